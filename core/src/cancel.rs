//! A link's control handle ([`Cancel`]): its priority class, and the power
//! to stop it — the worker or child process serving it is killed at once, and
//! its later worker requests and scheduler admissions are refused. Shared by
//! the scheduler (`sched.rs`), the workers (`worker.rs`) and the processes the
//! engines start.

use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::process::Child;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::sched::Priority;

const LIVE: u8 = 0;
const CANCELLED: u8 = 1;
pub(crate) const TIMED_OUT: u8 = 2;
const SUPERSEDED: u8 = 3;
const REQUESTED: u8 = 4;

/// Why a link was stopped (see [`Cancel::stopped`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stopped {
    /// [`Cancel::cancel`]: its caller went away.
    Cancelled,
    /// [`Cancel::supersede`]: a newer link of the same output replaced it.
    Superseded,
    /// Its worker or child outlived the time limit.
    TimedOut,
    /// [`Cancel::cancel_requested`]: someone asked for it by the link's id
    /// (`nvlinkd cancel`, an IDE).
    Requested,
}

impl Stopped {
    /// The name in events and logs.
    pub fn name(self) -> &'static str {
        match self {
            Stopped::Cancelled => "caller_gone",
            Stopped::Superseded => "superseded",
            Stopped::TimedOut => "timed_out",
            Stopped::Requested => "requested",
        }
    }
}

#[derive(Default)]
struct CancelInner {
    state: AtomicU8,
    /// The worker serving this link right now (not yet reaped: its pid cannot
    /// have been reused while it is recorded here).
    pid: Mutex<Option<u32>>,
    /// The class of the link's computation (`sched.rs`).
    priority: Priority,
    /// Whether the link holds a scheduler slot now (nested admissions of the
    /// same link take none).
    admitted: std::sync::atomic::AtomicBool,
    /// Whether the link holds a plan permit now (`sched.rs`, [`Stage::Plan`](crate::sched::Stage)):
    /// given back when it is admitted to compute, or when it ends without.
    planning: std::sync::atomic::AtomicBool,
    /// Whether `link_queued` was announced for it (once per link, whichever
    /// stage it waited at first).
    announced: std::sync::atomic::AtomicBool,
    /// The id of the link that superseded this one (0: none).
    superseded_by: std::sync::atomic::AtomicU64,
    /// Whom the link computes for ([`Tenant`]), once known.
    tenant: std::sync::OnceLock<Tenant>,
}

/// Whom a link computes for: the daemon host's own users ([`LOCAL`]), or a
/// remote caller (a token of several, a client certificate: its hash; all
/// callers of a single token: [`REMOTE`]). A worker that served one tenant
/// never serves another: nvJitLink reads some damaged inputs from memory
/// past them, and a worker's memory holds what it linked before.
pub type Tenant = [u8; 32];
/// The daemon host's own links (its unix socket, `nvlinkd exec`).
pub const LOCAL: Tenant = [0; 32];
/// Remote links where callers are not told apart.
pub const REMOTE: Tenant = [1; 32];

/// A link's control handle: its priority class, and the power to stop it. A
/// cancel kills the worker or child process serving the link, at once, and
/// refuses the link's later worker requests and its scheduler admission.
/// Clones share the state.
#[derive(Clone, Default)]
pub struct Cancel(Arc<CancelInner>);

impl Cancel {
    /// A foreground link's handle.
    pub fn new() -> Cancel {
        Cancel::default()
    }

    /// A handle for a link of class `priority` (background: idle CPU priority,
    /// admitted only into idle slots; see `sched.rs`).
    pub fn with_priority(priority: Priority) -> Cancel {
        Cancel(Arc::new(CancelInner { priority, ..Default::default() }))
    }

    /// The link's class.
    pub fn priority(&self) -> Priority {
        self.0.priority
    }

    /// Record whom the link computes for (the first call counts).
    pub fn set_tenant(&self, tenant: Tenant) {
        let _ = self.0.tenant.set(tenant);
    }

    /// Whom the link computes for ([`LOCAL`] unless set).
    pub fn tenant(&self) -> Tenant {
        self.0.tenant.get().copied().unwrap_or(LOCAL)
    }

    /// Cancel the link: its worker (if one is linking for it) gets SIGKILL.
    pub fn cancel(&self) {
        self.stop(CANCELLED);
    }

    /// Cancel the link because a newer one (of id `by`) replaces it.
    pub fn supersede(&self, by: u64) {
        self.0.superseded_by.store(by, Ordering::Release);
        self.stop(SUPERSEDED);
    }

    /// Cancel the link because someone asked for it by its id.
    pub fn cancel_requested(&self) {
        self.stop(REQUESTED);
    }

    /// The id of the link that superseded this one, if one did.
    pub fn superseded_by(&self) -> Option<u64> {
        Some(self.0.superseded_by.load(Ordering::Acquire))
            .filter(|&id| id != 0 && self.stopped() == Some(Stopped::Superseded))
    }

    pub fn is_cancelled(&self) -> bool {
        self.0.state.load(Ordering::Acquire) != LIVE
    }

    /// Why the link was stopped, if it was.
    pub fn stopped(&self) -> Option<Stopped> {
        match self.0.state.load(Ordering::Acquire) {
            CANCELLED => Some(Stopped::Cancelled),
            SUPERSEDED => Some(Stopped::Superseded),
            TIMED_OUT => Some(Stopped::TimedOut),
            REQUESTED => Some(Stopped::Requested),
            _ => None,
        }
    }

    /// Whether `other` is a clone of this handle (the same link).
    pub fn same(&self, other: &Cancel) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// Mark the link as holding a slot; false when it already held one.
    pub(crate) fn take_admission(&self) -> bool {
        !self.0.admitted.swap(true, Ordering::AcqRel)
    }

    pub(crate) fn end_admission(&self) {
        self.0.admitted.store(false, Ordering::Release);
    }

    /// Mark the link as holding a plan permit (`sched.rs`).
    pub(crate) fn start_planning(&self) {
        self.0.planning.store(true, Ordering::Release);
    }

    /// Give the plan permit up: true when the link held one (called under the
    /// scheduler's lock, so that exactly one caller counts it back).
    pub(crate) fn end_planning(&self) -> bool {
        self.0.planning.swap(false, Ordering::AcqRel)
    }

    /// True the first time only: the link's wait is announced once.
    pub(crate) fn announce_queued(&self) -> bool {
        !self.0.announced.swap(true, Ordering::AcqRel)
    }

    pub(crate) fn stop(&self, why: u8) {
        let pid = self.0.pid.lock().unwrap_or_else(|e| e.into_inner());
        let _ = self.0.state.compare_exchange(LIVE, why, Ordering::AcqRel, Ordering::Acquire);
        if let Some(pid) = *pid {
            // SAFETY: pid is our child and not yet reaped (see `pid`).
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
    }

    /// Wait for `child` (a process run for this link: the real nvlink) and
    /// collect its output; [`Cancel::cancel`] kills it, and so does `limit`.
    pub(crate) fn supervise(&self, mut child: Child, limit: Duration) -> std::io::Result<std::process::Output> {
        if !self.attach(child.id()) {
            let _ = child.kill();
            let _ = child.wait();
            return Err(std::io::Error::other("link cancelled"));
        }
        let started = Instant::now();
        let (done, wait) = std::sync::mpsc::channel::<()>();
        let me = self.clone();
        let watchdog = std::thread::Builder::new().name("nvlinkd-process-watch".into()).spawn(move || {
            if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = wait.recv_timeout(limit) {
                me.stop(TIMED_OUT);
            }
        });
        let stderr = child.stderr.take();
        let err_reader = std::thread::spawn(move || {
            let mut v = Vec::new();
            if let Some(mut e) = stderr {
                let _ = e.read_to_end(&mut v);
            }
            v
        });
        let mut stdout = Vec::new();
        let read = child.stdout.take().map_or(Ok(0), |mut o| o.read_to_end(&mut stdout));
        let stderr = err_reader.join().unwrap_or_default();
        // Wait for the exit without reaping it: the pid stays this child's for
        // as long as a cancel may still signal it.
        // SAFETY: waitid on our own child with a zeroed out-parameter.
        unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            libc::waitid(libc::P_PID, child.id(), &mut info, libc::WEXITED | libc::WNOWAIT);
        }
        // A run that was still going when its limit passed is not a result,
        // whichever came first: the watchdog thread's kill (it may not have
        // been scheduled yet on a loaded machine) or the child's own exit.
        if started.elapsed() >= limit {
            self.stop(TIMED_OUT);
        }
        self.detach();
        let _ = done.send(());
        if let Ok(w) = watchdog {
            let _ = w.join();
        }
        let mut status = child.wait()?;
        if self.stopped() == Some(Stopped::TimedOut) && status.signal().is_none() {
            // Killed at its limit, if only as a zombie: reported as the kill.
            status = std::process::ExitStatus::from_raw(libc::SIGKILL);
        }
        read?;
        Ok(std::process::Output { status, stdout, stderr })
    }

    /// Record the worker about to serve this link; false when already cancelled.
    pub(crate) fn attach(&self, pid: u32) -> bool {
        let mut slot = self.0.pid.lock().unwrap_or_else(|e| e.into_inner());
        if self.is_cancelled() {
            return false;
        }
        *slot = Some(pid);
        true
    }

    pub(crate) fn detach(&self) {
        *self.0.pid.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}
