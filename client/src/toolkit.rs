//! Which toolkit this shim stands in for, and where the real nvlink is.
//!
//! In order: `NVLINKD_REAL_NVLINK`; the record `nvlinkd install` writes into an
//! overlay (`<prefix>/nvlinkd-overlay.env`, next to the shim's `bin/`), or
//! beside the shim by `nvlinkd install --in-place` (`bin/.nvlinkd/`, with the
//! toolkit's real nvlink); `CUDA_HOME`.
//!
//! The daemon is told the toolkit's *release* (the identity lines of its
//! nvlink's `--version`), never its directory: the daemon links with its own
//! toolkit of that release. Asking nvlink costs a process start, so the
//! answer is kept in the per-user runtime directory, named by the on-disk
//! identity of that nvlink (device, inode, size, mtime, ctime): an upgrade
//! rewrites the file and so names a new entry.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use nvlinkd_proto::paths;

#[derive(Debug, Default)]
pub struct Toolkit {
    /// The toolkit root (a CUDA_HOME), if known.
    pub cuda_home: Option<PathBuf>,
    /// The real nvlink, if known.
    pub real_nvlink: Option<PathBuf>,
    /// The nvlinkd binary recorded by the overlay.
    pub daemon_bin: Option<PathBuf>,
}

impl Toolkit {
    pub fn discover() -> Self {
        let mut tk = Toolkit::default();
        if let Some(record) = paths::OverlayRecord::of_current_exe() {
            tk.cuda_home = record.cuda_home;
            tk.real_nvlink = record.real_nvlink;
            tk.daemon_bin = record.nvlinkd;
        }
        if tk.cuda_home.is_none() {
            tk.cuda_home = std::env::var_os("CUDA_HOME").filter(|v| !v.is_empty()).map(PathBuf::from);
        }
        if let Some(p) = std::env::var_os(paths::ENV_REAL_NVLINK).filter(|v| !v.is_empty()) {
            let p = PathBuf::from(p);
            if tk.cuda_home.is_none() {
                tk.cuda_home = p.parent().and_then(Path::parent).map(Path::to_path_buf);
            }
            tk.real_nvlink = Some(p);
        }
        if tk.real_nvlink.is_none() {
            tk.real_nvlink = tk.cuda_home.as_ref().map(|h| h.join("bin/nvlink"));
        }
        tk
    }
}

impl Toolkit {
    /// The release identity of the real nvlink: the "Cuda compilation tools,
    /// release" and "Build" lines of its `--version`, joined by a newline.
    pub fn release(&self) -> Option<String> {
        let nvlink = self.real_nvlink.as_ref()?;
        let m = std::fs::metadata(nvlink).ok()?;
        // A memo only in a directory of this user's own, read and written
        // never through a symlink.
        let dir = paths::private_runtime_dir();
        let memo = format!(
            "release-{}-{}-{}-{}.{}-{}.{}",
            m.dev(),
            m.ino(),
            m.size(),
            m.mtime(),
            m.mtime_nsec(),
            m.ctime(),
            m.ctime_nsec()
        );
        let memo = dir.as_ref().map(|d| d.join(memo));
        if let Some(known) = memo.as_deref().and_then(read_nofollow).filter(|t| t.lines().count() == 2) {
            return Some(known);
        }
        let out =
            std::process::Command::new(nvlink).arg("--version").stdin(std::process::Stdio::null()).output().ok()?;
        let banner = String::from_utf8_lossy(&out.stdout);
        let tools = banner.lines().find(|l| l.starts_with("Cuda compilation tools, release "))?;
        let build = banner.lines().find(|l| l.starts_with("Build "))?;
        let identity = format!("{tools}\n{build}");
        // Best effort: a new temporary file (never an existing name), renamed into place.
        if let Some(memo) = memo {
            use std::io::Write;
            use std::os::unix::fs::OpenOptionsExt;
            let tmp = memo.with_extension(format!("tmp{}", std::process::id()));
            let written = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&tmp)
                .and_then(|mut f| f.write_all(identity.as_bytes()));
            if written.is_err() || std::fs::rename(&tmp, &memo).is_err() {
                let _ = std::fs::remove_file(&tmp);
            }
        }
        Some(identity)
    }
}

/// A small file's text, opened without following a symlink.
fn read_nofollow(path: &std::path::Path) -> Option<String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f =
        std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK).open(path).ok()?;
    if !f.metadata().ok()?.is_file() {
        return None;
    }
    let mut text = String::new();
    f.by_ref().take(4096).read_to_string(&mut text).ok()?;
    Some(text)
}
