//! The TCP listener's connections, guarded so that no client can starve the
//! daemon by connecting (issue: 1050 half-open TLS connections held every
//! file descriptor, spun the accept loop and stalled local links).
//!
//! - At most [`ConnectionLimits::total`] TCP connections at once, and at most
//!   [`ConnectionLimits::per_peer`] from one address: a connection beyond is closed at
//!   once. Both stay well under the file-descriptor limit (see
//!   [`raise_fd_limit`]), so the local socket, the cache and the workers
//!   always have descriptors left.
//! - An accept error for lack of descriptors or memory (`EMFILE`, `ENFILE`,
//!   `ENOBUFS`, `ENOMEM`) waits (10 ms, doubling to 1 s) instead of retrying
//!   at once: tonic's accept loop would spin on it.
//! - The TLS handshake (`tls.rs`, on these connections) has a deadline,
//!   [`HANDSHAKE_TIMEOUT`]: a connection that never completes it is closed and
//!   its slot freed.
//! - Refusals are logged at most once per [`LOG_EVERY`], with counts; so are
//!   failed TLS handshakes and refused tokens ([`LogLimit`]), with the peer's
//!   address.

use std::collections::HashMap;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tonic::transport::server::{Connected, TcpConnectInfo};
use tracing::warn;

/// Most refusal lines in the log: one per this period.
pub const LOG_EVERY: Duration = Duration::from_secs(10);
/// How long a TLS handshake may take.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Connection caps.
#[derive(Clone, Copy, Debug)]
pub struct ConnectionLimits {
    pub total: usize,
    pub per_peer: usize,
}

impl ConnectionLimits {
    /// Caps for a daemon allowed `max` connections (`--max-connections`),
    /// within a file-descriptor limit of `nofile`: at most half of the
    /// descriptors go to TCP peers.
    pub fn new(max: usize, nofile: u64) -> ConnectionLimits {
        let total = max.min((nofile / 2) as usize).max(1);
        ConnectionLimits { total, per_peer: (total / 4).max(1) }
    }
}

/// At most one log line of a kind per [`LOG_EVERY`]: a client that fails
/// on purpose, thousands of times a second, cannot fill the log.
#[derive(Default)]
pub struct LogLimit {
    last: Mutex<Option<Instant>>,
    held_back: AtomicU64,
}

impl LogLimit {
    /// Whether a line may be written now: `Some(lines held back since the
    /// last one written)`, or `None` (this one is held back and counted).
    pub fn allow(&self) -> Option<u64> {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if last.is_none_or(|t| t.elapsed() >= LOG_EVERY) {
            *last = Some(Instant::now());
            Some(self.held_back.swap(0, Ordering::Relaxed))
        } else {
            self.held_back.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

/// Counts shared by the listener and its connections.
#[derive(Default)]
pub struct Counters {
    /// Connections refused (over a cap).
    pub refused: AtomicU64,
    /// Accept errors waited out (no descriptors, no memory).
    pub accept_backoffs: AtomicU64,
    /// TLS handshakes that failed or timed out (`tls.rs`).
    pub tls_handshake_failures: AtomicU64,
    /// The log lines of failed handshakes.
    pub handshake_log: LogLimit,
    open: Mutex<(usize, HashMap<IpAddr, usize>)>,
    refusal_log: LogLimit,
}

impl Counters {
    /// For `stats --json`.
    pub fn counters(&self) -> [(&'static str, u64, nvlinkd_core::stats::Kind); 4] {
        use nvlinkd_core::stats::Kind::{Counter, Gauge};
        let open = self.open.lock().unwrap_or_else(|p| p.into_inner()).0 as u64;
        [
            ("tcp_connections", open, Gauge),
            ("tcp_connections_refused", self.refused.load(Ordering::Relaxed), Counter),
            ("tcp_accept_backoffs", self.accept_backoffs.load(Ordering::Relaxed), Counter),
            ("tls_handshake_failures", self.tls_handshake_failures.load(Ordering::Relaxed), Counter),
        ]
    }

    fn log_refusal(&self, why: &str) {
        if self.refusal_log.allow().is_some() {
            warn!(
                refused = self.refused.load(Ordering::Relaxed),
                accept_backoffs = self.accept_backoffs.load(Ordering::Relaxed),
                "TCP connections refused: {why} (logged at most every {}s)",
                LOG_EVERY.as_secs()
            );
        }
    }
}

/// One admitted connection; its slot is given back when it is dropped.
pub struct Guarded {
    stream: TcpStream,
    peer: Option<IpAddr>,
    counters: Arc<Counters>,
}

impl Drop for Guarded {
    fn drop(&mut self) {
        let mut open = self.counters.open.lock().unwrap_or_else(|p| p.into_inner());
        open.0 = open.0.saturating_sub(1);
        if let Some(ip) = self.peer {
            if let Some(n) = open.1.get_mut(&ip) {
                *n -= 1;
                if *n == 0 {
                    open.1.remove(&ip);
                }
            }
        }
    }
}

impl Guarded {
    /// The peer's address and port.
    pub fn peer_addr(&self) -> Option<std::net::SocketAddr> {
        self.stream.peer_addr().ok()
    }
}

impl Connected for Guarded {
    type ConnectInfo = TcpConnectInfo;
    fn connect_info(&self) -> TcpConnectInfo {
        self.stream.connect_info()
    }
}

impl AsyncRead for Guarded {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Guarded {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// The listener's admitted connections, as a stream for tonic's
/// `serve_with_incoming_shutdown` (accepted on a task of their own).
pub fn guarded(
    listener: TcpListener,
    limits: ConnectionLimits,
    counters: Arc<Counters>,
) -> impl tokio_stream::Stream<Item = std::io::Result<Guarded>> {
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    tokio::spawn(async move {
        let mut backoff = Duration::from_millis(10);
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(a) => {
                    backoff = Duration::from_millis(10);
                    a
                }
                Err(e) if out_of_resources(&e) => {
                    counters.accept_backoffs.fetch_add(1, Ordering::Relaxed);
                    counters.log_refusal(&format!("accept failed ({e}); waiting {}ms", backoff.as_millis()));
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                    continue;
                }
                // A peer gone before it was accepted, or the like: next.
                Err(_) => continue,
            };
            let ip = peer.ip();
            let admitted = {
                let mut open = counters.open.lock().unwrap_or_else(|p| p.into_inner());
                let mine = open.1.get(&ip).copied().unwrap_or(0);
                if open.0 >= limits.total {
                    Err("too many connections")
                } else if mine >= limits.per_peer {
                    Err("too many connections from one address")
                } else {
                    open.0 += 1;
                    *open.1.entry(ip).or_default() += 1;
                    Ok(())
                }
            };
            if let Err(why) = admitted {
                counters.refused.fetch_add(1, Ordering::Relaxed);
                counters.log_refusal(why);
                drop(stream);
                continue;
            }
            let _ = stream.set_nodelay(true);
            let g = Guarded { stream, peer: Some(ip), counters: counters.clone() };
            if tx.send(Ok(g)).await.is_err() {
                return;
            }
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

/// Errors of `accept` that say the process or system ran out of something:
/// retrying at once cannot succeed.
fn out_of_resources(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM))
}

/// Raise the soft limit of open files to the hard one (a daemon serving a
/// farm needs more than the usual 1024); returns the limit in force.
pub fn raise_fd_limit() -> u64 {
    let mut l = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit with a valid, initialised struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) != 0 {
            return 1024;
        }
        if l.rlim_cur < l.rlim_max {
            let raised = libc::rlimit { rlim_cur: l.rlim_max, rlim_max: l.rlim_max };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                l.rlim_cur = l.rlim_max;
            }
        }
    }
    l.rlim_cur
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_stay_within_half_the_descriptors() {
        let l = ConnectionLimits::new(512, 1024);
        assert_eq!((l.total, l.per_peer), (512, 128));
        let l = ConnectionLimits::new(512, 256);
        assert_eq!((l.total, l.per_peer), (128, 32));
        let l = ConnectionLimits::new(4096, 1 << 20);
        assert_eq!(l.total, 4096);
        assert_eq!(ConnectionLimits::new(1, 1).per_peer, 1);
    }

    #[test]
    fn running_out_of_descriptors_is_waited_out() {
        for code in [libc::EMFILE, libc::ENFILE, libc::ENOBUFS, libc::ENOMEM] {
            assert!(out_of_resources(&std::io::Error::from_raw_os_error(code)));
        }
        assert!(!out_of_resources(&std::io::Error::from_raw_os_error(libc::ECONNABORTED)));
    }
}
