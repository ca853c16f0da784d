//! The real nvlink as an engine.
//!
//! Used for the cases the in-process engine does not reproduce yet (see
//! docs/routed.md). It needs the caller's files at
//! the same paths: a daemon sharing the caller's filesystem runs it there, any
//! other on a copy of them (`sandbox.rs`, whose request this then runs).
//! nvlink runs in the caller's working directory with the caller's arguments,
//! except that its output files are redirected into a private directory (a
//! later `-o` overrides an earlier one), so the caller still writes them
//! atomically.
//!
//! # Faults of the daemon's environment are not nvlink's results
//!
//! nvlink writes its output (and, through `TMPDIR`, its temporary files) into
//! the daemon's scratch directory. When that directory's disk is full or gone,
//! nvlink fails in ways the caller's own nvlink would not (`fwrite failed`, or
//! exit status 0 and an empty cubin), and such an answer must neither reach the
//! caller nor the cache. A run is taken as an environment fault when the scratch
//! directory cannot be prepared, nvlink cannot be started or is killed by a
//! signal, its messages speak of a full, read-only or missing disk or name the
//! scratch directory, or it exits 0 without writing a non-empty `-o` file (but
//! for a virtual target, `compute_XY`, where nvlink writes none). Such a
//! run is retried once in another scratch directory (the system's temporary
//! directory) and otherwise reported as an error: the linker answers "fall
//! back" (the shim runs nvlink itself) and caches nothing. A signal is not
//! retried: nvlink crashes on some corrupt inputs too, and then the fallback
//! gives the caller that very crash. Every other outcome — nvlink's own errors
//! included — is nvlink's answer for the inputs.

use std::os::unix::fs::DirBuilderExt;
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
}

static NEXT: AtomicU64 = AtomicU64::new(0);

/// A private scratch directory, removed on drop.
pub struct Scratch(pub PathBuf);

impl Scratch {
    /// A new directory under `parent`, created exclusively (mode 0700, never an
    /// existing path: `parent` may be a shared temporary directory).
    pub fn new(parent: &Path) -> std::io::Result<Scratch> {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
        let dir =
            parent.join(format!("nvlinkd-{}-{}-{nanos:x}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed)));
        std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
        Ok(Scratch(dir))
    }
}

/// Where scratch directories go: the one given (under the cache directory)
/// and, when that one fails for lack of space or permission, the system's
/// temporary directory.
pub(crate) fn scratch_parents(preferred: &Path) -> [PathBuf; 2] {
    [preferred.to_owned(), std::env::temp_dir()]
}

/// Messages of a tool that mean the disk or the machine failed it, not the input.
/// (nvlink's own ones were seen on a full disk or are its write-error strings.)
const ENVIRONMENT_MESSAGES: &[&str] = &[
    "fwrite failed",
    "Internal error: writing file",
    "Could not write file",
    "Failed to write to outp",
    "Unable to create thread pool",
    "No space left on device",
    "Disk quota exceeded",
    "Read-only file system",
    "Too many open files",
    "Cannot allocate memory",
    "Input/output error",
    // The confinement helper could not start the tool (`confine.rs`).
    "nvlinkd: confine:",
];

/// Whether a tool's messages blame the environment (or name the scratch directory).
pub(crate) fn blames_environment(stdout: &[u8], stderr: &[u8], scratch: &Path) -> Option<String> {
    let scratch = scratch.as_os_str().as_encoded_bytes();
    for text in [stdout, stderr] {
        let t = String::from_utf8_lossy(text);
        if let Some(m) = ENVIRONMENT_MESSAGES.iter().find(|m| t.contains(*m)) {
            return Some(format!("the tool reported '{m}'"));
        }
        if text.windows(scratch.len()).any(|w| w == scratch) {
            return Some("the tool's messages name the scratch directory".into());
        }
    }
    None
}

/// A file a tool wrote into its scratch or sandbox, read back by the daemon:
/// only a regular file with one link, never through a symlink (the tool,
/// confined, may have planted one to a file only the daemon can read).
pub(crate) fn read_tool_output(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)?;
    let m = f.metadata()?;
    if !m.is_file() || m.nlink() != 1 {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "not a regular file of the tool's own"));
    }
    let mut data = Vec::with_capacity(m.len() as usize);
    f.read_to_end(&mut data)?;
    Ok(data)
}

/// Why a run of nvlink is no answer for the caller.
#[derive(Debug)]
pub enum RunError {
    /// The environment failed the run (see the module doc); retrying elsewhere may help.
    Environment(String),
    /// nvlink died of a signal.
    Signal(i32),
    /// The request cannot be run this way (output named in an options file).
    Unsupported(String),
}

impl std::fmt::Display for RunError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RunError::Environment(why) => write!(f, "environment fault: {why}"),
            RunError::Signal(s) => write!(f, "nvlink killed by signal {s}"),
            RunError::Unsupported(why) => f.write_str(why),
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Replace an option's value in argv, wherever it sits.
pub(crate) fn substitute(args: &mut [String], at: ArgPos, old: &str, new: &str) {
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

/// A run on a link's sandbox (`sandbox.rs`), confined (`confine.rs`): it
/// reads the toolkit and writes its sandbox and scratch, nothing else.
pub struct Confined<'a> {
    pub policy: &'a crate::confine::Policy,
    pub toolkit_root: &'a Path,
    /// The sandbox's directory (the mirrored files are below it).
    pub sandbox: &'a Path,
}

/// Run `nvlink` for `req`, capturing its outputs: in the first of
/// `scratch_parents` that works, retrying in the next after an environment
/// fault. `cancel` kills it, and so does a run longer than `limit` (it then
/// ends by a signal: no result).
pub fn run(
    nvlink: &Path,
    req: &Request,
    spec: &Spec,
    scratch_parents: &[PathBuf],
    cancel: &Cancel,
    limit: Duration,
    confined: Option<&Confined>,
) -> Result<ProcessResult, RunError> {
    retry_in_scratch("nvlink", scratch_parents, |parent| run_in(nvlink, req, spec, parent, cancel, limit, confined))
}

/// The failure of a tool's run in one scratch directory, as far as
/// [`retry_in_scratch`] cares: whether the environment failed it.
pub(crate) trait ScratchFailure: Sized {
    /// The environment failed the run, for the reason given.
    fn environment(why: String) -> Self;
    /// The reason, if the environment failed the run.
    fn as_environment(&self) -> Option<&str>;
}

impl ScratchFailure for RunError {
    fn environment(why: String) -> Self {
        RunError::Environment(why)
    }
    fn as_environment(&self) -> Option<&str> {
        match self {
            RunError::Environment(why) => Some(why),
            _ => None,
        }
    }
}

/// Run `attempt` in the first of `parents` (see [`scratch_parents`]) where the
/// environment does not fail it: a fault of the environment (see the module
/// doc) is logged and the next directory tried; any other result, success or
/// not, is the answer (a second run elsewhere would end the same way). When
/// every directory failed, the last fault is returned.
pub(crate) fn retry_in_scratch<T, E: ScratchFailure>(
    tool: &str,
    parents: &[PathBuf],
    mut attempt: impl FnMut(&Path) -> Result<T, E>,
) -> Result<T, E> {
    let mut last = E::environment("no scratch directory".into());
    for parent in parents {
        match attempt(parent) {
            Err(e) if e.as_environment().is_some() => {
                let why = e.as_environment().unwrap_or_default();
                tracing::warn!(scratch = %parent.display(), "{tool} run failed by its environment: {why}");
                last = e;
            }
            other => return other,
        }
    }
    Err(last)
}

fn env_err(what: &str) -> impl Fn(std::io::Error) -> RunError + '_ {
    move |e| RunError::Environment(format!("{what}: {e}"))
}

fn run_in(
    nvlink: &Path,
    req: &Request,
    spec: &Spec,
    scratch_parent: &Path,
    cancel: &Cancel,
    limit: Duration,
    confined: Option<&Confined>,
) -> Result<ProcessResult, RunError> {
    let _ = std::fs::create_dir_all(scratch_parent);
    let scratch = Scratch::new(scratch_parent).map_err(env_err("scratch directory"))?;
    let mut args = req.args.clone();
    // (caller's path, scratch path, whether it is the `-o` file)
    let mut redirected: Vec<(PathBuf, PathBuf, bool)> = Vec::new();
    for (id, name) in [(Opt::OutputFile, "output"), (Opt::RegisterLinkBinaries, "register-link-binaries")] {
        let given: Vec<&Occurrence> = spec.parsed.options.iter().filter(|o| o.id == id).collect();
        let Some(last) = given.last() else { continue };
        let Some(at) = last.at else { return Err(RunError::Unsupported("output named in an options file".into())) };
        // Same basename as the caller's file: nvlink renders it in verbose tkinfo.
        let base = last.value.as_deref().and_then(|v| Path::new(v).file_name()).unwrap_or(std::ffi::OsStr::new(name));
        let dir = scratch.0.join(name);
        std::fs::create_dir_all(&dir).map_err(env_err("scratch directory"))?;
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
        redirected.push((dest, tmp, id == Opt::OutputFile));
    }
    // A background link's nvlink runs at idle CPU priority (`sched.rs`); on a
    // client's mirrored files, confined (`confine.rs`): it reads the toolkit
    // and writes its sandbox and scratch, nothing else.
    let idle = cancel.priority() == crate::sched::Priority::Background;
    let mut cmd = match confined {
        Some(c) => {
            c.policy.hand_over(&[&scratch.0, c.sandbox]).map_err(env_err("sandbox user"))?;
            let mut read = crate::confine::toolkit_reads(c.toolkit_root);
            read.extend(nvlink.canonicalize().ok().and_then(|p| p.parent().map(Path::to_owned)));
            c.policy.command(nvlink, &read, &[&scratch.0, c.sandbox], idle).map_err(RunError::Environment)?
        }
        None => {
            let mut cmd = Command::new(nvlink);
            crate::sched::apply_to_command(&mut cmd, cancel.priority());
            cmd
        }
    };
    // In the caller's directory itself when it was opened (the child's own
    // descriptor of it, before it execs), not whatever now has its name.
    let dir = if confined.is_none() { req.in_dir(&req.cwd) } else { req.cwd.clone() };
    cmd.args(&args).current_dir(&dir).env_clear();
    // Of the caller's environment, only what the link depends on (the
    // request holds nothing else; checked again here, where a process starts).
    for (k, v) in req.env.iter().filter(|(k, _)| crate::request::LINK_ENV.contains(&k.as_str())) {
        cmd.env(k, v);
    }
    if let Ok(path) = std::env::var("PATH") {
        cmd.env("PATH", path);
    }
    // nvlink's temporary files go to the scratch directory too (one place
    // whose failures are recognised), not to the caller's TMPDIR.
    let tmpdir = scratch.0.join("tmp");
    std::fs::create_dir(&tmpdir).map_err(env_err("scratch directory"))?;
    cmd.env("TMPDIR", &tmpdir);
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(env_err("cannot run nvlink"))?;
    let out = cancel.supervise(child, limit).map_err(env_err("nvlink"))?;
    let exit_code = match out.status.code() {
        Some(c) => c,
        None => {
            let signal = std::os::unix::process::ExitStatusExt::signal(&out.status).unwrap_or(0);
            return Err(RunError::Signal(signal));
        }
    };
    if let Some(why) = blames_environment(&out.stdout, &out.stderr, &scratch.0) {
        return Err(RunError::Environment(why));
    }
    let mut outputs = Vec::new();
    for (dest, tmp, is_output) in redirected {
        match read_tool_output(&tmp) {
            Ok(data) => {
                // nvlink never succeeds with an empty output file.
                if exit_code == 0 && is_output && data.is_empty() {
                    return Err(RunError::Environment("nvlink exited 0 and its output is empty".into()));
                }
                outputs.push(OutputFile { path: dest, data: data.into(), append: false });
            }
            // For a virtual target (`compute_XY`) nvlink writes no `-o` file.
            Err(e) if exit_code == 0 && is_output && !spec.virtual_target() => {
                return Err(RunError::Environment(format!("nvlink exited 0 without its output: {e}")));
            }
            Err(_) => {}
        }
    }
    Ok(ProcessResult { exit_code, stdout: out.stdout, stderr: out.stderr, outputs })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each row: what the attempt in each scratch parent gives (`Ok`, an
    /// environment fault `E`, another failure `S` for a signal), the result
    /// and how many directories were tried.
    #[test]
    fn scratch_retry_moves_on_only_after_environment_faults() {
        type Row = (&'static [char], Result<usize, char>, usize);
        let rows: &[Row] = &[
            (&['O', 'O'], Ok(0), 1),
            (&['E', 'O'], Ok(1), 2),
            (&['S', 'O'], Err('S'), 1),
            (&['E', 'S'], Err('S'), 2),
            (&['E', 'E'], Err('E'), 2),
            (&[], Err('E'), 0),
        ];
        for (outcomes, want, tries) in rows {
            let parents: Vec<PathBuf> = (0..outcomes.len()).map(|i| PathBuf::from(format!("/p{i}"))).collect();
            let mut tried = 0;
            let got = retry_in_scratch("tool", &parents, |parent| {
                tried += 1;
                let i: usize = parent.to_str().unwrap()[2..].parse().unwrap();
                match outcomes[i] {
                    'O' => Ok(i),
                    'E' => Err(RunError::Environment(format!("fault in {i}"))),
                    _ => Err(RunError::Signal(9)),
                }
            });
            let got = got.map_err(|e| match e {
                RunError::Environment(why) => {
                    // The last fault is the one returned.
                    let last = outcomes.len().checked_sub(1).map(|i| format!("fault in {i}"));
                    assert_eq!(why, last.unwrap_or_else(|| "no scratch directory".into()), "{outcomes:?}");
                    'E'
                }
                _ => 'S',
            });
            assert_eq!(got, *want, "{outcomes:?}");
            assert_eq!(tried, *tries, "{outcomes:?}");
        }
    }
}
