//! `nvlinkd events --json` followed by a test: the daemon's event stream, one
//! JSON object per line, read on a thread and waited for with a deadline.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::corpus;
use crate::daemon::Daemon;
use crate::env::{nvlinkd, shim, TempDir};
use crate::run::{run, Invocation};

/// Longest wait for an event a test provoked (a broken daemon fails here
/// instead of hanging).
const PATIENCE: Duration = Duration::from_secs(120);

/// `nvlinkd events --json` on the daemon's socket, read line by line.
pub struct Events {
    child: Child,
    rx: Receiver<String>,
    /// Every event read so far.
    pub seen: Vec<Value>,
}

impl Events {
    /// Subscribe, and make sure the subscription is live: `--version` links
    /// go through the daemon until one of them shows up as an event.
    pub fn follow(d: &Daemon) -> Events {
        Events::follow_filtered(d, &[], corpus::dir(), "--version")
    }

    /// [`Events::follow`] with `nvlinkd events` options (filters): the
    /// probes are `probe` (templated) run in `cwd`, which the filter must
    /// let through.
    pub fn follow_filtered(d: &Daemon, options: &[&str], cwd: &Path, probe: &str) -> Events {
        let mut child = Command::new(nvlinkd())
            .args(["events", "--json"])
            .args(options)
            .arg("--socket")
            .arg(d.socket())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("nvlinkd events");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut ev = Events { child, rx, seen: Vec::new() };
        let probe_out = TempDir::new("ev-probe");
        let deadline = Instant::now() + PATIENCE;
        loop {
            let r = run(&shim(), &Invocation::templated(probe, cwd, &probe_out), &d.shim_env());
            assert_eq!(r.code, 0);
            // (The subscription may start in the middle of a probe.)
            if ev.next(Duration::from_millis(200)).is_some() {
                break;
            }
            assert!(Instant::now() < deadline, "no event came from nvlinkd events");
        }
        // Whatever else the probes produced is not the test's.
        while ev.next(Duration::from_millis(300)).is_some() {}
        ev.seen.clear();
        ev
    }

    /// The next event, if one comes within `wait`.
    pub fn next(&mut self, wait: Duration) -> Option<Value> {
        match self.rx.recv_timeout(wait) {
            Ok(line) => {
                let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
                self.seen.push(v.clone());
                Some(v)
            }
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => panic!("nvlinkd events ended; events so far: {:#?}", self.seen),
        }
    }

    /// Wait for the first event (seen before or arriving) that `pred` accepts.
    pub fn wait(&mut self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        if let Some(v) = self.seen.iter().find(|v| pred(v)) {
            return v.clone();
        }
        let deadline = Instant::now() + PATIENCE;
        while Instant::now() < deadline {
            if let Some(v) = self.next(Duration::from_millis(500)) {
                if pred(&v) {
                    return v;
                }
            }
        }
        panic!("no event {what}; events: {:#?}", self.seen)
    }

    /// The id of the link started with an `-o` ending in `out`.
    pub fn started(&mut self, out: &str) -> u64 {
        let v = self.wait(&format!("link_started for {out}"), |v| {
            v["event"] == "link_started"
                && v["args"].as_array().is_some_and(|a| a.iter().any(|x| x.as_str().is_some_and(|s| s.ends_with(out))))
        });
        v["link"].as_u64().expect("link id")
    }

    pub fn of(&mut self, kind: &str, link: u64) -> Value {
        self.wait(&format!("{kind} of link {link}"), |v| v["event"] == kind && v["link"] == link)
    }

    pub fn all(&self, kind: &str, link: u64) -> Vec<Value> {
        self.seen.iter().filter(|v| v["event"] == kind && v["link"] == link).cloned().collect()
    }
}

impl Drop for Events {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
