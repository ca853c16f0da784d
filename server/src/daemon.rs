//! `nvlinkd serve`: listeners, logging and shutdown.
//!
//! The daemon listens on a unix socket (mode 0600) and, with `--listen`, on TCP
//! for remote shims. The TCP listener is TLS (rustls, through tonic) and
//! authenticates every call: bearer tokens (`--token-file`, compared in
//! constant time) and/or client certificates (`--client-ca`). Without TLS and
//! an authentication it refuses to start, unless `--insecure` says a proxy
//! does that job. Both listeners also serve `grpc.health.v1` (tonic-health),
//! unauthenticated: it tells only whether the daemon serves. SIGTERM, SIGINT, the `Shutdown` RPC and `--idle-exit` all
//! start the same shutdown: no new connections or links; links in flight get the
//! grace period (`--shutdown-grace`) to finish, then are abandoned (their shims
//! fall back to the real nvlink; outputs are never half-written since the shim
//! writes them); the socket is removed and the process exits. A stuck client
//! never holds the daemon up longer than the grace period.
//!
//! The socket's directory belongs to someone: a directory the daemon has to
//! create is created private (0700); an existing one is never changed, only
//! checked (owned by us or root, and sticky if others may write to it, as /tmp
//! is). A file at the socket path is replaced only when it is a socket no daemon
//! answers on; anything else is refused.

use crate::net::auth::Auth;
use crate::net::listener::Remote;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use nvlinkd_core::{Linker, LinkerConfig};
use nvlinkd_proto::shared;
use nvlinkd_proto::v1::nvlinkd_server::NvlinkdServer;
use tokio::net::TcpListener;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;
use tokio_stream::wrappers::UnixListenerStream;
use tracing::{error, info, warn};
use tracing_subscriber::fmt::format::FmtSpan;

use crate::link::service::{Activity, Limits, Service};
use crate::observe::events::{Hub, PhaseLayer};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer;

use crate::speculate::watch::Watcher;
use crate::speculate::Speculator;

pub struct ServeOptions {
    pub socket: PathBuf,
    pub cache_dir: PathBuf,
    pub remote: Option<Remote>,
    pub linker: LinkerConfig,
    pub limits: Limits,
    /// How long links still computing may finish after a stop.
    pub shutdown_grace: Duration,
    /// Exit after this long without a link.
    pub idle_exit: Option<Duration>,
    /// The shared REAPI cache tier (`--remote-cache`).
    pub remote_cache: Option<crate::reapi::RemoteOptions>,
    /// Where to serve Prometheus metrics (`--metrics-listen`).
    pub metrics_listen: Option<String>,
    /// Where the event stream is published (`events.rs`).
    pub events: Hub,
    /// Speculative links (see `speculate.rs`).
    pub speculation: Speculation,
    /// Most TCP connections at once (`--max-connections`; see `incoming.rs`).
    pub max_connections: usize,
}

/// What the daemon links before it is asked (`speculate.rs`, `watch.rs`).
#[derive(Clone, Copy, Debug)]
pub struct Speculation {
    /// Link the other archs of a multi-arch nvcc step (off: `--no-speculate`).
    pub multi_arch: bool,
    /// Remember recent links and relink them when an input changes (`--watch`).
    pub watch: bool,
    /// Most speculative links computing at once.
    pub max_running: usize,
}

/// Log to `<cache dir>/nvlinkd.log`. The returned guard flushes on drop.
///
/// A cache directory that cannot hold the log (read-only, full, not a
/// directory) is not a reason to stop: the log goes to stderr instead, with one
/// line saying why, and the daemon serves (the cache then also runs without
/// its disk tier, see `cache::store`).
///
/// The event stream's layer ([`crate::observe::events::PhaseLayer`]) sits beside the
/// log's: each has its own filter, so the core's phase spans (`debug`) exist
/// for the events whatever `NVLINKD_LOG` lets the log show.
pub fn init_logging(cache_dir: &Path, events: &Hub) -> Option<tracing_appender::non_blocking::WorkerGuard> {
    let path = cache_dir.join("nvlinkd.log");
    let file = std::fs::create_dir_all(cache_dir)
        .and_then(|()| std::fs::OpenOptions::new().create(true).append(true).open(&path));
    let filter = tracing_subscriber::EnvFilter::try_from_env("NVLINKD_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let (writer, guard, failed) = match file {
        Ok(f) => {
            let (w, g) = tracing_appender::non_blocking(f);
            (w, g, None)
        }
        Err(e) => {
            let (w, g) = tracing_appender::non_blocking(std::io::stderr());
            (w, g, Some(e))
        }
    };
    // At debug level each span's end is logged with its duration: a link's
    // phases (see `Linker::link_span`) are its timings.
    let timed = filter.max_level_hint().is_some_and(|l| l >= tracing_subscriber::filter::LevelFilter::DEBUG);
    let span_events = if timed { FmtSpan::CLOSE } else { FmtSpan::NONE };
    let log = tracing_subscriber::fmt::layer()
        .with_span_events(span_events)
        .with_writer(writer)
        .with_ansi(false)
        .with_filter(filter);
    // The core's spans, and its scheduler's `sched = …` and verification's
    // `verify = …` events only.
    let phases = PhaseLayer { hub: events.clone() }.with_filter(tracing_subscriber::filter::filter_fn(|m| {
        m.target().starts_with("nvlinkd_core")
            && (m.is_span() || m.fields().field("sched").is_some() || m.fields().field("verify").is_some())
    }));
    let installed = tracing_subscriber::registry().with(log).with(phases).try_init();
    if let Some(e) = failed {
        tracing::warn!(log = %path.display(), "cannot write the log file ({e}): logging to stderr");
    }
    installed.ok().map(|()| guard)
}

/// HTTP/2 windows large enough that whole input files flow without waiting
/// for window updates.
fn builder() -> tonic::transport::Server {
    tonic::transport::Server::builder()
        .initial_stream_window_size(Some(shared::WINDOW_BYTES))
        .initial_connection_window_size(Some(shared::WINDOW_BYTES))
        .max_frame_size(Some(shared::FRAME_BYTES))
}

pub async fn serve(opts: ServeOptions) -> Result<(), Box<dyn std::error::Error>> {
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    // A farm daemon needs more descriptors than the usual soft limit of 1024.
    let nofile = crate::net::incoming::raise_fd_limit();
    let unix = crate::net::listener::bind_unix(&opts.socket)
        .map_err(|e| format!("cannot serve on {}: {e}", opts.socket.display()))?;
    let jobs = opts.linker.jobs;
    // Without a whole-link cache a speculative link's result would go nowhere
    // (`nvlinkd watch`, which receives its results, still works).
    let cached = opts.linker.cache_mem > 0 || opts.linker.cache_size > 0;
    // One line for whoever started `serve` in a terminal (the rest goes to the log).
    let listening = opts.remote.as_ref().map(|r| format!(" and {}", r.listen)).unwrap_or_default();
    let toolkits: Vec<String> = opts.linker.toolkits.iter().map(|t| t.display().to_string()).collect();
    let started_line = format!(
        "nvlinkd {} serving on {}{listening} (pid {}; toolkit {}; cache and log in {})",
        env!("CARGO_PKG_VERSION"),
        opts.socket.display(),
        std::process::id(),
        toolkits.join(", "),
        opts.cache_dir.display()
    );
    let linker = Arc::new(Linker::new(opts.linker));
    if let Some(r) = opts.remote_cache.clone() {
        let tier = crate::reapi::RemoteCache::new(r, tokio::runtime::Handle::current())?;
        linker.set_remote_tier(Arc::new(tier));
    }
    let speculator = Speculator::new(
        linker.clone(),
        opts.events.clone(),
        &opts.cache_dir,
        opts.speculation.multi_arch && cached,
        opts.speculation.max_running,
        opts.limits.max_link_input,
    );
    let watcher =
        Watcher::new(linker.clone(), speculator.clone(), opts.speculation.watch && cached, opts.limits.max_link_input);
    info!(
        multi_arch = opts.speculation.multi_arch && cached,
        watch = opts.speculation.watch && cached,
        max_running = opts.speculation.max_running,
        ?jobs,
        "speculative links"
    );
    info!(socket = %opts.socket.display(), cache = %opts.cache_dir.display(), pid = std::process::id(), "nvlinkd serving");
    eprintln!("{started_line}");

    // Signals start the same graceful shutdown as the RPC.
    let signals = shutdown_tx.clone();
    tokio::spawn(async move {
        let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
            return;
        };
        tokio::select! {
            _ = term.recv() => info!("SIGTERM: stopping"),
            _ = int.recv() => info!("SIGINT: stopping"),
        }
        let _ = signals.send(true);
    });

    let activity = Arc::new(Activity::default());
    if let Some(idle) = opts.idle_exit {
        let (activity, stop) = (activity.clone(), shutdown_tx.clone());
        tokio::spawn(async move {
            let tick = (idle / 4).clamp(Duration::from_millis(50), Duration::from_secs(30));
            loop {
                tokio::time::sleep(tick).await;
                if activity.idle_for() >= idle {
                    info!(idle_s = idle.as_secs_f64(), "no link for --idle-exit: stopping");
                    let _ = stop.send(true);
                    return;
                }
            }
        });
    }

    let slow_link_ms = std::env::var("NVLINKD_TEST_SLOW_LINK_MS").ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    let auth_failures = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let blobs =
        Arc::new(crate::blobs::BlobStore::open(Some(&opts.cache_dir), opts.limits.blob_mem, opts.limits.blob_size));
    let staged = Arc::new(crate::link::staging::Counters::default());
    let connections = Arc::new(crate::net::incoming::Counters::default());
    let service = |local: bool, auth: Option<Arc<Auth>>| {
        NvlinkdServer::new(Service {
            linker: linker.clone(),
            speculator: speculator.clone(),
            watcher: watcher.clone(),
            local,
            auth,
            auth_failures: auth_failures.clone(),
            shutdown: shutdown_tx.clone(),
            cache_dir: opts.cache_dir.clone(),
            limits: opts.limits,
            activity: activity.clone(),
            slow_link_ms,
            events: opts.events.clone(),
            blobs: blobs.clone(),
            staged: staged.clone(),
            connections: connections.clone(),
        })
        .max_decoding_message_size(nvlinkd_proto::MAX_MESSAGE_BYTES)
        .max_encoding_message_size(nvlinkd_proto::MAX_MESSAGE_BYTES)
        // Compressed only for a client that asks (remote shims, for their
        // outputs); the bounds above hold for the decompressed message.
        .send_compressed(tonic::codec::CompressionEncoding::Zstd)
        .accept_compressed(tonic::codec::CompressionEncoding::Zstd)
    };
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    if let Some(addr) = &opts.metrics_listen {
        let listener = TcpListener::bind(addr).await.map_err(|e| format!("cannot serve metrics on {addr}: {e}"))?;
        tokio::spawn(crate::observe::metrics::serve(
            listener,
            linker.clone(),
            blobs.clone(),
            auth_failures.clone(),
            stopped(shutdown_rx.clone()),
        ));
    }

    // grpc.health.v1: SERVING until the daemon stops.
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<NvlinkdServer<Service>>().await;
    {
        let (health, rx) = (health.clone(), shutdown_rx.clone());
        tokio::spawn(async move {
            stopped(rx).await;
            health.set_not_serving::<NvlinkdServer<Service>>().await;
            health.set_service_status("", tonic_health::ServingStatus::NotServing).await;
        });
    }

    let unix_server = builder()
        .add_service(health_service.clone())
        .add_service(service(true, None))
        .serve_with_incoming_shutdown(UnixListenerStream::new(unix), stopped(shutdown_rx.clone()));
    let tcp_server = match opts.remote {
        Some(remote) => {
            let listener = TcpListener::bind(&remote.listen).await?;
            let mut server = builder();
            let tls = remote.tls.is_some();
            match remote.tls {
                Some(config) => server = server.tls_config(config.timeout(crate::net::incoming::HANDSHAKE_TIMEOUT))?,
                None => warn!(listen = %remote.listen, "--insecure: serving remote shims without TLS"),
            }
            if !remote.authenticated {
                warn!(listen = %remote.listen, "--insecure: serving remote shims without authentication");
            }
            let connection_limits = crate::net::incoming::ConnectionLimits::new(opts.max_connections, nofile);
            info!(
                listen = %remote.listen,
                tls,
                tokens = remote.auth.is_some(),
                max_connections = connection_limits.total,
                per_peer = connection_limits.per_peer,
                "serving remote shims over TCP"
            );
            Some(
                server
                    .add_service(health_service)
                    .add_service(service(false, remote.auth))
                    .serve_with_incoming_shutdown(
                        crate::net::incoming::guarded(listener, connection_limits, connections.clone()),
                        stopped(shutdown_rx.clone()),
                    ),
            )
        }
        None => None,
    };
    let servers = async {
        match tcp_server {
            Some(tcp) => {
                let (a, b) = tokio::join!(unix_server, tcp);
                a.and(b)
            }
            None => unix_server.await,
        }
    };
    // Once stopping, links still computing get the grace period; then the
    // servers (which would wait for every connection) are dropped.
    let grace = opts.shutdown_grace;
    let abandon = async {
        stopped(shutdown_rx.clone()).await;
        tokio::time::sleep(grace).await;
    };
    let result = tokio::select! {
        r = servers => r,
        _ = abandon => {
            warn!(grace_s = grace.as_secs_f64(), "links still in flight after the grace period: abandoned");
            Ok(())
        }
    };
    let _ = std::fs::remove_file(&opts.socket);
    if let Err(e) = &result {
        error!("server error: {e}");
    }
    info!("nvlinkd stopped");
    result.map_err(Into::into)
}
