//! A CUDA toolkit: where its pieces are, what release it is, and its identity.
//!
//! Everything nvlink writes that names the toolkit (the `--version` banner, the
//! release and build strings of the `.note.nv.tkinfo` note) is read from the
//! toolkit's own `nvlink --version`, never hard-coded. The identity, a BLAKE3 hash
//! over those strings and the contents of the binaries and libraries a link
//! can use (see [`Toolkit::identity`]), is part of every cache key, so a
//! toolkit upgrade can never be served an old result, and the same toolkit on
//! another host or in another container shares the cache.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, OnceLock};

use crate::cache::store::{hex, parse_hex, private_dirs};
use crate::jitlink::JitLink;

#[derive(Debug, thiserror::Error)]
pub enum ToolkitError {
    #[error("no nvlink at {0}")]
    NoNvlink(PathBuf),
    #[error("cannot run {0} --version: {1}")]
    Version(PathBuf, String),
    #[error("unexpected version banner from {0}")]
    Banner(PathBuf),
    #[error("{0}")]
    JitLink(String),
}

/// Release strings as nvlink prints them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Release {
    pub major: u32,
    pub minor: u32,
    /// `Cuda compilation tools, release 13.5, V13.5.37`
    pub tools_line: String,
    /// `Build cuda_13.5.r13.5/compiler.39125733_0`
    pub build_line: String,
    /// The whole `nvlink --version` output.
    pub banner: String,
}

/// The releases whose nvlink the in-process engine reproduces byte for byte,
/// proven by the parity corpus and the generated programs. CUDA 13.0.88 is
/// not: its nvlink lays out cubins and prints messages otherwise (76 of the
/// 345 parity cases differed when tried), so its links go to its own nvlink.
pub const IN_PROCESS_PROVEN: &[(u32, u32)] = &[(13, 5)];

impl Release {
    /// Whether the in-process engine may answer for this release
    /// ([`IN_PROCESS_PROVEN`]); otherwise the release's own nvlink links
    /// (routed, reason `release`, cached as any nvlink answer) and answers
    /// option errors.
    pub fn in_process_proven(&self) -> bool {
        IN_PROCESS_PROVEN.contains(&(self.major, self.minor))
    }

    /// What names this release between a shim and a daemon: the tools and
    /// build lines of the banner, joined by a newline (see [`identity_of_banner`]).
    pub fn identity(&self) -> String {
        format!("{}\n{}", self.tools_line, self.build_line)
    }

    /// Parse the `nvlink --version` banner.
    pub(crate) fn from_banner(banner: &str) -> Option<Self> {
        let tools_line = banner.lines().find(|l| l.starts_with("Cuda compilation tools, release "))?.to_owned();
        let build_line = banner.lines().find(|l| l.starts_with("Build "))?.to_owned();
        let rel = tools_line.strip_prefix("Cuda compilation tools, release ")?;
        let rel = rel.split(',').next()?;
        let (major, minor) = rel.split_once('.')?;
        Some(Release {
            major: major.trim().parse().ok()?,
            minor: minor.trim().parse().ok()?,
            tools_line,
            build_line,
            banner: banner.to_owned(),
        })
    }
}

/// The release identity ([`Release::identity`]) in an `nvlink --version` banner.
pub fn identity_of_banner(banner: &str) -> Option<String> {
    Release::from_banner(banner).map(|r| r.identity())
}

/// One installed toolkit.
pub struct Toolkit {
    pub root: PathBuf,
    pub release: Release,
    identity: OnceLock<[u8; 32]>,
    /// Where content identities are remembered by stat identity (the
    /// daemon's cache directory), if anywhere.
    identity_memo: Option<PathBuf>,
    /// The files' stat identity the identity was last confirmed for, when,
    /// and whether their contents were found changed ([`Toolkit::changed_on_disk`]).
    confirmed: std::sync::Mutex<Option<Confirmed>>,
    jitlink: OnceLock<Result<Arc<JitLink>, String>>,
    help: OnceLock<String>,
}

impl std::fmt::Debug for Toolkit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Toolkit").field("root", &self.root).field("release", &self.release.tools_line).finish()
    }
}

/// Where `nvlinkd install --in-place` keeps a toolkit's real nvlink, relative
/// to the toolkit root; its `bin/nvlink` is then the shim.
pub const IN_PLACE_REAL_NVLINK: &str = "bin/.nvlinkd/nvlink";

/// The real nvlink of the toolkit at `root`: the one an in-place install kept
/// aside, else `bin/nvlink`.
pub fn real_nvlink(root: &Path) -> PathBuf {
    let kept = root.join(IN_PLACE_REAL_NVLINK);
    if kept.is_file() {
        kept
    } else {
        root.join("bin/nvlink")
    }
}

impl Toolkit {
    /// Open the toolkit at `root` (a CUDA_HOME): runs its `nvlink --version` once.
    pub fn open(root: &Path) -> Result<Self, ToolkitError> {
        let nvlink = real_nvlink(root);
        if !nvlink.is_file() {
            return Err(ToolkitError::NoNvlink(nvlink));
        }
        let out = Command::new(&nvlink)
            .arg("--version")
            .output()
            .map_err(|e| ToolkitError::Version(nvlink.clone(), e.to_string()))?;
        let banner = String::from_utf8_lossy(&out.stdout).into_owned();
        let release = Release::from_banner(&banner).ok_or_else(|| ToolkitError::Banner(nvlink.clone()))?;
        Ok(Toolkit::of_release(root, release))
    }

    /// The toolkit at `root` of `release` (read from its nvlink by [`Toolkit::open`]).
    fn of_release(root: &Path, release: Release) -> Self {
        Toolkit {
            root: root.to_owned(),
            release,
            identity: OnceLock::new(),
            identity_memo: None,
            confirmed: std::sync::Mutex::new(None),
            jitlink: OnceLock::new(),
            help: OnceLock::new(),
        }
    }

    /// Remember the content identity under `dir` (see [`Toolkit::identity`]).
    pub fn with_identity_memo(mut self, dir: PathBuf) -> Self {
        self.identity_memo = Some(dir);
        self
    }

    /// The toolkit's real nvlink (see [`real_nvlink`]).
    pub fn nvlink(&self) -> PathBuf {
        real_nvlink(&self.root)
    }

    /// The toolkit's ptxas (the in-process engine runs it for PTX → SASS).
    pub fn ptxas(&self) -> PathBuf {
        self.root.join("bin/ptxas")
    }

    /// `nvlink --help` of this toolkit, read once.
    pub(crate) fn help_text(&self) -> String {
        self.help
            .get_or_init(|| {
                Command::new(self.nvlink())
                    .arg("--help")
                    .output()
                    .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                    .unwrap_or_default()
            })
            .clone()
    }

    /// libnvJitLink of this toolkit (`lib64/` or `lib/`).
    pub(crate) fn jitlink_path(&self) -> PathBuf {
        let major = self.release.major;
        for dir in ["lib64", "lib", "targets/x86_64-linux/lib"] {
            let p = self.root.join(dir).join(format!("libnvJitLink.so.{major}"));
            if p.is_file() {
                return p;
            }
        }
        self.root.join(format!("lib64/libnvJitLink.so.{major}"))
    }

    /// What a worker process loads to link for this toolkit.
    pub fn jitlink_spec(&self) -> crate::worker::LibSpec {
        crate::worker::LibSpec { path: self.jitlink_path(), major: self.release.major, minor: self.release.minor }
    }

    /// The toolkit's libnvJitLink, loaded into this process on first use and
    /// kept (only where no worker executable is configured: see `worker.rs`).
    pub fn jitlink(&self) -> Result<Arc<JitLink>, ToolkitError> {
        self.jitlink
            .get_or_init(|| {
                JitLink::load(&self.jitlink_path(), self.release.major, self.release.minor)
                    .map(Arc::new)
                    .map_err(|e| e.to_string())
            })
            .clone()
            .map_err(ToolkitError::JitLink)
    }

    /// The toolkit's identity, part of every cache key: BLAKE3 over the
    /// `nvlink --version` banner (release and build strings), the toolkit's
    /// root as named, and the contents of every file whose behaviour a link
    /// depends on — nvlink, ptxas, libnvJitLink, NVVM's library and libdevice —
    /// each under its place in the toolkit (a file that is absent enters as
    /// absent, so its appearance changes the identity too).
    ///
    /// Contents, not inodes or times: the same toolkit installed on two hosts,
    /// in two containers or reinstalled has one identity, so a shared cache
    /// tier (`--remote-cache`) serves every host of a farm. Hashing reads
    /// ~220 MB (~0.3 s of one core, once, beside the first links): the result is remembered in the
    /// cache directory under the files' stat identity (canonical path, device,
    /// inode, size, modification and status-change times; see
    /// [`stat_identity`]), so a restarted daemon reads it back with a few
    /// `stat`s. That memo is as sound as the contents it stands for: an
    /// upgrade installs new files (new inodes) or rewrites them, and every
    /// write moves a file's ctime, which no program can set back. Computed
    /// once per daemon, on a thread of its own when the toolkit is opened
    /// ([`Toolkit::prime`]), not on a link's path.
    pub fn identity(&self) -> [u8; 32] {
        *self.identity.get_or_init(|| {
            let files = self.identity_files();
            let stat = self.stat();
            let id = remembered_identity(&self.release.banner, &self.root, &files, self.identity_memo.as_deref(), stat);
            // Files changed since the toolkit was opened (while they were
            // hashed, say): the identity may be the new bytes' while the
            // daemon runs the old ones, so the toolkit counts as changed.
            if stat_identity(&self.release.banner, &files) != stat {
                let mut c = self.confirmed();
                if let Some(c) = c.as_mut() {
                    c.changed = true;
                }
                tracing::warn!(toolkit = %self.root.display(), "the toolkit's files changed on disk while the daemon opened it: its links go to the caller's nvlink until the daemon is restarted");
            }
            id
        })
    }

    /// Whether the content identity is known (hashed or remembered).
    pub fn identity_ready(&self) -> bool {
        self.identity.get().is_some()
    }

    /// The identity for keys now, without waiting: the content identity
    /// where it is known or remembered (a few `stat`s), else, while
    /// [`Toolkit::prime`]'s hash runs (a fresh cache directory's first
    /// links), a provisional one derived from the files' stat identity.
    /// Sound for this host's cache, as the memo is; another host never
    /// computes it, so a shared tier holds such entries unused.
    pub fn key_identity(&self) -> [u8; 32] {
        if let Some(id) = self.identity.get().copied().or_else(|| self.take_remembered()) {
            return id;
        }
        let mut h = blake3::Hasher::new();
        h.update(b"nvlinkd-toolkit-provisional-identity-v1\0");
        h.update(&self.stat());
        *h.finalize().as_bytes()
    }

    /// The content identity the memo holds for the files' stat identity, if
    /// any, taken as the identity (a few stats and one small read).
    fn take_remembered(&self) -> Option<[u8; 32]> {
        let stat = self.stat();
        let id = self.identity_memo.as_deref().and_then(|d| read_memo(&d.join(hex(&stat))))?;
        Some(*self.identity.get_or_init(|| id))
    }

    /// Make the content identity ready for links: at once where it is
    /// remembered, else hashed on a thread of its own (links meanwhile use
    /// [`Toolkit::key_identity`]'s provisional one).
    pub fn prime(self: &Arc<Self>) {
        if self.take_remembered().is_some() {
            return;
        }
        let tk = Arc::clone(self);
        std::thread::spawn(move || {
            // Beside the links, not before them: at the lowest priority.
            // SAFETY: setpriority on this thread's own id has no preconditions.
            unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 19) };
            tk.identity();
        });
    }

    /// The files' stat identity as last confirmed.
    fn stat(&self) -> [u8; 32] {
        self.confirmed().as_ref().map(|c| c.stat).unwrap_or_default()
    }

    /// The stat identity at opening and its confirmations (see
    /// [`Toolkit::changed_on_disk`]), taken on first use.
    fn confirmed(&self) -> std::sync::MutexGuard<'_, Option<Confirmed>> {
        let mut c = self.confirmed.lock().unwrap_or_else(|p| p.into_inner());
        if c.is_none() {
            let stat = stat_identity(&self.release.banner, &self.identity_files());
            *c = Some(Confirmed { stat, at: std::time::Instant::now(), changed: false });
        }
        c
    }

    /// Whether the files the identity covers changed their contents since it
    /// was computed (an upgrade or a patch in place under a running daemon):
    /// their stats are looked at once a second at most, and only when those
    /// moved are the contents hashed again (a rename or a reinstall of the
    /// same bytes, `install --in-place`, keeps the identity). Stats that move
    /// before the first hash finished count as a change. Once changed,
    /// always: the daemon's loaded libraries are the old ones.
    pub fn changed_on_disk(&self) -> bool {
        let mut guard = self.confirmed();
        let Some(c) = guard.as_mut() else { return false };
        let now = std::time::Instant::now();
        if c.changed || now.duration_since(c.at) < CONFIRM_EVERY {
            return c.changed;
        }
        c.at = now;
        let files = self.identity_files();
        let stat = stat_identity(&self.release.banner, &files);
        if stat != c.stat {
            c.changed = match self.identity.get() {
                Some(id) => {
                    let memo = self.identity_memo.as_deref();
                    remembered_identity(&self.release.banner, &self.root, &files, memo, stat) != *id
                }
                None => true,
            };
            c.stat = stat;
            if c.changed {
                tracing::warn!(toolkit = %self.root.display(), "the toolkit's files changed on disk: its links go to the caller's nvlink until the daemon is restarted");
            }
        }
        c.changed
    }

    /// The files a link's answer depends on (see [`Toolkit::identity`]).
    fn identity_files(&self) -> [PathBuf; 6] {
        let nvvm = self.root.join("nvvm");
        [
            self.nvlink(),
            self.ptxas(),
            self.jitlink_path(),
            nvvm.join("lib64/libnvvm.so"),
            nvvm.join("lib/libnvvm.so"),
            nvvm.join("libdevice/libdevice.10.bc"),
        ]
    }
}

/// How often [`Toolkit::changed_on_disk`] looks at the files' stats.
const CONFIRM_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// See [`Toolkit::changed_on_disk`].
struct Confirmed {
    stat: [u8; 32],
    at: std::time::Instant,
    changed: bool,
}

/// See [`Toolkit::identity`]: the content identity of `files`, remembered
/// under `memo` by their stat identity `stat` (taken before their contents
/// are read).
fn remembered_identity(banner: &str, root: &Path, files: &[PathBuf], memo: Option<&Path>, stat: [u8; 32]) -> [u8; 32] {
    let memo = memo.map(|d| d.join(hex(&stat)));
    if let Some(id) = memo.as_deref().and_then(read_memo) {
        return id;
    }
    let id = content_identity(banner, root, files);
    // Only when no file changed while it was read.
    if let Some(m) = memo.filter(|_| stat_identity(banner, files) == stat) {
        write_memo(&m, &id);
    }
    id
}

/// A remembered content identity (64 hex digits), if `path` holds one.
fn read_memo(path: &Path) -> Option<[u8; 32]> {
    parse_hex(std::fs::read_to_string(path).ok()?.trim_end())
}

/// Remember a content identity (written aside, then renamed into place).
fn write_memo(path: &Path, id: &[u8; 32]) {
    let Some(dir) = path.parent() else { return };
    let tmp = dir.join(format!(".tmp-{}-{}", std::process::id(), &hex(id)[..8]));
    let written = private_dirs(dir)
        .and_then(|()| std::fs::write(&tmp, format!("{}\n", hex(id))))
        .and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        tracing::debug!(path = %path.display(), "toolkit identity not remembered: {e}");
    }
}

/// See [`Toolkit::identity`]: the files' contents, each file once.
fn content_identity(banner: &str, root: &Path, files: &[PathBuf]) -> [u8; 32] {
    // A file under two names (libnvvm in lib/ and lib64/) is read once.
    let real: Vec<PathBuf> = files.iter().map(|p| std::fs::canonicalize(p).unwrap_or_else(|_| p.clone())).collect();
    let mut unique: Vec<&PathBuf> = real.iter().collect();
    unique.sort();
    unique.dedup();
    // One after another on the caller's thread: rayon's pool is the links'
    // (a link's input digests would wait behind these hundreds of megabytes).
    let distinct: std::collections::HashMap<&PathBuf, Option<(u64, [u8; 32])>> =
        unique.iter().map(|p| (*p, file_digest(p).ok())).collect();
    let digests: Vec<Option<(u64, [u8; 32])>> = real.iter().map(|p| distinct[p]).collect();
    let mut h = blake3::Hasher::new();
    h.update(b"nvlinkd-toolkit-identity-v3\0");
    h.update(&(banner.len() as u64).to_le_bytes());
    h.update(banner.as_bytes());
    // The root as named (what nvlink itself may print of it), and each file
    // by its place under the root.
    for part in
        std::iter::once(root.as_os_str()).chain(files.iter().map(|p| p.strip_prefix(root).unwrap_or(p).as_os_str()))
    {
        h.update(&(part.len() as u64).to_le_bytes());
        h.update(part.as_encoded_bytes());
    }
    for d in &digests {
        match d {
            Some((len, digest)) => {
                h.update(b"file");
                h.update(&len.to_le_bytes());
                h.update(digest);
            }
            None => {
                h.update(b"absent");
            }
        }
    }
    *h.finalize().as_bytes()
}

/// A file's length and BLAKE3 digest, read in pieces.
fn file_digest(path: &Path) -> std::io::Result<(u64, [u8; 32])> {
    use std::io::Read;
    let mut f = std::fs::File::open(path)?;
    if !f.metadata()?.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    let mut h = blake3::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut len = 0u64;
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        len += n as u64;
        h.update(&buf[..n]);
    }
    Ok((len, *h.finalize().as_bytes()))
}

/// The files' identity on disk, with the banner: the key of the remembered
/// content identity (see [`Toolkit::identity`]).
fn stat_identity(banner: &str, files: &[PathBuf]) -> [u8; 32] {
    use std::os::unix::fs::MetadataExt;
    let mut h = blake3::Hasher::new();
    h.update(b"nvlinkd-toolkit-identity-v2\0");
    h.update(&(banner.len() as u64).to_le_bytes());
    h.update(banner.as_bytes());
    for p in files {
        let real = std::fs::canonicalize(p).unwrap_or_else(|_| p.clone());
        for part in [p.as_os_str(), real.as_os_str()] {
            h.update(&(part.len() as u64).to_le_bytes());
            h.update(part.as_encoded_bytes());
        }
        match std::fs::metadata(&real) {
            Ok(m) => {
                for v in [m.dev(), m.ino(), m.size()] {
                    h.update(&v.to_le_bytes());
                }
                for v in [m.mtime(), m.mtime_nsec(), m.ctime(), m.ctime_nsec()] {
                    h.update(&v.to_le_bytes());
                }
            }
            Err(_) => {
                h.update(b"absent");
            }
        }
    }
    *h.finalize().as_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity_of(banner: &str, root: &Path, files: &[PathBuf], memo: Option<&Path>) -> [u8; 32] {
        remembered_identity(banner, root, files, memo, stat_identity(banner, files))
    }

    #[test]
    fn identity_follows_the_files() {
        // A toolkit-shaped directory: the identity changes when a binary is
        // rewritten, even with the same size and modification time.
        let root = std::env::temp_dir().join(format!("nvlinkd-tk-identity-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("bin")).unwrap();
        let ptxas = root.join("bin/ptxas");
        std::fs::write(&ptxas, b"ptxas one").unwrap();
        let files = [ptxas.clone(), root.join("bin/nvlink")];
        let first = stat_identity("banner", &files);
        assert_eq!(first, stat_identity("banner", &files));
        assert_ne!(first, stat_identity("another banner", &files));
        let mtime = std::fs::metadata(&ptxas).unwrap().modified().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&ptxas, b"ptxas two").unwrap();
        std::fs::File::options().write(true).open(&ptxas).unwrap().set_modified(mtime).unwrap();
        assert_ne!(first, stat_identity("banner", &files), "a rewritten ptxas kept the identity");
        std::fs::write(root.join("bin/nvlink"), b"appeared").unwrap();
        assert_ne!(first, stat_identity("banner", &files), "a new binary kept the identity");
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn the_identity_is_the_contents_wherever_they_were_installed() {
        // The same files installed twice at one place (new inodes and times,
        // as on another host or after a reinstall): one identity. Other
        // contents or another place: another.
        let base = std::env::temp_dir().join(format!("nvlinkd-tk-content-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let (root, memo) = (base.join("cuda"), base.join("memo"));
        let install = |ptxas: &[u8]| {
            let _ = std::fs::remove_dir_all(&root);
            std::fs::create_dir_all(root.join("bin")).unwrap();
            std::fs::write(root.join("bin/ptxas"), ptxas).unwrap();
            std::fs::write(root.join("bin/nvlink"), b"nvlink").unwrap();
        };
        let files = || [root.join("bin/ptxas"), root.join("bin/nvlink"), root.join("nvvm/libdevice/libdevice.10.bc")];
        install(b"ptxas one");
        let first = identity_of("banner", &root, &files(), Some(&memo));
        let remembered = std::fs::read_dir(&memo).unwrap().count();
        assert_eq!(remembered, 1, "the content identity was not remembered");
        assert_eq!(first, identity_of("banner", &root, &files(), Some(&memo)));
        std::thread::sleep(std::time::Duration::from_millis(20));
        install(b"ptxas one");
        assert_eq!(first, identity_of("banner", &root, &files(), Some(&memo)), "a reinstall changed the identity");
        assert_eq!(first, identity_of("banner", &root, &files(), None));
        install(b"ptxas two");
        assert_ne!(first, identity_of("banner", &root, &files(), Some(&memo)), "other contents kept the identity");
        assert_ne!(first, identity_of("another banner", &root, &files(), None));
        install(b"ptxas one");
        let elsewhere = base.join("elsewhere");
        let moved: Vec<PathBuf> = files().iter().map(|f| elsewhere.join(f.strip_prefix(&root).unwrap())).collect();
        assert_ne!(first, content_identity("banner", &elsewhere, &moved), "another root kept the identity");
        let _ = std::fs::remove_dir_all(&base);
    }

    #[test]
    fn a_remembered_identity_is_read_back_only_for_the_same_files_on_disk() {
        let base = std::env::temp_dir().join(format!("nvlinkd-tk-memo-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let (root, memo) = (base.join("cuda"), base.join("memo"));
        std::fs::create_dir_all(root.join("bin")).unwrap();
        let ptxas = root.join("bin/ptxas");
        std::fs::write(&ptxas, b"ptxas one").unwrap();
        let files = [ptxas.clone()];
        let first = identity_of("banner", &root, &files, Some(&memo));
        // A planted memo for these very files is believed (it is the daemon's
        // own directory) ...
        let at = memo.join(hex(&stat_identity("banner", &files)));
        write_memo(&at, &[7; 32]);
        assert_eq!(identity_of("banner", &root, &files, Some(&memo)), [7; 32]);
        // ... and forgotten once a file is rewritten (its ctime moves).
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&ptxas, b"ptxas one").unwrap();
        assert_eq!(identity_of("banner", &root, &files, Some(&memo)), first);
        // A damaged memo is recomputed.
        std::fs::write(memo.join(hex(&stat_identity("banner", &files))), b"junk").unwrap();
        assert_eq!(identity_of("banner", &root, &files, Some(&memo)), first);
        let _ = std::fs::remove_dir_all(&base);
    }

    /// A toolkit at `root` whose content identities are remembered in `memo`.
    fn fake(root: &Path, memo: &Path) -> Toolkit {
        let banner = "Cuda compilation tools, release 13.5, V13.5.37\nBuild cuda_13.5.r13.5/compiler.39125733_0\n";
        Toolkit::of_release(root, Release::from_banner(banner).unwrap()).with_identity_memo(memo.to_owned())
    }

    /// A fresh cache directory's first links do not wait for the contents to
    /// be hashed: they key with a provisional identity until the hash is
    /// there, and a daemon on a directory that remembers it never waits.
    #[test]
    fn links_key_with_a_provisional_identity_until_the_contents_are_hashed() {
        let base = std::env::temp_dir().join(format!("nvlinkd-tk-provisional-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let (root, memo) = (base.join("cuda"), base.join("memo"));
        std::fs::create_dir_all(root.join("bin")).unwrap();
        std::fs::write(root.join("bin/ptxas"), b"ptxas").unwrap();
        std::fs::write(root.join("bin/nvlink"), b"nvlink").unwrap();
        let tk = fake(&root, &memo);
        let provisional = tk.key_identity();
        assert_eq!(provisional, tk.key_identity());
        assert!(tk.identity.get().is_none(), "keying hashed the contents");
        let content = tk.identity();
        assert_ne!(provisional, content);
        assert_eq!(tk.key_identity(), content);
        // Another daemon on the same cache directory reads it back.
        assert_eq!(fake(&root, &memo).key_identity(), content);
        let primed = Arc::new(fake(&root, &memo));
        primed.prime();
        assert_eq!(primed.identity.get(), Some(&content), "prime hashed again what was remembered");
        // Another installation (new inodes): provisional again, then the same contents.
        let fresh = fake(&base.join("elsewhere"), &memo);
        assert_ne!(fresh.key_identity(), provisional);
        let _ = std::fs::remove_dir_all(&base);
    }

    #[test]
    fn parses_banner() {
        let b = "nvlink: NVIDIA (R) Cuda linker\nCopyright (c) 2005-2026 NVIDIA Corporation\nBuilt on Mon_Oct_12_19:25:48_PDT_2026\nCuda compilation tools, release 13.5, V13.5.37\nBuild cuda_13.5.r13.5/compiler.39125733_0\n";
        let r = Release::from_banner(b).unwrap();
        assert_eq!((r.major, r.minor), (13, 5));
        assert_eq!(r.tools_line, "Cuda compilation tools, release 13.5, V13.5.37");
        assert_eq!(r.build_line, "Build cuda_13.5.r13.5/compiler.39125733_0");
        assert!(Release::from_banner("garbage").is_none());
    }
}
