//! The real nvlink as an engine.
//!
//! Used for the cases the in-process engine does not reproduce yet (see
//! ARCHITECTURE.md, "Cases routed to nvlink"). It needs the caller's files at
//! the same paths, so only a daemon sharing the caller's filesystem uses it.
//! nvlink runs in the caller's working directory with the caller's arguments,
//! except that its output files are redirected into a private directory (a
//! later `-o` overrides an earlier one), so the caller still writes them
//! atomically.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::cli::options::Opt;
use crate::cli::parse::{ArgPos, Occurrence};
use crate::cli::spec::Spec;
use crate::fs::absolute;
use crate::request::{OutputFile, Request};
use crate::worker::Cancel;

/// What an nvlink run printed and wrote.
pub struct ProcessResult {
    pub exit_code: i32,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub outputs: Vec<OutputFile>,
    /// The signal that ended nvlink, if one did (a crash, or a kill from
    /// outside): the run is then no result to keep.
    pub signal: Option<i32>,
}

static NEXT: AtomicU64 = AtomicU64::new(0);

/// A private scratch directory, removed on drop.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(parent: &Path) -> std::io::Result<Scratch> {
        let dir = parent.join(format!("nvlinkd-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed)));
        std::fs::create_dir_all(&dir)?;
        Ok(Scratch(dir))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Replace an option's value in argv, wherever it sits.
fn substitute(args: &mut [String], at: ArgPos, old: &str, new: &str) {
    match at.value {
        Some(v) => args[v] = new.to_owned(),
        None => {
            let a = &mut args[at.option];
            if let Some(prefix) = a.strip_suffix(old) {
                *a = format!("{prefix}{new}");
            }
        }
    }
}

/// Run `nvlink` for `req`, capturing its outputs. `cancel` kills it, and so
/// does a run longer than `limit` (it then ends by a signal: no result).
pub fn run(
    nvlink: &Path,
    req: &Request,
    spec: &Spec,
    scratch_parent: &Path,
    cancel: &Cancel,
    limit: Duration,
) -> std::io::Result<ProcessResult> {
    let scratch = Scratch::new(scratch_parent)?;
    let mut args = req.args.clone();
    // (caller's path, scratch path)
    let mut redirected: Vec<(PathBuf, PathBuf)> = Vec::new();
    for (id, name) in [(Opt::OutputFile, "output"), (Opt::RegisterLinkBinaries, "register-link-binaries")] {
        let given: Vec<&Occurrence> = spec.parsed.options.iter().filter(|o| o.id == id).collect();
        let Some(last) = given.last() else { continue };
        let Some(at) = last.at else { return Err(std::io::Error::other("output named in an options file")) };
        // Same basename as the caller's file: nvlink renders it in verbose tkinfo.
        let base = last.value.as_deref().and_then(|v| Path::new(v).file_name()).unwrap_or(std::ffi::OsStr::new(name));
        let dir = scratch.0.join(name);
        std::fs::create_dir_all(&dir)?;
        let tmp = dir.join(base);
        let tmp_str = tmp.to_string_lossy().into_owned();
        let dest = absolute(&req.cwd, last.value.as_deref().unwrap_or_default());
        // Every occurrence of the option gets the scratch path (so that nvlink's
        // "incompatible redefinition" warning keeps its meaning), in place.
        for o in &given {
            if let Some(at) = o.at {
                let same = o.value == last.value;
                let replacement = if same { tmp_str.clone() } else { format!("{tmp_str}.other") };
                substitute(&mut args, at, o.value.as_deref().unwrap_or_default(), &replacement);
            }
        }
        let _ = at;
        redirected.push((dest, tmp));
    }
    let mut cmd = Command::new(nvlink);
    cmd.args(&args).current_dir(&req.cwd).env_clear();
    for (k, v) in &req.env {
        cmd.env(k, v);
    }
    if let Ok(path) = std::env::var("PATH") {
        cmd.env("PATH", path);
    }
    let child = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
    let out = cancel.supervise(child, limit)?;
    let signal = std::os::unix::process::ExitStatusExt::signal(&out.status);
    let exit_code = match out.status.code() {
        Some(c) => c,
        None => 128 + signal.unwrap_or(0),
    };
    let mut outputs = Vec::new();
    for (dest, tmp) in redirected {
        if let Ok(data) = std::fs::read(&tmp) {
            outputs.push(OutputFile { path: dest, data, append: false });
        }
    }
    Ok(ProcessResult { exit_code, stdout: out.stdout, stderr: out.stderr, outputs, signal })
}
