//! The blob store: remote shims' input files by content.
//!
//! A remote shim announces each file it serves by BLAKE3 digest and size
//! (`Start.files`). A link reads an announced file from here; only a blob the
//! store lacks is asked of the shim, and it is kept only after its bytes hash
//! to the digest announced for them (`stream_fs.rs`), so nothing a shim sends
//! can stand for other contents. Memory (an LRU bounded in bytes) over a
//! bounded disk tier at `<cache dir>/blobs` (the cache store's format, written
//! atomically; a disk entry whose payload does not hash to its name is dropped
//! and counted as a miss). Two daemons may share the directory.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use nvlinkd_core::cache::Store;
use tracing::warn;

pub type Digest = [u8; 32];

pub struct BlobStore {
    store: Store,
    /// Announced files read from the store.
    pub hits: AtomicU64,
    /// Announced files the store lacked (asked of the shim).
    pub misses: AtomicU64,
    /// Blobs refused: their bytes did not hash to the announced digest or
    /// size (the link is handed back to the shim, nothing is kept or cached).
    pub rejected: AtomicU64,
    /// Input bytes received over link streams (blobs and files read by path).
    pub input_bytes_received: AtomicU64,
}

impl BlobStore {
    /// Memory only when `cache_dir` is `None` or cannot be written.
    pub fn open(cache_dir: Option<&Path>, mem: u64, disk: u64) -> BlobStore {
        // Checked here so that the log says what is off (the cache store's own
        // line is about cached results).
        let dir = cache_dir.map(|d| d.join("blobs")).filter(|d| match writable(d) {
            Ok(()) => true,
            Err(e) => {
                warn!(dir = %d.display(), "blob directory not writable ({e}): remote inputs kept in memory only");
                false
            }
        });
        BlobStore {
            store: Store::open(dir.as_deref(), mem, disk).content_addressed(),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            input_bytes_received: AtomicU64::new(0),
        }
    }

    /// The blob of `digest`, if held (and `size` bytes long).
    pub fn get(&self, digest: &Digest, size: u64) -> Option<Arc<[u8]>> {
        self.store.get(digest).filter(|b| b.len() as u64 == size)
    }

    /// Whether the blob is (probably) held: in memory, or a file on disk that
    /// `get` will verify.
    pub fn has(&self, digest: &Digest) -> bool {
        self.store.contains(digest)
    }

    /// Keep `data` as the blob of `digest`, if it is: true when it hashes to
    /// the digest (else nothing is kept).
    pub fn verify_and_put(&self, digest: &Digest, data: &Arc<[u8]>) -> bool {
        if blake3::hash(data).as_bytes() != digest {
            self.rejected.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        self.store.put(digest, data.clone());
        true
    }

    /// Counters for `nvlinkd stats --json`.
    pub fn counters(&self) -> Vec<(&'static str, u64)> {
        let (mem, disk) = self.store.sizes();
        let r = Ordering::Relaxed;
        vec![
            ("input_bytes_received", self.input_bytes_received.load(r)),
            ("blob_hits", self.hits.load(r)),
            ("blob_misses", self.misses.load(r)),
            ("blob_rejected", self.rejected.load(r)),
            ("blob_mem_bytes", mem),
            ("blob_disk_bytes", disk),
        ]
    }
}

/// Whether files can be written in `dir` (made if missing).
fn writable(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let probe = dir.join(format!(".probe-blobs-{}", std::process::id()));
    let written = std::fs::write(&probe, b"nvlinkd");
    let _ = std::fs::remove_file(&probe);
    written
}
