//! The compiled corpus, built once per test run and shared by every test
//! process (cargo and nextest run tests in several processes): the build goes
//! to a directory keyed by the corpus sources and the toolkit, under a file lock.

use std::io::Write;
use std::os::unix::io::AsRawFd;
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use crate::env::{bin_dir, cuda_home, repo_root};

/// The directory holding the built corpus (see `tests/corpus/build.sh`).
pub fn dir() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| build("tests/corpus", "corpus.done"))
}

/// A view of the corpus for one test: a fresh directory of symlinks to every
/// corpus file, which [`Recompiled::swap`] points at the second compilation of
/// the same sources (`twin/` in the corpus) where there is one. The path stays
/// the same, as in an incremental build that recompiles a unit in place.
pub struct Recompiled {
    pub dir: crate::env::TempDir,
}

impl Recompiled {
    pub fn new(tag: &str) -> Recompiled {
        let dir = crate::env::TempDir::new(tag);
        for e in std::fs::read_dir(self::dir()).expect("corpus dir").flatten() {
            if e.file_name() != "twin" {
                std::os::unix::fs::symlink(e.path(), dir.path().join(e.file_name())).expect("symlink");
            }
        }
        Recompiled { dir }
    }

    /// The names compiled twice.
    pub fn twins() -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(self::dir().join("twin"))
            .expect("corpus twin dir")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    /// Point every recompiled name at its second compilation.
    pub fn swap(&self) {
        for name in Self::twins() {
            let link = self.dir.path().join(&name);
            std::fs::remove_file(&link).expect("remove symlink");
            std::os::unix::fs::symlink(self::dir().join("twin").join(&name), &link).expect("symlink");
        }
    }
}

/// Compile `big.cu` into `big.o` in `dir` with the real nvcc (`-rdc=true
/// -arch=sm_90`): a kernel summing an initialized `__device__` array of
/// `bytes` bytes. Its zeros compress, so the object stays small while the
/// linked cubin holds the whole array (large outputs from a tiny source).
/// With `launched`, host code launches the kernel (nvlinkd links it in
/// process); without, no host code references it (nvlinkd leaves that link to
/// the real nvlink).
pub fn big_array_object(dir: &std::path::Path, bytes: usize, launched: bool) -> PathBuf {
    let launch = if launched { "void launch(unsigned *out) { sum<<<1, 32>>>(out); }\n" } else { "" };
    let source = format!(
        "#define N ({bytes})\n\
         __device__ unsigned char table[N] = {{1, 2, 3}};\n\
         __global__ void sum(unsigned *out) {{ unsigned s = 0; for (int i = threadIdx.x; i < N; i += blockDim.x) s += table[i]; atomicAdd(out, s); }}\n\
         {launch}"
    );
    std::fs::write(dir.join("big.cu"), source).expect("write big.cu");
    let nvcc = Command::new(cuda_home().join("bin/nvcc"))
        .args(["-rdc=true", "-arch=sm_90", "-c", "big.cu", "-o", "big.o"])
        .current_dir(dir)
        .output()
        .expect("run nvcc");
    assert!(nvcc.status.success(), "nvcc: {}", String::from_utf8_lossy(&nvcc.stderr));
    dir.join("big.o")
}

/// The directory holding the built benchmark workload (`tests/bench/build.sh`).
pub fn workload() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| build("tests/bench", "workload.done"))
}

/// Run `<src>/build.sh` into a directory keyed by the sources and the toolkit,
/// once for all processes (under a file lock).
fn build(src: &str, done: &str) -> PathBuf {
    let src = repo_root().join(src);
    let mut h = blake3::Hasher::new();
    h.update(cuda_home().as_os_str().as_encoded_bytes());
    let mut names: Vec<_> = std::fs::read_dir(&src).expect("corpus dir").flatten().map(|e| e.path()).collect();
    names.sort();
    for p in names {
        h.update(p.file_name().unwrap_or_default().as_encoded_bytes());
        h.update(&std::fs::read(&p).unwrap_or_default());
    }
    let key = h.finalize().to_hex();
    let root = bin_dir().join("nvlinkd-corpus");
    let lock = lock_build_root(&root);
    let out = root.join(&key.as_str()[..16]);
    if !out.join(done).is_file() {
        let _ = std::fs::remove_dir_all(&out);
        let res =
            Command::new(src.join("build.sh")).arg(&out).env("CUDA_HOME", cuda_home()).output().expect("build.sh");
        if !res.status.success() {
            let _ = std::io::stderr().write_all(&res.stderr);
            panic!("build of {} failed", src.display());
        }
    }
    drop(lock);
    out
}

/// Create `root` and hold its `lock` file exclusively (test processes building
/// into it wait for each other) until the returned file is dropped.
pub fn lock_build_root(root: &std::path::Path) -> std::fs::File {
    std::fs::create_dir_all(root).expect("build root");
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(root.join("lock"))
        .expect("lock file");
    // SAFETY: flock on an open file descriptor; closing it releases the lock.
    assert_eq!(unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) }, 0, "flock");
    lock
}
