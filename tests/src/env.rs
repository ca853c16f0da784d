//! Where things are: the repository, the toolkit, the built binaries.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The repository: `$NVLINKD_REPO_ROOT` where prebuilt test tools run from
/// another copy of it (the GPU machines), else the one they were built in.
pub fn repo_root() -> &'static Path {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    ROOT.get_or_init(|| {
        std::env::var_os("NVLINKD_REPO_ROOT")
            .map(PathBuf::from)
            .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("repo root").to_path_buf())
    })
}

/// The CUDA toolkit the tests use: `$NVLINKD_TEST_CUDA_HOME`, `$CUDA_HOME`, or
/// the project-local one installed (idempotently) by `scripts/setup-toolkit.sh`.
pub fn cuda_home() -> &'static Path {
    static HOME: OnceLock<PathBuf> = OnceLock::new();
    HOME.get_or_init(|| {
        for var in ["NVLINKD_TEST_CUDA_HOME", "CUDA_HOME"] {
            if let Some(p) = std::env::var_os(var).map(PathBuf::from).filter(|p| p.join("bin/nvlink").is_file()) {
                return p;
            }
        }
        let out =
            Command::new(repo_root().join("scripts/setup-toolkit.sh")).output().expect("run scripts/setup-toolkit.sh");
        assert!(out.status.success(), "toolkit setup failed: {}", String::from_utf8_lossy(&out.stderr));
        PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
    })
}

pub fn real_nvlink() -> PathBuf {
    cuda_home().join("bin/nvlink")
}

/// `target/<profile>`, where cargo put nvlinkd and the nvlink shim.
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable");
    // Tests run from target/<profile>/deps/<test>-<hash>, tools from target/<profile>/.
    let dir = exe.parent().expect("target dir");
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir.parent().expect("target dir").to_path_buf()
    } else {
        dir.to_path_buf()
    }
}

pub fn shim() -> PathBuf {
    let p = bin_dir().join("nvlink");
    assert!(p.is_file(), "{} missing: build the workspace first (cargo build --workspace)", p.display());
    p
}

pub fn nvlinkd() -> PathBuf {
    let p = bin_dir().join("nvlinkd");
    assert!(p.is_file(), "{} missing: build the workspace first (cargo build --workspace)", p.display());
    p
}

/// A shim's environment for a daemon it starts itself: its socket at
/// `socket`, its cache in `cache`, no fallback, the test toolkit.
pub fn auto_start_env(socket: &Path, cache: &Path) -> Vec<(String, String)> {
    vec![
        ("NVLINKD_SOCKET".into(), socket.display().to_string()),
        ("NVLINKD_CACHE_DIR".into(), cache.display().to_string()),
        ("NVLINKD_FALLBACK".into(), "never".into()),
        ("CUDA_HOME".into(), cuda_home().display().to_string()),
    ]
}

/// A fresh directory under the target dir, removed when dropped.
pub struct TempDir(pub PathBuf);

/// Write a secret's file as an operator would: for this user alone (mode
/// 0600); the daemon refuses token and key files others can read.
pub fn write_private(path: &Path, contents: &[u8]) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, contents).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // Short paths: unix socket paths are limited to ~108 bytes.
        let dir = std::env::temp_dir().join(format!("nvlt-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create temp dir");
        TempDir(dir)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `nvlinkd install --cuda-home <the test toolkit> --prefix <prefix>`: an
/// overlay whose `bin/nvlink` is the shim; panics with its stderr if it fails.
pub fn install_overlay(prefix: &Path) {
    let st = Command::new(nvlinkd())
        .args(["install", "--cuda-home"])
        .arg(cuda_home())
        .arg("--prefix")
        .arg(prefix)
        .output()
        .expect("run nvlinkd install");
    assert!(st.status.success(), "nvlinkd install: {}", String::from_utf8_lossy(&st.stderr));
}

/// The toolkit installed afresh at `at`: its directories made, the files a
/// link's answer depends on (nvlink, ptxas, libnvJitLink, libNVVM, libdevice)
/// copied (new inodes and times, as on another host), the rest linked.
pub fn install_toolkit_copy(at: &Path) {
    fn walk(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for e in std::fs::read_dir(from).unwrap().flatten() {
            let (src, dst) = (e.path(), to.join(e.file_name()));
            let name = e.file_name().to_string_lossy().into_owned();
            let t = e.file_type().unwrap();
            if t.is_symlink() {
                std::os::unix::fs::symlink(std::fs::read_link(&src).unwrap(), &dst).unwrap();
            } else if t.is_dir() {
                walk(&src, &dst);
            } else if ["nvlink", "ptxas", "libnvJitLink", "libnvvm", "libdevice"].iter().any(|p| name.starts_with(p)) {
                std::fs::copy(&src, &dst).unwrap();
            } else {
                std::os::unix::fs::symlink(&src, &dst).unwrap();
            }
        }
    }
    let _ = std::fs::remove_dir_all(at);
    walk(cuda_home(), at);
}
