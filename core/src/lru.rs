//! A least-recently-used map bounded by the bytes of its values, shared by
//! threads: the cache store's memory tier and the memo of decoded device code
//! both keep "as much as fits in N bytes, most recently used first".

use std::hash::Hash;
use std::sync::Mutex;

use lru::LruCache;

/// At most `limit` bytes of values (as `size` weighs them); a value larger than
/// the whole bound is not kept; inserting evicts least-recently used entries
/// until the total fits again.
pub(crate) struct ByteLru<K: Hash + Eq, V> {
    inner: Mutex<Inner<K, V>>,
    limit: u64,
    size: fn(&V) -> u64,
}

struct Inner<K: Hash + Eq, V> {
    lru: LruCache<K, V>,
    bytes: u64,
}

impl<K: Hash + Eq, V: Clone> ByteLru<K, V> {
    pub(crate) fn new(limit: u64, size: fn(&V) -> u64) -> Self {
        ByteLru { inner: Mutex::new(Inner { lru: LruCache::unbounded(), bytes: 0 }), limit, size }
    }

    /// The value of `key`, now the most recently used.
    pub(crate) fn get(&self, key: &K) -> Option<V> {
        self.inner.lock().ok()?.lru.get(key).cloned()
    }

    pub(crate) fn put(&self, key: K, value: V) {
        let size = (self.size)(&value);
        if size > self.limit {
            return;
        }
        let Ok(mut m) = self.inner.lock() else { return };
        if let Some(old) = m.lru.put(key, value) {
            m.bytes -= (self.size)(&old);
        }
        m.bytes += size;
        while m.bytes > self.limit {
            match m.lru.pop_lru() {
                Some((_, v)) => m.bytes -= (self.size)(&v),
                None => break,
            }
        }
    }

    /// Bytes of values held.
    pub(crate) fn bytes(&self) -> u64 {
        self.inner.lock().map(|m| m.bytes).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lru(limit: u64) -> ByteLru<u8, Vec<u8>> {
        ByteLru::new(limit, |v| v.len() as u64)
    }

    #[test]
    fn evicts_least_recent_until_the_bytes_fit() {
        let c = lru(100);
        c.put(1, vec![0; 40]);
        c.put(2, vec![0; 40]);
        assert_eq!(c.bytes(), 80);
        assert!(c.get(&1).is_some()); // 1 is now the most recent
        c.put(3, vec![0; 40]); // 120 > 100: 2, the least recent, goes
        assert_eq!(c.bytes(), 80);
        assert!(c.get(&2).is_none());
        assert!(c.get(&1).is_some() && c.get(&3).is_some());
        c.put(4, vec![0; 90]); // evicts as many as needed: 3 and 1
        assert_eq!(c.bytes(), 90);
        assert!(c.get(&1).is_none() && c.get(&3).is_none() && c.get(&4).is_some());
    }

    #[test]
    fn replacing_a_key_counts_its_new_size_and_oversized_values_are_not_kept() {
        let c = lru(100);
        c.put(1, vec![0; 60]);
        c.put(1, vec![0; 10]);
        assert_eq!(c.bytes(), 10);
        c.put(2, vec![0; 101]);
        assert!(c.get(&2).is_none());
        assert_eq!(c.bytes(), 10);
        c.put(3, vec![0; 100]); // exactly the bound: kept, 1 evicted
        assert_eq!(c.bytes(), 100);
        assert!(c.get(&1).is_none() && c.get(&3).is_some());
    }
}
