//! Test hooks, in one place: environment variables the integration tests set
//! on a daemon to hold a link at a known point or inject a fault, so that
//! order is observed, never timed. Read once when a [`Linker`](crate::Linker)
//! is made; unset, each costs a branch. (The worker's own hook is
//! `worker::HOLD_ENV`; the daemon's `NVLINKD_TEST_SLOW_LINK_MS` and
//! `NVLINKD_TEST_REMOTE_BATCH_BYTES` live with the server.)

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::time::{Duration, Instant};

use crate::cancel::Cancel;

#[derive(Default)]
pub(crate) struct TestHooks {
    /// `NVLINKD_TEST_HOLD_SLOT`: an admitted link waits while this file
    /// exists (cancellably), so tests can fill every slot.
    hold_slot: Option<PathBuf>,
    /// `NVLINKD_TEST_HOLD_STORE`: one link at a time, about to store its
    /// entry, waits while this file exists (and marks `<file>.storing`).
    hold_store: Option<PathBuf>,
    holding_store: AtomicBool,
    /// `NVLINKD_TEST_PAUSE_AFTER_KEY_MS`: a pause between a link's key and
    /// its computation, for tests that change inputs in between.
    pause_after_key: Option<Duration>,
    /// `NVLINKD_TEST_CORRUPT_IN_PROCESS`: the in-process engine's output
    /// files come out damaged (a fault verification must catch).
    corrupt_in_process: bool,
}

impl TestHooks {
    pub(crate) fn from_env() -> TestHooks {
        TestHooks {
            hold_slot: std::env::var_os("NVLINKD_TEST_HOLD_SLOT").map(PathBuf::from),
            hold_store: std::env::var_os("NVLINKD_TEST_HOLD_STORE").map(PathBuf::from),
            holding_store: AtomicBool::new(false),
            pause_after_key: std::env::var("NVLINKD_TEST_PAUSE_AFTER_KEY_MS")
                .ok()
                .and_then(|v| v.parse().ok())
                .filter(|&ms| ms > 0)
                .map(Duration::from_millis),
            corrupt_in_process: std::env::var_os("NVLINKD_TEST_CORRUPT_IN_PROCESS").is_some(),
        }
    }

    /// An admitted link waits here while the hold-slot file exists; false
    /// when it was cancelled meanwhile.
    pub(crate) fn hold_slot(&self, cancel: &Cancel) -> bool {
        if let Some(hold) = &self.hold_slot {
            while hold.exists() && !cancel.is_cancelled() {
                std::thread::sleep(Duration::from_millis(10));
            }
            return !cancel.is_cancelled();
        }
        true
    }

    /// Between the key and the computation.
    pub(crate) fn pause_after_key(&self) {
        if let Some(pause) = self.pause_after_key {
            std::thread::sleep(pause);
        }
    }

    /// Before a link stores its entry: a test sees what happens meanwhile.
    pub(crate) fn hold_store(&self) {
        let Some(hold) = &self.hold_store else { return };
        if !hold.exists() || self.holding_store.swap(true, SeqCst) {
            return;
        }
        let mut mark = hold.clone().into_os_string();
        mark.push(".storing");
        let _ = std::fs::write(&mark, b"");
        let t0 = Instant::now();
        while hold.exists() && t0.elapsed() < Duration::from_secs(120) {
            std::thread::sleep(Duration::from_millis(10));
        }
        self.holding_store.store(false, SeqCst);
    }

    /// The in-process engine's output, damaged when the fault is injected.
    pub(crate) fn corrupt(&self, output: &mut [u8]) {
        if self.corrupt_in_process {
            if let Some(b) = output.last_mut() {
                *b ^= 0x5a;
            }
        }
    }
}
