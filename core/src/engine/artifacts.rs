//! Cached intermediate artifacts: compiled PTX modules (JIT), NVVM's LTO PTX,
//! ptxas's whole-program cubins.
//!
//! Each level has its own key domain and its own hit/miss counters. Identical
//! work requested concurrently (two links sharing a module, two builds) is
//! computed once. Without a store, work is simply done.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use crate::cache::flight::Flights;
use crate::cache::{Key, KeyBuilder, Store};
use crate::declined::{Declined, Reason};
use crate::observe::InPhase;
use crate::stats::{bump, Stats};

/// Which counters an artifact belongs to.
#[derive(Clone, Copy, Debug)]
pub enum Level {
    /// A PTX module compiled to a relocatable cubin.
    Jit,
    /// LTO IR modules compiled to PTX by NVVM.
    Nvvm,
    /// PTX compiled to a whole-program cubin by ptxas.
    Ptxas,
}

impl Level {
    fn domain(self) -> &'static str {
        match self {
            Level::Jit => "jit",
            Level::Nvvm => "nvvm",
            Level::Ptxas => "ptxas",
        }
    }
}

pub struct Artifacts<'a> {
    pub store: Option<&'a Store>,
    pub flights: &'a Flights<Arc<[u8]>>,
    pub toolkit: [u8; 32],
    pub stats: &'a Stats,
}

impl Artifacts<'_> {
    fn counters(&self, level: Level) -> (&AtomicU64, &AtomicU64) {
        match level {
            Level::Jit => (&self.stats.jit_hits, &self.stats.jit_misses),
            Level::Nvvm => (&self.stats.nvvm_hits, &self.stats.nvvm_misses),
            Level::Ptxas => (&self.stats.ptxas_hits, &self.stats.ptxas_misses),
        }
    }

    /// A key for `level` over the toolkit and `parts`.
    pub fn key(&self, level: Level, parts: &[&[u8]]) -> Key {
        let mut k = KeyBuilder::new(level.domain());
        k.bytes(&self.toolkit);
        for p in parts {
            k.bytes(p);
        }
        k.finish()
    }

    /// The artifact for `key`, computing and storing it on a miss. `phase`,
    /// the link's phase this step is (`jit`, `nvvm`, `ptxas`), is marked
    /// cached on a hit.
    pub(crate) fn get_or_compute(
        &self,
        level: Level,
        key: Key,
        phase: &InPhase<'_>,
        compute: impl FnOnce() -> Result<Vec<u8>, Declined>,
    ) -> Result<Arc<[u8]>, Declined> {
        let (hits, misses) = self.counters(level);
        if let Some(v) = self.store.and_then(|s| s.fetch(level.domain(), &key)) {
            bump(hits);
            phase.cached();
            return Ok(v);
        }
        bump(misses);
        let mut error = None;
        let value = self.flights.run(key, || match compute() {
            // No tool succeeds with nothing: an empty artifact is a fault
            // (of the environment, or of a worker), never stored.
            Ok(v) if v.is_empty() => {
                error = Some(Declined::new(Reason::Environment, format!("{} produced nothing", level.domain())));
                None
            }
            Ok(v) => {
                let v: Arc<[u8]> = v.into();
                if let Some(s) = self.store {
                    s.store(level.domain(), &key, v.clone());
                }
                Some(v)
            }
            Err(e) => {
                error = Some(e);
                None
            }
        });
        value.ok_or_else(|| error.unwrap_or_else(|| Declined::new(Reason::Tool, "concurrent computation failed")))
    }
}
