//! Running the real nvlink when the daemon cannot serve a link.

use std::os::unix::process::CommandExt;
use std::process::ExitCode;

use crate::toolkit::Toolkit;
use nvlinkd_proto::paths;

/// Fallback with a freshly discovered toolkit.
pub fn run(reason: &str) -> ExitCode {
    run_with(&Toolkit::discover(), reason)
}

/// Replace this process with the real nvlink (same arguments), or fail when
/// `NVLINKD_FALLBACK=never` or no real nvlink is known.
pub fn run_with(tk: &Toolkit, reason: &str) -> ExitCode {
    let never = std::env::var(paths::ENV_FALLBACK).map(|v| v == "never").unwrap_or(false);
    if never {
        eprintln!("nvlink fatal   : nvlinkd could not serve this link ({reason}) and {}=never", paths::ENV_FALLBACK);
        return ExitCode::from(1);
    }
    exec_real(tk, reason)
}

/// Replace this process with the real nvlink (same arguments): for a fallback,
/// and for what only the caller's machine can do (host linker scripts for a
/// remote daemon), whatever `NVLINKD_FALLBACK` says.
pub fn exec_real(tk: &Toolkit, reason: &str) -> ExitCode {
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
    let err = std::process::Command::new(real).args(std::env::args_os().skip(1)).exec();
    eprintln!("nvlink fatal   : cannot run {}: {err}", real.display());
    ExitCode::from(1)
}
