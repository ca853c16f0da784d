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
//! - A connection that makes no authenticated call within [`AUTH_TIMEOUT`]
//!   of its TLS handshake is closed, and so is one with no call open for
//!   [`IDLE_TIMEOUT`] (shims reconnect): a client that holds connections open
//!   without using them cannot keep remote shims out. The service tells each
//!   connection what it does ([`Connection`], found by its addresses); the
//!   connection's reads fail once a deadline passes, which closes it.
//! - One "address" of the per-address cap is an IPv4 address or an IPv6 /64
//!   (one host usually has a whole /64 to connect from).
//! - A quarter of the slots ([`ConnectionLimits::reserved`]) is kept for
//!   addresses that made an authenticated call within [`KNOWN_FOR`]: a client
//!   that keeps reconnecting from a few addresses without ever authenticating
//!   takes the other slots only, and token holders who linked lately still
//!   get in. While more than half of those other slots are taken, a new
//!   connection from an address not known so has [`HURRIED_TIMEOUT`] for its
//!   handshake and as long again for its first authenticated call.
//! - Refusals are logged at most once per [`LOG_EVERY`], with counts; so are
//!   failed TLS handshakes, refused tokens and connections closed for making
//!   no authenticated call ([`LogLimit`]), with the peer's address.

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tonic::transport::server::{Connected, TcpConnectInfo};
use tracing::{debug, warn};

/// Most refusal lines in the log: one per this period.
pub const LOG_EVERY: Duration = Duration::from_secs(10);
/// How long a TLS handshake may take.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long after its TLS handshake a connection may go without an
/// authenticated call (a shim makes its call at once).
pub const AUTH_TIMEOUT: Duration = Duration::from_secs(10);
/// Under pressure (more than half of the unreserved slots taken), the
/// handshake's time and then the first call's for a connection from an
/// address with no recent authenticated call (a shim prepares its request
/// before it connects, and calls at once).
pub const HURRIED_TIMEOUT: Duration = Duration::from_secs(1);
/// How long an address that made an authenticated call may take the
/// reserved slots after it.
pub const KNOWN_FOR: Duration = Duration::from_secs(3600);
/// Most addresses remembered as known (only authenticated callers add one).
const KNOWN_MAX: usize = 4096;
/// How long a connection may stay with no call open.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(300);
/// HTTP/2 streams one TCP connection may have open at once (a shim uses one
/// per link).
pub const MAX_STREAMS: u32 = 16;
/// HTTP/2 pings from the daemon on a quiet connection, and how long an answer
/// may take: a peer that vanished is noticed without waiting for the idle
/// timeout.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// Connection caps.
#[derive(Clone, Copy, Debug)]
pub struct ConnectionLimits {
    pub total: usize,
    pub per_peer: usize,
    /// Of `total`, the slots only known addresses (an authenticated call
    /// within [`KNOWN_FOR`]) may take.
    pub reserved: usize,
}

impl ConnectionLimits {
    /// Caps for a daemon allowed `max` connections (`--max-connections`),
    /// within a file-descriptor limit of `nofile`: at most half of the
    /// descriptors go to TCP peers.
    pub fn new(max: usize, nofile: u64) -> ConnectionLimits {
        let total = max.min((nofile / 2) as usize).max(1);
        ConnectionLimits { total, per_peer: (total / 4).max(1), reserved: total / 4 }
    }

    /// Whether a new connection is admitted, with `open` connections open,
    /// `mine` of them from its address, which is `known` or not; and whether
    /// it is hurried ([`HURRIED_TIMEOUT`]).
    fn admit(&self, open: usize, mine: usize, known: bool) -> Result<bool, Refusal> {
        let unreserved = self.total - self.reserved;
        if open >= self.total {
            Err(Refusal::Total)
        } else if mine >= self.per_peer {
            Err(Refusal::PerPeer)
        } else if !known && open >= unreserved {
            Err(Refusal::Reserved)
        } else {
            Ok(!known && open >= unreserved / 2)
        }
    }
}

/// Why a connection is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Refusal {
    Total,
    PerPeer,
    /// Only reserved slots are left, and its address is not known.
    Reserved,
}

impl Refusal {
    fn why(self) -> &'static str {
        match self {
            Refusal::Total => "too many connections",
            Refusal::PerPeer => "too many connections from one address",
            Refusal::Reserved => "only the slots reserved for addresses that authenticated lately are left",
        }
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
    /// Of those, refused from an address not known, with only reserved
    /// slots left.
    pub refused_reserved: AtomicU64,
    /// Accept errors waited out (no descriptors, no memory).
    pub accept_backoffs: AtomicU64,
    /// TLS handshakes that failed or timed out (`tls.rs`).
    pub tls_handshake_failures: AtomicU64,
    /// The log lines of failed handshakes.
    pub handshake_log: LogLimit,
    /// Connections closed for making no authenticated call in time.
    pub closed_unauthenticated: AtomicU64,
    /// Connections closed for having no call open for [`IDLE_TIMEOUT`].
    pub closed_idle: AtomicU64,
    /// Open connections, and how many from each address (see [`peer_group`]).
    open: Mutex<(usize, HashMap<IpAddr, usize>)>,
    /// What each open connection does, by its (local, peer) addresses.
    live: Mutex<HashMap<(SocketAddr, SocketAddr), Arc<Connection>>>,
    /// Address groups that made an authenticated call, and when they last did.
    known: Mutex<HashMap<IpAddr, Instant>>,
    refusal_log: LogLimit,
    unauthenticated_log: LogLimit,
}

impl Counters {
    /// For `stats --json`.
    pub fn counters(&self) -> [(&'static str, u64, nvlinkd_core::stats::Kind); 7] {
        use nvlinkd_core::stats::Kind::{Counter, Gauge};
        let open = self.open.lock().unwrap_or_else(|p| p.into_inner()).0 as u64;
        let r = Ordering::Relaxed;
        [
            ("tcp_connections", open, Gauge),
            ("tcp_connections_refused", self.refused.load(r), Counter),
            ("tcp_connections_refused_reserved", self.refused_reserved.load(r), Counter),
            ("tcp_accept_backoffs", self.accept_backoffs.load(r), Counter),
            ("tls_handshake_failures", self.tls_handshake_failures.load(r), Counter),
            ("tcp_closed_unauthenticated", self.closed_unauthenticated.load(r), Counter),
            ("tcp_closed_idle", self.closed_idle.load(r), Counter),
        ]
    }

    /// The open connection with these addresses (a call's `TcpConnectInfo`).
    pub fn connection(&self, local: Option<SocketAddr>, peer: Option<SocketAddr>) -> Option<Arc<Connection>> {
        let key = (local?, peer?);
        self.live.lock().unwrap_or_else(|p| p.into_inner()).get(&key).cloned()
    }

    /// A call on a connection from `peer` passed authentication: its address
    /// may take the reserved slots for [`KNOWN_FOR`].
    pub fn known(&self, peer: IpAddr) {
        let now = Instant::now();
        let mut known = self.known.lock().unwrap_or_else(|p| p.into_inner());
        if known.len() >= KNOWN_MAX {
            known.retain(|_, at| now.duration_since(*at) < KNOWN_FOR);
            if known.len() >= KNOWN_MAX {
                if let Some(oldest) = known.iter().min_by_key(|(_, at)| **at).map(|(ip, _)| *ip) {
                    known.remove(&oldest);
                }
            }
        }
        known.insert(peer_group(peer), now);
    }

    /// Whether the address group `ip` made an authenticated call lately.
    fn is_known(&self, ip: IpAddr, now: Instant) -> bool {
        let known = self.known.lock().unwrap_or_else(|p| p.into_inner());
        known.get(&ip).is_some_and(|at| now.saturating_duration_since(*at) < KNOWN_FOR)
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

/// What one connection does, as the service tells it: whether it made an
/// authenticated call, how many calls it has open, when it last began or
/// ended one. Its deadlines follow ([`Connection::deadline`]).
pub struct Connection {
    state: Mutex<Use>,
}

struct Use {
    authenticated: bool,
    /// Accepted under pressure from an address not known: [`HURRIED_TIMEOUT`]
    /// for its handshake and its first call.
    hurried: bool,
    /// Without an authenticated call by then, the connection is closed.
    auth_by: Instant,
    /// Calls open (link streams).
    open: usize,
    /// When a call last began or ended.
    last: Instant,
}

/// Why a connection is closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expiry {
    /// No authenticated call within [`AUTH_TIMEOUT`] of the handshake.
    Unauthenticated,
    /// No call open for [`IDLE_TIMEOUT`].
    Idle,
}

/// When a connection is closed unless it is used meanwhile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Deadline {
    At(Instant, Expiry),
    /// A call is open: not while it is.
    Busy,
}

impl Connection {
    /// A connection accepted at `now`: it has the handshake's deadline and
    /// [`AUTH_TIMEOUT`] after it for its first authenticated call, or
    /// [`HURRIED_TIMEOUT`] for each where `hurried`.
    pub fn new(now: Instant, hurried: bool) -> Connection {
        let (handshake, auth) = timeouts(hurried);
        Connection {
            state: Mutex::new(Use {
                authenticated: false,
                hurried,
                auth_by: now + handshake + auth,
                open: 0,
                last: now,
            }),
        }
    }

    /// A connection of the unix socket (no handshake): it must make a call
    /// from the daemon's user by `by`.
    pub fn local(by: Instant) -> Connection {
        let now = Instant::now();
        Connection { state: Mutex::new(Use { authenticated: false, hurried: false, auth_by: by, open: 0, last: now }) }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, Use> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How long its TLS handshake may take.
    pub fn handshake_timeout(&self) -> Duration {
        timeouts(self.state().hurried).0
    }

    /// The TLS handshake is done: [`AUTH_TIMEOUT`] from now (or
    /// [`HURRIED_TIMEOUT`]) for an authenticated call.
    pub fn handshaken(&self) {
        let mut s = self.state();
        s.auth_by = s.auth_by.min(Instant::now() + timeouts(s.hurried).1);
    }

    /// A call passed authentication.
    pub fn authenticated(&self) {
        let mut s = self.state();
        s.authenticated = true;
        s.last = Instant::now();
    }

    /// A call (a link's stream) is open until the guard is dropped.
    pub fn call(self: &Arc<Self>) -> Call {
        let mut s = self.state();
        s.open += 1;
        s.last = Instant::now();
        Call(self.clone())
    }

    /// When the connection is to be closed, as it stands; an idle period of `idle`.
    pub fn deadline(&self, idle: Duration) -> Deadline {
        let s = self.state();
        if !s.authenticated {
            Deadline::At(s.auth_by, Expiry::Unauthenticated)
        } else if s.open > 0 {
            Deadline::Busy
        } else {
            Deadline::At(s.last + idle, Expiry::Idle)
        }
    }
}

/// A connection's time for its handshake, and then for its first
/// authenticated call.
fn timeouts(hurried: bool) -> (Duration, Duration) {
    if hurried {
        (HURRIED_TIMEOUT, HURRIED_TIMEOUT)
    } else {
        (HANDSHAKE_TIMEOUT, AUTH_TIMEOUT)
    }
}

/// An open call of a connection ([`Connection::call`]).
pub struct Call(Arc<Connection>);

impl Drop for Call {
    fn drop(&mut self) {
        let mut s = self.0.state();
        s.open = s.open.saturating_sub(1);
        s.last = Instant::now();
    }
}

/// One admitted connection; its slot is given back when it is dropped. Its
/// reads fail once its [`Connection`]'s deadline passes, which closes it.
pub struct Guarded {
    stream: TcpStream,
    /// Its address group (see [`peer_group`]).
    peer: Option<IpAddr>,
    addrs: Option<(SocketAddr, SocketAddr)>,
    counters: Arc<Counters>,
    connection: Arc<Connection>,
    timer: Pin<Box<tokio::time::Sleep>>,
    /// Why it was closed, once it was.
    expired: Option<Expiry>,
}

impl Drop for Guarded {
    fn drop(&mut self) {
        if let Some(addrs) = self.addrs {
            self.counters.live.lock().unwrap_or_else(|p| p.into_inner()).remove(&addrs);
        }
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

    /// What the connection does (the TLS handshake reports its end here).
    pub fn connection(&self) -> &Arc<Connection> {
        &self.connection
    }

    /// The error that closes the connection once its deadline has passed;
    /// until then, the timer is set to wake its reader at the deadline.
    fn check(&mut self, cx: &mut Context<'_>) -> Option<std::io::Error> {
        let closed = |why: Expiry| {
            let what = match why {
                Expiry::Unauthenticated => "no authenticated call in time",
                Expiry::Idle => "idle",
            };
            std::io::Error::new(std::io::ErrorKind::TimedOut, what)
        };
        if let Some(why) = self.expired {
            return Some(closed(why));
        }
        let now = Instant::now();
        let wake = match self.connection.deadline(IDLE_TIMEOUT) {
            Deadline::At(at, why) if at <= now => {
                self.expired = Some(why);
                let within = timeouts(self.connection.state().hurried).1;
                self.counters.closed(why, self.addrs.map(|a| a.1), within);
                return Some(closed(why));
            }
            Deadline::At(at, _) => tokio::time::Instant::from_std(at),
            // Looked at again later: a call may end without a read here.
            Deadline::Busy if self.timer.deadline() > tokio::time::Instant::from_std(now) => self.timer.deadline(),
            Deadline::Busy => tokio::time::Instant::from_std(now + IDLE_TIMEOUT),
        };
        if self.timer.deadline() != wake {
            self.timer.as_mut().reset(wake);
        }
        if self.timer.as_mut().poll(cx).is_ready() {
            // Due now: the next read looks again.
            cx.waker().wake_by_ref();
        }
        None
    }
}

impl Counters {
    /// `within`: the time it had for its first authenticated call.
    fn closed(&self, why: Expiry, peer: Option<SocketAddr>, within: Duration) {
        let peer = peer.map(|p| p.to_string()).unwrap_or_else(|| "?".into());
        match why {
            Expiry::Unauthenticated => {
                self.closed_unauthenticated.fetch_add(1, Ordering::Relaxed);
                match self.unauthenticated_log.allow() {
                    Some(suppressed) => warn!(
                        %peer,
                        suppressed,
                        "TCP connection closed: no authenticated call within {}s of its TLS handshake (logged at \
                         most every {}s; suppressed: closings not logged since the last line)",
                        within.as_secs(),
                        LOG_EVERY.as_secs()
                    ),
                    None => debug!(%peer, "TCP connection closed: no authenticated call in time"),
                }
            }
            Expiry::Idle => {
                self.closed_idle.fetch_add(1, Ordering::Relaxed);
                debug!(%peer, idle_s = IDLE_TIMEOUT.as_secs(), "TCP connection closed: idle");
            }
        }
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
        if let Some(e) = self.check(cx) {
            return Poll::Ready(Err(e));
        }
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
            let ip = peer_group(peer.ip());
            let now = Instant::now();
            let known = counters.is_known(ip, now);
            let admitted = {
                let mut open = counters.open.lock().unwrap_or_else(|p| p.into_inner());
                let mine = open.1.get(&ip).copied().unwrap_or(0);
                let admitted = limits.admit(open.0, mine, known);
                if admitted.is_ok() {
                    open.0 += 1;
                    *open.1.entry(ip).or_default() += 1;
                }
                admitted
            };
            let hurried = match admitted {
                Ok(hurried) => hurried,
                Err(why) => {
                    counters.refused.fetch_add(1, Ordering::Relaxed);
                    if why == Refusal::Reserved {
                        counters.refused_reserved.fetch_add(1, Ordering::Relaxed);
                    }
                    counters.log_refusal(why.why());
                    drop(stream);
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            let connection = Arc::new(Connection::new(now, hurried));
            let addrs = stream.local_addr().ok().map(|local| (local, peer));
            if let Some(addrs) = addrs {
                counters.live.lock().unwrap_or_else(|p| p.into_inner()).insert(addrs, connection.clone());
            }
            let timer = Box::pin(tokio::time::sleep_until(tokio::time::Instant::from_std(now + IDLE_TIMEOUT)));
            let g =
                Guarded { stream, peer: Some(ip), addrs, counters: counters.clone(), connection, timer, expired: None };
            if tx.send(Ok(g)).await.is_err() {
                return;
            }
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

/// The group of addresses one per-address cap counts: an IPv4 address (also
/// as an IPv4-mapped IPv6 one), or the /64 of an IPv6 address.
pub fn peer_group(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
    }
}

/// Errors of `accept` that say the process or system ran out of something:
/// retrying at once cannot succeed.
pub fn out_of_resources(e: &std::io::Error) -> bool {
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
        assert_eq!((l.total, l.per_peer, l.reserved), (512, 128, 128));
        let l = ConnectionLimits::new(512, 256);
        assert_eq!((l.total, l.per_peer), (128, 32));
        let l = ConnectionLimits::new(4096, 1 << 20);
        assert_eq!(l.total, 4096);
        assert_eq!(ConnectionLimits::new(1, 1).per_peer, 1);
        assert_eq!(ConnectionLimits::new(1, 1).reserved, 0);
    }

    #[test]
    fn the_last_quarter_is_for_addresses_that_authenticated_lately() {
        let l = ConnectionLimits::new(16, 1 << 20);
        assert_eq!((l.total, l.per_peer, l.reserved), (16, 4, 4));
        // Unhurried until half of the 12 unreserved slots are taken.
        assert_eq!(l.admit(5, 0, false), Ok(false));
        assert_eq!(l.admit(6, 0, false), Ok(true));
        assert_eq!(l.admit(6, 0, true), Ok(false), "a known address is never hurried");
        assert_eq!(l.admit(12, 0, false), Err(Refusal::Reserved));
        assert_eq!(l.admit(12, 0, true), Ok(false));
        assert_eq!(l.admit(15, 3, true), Ok(false));
        assert_eq!(l.admit(15, 4, true), Err(Refusal::PerPeer), "the per-address cap holds for known ones");
        assert_eq!(l.admit(16, 0, true), Err(Refusal::Total));
        let c = Counters::default();
        let (a, b): (IpAddr, IpAddr) = ("192.0.2.7".parse().unwrap(), "2001:db8:1:2::1".parse().unwrap());
        assert!(!c.is_known(a, Instant::now()));
        c.known(a);
        c.known(b);
        assert!(c.is_known(a, Instant::now()));
        assert!(c.is_known(peer_group("2001:db8:1:2::9".parse().unwrap()), Instant::now()), "by its /64");
        assert!(!c.is_known(a, Instant::now() + KNOWN_FOR), "only lately");
    }

    #[test]
    fn a_hurried_connection_has_a_second_for_each_step() {
        let t0 = Instant::now();
        let c = Connection::new(t0, true);
        assert_eq!(c.handshake_timeout(), HURRIED_TIMEOUT);
        let Deadline::At(at, Expiry::Unauthenticated) = c.deadline(IDLE_TIMEOUT) else { panic!() };
        assert_eq!(at, t0 + 2 * HURRIED_TIMEOUT);
        c.handshaken();
        let Deadline::At(at, _) = c.deadline(IDLE_TIMEOUT) else { panic!() };
        assert!(at <= Instant::now() + HURRIED_TIMEOUT);
        assert_eq!(Connection::new(t0, false).handshake_timeout(), HANDSHAKE_TIMEOUT);
    }

    #[test]
    fn an_ipv6_peer_counts_by_its_64() {
        let g = |a: &str| peer_group(a.parse().unwrap()).to_string();
        assert_eq!(g("2001:db8:1:2:aaaa:bbbb:cccc:dddd"), "2001:db8:1:2::");
        assert_eq!(g("2001:db8:1:2::1"), g("2001:db8:1:2:ffff::9"));
        assert_ne!(g("2001:db8:1:2::1"), g("2001:db8:1:3::1"));
        assert_eq!(g("::ffff:192.0.2.7"), "192.0.2.7");
        assert_eq!(g("192.0.2.7"), "192.0.2.7");
    }

    #[test]
    fn a_connection_is_closed_without_an_authenticated_call_or_when_idle() {
        let t0 = Instant::now();
        let c = Arc::new(Connection::new(t0, false));
        let Deadline::At(at, Expiry::Unauthenticated) = c.deadline(IDLE_TIMEOUT) else { panic!() };
        assert_eq!(at, t0 + HANDSHAKE_TIMEOUT + AUTH_TIMEOUT, "the handshake's time and then the call's");
        c.handshaken();
        let Deadline::At(at, Expiry::Unauthenticated) = c.deadline(IDLE_TIMEOUT) else { panic!() };
        assert!(at <= Instant::now() + AUTH_TIMEOUT);
        c.authenticated();
        let call = c.call();
        assert_eq!(c.deadline(IDLE_TIMEOUT), Deadline::Busy, "never while a call is open");
        let second = c.call();
        drop(call);
        assert_eq!(c.deadline(IDLE_TIMEOUT), Deadline::Busy);
        drop(second);
        let Deadline::At(at, Expiry::Idle) = c.deadline(IDLE_TIMEOUT) else { panic!() };
        assert!(at > Instant::now() + IDLE_TIMEOUT - Duration::from_secs(1));
    }

    #[test]
    fn running_out_of_descriptors_is_waited_out() {
        for code in [libc::EMFILE, libc::ENFILE, libc::ENOBUFS, libc::ENOMEM] {
            assert!(out_of_resources(&std::io::Error::from_raw_os_error(code)));
        }
        assert!(!out_of_resources(&std::io::Error::from_raw_os_error(libc::ECONNABORTED)));
    }
}
