//! The gRPC service: a thin async shell around `nvlinkd_core::Linker`.
//!
//! `Link` reads the `Start` message, runs the link on a blocking thread with a
//! [`StreamFs`] that reads the shim's files over the same stream, and sends the
//! result back. A panic or error inside one link becomes that link's failure
//! (the shim then falls back to the real nvlink); the daemon keeps serving.

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;

use nvlinkd_core::fs::{InputFs, LocalFs};
use nvlinkd_core::request::Request as LinkRequest;
use nvlinkd_core::Linker;
use nvlinkd_proto::v1::{
    client_message, nvlinkd_server::Nvlinkd, server_message, ClientMessage, LinkResult, OutputFile, PingReply,
    PingRequest, ServerMessage, ShutdownReply, ShutdownRequest, StatsReply, StatsRequest,
};
use tokio::sync::{mpsc, watch};
use tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};
use tracing::{info, warn};

use crate::stream_fs::{Pending, StreamFs};

/// Most input bytes one link may read (larger links fall back to the real nvlink).
const MAX_REQUEST_BYTES: u64 = 32 << 30;

#[derive(Clone)]
pub struct Service {
    pub linker: Arc<Linker>,
    /// Whether this listener is the local unix socket (the caller shares our filesystem).
    pub local: bool,
    pub shutdown: watch::Sender<bool>,
    pub cache_dir: PathBuf,
    /// Test hook (`NVLINKD_TEST_SLOW_LINK_MS`): every link first sleeps this
    /// long, so tests can kill or stop the daemon while a link is in flight.
    pub slow_link_ms: u64,
}

type LinkStream = Pin<Box<dyn Stream<Item = Result<ServerMessage, Status>> + Send>>;

impl Service {
    /// Read the Start message, run the link on a blocking thread (file reads
    /// go back to the shim over this stream), send the result.
    async fn serve_link(
        &self,
        mut inbound: Streaming<ClientMessage>,
        tx: mpsc::Sender<Result<ServerMessage, Status>>,
    ) -> Result<(), Status> {
        let start = match inbound.message().await?.and_then(|m| m.msg) {
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
        };

        let pending: Pending = Default::default();
        // Route the shim's file replies to the waiting link thread.
        let router = pending.clone();
        tokio::spawn(async move {
            while let Ok(Some(msg)) = inbound.message().await {
                if let Some(client_message::Msg::File(reply)) = msg.msg {
                    if let Some((_, waiter)) = router.remove(&reply.id) {
                        let _ = waiter.send(reply);
                    }
                }
            }
            // Shim gone: fail every pending read.
            router.clear();
        });

        let linker = self.linker.clone();
        let slow = self.slow_link_ms;
        tokio::task::spawn_blocking(move || {
            let _in_flight = linker.in_flight_guard();
            if slow > 0 {
                std::thread::sleep(std::time::Duration::from_millis(slow));
            }
            let stream_fs = StreamFs::new(tx.clone(), pending.clone(), MAX_REQUEST_BYTES);
            // A daemon on the caller's filesystem reads the files itself: no copies
            // through the stream.
            let fs: &dyn InputFs = if req.shared_fs { &LocalFs } else { &stream_fs };
            let args = req.args.join(" ");
            let t_link = std::time::Instant::now();
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| linker.link(&req, fs)));
            pending.clear();
            let result = match outcome {
                Ok(o) => {
                    info!(
                        args = %args,
                        exit = o.exit_code,
                        engine = ?o.engine,
                        fallback = ?o.fallback,
                        routed = ?o.routed,
                        ms = t_link.elapsed().as_secs_f64() * 1e3,
                        "link done"
                    );
                    LinkResult {
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
                        fallback_reason: o.fallback.unwrap_or_default(),
                    }
                }
                Err(_) => {
                    warn!(args = %args, "link panicked; asking the shim to fall back");
                    linker.note_failure();
                    LinkResult {
                        fallback: true,
                        fallback_reason: "internal error in nvlinkd".into(),
                        ..Default::default()
                    }
                }
            };
            let _ = tx.blocking_send(Ok(ServerMessage { msg: Some(server_message::Msg::Result(result)) }));
        });
        Ok(())
    }
}

#[tonic::async_trait]
impl Nvlinkd for Service {
    type LinkStream = LinkStream;

    async fn link(&self, request: Request<Streaming<ClientMessage>>) -> Result<Response<LinkStream>, Status> {
        // Answer with the response stream at once; the link itself runs in the
        // background as soon as the Start message arrives.
        let (tx, rx) = mpsc::channel(16);
        let this = self.clone();
        tokio::spawn(async move {
            if let Err(status) = this.serve_link(request.into_inner(), tx.clone()).await {
                let _ = tx.send(Err(status)).await;
            }
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
