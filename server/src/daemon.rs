//! `nvlinkd serve`: listeners, logging and shutdown.
//!
//! The daemon listens on a unix socket (mode 0600 in a 0700 directory) and,
//! with `--listen`, on TCP for remote shims. SIGTERM, SIGINT and the `Shutdown`
//! RPC all start a graceful shutdown: no new connections, in-flight links run
//! to completion, then the socket is removed and the process exits.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nvlinkd_core::{Linker, LinkerConfig};
use nvlinkd_proto::v1::nvlinkd_server::NvlinkdServer;
use tokio::net::{TcpListener, UnixListener};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;
use tokio_stream::wrappers::{TcpListenerStream, UnixListenerStream};
use tracing::{error, info};

use crate::service::Service;

pub struct ServeOptions {
    pub socket: PathBuf,
    pub cache_dir: PathBuf,
    pub listen: Option<String>,
    pub linker: LinkerConfig,
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
    let installed = tracing_subscriber::fmt().with_env_filter(filter).with_writer(writer).with_ansi(false).try_init();
    if let Some(e) = failed {
        tracing::warn!(log = %path.display(), "cannot write the log file ({e}): logging to stderr");
    }
    installed.ok().map(|()| guard)
}

/// Bind the unix socket: private directory, stale socket removed, mode 0600.
fn bind_unix(path: &Path) -> std::io::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
        let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
    }
    if path.exists() {
        // A live daemon answers on it; a dead one left it behind.
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(std::io::Error::new(std::io::ErrorKind::AddrInUse, "another nvlinkd is serving this socket"));
        }
        std::fs::remove_file(path)?;
    }
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

/// HTTP/2 windows large enough that whole input files flow without waiting
/// for window updates.
fn builder() -> tonic::transport::Server {
    tonic::transport::Server::builder()
        .initial_stream_window_size(Some(WINDOW))
        .initial_connection_window_size(Some(WINDOW))
}

pub const WINDOW: u32 = 32 << 20;

pub async fn serve(opts: ServeOptions) -> Result<(), Box<dyn std::error::Error>> {
    let linker = Arc::new(Linker::new(opts.linker));
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let unix = bind_unix(&opts.socket)?;
    info!(socket = %opts.socket.display(), cache = %opts.cache_dir.display(), pid = std::process::id(), "nvlinkd serving");

    // Signals start the same graceful shutdown as the RPC.
    let signals = shutdown_tx.clone();
    tokio::spawn(async move {
        let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
            return;
        };
        tokio::select! {
            _ = term.recv() => info!("SIGTERM: finishing in-flight links"),
            _ = int.recv() => info!("SIGINT: finishing in-flight links"),
        }
        let _ = signals.send(true);
    });

    let slow_link_ms = std::env::var("NVLINKD_TEST_SLOW_LINK_MS").ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    let service = |local: bool| {
        NvlinkdServer::new(Service {
            linker: linker.clone(),
            local,
            shutdown: shutdown_tx.clone(),
            cache_dir: opts.cache_dir.clone(),
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
    let result = match tcp_server {
        Some(tcp) => {
            let (a, b) = tokio::join!(unix_server, tcp);
            a.and(b)
        }
        None => unix_server.await,
    };
    let _ = std::fs::remove_file(&opts.socket);
    if let Err(e) = &result {
        error!("server error: {e}");
    }
    info!("nvlinkd stopped");
    result.map_err(Into::into)
}
