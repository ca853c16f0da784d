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
use crate::fatbin::Member;
use crate::lru::ByteLru;

type Key = [u8; 32];

/// Decoded members, shared by every request of a daemon.
pub struct DecodeMemo {
    lru: ByteLru<Key, Decoded>,
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
        DecodeMemo { lru: ByteLru::new(limit, |d| d.bytes.len() as u64) }
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
