//! `nvlinkd serve`: listeners, logging and shutdown.
//!
//! The daemon listens on a unix socket (mode 0600) and, with `--listen`, on TCP
//! for remote shims. SIGTERM, SIGINT, the `Shutdown` RPC and `--idle-exit` all
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

use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use nvlinkd_core::{Linker, LinkerConfig};
use nvlinkd_proto::shared;
use nvlinkd_proto::v1::nvlinkd_server::NvlinkdServer;
use tokio::net::{TcpListener, UnixListener};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;
use tokio_stream::wrappers::{TcpListenerStream, UnixListenerStream};
use tracing::{error, info, warn};
use tracing_subscriber::fmt::format::FmtSpan;

use crate::service::{Activity, Limits, Service};
use crate::speculate::Speculator;
use crate::watch::Watcher;

pub struct ServeOptions {
    pub socket: PathBuf,
    pub cache_dir: PathBuf,
    pub listen: Option<String>,
    pub linker: LinkerConfig,
    pub limits: Limits,
    /// How long links still computing may finish after a stop.
    pub shutdown_grace: Duration,
    /// Exit after this long without a link.
    pub idle_exit: Option<Duration>,
    /// Speculative links (see `speculate.rs`).
    pub speculation: Speculation,
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
pub fn init_logging(cache_dir: &Path) -> Option<tracing_appender::non_blocking::WorkerGuard> {
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
    let installed = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_span_events(span_events)
        .with_writer(writer)
        .with_ansi(false)
        .try_init();
    if let Some(e) = failed {
        tracing::warn!(log = %path.display(), "cannot write the log file ({e}): logging to stderr");
    }
    installed.ok().map(|()| guard)
}

/// The socket's directory: created private when missing (with any missing
/// parents), checked and left as it is when it exists.
fn socket_dir(dir: &Path) -> std::io::Result<()> {
    let refuse = |why: String| std::io::Error::new(std::io::ErrorKind::PermissionDenied, why);
    match std::fs::metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
                std::fs::create_dir_all(parent)?;
            }
            match std::fs::DirBuilder::new().mode(0o700).create(dir) {
                Ok(()) => Ok(()),
                // Another daemon starting at the same moment: check what it made.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => socket_dir(dir),
                Err(e) => Err(e),
            }
        }
        Err(e) => Err(e),
        Ok(m) if !m.is_dir() => Err(refuse(format!("{} is not a directory", dir.display()))),
        Ok(m) => {
            // SAFETY: geteuid cannot fail.
            let me = unsafe { libc::geteuid() };
            if m.uid() != me && m.uid() != 0 {
                return Err(refuse(format!(
                    "the socket directory {} belongs to uid {}, not to this user ({me})",
                    dir.display(),
                    m.uid()
                )));
            }
            if m.mode() & 0o022 != 0 && m.mode() & 0o1000 == 0 {
                return Err(refuse(format!(
                    "the socket directory {} is writable by others and not sticky (mode {:o})",
                    dir.display(),
                    m.mode() & 0o7777
                )));
            }
            Ok(())
        }
    }
}

/// Bind the unix socket: its directory made or checked, a stale socket of a
/// dead daemon replaced, mode 0600. A path that exists and is not a socket is
/// refused, never deleted.
fn bind_unix(path: &Path) -> std::io::Result<UnixListener> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        socket_dir(dir)?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            // A live daemon answers on it; a dead one left it behind.
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::AddrInUse,
                    "another nvlinkd is serving this socket",
                ));
            }
            std::fs::remove_file(path)?;
        }
        Ok(_) => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                format!("{} exists and is not a socket; nvlinkd will not replace it", path.display()),
            ))
        }
        Err(_) => {}
    }
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

/// HTTP/2 windows large enough that whole input files flow without waiting
/// for window updates.
fn builder() -> tonic::transport::Server {
    tonic::transport::Server::builder()
        .initial_stream_window_size(Some(shared::WINDOW_BYTES))
        .initial_connection_window_size(Some(shared::WINDOW_BYTES))
}

pub async fn serve(opts: ServeOptions) -> Result<(), Box<dyn std::error::Error>> {
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let unix = bind_unix(&opts.socket).map_err(|e| format!("cannot serve on {}: {e}", opts.socket.display()))?;
    let jobs = opts.linker.jobs;
    // Without a whole-link cache a speculative link's result would go nowhere
    // (`nvlinkd watch`, which receives its results, still works).
    let cached = opts.linker.cache_mem > 0 || opts.linker.cache_size > 0;
    let linker = Arc::new(Linker::new(opts.linker));
    let speculator = Speculator::new(
        linker.clone(),
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
    let service = |local: bool| {
        NvlinkdServer::new(Service {
            linker: linker.clone(),
            speculator: speculator.clone(),
            watcher: watcher.clone(),
            local,
            shutdown: shutdown_tx.clone(),
            cache_dir: opts.cache_dir.clone(),
            limits: opts.limits,
            activity: activity.clone(),
            slow_link_ms,
        })
        .max_decoding_message_size(nvlinkd_proto::MAX_MESSAGE_BYTES)
        .max_encoding_message_size(nvlinkd_proto::MAX_MESSAGE_BYTES)
    };
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };

    let unix_server = builder()
        .add_service(service(true))
        .serve_with_incoming_shutdown(UnixListenerStream::new(unix), stopped(shutdown_rx.clone()));
    let tcp_server = match &opts.listen {
        Some(addr) => {
            let listener = TcpListener::bind(addr).await?;
            info!(listen = %addr, "serving remote shims over TCP");
            Some(
                builder()
                    .add_service(service(false))
                    .serve_with_incoming_shutdown(TcpListenerStream::new(listener), stopped(shutdown_rx.clone())),
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
