//! The event stream: what the daemon does, as it happens, for IDEs and
//! `nvlinkd events --json`. The reference, every kind and field, is
//! `docs/events.md` (schema [`SCHEMA`]); a test keeps the two in step.
//!
//! One JSON object per event in an envelope: `event` (its kind), `schema`,
//! `time` (RFC 3339, UTC) and `link` (the link's id, 0 for none). cargo's
//! `--message-format=json` is the model. A link's events come in this order:
//! `link_started`, `link_queued`/`link_admitted` when it computes,
//! `phase_started`/`phase_progress`/`phase_finished` per phase, its
//! `diagnostic`s, then exactly one `link_finished` or `link_cancelled`.
//!
//! Each kind's fields are a message of the proto (`Event.body`): the JSON
//! line is that message serialised (serde, derived in `proto/build.rs`), so
//! the typed stream and the JSON one cannot disagree.
//!
//! The core knows nothing of JSON. Links and their outcome are reported by
//! the daemon (the service, speculation, watch) through [`Hub::started`],
//! [`Hub::finished`] and [`Hub::cancelled`]; what happens inside a link —
//! phases, queueing and admission, verification's mismatches — comes from
//! the core as typed [`LinkEvent`]s: the [`Hub`] is the linker's
//! [`Observer`] (`Linker::observed`), and maps each to its line here, so the
//! schema is this file's alone (renaming a span or a log field changes
//! nothing of it). Diagnostics are nvlink's message lines read into fields
//! (`diagnostics.rs`). A `tokio::sync::broadcast` channel fans events out: a
//! slow subscriber loses the oldest events (and is told, `lagged`), a link
//! never waits for one. Subscribers filter on the server ([`Filter`]).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nvlinkd_core::cancel::{Cancel, Stopped};
use nvlinkd_core::observe::{LinkEvent, Observer, Phase};
use nvlinkd_proto::v1 as pb;
use pb::event::Body;
use serde_json::Value;
use tokio::sync::broadcast;

use crate::observe::diagnostics::{self, Diagnostic};

/// The version of the events' schema (`schema` in every event): raised when
/// a field changes meaning or goes away (new kinds and fields keep it).
pub const SCHEMA: u32 = 1;

/// Most bytes of arguments a `link_started` carries (the rest: `args_truncated`).
const ARGS_MAX: usize = 64 << 10;

/// Events kept for a subscriber that has not read them yet.
const BACKLOG: usize = 4096;

/// A phase running this long gets `phase_progress` events, this often.
pub const PROGRESS_EVERY: Duration = Duration::from_secs(1);

/// One event: the link it concerns (0: none), its kind, its fields (typed:
/// the proto's message of the kind), its JSON line (made of those), when,
/// and what the link is (for the subscribers' filters).
#[derive(Clone, Debug)]
pub struct Event {
    pub link: u64,
    pub kind: &'static str,
    pub body: Arc<Body>,
    pub json: Arc<str>,
    pub time_unix_ms: i64,
    pub meta: Option<Arc<LinkMeta>>,
}

impl Event {
    /// An event of `body`'s kind about `link`, now.
    fn new(link: u64, body: Body, meta: Option<Arc<LinkMeta>>) -> Event {
        let now = time::OffsetDateTime::now_utc();
        let time_unix_ms = (now.unix_timestamp_nanos() / 1_000_000) as i64;
        let kind = kind_of(&body);
        let json = line(kind, link, fields_of(&body), now).into();
        Event { link, kind, body: Arc::new(body), json, time_unix_ms, meta }
    }

    /// The event as the `Events` RPC sends it.
    pub fn to_proto(&self) -> pb::Event {
        pb::Event {
            json: self.json.to_string(),
            kind: self.kind.to_owned(),
            link: self.link,
            schema: SCHEMA,
            time_unix_ms: self.time_unix_ms,
            body: Some((*self.body).clone()),
        }
    }
}

/// The kind of an event's body (`event` in its JSON).
pub fn kind_of(body: &Body) -> &'static str {
    match body {
        Body::LinkStarted(_) => "link_started",
        Body::LinkQueued(_) => "link_queued",
        Body::LinkAdmitted(_) => "link_admitted",
        Body::PhaseStarted(_) => "phase_started",
        Body::PhaseProgress(_) => "phase_progress",
        Body::PhaseFinished(_) => "phase_finished",
        Body::Diagnostic(_) => "diagnostic",
        Body::LinkFinished(_) => "link_finished",
        Body::LinkCancelled(_) => "link_cancelled",
        Body::VerifyMismatch(_) => "verify_mismatch",
        Body::Lagged(_) => "lagged",
    }
}

/// A body's fields as JSON: its message serialised (the one schema).
fn fields_of(body: &Body) -> Value {
    serde_json::to_value(body).unwrap_or(Value::Null)
}

/// What a link is, from its start to its end: for the subscribers' filters,
/// `link_finished`'s fields and cancelling it by its id.
pub struct LinkMeta {
    /// The caller's working directory.
    pub cwd: PathBuf,
    /// The files the command line names as outputs, absolute.
    pub outputs: Vec<PathBuf>,
    pub speculative: bool,
    /// Who asked: `local` (a shim on the unix socket), `remote` (a shim over
    /// TCP), `speculative` (the daemon predicted it), `watch` (a relink of a
    /// watched link).
    pub origin: &'static str,
    /// Its control handle (cancel by id), for links this daemon may cancel.
    pub cancel: Option<Cancel>,
    /// Its command line (the inputs of its diagnostics under LTO).
    pub args: Vec<String>,
}

impl std::fmt::Debug for LinkMeta {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinkMeta")
            .field("cwd", &self.cwd)
            .field("outputs", &self.outputs)
            .field("origin", &self.origin)
            .finish_non_exhaustive()
    }
}

/// What a subscriber wants to see (`nvlinkd events --cwd DIR --output PATH
/// --no-speculative`; the `Events` request's fields). Events about no link
/// (`lagged`) always pass.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    /// Links whose working directory is this directory or below it.
    pub cwd: Option<PathBuf>,
    /// Links that write this file (absolute, or relative to `cwd`).
    pub output: Option<PathBuf>,
    /// No speculative links (nor watch relinks).
    pub no_speculative: bool,
}

impl Filter {
    pub fn admits(&self, ev: &Event) -> bool {
        if ev.link == 0 {
            return true;
        }
        let Some(meta) = &ev.meta else {
            // A link this daemon knows nothing of passes only an empty filter.
            return self.cwd.is_none() && self.output.is_none() && !self.no_speculative;
        };
        if self.no_speculative && meta.speculative {
            return false;
        }
        if self.cwd.as_ref().is_some_and(|c| !meta.cwd.starts_with(c)) {
            return false;
        }
        if let Some(out) = &self.output {
            let out = match &self.cwd {
                Some(c) if out.is_relative() => c.join(out),
                _ => out.clone(),
            };
            if !meta.outputs.contains(&out) {
                return false;
            }
        }
        true
    }
}

/// What `link_started` tells.
pub struct Started<'a> {
    pub link: u64,
    pub cwd: &'a Path,
    pub args: &'a [String],
    pub priority: &'static str,
    pub origin: &'static str,
    pub cancel: Option<Cancel>,
}

/// How a link ended with an answer (`link_finished`).
pub struct Finished<'a> {
    pub exit_code: i32,
    pub ms: f64,
    /// [`engine_name`], or `none` (the daemon failed and gave it back).
    pub engine: &'static str,
    /// Why it was handed back to the caller's nvlink, if it was.
    pub fallback: Option<&'a str>,
    pub stdout: &'a [u8],
    pub stderr: &'a [u8],
    /// The files written (absolute); None: those the command line names.
    pub written: Option<Vec<PathBuf>>,
}

/// The phases running now: how many of a kind per link, since when.
type Running = HashMap<(u64, Phase), (usize, Instant)>;

/// Where events are published; cheap to clone.
#[derive(Clone)]
pub struct Hub {
    tx: broadcast::Sender<Event>,
    /// The links between their start and their end.
    links: Arc<Mutex<HashMap<u64, Arc<LinkMeta>>>>,
    running: Arc<Mutex<Running>>,
}

impl Default for Hub {
    fn default() -> Self {
        Hub { tx: broadcast::channel(BACKLOG).0, links: Default::default(), running: Default::default() }
    }
}

impl Hub {
    /// Receive every event from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.tx.subscribe()
    }

    fn meta(&self, link: u64) -> Option<Arc<LinkMeta>> {
        self.links.lock().unwrap_or_else(|p| p.into_inner()).get(&link).cloned()
    }

    /// Publish `body` as an event about `link`, in the envelope every event
    /// has (`event`, `schema`, `time`, `link`). Free when nobody listens.
    pub fn publish(&self, link: u64, body: Body) {
        if self.tx.receiver_count() == 0 {
            return;
        }
        let meta = self.meta(link);
        let _ = self.tx.send(Event::new(link, body, meta));
    }

    /// A link begins: `link_started`; the link is known (filters, cancel by
    /// id) until [`Hub::finished`] or [`Hub::cancelled`].
    pub fn started(&self, s: Started<'_>) {
        let outputs = named_outputs(s.args, s.cwd);
        let speculative = matches!(s.origin, "speculative" | "watch");
        let meta = LinkMeta {
            cwd: s.cwd.to_owned(),
            outputs,
            speculative,
            origin: s.origin,
            cancel: s.cancel,
            args: s.args.to_vec(),
        };
        // A command line may be megabytes (options files expanded): the
        // backlog of a stuck reader keeps every event, so the arguments an
        // event carries are bounded.
        let mut kept = 0;
        let args: Vec<&String> = s
            .args
            .iter()
            .take_while(|a| {
                kept += a.len();
                kept <= ARGS_MAX
            })
            .collect();
        let body = Body::LinkStarted(pb::LinkStarted {
            cwd: s.cwd.to_string_lossy().into_owned(),
            args_truncated: args.len() < s.args.len(),
            args: args.into_iter().cloned().collect(),
            priority: s.priority.to_owned(),
            speculative,
            origin: s.origin.to_owned(),
            outputs: paths(&meta.outputs),
        });
        self.links.lock().unwrap_or_else(|p| p.into_inner()).insert(s.link, Arc::new(meta));
        self.publish(s.link, body);
    }

    /// A link answered: one `diagnostic` per message line of nvlink's output,
    /// then `link_finished`. The link is forgotten.
    pub fn finished(&self, link: u64, f: Finished<'_>) {
        let meta = self.meta(link);
        if self.tx.receiver_count() > 0 {
            let cwd = meta.as_ref().map(|m| m.cwd.as_path());
            // A remote caller's directory is on its machine, not this one:
            // its objects are not resolved here.
            let here = meta.as_ref().filter(|m| m.origin != "remote").map(|m| m.cwd.as_path());
            for (i, mut d) in diagnostics::of_output(f.stdout, f.stderr).into_iter().enumerate() {
                let lines = i < diagnostics::SOURCE_LINE_LOOKUPS;
                if let (Some(cwd), Some(m), true) = (here, &meta, lines) {
                    d.locate_lto(cwd, &m.args);
                }
                self.publish(link, Body::Diagnostic(d.event(here, lines)));
            }
            let outputs = match (&f.written, &meta) {
                (Some(w), _) => paths(w),
                (None, Some(m)) => paths(&m.outputs),
                (None, None) => Vec::new(),
            };
            let body = Body::LinkFinished(pb::LinkFinished {
                exit_code: f.exit_code,
                ms: round(f.ms),
                cache_hit: f.engine == "cache",
                engine: f.engine.to_owned(),
                fallback: f.fallback.is_some(),
                fallback_reason: f.fallback.map(str::to_owned),
                cwd: cwd.map(|c| c.to_string_lossy().into_owned()),
                outputs,
            });
            self.publish(link, body);
        }
        self.forget(link);
    }

    /// A link was stopped before its answer: `link_cancelled` with why
    /// (`caller_gone`, `superseded` and by which link, `requested`,
    /// `timed_out`). The link is forgotten.
    pub fn cancelled(&self, link: u64, why: Stopped, superseded_by: Option<u64>) {
        let meta = self.meta(link);
        let body = Body::LinkCancelled(pb::LinkCancelled {
            reason: why.name().to_owned(),
            superseded_by,
            cwd: meta.as_ref().map(|m| m.cwd.to_string_lossy().into_owned()),
            outputs: meta.as_ref().map(|m| paths(&m.outputs)).unwrap_or_default(),
        });
        self.publish(link, body);
        self.forget(link);
    }

    fn forget(&self, link: u64) {
        self.links.lock().unwrap_or_else(|p| p.into_inner()).remove(&link);
        self.running.lock().unwrap_or_else(|p| p.into_inner()).retain(|(l, _), _| *l != link);
    }

    /// Cancel a running link by its id (the `Cancel` RPC): false when no
    /// such link runs, or it is not one this daemon cancels.
    pub fn cancel(&self, link: u64) -> bool {
        match self.meta(link).and_then(|m| m.cancel.clone()) {
            Some(c) => {
                c.cancel_requested();
                true
            }
            None => false,
        }
    }

    /// `phase_progress` for every phase running longer than
    /// [`PROGRESS_EVERY`], every [`PROGRESS_EVERY`], for as long as the
    /// runtime runs (a task on it).
    pub fn spawn_progress(&self) {
        let hub = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(PROGRESS_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            loop {
                tick.tick().await;
                hub.progress(PROGRESS_EVERY);
            }
        });
    }

    /// One `phase_progress` per phase running longer than `past`.
    pub fn progress(&self, past: Duration) {
        if self.tx.receiver_count() == 0 {
            return;
        }
        let long: Vec<((u64, Phase), (usize, Instant))> = self
            .running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|(_, (_, since))| since.elapsed() >= past)
            .map(|(k, v)| (*k, *v))
            .collect();
        for ((link, phase), (count, since)) in long {
            let elapsed_ms = since.elapsed().as_millis() as u64;
            let body = Body::PhaseProgress(pb::PhaseProgress {
                phase: phase.name().to_owned(),
                elapsed_ms,
                running: count as u64,
            });
            self.publish(link, body);
        }
    }
}

/// An event's line: the envelope (`event`, `schema`, `time`, `link`) and its fields.
fn line(kind: &str, link: u64, fields: Value, at: time::OffsetDateTime) -> String {
    let mut obj = serde_json::json!({ "event": kind, "schema": SCHEMA, "time": rfc3339(at), "link": link });
    if let (Some(o), Value::Object(f)) = (obj.as_object_mut(), fields) {
        o.extend(f);
    }
    obj.to_string()
}

/// A time in RFC 3339 (UTC, milliseconds).
fn rfc3339(t: time::OffsetDateTime) -> String {
    let t = t.replace_millisecond(t.millisecond()).unwrap_or(t);
    t.format(&time::format_description::well_known::Rfc3339).unwrap_or_default()
}

fn paths(p: &[PathBuf]) -> Vec<String> {
    p.iter().map(|p| p.to_string_lossy().into_owned()).collect()
}

/// The files a command line names as outputs (`-o`, `--register-link-binaries`),
/// resolved against `cwd`.
pub fn named_outputs(args: &[String], cwd: &Path) -> Vec<PathBuf> {
    nvlinkd_core::cli::written_files(args)
        .into_iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(_, v)| cwd.join(v))
        .collect()
}

fn round(ms: f64) -> f64 {
    (ms * 1000.0).round() / 1000.0
}

/// The core's events about a link, as lines of the stream: `phase_started`,
/// `phase_finished`, `link_queued`, `link_admitted`, `verify_mismatch`.
impl Observer for Hub {
    fn event(&self, e: &LinkEvent) {
        // Running phases are tracked for `phase_progress` whoever listens
        // (a subscriber may come while a long phase runs).
        match e {
            LinkEvent::PhaseStarted { link, phase } => {
                let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
                running.entry((*link, *phase)).or_insert((0, Instant::now())).0 += 1;
            }
            LinkEvent::PhaseFinished { link, phase, .. } => {
                let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(r) = running.get_mut(&(*link, *phase)) {
                    r.0 = r.0.saturating_sub(1);
                    if r.0 == 0 {
                        running.remove(&(*link, *phase));
                    }
                }
            }
            _ => {}
        }
        if self.tx.receiver_count() == 0 {
            return;
        }
        let (link, body) = match e {
            LinkEvent::PhaseStarted { link, phase } => {
                (link, Body::PhaseStarted(pb::PhaseStarted { phase: phase.name().to_owned() }))
            }
            LinkEvent::PhaseFinished { link, phase, cached, aborted, ms } => (
                link,
                Body::PhaseFinished(pb::PhaseFinished {
                    phase: phase.name().to_owned(),
                    cached: *cached,
                    aborted: *aborted,
                    ms: round(*ms),
                }),
            ),
            LinkEvent::Queued { link, priority } => {
                (link, Body::LinkQueued(pb::LinkQueued { priority: priority.name().to_owned() }))
            }
            LinkEvent::Admitted { link, priority, waited_ms } => (
                link,
                Body::LinkAdmitted(pb::LinkAdmitted {
                    priority: priority.name().to_owned(),
                    waited_ms: round(*waited_ms),
                }),
            ),
            LinkEvent::VerifyMismatch { link, bundle, differences } => (
                link,
                Body::VerifyMismatch(pb::VerifyMismatch {
                    bundle: bundle.as_deref().unwrap_or(Path::new("-")).display().to_string(),
                    differences: differences.join("; "),
                }),
            ),
        };
        self.publish(*link, body);
    }
}

/// The `lagged` event: a subscriber fell behind and `missed` events.
pub fn lagged(missed: u64) -> Event {
    Event::new(0, Body::Lagged(pb::Lagged { missed }), None)
}

/// The diagnostics of an output, as `diagnostic` events' fields (for `nvlinkd
/// watch`'s lines).
pub fn diagnostic_fields(stdout: &[u8], stderr: &[u8], cwd: Option<&Path>, args: &[String]) -> Vec<Value> {
    diagnostics::of_output(stdout, stderr)
        .into_iter()
        .enumerate()
        .map(|(i, mut d): (usize, Diagnostic)| {
            let lines = i < diagnostics::SOURCE_LINE_LOOKUPS;
            if let (Some(cwd), true) = (cwd, lines) {
                d.locate_lto(cwd, args);
            }
            fields_of(&Body::Diagnostic(d.event(cwd, lines)))
        })
        .collect()
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
    use serde_json::json;

    /// Every kind of event (`docs/events.md` has a row for each).
    const KINDS: &[&str] = &[
        "link_started",
        "link_queued",
        "link_admitted",
        "phase_started",
        "phase_progress",
        "phase_finished",
        "diagnostic",
        "link_finished",
        "link_cancelled",
        "verify_mismatch",
        "lagged",
    ];

    fn next(rx: &mut broadcast::Receiver<Event>) -> Value {
        serde_json::from_str(&rx.try_recv().expect("an event").json).unwrap()
    }

    /// Every event has the envelope: its kind, the schema's version, a time
    /// (RFC 3339, UTC) and its link.
    #[tokio::test]
    async fn every_event_has_kind_schema_time_and_link() {
        let hub = Hub::default();
        let mut rx = hub.subscribe();
        let args = ["-o".to_owned(), "x".to_owned()];
        hub.started(Started {
            link: 7,
            cwd: Path::new("/w"),
            args: &args,
            priority: "background",
            origin: "speculative",
            cancel: None,
        });
        hub.cancelled(7, Stopped::Superseded, Some(9));
        let v = next(&mut rx);
        assert_eq!(
            (v["event"].as_str(), v["schema"].as_u64(), v["link"].as_u64()),
            (Some("link_started"), Some(1), Some(7))
        );
        let t = v["time"].as_str().unwrap();
        assert!(time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339).is_ok(), "{t}");
        assert!(t.ends_with('Z'), "{t}");
        assert_eq!(v["args"][1], "x");
        assert_eq!(v["speculative"], true);
        assert_eq!(v["outputs"], json!(["/w/x"]));
        assert_eq!(v["args_truncated"], false);
        let v = next(&mut rx);
        assert_eq!((v["event"].as_str(), v["reason"].as_str()), (Some("link_cancelled"), Some("superseded")));
        assert_eq!((v["superseded_by"].as_u64(), v["cwd"].as_str()), (Some(9), Some("/w")));
        assert_eq!(v["outputs"], json!(["/w/x"]));
        let v: Value = serde_json::from_str(&lagged(3).json).unwrap();
        assert_eq!((v["event"].as_str(), v["link"].as_u64(), v["missed"].as_u64()), (Some("lagged"), Some(0), Some(3)));
    }

    /// The core's typed events become the lines the module docs name, with
    /// exactly those fields besides the envelope.
    #[tokio::test]
    async fn link_events_are_the_documented_lines() {
        use nvlinkd_core::sched::Priority;
        let hub = Hub::default();
        let mut rx = hub.subscribe();
        hub.event(&LinkEvent::PhaseStarted { link: 3, phase: Phase::JitLink });
        hub.event(&LinkEvent::PhaseFinished {
            link: 3,
            phase: Phase::JitLink,
            cached: false,
            aborted: false,
            ms: 1.234_56,
        });
        hub.event(&LinkEvent::PhaseFinished { link: 3, phase: Phase::Nvvm, cached: true, aborted: true, ms: 0.5 });
        hub.event(&LinkEvent::Queued { link: 3, priority: Priority::Background });
        hub.event(&LinkEvent::Admitted { link: 3, priority: Priority::Foreground, waited_ms: 2.000_4 });
        let differences = vec!["stdout".to_owned(), "/o/a.cubin: 9 bytes, nvlink's 8".to_owned()];
        hub.event(&LinkEvent::VerifyMismatch { link: 3, bundle: Some("/c/verify/ab-1-0".into()), differences });
        hub.event(&LinkEvent::VerifyMismatch { link: 3, bundle: None, differences: vec!["stderr".to_owned()] });
        let want = [
            json!({ "event": "phase_started", "phase": "jitlink" }),
            json!({ "event": "phase_finished", "phase": "jitlink", "cached": false, "aborted": false, "ms": 1.235 }),
            json!({ "event": "phase_finished", "phase": "nvvm", "cached": true, "aborted": true, "ms": 0.5 }),
            json!({ "event": "link_queued", "priority": "background" }),
            json!({ "event": "link_admitted", "priority": "foreground", "waited_ms": 2.0 }),
            json!({ "event": "verify_mismatch", "bundle": "/c/verify/ab-1-0", "differences": "stdout; /o/a.cubin: 9 bytes, nvlink's 8" }),
            json!({ "event": "verify_mismatch", "bundle": "-", "differences": "stderr" }),
        ];
        for w in want {
            let got = rx.try_recv().unwrap();
            assert_eq!((got.link, got.kind), (3, w["event"].as_str().unwrap()));
            let mut v: Value = serde_json::from_str(&got.json).unwrap();
            let o = v.as_object_mut().unwrap();
            assert_eq!((o.remove("schema"), o.remove("link")), (Some(json!(SCHEMA)), Some(json!(3))));
            assert!(o.remove("time").is_some());
            assert_eq!(v, w);
        }
    }

    /// A finished link's diagnostics come before `link_finished`, each with
    /// its fields; `link_finished` names the cwd and the outputs.
    #[tokio::test]
    async fn a_finished_link_tells_its_diagnostics_then_its_end() {
        let hub = Hub::default();
        let mut rx = hub.subscribe();
        let args = ["--arch=sm_90".to_owned(), "a.o".to_owned(), "-o".to_owned(), "out.cubin".to_owned()];
        hub.started(Started {
            link: 4,
            cwd: Path::new("/src"),
            args: &args,
            priority: "foreground",
            origin: "local",
            cancel: None,
        });
        let stderr = b"nvlink error   : Undefined reference to '_Z1fi' in 'a.o'\nnot a message\n";
        let f = Finished {
            exit_code: 255,
            ms: 3.0,
            engine: "in_process",
            fallback: None,
            stdout: b"",
            stderr,
            written: Some(Vec::new()),
        };
        hub.finished(4, f);
        next(&mut rx);
        let d = next(&mut rx);
        assert_eq!(
            (d["event"].as_str(), d["code"].as_str(), d["symbol"].as_str()),
            (Some("diagnostic"), Some("undefined_reference"), Some("_Z1fi"))
        );
        assert_eq!((d["symbol_demangled"].as_str(), d["object"].as_str()), (Some("f(int)"), Some("a.o")));
        let f = next(&mut rx);
        assert_eq!(
            (f["event"].as_str(), f["exit_code"].as_i64(), f["cwd"].as_str()),
            (Some("link_finished"), Some(255), Some("/src"))
        );
        assert_eq!(f["outputs"], json!([]));
        assert!(rx.try_recv().is_err());
        assert!(hub.meta(4).is_none(), "the link is forgotten");
    }

    /// A command line of megabytes is not kept whole by every event of a
    /// stuck reader's backlog; a remote link's objects are not resolved on
    /// this machine.
    #[tokio::test]
    async fn events_bound_arguments_and_resolve_only_local_files() {
        let hub = Hub::default();
        let mut rx = hub.subscribe();
        let args: Vec<String> = (0..1000).map(|i| format!("{i:0>200}.o")).collect();
        hub.started(Started {
            link: 8,
            cwd: Path::new("/"),
            args: &args,
            priority: "foreground",
            origin: "remote",
            cancel: None,
        });
        let v = next(&mut rx);
        assert_eq!(v["args_truncated"], true);
        let kept = v["args"].as_array().unwrap();
        assert!(!kept.is_empty() && kept.iter().map(|a| a.as_str().unwrap().len()).sum::<usize>() <= ARGS_MAX);
        // `/etc/hostname`-like: a file of this machine at the path a remote caller named.
        let stderr = b"nvlink error   : Undefined reference to 'f' in 'etc/passwd'\n";
        let f =
            Finished { exit_code: 255, ms: 1.0, engine: "nvlink", fallback: None, stdout: b"", stderr, written: None };
        hub.finished(8, f);
        let d = next(&mut rx);
        assert_eq!(d["object"], "etc/passwd");
        assert!(d.get("object_path").is_none(), "{d}");
    }

    /// Filters: by directory (the link's cwd at or below it), by output, and
    /// without speculative links; `lagged` passes every filter.
    #[test]
    fn filters_select_links_by_directory_output_and_kind() {
        let hub = Hub::default();
        let _rx = hub.subscribe();
        let mut rx = hub.subscribe();
        let (a, b) = (["-o".to_owned(), "a.cubin".to_owned()], ["-o".to_owned(), "b.cubin".to_owned()]);
        hub.started(Started {
            link: 1,
            cwd: Path::new("/p/app"),
            args: &a,
            priority: "foreground",
            origin: "local",
            cancel: None,
        });
        hub.started(Started {
            link: 2,
            cwd: Path::new("/q"),
            args: &b,
            priority: "background",
            origin: "speculative",
            cancel: None,
        });
        let (one, two) = (rx.try_recv().unwrap(), rx.try_recv().unwrap());
        let by_cwd = Filter { cwd: Some("/p".into()), ..Default::default() };
        assert!(by_cwd.admits(&one) && !by_cwd.admits(&two));
        let by_prefix_only = Filter { cwd: Some("/p/ap".into()), ..Default::default() };
        assert!(!by_prefix_only.admits(&one), "a directory, not a string prefix");
        let by_output = Filter { output: Some("/q/b.cubin".into()), ..Default::default() };
        assert!(!by_output.admits(&one) && by_output.admits(&two));
        let relative = Filter { cwd: Some("/p/app".into()), output: Some("a.cubin".into()), ..Default::default() };
        assert!(relative.admits(&one));
        let no_spec = Filter { no_speculative: true, ..Default::default() };
        assert!(no_spec.admits(&one) && !no_spec.admits(&two));
        let lagged = lagged(1);
        assert!(by_cwd.admits(&lagged) && by_output.admits(&lagged) && no_spec.admits(&lagged));
    }

    /// A phase running past the period is reported with `phase_progress`
    /// until it ends; a link cancelled by its id stops.
    #[tokio::test]
    async fn long_phases_report_progress_and_links_cancel_by_id() {
        let hub = Hub::default();
        let mut rx = hub.subscribe();
        let cancel = Cancel::new();
        let args = ["-o".to_owned(), "x".to_owned()];
        hub.started(Started {
            link: 5,
            cwd: Path::new("/w"),
            args: &args,
            priority: "foreground",
            origin: "local",
            cancel: Some(cancel.clone()),
        });
        next(&mut rx);
        hub.event(&LinkEvent::PhaseStarted { link: 5, phase: Phase::Ptxas });
        next(&mut rx);
        hub.progress(Duration::ZERO);
        let p = next(&mut rx);
        assert_eq!(
            (p["event"].as_str(), p["phase"].as_str(), p["running"].as_u64()),
            (Some("phase_progress"), Some("ptxas"), Some(1))
        );
        assert!(p["elapsed_ms"].as_u64().is_some());
        hub.event(&LinkEvent::PhaseFinished { link: 5, phase: Phase::Ptxas, cached: false, aborted: false, ms: 1.0 });
        next(&mut rx);
        hub.progress(Duration::ZERO);
        assert!(rx.try_recv().is_err(), "progress after the phase ended");
        assert!(!hub.cancel(6), "no such link");
        assert!(hub.cancel(5));
        assert_eq!(cancel.stopped(), Some(Stopped::Requested));
    }

    /// One body of every kind, every optional field set.
    fn every_kind() -> Vec<Body> {
        let some = || Some("x".to_owned());
        vec![
            Body::LinkStarted(Default::default()),
            Body::LinkQueued(Default::default()),
            Body::LinkAdmitted(Default::default()),
            Body::PhaseStarted(Default::default()),
            Body::PhaseProgress(Default::default()),
            Body::PhaseFinished(Default::default()),
            Body::Diagnostic(pb::DiagnosticEvent {
                symbol: some(),
                symbol_demangled: some(),
                object: some(),
                object_path: some(),
                member: some(),
                first_defined: some(),
                source_file: some(),
                line: Some(1),
                ..Default::default()
            }),
            Body::LinkFinished(Default::default()),
            Body::LinkCancelled(Default::default()),
            Body::VerifyMismatch(Default::default()),
            Body::Lagged(Default::default()),
        ]
    }

    /// One schema: the reference page has a row for every kind of the
    /// proto's `Event.body`, naming each of its fields (the JSON view is the
    /// message serialised); the typed event and its JSON line agree.
    #[test]
    fn docs_events_md_lists_every_kind_and_field() {
        let doc = include_str!("../../../docs/events.md");
        let bodies = every_kind();
        assert_eq!(bodies.len(), KINDS.len());
        for body in bodies {
            let kind = kind_of(&body);
            assert!(KINDS.contains(&kind), "{kind} is not in KINDS");
            let row_at =
                doc.find(&format!("| `{kind}` |")).unwrap_or_else(|| panic!("docs/events.md: no row for {kind}"));
            let row = &doc[row_at..doc[row_at..].find('\n').map_or(doc.len(), |e| row_at + e)];
            let Value::Object(fields) = fields_of(&body) else { panic!("{kind}: not an object") };
            for field in fields.keys() {
                let documented = row.contains(&format!("`{field}`"))
                    || (kind == "diagnostic" && doc.contains(&format!("`{field}`")));
                assert!(documented, "docs/events.md does not name {kind}'s field {field}");
            }
            let ev = Event::new(3, body.clone(), None);
            let line: Value = serde_json::from_str(&ev.json).unwrap();
            assert_eq!(line["event"], kind);
            let typed = ev.to_proto();
            assert_eq!((typed.kind.as_str(), typed.link, typed.schema), (kind, 3, SCHEMA));
            assert_eq!(typed.body.as_ref(), Some(&body));
            let t = time::OffsetDateTime::parse(
                line["time"].as_str().unwrap(),
                &time::format_description::well_known::Rfc3339,
            )
            .unwrap();
            assert_eq!((t.unix_timestamp_nanos() / 1_000_000) as i64, typed.time_unix_ms, "two times for one event");
        }
        assert!(doc.contains(&format!("(schema {SCHEMA})")), "docs/events.md is not of schema {SCHEMA}");
    }

    #[test]
    fn outputs_are_the_files_the_command_line_names() {
        let args: Vec<String> =
            ["-oa.cubin", "--register-link-binaries=r.c", "x.o", "--output-file", "/abs/b"].map(String::from).to_vec();
        assert_eq!(
            named_outputs(&args, Path::new("/w")),
            [PathBuf::from("/w/a.cubin"), "/w/r.c".into(), "/abs/b".into()]
        );
        let args: Vec<String> = ["-optf", "opts"].map(String::from).to_vec();
        assert!(named_outputs(&args, Path::new("/w")).is_empty());
    }
}
