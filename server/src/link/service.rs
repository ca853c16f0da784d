//! The gRPC service: a thin async shell around `nvlinkd_core::Linker`.
//!
//! `Link` reads the `Start` message, runs the link on a blocking thread with a
//! [`LinkFs`] (the caller's files, read here or over the same stream), and sends
//! the result back. A remote link first takes a slot (`admission.rs`; none
//! free in time: `RESOURCE_EXHAUSTED`) and waits for the blobs it lacks, both
//! on the runtime: a shim that never sends them holds no thread. A panic or
//! error inside one link becomes that link's failure (the shim then falls back
//! to the real nvlink); the daemon keeps serving. The stream owns its link:
//! see `stream_fs.rs` for how a closed stream ends it.
//!
//! Trust: a caller on the unix socket (mode 0600: this user) may administer
//! the daemon; a caller on the TCP listener is authenticated (bearer token,
//! see `daemon::Auth`; client certificates are checked by TLS before any call)
//! and may only link, read the stats and ping (without the pid or the cache
//! directory). Nothing a caller sends is used as a path here unless it shares
//! this filesystem over the unix socket: the toolkit is chosen by release among
//! the daemon's own (`--cuda-home`), and a remote link's files come over its
//! stream. Every message is bounded (`MAX_MESSAGE_BYTES`); output files go back
//! in `CHUNK_BYTES` pieces.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nvlinkd_core::declined::Reason;
use nvlinkd_core::fs::InputFs;
use nvlinkd_core::request::{EngineKind, Outcome, Request as LinkRequest};
use nvlinkd_core::sched::Priority;
use nvlinkd_core::worker::{Cancel, Stopped};
use nvlinkd_core::Linker;
use nvlinkd_proto::v1::{
    client_message, nvlinkd_server::Nvlinkd, server_message, CancelReply, CancelRequest, ClientMessage, Event,
    EventsRequest, LinkResult, OutputFile, PingReply, PingRequest, Progress, Recipe, RecipesReply, RecipesRequest,
    ServerMessage, ShutdownReply, ShutdownRequest, Start, StatsReply, StatsRequest, WatchEvent,
};
use tokio::sync::{mpsc, watch};
use tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};
use tracing::{debug, info, warn};

use crate::blobs::BlobStore;
use crate::link::admission::{Caller, RemoteLinks};
use crate::link::stream_fs::{LinkChannel, LinkFs, Outbound, ReplyMemory};
use crate::net::incoming::{Call, Connection};
use crate::observe::events::Hub;
use crate::speculate::watch::{Subscriber, Watcher};
use crate::speculate::Speculator;

/// Limits every link is held to.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// How long the daemon waits for the shim: its `Start`, each file reply, room
    /// in the stream for a request. Past it the shim counts as gone.
    pub reply_timeout: Duration,
    /// Most input bytes one link may read; past it the link is declined (the
    /// shim runs the real nvlink).
    pub max_link_input: u64,
    /// Most bytes of shims' file replies held at once, all links together
    /// (`stream_fs::ReplyMemory`); past it a link is declined.
    pub max_reply_memory: u64,
    /// Bytes of remote shims' input files kept in memory and on disk (`blobs.rs`).
    pub blob_mem: u64,
    pub blob_size: u64,
}

/// Links in flight and when the last one arrived, for `--idle-exit`. Only links
/// count: `status` and `stats` observe the daemon without keeping it alive.
#[derive(Debug)]
pub struct Activity {
    links: AtomicUsize,
    last: Mutex<Instant>,
}

impl Default for Activity {
    fn default() -> Self {
        Activity { links: AtomicUsize::new(0), last: Mutex::new(Instant::now()) }
    }
}

impl Activity {
    fn begin(self: &Arc<Self>) -> ActiveLink {
        self.links.fetch_add(1, Ordering::SeqCst);
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
        ActiveLink(self.clone())
    }

    /// How long the daemon has been idle (no link in flight); zero while one is.
    pub fn idle_for(&self) -> Duration {
        if self.links.load(Ordering::SeqCst) > 0 {
            return Duration::ZERO;
        }
        self.last.lock().unwrap_or_else(|p| p.into_inner()).elapsed()
    }
}

/// One link in flight, from its stream's arrival until its thread is done.
pub struct ActiveLink(Arc<Activity>);

impl Drop for ActiveLink {
    fn drop(&mut self) {
        *self.0.last.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
        self.0.links.fetch_sub(1, Ordering::SeqCst);
    }
}

#[derive(Clone)]
pub struct Service {
    pub linker: Arc<Linker>,
    /// Speculative links: other archs of multi-arch steps (`speculate.rs`).
    pub speculator: Arc<Speculator>,
    /// Recipes of recent links, relinked when their inputs change (`speculate/watch.rs`).
    pub watcher: Arc<Watcher>,
    /// Whether this listener is the local unix socket (the caller shares our filesystem).
    pub local: bool,
    /// Bearer tokens required of callers (the remote listener with `--token-file`).
    pub auth: Option<Arc<crate::net::auth::Auth>>,
    /// Calls refused for a missing or wrong token (`auth_failures` in the stats).
    pub auth_failures: Arc<AtomicU64>,
    pub shutdown: watch::Sender<bool>,
    pub cache_dir: PathBuf,
    pub limits: Limits,
    pub activity: Arc<Activity>,
    /// Test hook (`NVLINKD_TEST_SLOW_LINK_MS`): every link first sleeps this
    /// long, so tests can kill or stop the daemon while a link is in flight.
    pub slow_link_ms: u64,
    /// The event stream (`events.rs`).
    pub events: Hub,
    /// Remote shims' input files by digest, shared by the listeners (`blobs.rs`).
    pub blobs: Arc<BlobStore>,
    /// Outputs written here for local shims (`staging.rs`).
    pub staged: Arc<crate::link::staging::Counters>,
    /// The TCP listener's connections (`incoming.rs`).
    pub connections: Arc<crate::net::incoming::Counters>,
    /// Slots of remote links (`admission.rs`), taken by the links of the TCP
    /// listener only: a link on the unix socket never waits for one.
    pub remote_links: Arc<RemoteLinks>,
    /// The listener requires client certificates (`--client-ca`): each one
    /// is a caller of its own for the slots.
    pub client_certificates: bool,
    /// Bytes of shims' file replies held, shared by every link of both
    /// listeners (`--max-reply-memory`, `stream_fs.rs`).
    pub reply_memory: Arc<ReplyMemory>,
    /// The remote listener's tokens, for their figures in the stats of
    /// either listener (`auth` is this listener's own).
    pub tokens: Option<Arc<crate::net::auth::Auth>>,
    /// Remote links by client certificate subject, for callers without a
    /// token (stats and metrics).
    pub certificates: Arc<crate::net::auth::CertificateFigures>,
    /// Refused calls (another user on the unix socket, administration over
    /// TCP) are logged at most once per `LOG_EVERY`, with the count held back:
    /// a caller refused on purpose, thousands of times a second, cannot fill
    /// the log.
    pub refusal_log: Arc<crate::net::incoming::LogLimit>,
}

/// Who a remote link is: for its slot, its audit line and its token's figures.
struct RemoteCaller {
    /// Whom its slot counts against (`admission.rs`).
    caller: Option<Caller>,
    /// The peer's address.
    peer: String,
    /// The name of its token (`--token-file`).
    token: Option<Arc<str>>,
    /// The subject of its client certificate (`--client-ca`), control
    /// characters escaped.
    subject: Option<String>,
}

/// The credentials of a call's peer on the unix socket.
fn local_peer<T>(request: &Request<T>) -> Option<tokio::net::unix::UCred> {
    request.extensions().get::<crate::net::local::LocalConnectInfo>().and_then(|i| i.uds.peer_cred)
}

/// The subject of a DER certificate (`CN=…, O=…`), as a log may show it.
fn subject(der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    Some(nvlinkd_core::link::args_summary(&[cert.subject().to_string()]))
}

type LinkStream = Pin<Box<dyn Stream<Item = Result<ServerMessage, Status>> + Send>>;
type EventStream = Pin<Box<dyn Stream<Item = Result<Event, Status>> + Send>>;
type WatchStream = Pin<Box<dyn Stream<Item = Result<WatchEvent, Status>> + Send>>;

impl Service {
    /// The link a `Start` asks for. It shares this daemon's filesystem only
    /// over the local socket, when the shim's cwd is the same directory here
    /// and its mount namespace and root are this daemon's (a shim with a
    /// private /tmp sees other files under the same paths: it serves them).
    fn link_request(&self, start: &Start) -> LinkRequest {
        static OWN_VIEW: std::sync::OnceLock<[u64; 4]> = std::sync::OnceLock::new();
        let cwd = PathBuf::from(&start.cwd);
        let view = [start.mnt_ns_dev, start.mnt_ns_ino, start.root_dev, start.root_ino];
        let same_view = view == [0; 4] || view == *OWN_VIEW.get_or_init(nvlinkd_fs::fs_view);
        // The directory itself, opened once: the link reads (and nvlink runs)
        // through it, as nvlink does through its own, whatever is named `cwd`
        // meanwhile.
        let cwd_dir = (self.local && same_view)
            .then(|| open_dir(&cwd))
            .flatten()
            .filter(|(_, m)| m.dev() == start.cwd_dev && m.ino() == start.cwd_ino)
            .map(|(dir, _)| nvlinkd_core::request::CwdDir(Arc::new(dir)));
        let shared_fs = cwd_dir.is_some();
        // Without `/proc` the link goes by the directory's name.
        let cwd_dir = cwd_dir.filter(|d| d.reachable());
        LinkRequest {
            args: start.args.clone(),
            cwd,
            // Only what a link depends on: never a loader variable of the client's.
            env: nvlinkd_core::request::Request::link_env(start.env.clone()),
            toolkit: Some(start.toolkit_release.clone()).filter(|t| !t.is_empty()),
            shared_fs,
            caller: None,
            nvvm_stat: shared_fs || start.answers_nvvm_stat,
            speculative: false,
            remote: !self.local,
            cwd_dir,
        }
    }

    /// Read the Start message, run the link on a blocking thread (file reads
    /// go back to the shim over this stream), send the result.
    async fn serve_link(
        &self,
        mut inbound: Streaming<ClientMessage>,
        tx: Outbound,
        active: ActiveLink,
        same_user: bool,
        remote: Option<RemoteCaller>,
    ) -> Result<(), Status> {
        let mut shutdown = self.shutdown.subscribe();
        let first = tokio::select! {
            m = tokio::time::timeout(self.limits.reply_timeout, inbound.message()) => match m {
                Ok(m) => m?,
                Err(_) => return Err(Status::deadline_exceeded("no Start message")),
            },
            _ = shutdown.wait_for(|s| *s) => return Err(Status::unavailable("nvlinkd is shutting down")),
        };
        let start = match first.and_then(|m| m.msg) {
            Some(client_message::Msg::Start(s)) => s,
            _ => return Err(Status::invalid_argument("a link starts with a Start message")),
        };
        // Announcements are blobs and stats the daemon keeps for the link:
        // bounded, as the shim bounds them.
        if start.files.len() > nvlinkd_proto::MAX_ANNOUNCED_FILES {
            return Err(Status::resource_exhausted(format!(
                "{} files announced, more than the {} a link may announce",
                start.files.len(),
                nvlinkd_proto::MAX_ANNOUNCED_FILES
            )));
        }
        // A remote link's slot (`admission.rs`), waited for here, without a
        // thread; held until the link's thread is done. A shim that goes away
        // meanwhile leaves the queue.
        let slot = match &remote {
            Some(remote) => {
                let admit =
                    self.remote_links.admit(remote.caller, &remote.peer, nvlinkd_proto::codec::footprint(&start));
                tokio::pin!(admit);
                Some(loop {
                    tokio::select! {
                        slot = &mut admit => match slot {
                            Ok(slot) => break slot,
                            Err(refused) => {
                                if let (Some(auth), Some(name)) = (&self.auth, &remote.token) {
                                    auth.count_refused(name);
                                } else if let Some(subject) = &remote.subject {
                                    self.certificates.count_refused(subject);
                                }
                                return Err(refused);
                            }
                        },
                        m = inbound.message() => match m {
                            // Nothing was asked of the shim yet: nothing to take.
                            Ok(Some(_)) => continue,
                            Ok(None) | Err(_) => return Err(Status::cancelled("the shim went away")),
                        },
                        _ = shutdown.wait_for(|s| *s) => return Err(Status::unavailable("nvlinkd is shutting down")),
                    }
                })
            }
            None => None,
        };
        let mut req = self.link_request(&start);
        req.caller = remote.as_ref().and_then(|r| r.caller);
        // An unknown class is the default one: the shim forwards the variable as set.
        let priority = Priority::from_name(&start.priority).unwrap_or_default();
        let (link_id, span) = self.linker.link_span_with_id(&req);
        let events = self.events.clone();
        let cancel = Cancel::with_priority(priority);
        events.started(crate::observe::events::Started {
            link: link_id,
            cwd: &req.cwd,
            args: &req.args,
            priority: priority.name(),
            origin: if remote.is_some() { "remote" } else { "local" },
            // A remote link is its shim's alone to cancel (it goes away).
            cancel: remote.is_none().then(|| cancel.clone()),
        });
        if start.progress {
            forward_progress(&events, link_id, tx.clone());
        }

        // The other archs of a multi-arch nvcc step, linked alongside this one.
        self.speculator.on_link(&req);

        let channel = LinkChannel::new(
            tx,
            tokio::runtime::Handle::current(),
            self.limits.reply_timeout,
            self.limits.max_link_input,
            self.reply_memory.clone(),
        );
        // The stream owns the link: when the shim half-closes or goes away, the
        // channel closes and the link's reads fail at once. (A stop does not close
        // it: the link may finish within the grace period, then the process exits.)
        let reader = channel.clone();
        // ... and its computation: a closed stream kills the worker process or
        // nvlink engine serving the link (nothing of it is cached).
        let cancel_on_close = cancel.clone();
        // Outputs written here for the shim to rename (`staging.rs`); what it
        // leaves is removed once its stream ends.
        let staging = (self.local && same_user && start.accepts_staged && req.shared_fs)
            .then(|| Arc::new(crate::link::staging::Staging::of(&req)));
        let cleanup = staging.clone();
        let reply_timeout = self.limits.reply_timeout;
        tokio::spawn(async move {
            let why = loop {
                tokio::select! {
                    m = inbound.message() => match m {
                        Ok(Some(msg)) => {
                            if let Some(client_message::Msg::File(reply)) = msg.msg {
                                reader.deliver(reply);
                            }
                        }
                        Ok(None) => break "the shim closed its side of the stream",
                        Err(_) => break "the shim went away",
                    },
                    _ = reader.wait_closed() => break "the link is done",
                }
            };
            if why != "the link is done" {
                cancel_on_close.cancel();
            }
            reader.close(why);
            drop(reader);
            if let Some(staging) = cleanup {
                // The shim renames staged outputs before it ends its side of
                // the stream (a shim that never does is given up on after the
                // reply timeout).
                if why == "the link is done" {
                    let _ = tokio::time::timeout(reply_timeout, async {
                        while let Ok(Some(_)) = inbound.message().await {}
                    })
                    .await;
                }
                tokio::task::spawn_blocking(move || staging.finish());
            }
        });

        // What a remote shim announced: stats and contents (by digest) of its files.
        let announced =
            if req.shared_fs { Default::default() } else { crate::link::stream_fs::announced(&start.files) };
        let blobs = self.blobs.clone();
        let linker = self.linker.clone();
        let watcher = self.watcher.clone();
        let slow = self.slow_link_ms;
        let staged = self.staged.clone();
        let budget = self.limits.max_link_input;
        let auth = self.auth.clone();
        let certificates = self.certificates.clone();
        // A daemon on the caller's filesystem reads the files itself: no copies
        // through the stream. The announced blobs the store lacks are waited
        // for here, before the link takes a thread (a shim that never sends
        // them holds none).
        let fs = LinkFs::new(channel.clone(), &req, budget).with_contents(linker.contents().clone());
        let fs = if announced.is_empty() {
            fs
        } else {
            let named = crate::link::stream_fs::Named::of(&req.args, &req.cwd);
            fs.with_announced(announced, &named, blobs.clone(), req.caller.unwrap_or_default()).await
        };
        tokio::task::spawn_blocking(move || {
            let _active = active;
            let _slot = slot;
            // Every line of this link, the daemon's own included, carries its id.
            let _entered = span.enter();
            let _in_flight = linker.in_flight_guard();
            if slow > 0 {
                std::thread::sleep(std::time::Duration::from_millis(slow));
            }
            let args = nvlinkd_core::link::args_summary(&req.args);
            let t_link = std::time::Instant::now();
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                linker.link_cancellable(link_id, &req, &fs, &cancel)
            }));
            // Nothing is registered on this stream from now on.
            let gone = channel.closed_reason();
            channel.close("the link is done");
            if outcome.as_ref().is_ok_and(|o| o.fallback.is_none()) {
                // With --watch: relinked in the background when an input changes.
                watcher.remember(&req);
            }
            // Why a link went to the real nvlink or back to its shim (the log's `reason`).
            let reason;
            let mut routed: Option<String> = None;
            let (engine, cache) = match &outcome {
                Ok(o) if o.fallback.is_some() => ("fallback", "none"),
                Ok(o) => match o.engine {
                    EngineKind::Cache => ("cache", "hit"),
                    EngineKind::InProcess => ("in_process", "miss"),
                    EngineKind::NvlinkProcess => ("nvlink", "miss"),
                    EngineKind::Frontend => ("frontend", "none"),
                },
                Err(_) => ("fallback", "none"),
            };
            let ms = t_link.elapsed().as_secs_f64() * 1e3;
            let stopped = cancel.stopped().filter(|_| outcome.as_ref().is_ok_and(|o| o.fallback.is_some()));
            // Bytes of output files sent in pieces ahead of the result (metrics).
            let mut output_bytes = 0usize;
            // The shim went away while its outputs were sent: no result to send.
            let mut unsent = false;
            let result = match outcome {
                // Superseded by a newer link of the same output: the shim says so
                // and fails; it does not run nvlink (the newer link is the one wanted).
                Ok(_) if stopped == Some(Stopped::Superseded) => {
                    reason = "superseded";
                    let by = cancel.superseded_by();
                    info!(args = %args, ms, by, "link superseded by a newer link of the same output");
                    events.cancelled(link_id, Stopped::Superseded, by);
                    superseded(&req.args)
                }
                Ok(_) if stopped == Some(Stopped::Requested) => {
                    reason = "cancelled";
                    info!(args = %args, ms, "link cancelled by request");
                    events.cancelled(link_id, Stopped::Requested, None);
                    cancelled_by_request(&req.args)
                }
                Ok(o) if stopped == Some(Stopped::Cancelled) => {
                    reason = "cancelled";
                    info!(args = %args, ms, "link cancelled: its caller went away");
                    events.cancelled(link_id, Stopped::Cancelled, None);
                    fallback(o.fallback.map(|d| d.detail).unwrap_or_default())
                }
                Ok(o) => {
                    // The files the shim writes: what the outcome carries.
                    let written = (o.fallback.is_none() && fs.declined().is_none())
                        .then(|| o.outputs.iter().map(|f| req.cwd.join(&f.path)).collect());
                    events.finished(
                        link_id,
                        crate::observe::events::Finished {
                            exit_code: o.exit_code,
                            ms,
                            engine: crate::observe::events::engine_name(o.engine),
                            fallback: o.fallback.as_ref().map(|d| d.detail.as_str()),
                            stdout: &o.stdout,
                            stderr: &o.stderr,
                            written,
                        },
                    );
                    reason = o.fallback.as_ref().or(o.routed.as_ref()).map_or("-", |d| d.reason.name());
                    routed = o.routed.as_ref().map(|d| d.detail.clone());
                    // A remote link's line comes once its answer is sent (below).
                    if remote.is_none() {
                        info!(
                            args = %args,
                            exit = o.exit_code,
                            engine = ?o.engine,
                            fallback = ?o.fallback.as_ref().map(|d| &d.detail),
                            routed = ?o.routed.as_ref().map(|d| &d.detail),
                            reason,
                            ms = t_link.elapsed().as_secs_f64() * 1e3,
                            "link done"
                        );
                    }
                    match fs.declined() {
                        // An input only nvlink may read, or past the budget: whatever
                        // the link made of the failed read is not nvlink's answer.
                        // Past the budget, the user may want a larger one.
                        Some(why) if fs.past_budget() => fixable(fallback(why), "budget"),
                        Some(why) => fallback(why),
                        // Messages travel whole in the result, which is bounded.
                        None if o.stdout.len() + o.stderr.len() > MAX_TEXT => {
                            fallback("nvlink's messages are too long to send".into())
                        }
                        None => {
                            // Output files first, in bounded pieces; the result closes the link.
                            for f in &o.outputs {
                                match send_output(&channel, f, staging.as_deref(), &staged) {
                                    Some(bytes) => output_bytes += bytes,
                                    None => {
                                        unsent = true;
                                        break;
                                    }
                                }
                            }
                            let no_toolkit = o.fallback.as_ref().is_some_and(|d| d.reason == Reason::NoToolkit);
                            let result = LinkResult {
                                exit_code: o.exit_code,
                                stdout: o.stdout,
                                stderr: o.stderr,
                                outputs: Vec::new(),
                                fallback: o.fallback.is_some(),
                                fallback_reason: o.fallback.map(|d| d.detail).unwrap_or_default(),
                                fwrite_output: o
                                    .fwrite_output
                                    .map(|p| p.to_string_lossy().into_owned())
                                    .unwrap_or_default(),
                                ..Default::default()
                            };
                            // The caller's nvlink is of a release this daemon has no toolkit for.
                            if no_toolkit {
                                fixable(result, "toolkit")
                            } else {
                                result
                            }
                        }
                    }
                }
                Err(_) => {
                    reason = "panic";
                    events.finished(
                        link_id,
                        crate::observe::events::Finished {
                            exit_code: 0,
                            ms,
                            engine: "none",
                            fallback: Some("internal error in nvlinkd"),
                            stdout: b"",
                            stderr: b"",
                            written: Some(Vec::new()),
                        },
                    );
                    warn!(args = %args, "link panicked; asking the shim to fall back");
                    linker.note_failure();
                    fallback("internal error in nvlinkd".into())
                }
            };
            if let Some(why) = gone {
                debug!(args = %args, why, "stream closed during the link");
            }
            let sent = output_bytes
                + result.stdout.len()
                + result.stderr.len()
                + result.outputs.iter().map(|f| f.data.len()).sum::<usize>();
            let (engine, cache) = if result.fallback { ("fallback", "none") } else { (engine, cache) };
            let received = fs.bytes_received();
            if !unsent {
                blobs.input_bytes_received.fetch_add(received, Ordering::Relaxed);
                crate::observe::metrics::record_link(engine, cache, t_link.elapsed(), received, sent as u64);
            }
            let (exit, fallback) = (result.exit_code, result.fallback.then(|| result.fallback_reason.clone()));
            let mut result = result;
            if remote.is_some() {
                // A remote caller learns why, not where the daemon keeps things.
                let said: Vec<&str> = req
                    .args
                    .iter()
                    .map(String::as_str)
                    .chain(req.cwd.to_str())
                    .chain(req.env.values().map(String::as_str))
                    .collect();
                result.fallback_reason = linker.redact(&result.fallback_reason, &said);
            }
            // A shim that half-closed may still read the answer; one that is gone
            // or stopped reading is given up after the reply timeout.
            let answered = !unsent
                && channel.send(ServerMessage { msg: Some(server_message::Msg::Result(result)) }, false).is_ok();
            if let Some(remote) = &remote {
                // The audit line: who, from where, what, and how it went (the
                // token's name, never its secret).
                info!(
                    peer = %remote.peer,
                    token = %remote.token.as_deref().unwrap_or("-"),
                    subject = remote.subject.as_deref().unwrap_or("-"),
                    args = %args,
                    exit,
                    engine = %engine,
                    cache = %cache,
                    reason = %reason,
                    fallback = ?fallback,
                    routed = ?routed,
                    received,
                    sent,
                    answered,
                    ms,
                    "remote link done"
                );
                if let (Some(auth), Some(name)) = (&auth, &remote.token) {
                    auth.count_link(name, received, sent as u64);
                } else if let Some(subject) = &remote.subject {
                    certificates.count_link(subject, received, sent as u64);
                }
            }
        });
        Ok(())
    }
}

/// Most bytes of stdout and stderr together in a result (the rest of the
/// message bound is left for its framing).
const MAX_TEXT: usize = nvlinkd_proto::MAX_MESSAGE_BYTES / 2;

/// Send one output file in `CHUNK_BYTES` pieces (one empty piece for an empty
/// file), or staged beside it for a local shim (`staging.rs`). The bytes sent
/// in messages (0 for a staged file); None when the shim is gone.
fn send_output(
    channel: &LinkChannel,
    f: &nvlinkd_core::request::OutputFile,
    staging: Option<&crate::link::staging::Staging>,
    counters: &crate::link::staging::Counters,
) -> Option<usize> {
    let path = f.path.to_string_lossy().into_owned();
    if let Some(staged) = staging.filter(|_| !f.append).and_then(|st| st.stage(&f.path, &f.data, counters)) {
        let msg = OutputFile {
            path,
            staged: staged.path.to_string_lossy().into_owned(),
            staged_dev: staged.dev,
            staged_ino: staged.ino,
            staged_size: staged.size,
            ..Default::default()
        };
        return channel.send(ServerMessage { msg: Some(server_message::Msg::Output(msg)) }, false).ok().map(|_| 0);
    }
    // Pieces are slices of the one output (no copy until the message is encoded).
    for (data, more) in nvlinkd_proto::pieces(&f.data) {
        let msg = OutputFile { path: path.clone(), data, append: f.append, more, ..Default::default() };
        if channel.send(ServerMessage { msg: Some(server_message::Msg::Output(msg)) }, false).is_err() {
            return None;
        }
    }
    Some(f.data.len())
}

/// The answer of an outcome as the shim (or `nvlinkd watch`) receives it.
fn link_result(o: &Outcome) -> LinkResult {
    LinkResult {
        exit_code: o.exit_code,
        stdout: o.stdout.clone(),
        stderr: o.stderr.clone(),
        outputs: o
            .outputs
            .iter()
            .map(|f| OutputFile {
                path: f.path.to_string_lossy().into_owned(),
                data: f.data.clone(),
                append: f.append,
                more: false,
                ..Default::default()
            })
            .collect(),
        fallback: o.fallback.is_some(),
        fallback_reason: o.fallback.as_ref().map(|d| d.detail.clone()).unwrap_or_default(),
        fwrite_output: o.fwrite_output.as_ref().map(|p| p.to_string_lossy().into_owned()).unwrap_or_default(),
        ..Default::default()
    }
}

/// A response stream that keeps its connection's call open (`incoming.rs`)
/// until it ends or is dropped.
struct WithCall<S> {
    inner: S,
    _call: Option<Call>,
}

impl<S: Stream + Unpin> Stream for WithCall<S> {
    type Item = S::Item;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Option<S::Item>> {
        Pin::new(&mut self.inner).poll_next(cx)
    }
}

/// `dir` opened (`O_PATH`: no read permission needed, nothing followed past
/// it) with its metadata; None when it is no directory here.
fn open_dir(dir: &Path) -> Option<(std::os::fd::OwnedFd, std::fs::Metadata)> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(dir)
        .ok()?;
    let m = f.metadata().ok()?;
    Some((f.into(), m))
}

fn fallback(reason: String) -> LinkResult {
    LinkResult { fallback: true, fallback_reason: reason, ..Default::default() }
}

/// A fallback the user can fix (`LinkResult.fixable`: `toolkit`, `budget`),
/// named with this daemon, for the shim's one warning per daemon.
fn fixable(result: LinkResult, what: &str) -> LinkResult {
    LinkResult { fixable: what.to_owned(), daemon: instance().to_owned(), ..result }
}

/// This daemon process, as `LinkResult.daemon` names it: a digest of its pid
/// and the time of the first call (made at start by `daemon::serve`), so a
/// new daemon is a new name even with the same pid.
pub fn instance() -> &'static str {
    static NAME: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    NAME.get_or_init(|| {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        let mut h = blake3::Hasher::new();
        h.update(&std::process::id().to_le_bytes());
        h.update(&now.as_nanos().to_le_bytes());
        h.finalize().to_hex()[..16].to_owned()
    })
}

/// The answer to a superseded link: a failure with nvlink's kind of message
/// (also right for a shim that does not know `cancelled`: it prints stderr and
/// exits 1, writing nothing).
fn superseded(args: &[String]) -> LinkResult {
    let out = output_named(args).map(|o| format!(" of '{o}'")).unwrap_or_default();
    LinkResult {
        exit_code: 1,
        stderr: format!("nvlink fatal   : Link superseded by a newer link{out} from the same directory (nvlinkd)\n")
            .into_bytes(),
        cancelled: Stopped::Superseded.name().into(),
        ..Default::default()
    }
}

/// The answer to a link cancelled by its id (`nvlinkd cancel`, an editor):
/// it failed, as if superseded; the shim does not run nvlink.
fn cancelled_by_request(args: &[String]) -> LinkResult {
    let out = output_named(args).map(|o| format!(" of '{o}'")).unwrap_or_default();
    LinkResult {
        exit_code: 1,
        stderr: format!("nvlink fatal   : Link{out} cancelled by request (nvlinkd)\n").into_bytes(),
        cancelled: Stopped::Requested.name().into(),
        ..Default::default()
    }
}

/// The output file as the command line names it (`-o X`, `-oX`, `--output-file X`, `…=X`).
fn output_named(args: &[String]) -> Option<&str> {
    use nvlinkd_core::cli::{written_files, Written};
    written_files(args).into_iter().find(|(kind, _)| *kind == Written::Output).map(|(_, v)| v)
}

/// `Start.progress`: the link's phase events go to its own stream as
/// `Progress` messages (dropped, never waited for, when the stream is full).
fn forward_progress(events: &Hub, link: u64, tx: Outbound) {
    let mut rx = events.subscribe();
    let t0 = Instant::now();
    tokio::spawn(async move {
        loop {
            let ev = match rx.recv().await {
                Ok(ev) => ev,
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                Err(_) => return,
            };
            if ev.link != link {
                continue;
            }
            match ev.kind {
                "phase_finished" => {
                    let phase = serde_json::from_str::<serde_json::Value>(&ev.json)
                        .ok()
                        .and_then(|v| v["phase"].as_str().map(str::to_owned))
                        .unwrap_or_default();
                    let elapsed_ms = t0.elapsed().as_millis() as u64;
                    let msg =
                        ServerMessage { msg: Some(server_message::Msg::Progress(Progress { phase, elapsed_ms })) };
                    let _ = tx.try_send(Ok(msg));
                }
                "link_finished" | "link_cancelled" => return,
                _ => {}
            }
        }
    });
}

impl Service {
    /// The TCP connection a remote call came on (`incoming.rs`).
    fn connection<T>(&self, request: &Request<T>) -> Option<Arc<Connection>> {
        use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
        if self.local {
            return request.extensions().get::<crate::net::local::LocalConnectInfo>().map(|i| i.connection.clone());
        }
        let ext = request.extensions();
        let info =
            ext.get::<TcpConnectInfo>().or_else(|| ext.get::<TlsConnectInfo<TcpConnectInfo>>().map(|i| i.get_ref()))?;
        self.connections.connection(info.local_addr(), info.remote_addr())
    }

    /// Who a remote link counts against for the per-caller slots
    /// (`admission.rs`): its token where the token file holds several, else
    /// its client certificate where they are required; None (the
    /// daemon-wide count only) where all callers look alike.
    fn caller<T>(&self, request: &Request<T>) -> Option<Caller> {
        if let Some(auth) = self.auth.as_ref().filter(|a| a.count() > 1) {
            return auth.identify(request.metadata()).map(|t| t.hash);
        }
        if self.client_certificates {
            let certs = request.peer_certs()?;
            return certs.first().map(|c| *blake3::hash(c.as_ref()).as_bytes());
        }
        None
    }

    /// A caller of this listener is who it must be: any caller of the unix
    /// socket, a remote one with a valid token (where tokens are required).
    /// A remote call that is lets its connection stay, and its address take
    /// the reserved connection slots for a while (`incoming.rs`).
    fn authenticate<T>(&self, request: &Request<T>) -> Result<(), Status> {
        if self.local {
            let checked = self.check_local_peer(request);
            if let (Ok(()), Some(c)) = (&checked, self.connection(request)) {
                c.authenticated();
            }
            return checked;
        }
        let checked = self.check_token(request);
        if checked.is_ok() {
            if let Some(c) = self.connection(request) {
                c.authenticated();
                if let Some(peer) = request.remote_addr() {
                    self.connections.known(peer.ip());
                }
            }
        }
        checked
    }

    fn check_token<T>(&self, request: &Request<T>) -> Result<(), Status> {
        match &self.auth {
            Some(auth) if !auth.allows(request.metadata()) => {
                self.auth_failures.fetch_add(1, Ordering::Relaxed);
                Err(auth.refused(request.remote_addr()))
            }
            _ => Ok(()),
        }
    }

    /// The unix socket serves the daemon's own user (and root), whatever its
    /// mode: a local link reads the caller's files as the daemon's user, and
    /// the administrative calls (events, cancel, shutdown) are that user's.
    /// The socket is 0600 in a private directory; this holds where an operator
    /// opened it up. Another user runs a daemon of their own.
    fn check_local_peer<T>(&self, request: &Request<T>) -> Result<(), Status> {
        let peer = local_peer(request);
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        match peer.map(|c| c.uid()) {
            Some(uid) if uid == me || uid == 0 => Ok(()),
            uid => {
                self.auth_failures.fetch_add(1, Ordering::Relaxed);
                let who = uid.map_or_else(|| "an unknown user".to_owned(), |u| format!("uid {u}"));
                if let Some(suppressed) = self.refusal_log.allow() {
                    warn!(peer = %who, suppressed, "a caller of another user on the local socket refused (logged at \
                          most every {}s; suppressed: refusals not logged since the last line)",
                          crate::net::incoming::LOG_EVERY.as_secs());
                }
                Err(Status::permission_denied(format!(
                    "this daemon serves uid {me}, not {who}: start your own (nvlinkd start)"
                )))
            }
        }
    }

    /// Administration is for the daemon's own user, on the unix socket.
    fn local_only(&self, what: &str) -> Result<(), Status> {
        if self.local {
            Ok(())
        } else {
            if let Some(suppressed) = self.refusal_log.allow() {
                warn!(
                    what,
                    suppressed,
                    "administration over the remote listener refused (logged at most every {}s; \
                      suppressed: refusals not logged since the last line)",
                    crate::net::incoming::LOG_EVERY.as_secs()
                );
            }
            Err(Status::permission_denied(format!("{what} is only allowed over the daemon's local unix socket")))
        }
    }
}

#[tonic::async_trait]
impl Nvlinkd for Service {
    type LinkStream = LinkStream;

    async fn link(&self, request: Request<Streaming<ClientMessage>>) -> Result<Response<LinkStream>, Status> {
        self.authenticate(&request)?;
        // Answer with the response stream at once; the link itself runs in the
        // background as soon as the Start message arrives.
        let (tx, rx) = mpsc::channel(16);
        let this = self.clone();
        let active = self.activity.begin();
        let peer = local_peer(&request);
        let same_user = crate::link::staging::same_user(peer);
        let remote = (!self.local).then(|| RemoteCaller {
            caller: self.caller(&request),
            peer: request.remote_addr().map(|a| a.to_string()).unwrap_or_else(|| "?".into()),
            token: self.auth.as_ref().and_then(|a| a.identify(request.metadata())).map(|t| t.name),
            subject: request.peer_certs().and_then(|certs| certs.first().and_then(|c| subject(c.as_ref()))),
        });
        // The connection is in use while the stream is open.
        let call = self.connection(&request).map(|c| c.call());
        tokio::spawn(async move {
            if let Err(status) = this.serve_link(request.into_inner(), tx.clone(), active, same_user, remote).await {
                let _ = tx.try_send(Err(status));
            }
        });
        Ok(Response::new(Box::pin(WithCall { inner: tokio_stream::wrappers::ReceiverStream::new(rx), _call: call })))
    }

    type EventsStream = EventStream;

    async fn events(&self, request: Request<EventsRequest>) -> Result<Response<EventStream>, Status> {
        self.authenticate(&request)?;
        // Every link's cwd and arguments: for the daemon's own user only.
        self.local_only("Events")?;
        // The connection is in use while the stream is open.
        let call = self.connection(&request).map(|c| c.call());
        let want = request.into_inner();
        let nonempty = |s: String| (!s.is_empty()).then(|| PathBuf::from(s));
        let filter = crate::observe::events::Filter {
            cwd: nonempty(want.cwd),
            output: nonempty(want.output),
            no_speculative: want.no_speculative,
        };
        let mut rx = self.events.subscribe();
        let mut shutdown = self.shutdown.subscribe();
        let (tx, out) = mpsc::channel(256);
        tokio::spawn(async move {
            let _call = call;
            loop {
                let event = tokio::select! {
                    ev = rx.recv() => match ev {
                        Ok(ev) if filter.admits(&ev) => ev.to_proto(),
                        Ok(_) => continue,
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                            crate::observe::events::lagged(n).to_proto()
                        }
                        Err(_) => return,
                    },
                    // A stop ends the stream (the server waits for open streams).
                    _ = shutdown.wait_for(|s| *s) => return,
                    _ = tx.closed() => return,
                };
                if tx.send(Ok(event)).await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(out))))
    }

    type WatchStream = WatchStream;

    async fn watch(&self, request: Request<Start>) -> Result<Response<WatchStream>, Status> {
        self.authenticate(&request)?;
        self.local_only("Watch")?;
        // The connection is in use while the stream is open.
        let call = self.connection(&request).map(|c| c.call());
        let start = request.into_inner();
        let req = self.link_request(&start);
        if !req.shared_fs {
            return Err(Status::failed_precondition(
                "nvlinkd watch needs a daemon on this machine that sees the link's files (its unix socket)",
            ));
        }
        let (tx, rx) = mpsc::channel(16);
        let events = tx.clone();
        let subscriber: Subscriber = Arc::new(move |relink, link, changed, o, took| {
            let event = WatchEvent {
                relink,
                changed: changed.iter().map(|p| p.to_string_lossy().into_owned()).collect(),
                result: Some(link_result(o)),
                ms: took.as_secs_f64() * 1e3,
                engine: if o.fallback.is_some() { "none" } else { crate::observe::events::engine_name(o.engine) }
                    .to_owned(),
                link,
            };
            // Called on the relink's own thread, never on the runtime.
            events.blocking_send(Ok(event)).is_ok()
        });
        let watcher = self.watcher.clone();
        let id = tokio::task::spawn_blocking(move || watcher.subscribe(req, subscriber))
            .await
            .map_err(|e| Status::internal(e.to_string()))?
            .ok_or_else(|| Status::invalid_argument("not a device link with an output file (nothing to keep fresh)"))?;
        info!(id, "watching a link for nvlinkd watch");
        let watcher = self.watcher.clone();
        tokio::spawn(async move {
            let _call = call;
            tx.closed().await;
            debug!(id, "nvlinkd watch went away");
            watcher.unsubscribe(id);
        });
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))))
    }

    async fn cancel(&self, request: Request<CancelRequest>) -> Result<Response<CancelReply>, Status> {
        self.authenticate(&request)?;
        self.local_only("Cancel")?;
        let link = request.into_inner().link;
        let cancelled = self.events.cancel(link);
        info!(link, cancelled, "cancel requested");
        Ok(Response::new(CancelReply { cancelled }))
    }

    async fn recipes(&self, request: Request<RecipesRequest>) -> Result<Response<RecipesReply>, Status> {
        self.authenticate(&request)?;
        self.local_only("Recipes")?;
        let want = request.into_inner();
        let watcher = self.watcher.clone();
        let recipes = tokio::task::spawn_blocking(move || {
            if want.forget_all {
                watcher.forget(None);
            } else if !want.forget.is_empty() {
                watcher.forget(Some(&want.forget));
            }
            watcher.recipes()
        })
        .await
        .map_err(|e| Status::internal(e.to_string()))?;
        let recipes = recipes
            .into_iter()
            .map(|r| Recipe {
                id: r.id,
                outputs: crate::observe::events::named_outputs(&r.args, &r.cwd)
                    .iter()
                    .map(|p| p.to_string_lossy().into_owned())
                    .collect(),
                cwd: r.cwd.to_string_lossy().into_owned(),
                args: r.args,
                relinks: r.relinks,
                followed: r.followed,
            })
            .collect();
        Ok(Response::new(RecipesReply { recipes }))
    }

    async fn stats(&self, request: Request<StatsRequest>) -> Result<Response<StatsReply>, Status> {
        self.authenticate(&request)?;
        let figures = crate::observe::Figures {
            linker: self.linker.clone(),
            blobs: self.blobs.clone(),
            staged: self.staged.clone(),
            connections: self.connections.clone(),
            auth_failures: self.auth_failures.clone(),
            remote_links: self.remote_links.clone(),
            reply_memory: self.reply_memory.clone(),
            auth: self.tokens.clone(),
            certificates: self.certificates.clone(),
        };
        let mut snapshot = figures.snapshot();
        if !self.local {
            // A remote caller learns the figures, not where the toolkits live
            // nor what other callers (tokens) did.
            snapshot.toolkits.clear();
            snapshot.tokens.clear();
            snapshot.certificates.clear();
        }
        Ok(Response::new(StatsReply { json: snapshot.to_json() }))
    }

    async fn ping(&self, request: Request<PingRequest>) -> Result<Response<PingReply>, Status> {
        self.authenticate(&request)?;
        // A remote caller learns that the daemon answers, and its version; not
        // where it keeps its files or which process it is.
        let (pid, cache_dir) = if self.local {
            (std::process::id(), self.cache_dir.to_string_lossy().into_owned())
        } else {
            (0, String::new())
        };
        Ok(Response::new(PingReply { pid, version: env!("CARGO_PKG_VERSION").into(), cache_dir }))
    }

    async fn shutdown(&self, request: Request<ShutdownRequest>) -> Result<Response<ShutdownReply>, Status> {
        self.authenticate(&request)?;
        self.local_only("Shutdown")?;
        info!("shutdown requested");
        let _ = self.shutdown.send(true);
        Ok(Response::new(ShutdownReply {}))
    }
}
