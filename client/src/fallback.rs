//! Running the real nvlink when the daemon cannot serve a link.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::process::ExitCode;

use crate::toolkit::Toolkit;
use nvlinkd_proto::paths;

/// Fallback with a freshly discovered toolkit and this process's own
/// arguments as they came (for arguments that are not UTF-8).
pub fn run(reason: &str) -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    run_os(&Toolkit::discover(), &args, reason)
}

/// Replace this process with the real nvlink running `args` (the command
/// line, an overlay's paths already written as the toolkit's), or fail when
/// `NVLINKD_FALLBACK=never` or no real nvlink is known.
pub fn run_with(tk: &Toolkit, args: &[String], reason: &str) -> ExitCode {
    run_os(tk, &os(args), reason)
}

fn os(args: &[String]) -> Vec<OsString> {
    args.iter().map(OsString::from).collect()
}

fn run_os(tk: &Toolkit, args: &[OsString], reason: &str) -> ExitCode {
    let never = std::env::var(paths::ENV_FALLBACK).map(|v| v == "never").unwrap_or(false);
    if never {
        eprintln!("nvlink fatal   : nvlinkd could not serve this link ({reason}) and {}=never", paths::ENV_FALLBACK);
        return ExitCode::from(1);
    }
    exec_os(tk, args, reason)
}

/// Replace this process with the real nvlink running `args`: for a fallback,
/// and for what only the caller's machine can do (host linker scripts for a
/// remote daemon), whatever `NVLINKD_FALLBACK` says.
pub fn exec_real(tk: &Toolkit, args: &[String], reason: &str) -> ExitCode {
    exec_os(tk, &os(args), reason)
}

fn exec_os(tk: &Toolkit, args: &[OsString], reason: &str) -> ExitCode {
    let Some(real) = tk.real_nvlink.as_ref().filter(|p| p.is_file()) else {
        eprintln!(
            "nvlink fatal   : nvlinkd could not serve this link ({reason}) and no real nvlink is known (set {} or CUDA_HOME)",
            paths::ENV_REAL_NVLINK
        );
        return ExitCode::from(1);
    };
    // Never fall back onto ourselves (an overlay pointing at itself).
    if let (Ok(me), Ok(it)) = (std::env::current_exe(), real.canonicalize()) {
        if me.canonicalize().map(|m| m == it).unwrap_or(false) {
            eprintln!("nvlink fatal   : nvlinkd could not serve this link ({reason}) and the real nvlink is this shim");
            return ExitCode::from(1);
        }
    }
    let err = std::process::Command::new(real).args(args).exec();
    eprintln!("nvlink fatal   : cannot run {}: {err}", real.display());
    ExitCode::from(1)
}
