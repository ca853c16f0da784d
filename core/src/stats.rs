//! Counters of a linker, and [`Snapshot`]: one reading of every figure of a
//! daemon, made once and written out by each reader (`nvlinkd stats --json`,
//! `/metrics`, `nvlinkd status`) — nobody parses another's text.

use std::sync::atomic::{AtomicU64, Ordering};

/// Whether a figure only grows (a counter) or goes up and down (a gauge).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
}

/// One reading of a daemon's figures.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// Flat figures, in report order: name, value, kind.
    pub values: Vec<(&'static str, u64, Kind)>,
    /// Links routed to the real nvlink, by reason (reasons counted at least once).
    pub routed: Vec<(&'static str, u64)>,
    /// Links answered "fall back", by reason.
    pub fallback_reasons: Vec<(&'static str, u64)>,
    /// The toolkits' roots.
    pub toolkits: Vec<String>,
    /// Remote links by the name of the token they presented (a daemon's
    /// `--token-file`), in name order.
    pub tokens: Vec<(String, TokenFigures)>,
    /// Remote links by the subject of the client certificate they presented
    /// where no token was required (`--client-ca`), in subject order.
    pub certificates: Vec<(String, TokenFigures)>,
}

/// What the remote links of one token did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TokenFigures {
    /// Links served (answered, declined or failed).
    pub links: u64,
    /// Links refused before they started (no slot in time).
    pub refused: u64,
    /// Bytes of input files their shims sent.
    pub bytes_received: u64,
    /// Bytes of answers (outputs, messages) sent to their shims.
    pub bytes_sent: u64,
}

impl TokenFigures {
    /// Each figure by name, in report order.
    pub fn named(&self) -> [(&'static str, u64); 4] {
        [
            ("links", self.links),
            ("refused", self.refused),
            ("bytes_received", self.bytes_received),
            ("bytes_sent", self.bytes_sent),
        ]
    }
}

impl Snapshot {
    pub fn counter(&mut self, name: &'static str, v: u64) {
        self.values.push((name, v, Kind::Counter));
    }

    pub fn gauge(&mut self, name: &'static str, v: u64) {
        self.values.push((name, v, Kind::Gauge));
    }

    /// Figures that go first (the daemon's own, before the linker's).
    pub fn prepend(&mut self, first: impl IntoIterator<Item = (&'static str, u64, Kind)>) {
        let mut v: Vec<_> = first.into_iter().collect();
        v.append(&mut self.values);
        self.values = v;
    }

    pub fn get(&self, name: &str) -> Option<u64> {
        self.values.iter().find(|(n, _, _)| *n == name).map(|(_, v, _)| *v)
    }

    /// One JSON object: every flat figure as a top-level integer, then
    /// `routed` and `fallback_reasons` (reason → count), `tokens` (name →
    /// its [`TokenFigures`] by name) and `toolkits`.
    pub fn to_json(&self) -> String {
        let quote = |s: &str| {
            let mut q = String::with_capacity(s.len() + 2);
            q.push('"');
            for c in s.chars() {
                match c {
                    '"' => q.push_str("\\\""),
                    '\\' => q.push_str("\\\\"),
                    c if (c as u32) < 0x20 => q.push_str(&format!("\\u{:04x}", c as u32)),
                    c => q.push(c),
                }
            }
            q.push('"');
            q
        };
        let object = |pairs: &[(&str, u64)]| {
            let f: Vec<String> = pairs.iter().map(|(k, v)| format!("{}:{v}", quote(k))).collect();
            format!("{{{}}}", f.join(","))
        };
        let mut fields: Vec<String> = self.values.iter().map(|(k, v, _)| format!("{}:{v}", quote(k))).collect();
        fields.push(format!("\"routed\":{}", object(&self.routed)));
        fields.push(format!("\"fallback_reasons\":{}", object(&self.fallback_reasons)));
        let tokens: Vec<String> =
            self.tokens.iter().map(|(name, f)| format!("{}:{}", quote(name), object(&f.named()))).collect();
        fields.push(format!("\"tokens\":{{{}}}", tokens.join(",")));
        let certificates: Vec<String> =
            self.certificates.iter().map(|(name, f)| format!("{}:{}", quote(name), object(&f.named()))).collect();
        fields.push(format!("\"certificates\":{{{}}}", certificates.join(",")));
        let toolkits: Vec<String> = self.toolkits.iter().map(|t| quote(t)).collect();
        fields.push(format!("\"toolkits\":[{}]", toolkits.join(",")));
        format!("{{{}}}", fields.join(","))
    }
}

macro_rules! counters {
    ($($(#[doc = $doc:literal])* $name:ident),* $(,)?) => {
        /// Monotonic counters; all relaxed atomics.
        #[derive(Debug, Default)]
        pub struct Stats { $($(#[doc = $doc])* pub $name: AtomicU64,)* }

        impl Stats {
            /// Every counter into `snapshot`.
            pub fn read_into(&self, snapshot: &mut Snapshot) {
                $(snapshot.counter(stringify!($name), self.$name.load(Ordering::Relaxed));)*
            }

            /// Each counter's doc comment, line by line (what `/metrics`
            /// says of it).
            const DOCS: &'static [(&'static str, &'static [&'static str])] = &[$((stringify!($name), &[$($doc),*])),*];
        }
    };
}

/// What the linker's figures that are not [`Stats`] counters mean.
const OTHER_HELP: &[(&str, &str)] = &[
    ("in_flight", "Links being served now"),
    ("uptime_s", "Seconds since the daemon started"),
    ("toolkits_hashing", "Toolkits still opening or having their contents hashed (their links key provisionally)"),
    ("workers", "nvJitLink worker processes alive"),
    ("worker_crashes", "nvJitLink worker processes that died while serving a link"),
    ("cache_mem_bytes", "Bytes in the memory cache tier"),
    ("cache_disk_bytes", "Bytes in the disk cache tier"),
    ("cache_disk", "Whether the disk cache tier is on (1) or off (0)"),
    ("cache_corrupt_entries", "Damaged disk cache entries found and dropped"),
    ("cache_write_errors", "Cache entries that could not be written to disk"),
    ("decoded_input_bytes", "Bytes of decoded inputs kept for reuse"),
    ("input_memo_bytes", "Bytes of local input files kept for the links reading them"),
    ("input_memo_hits", "Reads of local input files served from the memo"),
    ("queued", "Links waiting for a slot"),
    ("running_foreground", "Foreground links computing now"),
    ("running_background", "Background links computing now"),
    ("verified", "Links checked against the real nvlink"),
    ("verify_mismatches", "Links whose answer differed from the real nvlink's (healed, routed)"),
    ("verify_skipped", "Links not checked: the verification queue was full"),
    ("verify_pending", "Links waiting to be checked against the real nvlink"),
];

/// What a figure of the linker means, in one line (HELP in `/metrics`);
/// None for a name the linker does not report.
pub fn help(name: &str) -> Option<String> {
    if let Some((_, docs)) = Stats::DOCS.iter().find(|(n, _)| *n == name).filter(|(_, d)| !d.is_empty()) {
        let words: Vec<&str> = docs.iter().map(|l| l.trim()).collect();
        return Some(words.join(" "));
    }
    OTHER_HELP.iter().find(|(n, _)| *n == name).map(|(_, h)| (*h).to_owned())
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
    /// Requests handed back to the shim to run the real nvlink (cancelled
    /// links are counted in `cancelled` instead).
    fallbacks,
    /// Requests that failed inside nvlinkd (answered with a fallback).
    failures,
    /// Links whose engine was failed by the daemon's environment (no space,
    /// no scratch directory, a tool that could not run): answered with a
    /// fallback, never cached.
    environment_faults,
    /// Links not cached because an input changed while they ran.
    uncached_changed_inputs,
    /// Per-module JIT (PTX to cubin) cache hits.
    jit_hits,
    /// Per-module JIT (PTX to cubin) cache misses.
    jit_misses,
    /// LTO: NVVM step (LTO IR to PTX) cache hits.
    nvvm_hits,
    /// LTO: NVVM step (LTO IR to PTX) cache misses.
    nvvm_misses,
    /// LTO: ptxas step (PTX to cubin) cache hits.
    ptxas_hits,
    /// LTO: ptxas step (PTX to cubin) cache misses.
    ptxas_misses,
    /// Links stopped before their answer (never counted in `fallbacks`):
    /// their caller went away, someone cancelled them by id, or a newer link
    /// of the same output superseded them (also counted in
    /// `cancelled_superseded`). Nothing of theirs is cached but finished artifacts.
    cancelled,
    /// Links stopped because a newer link of the same output superseded them.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_is_one_json_object_with_its_maps_and_toolkits() {
        let mut s = Snapshot::default();
        s.counter("requests", 3);
        s.gauge("in_flight", 1);
        s.prepend([("auth_failures", 2, Kind::Counter)]);
        s.routed.push(("arch", 1));
        s.toolkits.push("/opt/cuda \"13\"".into());
        s.tokens.push(("ci".into(), TokenFigures { links: 2, refused: 1, bytes_received: 30, bytes_sent: 40 }));
        assert_eq!(
            s.to_json(),
            r#"{"auth_failures":2,"requests":3,"in_flight":1,"routed":{"arch":1},"fallback_reasons":{},"tokens":{"ci":{"links":2,"refused":1,"bytes_received":30,"bytes_sent":40}},"certificates":{},"toolkits":["/opt/cuda \"13\""]}"#
        );
        assert_eq!(s.get("in_flight"), Some(1));
    }
}
