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
//!
//! A link waiting for its slot holds its decoded `Start` (at most
//! `MAX_START_FOOTPRINT`, counted before decoding: `nvlinkd_proto::codec`).
//! The `Start`s waiting at once hold at most [`RemoteLinks::max`] of the
//! largest `Start`'s bytes, and one caller's at most half of that: a link
//! whose `Start` does not fit is refused at once, as after a wait, so
//! thousands of streams cannot make the daemon hold gigabytes while they
//! wait.

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
    /// KiB of waiting links' `Start` messages, daemon-wide.
    waiting_kib: Arc<Semaphore>,
    callers: Mutex<HashMap<Caller, Arc<CallerSlots>>>,
    wait: Duration,
    waiting: AtomicU64,
    refused: AtomicU64,
    refusal_log: LogLimit,
    /// Bytes of remote messages received in part (`net/partial.rs`): twice
    /// [`RemoteLinks::max`] full-size messages, the links' and the waiting ones'.
    pub partial: Arc<crate::net::partial::PartialMessages>,
}

/// One caller's share: its slots, and the KiB its waiting `Start`s may hold.
struct CallerSlots {
    slots: Arc<Semaphore>,
    waiting_kib: Arc<Semaphore>,
}

/// KiB that the largest `Start` may hold while it waits (its decoded size,
/// `nvlinkd_proto::codec::footprint`).
const START_KIB: u32 = (nvlinkd_proto::codec::MAX_START_FOOTPRINT / 1024) as u32;

/// A remote link's slot, given back when dropped.
pub struct Slot {
    links: Arc<RemoteLinks>,
    permits: Option<(Option<OwnedSemaphorePermit>, OwnedSemaphorePermit)>,
    caller: Option<(Caller, Arc<CallerSlots>)>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        drop(self.permits.take());
        if let Some((caller, share)) = self.caller.take() {
            self.links.forget(caller, share);
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
            waiting_kib: Arc::new(Semaphore::new(max * START_KIB as usize)),
            callers: Mutex::new(HashMap::new()),
            wait: wait.min(MAX_WAIT),
            waiting: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            refusal_log: LogLimit::default(),
            partial: crate::net::partial::PartialMessages::new(
                2 * max as u64 * nvlinkd_proto::MAX_MESSAGE_BYTES as u64,
            ),
        })
    }

    /// A slot for a link of `caller` (None: counted daemon-wide only) whose
    /// `Start` message is `start_bytes` long, or `RESOURCE_EXHAUSTED` after
    /// the wait, or at once when the waiting `Start`s already hold what they
    /// may. `peer` is for the log.
    pub async fn admit(
        self: &Arc<Self>,
        caller: Option<Caller>,
        peer: &str,
        start_bytes: usize,
    ) -> Result<Slot, Status> {
        let mine = caller.map(|c| {
            let mut callers = self.callers.lock().unwrap_or_else(|p| p.into_inner());
            let share = callers.entry(c).or_insert_with(|| {
                Arc::new(CallerSlots {
                    slots: Arc::new(Semaphore::new(self.per_caller)),
                    waiting_kib: Arc::new(Semaphore::new(self.per_caller * START_KIB as usize)),
                })
            });
            (c, share.clone())
        });
        // Without its permits until they are granted; dropped (a refusal, a
        // shim gone), it lets go of the caller's share.
        let mut slot = Slot { links: self.clone(), permits: None, caller: mine };
        // A free slot at once: nothing is held while waiting.
        let own = match &slot.caller {
            Some((_, share)) => share.slots.clone().try_acquire_owned().ok().map(Some),
            None => Some(None),
        };
        if let Some(own) = own {
            if let Ok(all) = self.all.clone().try_acquire_owned() {
                slot.permits = Some((own, all));
                return Ok(slot);
            }
        }
        // Room for this `Start` among the waiting ones, the caller's and everybody's.
        // A larger `Start` (never decoded: `nvlinkd_proto::codec`) never fits.
        let kib = u32::try_from(start_bytes.div_ceil(1024)).unwrap_or(u32::MAX).max(1);
        let room = (|| {
            let theirs = match &slot.caller {
                Some((_, share)) => Some(share.waiting_kib.clone().try_acquire_many_owned(kib).ok()?),
                None => None,
            };
            Some((theirs, self.waiting_kib.clone().try_acquire_many_owned(kib).ok()?))
        })();
        let Some(room) = room else {
            drop(slot);
            return Err(self.refuse(peer, "too many links are waiting for one"));
        };
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
                Some((_, share)) => Some(share.slots.clone().acquire_owned().await.ok()?),
                None => None,
            };
            let all = self.all.clone().acquire_owned().await.ok()?;
            Some((own, all))
        })
        .await;
        drop(waiting);
        drop(room);
        if let Ok(Some(permits)) = acquired {
            slot.permits = Some(permits);
            return Ok(slot);
        }
        drop(slot);
        let why = format!("none ended within {}s", self.wait.as_secs_f64());
        Err(self.refuse(peer, &why))
    }

    /// A link refused a slot (`why`): counted, logged at most every
    /// [`LOG_EVERY`], and the status its shim gets.
    fn refuse(&self, peer: &str, why: &str) -> Status {
        self.refused.fetch_add(1, Ordering::Relaxed);
        match self.refusal_log.allow() {
            Some(suppressed) => warn!(
                %peer,
                suppressed,
                max = self.max,
                per_caller = self.per_caller,
                "remote link refused: no free slot, {why} (logged at most every {}s; suppressed: refusals not \
                 logged since the last line)",
                LOG_EVERY.as_secs()
            ),
            None => debug!(%peer, "remote link refused: no free slot, {why}"),
        }
        Status::resource_exhausted(format!(
            "nvlinkd is serving as many remote links as it may ({} at once, {} per caller) and {why}; run this link \
             elsewhere",
            self.max, self.per_caller,
        ))
    }

    /// Drop a caller's share once nobody holds or waits for a slot of it.
    fn forget(&self, caller: Caller, share: Arc<CallerSlots>) {
        let mut callers = self.callers.lock().unwrap_or_else(|p| p.into_inner());
        // The map's and ours: nobody else holds or waits for a slot of it.
        if Arc::strong_count(&share) == 2 {
            callers.remove(&caller);
        }
    }

    /// For `stats --json`.
    pub fn counters(&self) -> Vec<(&'static str, u64, Kind)> {
        let mut c = vec![
            ("remote_links", (self.max - self.all.available_permits()) as u64, Kind::Gauge),
            ("remote_links_waiting", self.waiting.load(Ordering::Relaxed), Kind::Gauge),
            ("remote_links_refused", self.refused.load(Ordering::Relaxed), Kind::Counter),
        ];
        c.extend(self.partial.counters());
        c
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
            let held: Vec<Slot> =
                all_granted(vec![links.admit(Some(a), "a", 100).await, links.admit(Some(a), "a", 100).await]);
            assert_eq!(links.counters()[0].1, 2);
            let e = links.admit(Some(a), "a", 100).await.err().expect("a third slot for one caller of four");
            assert_eq!(e.code(), tonic::Code::ResourceExhausted);
            assert_eq!(links.counters()[2].1, 1, "counted");
            let b1 = links.admit(Some(b), "b", 100).await.expect("another caller's slot");
            let _b2 = links.admit(Some(b), "b", 100).await.expect("another caller's second slot");
            assert!(links.admit(None, "-", 100).await.is_err(), "all four are taken");
            drop(b1);
            let _any = links.admit(None, "-", 100).await.expect("a slot given back is taken");
            drop(held);
            assert_eq!(links.callers.lock().unwrap().len(), 1, "only b's semaphore is left");
        });
    }

    #[test]
    fn a_waiting_link_gets_the_slot_given_back() {
        rt().block_on(async {
            let links = RemoteLinks::new(1, Duration::from_secs(5));
            let held = links.admit(None, "-", 100).await.unwrap();
            let waiter = tokio::spawn({
                let links = links.clone();
                async move { links.admit(None, "-", 100).await.is_ok() }
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
            let held = links.admit(Some(c), "c", 100).await.unwrap();
            let next = links.admit(Some(c), "c", 100);
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

    #[test]
    fn waiting_starts_hold_at_most_their_share_of_memory() {
        rt().block_on(async {
            // Two slots, one per caller: a caller's waiting Starts may hold one
            // full-size message, everybody's two.
            let links = RemoteLinks::new(2, Duration::from_secs(5));
            let (a, b, c) = ([1u8; 32], [2u8; 32], [3u8; 32]);
            let full = nvlinkd_proto::codec::MAX_START_FOOTPRINT;
            let held_a = links.admit(Some(a), "a", full).await.expect("a free slot takes no waiting room");
            let held_b = links.admit(Some(b), "b", full).await.expect("a free slot takes no waiting room");
            let mut waiters = Vec::new();
            for (who, bytes) in [(a, full / 2), (a, full / 2), (c, full)] {
                let links = links.clone();
                waiters.push(tokio::spawn(async move { links.admit(Some(who), "w", bytes).await.is_ok() }));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
            assert_eq!(links.counters()[1].1, 3, "three waiting");
            let at_once = std::time::Instant::now();
            let e = links.admit(Some(a), "a", 1).await.err().expect("past the caller's waiting room");
            assert_eq!(e.code(), tonic::Code::ResourceExhausted);
            assert!(e.message().contains("waiting"), "{}", e.message());
            let e = links.admit(Some(b), "b", 1).await.err().expect("past everybody's waiting room");
            assert!(at_once.elapsed() < Duration::from_secs(1), "a refusal for room waited");
            assert_eq!(e.code(), tonic::Code::ResourceExhausted);
            assert_eq!(links.counters()[2].1, 2, "both counted");
            for w in waiters {
                w.abort();
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
            let waiter = tokio::spawn({
                let links = links.clone();
                async move { links.admit(Some(b), "b", full).await.is_ok() }
            });
            tokio::time::sleep(Duration::from_millis(20)).await;
            assert_eq!(links.counters()[1].1, 1, "room given back by the waiters that left");
            drop(held_b);
            assert!(waiter.await.unwrap());
            drop(held_a);
        });
    }

    fn all_granted(slots: Vec<Result<Slot, Status>>) -> Vec<Slot> {
        slots.into_iter().map(|s| s.expect("a slot")).collect()
    }
}
