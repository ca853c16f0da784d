//! Admission of links that must compute: a bounded, prioritised queue.
//!
//! Why here, in the synchronous core, and why only there: a link costs CPU only
//! once the whole-link cache missed (or there is no key); a cache hit, `--help`,
//! `--version` and nvlink's option errors are answered in microseconds and must
//! never wait behind compiles. So `Linker` asks [`Scheduler::admit`] for a slot
//! right after the whole-link lookup missed (and before running the real nvlink
//! for links that have no key), not the service when a stream arrives. The core
//! is synchronous (no tokio), so this is a small priority semaphore on a
//! `Mutex`/`Condvar`.
//!
//! Two classes ([`Priority`]), one queue ordered by class, then arrival:
//!
//! - **Foreground** (the default: a build or a person waits for it) is admitted
//!   while fewer than `jobs` foreground links compute. Background links do not
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
//! A link waiting for a slot is dropped as soon as it is cancelled (its shim
//! went away, or a newer link superseded it): the waiter checks its
//! [`Cancel`] every [`CANCEL_POLL`].
//!
//! Entry point for background work (speculative relinks included): give the
//! link a `Cancel::with_priority(Priority::Background)` and call
//! `Linker::link_cancellable`; admission, the idle CPU policy and the separate
//! pools follow from the handle. Code that computes outside a link can take a
//! slot itself with `linker.scheduler().admit(Priority::Background, &cancel)`.

use std::collections::BTreeSet;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::worker::Cancel;

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

#[derive(Default)]
struct State {
    /// Links computing, per class.
    running: [usize; 2],
    /// Links waiting: (class, arrival).
    waiting: BTreeSet<(Priority, u64)>,
    next: u64,
}

/// The bounded queue of links that must compute (see the module docs).
pub struct Scheduler {
    jobs: usize,
    state: Mutex<State>,
    freed: Condvar,
}

/// A computing link's slot; freed on drop.
pub struct Slot<'a> {
    sched: &'a Scheduler,
    class: Priority,
    /// How long the link waited for it.
    pub waited: Duration,
    /// Whether it had to wait in the queue at all.
    pub queued: bool,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.sched.lock().running[self.class as usize] -= 1;
        self.sched.freed.notify_all();
    }
}

impl Scheduler {
    /// At most `jobs` foreground links compute at once (see the module docs).
    pub fn new(jobs: usize) -> Scheduler {
        Scheduler { jobs: jobs.max(1), state: Mutex::default(), freed: Condvar::new() }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Wait for a slot of class `priority`; None when `cancel` fired first
    /// (the link is then dropped from the queue and computes nothing).
    pub fn admit(&self, priority: Priority, cancel: &Cancel) -> Option<Slot<'_>> {
        let t0 = Instant::now();
        let mut st = self.lock();
        let me = (priority, st.next);
        st.next += 1;
        st.waiting.insert(me);
        let mut announced = false;
        loop {
            if cancel.is_cancelled() {
                st.waiting.remove(&me);
                drop(st);
                // Others may start now that this one no longer waits ahead of them.
                self.freed.notify_all();
                return None;
            }
            if self.may_start(&st, me) {
                st.waiting.remove(&me);
                st.running[priority as usize] += 1;
                drop(st);
                // A background link may now be first in line behind this one.
                self.freed.notify_all();
                let waited = t0.elapsed();
                tracing::debug!(sched = "admitted", priority = priority.name(), waited_ms = ms(waited), "admitted");
                return Some(Slot { sched: self, class: priority, waited, queued: announced });
            }
            if !announced {
                announced = true;
                let (fg, bg) = (st.running[0], st.running[1]);
                tracing::debug!(sched = "queued", priority = priority.name(), fg, bg, "waiting for a slot");
            }
            st = self.freed.wait_timeout(st, CANCEL_POLL).unwrap_or_else(|e| e.into_inner()).0;
        }
    }

    fn may_start(&self, st: &State, me: (Priority, u64)) -> bool {
        // First in line among its own class (arrival order within a class) ...
        let first_of_class = st.waiting.range((me.0, 0)..).next() == Some(&me);
        first_of_class
            && match me.0 {
                // ... foreground ignores background work ...
                Priority::Foreground => st.running[0] < self.jobs,
                // ... background fills idle slots only, after every foreground waiter.
                Priority::Background => {
                    st.running[0] + st.running[1] < self.jobs && st.waiting.first().is_some_and(|w| w.0 == me.0)
                }
            }
    }

    /// Links waiting for a slot now.
    pub fn queued(&self) -> u64 {
        self.lock().waiting.len() as u64
    }

    /// Links computing now: (foreground, background).
    pub fn running(&self) -> (u64, u64) {
        let st = self.lock();
        (st.running[0] as u64, st.running[1] as u64)
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
        let first = s.admit(Priority::Foreground, &none).unwrap();
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
                    let _slot = s.admit(p, &none).unwrap();
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
        let bg = s.admit(Priority::Background, &none).unwrap();
        let fg = s.admit(Priority::Foreground, &none).unwrap();
        assert_eq!(s.running(), (1, 1));
        drop((bg, fg));
    }

    #[test]
    fn a_cancelled_waiter_leaves_the_queue() {
        let s = Scheduler::new(1);
        let busy = s.admit(Priority::Foreground, &Cancel::new()).unwrap();
        let cancel = Cancel::new();
        std::thread::scope(|scope| {
            let h = scope.spawn(|| s.admit(Priority::Foreground, &cancel).is_none());
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

    #[test]
    fn names() {
        assert_eq!(Priority::from_name("Background"), Some(Priority::Background));
        assert_eq!(Priority::from_name("foreground"), Some(Priority::Foreground));
        assert_eq!(Priority::from_name("urgent"), None);
    }
}
