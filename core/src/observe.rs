//! What a link does, as typed events: the core's one channel to whoever
//! watches links (the daemon's event stream, `server/src/observe/events.rs`).
//!
//! A [`Linker`](crate::Linker) holds one [`Observer`] (set at construction,
//! [`Linker::observed`](crate::Linker::observed); [`Ignore`] by default) and
//! hands each link a [`LinkObs`]: the link's id, the observer and the link's
//! `tracing` span, cheap to clone. The handle travels explicitly with the
//! link's work — into the in-process engine's context (whose steps run on the
//! rayon pool), the scheduler's admission and the verification job (which runs
//! on a thread of its own, after the answer) — so every event names its link
//! whatever thread emits it. No thread-locals, no span lookups.
//!
//! Emitted where things happen:
//!
//! - [`LinkEvent::PhaseStarted`] and [`LinkEvent::PhaseFinished`]: when a
//!   phase begins and ends ([`LinkObs::phase`]:
//!   `plan` in `Link::plan` (`link/pass.rs`), `jit`, `jitlink`, `nvvm`, `ptxas` and
//!   `finalize` in `engine/inprocess.rs`, `nvlink` in `Link::run_nvlink` (`link/engine.rs`)),
//!   `cached` when the step was an artifact served from the cache
//!   ([`InPhase::cached`], from `engine/artifacts.rs`), `aborted` when the
//!   link was stopped while it ran;
//! - [`LinkEvent::Queued`] and [`LinkEvent::Admitted`]: the scheduler
//!   (`sched.rs`), once per link when it must wait, and when it is admitted to
//!   compute;
//! - [`LinkEvent::VerifyMismatch`]: verification (`verify.rs`) found the
//!   in-process answer different from nvlink's.
//!
//! Phases are timed by one mechanism, [`InPhase`]: the guard enters the
//! phase's `debug` span for the log (whose end, at debug level, is logged with
//! its duration; target `nvlinkd_core::observe`) and measures the event's
//! milliseconds over the same interval. The linker's passes that events do
//! not report ([`Step`]: `keys`, `store`) are timed by the same guard
//! ([`LinkObs::step`]), which then emits nothing. The span's name is the phase's
//! [`Phase::name`], but the event schema depends on the enum, never on span
//! names or log fields, nor on what `NVLINKD_LOG` lets the log show. An
//! observer is called on the link's threads, sometimes under the scheduler's
//! lock: it must return at once (publish, never wait).

use std::cell::Cell;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::field::Empty;
use tracing::Span;

use crate::cancel::Cancel;
use crate::sched::Priority;

/// A step of a link that events report when it ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Inputs decoded and the link plan built (`plan.rs`).
    Plan,
    /// One PTX module compiled to a relocatable cubin (ptxas `-c`), once per module.
    Jit,
    /// nvJitLink's link of the cubins.
    JitLink,
    /// NVVM (nvJitLink `-lto -ptx`): LTO IR to PTX.
    Nvvm,
    /// ptxas on LTO's PTX.
    Ptxas,
    /// The finalizer: nvJitLink's cubin made nvlink's bytes.
    Finalize,
    /// The real nvlink as the engine.
    Nvlink,
}

impl Phase {
    /// Every phase, in the order a link may run them.
    pub const ALL: [Phase; 7] =
        [Phase::Plan, Phase::Jit, Phase::Nvvm, Phase::Ptxas, Phase::JitLink, Phase::Finalize, Phase::Nvlink];

    /// The name in events (`phase`) and of the phase's span in the log.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Plan => "plan",
            Phase::Jit => "jit",
            Phase::JitLink => "jitlink",
            Phase::Nvvm => "nvvm",
            Phase::Ptxas => "ptxas",
            Phase::Finalize => "finalize",
            Phase::Nvlink => "nvlink",
        }
    }

    /// The phase's span, a child of `parent` (the link's span), of target
    /// `nvlinkd_core::observe` (`NVLINKD_LOG=info,nvlinkd_core::observe=debug`
    /// logs the phases' timings alone). Steps that may be served from the
    /// artifact cache declare `cached` (recorded when the phase ends);
    /// `module` (jit) and `ptx_bytes` (ptxas) are recorded by the caller
    /// ([`InPhase::detail`]).
    fn span(self, parent: &Span) -> Span {
        // The names must stay `Phase::name`'s (one literal per macro call).
        match self {
            Phase::Plan => tracing::debug_span!(parent: parent, "plan"),
            Phase::Jit => tracing::debug_span!(parent: parent, "jit", module = Empty, cached = Empty),
            Phase::JitLink => tracing::debug_span!(parent: parent, "jitlink"),
            Phase::Nvvm => tracing::debug_span!(parent: parent, "nvvm", cached = Empty),
            Phase::Ptxas => tracing::debug_span!(parent: parent, "ptxas", ptx_bytes = Empty, cached = Empty),
            Phase::Finalize => tracing::debug_span!(parent: parent, "finalize"),
            Phase::Nvlink => tracing::debug_span!(parent: parent, "nvlink"),
        }
    }
}

/// A pass of the linker that the log times and events do not report
/// ([`LinkObs::step`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Step {
    /// The whole-link keys computed (`linkcache::keys`).
    Keys,
    /// The link's entry written to the store.
    Store,
}

impl Step {
    /// The step's span, a child of `parent` (the link's span), of target
    /// `nvlinkd_core::observe` like the phases'.
    fn span(self, parent: &Span) -> Span {
        match self {
            Step::Keys => tracing::debug_span!(parent: parent, "keys"),
            Step::Store => tracing::debug_span!(parent: parent, "store"),
        }
    }
}

/// What happened to a link (see the module docs). `link` is the link's id
/// ([`Linker::link_span_with_id`](crate::Linker::link_span_with_id); 0: a
/// link given none).
#[derive(Clone, Debug, PartialEq)]
pub enum LinkEvent {
    /// A phase began. Phases of one kind may overlap (`jit` runs once per
    /// PTX module, in parallel): each start has its own finish.
    PhaseStarted { link: u64, phase: Phase },
    /// A phase ended; `cached`: its result came from the artifact cache;
    /// `aborted`: it was cut off (the link was cancelled or superseded while
    /// it ran, or the phase's step panicked), so its result is not the link's.
    PhaseFinished { link: u64, phase: Phase, cached: bool, aborted: bool, ms: f64 },
    /// The link must wait for a plan permit or a compute slot (once per link).
    Queued { link: u64, priority: Priority },
    /// The link was given a compute slot after `waited_ms`.
    Admitted { link: u64, priority: Priority, waited_ms: f64 },
    /// The real nvlink answered the link otherwise than the in-process engine
    /// (`--verify`): the repro bundle, if one was written, and what differs.
    VerifyMismatch { link: u64, bundle: Option<PathBuf>, differences: Vec<String> },
}

impl LinkEvent {
    /// The link the event is about.
    pub fn link(&self) -> u64 {
        match self {
            LinkEvent::PhaseStarted { link, .. }
            | LinkEvent::PhaseFinished { link, .. }
            | LinkEvent::Queued { link, .. }
            | LinkEvent::Admitted { link, .. }
            | LinkEvent::VerifyMismatch { link, .. } => *link,
        }
    }
}

/// Whoever watches links. Called on the link's own threads: it must not block.
pub trait Observer: Send + Sync {
    fn event(&self, e: &LinkEvent);
}

/// The observer that ignores everything (a linker's default).
pub struct Ignore;

impl Observer for Ignore {
    fn event(&self, _: &LinkEvent) {}
}

/// One link's observation handle: its id, the linker's observer and the
/// link's span (the parent of its phase spans). Cheap to clone; `Send`, so it
/// goes with the link's work to other threads.
#[derive(Clone)]
pub struct LinkObs {
    link: u64,
    observer: Arc<dyn Observer>,
    span: Span,
    /// The link's control handle: a phase that ends once the link is stopped
    /// was cut off (`aborted`).
    cancel: Option<Cancel>,
}

impl Default for LinkObs {
    /// No link, nobody watching.
    fn default() -> Self {
        LinkObs { link: 0, observer: Arc::new(Ignore), span: Span::none(), cancel: None }
    }
}

impl LinkObs {
    pub fn new(link: u64, observer: Arc<dyn Observer>, span: Span) -> LinkObs {
        LinkObs { link, observer, span, cancel: None }
    }

    /// The link's control handle, so that a phase cut off by a cancel is
    /// reported `aborted`.
    pub fn with_cancel(mut self, cancel: &Cancel) -> LinkObs {
        self.cancel = Some(cancel.clone());
        self
    }

    /// The link's id.
    pub fn link(&self) -> u64 {
        self.link
    }

    /// The link's span.
    pub fn span(&self) -> &Span {
        &self.span
    }

    /// Enter `phase` until the guard drops: its span (a child of the link's)
    /// is entered, and its [`LinkEvent::PhaseFinished`] is emitted at the end.
    pub fn phase(&self, phase: Phase) -> InPhase<'_> {
        let span = phase.span(&self.span).entered();
        self.emit(&LinkEvent::PhaseStarted { link: self.link, phase });
        InPhase { obs: self, phase: Some(phase), start: Instant::now(), cached: Cell::new(false), span }
    }

    /// Enter `step` until the guard drops: its span (a child of the link's)
    /// is entered and timed like a phase's, and no event is emitted.
    pub fn step(&self, step: Step) -> InPhase<'_> {
        let span = step.span(&self.span).entered();
        InPhase { obs: self, phase: None, start: Instant::now(), cached: Cell::new(false), span }
    }

    /// Run `f` inside `phase` ([`LinkObs::phase`]).
    pub fn in_phase<T>(&self, phase: Phase, f: impl FnOnce() -> T) -> T {
        let _phase = self.phase(phase);
        f()
    }

    /// Run `f` inside `step` ([`LinkObs::step`]).
    pub fn in_step<T>(&self, step: Step, f: impl FnOnce() -> T) -> T {
        let _step = self.step(step);
        f()
    }

    /// The link waits for the scheduler.
    pub fn queued(&self, priority: Priority) {
        self.emit(&LinkEvent::Queued { link: self.link, priority });
    }

    /// The link got a compute slot after `waited`.
    pub fn admitted(&self, priority: Priority, waited: Duration) {
        self.emit(&LinkEvent::Admitted { link: self.link, priority, waited_ms: waited.as_secs_f64() * 1e3 });
    }

    /// Verification found the link's in-process answer wrong.
    pub fn verify_mismatch(&self, bundle: Option<PathBuf>, differences: Vec<String>) {
        self.emit(&LinkEvent::VerifyMismatch { link: self.link, bundle, differences });
    }

    fn emit(&self, e: &LinkEvent) {
        self.observer.event(e);
    }
}

/// A phase in progress ([`LinkObs::phase`]), or a step ([`LinkObs::step`]):
/// its span entered, its clock running; dropping it ends the phase.
pub struct InPhase<'a> {
    obs: &'a LinkObs,
    /// None for a step (no event).
    phase: Option<Phase>,
    start: Instant,
    cached: Cell<bool>,
    span: tracing::span::EnteredSpan,
}

impl InPhase<'_> {
    /// The step was served from the artifact cache (`jit`, `nvvm`, `ptxas`).
    pub fn cached(&self) {
        self.cached.set(true);
    }

    /// Record a detail the phase's span declares (`module` of `jit`,
    /// `ptx_bytes` of `ptxas`), for the log.
    pub fn detail(self, field: &str, value: u64) -> Self {
        self.span.record(field, value);
        self
    }
}

impl Drop for InPhase<'_> {
    fn drop(&mut self) {
        let Some(phase) = self.phase else { return };
        let ms = self.start.elapsed().as_secs_f64() * 1e3;
        let (link, cached) = (self.obs.link, self.cached.get());
        let aborted = std::thread::panicking() || self.obs.cancel.as_ref().is_some_and(Cancel::is_cancelled);
        // (A field the phase's span does not declare is not recorded.)
        self.span.record("cached", cached);
        self.obs.emit(&LinkEvent::PhaseFinished { link, phase, cached, aborted, ms });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[derive(Default)]
    struct Recorder(Mutex<Vec<LinkEvent>>);

    impl Observer for Recorder {
        fn event(&self, e: &LinkEvent) {
            self.0.lock().unwrap().push(e.clone());
        }
    }

    /// The names events use for phases (the documented schema of
    /// `nvlinkd events --json`).
    #[test]
    fn phase_names_are_the_event_schemas() {
        let names: Vec<&str> = Phase::ALL.iter().map(|p| p.name()).collect();
        assert_eq!(names, ["plan", "jit", "nvvm", "ptxas", "jitlink", "finalize", "nvlink"]);
    }

    /// A phase ends once, when its guard drops, with the link's id, whether
    /// it was cached, and its time; on another thread too (a clone of the
    /// handle).
    #[test]
    fn a_phase_is_reported_once_when_it_ends_with_its_link() {
        let rec = Arc::new(Recorder::default());
        let obs = LinkObs::new(7, rec.clone(), Span::none());
        {
            let p = obs.phase(Phase::Nvvm);
            p.cached();
            assert_eq!(rec.0.lock().unwrap().len(), 1, "its end reported before it ended");
        }
        let other = obs.clone();
        std::thread::spawn(move || other.in_phase(Phase::Jit, || ())).join().unwrap();
        obs.queued(Priority::Background);
        obs.admitted(Priority::Background, Duration::from_millis(2));
        let got = rec.0.lock().unwrap().clone();
        assert!(got.iter().all(|e| e.link() == 7), "{got:?}");
        let phases: Vec<(Phase, bool)> = got
            .iter()
            .filter_map(|e| match e {
                LinkEvent::PhaseFinished { phase, cached, ms, aborted: false, .. } if *ms >= 0.0 => {
                    Some((*phase, *cached))
                }
                _ => None,
            })
            .collect();
        assert_eq!(phases, [(Phase::Nvvm, true), (Phase::Jit, false)]);
        assert_eq!(got[0], LinkEvent::PhaseStarted { link: 7, phase: Phase::Nvvm });
        assert_eq!(got[2], LinkEvent::PhaseStarted { link: 7, phase: Phase::Jit });
        assert!(matches!(got[4], LinkEvent::Queued { priority: Priority::Background, .. }));
        assert!(matches!(got[5], LinkEvent::Admitted { waited_ms, .. } if (waited_ms - 2.0).abs() < 1e-9));
    }

    /// A step (a pass events do not report) emits nothing.
    #[test]
    fn a_step_is_timed_without_events() {
        let rec = Arc::new(Recorder::default());
        let obs = LinkObs::new(3, rec.clone(), Span::none());
        assert_eq!(obs.in_step(Step::Keys, || 5), 5);
        drop(obs.step(Step::Store));
        assert!(rec.0.lock().unwrap().is_empty());
    }

    /// A phase that ends after its link was stopped was cut off: `aborted`.
    #[test]
    fn a_phase_cut_off_by_a_cancel_is_reported_aborted() {
        let rec = Arc::new(Recorder::default());
        let cancel = Cancel::new();
        let obs = LinkObs::new(9, rec.clone(), Span::none()).with_cancel(&cancel);
        obs.in_phase(Phase::Plan, || ());
        obs.in_phase(Phase::Ptxas, || cancel.cancel());
        let ended: Vec<(Phase, bool)> = rec
            .0
            .lock()
            .unwrap()
            .iter()
            .filter_map(|e| match e {
                LinkEvent::PhaseFinished { phase, aborted, .. } => Some((*phase, *aborted)),
                _ => None,
            })
            .collect();
        assert_eq!(ended, [(Phase::Plan, false), (Phase::Ptxas, true)]);
    }
}
