//! `nvlink`, the shim.
//!
//! It links nothing itself. It sends its arguments, working directory and the
//! relevant environment to nvlinkd, answers the daemon's requests for files,
//! then writes the outputs the daemon returns (atomically: a temporary file and a
//! rename, so an interrupted link never leaves a half-written cubin), prints what
//! nvlink would have printed and exits with nvlink's status.
//!
//! When no daemon answers it starts one (`nvlinkd start`), and when it still
//! cannot get an answer — or the daemon dies mid-link, or declines the link — it
//! runs the real nvlink instead, unless `NVLINKD_FALLBACK=never`.
//!
//! The shim trusts no daemon (`policy.rs`): it serves only the files nvlink
//! would read, writes only the files nvlink would write, and waits a bounded
//! time for each message; anything else is a protocol violation, said on
//! stderr, and the real nvlink runs.

mod announce;
mod fallback;
mod remap;
mod session;
mod toolkit;
mod warn;

use std::process::ExitCode;

use nvlinkd_proto::policy;

/// The environment variables nvlink reads (its binary's `getenv` names)
/// besides `LIBRARY_PATH` and `TMPDIR`.
const NVLINK_ENV: &[&str] =
    &["FINALIZER_USE_LEGACY_ELF_BUILDER", "FINALIZER_CUBIE", "CUDA_DEVCODE_CACHE", "CUDA_DEVCODE_PATH"];

fn main() -> ExitCode {
    let args: Vec<String> = match std::env::args_os().skip(1).map(|a| a.into_string()).collect() {
        Ok(a) => a,
        // Arguments that are not UTF-8 cannot travel in the protocol: let nvlink have them.
        Err(_) => return fallback::run("arguments are not UTF-8"),
    };
    let tk = toolkit::Toolkit::discover();
    // An overlay's paths as the toolkit's own (remap.rs): the daemon and the
    // real nvlink both link the plain build's command line.
    let args = match (remap::Remap::of_current_exe(), std::env::current_dir()) {
        (Some(remap), Ok(cwd)) => remap.args(&args, &cwd),
        _ => args,
    };
    // The caller's own descriptors (`-o /dev/stdout`) are this process's:
    // the real nvlink writes them here, whatever daemon there is.
    if let Ok(cwd) = std::env::current_dir() {
        if policy::names_caller_descriptors(&args, &cwd) {
            return fallback::exec_real(&tk, &args, "the command line names the caller's own descriptors");
        }
    }
    // Variables nvlink itself reads that change its answer (its finalizer's
    // ELF builder and dump file, its device-code cache): only the real
    // nvlink honours them, and no key holds them.
    if let Some(name) = NVLINK_ENV.iter().find(|n| std::env::var_os(n).is_some()) {
        return fallback::exec_real(&tk, &args, &format!("{name} is set (nvlink reads it)"));
    }
    // A host linker script comes from the caller's host tools (`gcc`, `ld`,
    // found on the caller's PATH, with its environment): the real nvlink
    // makes it here, whatever daemon there is.
    if let Ok(cwd) = std::env::current_dir() {
        if policy::host_linker_script(&args, &cwd) {
            return fallback::exec_real(&tk, &args, "host linker script");
        }
        // A remote daemon links with its own toolkit's libNVVM: another one
        // the command line names is loaded by the real nvlink, here.
        if session::remote() && policy::foreign_nvvm(&args, &cwd, tk.cuda_home.as_deref()) {
            return fallback::exec_real(&tk, &args, "-nvvmpath names another libNVVM than the toolkit's");
        }
        // One file under two names: nvlink takes it once, a remote daemon's
        // sandbox would hold two.
        if session::remote() {
            let library_path = std::env::var("LIBRARY_PATH").ok();
            let policy = policy::Policy::new(&args, &cwd, library_path.as_deref(), tk.cuda_home.as_deref());
            if let Some((a, b)) = announce::one_file_twice(&policy, &cwd) {
                let why = format!("{} and {} are one file", a.display(), b.display());
                return fallback::exec_real(&tk, &args, &why);
            }
        }
    }
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => return fallback::run_with(&tk, &args, &format!("cannot start runtime: {e}")),
    };
    match runtime.block_on(session::run(&args, &tk)) {
        Ok(code) => ExitCode::from(code as u8),
        Err(failure) => {
            drop(runtime);
            if failure.violation {
                eprintln!("nvlink: nvlinkd protocol violation: {}; not using the daemon's answer", failure.reason);
            }
            if let Some(fixable) = &failure.fixable {
                warn::once(fixable, &tk, session::remote());
            }
            fallback::run_with(&tk, &args, &failure.reason)
        }
    }
}
