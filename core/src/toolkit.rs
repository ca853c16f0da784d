//! A CUDA toolkit: where its pieces are, what release it is, and its identity.
//!
//! Everything nvlink writes that names the toolkit (the `--version` banner, the
//! release and build strings of the `.note.nv.tkinfo` note) is read from the
//! toolkit's own `nvlink --version`, never hard-coded. The identity, a BLAKE3 hash
//! over those strings and the libraries a link can use, is part of every cache
//! key, so a toolkit upgrade can never be served an old result.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, OnceLock};

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

impl Release {
    /// Parse the `nvlink --version` banner.
    pub fn from_banner(banner: &str) -> Option<Self> {
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

/// One installed toolkit.
pub struct Toolkit {
    pub root: PathBuf,
    pub release: Release,
    identity: OnceLock<[u8; 32]>,
    jitlink: OnceLock<Result<Arc<JitLink>, String>>,
    help: OnceLock<String>,
}

impl std::fmt::Debug for Toolkit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Toolkit").field("root", &self.root).field("release", &self.release.tools_line).finish()
    }
}

impl Toolkit {
    /// Open the toolkit at `root` (a CUDA_HOME): runs its `nvlink --version` once.
    pub fn open(root: &Path) -> Result<Self, ToolkitError> {
        let nvlink = root.join("bin/nvlink");
        if !nvlink.is_file() {
            return Err(ToolkitError::NoNvlink(nvlink));
        }
        let out = Command::new(&nvlink)
            .arg("--version")
            .output()
            .map_err(|e| ToolkitError::Version(nvlink.clone(), e.to_string()))?;
        let banner = String::from_utf8_lossy(&out.stdout).into_owned();
        let release = Release::from_banner(&banner).ok_or_else(|| ToolkitError::Banner(nvlink.clone()))?;
        Ok(Toolkit {
            root: root.to_owned(),
            release,
            identity: OnceLock::new(),
            jitlink: OnceLock::new(),
            help: OnceLock::new(),
        })
    }

    pub fn nvlink(&self) -> PathBuf {
        self.root.join("bin/nvlink")
    }

    /// The toolkit's ptxas (the in-process engine runs it for PTX → SASS).
    pub fn ptxas(&self) -> PathBuf {
        self.root.join("bin/ptxas")
    }

    /// `nvlink --help` of this toolkit, read once.
    pub fn help_text(&self) -> String {
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
    pub fn jitlink_path(&self) -> PathBuf {
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

    /// BLAKE3 over the release strings and the binaries whose behaviour a link
    /// depends on. Computed once (it reads ~200 MB).
    pub fn identity(&self) -> [u8; 32] {
        *self.identity.get_or_init(|| {
            let mut h = blake3::Hasher::new();
            h.update(self.release.banner.as_bytes());
            for p in [self.nvlink(), self.jitlink_path(), self.ptxas()] {
                h.update(p.as_os_str().as_encoded_bytes());
                if let Ok(bytes) = std::fs::read(&p) {
                    h.update_rayon(&bytes);
                }
            }
            *h.finalize().as_bytes()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
