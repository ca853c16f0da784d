//! Counters of a linker, reported by `nvlinkd stats --json`.

use std::sync::atomic::{AtomicU64, Ordering};

macro_rules! counters {
    ($($(#[$doc:meta])* $name:ident),* $(,)?) => {
        /// Monotonic counters; all relaxed atomics.
        #[derive(Debug, Default)]
        pub struct Stats { $($(#[$doc])* pub $name: AtomicU64,)* }

        impl Stats {
            /// One JSON object with every counter as a top-level integer.
            pub fn to_json(&self, extra: &[(&str, u64)]) -> String {
                let mut fields: Vec<String> = vec![
                    $(format!("\"{}\":{}", stringify!($name), self.$name.load(Ordering::Relaxed)),)*
                ];
                fields.extend(extra.iter().map(|(k, v)| format!("\"{k}\":{v}")));
                format!("{{{}}}", fields.join(","))
            }
        }
    };
}

counters! {
    /// Link requests received.
    requests,
    /// Whole-link results served from the cache.
    cache_hits,
    /// Whole links that had to be computed.
    cache_misses,
    /// Links computed in process (libnvJitLink + finalizer).
    in_process,
    /// Links computed by running the real nvlink.
    nvlink_process,
    /// Requests answered without linking (help, version, option errors, -ghls).
    frontend,
    /// Requests handed back to the shim to run the real nvlink.
    fallbacks,
    /// Requests that failed inside nvlinkd (answered with a fallback).
    failures,
    /// Links whose engine was failed by the daemon's environment (no space,
    /// no scratch directory, a tool that could not run): answered with a
    /// fallback, never cached.
    environment_faults,
    /// Links not cached because an input changed while they ran.
    uncached_changed_inputs,
    /// Per-module JIT (PTX to cubin) cache hits and misses.
    jit_hits,
    jit_misses,
    /// LTO: NVVM step (LTO IR to PTX) cache hits and misses.
    nvvm_hits,
    nvvm_misses,
    /// LTO: ptxas step (PTX to cubin) cache hits and misses.
    ptxas_hits,
    ptxas_misses,
    /// Links stopped before their answer: their caller went away, or a newer
    /// link of the same output superseded them (also counted in
    /// `cancelled_superseded`). Nothing of theirs is cached but finished artifacts.
    cancelled,
    cancelled_superseded,
    /// Speculative links started (another arch of a multi-arch build, a
    /// relink after a watched input changed); they are not `requests`.
    speculative_links,
    /// Real links served from an entry a speculative link computed (or was
    /// computing when they arrived).
    speculative_hits,
    /// Speculative links that ended (computed, served from the cache, or cancelled).
    speculative_finished,
    /// Speculative links cancelled by a newer change of their inputs.
    speculative_cancelled,
    /// Predictions not started because the speculative work was at its bound.
    speculative_dropped,
}

pub fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}
