//! The unix socket's connections, guarded as the TCP listener's are
//! (`incoming.rs`): a local flood of idle connections cannot take every file
//! descriptor, spin the accept loop or keep the daemon's own user out.
//!
//! - At most [`LocalLimits::total`] connections at once (a quarter of the
//!   file-descriptor limit at most, so the cache, the workers and the TCP
//!   listener keep theirs), and at most [`LocalLimits::other_uid`] from a
//!   user other than the daemon's own and root (such a caller is refused on
//!   every call: it needs a connection only to hear so). A connection beyond
//!   is closed at once.
//! - A connection that makes no call from the daemon's user (or root) within
//!   [`FIRST_CALL_TIMEOUT`] is closed ([`HURRIED_TIMEOUT`] while more than
//!   half of the slots are taken), and so is one with no call open for
//!   [`IDLE_TIMEOUT`] (a link's stream, `events` and `watch` are calls open
//!   as long as they last).
//! - An accept error for lack of descriptors or memory waits (10 ms, doubling
//!   to 1 s) instead of retrying at once.
//! - Refusals are logged at most once per [`LOG_EVERY`], with counts.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{UnixListener, UnixStream};
use tonic::transport::server::{Connected, UdsConnectInfo};
use tracing::warn;

use super::incoming::{out_of_resources, Connection, Deadline, LogLimit, HURRIED_TIMEOUT, IDLE_TIMEOUT, LOG_EVERY};

/// How long a local connection may go without a call from the daemon's user
/// (a shim calls at once).
pub const FIRST_CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Caps of the unix socket's connections.
#[derive(Clone, Copy, Debug)]
pub struct LocalLimits {
    pub total: usize,
    /// Connections from one user other than the daemon's own and root.
    pub other_uid: usize,
}

impl LocalLimits {
    /// Caps for a daemon allowed `max` connections (`--max-connections`)
    /// within a file-descriptor limit of `nofile`.
    pub fn new(max: usize, nofile: u64) -> LocalLimits {
        let total = max.min((nofile / 4) as usize).max(2);
        LocalLimits { total, other_uid: (total / 16).clamp(1, 8) }
    }
}

/// Counts of the unix socket's connections.
#[derive(Default)]
pub struct LocalCounters {
    /// Open connections: in all, and by uid.
    open: Mutex<(usize, std::collections::HashMap<u32, usize>)>,
    /// Connections refused (over a cap).
    pub refused: AtomicU64,
    /// Accept errors waited out (no descriptors, no memory).
    pub accept_backoffs: AtomicU64,
    /// Connections closed without a call in time, or idle.
    pub closed: AtomicU64,
    log: LogLimit,
}

impl LocalCounters {
    fn log(&self, why: &str) {
        if let Some(suppressed) = self.log.allow() {
            warn!(
                refused = self.refused.load(Ordering::Relaxed),
                accept_backoffs = self.accept_backoffs.load(Ordering::Relaxed),
                closed = self.closed.load(Ordering::Relaxed),
                suppressed,
                "local connections: {why} (logged at most every {}s)",
                LOG_EVERY.as_secs()
            );
        }
    }
}

/// What a call on the unix socket learns of its connection: the peer's
/// credentials, and the [`Connection`] the service reports its calls to.
#[derive(Clone)]
pub struct LocalConnectInfo {
    pub uds: UdsConnectInfo,
    pub connection: Arc<Connection>,
}

/// One admitted local connection; its slot is given back when it is
/// dropped, and its reads fail once its deadline passes, which closes it.
pub struct LocalGuarded {
    stream: UnixStream,
    uid: Option<u32>,
    counters: Arc<LocalCounters>,
    connection: Arc<Connection>,
    timer: Pin<Box<tokio::time::Sleep>>,
    expired: bool,
}

impl Drop for LocalGuarded {
    fn drop(&mut self) {
        let mut open = self.counters.open.lock().unwrap_or_else(|p| p.into_inner());
        open.0 = open.0.saturating_sub(1);
        if let Some(uid) = self.uid {
            if let Some(n) = open.1.get_mut(&uid) {
                *n -= 1;
                if *n == 0 {
                    open.1.remove(&uid);
                }
            }
        }
    }
}

impl LocalGuarded {
    /// The error that closes the connection once its deadline passed; until
    /// then the timer is set to wake its reader at the deadline.
    fn check(&mut self, cx: &mut Context<'_>) -> Option<std::io::Error> {
        let closed = || std::io::Error::new(std::io::ErrorKind::TimedOut, "no call in time, or idle");
        if self.expired {
            return Some(closed());
        }
        let now = Instant::now();
        let wake = match self.connection.deadline(IDLE_TIMEOUT) {
            Deadline::At(at, _) if at <= now => {
                self.expired = true;
                self.counters.closed.fetch_add(1, Ordering::Relaxed);
                self.counters.log("closed one with no call in time, or idle");
                return Some(closed());
            }
            Deadline::At(at, _) => tokio::time::Instant::from_std(at),
            Deadline::Busy => tokio::time::Instant::from_std(now + IDLE_TIMEOUT),
        };
        if self.timer.deadline() != wake {
            self.timer.as_mut().reset(wake);
        }
        if self.timer.as_mut().poll(cx).is_ready() {
            cx.waker().wake_by_ref();
        }
        None
    }
}

impl Connected for LocalGuarded {
    type ConnectInfo = LocalConnectInfo;
    fn connect_info(&self) -> LocalConnectInfo {
        LocalConnectInfo { uds: self.stream.connect_info(), connection: self.connection.clone() }
    }
}

impl AsyncRead for LocalGuarded {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        if let Some(e) = self.check(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for LocalGuarded {
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

/// The unix socket's admitted connections, as a stream for tonic's
/// `serve_with_incoming_shutdown` (accepted on a task of their own).
pub fn guarded(
    listener: UnixListener,
    limits: LocalLimits,
    counters: Arc<LocalCounters>,
) -> impl tokio_stream::Stream<Item = std::io::Result<LocalGuarded>> {
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    tokio::spawn(async move {
        let mut backoff = Duration::from_millis(10);
        loop {
            let stream = match listener.accept().await {
                Ok((s, _)) => {
                    backoff = Duration::from_millis(10);
                    s
                }
                Err(e) if out_of_resources(&e) => {
                    counters.accept_backoffs.fetch_add(1, Ordering::Relaxed);
                    counters.log(&format!("accept failed ({e}); waiting {}ms", backoff.as_millis()));
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                    continue;
                }
                Err(_) => continue,
            };
            let uid = stream.peer_cred().ok().map(|c| c.uid());
            let ours = uid.is_some_and(|u| u == me || u == 0);
            let hurried = {
                let mut open = counters.open.lock().unwrap_or_else(|p| p.into_inner());
                let theirs = uid.and_then(|u| open.1.get(&u).copied()).unwrap_or(0);
                if open.0 >= limits.total || (!ours && theirs >= limits.other_uid) {
                    None
                } else {
                    open.0 += 1;
                    if let Some(u) = uid {
                        *open.1.entry(u).or_default() += 1;
                    }
                    Some(open.0 > limits.total / 2)
                }
            };
            let Some(hurried) = hurried else {
                counters.refused.fetch_add(1, Ordering::Relaxed);
                let who = uid.map_or_else(|| "an unknown user".to_owned(), |u| format!("uid {u}"));
                counters.log(&format!("refused one of {who}: too many open"));
                continue;
            };
            let now = Instant::now();
            let first = if hurried { HURRIED_TIMEOUT } else { FIRST_CALL_TIMEOUT };
            let connection = Arc::new(Connection::local(now + first));
            let timer = Box::pin(tokio::time::sleep_until(tokio::time::Instant::from_std(now + first)));
            let g = LocalGuarded { stream, uid, counters: counters.clone(), connection, timer, expired: false };
            if tx.send(Ok(g)).await.is_err() {
                return;
            }
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}
