//! Why a link is not served in process: one type for every "not here".
//!
//! A link the in-process engine does not reproduce byte for byte goes to the
//! real nvlink (*routed*); a link no engine of this process can answer goes
//! back to the shim, which runs nvlink itself (*fallback*). Both carry a
//! [`Declined`]: a [`Reason`] (a category of docs/routed.md, or a
//! fault of the daemon's side) and the detail for the log. The
//! detail is what the shim is told (`fallback_reason`) and what the log shows;
//! the reason is what `nvlinkd stats --json` counts (`routed`).

use std::fmt;

/// The category of a declined link.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Reason {
    /// Partial LTO nvlink does differently from nvJitLink: several LTO modules
    /// beside non-LTO code, LTO code needing libcudadevrt alone (NVVM leaves
    /// the program relocatable), relocatable
    /// LTO output, `.nvvm`/`.ltoir` files, `-dlto` without libcudadevrt.
    PartialLto,
    /// `-dlto` options nvJitLink cannot express as nvlink applies them
    /// (`--nvvm-latest`, `-g`, `--keep-system-libraries`, `-Xnvvm` math
    /// options).
    LtoOptions,
    /// PTX compiled at link time with pruning or ptxas options.
    PtxJit,
    /// Member selection and arch checks not reproduced (`--arch compute_XY`,
    /// reused SASS of another minor, suffixed members, …).
    Arch,
    /// nvlink's own diagnostics where they are not reproduced (several
    /// multiply defined symbols, link errors with `--register-link-binaries`,
    /// `-Werror` beside infos).
    Diagnostics,
    /// Options whose effects are not reproduced (`-v`, `-time`, …).
    Options,
    /// Inputs whose messages are nvlink's (thin or malformed archives and
    /// fatbins, unreadable files, …).
    Input,
    /// Host references `-kernels-used` cannot express exactly.
    KernelsUsed,
    /// nvJitLink and the plan disagree on the kept device code.
    SafetyNet,
    /// A tool of the in-process engine failed (nvJitLink error, ptxas, the
    /// finalizer): nvlink's answer is nvlink's.
    Tool,
    /// nvlink itself crashes on the request (`-report-arch` without `--arch`).
    NvlinkCrash,
    /// The daemon's environment failed the link (scratch, disk, a tool that
    /// could not run, nvlink killed by a signal).
    Environment,
    /// The worker process serving the link died, timed out or was cancelled.
    Worker,
    /// An input only nvlink may read (not a regular file), or past the budget.
    InputDeclined,
    /// The link needs the real nvlink and the daemon does not share the
    /// caller's files.
    NotHere,
    /// The daemon has no toolkit of the release the caller's nvlink is (or
    /// none at all): the caller's nvlink serves it, and the shim says how to
    /// give the daemon that toolkit.
    NoToolkit,
    /// Verification found the in-process answer for this link wrong
    /// (`verify.rs`): the real nvlink serves it from then on.
    VerifyMismatch,
    /// The in-process engine is not proven on this toolkit's release
    /// (`Release::in_process_proven`): its nvlink links.
    Release,
    /// The toolkit's files changed on disk since the daemon opened it (an
    /// upgrade or patch in place): the caller's nvlink links until the
    /// daemon is restarted.
    ToolkitChanged,
}

impl Reason {
    /// All reasons, in the order `stats --json` lists them.
    pub const ALL: [Reason; 19] = [
        Reason::PartialLto,
        Reason::LtoOptions,
        Reason::PtxJit,
        Reason::Arch,
        Reason::Diagnostics,
        Reason::Options,
        Reason::Input,
        Reason::KernelsUsed,
        Reason::SafetyNet,
        Reason::Tool,
        Reason::NvlinkCrash,
        Reason::Environment,
        Reason::Worker,
        Reason::InputDeclined,
        Reason::NotHere,
        Reason::NoToolkit,
        Reason::VerifyMismatch,
        Reason::Release,
        Reason::ToolkitChanged,
    ];

    /// The name used in `stats --json` and the log.
    pub fn name(self) -> &'static str {
        match self {
            Reason::PartialLto => "partial_lto",
            Reason::LtoOptions => "lto_options",
            Reason::PtxJit => "ptx_jit",
            Reason::Arch => "arch",
            Reason::Diagnostics => "diagnostics",
            Reason::Options => "options",
            Reason::Input => "input",
            Reason::KernelsUsed => "kernels_used",
            Reason::SafetyNet => "safety_net",
            Reason::Tool => "tool",
            Reason::NvlinkCrash => "nvlink_crash",
            Reason::Environment => "environment",
            Reason::Worker => "worker",
            Reason::InputDeclined => "input_declined",
            Reason::NotHere => "not_here",
            Reason::NoToolkit => "no_toolkit",
            Reason::VerifyMismatch => "verify_mismatch",
            Reason::Release => "release",
            Reason::ToolkitChanged => "toolkit_changed",
        }
    }

    fn index(self) -> usize {
        Reason::ALL.iter().position(|r| *r == self).unwrap_or(0)
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A link (or a step of one) that is not served in process, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Declined {
    pub reason: Reason,
    /// What exactly, for the log and the shim (shown as is).
    pub detail: String,
}

impl Declined {
    pub fn new(reason: Reason, detail: impl Into<String>) -> Self {
        Declined { reason, detail: detail.into() }
    }
}

/// `Err(Declined)`: the short form used by the engines and the loader.
pub fn declined<T>(reason: Reason, detail: impl Into<String>) -> Result<T, Declined> {
    Err(Declined::new(reason, detail))
}

impl fmt::Display for Declined {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.detail)
    }
}

impl std::error::Error for Declined {}

/// Counts of declined links per reason (relaxed atomics).
#[derive(Debug, Default)]
pub struct ReasonCounts([std::sync::atomic::AtomicU64; Reason::ALL.len()]);

impl ReasonCounts {
    pub(crate) fn bump(&self, r: Reason) {
        self.0[r.index()].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn get(&self, r: Reason) -> u64 {
        self.0[r.index()].load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The reasons counted at least once, with their counts.
    pub(crate) fn pairs(&self) -> Vec<(&'static str, u64)> {
        Reason::ALL.iter().filter(|r| self.get(**r) > 0).map(|r| (r.name(), self.get(*r))).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_distinct_and_every_reason_is_listed() {
        let names: std::collections::BTreeSet<&str> = Reason::ALL.iter().map(|r| r.name()).collect();
        assert_eq!(names.len(), Reason::ALL.len());
        for (i, r) in Reason::ALL.iter().enumerate() {
            assert_eq!(r.index(), i);
        }
    }

    #[test]
    fn counts_list_the_reasons_counted_in_reason_order() {
        let c = ReasonCounts::default();
        assert!(c.pairs().is_empty());
        c.bump(Reason::Arch);
        c.bump(Reason::Arch);
        c.bump(Reason::PartialLto);
        assert_eq!(c.pairs(), vec![("partial_lto", 1), ("arch", 2)]);
    }

    #[test]
    fn the_detail_is_what_is_shown() {
        let d = Declined::new(Reason::Input, "x.a: thin archive");
        assert_eq!(d.to_string(), "x.a: thin archive");
    }
}
