//! Admission of links that must compute: a bounded, prioritised queue.
//!
//! Why here, in the synchronous core, and why only there: a link costs CPU only
//! once the whole-link cache missed (or there is no key); a cache hit, `--help`,
//! `--version` and nvlink's option errors are answered in microseconds and must
//! never wait behind compiles. So `Linker` asks for a plan permit right after
//! the whole-link lookup missed, and for a compute slot once planned (and
//! before running the real nvlink), not the service when a stream arrives. The core
//! is synchronous (no tokio), so this is a small priority semaphore on a
//! `Mutex`/`Condvar`.
//!
//! Two classes ([`Priority`]), one queue ordered by class, then arrival:
//!
//! - **Foreground** (the default: a build or a person waits for it) is admitted
//!   while fewer than `jobs` foreground links compute. A remote caller's
//!   foreground link (from the network listener) counts as foreground but
//!   queues apart: it starts only while fewer than `jobs` foreground links of
//!   either kind compute and no local one waits, and local links do not count
//!   remote ones against their `jobs`, so token holders keeping every slot
//!   busy never make the host's own build wait. Background links do not
//!   count against it: a foreground link that arrives while background work
//!   fills every slot starts at once. Background work runs at idle CPU priority
//!   (below), so letting foreground exceed the bound costs it nothing; the
//!   alternative — preempting background links — would throw their work away.
//! - **Background** (`NVLINKD_PRIORITY=background` in the shim's environment,
//!   and all speculative work) is admitted only while fewer than `jobs` links of
//!   either class compute and no foreground link waits: it fills idle slots,
//!   never more. Its computation runs at `SCHED_IDLE` ([`idle_priority`]): its
//!   nvJitLink workers are separate processes started at that policy (see
//!   `worker.rs`), its ptxas and nvlink children are started at it, and its
//!   parallel work runs on a second `--jobs` thread pool whose threads are at
//!   it. The kernel then gives the CPU to foreground work first.
//!
//! Two stages ([`Stage`]), each with its own budget, so that the daemon's
//! side of one link overlaps the worker side of another without admitting
//! more links to compute:
//!
//! - a **plan permit** ([`Scheduler::admit_plan`], taken where the whole-link
//!   cache missed) lets a link decode its inputs and build its plan on the
//!   daemon's threads: `jobs` permits per class, with the rules above;
//! - a **compute slot** ([`Scheduler::admit`], taken once the plan is built,
//!   or before the real nvlink runs) lets it link: nvJitLink or NVVM in a
//!   worker, ptxas, finalize. Admission gives the plan permit back, so at most
//!   `jobs` links compute and at most `jobs` more hold a plan: memory stays
//!   bounded however many links arrive, and a slot that frees finds its next
//!   link planned. Measured on 8 concurrent distinct links on 2 cores
//!   (docs/benchmarks.md, row (e)): with one admission for both, the plans of queued links waited
//!   for slots while cores idled.
//!
//! Background links compute only while no foreground link waits at either
//! stage or holds a plan permit: a foreground link that is still planning
//! computes next, as it would have with one admission. Events and the
//! `queued` counter see both stages: the link's observer (`observe.rs`) is
//! told once per link that it queued ([`LinkEvent::Queued`]: `link_queued`
//! on the event stream), and when it is admitted to compute
//! ([`LinkEvent::Admitted`]: `link_admitted`).
//!
//! [`LinkEvent::Queued`]: crate::observe::LinkEvent::Queued
//! [`LinkEvent::Admitted`]: crate::observe::LinkEvent::Admitted
//!
//! A link waiting for a slot is dropped as soon as it is cancelled (its shim
//! went away, or a newer link superseded it): the waiter checks its
//! [`Cancel`] every [`CANCEL_POLL`].
//!
//! Entry point for background work (speculative relinks included): give the
//! link a `Cancel::with_priority(Priority::Background)` and call
//! `Linker::link_cancellable`; admission, the idle CPU policy and the separate
//! pools follow from the handle. Code that computes outside a link can take a
//! slot itself with `linker.scheduler().admit(Priority::Background, &cancel, &LinkObs::default())`.

use std::collections::BTreeSet;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::cancel::Cancel;
use crate::observe::LinkObs;

/// How often a queued link checks whether it was cancelled.
pub const CANCEL_POLL: Duration = Duration::from_millis(20);

/// The class of a link's computation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Priority {
    /// Someone waits for this link (the default).
    #[default]
    Foreground = 0,
    /// Nobody waits: IDE background builds, speculative relinks.
    Background = 1,
}

impl Priority {
    /// The name used on the wire, in events and in `NVLINKD_PRIORITY`.
    pub fn name(self) -> &'static str {
        match self {
            Priority::Foreground => "foreground",
            Priority::Background => "background",
        }
    }

    /// `foreground`/`background` (any case); anything else is None.
    pub fn from_name(s: &str) -> Option<Priority> {
        match s.trim().to_ascii_lowercase().as_str() {
            "foreground" | "fg" => Some(Priority::Foreground),
            "background" | "bg" | "idle" => Some(Priority::Background),
            _ => None,
        }
    }
}

/// Where a link waits: for a plan permit, then for a compute slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Decoding its inputs and building its plan on the daemon's threads;
    /// held until the link is admitted to compute (or ends without).
    Plan = 0,
    /// Linking: nvJitLink or NVVM in a worker, ptxas, the real nvlink, finalize.
    Compute = 1,
}

/// Who a link computes for, within its priority: the scheduler's classes.
/// Foreground links of the daemon host's own users (`Local`) and of remote
/// callers (`Remote`) queue apart, so token holders filling every slot never
/// keep a local build waiting.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Class {
    Local = 0,
    Background = 1,
    Remote = 2,
}

impl Class {
    fn of(priority: Priority, remote: bool) -> Class {
        match (priority, remote) {
            (Priority::Background, _) => Class::Background,
            (Priority::Foreground, false) => Class::Local,
            (Priority::Foreground, true) => Class::Remote,
        }
    }

    fn priority(self) -> Priority {
        match self {
            Class::Background => Priority::Background,
            Class::Local | Class::Remote => Priority::Foreground,
        }
    }
}

#[derive(Default)]
struct State {
    /// Links holding a permit, per stage and class.
    running: [[usize; 3]; 2],
    /// Links waiting, per stage: (class, arrival).
    waiting: [BTreeSet<(Class, u64)>; 2],
    next: u64,
}

impl State {
    fn holding_class(&self, stage: Stage, class: Class) -> usize {
        self.running[stage as usize][class as usize]
    }

    fn holding(&self, stage: Stage, priority: Priority) -> usize {
        match priority {
            Priority::Background => self.holding_class(stage, Class::Background),
            Priority::Foreground => self.holding_class(stage, Class::Local) + self.holding_class(stage, Class::Remote),
        }
    }

    fn holding_all(&self, stage: Stage) -> usize {
        self.running[stage as usize].iter().sum()
    }

    /// Whether a foreground link waits at `stage`.
    fn foreground_waits(&self, stage: Stage) -> bool {
        self.waiting[stage as usize].iter().any(|w| w.0 != Class::Background)
    }

    /// Whether a local foreground link waits at `stage`.
    fn local_waits(&self, stage: Stage) -> bool {
        self.waiting[stage as usize].first().is_some_and(|w| w.0 == Class::Local)
    }
}

/// The bounded queue of links that must compute (see the module docs).
pub struct Scheduler {
    /// Compute slots, and plan permits, per class (each computing link may
    /// have one successor planned and ready).
    jobs: usize,
    state: Mutex<State>,
    freed: Condvar,
}

/// A link's permit for a stage; given back on drop.
pub struct Slot<'a> {
    sched: &'a Scheduler,
    class: Class,
    stage: Stage,
    /// The link's handle (a plan permit goes back when it is admitted to compute).
    cancel: Cancel,
    /// How long the link waited for it.
    pub waited: Duration,
    /// Whether it had to wait in the queue at all.
    pub queued: bool,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        let mut st = self.sched.lock();
        let gone = match self.stage {
            Stage::Compute => true,
            // Not counted twice: admission to compute gave it back already.
            Stage::Plan => self.cancel.end_planning(),
        };
        if gone {
            st.running[self.stage as usize][self.class as usize] -= 1;
        }
        drop(st);
        self.sched.freed.notify_all();
    }
}

impl Scheduler {
    /// At most `jobs` foreground links compute at once, and at most `jobs`
    /// more hold a plan (see the module docs).
    pub fn new(jobs: usize) -> Scheduler {
        Scheduler { jobs: jobs.max(1), state: Mutex::default(), freed: Condvar::new() }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Wait for a compute slot of class `priority`; None when `cancel` fired
    /// first (the link is then dropped from the queue and computes nothing).
    /// A plan permit the link holds is given back on admission. `obs` is told
    /// when the link queues (once per link) and when it is admitted.
    pub fn admit(&self, priority: Priority, cancel: &Cancel, obs: &LinkObs) -> Option<Slot<'_>> {
        self.enter(Stage::Compute, Class::of(priority, false), cancel, obs)
    }

    /// [`Scheduler::admit`] for a remote caller's link when `remote`.
    pub fn admit_for(&self, priority: Priority, remote: bool, cancel: &Cancel, obs: &LinkObs) -> Option<Slot<'_>> {
        self.enter(Stage::Compute, Class::of(priority, remote), cancel, obs)
    }

    /// Wait for a plan permit of class `priority` (see the module docs); None
    /// when `cancel` fired first. `obs` is told when the link queues.
    pub fn admit_plan(&self, priority: Priority, cancel: &Cancel, obs: &LinkObs) -> Option<Slot<'_>> {
        self.enter(Stage::Plan, Class::of(priority, false), cancel, obs)
    }

    /// [`Scheduler::admit_plan`] for a remote caller's link when `remote`.
    pub fn admit_plan_for(&self, priority: Priority, remote: bool, cancel: &Cancel, obs: &LinkObs) -> Option<Slot<'_>> {
        self.enter(Stage::Plan, Class::of(priority, remote), cancel, obs)
    }

    fn enter(&self, stage: Stage, class: Class, cancel: &Cancel, obs: &LinkObs) -> Option<Slot<'_>> {
        let t0 = Instant::now();
        let priority = class.priority();
        let mut st = self.lock();
        let me = (class, st.next);
        st.next += 1;
        st.waiting[stage as usize].insert(me);
        let mut queued = false;
        loop {
            if cancel.is_cancelled() {
                st.waiting[stage as usize].remove(&me);
                drop(st);
                // Others may start now that this one no longer waits ahead of them.
                self.freed.notify_all();
                return None;
            }
            if self.may_start(&st, stage, me) {
                st.waiting[stage as usize].remove(&me);
                st.running[stage as usize][class as usize] += 1;
                match stage {
                    Stage::Plan => cancel.start_planning(),
                    Stage::Compute => {
                        if cancel.end_planning() {
                            st.running[Stage::Plan as usize][class as usize] -= 1;
                        }
                    }
                }
                drop(st);
                // A background link may now be first in line behind this one,
                // and a plan permit may have come free.
                self.freed.notify_all();
                let waited = t0.elapsed();
                if stage == Stage::Compute {
                    tracing::debug!(sched = "admitted", priority = priority.name(), waited_ms = ms(waited), "admitted");
                    obs.admitted(priority, waited);
                } else {
                    tracing::trace!(priority = priority.name(), waited_ms = ms(waited), "plan permit");
                }
                return Some(Slot { sched: self, class, stage, cancel: cancel.clone(), waited, queued });
            }
            if !queued {
                queued = true;
                if cancel.announce_queued() {
                    let (fg, bg) = (
                        st.holding(Stage::Compute, Priority::Foreground),
                        st.holding(Stage::Compute, Priority::Background),
                    );
                    tracing::debug!(sched = "queued", priority = priority.name(), fg, bg, "waiting for a slot");
                    obs.queued(priority);
                }
            }
            st = self.freed.wait_timeout(st, CANCEL_POLL).unwrap_or_else(|e| e.into_inner()).0;
        }
    }

    fn may_start(&self, st: &State, stage: Stage, me: (Class, u64)) -> bool {
        // First in line among its own class (arrival order within a class) ...
        let first_of_class = st.waiting[stage as usize].range((me.0, 0)..).next() == Some(&me);
        first_of_class
            && match me.0 {
                // ... the host's own foreground links ignore other work ...
                Class::Local => st.holding_class(stage, Class::Local) < self.jobs,
                // ... remote ones fill what the local ones leave ...
                Class::Remote => st.holding(stage, Priority::Foreground) < self.jobs && !st.local_waits(stage),
                // ... background fills idle slots only, after every foreground
                // waiter; and it computes only while no foreground link is
                // planning or waiting to plan (that link computes next).
                Class::Background => {
                    st.holding_all(stage) < self.jobs
                        && !st.foreground_waits(stage)
                        && (stage == Stage::Plan
                            || (st.holding(Stage::Plan, Priority::Foreground) == 0
                                && !st.foreground_waits(Stage::Plan)))
                }
            }
    }

    /// Links waiting for a permit or a slot now.
    pub fn queued(&self) -> u64 {
        let st = self.lock();
        (st.waiting[0].len() + st.waiting[1].len()) as u64
    }

    /// Links computing now: (foreground, background).
    pub fn running(&self) -> (u64, u64) {
        let st = self.lock();
        (
            st.holding(Stage::Compute, Priority::Foreground) as u64,
            st.holding(Stage::Compute, Priority::Background) as u64,
        )
    }

    /// Links holding a plan permit now (planning, or planned and waiting to compute).
    pub fn planning(&self) -> u64 {
        self.lock().holding_all(Stage::Plan) as u64
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Put the calling thread (on Linux, `sched_setscheduler(0, …)` acts on the
/// calling thread) or, called between fork and exec, the child process at idle
/// CPU priority: `SCHED_IDLE`, or nice 19 where that policy is refused. What it
/// starts afterwards (threads, processes) inherits it. Async-signal-safe.
pub fn idle_priority() {
    // SAFETY: plain syscalls on the calling thread with a valid, initialised
    // sched_param; no memory is allocated (async-signal-safe for pre_exec).
    unsafe {
        let param = libc::sched_param { sched_priority: 0 };
        if libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) != 0 {
            libc::setpriority(libc::PRIO_PROCESS, 0, 19);
        }
    }
}

/// Start `cmd`'s process at idle CPU priority when `priority` is background.
pub fn apply_to_command(cmd: &mut std::process::Command, priority: Priority) {
    if priority == Priority::Background {
        use std::os::unix::process::CommandExt;
        // SAFETY: the closure only makes async-signal-safe syscalls (see
        // `idle_priority`) and touches no memory of the parent.
        unsafe {
            cmd.pre_exec(|| {
                idle_priority();
                Ok(())
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    /// With every slot taken, waiters start by class, then arrival; a
    /// foreground link starts while background work holds every slot.
    #[test]
    fn order_is_class_then_arrival_and_foreground_passes_background() {
        let s = Scheduler::new(1);
        let none = Cancel::new();
        let first = s.admit(Priority::Foreground, &none, &LinkObs::default()).unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::scope(|scope| {
            let arrivals = [
                (Priority::Background, "b1"),
                (Priority::Foreground, "f1"),
                (Priority::Background, "b2"),
                (Priority::Foreground, "f2"),
            ];
            for (i, (p, name)) in arrivals.into_iter().enumerate() {
                let (s, tx, none) = (&s, tx.clone(), none.clone());
                scope.spawn(move || {
                    let _slot = s.admit(p, &none, &LinkObs::default()).unwrap();
                    tx.send(name).unwrap();
                });
                // Arrival order is the order they queue in.
                while s.queued() < i as u64 + 1 {
                    std::thread::yield_now();
                }
            }
            drop(first);
            let order: Vec<_> = rx.iter().take(4).collect();
            assert_eq!(order, ["f1", "f2", "b1", "b2"]);
        });
        // Background holds the only slot: foreground still starts.
        let bg = s.admit(Priority::Background, &none, &LinkObs::default()).unwrap();
        let fg = s.admit(Priority::Foreground, &none, &LinkObs::default()).unwrap();
        assert_eq!(s.running(), (1, 1));
        drop((bg, fg));
    }

    #[test]
    fn remote_links_filling_every_slot_keep_no_local_link_waiting() {
        let s = Scheduler::new(2);
        let none = Cancel::new();
        let obs = LinkObs::default();
        let remote: Vec<_> = (0..2).map(|_| s.admit_for(Priority::Foreground, true, &none, &obs).unwrap()).collect();
        // A local link starts at once beside them ...
        let local = s.admit(Priority::Foreground, &none, &obs).unwrap();
        assert_eq!(s.running(), (3, 0));
        std::thread::scope(|scope| {
            // ... and a remote one waits until foreground links hold fewer
            // than `jobs` slots, and while a local link waits.
            let (s, none) = (&s, none.clone());
            let waiter =
                scope.spawn(move || s.admit_for(Priority::Foreground, true, &none, &LinkObs::default()).is_some());
            while s.queued() < 1 {
                std::thread::yield_now();
            }
            drop(remote);
            assert!(waiter.join().unwrap());
        });
        drop(local);
        assert_eq!(s.running(), (0, 0));
    }

    #[test]
    fn a_cancelled_waiter_leaves_the_queue() {
        let s = Scheduler::new(1);
        let busy = s.admit(Priority::Foreground, &Cancel::new(), &LinkObs::default()).unwrap();
        let cancel = Cancel::new();
        std::thread::scope(|scope| {
            let h = scope.spawn(|| s.admit(Priority::Foreground, &cancel, &LinkObs::default()).is_none());
            while s.queued() == 0 {
                std::thread::yield_now();
            }
            cancel.cancel();
            assert!(h.join().unwrap(), "a cancelled link was admitted");
        });
        assert_eq!(s.queued(), 0);
        drop(busy);
        assert_eq!(s.running(), (0, 0));
    }

    /// Plan permits: `jobs` per class beside the computing links, given back
    /// on admission to compute (counted once), a waiter takes the one freed.
    #[test]
    fn plan_permits_are_bounded_and_given_back_on_admission() {
        let s = Scheduler::new(1);
        let a = Cancel::new();
        let a_plan = s.admit_plan(Priority::Foreground, &a, &LinkObs::default()).unwrap();
        assert_eq!(s.planning(), 1);
        let a_slot = s.admit(Priority::Foreground, &a, &LinkObs::default()).unwrap();
        assert_eq!((s.planning(), s.running()), (0, (1, 0)), "admission to compute kept the plan permit");
        drop(a_plan);
        assert_eq!(s.planning(), 0, "a permit given back on admission was counted back twice");
        let b = Cancel::new();
        let b_plan = s.admit_plan(Priority::Foreground, &b, &LinkObs::default()).unwrap();
        std::thread::scope(|scope| {
            let c = scope
                .spawn(|| s.admit_plan(Priority::Foreground, &Cancel::new(), &LinkObs::default()).map(|p| p.queued));
            while s.queued() == 0 {
                std::thread::yield_now();
            }
            // C waits for B's permit; B waits for A's slot.
            let b_wait = scope.spawn(|| s.admit(Priority::Foreground, &b, &LinkObs::default()).map(|slot| slot.queued));
            while s.queued() < 2 {
                std::thread::yield_now();
            }
            assert!(!c.is_finished(), "a plan permit beyond the bound");
            drop(a_slot);
            assert_eq!(b_wait.join().unwrap(), Some(true));
            assert_eq!(c.join().unwrap(), Some(true), "the permit B gave back did not go to C");
        });
        drop(b_plan);
        assert_eq!((s.queued(), s.planning(), s.running()), (0, 0, (0, 0)));
    }

    /// A foreground link that holds a plan permit computes before a
    /// background link that planned first, even with the slot idle meanwhile.
    #[test]
    fn background_does_not_compute_ahead_of_a_planning_foreground_link() {
        let s = Scheduler::new(1);
        let (b, f) = (Cancel::with_priority(Priority::Background), Cancel::new());
        let b_plan = s.admit_plan(Priority::Background, &b, &LinkObs::default()).unwrap();
        // Foreground ignores the background permit.
        let f_plan = s.admit_plan(Priority::Foreground, &f, &LinkObs::default()).unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::scope(|scope| {
            let (tx2, s, b) = (tx, &s, &b);
            let bg = scope.spawn(move || {
                let slot = s.admit(Priority::Background, b, &LinkObs::default());
                tx2.send("b").unwrap();
                slot.is_some()
            });
            let t0 = Instant::now();
            while s.queued() == 0 && !bg.is_finished() && t0.elapsed() < Duration::from_secs(10) {
                std::thread::yield_now();
            }
            std::thread::sleep(CANCEL_POLL * 2);
            assert!(rx.try_recv().is_err(), "background computed while a foreground link was planning");
            let f_slot = s.admit(Priority::Foreground, &f, &LinkObs::default()).unwrap();
            assert!(rx.try_recv().is_err(), "background computed beside the foreground link");
            drop(f_slot);
            let got = rx.recv_timeout(Duration::from_secs(10));
            b.cancel();
            assert!(bg.join().unwrap() && got.is_ok(), "background never computed after the foreground link");
        });
        drop((b_plan, f_plan));
        assert_eq!((s.queued(), s.planning(), s.running()), (0, 0, (0, 0)));
    }

    #[test]
    fn names() {
        assert_eq!(Priority::from_name("Background"), Some(Priority::Background));
        assert_eq!(Priority::from_name("foreground"), Some(Priority::Foreground));
        assert_eq!(Priority::from_name("urgent"), None);
    }
}
