//! The event stream: what the daemon does, as it happens, for IDEs and
//! `nvlinkd events --json`.
//!
//! One JSON object per event, its kind in the field `event` (cargo's
//! `--message-format=json` is the model: `reason` there; here `reason` is a
//! field of `link_cancelled`). Kinds and fields:
//!
//! - `link_started` {link, cwd, args, priority, speculative}
//! - `link_queued` {link, priority}: it must compute and every slot is taken
//! - `link_admitted` {link, priority, waited_ms}: it computes now
//! - `phase` {link, phase, cached, ms}: a phase ended (plan, jit, jitlink,
//!   nvvm, ptxas, finalize, nvlink)
//! - `diagnostic` {link, severity, message}: a line of nvlink's output of kind
//!   error, warning, info or fatal
//! - `link_finished` {link, exit_code, ms, cache_hit, engine, fallback}
//! - `link_cancelled` {link, reason}: `caller_gone` or `superseded`
//! - `verify_mismatch` {link, bundle, differences}: the real nvlink answered
//!   this link otherwise than the in-process engine (`--verify`); `bundle` is
//!   the repro directory
//! - `lagged` {missed}: this subscriber fell behind and missed events
//!
//! The core knows nothing of JSON. Links and their outcome are reported by the
//! service ([`Hub`]); what happens inside a link — phases, queueing and
//! admission, verification's mismatches — comes from the core as typed
//! [`LinkEvent`]s: the [`Hub`] is the linker's [`Observer`]
//! (`Linker::observed`), and its `event` maps each to its line here, so the
//! schema above is this file's alone (renaming a span or a log field changes
//! nothing of it). A `tokio::sync::broadcast` channel fans events out: a slow
//! subscriber loses the oldest events, a link never waits for one.

use std::path::Path;
use std::sync::Arc;

use nvlinkd_core::observe::{LinkEvent, Observer};
use serde_json::{json, Value};
use tokio::sync::broadcast;

/// Events kept for a subscriber that has not read them yet.
const BACKLOG: usize = 4096;

/// One event: the link it concerns (0: none) and its JSON line.
#[derive(Clone, Debug)]
pub struct Event {
    pub link: u64,
    pub kind: &'static str,
    pub json: Arc<str>,
}

/// Where events are published; cheap to clone.
#[derive(Clone)]
pub struct Hub {
    tx: broadcast::Sender<Event>,
}

impl Default for Hub {
    fn default() -> Self {
        Hub { tx: broadcast::channel(BACKLOG).0 }
    }
}

impl Hub {
    /// Receive every event from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.tx.subscribe()
    }

    /// Publish `fields` (an object) as an event of kind `kind` about `link`.
    /// Free when nobody listens.
    pub fn publish(&self, kind: &'static str, link: u64, fields: Value) {
        if self.tx.receiver_count() == 0 {
            return;
        }
        let mut obj = json!({ "event": kind });
        if link != 0 {
            obj["link"] = json!(link);
        }
        if let (Some(o), Value::Object(f)) = (obj.as_object_mut(), fields) {
            o.extend(f);
        }
        let _ = self.tx.send(Event { link, kind, json: obj.to_string().into() });
    }

    /// `link_started`.
    pub fn started(&self, link: u64, cwd: &str, args: &[String], priority: &str, speculative: bool) {
        self.publish(
            "link_started",
            link,
            json!({ "cwd": cwd, "args": args, "priority": priority, "speculative": speculative }),
        );
    }

    /// One `diagnostic` per line of nvlink's output that is an nvlink message
    /// (`nvlink error   : …`, `nvlink warning : …`, `nvlink info    : …`,
    /// `nvlink fatal   : …`), then nothing else of the output.
    pub fn diagnostics(&self, link: u64, stdout: &[u8], stderr: &[u8]) {
        if self.tx.receiver_count() == 0 {
            return;
        }
        for line in String::from_utf8_lossy(stderr).lines().chain(String::from_utf8_lossy(stdout).lines()) {
            if let Some((severity, message)) = diagnostic(line) {
                self.publish("diagnostic", link, json!({ "severity": severity, "message": message }));
            }
        }
    }

    /// `link_finished`.
    pub fn finished(&self, link: u64, exit_code: i32, ms: f64, engine: &str, fallback: bool) {
        self.publish(
            "link_finished",
            link,
            json!({
                "exit_code": exit_code,
                "ms": round(ms),
                "cache_hit": engine == "cache",
                "engine": engine,
                "fallback": fallback,
            }),
        );
    }

    /// `link_cancelled`.
    pub fn cancelled(&self, link: u64, reason: &str) {
        self.publish("link_cancelled", link, json!({ "reason": reason }));
    }
}

/// `nvlink <severity> : <message>` → (severity, message).
fn diagnostic(line: &str) -> Option<(&'static str, &str)> {
    let rest = line.strip_prefix("nvlink ")?;
    let (kind, message) = rest.split_once(':')?;
    let severity = match kind.trim() {
        "error" => "error",
        "warning" => "warning",
        "info" => "info",
        "fatal" => "fatal",
        _ => return None,
    };
    Some((severity, message.trim()))
}

fn round(ms: f64) -> f64 {
    (ms * 1000.0).round() / 1000.0
}

/// The core's events about a link, as lines of the stream: `phase`,
/// `link_queued`, `link_admitted`, `verify_mismatch`.
impl Observer for Hub {
    fn event(&self, e: &LinkEvent) {
        if self.tx.receiver_count() == 0 {
            return;
        }
        match e {
            LinkEvent::PhaseFinished { link, phase, cached, ms } => {
                self.publish("phase", *link, json!({ "phase": phase.name(), "cached": cached, "ms": round(*ms) }))
            }
            LinkEvent::Queued { link, priority } => {
                self.publish("link_queued", *link, json!({ "priority": priority.name() }))
            }
            LinkEvent::Admitted { link, priority, waited_ms } => self.publish(
                "link_admitted",
                *link,
                json!({ "priority": priority.name(), "waited_ms": round(*waited_ms) }),
            ),
            LinkEvent::VerifyMismatch { link, bundle, differences } => {
                let bundle = bundle.as_deref().unwrap_or(Path::new("-")).display().to_string();
                let fields = json!({ "bundle": bundle, "differences": differences.join("; ") });
                self.publish("verify_mismatch", *link, fields)
            }
        }
    }
}

/// An engine's name in `link_finished`.
pub fn engine_name(e: nvlinkd_core::request::EngineKind) -> &'static str {
    use nvlinkd_core::request::EngineKind;
    match e {
        EngineKind::Frontend => "frontend",
        EngineKind::InProcess => "in_process",
        EngineKind::NvlinkProcess => "nvlink",
        EngineKind::Cache => "cache",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diagnostics_are_nvlink_message_lines() {
        assert_eq!(
            diagnostic("nvlink error   : Undefined reference to 'f' in 'a.o'"),
            Some(("error", "Undefined reference to 'f' in 'a.o'"))
        );
        assert_eq!(
            diagnostic("nvlink warning : SM Arch ('sm_52') not found"),
            Some(("warning", "SM Arch ('sm_52') not found"))
        );
        assert_eq!(diagnostic("nvlink info    : 0 bytes gmem"), Some(("info", "0 bytes gmem")));
        assert_eq!(
            diagnostic("nvlink fatal   : Could not open input file 'x'"),
            Some(("fatal", "Could not open input file 'x'"))
        );
        assert_eq!(diagnostic("ptxas info    : Used 8 registers"), None);
        assert_eq!(diagnostic("nvlink: something"), None);
    }

    #[tokio::test]
    async fn events_carry_their_kind_and_link() {
        let hub = Hub::default();
        let mut rx = hub.subscribe();
        hub.started(7, "/w", &["-o".into(), "x".into()], "background", true);
        hub.cancelled(7, "superseded");
        let v: Value = serde_json::from_str(&rx.recv().await.unwrap().json).unwrap();
        assert_eq!(v["event"], "link_started");
        assert_eq!(v["link"], 7);
        assert_eq!(v["args"][1], "x");
        assert_eq!(v["speculative"], true);
        let v: Value = serde_json::from_str(&rx.recv().await.unwrap().json).unwrap();
        assert_eq!((v["event"].as_str(), v["reason"].as_str()), (Some("link_cancelled"), Some("superseded")));
    }

    /// The core's typed events become the lines the module docs name, with
    /// exactly those fields.
    #[tokio::test]
    async fn link_events_are_the_documented_lines() {
        use nvlinkd_core::observe::Phase;
        use nvlinkd_core::sched::Priority;
        let hub = Hub::default();
        let mut rx = hub.subscribe();
        hub.event(&LinkEvent::PhaseFinished { link: 3, phase: Phase::JitLink, cached: false, ms: 1.234_56 });
        hub.event(&LinkEvent::PhaseFinished { link: 3, phase: Phase::Nvvm, cached: true, ms: 0.5 });
        hub.event(&LinkEvent::Queued { link: 3, priority: Priority::Background });
        hub.event(&LinkEvent::Admitted { link: 3, priority: Priority::Foreground, waited_ms: 2.000_4 });
        let differences = vec!["stdout".to_owned(), "/o/a.cubin: 9 bytes, nvlink's 8".to_owned()];
        hub.event(&LinkEvent::VerifyMismatch { link: 3, bundle: Some("/c/verify/ab-1-0".into()), differences });
        hub.event(&LinkEvent::VerifyMismatch { link: 3, bundle: None, differences: vec!["stderr".to_owned()] });
        let want = [
            json!({ "event": "phase", "link": 3, "phase": "jitlink", "cached": false, "ms": 1.235 }),
            json!({ "event": "phase", "link": 3, "phase": "nvvm", "cached": true, "ms": 0.5 }),
            json!({ "event": "link_queued", "link": 3, "priority": "background" }),
            json!({ "event": "link_admitted", "link": 3, "priority": "foreground", "waited_ms": 2.0 }),
            json!({
                "event": "verify_mismatch",
                "link": 3,
                "bundle": "/c/verify/ab-1-0",
                "differences": "stdout; /o/a.cubin: 9 bytes, nvlink's 8",
            }),
            json!({ "event": "verify_mismatch", "link": 3, "bundle": "-", "differences": "stderr" }),
        ];
        for w in want {
            let got = rx.recv().await.unwrap();
            assert_eq!((got.link, got.kind), (3, w["event"].as_str().unwrap()));
            assert_eq!(serde_json::from_str::<Value>(&got.json).unwrap(), w);
        }
    }
}
