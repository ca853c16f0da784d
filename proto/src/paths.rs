//! Where the shim and the daemon meet by default, and the environment variables
//! that change it. Shared by both binaries so they always agree.

use std::path::{Path, PathBuf};

/// Unix socket of the daemon.
pub const ENV_SOCKET: &str = "NVLINKD_SOCKET";
/// Remote daemons (take precedence over the socket): `https://HOST:PORT`,
/// several separated by commas (tried in order); `http://` only when written.
pub const ENV_ADDR: &str = "NVLINKD_ADDR";
/// CA certificate (PEM) the remote daemon's certificate must chain to
/// (default: the system's roots).
pub const ENV_TLS_CA: &str = "NVLINKD_TLS_CA";
/// Client certificate chain (PEM) presented to a remote daemon that requires
/// one (`--client-ca`, mTLS); with [`ENV_TLS_KEY`].
pub const ENV_TLS_CERT: &str = "NVLINKD_TLS_CERT";
/// Private key (PEM) of [`ENV_TLS_CERT`].
pub const ENV_TLS_KEY: &str = "NVLINKD_TLS_KEY";
/// File whose first line is the bearer token sent to a remote daemon.
pub const ENV_TOKEN_FILE: &str = "NVLINKD_TOKEN_FILE";
/// Longest wait for the daemon's next message (seconds, default 600); a
/// silent daemon then costs this long and the real nvlink runs.
pub const ENV_TIMEOUT: &str = "NVLINKD_TIMEOUT";
/// The real nvlink, for fallback.
pub const ENV_REAL_NVLINK: &str = "NVLINKD_REAL_NVLINK";
/// `auto` (default): fall back to the real nvlink when no daemon answers;
/// `never`: fail instead.
pub const ENV_FALLBACK: &str = "NVLINKD_FALLBACK";
/// Cache directory of an auto-started daemon.
pub const ENV_CACHE_DIR: &str = "NVLINKD_CACHE_DIR";
/// The nvlinkd binary the shim starts when no daemon answers.
pub const ENV_DAEMON_BIN: &str = "NVLINKD_BIN";
/// The link's class: `background` (idle slots and idle CPU priority) or `foreground` (the default).
pub const ENV_PRIORITY: &str = "NVLINKD_PRIORITY";
/// `1`: the shim shows one progress line on stderr for links longer than a second.
pub const ENV_PROGRESS: &str = "NVLINKD_PROGRESS";
/// Idle time after which a daemon the shim starts exits (`nvlinkd serve --idle-exit`).
pub const ENV_IDLE_EXIT: &str = "NVLINKD_IDLE_EXIT";
/// File written by `nvlinkd install` next to the shim, recording the toolkit.
pub const OVERLAY_RECORD: &str = "nvlinkd-overlay.env";
/// Directory beside the shim (`<toolkit>/bin/.nvlinkd`) where `nvlinkd install
/// --in-place` keeps the toolkit's real nvlink, the daemon and the record.
pub const IN_PLACE_DIR: &str = ".nvlinkd";

/// What `nvlinkd install` records about the toolkit an installed shim or
/// daemon stands for (`OVERLAY_RECORD`, lines of `KEY=VALUE`).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct OverlayRecord {
    /// `CUDA_HOME`: the real toolkit's root.
    pub cuda_home: Option<PathBuf>,
    /// `REAL_NVLINK`: the real nvlink.
    pub real_nvlink: Option<PathBuf>,
    /// `NVLINKD`: the installed daemon binary.
    pub nvlinkd: Option<PathBuf>,
    /// `CUDA_HOME_NAMED`: the toolkit's root as `install` was given it (made
    /// absolute, symlinks kept: `/usr/local/cuda`, where `CUDA_HOME` is
    /// `/usr/local/cuda-13.5`), the path a plain build runs nvcc from. An
    /// overlay's shim writes it where nvcc wrote the overlay's own path.
    pub cuda_home_named: Option<PathBuf>,
    /// `DPKG_DIVERSION`: the file an in-place install diverted with
    /// `dpkg-divert` (`<toolkit>/bin/nvlink`, owned by a Debian package).
    pub dpkg_diversion: Option<PathBuf>,
}

impl OverlayRecord {
    pub fn parse(text: &str) -> Self {
        let mut r = OverlayRecord::default();
        for (k, v) in text.lines().filter_map(|l| l.split_once('=')) {
            // Absolute paths only: a relative one would name a file of
            // whatever directory a build runs in (a binary the shim runs).
            let v = Some(PathBuf::from(v.trim())).filter(|p| p.is_absolute());
            match k.trim() {
                "CUDA_HOME" => r.cuda_home = v,
                "REAL_NVLINK" => r.real_nvlink = v,
                "NVLINKD" => r.nvlinkd = v,
                "CUDA_HOME_NAMED" => r.cuda_home_named = v,
                "DPKG_DIVERSION" => r.dpkg_diversion = v,
                _ => {}
            }
        }
        r
    }

    /// The file's text (what `parse` reads).
    pub fn to_text(&self) -> String {
        [
            ("CUDA_HOME", &self.cuda_home),
            ("REAL_NVLINK", &self.real_nvlink),
            ("NVLINKD", &self.nvlinkd),
            ("CUDA_HOME_NAMED", &self.cuda_home_named),
            ("DPKG_DIVERSION", &self.dpkg_diversion),
        ]
        .iter()
        .filter_map(|(k, v)| v.as_ref().map(|v| format!("{k}={}\n", v.display())))
        .collect()
    }

    /// The record of the installation the executable `exe` belongs to, if any:
    /// `<toolkit>/bin/.nvlinkd/` for an in-place shim (`<toolkit>/bin/nvlink`),
    /// the executable's own directory for the in-place daemon
    /// (`<toolkit>/bin/.nvlinkd/nvlinkd`), `<prefix>/` for an overlay's
    /// `<prefix>/bin/nvlink` and `<prefix>/bin/nvlinkd`.
    pub fn of_executable(exe: &Path) -> Option<Self> {
        Self::found_for(exe).map(|(_, r)| r)
    }

    /// [`of_executable`](Self::of_executable) and the directory the record
    /// was found in (an overlay's prefix, `<toolkit>/bin/.nvlinkd`, ...).
    pub fn found_for(exe: &Path) -> Option<(PathBuf, Self)> {
        let bin = exe.parent()?;
        [Some(bin.join(IN_PLACE_DIR)), Some(bin.to_path_buf()), bin.parent().map(Path::to_path_buf)]
            .into_iter()
            .flatten()
            .find_map(|dir| std::fs::read_to_string(dir.join(OVERLAY_RECORD)).ok().map(|text| (dir, text)))
            .map(|(dir, text)| (dir, Self::parse(&text)))
    }

    /// The record of the running executable's installation.
    pub fn of_current_exe() -> Option<Self> {
        Self::of_executable(&std::env::current_exe().ok()?)
    }
}

pub fn uid() -> u32 {
    // SAFETY: getuid cannot fail.
    unsafe { libc_getuid() }
}

extern "C" {
    #[link_name = "getuid"]
    fn libc_getuid() -> u32;
}

/// The per-user runtime directory: `$XDG_RUNTIME_DIR/nvlinkd` or `/tmp/nvlinkd-$UID`.
pub fn runtime_dir() -> PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d).join("nvlinkd"),
        _ => PathBuf::from(format!("/tmp/nvlinkd-{}", uid())),
    }
}

/// The runtime directory if it is this user's own: created (mode 0700) where
/// missing; an existing one must be a directory, not a symlink, owned by this
/// user and writable by nobody else. None otherwise: in `/tmp` another user
/// may have made it first, to plant a daemon or a symlink there.
pub fn private_runtime_dir() -> Option<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let dir = runtime_dir();
    if let Some(parent) = dir.parent() {
        let _ = std::fs::create_dir_all(parent);
    }
    let _ = std::fs::DirBuilder::new().mode(0o700).create(&dir);
    private_dir(&dir).ok().map(|()| dir)
}

/// Whether `dir` is this user's own private directory: a directory itself
/// (`lstat`: not a symlink, which another user could re-point), owned by this
/// user, writable by nobody else. The error says which rule it breaks. The
/// shim, the daemon's socket and the control commands all hold the runtime
/// directory to this.
pub fn private_dir(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::symlink_metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if m.file_type().is_symlink() {
        return Err(format!("{} is a symlink, not a directory of this user's own", dir.display()));
    }
    if !m.is_dir() {
        return Err(format!("{} is not a directory", dir.display()));
    }
    if m.uid() != uid() {
        return Err(format!("{} belongs to uid {}, not to this user (uid {})", dir.display(), m.uid(), uid()));
    }
    if m.mode() & 0o022 != 0 {
        return Err(format!("{} is writable by others (mode {:o})", dir.display(), m.mode() & 0o7777));
    }
    Ok(())
}

/// The socket path: `$NVLINKD_SOCKET`, else `<runtime dir>/nvlinkd.sock`.
pub fn socket_path() -> PathBuf {
    match std::env::var_os(ENV_SOCKET) {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => runtime_dir().join("nvlinkd.sock"),
    }
}

/// The default cache directory: `$NVLINKD_CACHE_DIR`, `$XDG_CACHE_HOME/nvlinkd`
/// or `~/.cache/nvlinkd`.
pub fn cache_dir() -> PathBuf {
    if let Some(p) = std::env::var_os(ENV_CACHE_DIR).filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    if let Some(p) = std::env::var_os("XDG_CACHE_HOME").filter(|p| !p.is_empty()) {
        return PathBuf::from(p).join("nvlinkd");
    }
    match std::env::var_os("HOME").filter(|p| !p.is_empty()) {
        Some(h) => PathBuf::from(h).join(".cache/nvlinkd"),
        None => runtime_dir().join("cache"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Another user's directory, a world-writable one or a symlink is not
    /// this user's own runtime directory; a fresh one is made private.
    #[test]
    fn only_a_private_runtime_directory_is_used() {
        use std::os::unix::fs::PermissionsExt;
        let base = std::env::temp_dir().join(format!("nvlinkd-rt-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(&base).unwrap();
        std::env::set_var("XDG_RUNTIME_DIR", &base);
        let dir = private_runtime_dir().expect("a fresh runtime directory");
        assert_eq!(std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o700);
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert_eq!(private_runtime_dir(), None, "a world-writable directory");
        std::fs::remove_dir(&dir).unwrap();
        let elsewhere = base.join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &dir).unwrap();
        assert_eq!(private_runtime_dir(), None, "a symlink");
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn overlay_record_round_trip() {
        let r = OverlayRecord {
            cuda_home: Some("/opt/cuda".into()),
            real_nvlink: Some("/opt/cuda/bin/.nvlinkd/nvlink".into()),
            nvlinkd: None,
            cuda_home_named: Some("/usr/local/cuda".into()),
            dpkg_diversion: Some("/opt/cuda/bin/nvlink".into()),
        };
        assert_eq!(OverlayRecord::parse(&r.to_text()), r);
        assert_eq!(OverlayRecord::parse("junk\nCUDA_HOME = /x \n").cuda_home, Some("/x".into()));
    }
}
