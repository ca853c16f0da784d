//! One nvlink invocation as the daemon receives it, and what comes back.

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::declined::Declined;

/// The environment variables a link's result depends on, and the only ones a
/// [`Request`] carries: `LIBRARY_PATH` (nvlink searches `-l` libraries there
/// after the `-L` directories). It is part of the link's cache key. Nothing
/// else a client sends reaches nvlink, ptxas or a worker: not the loader's
/// variables (`LD_PRELOAD`, `LD_LIBRARY_PATH`, `LD_AUDIT`, …), `GCONV_PATH`,
/// `MALLOC_*`, `TMPDIR` (each run gets its own scratch directory), nor
/// `CUDA_HOME` (the daemon links with its own toolkits).
pub const LINK_ENV: &[&str] = &["LIBRARY_PATH"];

/// An nvlink invocation.
#[derive(Clone, Debug, Default)]
pub struct Request {
    /// nvlink's arguments, without `argv[0]`.
    pub args: Vec<String>,
    /// The invoking process's working directory (absolute).
    pub cwd: PathBuf,
    /// Its environment, of [`LINK_ENV`] only (see [`Request::link_env`]).
    pub env: BTreeMap<String, String>,
    /// The identity of the toolkit the caller stands for ([`Release::identity`]
    /// of its nvlink), when it knows it: the linker links with its own toolkit
    /// of that identity or declines. Never a path: callers do not choose what
    /// the daemon executes or loads.
    ///
    /// [`Release::identity`]: crate::toolkit::Release::identity
    pub toolkit: Option<String>,
    /// Whether this process sees the caller's filesystem at the same paths (a
    /// local daemon). Only then can the real nvlink run here as an engine.
    pub shared_fs: bool,
    /// Who answers the file requests of a link that does not share this
    /// filesystem, where the daemon tells its remote callers apart (a token of
    /// several, a client certificate): such links lead or join flights of the
    /// same caller only, so one tenant's slow answers never hold another's
    /// identical link.
    pub caller: Option<[u8; 32]>,
    /// Whether the caller answers stats of the libNVVM under `-nvvmpath`
    /// (a shim that does not share this filesystem may refuse them).
    pub nvvm_stat: bool,
    /// A link nobody asked for yet, computed ahead of a predicted call
    /// (another arch of a multi-arch build, a relink after an input changed;
    /// see `nvlinkd_core::speculate`). Its result goes only into the cache, it
    /// belongs to the background priority class, and it does not count as a
    /// request in the stats.
    pub speculative: bool,
    /// A link from the network listener (a token holder's, another
    /// machine's): its foreground computation fills the slots the daemon
    /// host's own links leave, never keeps them waiting (`sched.rs`).
    pub remote: bool,
    /// The caller's working directory itself, opened once (a link on the
    /// caller's filesystem: `O_PATH`, checked to be the shim's by device and
    /// inode). nvlink finds relative names through its process's directory,
    /// not its name: the link's files under `cwd` are read, and the real
    /// nvlink run, through this one ([`Request::in_dir`]), whatever the
    /// directory is called meanwhile.
    pub cwd_dir: Option<CwdDir>,
}

/// An opened working directory (see [`Request::cwd_dir`]).
#[derive(Clone, Debug)]
pub struct CwdDir(pub std::sync::Arc<std::os::fd::OwnedFd>);

impl CwdDir {
    /// The directory's name for this process (and, in a child before it
    /// execs, for the child): `/proc/self/fd/N`, a link the kernel follows
    /// to the directory itself.
    pub fn path(&self) -> PathBuf {
        use std::os::fd::AsRawFd;
        PathBuf::from(format!("/proc/self/fd/{}", self.0.as_raw_fd()))
    }

    /// Whether [`CwdDir::path`] leads to the directory (no `/proc` mounted:
    /// it does not, and the link goes by the directory's name).
    pub fn reachable(&self) -> bool {
        use std::os::unix::fs::MetadataExt;
        let Ok(fd) = self.0.try_clone() else { return false };
        let opened = std::fs::File::from(fd).metadata();
        let named = std::fs::metadata(self.path());
        matches!((opened, named), (Ok(a), Ok(b)) if (a.dev(), a.ino()) == (b.dev(), b.ino()))
    }

    /// `path` with a leading `cwd` (the name this directory was opened by)
    /// replaced by [`CwdDir::path`]; see [`Request::in_dir`].
    pub fn under(&self, cwd: &std::path::Path, path: &std::path::Path) -> PathBuf {
        use std::os::unix::ffi::{OsStrExt, OsStringExt};
        let (p, cwd) = (path.as_os_str().as_bytes(), cwd.as_os_str().as_bytes());
        let rest = match p.strip_prefix(cwd) {
            Some(rest) if rest.is_empty() || rest.starts_with(b"/") => rest,
            // The root directory: every absolute path is under it.
            Some(_) if cwd == b"/" => p,
            _ => return path.to_owned(),
        };
        let mut out = self.path().into_os_string().into_vec();
        out.extend_from_slice(rest);
        PathBuf::from(std::ffi::OsString::from_vec(out))
    }
}

impl Request {
    /// A link of this machine's own user on its own files (`nvlinkd exec`,
    /// library users): the filesystem shared, nothing remote.
    pub fn local(args: Vec<String>, cwd: PathBuf) -> Request {
        Request { args, cwd, shared_fs: true, nvvm_stat: true, ..Default::default() }
    }

    /// `path` (absolute, as the link names a file) with a leading `cwd`
    /// replaced by the opened directory's name, if the request has one: the
    /// file nvlink, in that directory, would open. Byte for byte (a trailing
    /// `/` stays). Paths elsewhere are unchanged.
    pub fn in_dir(&self, path: &std::path::Path) -> PathBuf {
        match &self.cwd_dir {
            Some(dir) => dir.under(&self.cwd, path),
            None => path.to_owned(),
        }
    }

    /// Whom the link computes for (see [`crate::cancel::Tenant`]).
    pub fn tenant(&self) -> crate::cancel::Tenant {
        match (self.remote, self.caller) {
            (false, _) => crate::cancel::LOCAL,
            (true, Some(caller)) => caller,
            (true, None) => crate::cancel::REMOTE,
        }
    }

    /// The environment a link keeps of what its caller sent: the variables
    /// of [`LINK_ENV`], nothing else, whatever the caller put there.
    pub fn link_env(sent: impl IntoIterator<Item = (String, String)>) -> BTreeMap<String, String> {
        sent.into_iter().filter(|(k, _)| LINK_ENV.contains(&k.as_str())).collect()
    }
}

/// A file to write on the caller's side.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutputFile {
    pub path: PathBuf,
    /// Shared, not copied, between the outcome, its cache entry and the
    /// messages that carry it to the shim.
    pub data: bytes::Bytes,
    /// Append rather than replace (`-time`).
    pub append: bool,
}

/// Which engine produced a result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EngineKind {
    /// Nothing to link: help, version, errors found before linking, `-ghls`.
    Frontend,
    /// libnvJitLink in process, finalized to nvlink's bytes.
    InProcess,
    /// The real nvlink, run by the daemon.
    NvlinkProcess,
    /// Served from the cache.
    Cache,
}

/// What the caller must do with the invocation.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub exit_code: i32,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// Files to write, in order, only when they were produced.
    pub outputs: Vec<OutputFile>,
    /// Set when this process cannot serve the link and the caller should run
    /// the real nvlink itself (with the reason; its detail is shown to the shim).
    pub fallback: Option<Declined>,
    pub engine: EngineKind,
    /// Why the in-process engine did not serve the link, when it did not.
    pub routed: Option<Declined>,
    /// The output nvlink writes with `fwrite`: a whole-program LTO link's
    /// cubin. On a full disk nvlink says [`NO_ROOM_FWRITE`] of it and
    /// [`NO_ROOM`] of every other output.
    pub fwrite_output: Option<PathBuf>,
}

/// nvlink's fatal message when an output cannot be written for want of room
/// (a full disk, a quota, the file size limit).
pub const NO_ROOM: &str = "Internal error: writing file";
/// The same, for the output of [`Outcome::fwrite_output`].
pub const NO_ROOM_FWRITE: &str = "fwrite failed";

impl Outcome {
    /// An answer of `engine`: exit status, messages and the files to write.
    pub fn answer(
        engine: EngineKind,
        exit_code: i32,
        stdout: Vec<u8>,
        stderr: Vec<u8>,
        outputs: Vec<OutputFile>,
    ) -> Self {
        Outcome { exit_code, stdout, stderr, outputs, fallback: None, engine, routed: None, fwrite_output: None }
    }

    /// "Run the real nvlink yourself", and why.
    pub fn fallback(why: Declined) -> Self {
        Outcome { fallback: Some(why), ..Outcome::answer(EngineKind::Frontend, 0, Vec::new(), Vec::new(), Vec::new()) }
    }

    /// Put `stderr` text printed earlier (parse warnings) in front of this outcome's.
    pub fn after(mut self, stderr: Vec<u8>) -> Self {
        if !stderr.is_empty() {
            let mut all = stderr;
            all.append(&mut self.stderr);
            self.stderr = all;
        }
        self
    }

    /// Record why the in-process engine passed this link on.
    pub fn routed(mut self, why: Declined) -> Self {
        self.routed = Some(why);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Names under the working directory go through the opened directory,
    /// byte for byte; others stay as they are.
    #[test]
    fn names_under_the_working_directory_go_through_it() {
        let dir = std::fs::File::open("/").unwrap();
        let dir = CwdDir(std::sync::Arc::new(std::os::fd::OwnedFd::from(dir)));
        let at = dir.path().display().to_string();
        let req = Request { cwd: "/w/b".into(), cwd_dir: Some(dir.clone()), ..Default::default() };
        let rows = [
            ("/w/b/a.o", format!("{at}/a.o")),
            ("/w/b/sub/x/", format!("{at}/sub/x/")),
            ("/w/b", at.clone()),
            ("/w/bc/a.o", "/w/bc/a.o".into()),
            ("/abs/a.o", "/abs/a.o".into()),
        ];
        for (path, want) in rows {
            assert_eq!(req.in_dir(std::path::Path::new(path)), PathBuf::from(want), "{path}");
        }
        let root = Request { cwd: "/".into(), cwd_dir: Some(dir), ..Default::default() };
        assert_eq!(root.in_dir(std::path::Path::new("/a.o")), PathBuf::from(format!("{at}/a.o")));
        assert!(CwdDir(std::sync::Arc::new(std::fs::File::open("/").unwrap().into())).reachable());
        let plain = Request { cwd: "/w/b".into(), ..Default::default() };
        assert_eq!(plain.in_dir(std::path::Path::new("/w/b/a.o")), PathBuf::from("/w/b/a.o"));
    }
}
