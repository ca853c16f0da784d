//! Single flight: identical work requested concurrently is computed once.
//!
//! The first caller of a key becomes the leader and computes; later callers of
//! the same key wait for the leader's result instead of computing it again. If
//! the leader fails (returns `None` or panics), one waiter takes over.

use std::sync::{Arc, Condvar, Mutex};

use dashmap::DashMap;

use super::store::Key;

type Slot<T> = Arc<(Mutex<Option<Option<T>>>, Condvar)>;

pub struct Flights<T: Clone> {
    inflight: DashMap<Key, Slot<T>>,
}

impl<T: Clone> Default for Flights<T> {
    fn default() -> Self {
        Flights { inflight: DashMap::new() }
    }
}

/// Removes the leader's slot even if the computation panics, waking waiters.
struct Leader<'a, T: Clone> {
    flights: &'a Flights<T>,
    key: Key,
    slot: Slot<T>,
    result: Option<Option<T>>,
}

impl<T: Clone> Drop for Leader<'_, T> {
    fn drop(&mut self) {
        self.flights.inflight.remove(&self.key);
        let (lock, cv) = &*self.slot;
        if let Ok(mut r) = lock.lock() {
            *r = Some(self.result.take().unwrap_or(None));
        }
        cv.notify_all();
    }
}

impl<T: Clone> Flights<T> {
    /// Run `compute` for `key` unless another caller is already running it, in
    /// which case wait for that result (computed by whichever call ran it).
    pub fn run(&self, key: Key, compute: impl FnOnce() -> Option<T>) -> Option<T> {
        self.run_or_wait(key, || {}, compute)
    }

    /// [`Flights::run`], calling `waiting` once before this caller first waits
    /// for another's result: to give back what it holds that the leader may
    /// need (a link gives back its plan permit, which a background leader
    /// waits on while a foreground link holds one: a deadlock otherwise).
    pub fn run_or_wait(&self, key: Key, waiting: impl FnOnce(), compute: impl FnOnce() -> Option<T>) -> Option<T> {
        let mut compute = Some(compute);
        let mut waiting = Some(waiting);
        loop {
            let (slot, leader) = match self.inflight.entry(key) {
                dashmap::Entry::Occupied(e) => (e.get().clone(), false),
                dashmap::Entry::Vacant(e) => {
                    let slot: Slot<T> = Arc::new((Mutex::new(None), Condvar::new()));
                    e.insert(slot.clone());
                    (slot, true)
                }
            };
            if leader {
                let mut guard = Leader { flights: self, key, slot, result: None };
                let value = compute.take().and_then(|f| f());
                guard.result = Some(value.clone());
                return value;
            }
            if let Some(w) = waiting.take() {
                w();
            }
            let (lock, cv) = &*slot;
            let Ok(mut r) = lock.lock() else { return None };
            while r.is_none() {
                r = match cv.wait(r) {
                    Ok(r) => r,
                    Err(_) => return None,
                };
            }
            if let Some(Some(v)) = r.clone() {
                return Some(v);
            }
            // The leader produced nothing: try again, possibly as the leader.
            compute.as_ref()?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A waiter gives back what the leader needs before it waits (the leader
    /// here finishes only once the waiter has done so, as a speculative link
    /// is admitted only once a waiting foreground link gave back its plan
    /// permit).
    #[test]
    fn a_waiter_gives_back_before_it_waits() {
        let f: Flights<u32> = Flights::default();
        let (given_back, permit) = std::sync::mpsc::channel::<()>();
        let (started, leading) = std::sync::mpsc::channel::<()>();
        std::thread::scope(|s| {
            let f = &f;
            let leader = s.spawn(move || {
                f.run([7; 32], || {
                    started.send(()).unwrap();
                    permit.recv_timeout(std::time::Duration::from_secs(10)).ok().map(|()| 1)
                })
            });
            leading.recv().unwrap();
            let waiter = f.run_or_wait([7; 32], || given_back.send(()).unwrap(), || Some(2));
            assert_eq!(leader.join().unwrap(), Some(1), "the leader never got what the waiter held");
            assert_eq!(waiter, Some(1));
        });
    }

    #[test]
    fn concurrent_identical_work_runs_once() {
        let f: Flights<u32> = Flights::default();
        let runs = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    let v = f.run([7; 32], || {
                        runs.fetch_add(1, Ordering::SeqCst);
                        std::thread::sleep(std::time::Duration::from_millis(100));
                        Some(42)
                    });
                    assert_eq!(v, Some(42));
                });
            }
        });
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }
}
