//! How many remote links run at once (issue: 640 streams that announced files
//! and never sent them each held a blocking thread, the pool filled and local
//! links waited ~50 s).
//!
//! A remote link takes a slot once its `Start` has arrived and before
//! anything else: at most [`RemoteLinks::max`] daemon-wide (`--max-remote-links`,
//! default four per `--jobs`), and at most half of them for one caller (one
//! token, or one client certificate) where the listener knows several. Slots
//! are tokio semaphores, waited for on the runtime, never on a thread, in
//! arrival order; a link that has no slot after the wait (`--reply-timeout`,
//! at most [`MAX_WAIT`]) is refused with `RESOURCE_EXHAUSTED`, and its shim
//! tries the next daemon of `NVLINKD_ADDR` or runs the real nvlink. Links on
//! the unix socket never take a slot: whatever remote callers do, local links
//! wait only for the scheduler, as before.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nvlinkd_core::stats::Kind;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::Status;
use tracing::{debug, warn};

use crate::net::incoming::{LogLimit, LOG_EVERY};

/// Longest wait for a slot.
pub const MAX_WAIT: Duration = Duration::from_secs(10);

/// Who a remote link counts against: the BLAKE3 hash of its token, or of its
/// client certificate.
pub type Caller = [u8; 32];

/// The slots of remote links (see the module documentation).
pub struct RemoteLinks {
    /// Remote links at once, daemon-wide.
    pub max: usize,
    /// Remote links at once of one caller.
    pub per_caller: usize,
    all: Arc<Semaphore>,
    callers: Mutex<HashMap<Caller, Arc<Semaphore>>>,
    wait: Duration,
    waiting: AtomicU64,
    refused: AtomicU64,
    refusal_log: LogLimit,
}

/// A remote link's slot, given back when dropped.
pub struct Slot {
    links: Arc<RemoteLinks>,
    permits: Option<(Option<OwnedSemaphorePermit>, OwnedSemaphorePermit)>,
    caller: Option<(Caller, Arc<Semaphore>)>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        drop(self.permits.take());
        if let Some((caller, semaphore)) = self.caller.take() {
            self.links.forget(caller, semaphore);
        }
    }
}

impl RemoteLinks {
    /// `max` links at once (at least one), half of them per caller; a link
    /// waits at most `wait` (and [`MAX_WAIT`]) for its slot.
    pub fn new(max: usize, wait: Duration) -> Arc<RemoteLinks> {
        let max = max.max(1);
        Arc::new(RemoteLinks {
            max,
            per_caller: (max / 2).max(1),
            all: Arc::new(Semaphore::new(max)),
            callers: Mutex::new(HashMap::new()),
            wait: wait.min(MAX_WAIT),
            waiting: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            refusal_log: LogLimit::default(),
        })
    }

    /// A slot for a link of `caller` (None: counted daemon-wide only), or
    /// `RESOURCE_EXHAUSTED` after the wait. `peer` is for the log.
    pub async fn admit(self: &Arc<Self>, caller: Option<Caller>, peer: &str) -> Result<Slot, Status> {
        let mine = caller.map(|c| {
            let mut callers = self.callers.lock().unwrap_or_else(|p| p.into_inner());
            (c, callers.entry(c).or_insert_with(|| Arc::new(Semaphore::new(self.per_caller))).clone())
        });
        // Without its permits until they are granted; dropped (a refusal, a
        // shim gone), it lets go of the caller's semaphore.
        let mut slot = Slot { links: self.clone(), permits: None, caller: mine };
        // Counted while waiting, however the wait ends (a shim that goes
        // away drops it).
        struct Waiting<'a>(&'a AtomicU64);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::Relaxed);
            }
        }
        self.waiting.fetch_add(1, Ordering::Relaxed);
        let waiting = Waiting(&self.waiting);
        // The caller's own slot first: a caller at its cap waits without
        // holding one of everybody's.
        let acquired = tokio::time::timeout(self.wait, async {
            let own = match &slot.caller {
                Some((_, s)) => Some(s.clone().acquire_owned().await.ok()?),
                None => None,
            };
            let all = self.all.clone().acquire_owned().await.ok()?;
            Some((own, all))
        })
        .await;
        drop(waiting);
        if let Ok(Some(permits)) = acquired {
            slot.permits = Some(permits);
            return Ok(slot);
        }
        drop(slot);
        self.refused.fetch_add(1, Ordering::Relaxed);
        match self.refusal_log.allow() {
            Some(suppressed) => warn!(
                %peer,
                suppressed,
                max = self.max,
                per_caller = self.per_caller,
                "remote link refused: no free slot within {}s (logged at most every {}s; suppressed: refusals not \
                 logged since the last line)",
                self.wait.as_secs_f64(),
                LOG_EVERY.as_secs()
            ),
            None => debug!(%peer, "remote link refused: no free slot"),
        }
        Err(Status::resource_exhausted(format!(
            "nvlinkd is serving as many remote links as it may ({} at once, {} per caller) and none ended within \
             {}s; run this link elsewhere",
            self.max,
            self.per_caller,
            self.wait.as_secs_f64()
        )))
    }

    /// Drop a caller's semaphore once nobody holds or waits for it.
    fn forget(&self, caller: Caller, semaphore: Arc<Semaphore>) {
        let mut callers = self.callers.lock().unwrap_or_else(|p| p.into_inner());
        // The map's and ours: nobody else holds or waits for a slot of it.
        if Arc::strong_count(&semaphore) == 2 {
            callers.remove(&caller);
        }
    }

    /// For `stats --json`.
    pub fn counters(&self) -> [(&'static str, u64, Kind); 3] {
        [
            ("remote_links", (self.max - self.all.available_permits()) as u64, Kind::Gauge),
            ("remote_links_waiting", self.waiting.load(Ordering::Relaxed), Kind::Gauge),
            ("remote_links_refused", self.refused.load(Ordering::Relaxed), Kind::Counter),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
    }

    #[test]
    fn a_caller_at_its_half_waits_and_is_refused_while_others_get_slots() {
        rt().block_on(async {
            let links = RemoteLinks::new(4, Duration::from_millis(50));
            let (a, b) = ([1u8; 32], [2u8; 32]);
            let held: Vec<Slot> = all_granted(vec![links.admit(Some(a), "a").await, links.admit(Some(a), "a").await]);
            assert_eq!(links.counters()[0].1, 2);
            let e = links.admit(Some(a), "a").await.err().expect("a third slot for one caller of four");
            assert_eq!(e.code(), tonic::Code::ResourceExhausted);
            assert_eq!(links.counters()[2].1, 1, "counted");
            let b1 = links.admit(Some(b), "b").await.expect("another caller's slot");
            let _b2 = links.admit(Some(b), "b").await.expect("another caller's second slot");
            assert!(links.admit(None, "-").await.is_err(), "all four are taken");
            drop(b1);
            let _any = links.admit(None, "-").await.expect("a slot given back is taken");
            drop(held);
            assert_eq!(links.callers.lock().unwrap().len(), 1, "only b's semaphore is left");
        });
    }

    #[test]
    fn a_waiting_link_gets_the_slot_given_back() {
        rt().block_on(async {
            let links = RemoteLinks::new(1, Duration::from_secs(5));
            let held = links.admit(None, "-").await.unwrap();
            let waiter = tokio::spawn({
                let links = links.clone();
                async move { links.admit(None, "-").await.is_ok() }
            });
            tokio::time::sleep(Duration::from_millis(20)).await;
            assert_eq!(links.counters()[1].1, 1, "one waiting");
            drop(held);
            assert!(waiter.await.unwrap(), "the waiter was refused a slot given back");
        });
    }

    #[test]
    fn a_link_that_leaves_the_queue_leaves_nothing_behind() {
        rt().block_on(async {
            let links = RemoteLinks::new(2, Duration::from_secs(5));
            let c = [3u8; 32];
            let held = links.admit(Some(c), "c").await.unwrap();
            let next = links.admit(Some(c), "c");
            tokio::select! {
                _ = next => panic!("a second slot for a caller of one"),
                _ = tokio::time::sleep(Duration::from_millis(20)) => {}
            }
            assert_eq!(links.counters()[1].1, 0, "still counted as waiting");
            drop(held);
            assert!(links.callers.lock().unwrap().is_empty(), "the caller's semaphore was kept");
            assert_eq!(links.counters()[2].1, 0, "a shim that went away is no refusal");
        });
    }

    fn all_granted(slots: Vec<Result<Slot, Status>>) -> Vec<Slot> {
        slots.into_iter().map(|s| s.expect("a slot")).collect()
    }
}
