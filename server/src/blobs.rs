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
//!
//! A blob is fetched once however many links lack it at once (a build starts
//! many links of the same objects together): the first link whose shim
//! announced it *owns* its flight and asks its shim for it; the bytes are
//! verified and stored as soon as they arrive, whether that link reads them
//! or not; other links wait for the flight (at most the reply timeout) and
//! then read the store, or, if the flight failed (the owner's stream ended,
//! its bytes were refused), ask their own shims.

use nvlinkd_core::stats::Kind;
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use nvlinkd_core::cache::Store;
use tokio::sync::watch;
use tracing::warn;

pub type Digest = [u8; 32];

/// Whom a flight belongs to (`Request::caller`; zeros where the daemon does
/// not tell its callers apart).
pub type Caller = [u8; 32];

pub struct BlobStore {
    store: Store,
    /// Blobs on their way from a shim, by digest and by the remote caller
    /// that sends them: a link waits only on its own caller's uploads, never
    /// on another tenant's, who may announce a blob and never send it.
    flights: Mutex<HashMap<(Digest, Caller), Arc<Flight>>>,
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
            store: Store::open(dir.as_deref(), mem, disk).content_addressed().with_file_limit(max_files(disk)),
            flights: Mutex::new(HashMap::new()),
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

    /// Keep `data` as the blob of `digest`, if it is: true when it is the
    /// announced `size` and hashes to the digest (else nothing is kept, and
    /// the blob counts as refused).
    pub fn keep(&self, digest: &Digest, size: u64, data: &Arc<[u8]>) -> bool {
        if data.len() as u64 != size || blake3::hash(data).as_bytes() != digest {
            self.rejected.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        self.store.put(digest, data.clone());
        true
    }

    /// Who fetches a blob the store lacks: this link (it must ask its shim,
    /// then [`BlobStore::land`] the bytes), or another link already (wait for
    /// its flight).
    pub fn claim(&self, digest: &Digest, caller: &Caller) -> Claim {
        let mut flights = self.flights.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(f) = flights.get(&(*digest, *caller)) {
            return Claim::Wait(f.clone());
        }
        let f = Arc::new(Flight::default());
        flights.insert((*digest, *caller), f.clone());
        Claim::Own(f)
    }

    /// The end of an owned flight: `data` (the shim's reply, if any) is kept
    /// when it is `size` bytes that hash to `digest`; waiters are woken.
    pub fn land(&self, digest: &Digest, caller: &Caller, size: u64, data: Option<Vec<u8>>, flight: &Flight) {
        let landed = match data.map(Arc::<[u8]>::from) {
            None => Landed::Failed,
            Some(d) if self.keep(digest, size, &d) => Landed::Stored,
            Some(_) => Landed::Rejected,
        };
        self.flights.lock().unwrap_or_else(|p| p.into_inner()).remove(&(*digest, *caller));
        flight.finish(landed);
    }

    /// Counters for `nvlinkd stats --json`.
    pub fn counters(&self) -> Vec<(&'static str, u64, Kind)> {
        let (mem, disk) = self.store.sizes();
        let r = Ordering::Relaxed;
        vec![
            ("input_bytes_received", self.input_bytes_received.load(r), Kind::Counter),
            ("blob_hits", self.hits.load(r), Kind::Counter),
            ("blob_misses", self.misses.load(r), Kind::Counter),
            ("blob_rejected", self.rejected.load(r), Kind::Counter),
            ("blob_mem_bytes", mem, Kind::Gauge),
            ("blob_disk_bytes", disk, Kind::Gauge),
        ]
    }
}

/// Blob files a disk tier of `disk` bytes holds at most: one per
/// [`BYTES_PER_FILE`], and at least [`MIN_FILES`]. Each blob is a file; a
/// shim announcing many tiny ones would otherwise spend the filesystem's
/// inodes long before the bytes (each is also accounted at its blocks and an
/// inode's worth, `cache/store.rs`).
pub fn max_files(disk: u64) -> usize {
    usize::try_from(disk / BYTES_PER_FILE).unwrap_or(usize::MAX).max(MIN_FILES)
}

/// `--blob-size` bytes per blob file allowed (10 GiB: 327,680 files).
const BYTES_PER_FILE: u64 = 32 << 10;
/// Blob files allowed whatever `--blob-size` says.
const MIN_FILES: usize = 4096;

/// Whether files can be written in `dir` (made if missing).
fn writable(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let probe = dir.join(format!(".probe-blobs-{}", std::process::id()));
    let written = std::fs::write(&probe, b"nvlinkd");
    let _ = std::fs::remove_file(&probe);
    written
}

/// One blob on its way from a shim (see [`BlobStore::claim`]), waited for
/// on a link's thread ([`Flight::wait`]) or, before the link takes one, on
/// the runtime ([`Flight::landed`]).
pub struct Flight {
    landed: Mutex<Option<Landed>>,
    done: Condvar,
    landed_async: watch::Sender<Option<Landed>>,
}

impl Default for Flight {
    fn default() -> Self {
        Flight { landed: Mutex::new(None), done: Condvar::new(), landed_async: watch::channel(None).0 }
    }
}

/// How a flight ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Landed {
    /// Verified and in the store.
    Stored,
    /// The owner's shim sent other bytes than it announced.
    Rejected,
    /// No reply (the owner's stream ended or timed out).
    Failed,
}

pub enum Claim {
    Own(Arc<Flight>),
    Wait(Arc<Flight>),
}

impl Flight {
    fn finish(&self, landed: Landed) {
        *self.landed.lock().unwrap_or_else(|p| p.into_inner()) = Some(landed);
        self.done.notify_all();
        self.landed_async.send_replace(Some(landed));
    }

    /// How the flight ended, once it has (without a thread: the async side of [`Flight::wait`]).
    pub async fn landed(&self) -> Landed {
        let mut rx = self.landed_async.subscribe();
        let landed = match rx.wait_for(Option::is_some).await {
            Ok(l) => *l,
            // The sender lives as long as `self`.
            Err(_) => None,
        };
        landed.unwrap_or(Landed::Failed)
    }

    /// Wait at most `timeout` for the flight to end; None if it has not.
    pub fn wait(&self, timeout: Duration) -> Option<Landed> {
        let deadline = Instant::now() + timeout;
        let mut landed = self.landed.lock().unwrap_or_else(|p| p.into_inner());
        while landed.is_none() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            landed = self.done.wait_timeout(landed, left).unwrap_or_else(|p| p.into_inner()).0;
        }
        *landed
    }
}
