//! How a link reads the files of the machine it was invoked on.
//!
//! nvlink reads its inputs, options files and library directories from the
//! invoking machine. In nvlinkd the link runs in the daemon, so every read goes
//! through [`InputFs`]: the daemon implements it by asking the shim over the
//! link's gRPC stream; tests and the command-line tools use [`LocalFs`]. Paths
//! given to an `InputFs` are absolute (the request's working directory already
//! applied).
//!
//! Only regular files are ever read. nvlink opens whatever it is given and reads
//! it through stdio: `/dev/zero` gives it one 4 KiB buffer of zeros (and, by
//! extension, "cubin not an elf?" or a silently ignored host object), a FIFO
//! blocks it until a writer comes. Reading such a file whole would never end, and
//! opening a FIFO would block, so a read of anything that is not a regular file
//! or a directory fails with [`NotRegular`] without opening it: the daemon then
//! declines the link ([`InputFs::declined`]) and the shim runs the real nvlink,
//! which answers exactly as nvlink does because it is nvlink.

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
    /// for all of them at once instead of one round trip each, and may wait
    /// for them here, on the calling thread (the link's own), so that the
    /// reads that follow on other threads (rayon's) wait on nothing.
    fn prefetch(&self, _paths: &[PathBuf]) {}
    /// The file's identity on this machine, where the filesystem can tell
    /// (see [`HashMemo`]); `None` for remote files.
    fn identity(&self, _path: &Path) -> Option<FileIdentity> {
        None
    }
    /// Why this link must not be answered here, if a read met something only
    /// nvlink itself may read (a non-regular file) or went past the daemon's
    /// budget: the link is then handed back to the caller (fallback) and no
    /// engine of the daemon runs it.
    fn declined(&self) -> Option<String> {
        None
    }
}

pub use nvlinkd_fs::{is_not_regular, not_regular, read_regular, read_regular_shared, NotRegular};

/// Which file, at which version: device, inode, size and both timestamps.
/// Any write to the file changes its ctime, which nobody can set back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FileIdentity {
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i128,
    ctime_ns: i128,
}

/// Content hashes of local files, remembered by [`FileIdentity`] so that a
/// relink does not read and hash unchanged inputs again. The cache keys stay
/// content hashes; this only avoids recomputing them. A hash is remembered
/// only when the file's ctime was already [`SETTLED`] in the past when it was
/// read: a later write sets a new ctime, so a remembered identity can never
/// name different contents (a write within the same timestamp tick as the read
/// could, which is why recent files are always hashed again).
pub struct HashMemo {
    /// By identity and digest function (see [`HashMemo::digest`]).
    hashes: dashmap::DashMap<(FileIdentity, usize), [u8; 32]>,
    settle: std::time::Duration,
    /// Digests under way: the links of a burst that share an object read
    /// and hash it once (settled files only, those a digest is remembered for).
    flights: crate::cache::flight::Flights<[u8; 32]>,
}

/// How old a file's last change must be before its hash is remembered.
pub const SETTLED: std::time::Duration = std::time::Duration::from_secs(2);
/// Entries kept at most (the memo is cleared beyond, not trimmed: it is cheap to refill).
const HASH_MEMO_ENTRIES: usize = 1 << 16;

impl Default for HashMemo {
    fn default() -> Self {
        HashMemo::with_settle(SETTLED)
    }
}

impl HashMemo {
    /// A memo that remembers files unchanged for `settle` (tests use zero).
    pub(crate) fn with_settle(settle: std::time::Duration) -> Self {
        HashMemo { hashes: dashmap::DashMap::new(), settle, flights: Default::default() }
    }

    /// Hashes remembered.
    pub fn len(&self) -> usize {
        self.hashes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.hashes.is_empty()
    }

    /// The BLAKE3 of a file's contents, read through `fs`.
    pub fn hash(&self, fs: &dyn InputFs, path: &Path) -> io::Result<[u8; 32]> {
        self.digest(fs, path, whole)
    }

    /// `f` of a file's contents, read through `fs` (remembered per function:
    /// one file may be digested two ways).
    pub fn digest(&self, fs: &dyn InputFs, path: &Path, f: fn(&[u8]) -> [u8; 32]) -> io::Result<[u8; 32]> {
        let which = f as usize;
        let before = fs.identity(path);
        if let Some(h) = before.and_then(|id| self.hashes.get(&(id, which)).map(|h| *h)) {
            return Ok(h);
        }
        let Some(id) = before.filter(|id| settled(id, self.settle)) else {
            return self.compute(fs, path, f, before).map(|(h, _)| h);
        };
        // A concurrent caller digesting the same settled file: wait for its
        // digest as if it were remembered already (the same rule: the link
        // reads the file later only if its identity is still this one).
        let mut mine = None;
        let shared = self.flights.run(flight_key(&id, which), || {
            let computed = self.compute(fs, path, f, before);
            let remembered = computed.as_ref().ok().and_then(|(h, kept)| kept.then_some(*h));
            mine = Some(computed);
            remembered
        });
        match (mine, shared) {
            (Some(computed), _) => computed.map(|(h, _)| h),
            (None, Some(h)) => Ok(h),
            // The leader's digest was not remembered (its read failed, or the
            // file changed meanwhile): digest it here.
            (None, None) => self.compute(fs, path, f, before).map(|(h, _)| h),
        }
    }

    /// Read and digest the file, and remember the digest when the file kept
    /// the identity `before` through the read and has settled (the flag).
    fn compute(
        &self,
        fs: &dyn InputFs,
        path: &Path,
        f: fn(&[u8]) -> [u8; 32],
        before: Option<FileIdentity>,
    ) -> io::Result<([u8; 32], bool)> {
        let data = fs.read(path)?;
        let hash = f(&data);
        let kept = before.filter(|id| fs.identity(path) == Some(*id) && settled(id, self.settle));
        if let Some(id) = kept {
            if self.hashes.len() >= HASH_MEMO_ENTRIES {
                self.hashes.clear();
            }
            self.hashes.insert((id, f as usize), hash);
        }
        Ok((hash, kept.is_some()))
    }
}

impl FileIdentity {
    /// The identity of contents known by their BLAKE3 `digest` (a file a
    /// remote shim announced, read only if its bytes hash to it): hashes of
    /// it are remembered like a settled local file's, so a warm remote relink
    /// digests nothing again. No local file has it: device `u64::MAX` and
    /// timestamps before the epoch (a ctime cannot be set). It carries 192
    /// bits of the digest and the size.
    pub fn of_contents(digest: &[u8; 32], size: u64) -> FileIdentity {
        let word = |i: usize| u64::from_le_bytes(digest[i..i + 8].try_into().expect("8 bytes"));
        FileIdentity {
            dev: u64::MAX,
            ino: word(0),
            size,
            mtime_ns: -1 - i128::from(word(8)),
            ctime_ns: -1 - i128::from(word(16)),
        }
    }

    /// Whether this names contents (`of_contents`) rather than a local file:
    /// two names of equal contents may then be one file or two.
    pub(crate) fn is_contents(&self) -> bool {
        self.dev == u64::MAX && self.mtime_ns < 0
    }

    /// The status change time, in nanoseconds since the epoch.
    pub(crate) fn ctime_ns(&self) -> i128 {
        self.ctime_ns
    }
}

/// Contents of local files, remembered by [`FileIdentity`] under the same
/// rule as [`HashMemo`] (only files whose last change was [`SETTLED`] in the
/// past when they were read, so an identity never names two contents), and
/// bounded in bytes by least-recent use. Links started together read the
/// same objects and libraries (a burst of a build's links, every arch of a
/// multi-arch build, libcudadevrt in every link): each is read from disk
/// once, and every link shares its bytes.
pub struct ContentMemo {
    lru: crate::lru::ByteLru<FileIdentity, Arc<[u8]>>,
    settle: std::time::Duration,
    hits: std::sync::atomic::AtomicU64,
}

impl ContentMemo {
    /// A memo of at most `limit` bytes (0: none kept).
    pub fn new(limit: u64) -> Self {
        Self::with_settle(limit, SETTLED)
    }

    pub(crate) fn with_settle(limit: u64, settle: std::time::Duration) -> Self {
        ContentMemo {
            lru: crate::lru::ByteLru::new(limit, |d: &Arc<[u8]>| d.len() as u64),
            settle,
            hits: Default::default(),
        }
    }

    /// A regular file of at most `max` bytes, as [`read_regular_shared`]
    /// reads it; from the memo when a settled file of the same identity was
    /// read before (a path that is now something else, or another file, has
    /// another identity and is read).
    pub fn read(&self, path: &Path, max: u64) -> io::Result<Arc<[u8]>> {
        let before = LocalFs.identity(path).filter(|id| settled(id, self.settle));
        if let Some(d) = before.and_then(|id| self.lru.get(&id)).filter(|d| d.len() as u64 <= max) {
            self.hits.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return Ok(d);
        }
        let data = read_regular_shared(path, max)?;
        if let Some(id) = before.filter(|id| id.size == data.len() as u64 && LocalFs.identity(path) == Some(*id)) {
            self.lru.put(id, data.clone());
        }
        Ok(data)
    }

    /// Reads answered from the memo.
    pub fn hits(&self) -> u64 {
        self.hits.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        self.lru.bytes()
    }
}

fn whole(data: &[u8]) -> [u8; 32] {
    *blake3::hash(data).as_bytes()
}

/// The flight of one file version's digest by one function.
fn flight_key(id: &FileIdentity, which: usize) -> crate::cache::Key {
    let mut k = blake3::Hasher::new();
    k.update(&id.dev.to_le_bytes()).update(&id.ino.to_le_bytes()).update(&id.size.to_le_bytes());
    k.update(&id.mtime_ns.to_le_bytes()).update(&id.ctime_ns.to_le_bytes()).update(&which.to_le_bytes());
    *k.finalize().as_bytes()
}

fn settled(id: &FileIdentity, settle: std::time::Duration) -> bool {
    let now =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as i128).unwrap_or(0);
    let settle = settle.as_nanos() as i128;
    now - id.ctime_ns >= settle && now - id.mtime_ns >= settle
}

/// The local filesystem.
#[derive(Clone, Copy, Debug, Default)]
pub struct LocalFs;

impl InputFs for LocalFs {
    fn read(&self, path: &Path) -> io::Result<Arc<[u8]>> {
        read_regular_shared(path, u64::MAX)
    }
    fn stat(&self, path: &Path) -> io::Result<FileStat> {
        let m = std::fs::metadata(path)?;
        Ok(FileStat { is_dir: m.is_dir(), size: m.len() })
    }
    fn identity(&self, path: &Path) -> Option<FileIdentity> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(path).ok().filter(|m| m.is_file())?;
        Some(FileIdentity {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
            ctime_ns: i128::from(m.ctime()) * 1_000_000_000 + i128::from(m.ctime_nsec()),
        })
    }
}

/// `path` made absolute against `cwd` (lexically: nvlink does not resolve symlinks).
pub(crate) fn absolute(cwd: &Path, path: &str) -> PathBuf {
    let p = Path::new(path);
    if p.is_absolute() {
        p.to_owned()
    } else {
        cwd.join(p)
    }
}

/// Whether the caller's nvlink would find a libNVVM under `-nvvmpath` `dir`
/// (where it looks: `lib64/libnvvm.so`, then `lib/libnvvm.so`), as `fs` sees it.
pub(crate) fn has_libnvvm(fs: &dyn InputFs, dir: &Path) -> bool {
    ["lib64/libnvvm.so", "lib/libnvvm.so"].iter().any(|l| fs.stat(&dir.join(l)).is_ok_and(|s| !s.is_dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_file(name: &str, data: &[u8]) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("nvlinkd-fs-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("f.o");
        std::fs::write(&p, data).unwrap();
        p
    }

    #[test]
    fn fresh_files_are_hashed_every_time() {
        let p = temp_file("fresh", b"first contents");
        let memo = HashMemo::default();
        assert_eq!(memo.hash(&LocalFs, &p).unwrap(), *blake3::hash(b"first contents").as_bytes());
        // Just written: not remembered, so a rewrite within the same tick is still seen.
        assert!(memo.is_empty());
        std::fs::write(&p, b"other contents").unwrap();
        assert_eq!(memo.hash(&LocalFs, &p).unwrap(), *blake3::hash(b"other contents").as_bytes());
    }

    /// The local filesystem, counting reads; each read takes a while.
    struct SlowCounting(std::sync::atomic::AtomicUsize);

    impl InputFs for SlowCounting {
        fn read(&self, path: &Path) -> io::Result<Arc<[u8]>> {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            std::thread::sleep(std::time::Duration::from_millis(50));
            LocalFs.read(path)
        }
        fn stat(&self, path: &Path) -> io::Result<FileStat> {
            LocalFs.stat(path)
        }
        fn identity(&self, path: &Path) -> Option<FileIdentity> {
            LocalFs.identity(path)
        }
    }

    #[test]
    fn concurrent_digests_of_a_settled_file_read_it_once() {
        let p = temp_file("burst", b"an object every link of a burst names");
        let want = *blake3::hash(b"an object every link of a burst names").as_bytes();
        let memo = HashMemo::with_settle(std::time::Duration::ZERO);
        let fs = SlowCounting(Default::default());
        std::thread::scope(|s| {
            let links: Vec<_> = (0..4).map(|_| s.spawn(|| memo.hash(&fs, &p).unwrap())).collect();
            for l in links {
                assert_eq!(l.join().unwrap(), want);
            }
        });
        assert_eq!(fs.0.load(std::sync::atomic::Ordering::SeqCst), 1, "one read for four concurrent links");
        // A file that has not settled is read by each link (its digest is
        // not remembered, so not shared either).
        let fresh = HashMemo::default();
        let fs = SlowCounting(Default::default());
        std::thread::scope(|s| {
            let links: Vec<_> = (0..2).map(|_| s.spawn(|| fresh.hash(&fs, &p).unwrap())).collect();
            for l in links {
                assert_eq!(l.join().unwrap(), want);
            }
        });
        assert_eq!(fs.0.load(std::sync::atomic::Ordering::SeqCst), 2);
    }

    #[test]
    fn a_remembered_hash_follows_rewrites() {
        let p = temp_file("rewrite", b"first contents");
        let memo = HashMemo::with_settle(std::time::Duration::ZERO);
        assert_eq!(memo.hash(&LocalFs, &p).unwrap(), *blake3::hash(b"first contents").as_bytes());
        assert_eq!(memo.len(), 1);
        // Same size, new contents: the ctime moves on, so the identity differs.
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&p, b"other contents").unwrap();
        assert_eq!(memo.hash(&LocalFs, &p).unwrap(), *blake3::hash(b"other contents").as_bytes());
    }

    #[test]
    fn remembered_contents_follow_rewrites_and_refusals() {
        let p = temp_file("contents", b"first contents");
        let memo = ContentMemo::with_settle(1 << 20, std::time::Duration::ZERO);
        assert_eq!(&*memo.read(&p, u64::MAX).unwrap(), b"first contents");
        assert_eq!(&*memo.read(&p, u64::MAX).unwrap(), b"first contents");
        assert_eq!((memo.hits(), memo.bytes()), (1, 14));
        // Same size, new contents: the ctime moves on, so the identity differs.
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&p, b"other contents").unwrap();
        assert_eq!(&*memo.read(&p, u64::MAX).unwrap(), b"other contents");
        assert_eq!(memo.hits(), 1);
        // A remembered file is still refused beyond the reader's bound.
        assert_eq!(memo.read(&p, 9).unwrap_err().kind(), io::ErrorKind::FileTooLarge);
        // A file just written is read again every time (a rewrite within the tick is seen).
        let fresh = ContentMemo::new(1 << 20);
        fresh.read(&p, u64::MAX).unwrap();
        assert_eq!(fresh.bytes(), 0);
        // Other things at the path are read (and refused) as before.
        assert_eq!(memo.read(p.parent().unwrap(), u64::MAX).unwrap_err().kind(), io::ErrorKind::IsADirectory);
        assert!(is_not_regular(&memo.read(Path::new("/dev/zero"), u64::MAX).unwrap_err()));
    }

    #[test]
    fn shared_reads_are_whole_reads() {
        // A file longer than its stat said (here: one of /proc, size 0) is read to its end.
        let cmdline = Path::new("/proc/self/cmdline");
        let shared = read_regular_shared(cmdline, u64::MAX).unwrap();
        assert!(!shared.is_empty());
        assert_eq!(&*shared, &read_regular(cmdline, u64::MAX).unwrap()[..]);
        assert_eq!(read_regular_shared(cmdline, 1).unwrap_err().kind(), io::ErrorKind::FileTooLarge);
        for len in [0usize, 1, 4095, 4096, 1 << 20] {
            let data: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
            let p = temp_file(&format!("shared-{len}"), &data);
            assert_eq!(&*read_regular_shared(&p, u64::MAX).unwrap(), &data[..]);
            if len > 0 {
                let max = len as u64 - 1;
                assert_eq!(read_regular_shared(&p, max).unwrap_err().kind(), io::ErrorKind::FileTooLarge);
            }
        }
    }

    #[test]
    fn only_regular_files_are_read() {
        let p = temp_file("regular", b"0123456789");
        assert_eq!(&*LocalFs.read(&p).unwrap(), b"0123456789");
        assert_eq!(read_regular(&p, 9).unwrap_err().kind(), io::ErrorKind::FileTooLarge);
        assert_eq!(LocalFs.read(p.parent().unwrap()).unwrap_err().kind(), io::ErrorKind::IsADirectory);
        // Never read whole (it has no end), never opened blocking.
        assert!(is_not_regular(&LocalFs.read(Path::new("/dev/zero")).unwrap_err()));
        let fifo = p.with_file_name("fifo");
        let _ = std::fs::remove_file(&fifo);
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert!(is_not_regular(&LocalFs.read(&fifo).unwrap_err()));
        assert!(!fifo.is_file() && fifo.exists());
    }

    #[test]
    fn contents_known_by_digest_are_remembered_by_it() {
        struct Announced(&'static [u8]);
        impl InputFs for Announced {
            fn read(&self, _: &Path) -> io::Result<Arc<[u8]>> {
                Ok(Arc::from(self.0))
            }
            fn stat(&self, _: &Path) -> io::Result<FileStat> {
                Ok(FileStat { is_dir: false, size: self.0.len() as u64 })
            }
            fn identity(&self, _: &Path) -> Option<FileIdentity> {
                Some(FileIdentity::of_contents(blake3::hash(self.0).as_bytes(), self.0.len() as u64))
            }
        }
        let memo = HashMemo::default();
        let (a, b) = (Announced(b"first"), Announced(b"other"));
        assert_eq!(memo.hash(&a, Path::new("/x")).unwrap(), *blake3::hash(b"first").as_bytes());
        assert_eq!(memo.len(), 1, "settled from the start");
        assert_eq!(memo.hash(&b, Path::new("/x")).unwrap(), *blake3::hash(b"other").as_bytes());
        assert_eq!(memo.len(), 2);
        let id = a.identity(Path::new("/x")).unwrap();
        assert!(id.ctime_ns() < 0 && id != b.identity(Path::new("/x")).unwrap());
    }

    #[test]
    fn remote_files_are_never_remembered() {
        struct Remote;
        impl InputFs for Remote {
            fn read(&self, _: &Path) -> io::Result<Arc<[u8]>> {
                Ok(Arc::from(&b"remote"[..]))
            }
            fn stat(&self, _: &Path) -> io::Result<FileStat> {
                Ok(FileStat { is_dir: false, size: 6 })
            }
        }
        let memo = HashMemo::with_settle(std::time::Duration::ZERO);
        assert_eq!(memo.hash(&Remote, Path::new("/x")).unwrap(), *blake3::hash(b"remote").as_bytes());
        assert!(memo.is_empty());
    }
}
