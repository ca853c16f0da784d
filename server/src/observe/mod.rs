//! What the daemon tells: the event stream (`nvlinkd events`) and `/metrics`.

pub mod events;
pub mod metrics;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use nvlinkd_core::stats::{Kind, Snapshot};
use nvlinkd_core::Linker;

/// Where a daemon's figures live: one [`Snapshot`] of them is what
/// `nvlinkd stats --json`, `status` and `/metrics` report.
#[derive(Clone)]
pub struct Figures {
    pub linker: Arc<Linker>,
    pub blobs: Arc<crate::blobs::BlobStore>,
    pub staged: Arc<crate::link::staging::Counters>,
    pub connections: Arc<crate::net::incoming::Counters>,
    pub auth_failures: Arc<AtomicU64>,
    pub remote_links: Arc<crate::link::admission::RemoteLinks>,
}

impl Figures {
    /// The daemon's own figures first, then the linker's.
    pub fn snapshot(&self) -> Snapshot {
        let mut s = self.linker.snapshot();
        let mut own = vec![("auth_failures", self.auth_failures.load(Ordering::Relaxed), Kind::Counter)];
        own.extend(self.blobs.counters());
        own.extend(self.staged.counters());
        own.extend(self.connections.counters());
        own.extend(self.remote_links.counters());
        s.prepend(own);
        s
    }
}
