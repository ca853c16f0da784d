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
//! The core knows nothing of this. Links and their outcome are reported by the
//! service ([`Hub`]); phases come from the core's existing `tracing` spans
//! (`Linker::link_span`'s `link{id}` and the phase spans inside it) through
//! [`PhaseLayer`], and queueing from the scheduler's `sched = …` debug
//! events — so phases are timed in one place, by the spans the log already
//! shows. A `tokio::sync::broadcast` channel fans events out: a slow
//! subscriber loses the oldest events, a link never waits for one.

use std::sync::Arc;
use std::time::Instant;

use serde_json::{json, Value};
use tokio::sync::broadcast;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event as TracingEvent, Subscriber};
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// Events kept for a subscriber that has not read them yet.
const BACKLOG: usize = 4096;

/// The phases reported as `phase` events (the core's span names).
const PHASES: &[&str] = &["plan", "jit", "jitlink", "nvvm", "ptxas", "finalize", "nvlink"];

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

/// Turns the core's spans into events (see the module docs).
pub struct PhaseLayer {
    pub hub: Hub,
}

/// The id of a `link` span.
struct LinkId(u64);

/// A phase span in progress.
struct Phase {
    link: u64,
    name: &'static str,
    start: Instant,
    cached: bool,
}

#[derive(Default)]
struct Fields {
    id: Option<u64>,
    cached: Option<bool>,
    sched: Option<String>,
    priority: Option<String>,
    waited_ms: Option<f64>,
    verify: Option<String>,
    bundle: Option<String>,
    differences: Option<String>,
}

impl Visit for Fields {
    fn record_u64(&mut self, field: &Field, value: u64) {
        if field.name() == "id" {
            self.id = Some(value);
        }
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        if field.name() == "id" {
            self.id = u64::try_from(value).ok();
        }
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        if field.name() == "cached" {
            self.cached = Some(value);
        }
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        if field.name() == "waited_ms" {
            self.waited_ms = Some(value);
        }
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "sched" => self.sched = Some(value.to_owned()),
            "priority" => self.priority = Some(value.to_owned()),
            "verify" => self.verify = Some(value.to_owned()),
            _ => {}
        }
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        match field.name() {
            "bundle" => self.bundle = Some(format!("{value:?}")),
            "differences" => self.differences = Some(format!("{value:?}")),
            _ => {}
        }
    }
}

fn from_core(target: &str) -> bool {
    target.starts_with("nvlinkd_core")
}

impl PhaseLayer {
    /// The id of the link span enclosing `span` (itself included).
    fn link_of<S>(span: &tracing_subscriber::registry::SpanRef<'_, S>) -> Option<u64>
    where
        S: for<'a> LookupSpan<'a>,
    {
        span.scope().find_map(|s| s.extensions().get::<LinkId>().map(|l| l.0))
    }
}

impl<S> Layer<S> for PhaseLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let meta = attrs.metadata();
        if !from_core(meta.target()) {
            return;
        }
        let Some(span) = ctx.span(id) else { return };
        let mut f = Fields::default();
        attrs.record(&mut f);
        if meta.name() == "link" {
            if let Some(link) = f.id {
                span.extensions_mut().insert(LinkId(link));
            }
        } else if let Some(name) = PHASES.iter().find(|p| **p == meta.name()) {
            if let Some(link) = Self::link_of(&span) {
                let phase = Phase { link, name, start: Instant::now(), cached: f.cached.unwrap_or(false) };
                span.extensions_mut().insert(phase);
            }
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut f = Fields::default();
        values.record(&mut f);
        let Some(cached) = f.cached else { return };
        let mut ext = span.extensions_mut();
        if let Some(phase) = ext.get_mut::<Phase>() {
            phase.cached = cached;
        }
    }

    fn on_event(&self, event: &TracingEvent<'_>, ctx: Context<'_, S>) {
        if !from_core(event.metadata().target()) {
            return;
        }
        let mut f = Fields::default();
        event.record(&mut f);
        let link = ctx
            .event_scope(event)
            .and_then(|mut scope| scope.find_map(|s| s.extensions().get::<LinkId>().map(|l| l.0)));
        if f.verify.as_deref() == Some("mismatch") {
            let fields = json!({ "bundle": f.bundle, "differences": f.differences });
            self.hub.publish("verify_mismatch", link.unwrap_or(0), fields);
            return;
        }
        let Some(kind) = f.sched.as_deref() else { return };
        let Some(link) = link else { return };
        let priority = f.priority.unwrap_or_default();
        match kind {
            "queued" => self.hub.publish("link_queued", link, json!({ "priority": priority })),
            "admitted" => self.hub.publish(
                "link_admitted",
                link,
                json!({ "priority": priority, "waited_ms": round(f.waited_ms.unwrap_or(0.0)) }),
            ),
            _ => {}
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(&id) else { return };
        let Some(phase) = span.extensions_mut().remove::<Phase>() else { return };
        self.hub.publish(
            "phase",
            phase.link,
            json!({
                "phase": phase.name,
                "cached": phase.cached,
                "ms": round(phase.start.elapsed().as_secs_f64() * 1e3),
            }),
        );
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
}
