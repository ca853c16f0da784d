//! The gRPC service: a thin async shell around `nvlinkd_core::Linker`.
//!
//! `Link` reads the `Start` message, runs the link on a blocking thread with a
//! [`LinkFs`] (the caller's files, read here or over the same stream), and sends
//! the result back. A panic or error inside one link becomes that link's failure
//! (the shim then falls back to the real nvlink); the daemon keeps serving. The
//! stream owns its link: see `stream_fs.rs` for how a closed stream ends it.

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nvlinkd_core::fs::InputFs;
use nvlinkd_core::request::{Outcome, Request as LinkRequest};
use nvlinkd_core::worker::Cancel;
use nvlinkd_core::Linker;
use nvlinkd_proto::v1::{
    client_message, nvlinkd_server::Nvlinkd, server_message, ClientMessage, LinkResult, OutputFile, PingReply,
    PingRequest, ServerMessage, ShutdownReply, ShutdownRequest, Start, StatsReply, StatsRequest, WatchEvent,
};
use tokio::sync::{mpsc, watch};
use tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};
use tracing::{debug, info, warn};

use crate::speculate::Speculator;
use crate::stream_fs::{LinkChannel, LinkFs, Outbound};
use crate::watch::{Subscriber, Watcher};

/// Limits every link is held to.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// How long the daemon waits for the shim: its `Start`, each file reply, room
    /// in the stream for a request. Past it the shim counts as gone.
    pub reply_timeout: Duration,
    /// Most input bytes one link may read; past it the link is declined (the
    /// shim runs the real nvlink).
    pub max_link_input: u64,
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
    /// Recipes of recent links, relinked when their inputs change (`watch.rs`).
    pub watcher: Arc<Watcher>,
    /// Whether this listener is the local unix socket (the caller shares our filesystem).
    pub local: bool,
    pub shutdown: watch::Sender<bool>,
    pub cache_dir: PathBuf,
    pub limits: Limits,
    pub activity: Arc<Activity>,
    /// Test hook (`NVLINKD_TEST_SLOW_LINK_MS`): every link first sleeps this
    /// long, so tests can kill or stop the daemon while a link is in flight.
    pub slow_link_ms: u64,
}

type LinkStream = Pin<Box<dyn Stream<Item = Result<ServerMessage, Status>> + Send>>;
type WatchStream = Pin<Box<dyn Stream<Item = Result<WatchEvent, Status>> + Send>>;

impl Service {
    /// Read the Start message, run the link on a blocking thread (file reads
    /// go back to the shim over this stream), send the result.
    async fn serve_link(
        &self,
        mut inbound: Streaming<ClientMessage>,
        tx: Outbound,
        active: ActiveLink,
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
        let cwd = PathBuf::from(&start.cwd);
        // Same filesystem only when local and the shim's cwd is the same directory here.
        let shared_fs = self.local
            && std::fs::metadata(&cwd).map(|m| m.dev() == start.cwd_dev && m.ino() == start.cwd_ino).unwrap_or(false);
        let req = LinkRequest {
            args: start.args,
            cwd,
            env: start.env.into_iter().collect(),
            toolkit: Some(start.toolkit).filter(|t| !t.is_empty()).map(PathBuf::from),
            shared_fs,
            speculative: false,
        };

        // The other archs of a multi-arch nvcc step, linked alongside this one.
        self.speculator.on_link(&req);

        let channel = LinkChannel::new(tx, tokio::runtime::Handle::current(), self.limits.reply_timeout);
        // The stream owns the link: when the shim half-closes or goes away, the
        // channel closes and the link's reads fail at once. (A stop does not close
        // it: the link may finish within the grace period, then the process exits.)
        let reader = channel.clone();
        // ... and its computation: a closed stream kills the worker process or
        // nvlink engine serving the link (nothing of it is cached).
        let cancel = Cancel::new();
        let cancel_on_close = cancel.clone();
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
        });

        let linker = self.linker.clone();
        let watcher = self.watcher.clone();
        let slow = self.slow_link_ms;
        let budget = self.limits.max_link_input;
        tokio::task::spawn_blocking(move || {
            let _active = active;
            // Every line of this link, the daemon's own included, carries its id.
            let span = linker.link_span(&req);
            let _entered = span.enter();
            let _in_flight = linker.in_flight_guard();
            if slow > 0 {
                std::thread::sleep(std::time::Duration::from_millis(slow));
            }
            // A daemon on the caller's filesystem reads the files itself: no copies
            // through the stream.
            let fs = LinkFs::new(channel.clone(), req.shared_fs, budget);
            let args = req.args.join(" ");
            let t_link = std::time::Instant::now();
            let outcome =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| linker.link_cancellable(&req, &fs, &cancel)));
            // Nothing is registered on this stream from now on.
            let gone = channel.closed_reason();
            channel.close("the link is done");
            if outcome.as_ref().is_ok_and(|o| o.fallback.is_none()) {
                // With --watch: relinked in the background when an input changes.
                watcher.remember(&req);
            }
            let result = match outcome {
                Ok(o) => {
                    info!(
                        args = %args,
                        exit = o.exit_code,
                        engine = ?o.engine,
                        fallback = ?o.fallback.as_ref().map(|d| &d.detail),
                        routed = ?o.routed.as_ref().map(|d| &d.detail),
                        reason = o.fallback.as_ref().or(o.routed.as_ref()).map_or("-", |d| d.reason.name()),
                        ms = t_link.elapsed().as_secs_f64() * 1e3,
                        "link done"
                    );
                    match fs.declined() {
                        // An input only nvlink may read, or past the budget: whatever
                        // the link made of the failed read is not nvlink's answer.
                        Some(why) => fallback(why),
                        None => LinkResult {
                            exit_code: o.exit_code,
                            stdout: o.stdout,
                            stderr: o.stderr,
                            outputs: o
                                .outputs
                                .into_iter()
                                .map(|f| OutputFile {
                                    path: f.path.to_string_lossy().into_owned(),
                                    data: f.data,
                                    append: f.append,
                                })
                                .collect(),
                            fallback: o.fallback.is_some(),
                            fallback_reason: o.fallback.map(|d| d.detail).unwrap_or_default(),
                        },
                    }
                }
                Err(_) => {
                    warn!(args = %args, "link panicked; asking the shim to fall back");
                    linker.note_failure();
                    fallback("internal error in nvlinkd".into())
                }
            };
            if let Some(why) = gone {
                debug!(args = %args, why, "stream closed during the link");
            }
            // A shim that half-closed may still read the answer; one that is gone
            // or stopped reading is given up after the reply timeout.
            let _ = channel.send(ServerMessage { msg: Some(server_message::Msg::Result(result)) }, false);
        });
        Ok(())
    }
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
            .map(|f| OutputFile { path: f.path.to_string_lossy().into_owned(), data: f.data.clone(), append: f.append })
            .collect(),
        fallback: o.fallback.is_some(),
        fallback_reason: o.fallback.as_ref().map(|d| d.detail.clone()).unwrap_or_default(),
    }
}

fn fallback(reason: String) -> LinkResult {
    LinkResult { fallback: true, fallback_reason: reason, ..Default::default() }
}

#[tonic::async_trait]
impl Nvlinkd for Service {
    type LinkStream = LinkStream;

    async fn link(&self, request: Request<Streaming<ClientMessage>>) -> Result<Response<LinkStream>, Status> {
        // Answer with the response stream at once; the link itself runs in the
        // background as soon as the Start message arrives.
        let (tx, rx) = mpsc::channel(16);
        let this = self.clone();
        let active = self.activity.begin();
        tokio::spawn(async move {
            if let Err(status) = this.serve_link(request.into_inner(), tx.clone(), active).await {
                let _ = tx.try_send(Err(status));
            }
        });
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))))
    }

    type WatchStream = WatchStream;

    async fn watch(&self, request: Request<Start>) -> Result<Response<WatchStream>, Status> {
        let start = request.into_inner();
        let cwd = PathBuf::from(&start.cwd);
        let shared_fs = self.local
            && std::fs::metadata(&cwd).map(|m| m.dev() == start.cwd_dev && m.ino() == start.cwd_ino).unwrap_or(false);
        if !shared_fs {
            return Err(Status::failed_precondition(
                "nvlinkd watch needs a daemon on this machine that sees the link's files (its unix socket)",
            ));
        }
        let req = LinkRequest {
            args: start.args,
            cwd,
            env: start.env.into_iter().collect(),
            toolkit: Some(start.toolkit).filter(|t| !t.is_empty()).map(PathBuf::from),
            shared_fs,
            speculative: false,
        };
        let (tx, rx) = mpsc::channel(16);
        let events = tx.clone();
        let subscriber: Subscriber = Arc::new(move |relink, changed, o, took| {
            let event = WatchEvent {
                relink,
                changed: changed.iter().map(|p| p.to_string_lossy().into_owned()).collect(),
                result: Some(link_result(o)),
                ms: took.as_secs_f64() * 1e3,
                engine: format!("{:?}", o.engine),
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
            tx.closed().await;
            debug!(id, "nvlinkd watch went away");
            watcher.unsubscribe(id);
        });
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))))
    }

    async fn stats(&self, _: Request<StatsRequest>) -> Result<Response<StatsReply>, Status> {
        Ok(Response::new(StatsReply { json: self.linker.stats_json() }))
    }

    async fn ping(&self, _: Request<PingRequest>) -> Result<Response<PingReply>, Status> {
        Ok(Response::new(PingReply {
            pid: std::process::id(),
            version: env!("CARGO_PKG_VERSION").into(),
            cache_dir: self.cache_dir.to_string_lossy().into_owned(),
        }))
    }

    async fn shutdown(&self, _: Request<ShutdownRequest>) -> Result<Response<ShutdownReply>, Status> {
        info!("shutdown requested");
        let _ = self.shutdown.send(true);
        Ok(Response::new(ShutdownReply {}))
    }
}
