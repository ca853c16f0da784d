//! How a link reads the files of the machine it was invoked on.
//!
//! nvlink reads its inputs, options files and library directories from the
//! invoking machine. In nvlinkd the link runs in the daemon, so every read goes
//! through [`InputFs`]: the daemon implements it by asking the shim over the
//! link's gRPC stream; tests and the command-line tools use [`LocalFs`]. Paths
//! given to an `InputFs` are absolute (the request's working directory already
//! applied).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Kind of a path, as far as a link cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileStat {
    pub is_dir: bool,
    pub size: u64,
}

pub trait InputFs: Send + Sync {
    /// The whole contents of a regular file.
    fn read(&self, path: &Path) -> io::Result<Arc<[u8]>>;
    /// Whether the path exists, and what it is.
    fn stat(&self, path: &Path) -> io::Result<FileStat>;
    /// A hint that these files will be read soon: a remote implementation asks
    /// for all of them at once instead of one round trip each.
    fn prefetch(&self, _paths: &[PathBuf]) {}
}

/// The local filesystem.
#[derive(Clone, Copy, Debug, Default)]
pub struct LocalFs;

impl InputFs for LocalFs {
    fn read(&self, path: &Path) -> io::Result<Arc<[u8]>> {
        if std::fs::metadata(path)?.is_dir() {
            return Err(io::Error::new(io::ErrorKind::IsADirectory, "is a directory"));
        }
        Ok(std::fs::read(path)?.into())
    }
    fn stat(&self, path: &Path) -> io::Result<FileStat> {
        let m = std::fs::metadata(path)?;
        Ok(FileStat { is_dir: m.is_dir(), size: m.len() })
    }
}

/// `path` made absolute against `cwd` (lexically: nvlink does not resolve symlinks).
pub fn absolute(cwd: &Path, path: &str) -> PathBuf {
    let p = Path::new(path);
    if p.is_absolute() {
        p.to_owned()
    } else {
        cwd.join(p)
    }
}
