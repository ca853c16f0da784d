//! The content-addressed store: a bounded in-memory LRU tier over a bounded
//! on-disk tier.
//!
//! Disk entries live at `<dir>/v2/<first two hex digits>/<64 hex digits>`, each a
//! small header (magic, the entry's own key, BLAKE3 of the payload, payload
//! length) and the payload. Writes go to a temporary file in the same directory
//! and are renamed into place, so a reader never sees half an entry and two
//! daemons sharing a directory never corrupt each other. Every read is verified
//! against the key it is read for and the stored hash: an entry under another
//! key's name (files swapped, copied or renamed by hand), a damaged or a
//! truncated entry is removed, counted as corrupt and reported as a miss, so it
//! is recomputed and replaced, never returned (which is also why writes are not
//! fsync'ed: a write a crash cut short is just such an entry). The disk tier is
//! trimmed to its bound by least-recent use (access refreshes the file's
//! modification time).
//!
//! The disk is an optimisation, never a condition: a cache directory that
//! cannot be written at start (read-only, full, not a directory) turns the disk
//! tier off with one log line; a write that fails later (no space left) drops
//! that entry (logged once until a write succeeds again) and the link's result
//! is unaffected.
//!
//! A shared tier ([`RemoteTier`], the daemon's REAPI cache) may stand behind
//! both: [`Store::fetch`] asks it after a local miss and fills memory and disk
//! from its (verified) answer; [`Store::store`] offers it every new entry.

use std::collections::HashMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use tracing::{debug, warn};

use crate::cache::remote::{Kind, RemoteTier};
use crate::lru::ByteLru;

/// A cache key: the BLAKE3 hash of everything the value depends on.
pub type Key = [u8; 32];

const MAGIC: &[u8; 8] = b"nvlkdc02";
/// Magic, key, BLAKE3 of the payload, payload length.
const HEADER: usize = 8 + 32 + 32 + 8;
/// The directory of this entry format under the cache directory.
const FORMAT_DIR: &str = "v2";
/// What a disk entry costs besides its bytes rounded up to [`BLOCK`]: an
/// inode, a directory entry and its place in the in-memory index.
const FILE_OVERHEAD: u64 = 1024;
/// The allocation unit a file's bytes are rounded up to (ext4, tmpfs, xfs).
const BLOCK: u64 = 4096;
/// What a memory entry costs besides its bytes: the LRU's node and key, the
/// value's allocation header.
const MEM_OVERHEAD: u64 = 256;

/// What a disk entry of `file_len` bytes (header included) is accounted at.
fn disk_cost(file_len: u64) -> u64 {
    file_len.div_ceil(BLOCK) * BLOCK + FILE_OVERHEAD
}

pub(crate) fn hex(key: &Key) -> String {
    key.iter().map(|b| format!("{b:02x}")).collect()
}

struct DiskIndex {
    /// Size and last use of every entry this process knows about.
    entries: HashMap<Key, (u64, SystemTime)>,
    bytes: u64,
}

impl DiskIndex {
    /// Whether it holds more than `bytes` or more than `files` entries.
    fn over(&self, bytes: u64, files: usize) -> bool {
        self.bytes > bytes || self.entries.len() > files
    }
}

/// Both tiers.
pub struct Store {
    dir: Option<PathBuf>,
    /// Bytes of the disk tier, each entry at [`disk_cost`].
    disk_limit: u64,
    /// Files of the disk tier.
    disk_files: usize,
    mem: ByteLru<Key, Arc<[u8]>>,
    disk: Mutex<DiskIndex>,
    tmp_counter: AtomicU64,
    /// Entries found damaged (or stored under another key) on disk and dropped.
    pub corrupt: AtomicU64,
    /// Disk writes that failed (the entry was dropped).
    pub write_errors: AtomicU64,
    /// Whether the last disk write failed (so that a full disk logs once).
    failing: std::sync::atomic::AtomicBool,
    /// The shared tier behind memory and disk, once the daemon sets one.
    remote: std::sync::OnceLock<Arc<dyn RemoteTier>>,
    /// Keys are the BLAKE3 of the payload itself (the daemon's blob store): a
    /// disk entry is used only if its payload hashes to its key.
    addressed: bool,
}

impl Store {
    /// A store over `dir` (None: memory only). Scans the directory to learn its
    /// current size.
    pub fn open(dir: Option<&Path>, mem_limit: u64, disk_limit: u64) -> Store {
        let mut dir = dir.map(|d| d.join(FORMAT_DIR));
        if let Some(d) = &dir {
            if let Err(e) = probe(d) {
                warn!(dir = %d.display(), "cache directory not writable ({e}): disk cache off, memory cache only");
                dir = None;
            }
        }
        let mut index = DiskIndex { entries: HashMap::new(), bytes: 0 };
        if let Some(d) = &dir {
            for (key, size, mtime) in scan(d) {
                index.bytes += disk_cost(size);
                index.entries.insert(key, (disk_cost(size), mtime));
            }
        }
        Store {
            dir,
            disk_limit,
            disk_files: usize::MAX,
            mem: ByteLru::new(mem_limit, |v| v.len() as u64 + MEM_OVERHEAD),
            disk: Mutex::new(index),
            tmp_counter: AtomicU64::new(0),
            corrupt: AtomicU64::new(0),
            write_errors: AtomicU64::new(0),
            failing: std::sync::atomic::AtomicBool::new(false),
            remote: std::sync::OnceLock::new(),
            addressed: false,
        }
    }

    /// A store whose keys are the BLAKE3 of their values (blobs): a disk
    /// entry whose payload does not hash to its key is damaged, dropped and a miss.
    pub fn content_addressed(mut self) -> Store {
        self.addressed = true;
        self
    }

    /// At most `files` entries on disk (the blob store: many tiny blobs
    /// would spend a filesystem's inodes long before its bytes).
    pub fn with_file_limit(mut self, files: usize) -> Store {
        self.disk_files = files.max(1);
        self
    }

    /// Whether entries go to disk.
    pub(crate) fn has_disk(&self) -> bool {
        self.dir.is_some()
    }

    fn path(&self, key: &Key) -> Option<PathBuf> {
        let h = hex(key);
        self.dir.as_ref().map(|d| d.join(&h[..2]).join(&h))
    }

    /// Bytes held in memory and on disk.
    pub fn sizes(&self) -> (u64, u64) {
        let mem = self.mem.bytes();
        let disk = self.disk.lock().map(|d| d.bytes).unwrap_or(0);
        (mem, disk)
    }

    /// Put a shared tier behind the local ones (once; later calls are ignored).
    /// Whether a shared tier is behind this store.
    pub fn has_remote(&self) -> bool {
        self.remote.get().is_some()
    }

    pub fn set_remote(&self, remote: Arc<dyn RemoteTier>) {
        let _ = self.remote.set(remote);
    }

    /// The shared tier's counters (none without one).
    pub fn remote_counters(&self) -> Vec<(&'static str, u64)> {
        self.remote.get().map(|r| r.counters()).unwrap_or_default()
    }

    /// Memory, then disk, then the shared tier: an entry found only there
    /// fills memory and disk (not offered back to the shared tier).
    pub fn fetch(&self, kind: Kind, key: &Key) -> Option<Arc<[u8]>> {
        if let Some(v) = self.get(key) {
            return Some(v);
        }
        let value: Arc<[u8]> = self.remote.get()?.get(kind, key)?.into();
        self.put_local(key, value.clone());
        Some(value)
    }

    /// Store locally and offer the entry to the shared tier.
    pub fn store(&self, kind: Kind, key: &Key, value: Arc<[u8]>) {
        self.put_local(key, value.clone());
        if let Some(r) = self.remote.get() {
            r.put(kind, key, value);
        }
    }

    /// Whether memory holds the entry or the disk has a file for it (not read:
    /// a later `get` still verifies it).
    pub fn contains(&self, key: &Key) -> bool {
        self.mem.get(key).is_some() || self.path(key).is_some_and(|p| p.is_file())
    }

    /// Memory and disk only.
    pub fn get(&self, key: &Key) -> Option<Arc<[u8]>> {
        if let Some(v) = self.mem.get(key) {
            return Some(v);
        }
        let path = self.path(key)?;
        let raw = fs::read(&path).ok()?;
        match verify(&raw, key).filter(|_| !self.addressed || &raw[40..72] == key) {
            Some(payload) => {
                let value: Arc<[u8]> = payload.into();
                // Touch: the disk tier evicts by least-recent use.
                let now = SystemTime::now();
                if let Ok(f) = fs::File::options().write(true).open(&path) {
                    let _ = f.set_modified(now);
                }
                if let Ok(mut d) = self.disk.lock() {
                    if let Some(e) = d.entries.get_mut(key) {
                        e.1 = now;
                    }
                }
                self.put_mem(key, value.clone());
                Some(value)
            }
            None => {
                warn!(entry = %path.display(), "damaged cache entry (or another key's) dropped");
                self.corrupt.fetch_add(1, Ordering::Relaxed);
                let _ = fs::remove_file(&path);
                if let Ok(mut d) = self.disk.lock() {
                    if let Some((size, _)) = d.entries.remove(key) {
                        d.bytes = d.bytes.saturating_sub(size);
                    }
                }
                None
            }
        }
    }

    /// Memory and disk only.
    pub fn put(&self, key: &Key, value: Arc<[u8]>) {
        self.put_local(key, value)
    }

    fn put_local(&self, key: &Key, value: Arc<[u8]>) {
        self.put_mem(key, value.clone());
        match self.put_disk(key, &value) {
            Ok(()) => {
                if self.failing.swap(false, Ordering::Relaxed) {
                    warn!("cache disk writes work again");
                }
            }
            Err(e) => {
                self.write_errors.fetch_add(1, Ordering::Relaxed);
                if !self.failing.swap(true, Ordering::Relaxed) {
                    warn!("cache disk write failed ({e}): entry kept in memory only, results unaffected");
                } else {
                    debug!("cache write failed: {e}");
                }
            }
        }
    }

    fn put_mem(&self, key: &Key, value: Arc<[u8]>) {
        self.mem.put(*key, value);
    }

    fn put_disk(&self, key: &Key, value: &[u8]) -> std::io::Result<()> {
        let Some(path) = self.path(key) else { return Ok(()) };
        let size = disk_cost((HEADER + value.len()) as u64);
        if size > self.disk_limit {
            return Ok(());
        }
        let dir = path.parent().ok_or_else(|| std::io::Error::other("no parent"))?;
        private_dirs(dir)?;
        let tmp = dir.join(format!(".tmp-{}-{}", std::process::id(), self.tmp_counter.fetch_add(1, Ordering::Relaxed)));
        let written = (|| {
            // A new file, never through a name someone planted.
            let mut f = new_file(&tmp)?;
            f.write_all(MAGIC)?;
            f.write_all(key)?;
            f.write_all(blake3::hash(value).as_bytes())?;
            f.write_all(&(value.len() as u64).to_le_bytes())?;
            f.write_all(value)?;
            // No fsync: an entry that a crash leaves short or zeroed fails its
            // hash check on read and is recomputed, so durability buys nothing
            // but milliseconds on every link.
            fs::rename(&tmp, &path)
        })();
        if written.is_err() {
            let _ = fs::remove_file(&tmp);
            return written;
        }
        let victims = {
            let mut d = self.disk.lock().map_err(|_| std::io::Error::other("poisoned"))?;
            if let Some((old, _)) = d.entries.insert(*key, (size, SystemTime::now())) {
                d.bytes = d.bytes.saturating_sub(old);
            }
            d.bytes += size;
            let mut victims = Vec::new();
            if d.over(self.disk_limit, self.disk_files) {
                // Trim to 90% of the bounds, least recently used first.
                let (bytes, files) = (self.disk_limit / 10 * 9, self.disk_files - self.disk_files / 10);
                let mut by_age: Vec<(SystemTime, Key, u64)> =
                    d.entries.iter().map(|(k, (s, t))| (*t, *k, *s)).collect();
                by_age.sort();
                for (_, k, s) in by_age {
                    if !d.over(bytes, files) {
                        break;
                    }
                    if &k == key {
                        continue;
                    }
                    d.entries.remove(&k);
                    d.bytes = d.bytes.saturating_sub(s);
                    victims.push(k);
                }
            }
            victims
        };
        for k in victims {
            if let Some(p) = self.path(&k) {
                let _ = fs::remove_file(p);
            }
        }
        Ok(())
    }
}

/// The payload of a stored entry, if it is intact and is the entry of `key`.
fn verify(raw: &[u8], key: &Key) -> Option<Vec<u8>> {
    if raw.len() < HEADER || &raw[..8] != MAGIC || &raw[8..40] != key {
        return None;
    }
    let len = u64::from_le_bytes(raw[72..80].try_into().ok()?) as usize;
    let payload = raw.get(HEADER..)?;
    if payload.len() != len || blake3::hash(payload).as_bytes() != &raw[40..72] {
        return None;
    }
    Some(payload.to_vec())
}

/// Create `dir` and its missing parents for this user alone (0700, whatever
/// the umask): nobody else may put an entry where the store reads them.
pub(crate) fn private_dirs(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)
}

/// Whether entries can be written under `dir`: create it and a file in it.
fn probe(dir: &Path) -> std::io::Result<()> {
    private_dirs(dir)?;
    let p = dir.join(format!(".probe-{}", std::process::id()));
    let _ = fs::remove_file(&p);
    let written = new_file(&p).and_then(|mut f| f.write_all(b"nvlinkd"));
    let _ = fs::remove_file(&p);
    written
}

/// Create `path` as a new file of this user's only (0600), failing on an
/// existing name or a symlink planted there.
fn new_file(path: &Path) -> std::io::Result<fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    fs::OpenOptions::new().write(true).create_new(true).mode(0o600).custom_flags(libc::O_NOFOLLOW).open(path)
}

fn scan(dir: &Path) -> Vec<(Key, u64, SystemTime)> {
    let mut out = Vec::new();
    let Ok(shards) = fs::read_dir(dir) else { return out };
    for shard in shards.flatten() {
        let Ok(files) = fs::read_dir(shard.path()) else { continue };
        for f in files.flatten() {
            let name = f.file_name();
            let Some(key) = parse_hex(&name.to_string_lossy()) else {
                // Leftover temporary files from an interrupted write.
                if name.to_string_lossy().starts_with(".tmp-") || name.to_string_lossy().starts_with(".probe-") {
                    let _ = fs::remove_file(f.path());
                }
                continue;
            };
            if let Ok(m) = f.metadata() {
                out.push((key, m.len(), m.modified().unwrap_or(SystemTime::UNIX_EPOCH)));
            }
        }
    }
    out
}

pub(crate) fn parse_hex(s: &str) -> Option<Key> {
    if s.len() != 64 {
        return None;
    }
    let mut k = [0u8; 32];
    for (i, b) in k.iter_mut().enumerate() {
        *b = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(k)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmpdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("nvlinkd-store-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        d
    }

    fn key(n: u8) -> Key {
        *blake3::hash(&[n]).as_bytes()
    }

    #[test]
    fn survives_reopen_and_detects_corruption() {
        let d = tmpdir("reopen");
        let s = Store::open(Some(&d), 1 << 20, 1 << 20);
        s.put(&key(1), Arc::from(&b"hello"[..]));
        drop(s);
        let s = Store::open(Some(&d), 1 << 20, 1 << 20);
        assert_eq!(s.get(&key(1)).as_deref(), Some(&b"hello"[..]));
        // Damage the file: the entry is dropped, not returned.
        let p = s.path(&key(1)).unwrap();
        let mut raw = fs::read(&p).unwrap();
        let last = raw.len() - 1;
        raw[last] ^= 1;
        fs::write(&p, &raw).unwrap();
        let s = Store::open(Some(&d), 1 << 20, 1 << 20);
        assert!(s.get(&key(1)).is_none());
        assert!(!p.exists());
        // Truncated.
        s.put(&key(2), Arc::from(&b"world"[..]));
        let p = s.path(&key(2)).unwrap();
        let raw = fs::read(&p).unwrap();
        fs::write(&p, &raw[..raw.len() - 2]).unwrap();
        let s = Store::open(Some(&d), 1 << 20, 1 << 20);
        assert!(s.get(&key(2)).is_none());
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn an_entry_is_only_served_for_its_own_key() {
        let d = tmpdir("swap");
        let s = Store::open(Some(&d), 0, 1 << 20);
        s.put(&key(1), Arc::from(&b"one"[..]));
        s.put(&key(2), Arc::from(&b"two"[..]));
        let (p1, p2) = (s.path(&key(1)).unwrap(), s.path(&key(2)).unwrap());
        let (b1, b2) = (fs::read(&p1).unwrap(), fs::read(&p2).unwrap());
        fs::write(&p1, &b2).unwrap();
        fs::write(&p2, &b1).unwrap();
        let s = Store::open(Some(&d), 0, 1 << 20);
        assert!(s.get(&key(1)).is_none());
        assert!(s.get(&key(2)).is_none());
        assert_eq!(s.corrupt.load(Ordering::Relaxed), 2);
        assert!(!p1.exists() && !p2.exists());
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn a_blob_on_disk_must_hash_to_its_key() {
        let d = tmpdir("blob");
        let blob = &b"device code"[..];
        let digest = *blake3::hash(blob).as_bytes();
        let s = Store::open(Some(&d), 0, 1 << 20).content_addressed();
        s.put(&digest, Arc::from(blob));
        assert_eq!(s.get(&digest).as_deref(), Some(blob));
        // Other bytes under the blob's name, with a header that is consistent
        // for them (their own hash): a plain store would serve them.
        let other = &b"other bytes"[..];
        let mut raw = Vec::from(&MAGIC[..]);
        raw.extend_from_slice(&digest);
        raw.extend_from_slice(blake3::hash(other).as_bytes());
        raw.extend_from_slice(&(other.len() as u64).to_le_bytes());
        raw.extend_from_slice(other);
        fs::write(s.path(&digest).unwrap(), &raw).unwrap();
        assert_eq!(Store::open(Some(&d), 0, 1 << 20).get(&digest).as_deref(), Some(other));
        fs::write(s.path(&digest).unwrap(), &raw).unwrap();
        let s = Store::open(Some(&d), 0, 1 << 20).content_addressed();
        assert!(s.get(&digest).is_none());
        assert_eq!(s.corrupt.load(Ordering::Relaxed), 1);
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn bounds_hold() {
        let d = tmpdir("bounds");
        let s = Store::open(Some(&d), 1000, 50_000);
        for n in 0..50u8 {
            s.put(&key(n), Arc::from(vec![n; 400]));
        }
        let (mem, disk) = s.sizes();
        assert!(mem <= 1000, "memory tier {mem}");
        assert!(disk <= 50_000, "disk tier {disk}");
        assert!(s.get(&key(49)).is_some(), "newest entry evicted");
        let _ = fs::remove_dir_all(&d);
    }

    /// Each entry is a file (a block and an inode) and an index entry: a
    /// store of tiny entries is held to its bounds at that cost, and to its
    /// number of files, not at a few bytes each.
    #[test]
    fn tiny_entries_cost_a_block_and_a_file() {
        let d = tmpdir("tiny");
        let s = Store::open(Some(&d), 64 << 10, 1 << 20).content_addressed().with_file_limit(100);
        for n in 0..1000u32 {
            let blob = n.to_le_bytes();
            s.put(blake3::hash(&blob).as_bytes(), Arc::from(&blob[..]));
        }
        let files: usize =
            fs::read_dir(d.join(FORMAT_DIR)).unwrap().flatten().map(|e| fs::read_dir(e.path()).unwrap().count()).sum();
        let (mem, disk) = s.sizes();
        assert!(files <= 100, "{files} files on disk");
        assert_eq!(disk, files as u64 * (BLOCK + FILE_OVERHEAD), "disk tier");
        assert!(mem <= 64 << 10, "memory tier {mem}");
        assert!(mem / (4 + MEM_OVERHEAD) <= 256, "{} tiny entries in 64 KiB", mem / (4 + MEM_OVERHEAD));
        // Opened again, the disk tier is counted the same way.
        let again = Store::open(Some(&d), 0, 1 << 20);
        assert_eq!(again.sizes().1, disk);
        let _ = fs::remove_dir_all(&d);
    }
}
