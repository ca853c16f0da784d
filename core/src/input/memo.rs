//! A memo of decoded device code: fatbin SASS members, decompressed and parsed.
//!
//! Builds relink the same objects over and over: every executable links
//! libcudadevrt, each arch of a build links the same host objects, a one-unit
//! change relinks every other unit unchanged. Decompressing a CUB-heavy
//! object's fatbin member and parsing its symbol table costs more than nvlink's
//! whole link of it, so the daemon keeps the result, keyed by the BLAKE3 of the
//! member as stored (its payload and declared size), and bounded in bytes by
//! least-recent use. Keys are content: a changed object is a different key.

use std::sync::Arc;

use super::cubin::CubinInfo;
use super::Bytes;
use crate::cache::flight::Flights;
use crate::fatbin::Member;
use crate::lru::ByteLru;

type Key = [u8; 32];

/// Decoded members, shared by every request of a daemon.
pub struct DecodeMemo {
    lru: ByteLru<Key, Decoded>,
    /// Decodes under way: links started together that need the same member
    /// (the same object or library in every link of a burst) decode it once.
    flights: Flights<Decoded>,
}

/// A member's contents and what the plan reads from them.
#[derive(Clone)]
pub struct Decoded {
    pub bytes: Bytes,
    pub info: Arc<CubinInfo>,
}

impl DecodeMemo {
    /// A memo holding at most `limit` bytes of decoded contents.
    pub fn new(limit: u64) -> Self {
        DecodeMemo { lru: ByteLru::new(limit, |d| d.bytes.len() as u64), flights: Flights::default() }
    }

    /// The member under `key`: remembered, decoded by a concurrent caller, or
    /// decoded now with `decode` (an error is the caller's own: a caller that
    /// waited for a failed decode decodes again, and meets its own error).
    pub fn get_or_decode<E>(&self, key: Key, decode: impl Fn() -> Result<Decoded, E>) -> Result<Decoded, E> {
        if let Some(d) = self.get(&key) {
            return Ok(d);
        }
        let mut failed = None;
        let shared = self.flights.run(key, || {
            if let Some(d) = self.get(&key) {
                return Some(d);
            }
            match decode() {
                Ok(d) => {
                    self.put(key, d.clone());
                    Some(d)
                }
                Err(e) => {
                    failed = Some(e);
                    None
                }
            }
        });
        match (shared, failed) {
            (_, Some(e)) => Err(e),
            (Some(d), None) => Ok(d),
            (None, None) => decode(),
        }
    }

    pub fn key(member: &Member<'_>) -> Key {
        member.fingerprint()
    }

    pub fn get(&self, key: &Key) -> Option<Decoded> {
        self.lru.get(key)
    }

    pub fn put(&self, key: Key, decoded: Decoded) {
        self.lru.put(key, decoded)
    }

    /// Bytes of decoded contents held.
    pub fn bytes(&self) -> u64 {
        self.lru.bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decoded(n: usize) -> Decoded {
        Decoded { bytes: vec![0u8; n].into(), info: Arc::new(CubinInfo::default()) }
    }

    #[test]
    fn concurrent_decodes_of_one_member_run_once() {
        let memo = DecodeMemo::new(1 << 20);
        let runs = std::sync::atomic::AtomicUsize::new(0);
        let decode = || -> Result<Decoded, ()> {
            runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            std::thread::sleep(std::time::Duration::from_millis(100));
            Ok(decoded(10))
        };
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| assert_eq!(memo.get_or_decode([7; 32], decode).unwrap().bytes.len(), 10));
            }
        });
        assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 1);
        // A failed decode is not remembered, and each caller meets its own error.
        assert!(memo.get_or_decode([8; 32], || Err::<Decoded, _>("bad")).is_err());
        assert!(memo.get(&[8; 32]).is_none());
    }

    #[test]
    fn bounded_by_bytes_least_recent_first() {
        let memo = DecodeMemo::new(100);
        memo.put([1; 32], decoded(40));
        memo.put([2; 32], decoded(40));
        assert!(memo.get(&[1; 32]).is_some()); // 1 is now the most recent
        memo.put([3; 32], decoded(40));
        assert!(memo.bytes() <= 100);
        assert!(memo.get(&[2; 32]).is_none());
        assert!(memo.get(&[1; 32]).is_some() && memo.get(&[3; 32]).is_some());
        memo.put([4; 32], decoded(101)); // larger than the bound: not kept
        assert!(memo.get(&[4; 32]).is_none());
    }
}
