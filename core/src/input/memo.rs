//! A memo of decoded device code: fatbin SASS members, decompressed and parsed.
//!
//! Builds relink the same objects over and over: every executable links
//! libcudadevrt, each arch of a build links the same host objects, a one-unit
//! change relinks every other unit unchanged. Decompressing a CUB-heavy
//! object's fatbin member and parsing its symbol table costs more than nvlink's
//! whole link of it, so the daemon keeps the result, keyed by the BLAKE3 of the
//! member as stored (its payload and declared size), and bounded in bytes by
//! least-recent use. Keys are content: a changed object is a different key.

use std::sync::{Arc, Mutex};

use lru::LruCache;

use super::cubin::CubinInfo;
use super::Bytes;
use crate::fatbin::Member;

type Key = [u8; 32];

/// Decoded members, shared by every request of a daemon.
pub struct DecodeMemo {
    inner: Mutex<Inner>,
    limit: u64,
}

struct Inner {
    lru: LruCache<Key, Decoded>,
    bytes: u64,
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
        DecodeMemo { inner: Mutex::new(Inner { lru: LruCache::unbounded(), bytes: 0 }), limit }
    }

    pub fn key(member: &Member<'_>) -> Key {
        member.fingerprint()
    }

    pub fn get(&self, key: &Key) -> Option<Decoded> {
        self.inner.lock().ok()?.lru.get(key).cloned()
    }

    pub fn put(&self, key: Key, decoded: Decoded) {
        let size = decoded.bytes.len() as u64;
        if size > self.limit {
            return;
        }
        let Ok(mut m) = self.inner.lock() else { return };
        if let Some(old) = m.lru.put(key, decoded) {
            m.bytes -= old.bytes.len() as u64;
        }
        m.bytes += size;
        while m.bytes > self.limit {
            match m.lru.pop_lru() {
                Some((_, v)) => m.bytes -= v.bytes.len() as u64,
                None => break,
            }
        }
    }

    /// Bytes of decoded contents held.
    pub fn bytes(&self) -> u64 {
        self.inner.lock().map(|m| m.bytes).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decoded(n: usize) -> Decoded {
        Decoded { bytes: vec![0u8; n].into(), info: Arc::new(CubinInfo::default()) }
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
