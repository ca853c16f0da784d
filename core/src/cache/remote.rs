//! A shared cache tier behind the local ones: the trait the store calls.
//!
//! The core is synchronous and knows no network; the daemon implements this
//! trait with a Remote Execution API client (`server/src/reapi.rs`) and hands
//! it to the linker. The store asks it after a local miss and fills the local
//! tiers from its answer; it gives it every entry it stores.
//!
//! An implementation must keep a link's delay bounded whatever the tier does
//! (deadlines, giving up after failures), verify what it returns (the value is
//! the one stored for this `kind` and `key`, whole), and never fail: every
//! error is a miss, or a skipped upload.

use std::sync::Arc;

use super::Key;

/// What kind of entry a key names: the key domains of the store
/// (`link`: a whole link's entry; `jit`, `nvvm`, `ptxas`: intermediate
/// artifacts). Part of the remote address of an entry, and of its counters.
pub type Kind = &'static str;

pub trait RemoteTier: Send + Sync {
    /// The value stored under `key`, verified, or None (a miss, an error, a
    /// timeout). Blocks the calling (link) thread for a bounded time.
    fn get(&self, kind: Kind, key: &Key) -> Option<Vec<u8>>;
    /// Offer an entry to the tier; may return before (or without) uploading it.
    fn put(&self, kind: Kind, key: &Key, value: Arc<[u8]>);
    /// Counters for the daemon's stats, name → value.
    fn counters(&self) -> Vec<(&'static str, u64)>;
}
