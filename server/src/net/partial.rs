//! Bytes of remote callers' gRPC messages received in part, bounded.
//!
//! tonic gathers a message's bytes until it is whole (up to the 4 MiB message
//! bound) and releases HTTP/2 flow-control window as it copies them, so the
//! window does not bound what sits in its buffers: an authenticated client
//! that opens many streams and sends 4 MiB less a few bytes on each made the
//! daemon hold 1 GB with 16 connections (and 32 GiB at the connection cap).
//!
//! Every request body of the TCP listener passes through [`Budgeted`], which
//! follows the gRPC framing (a 5-byte prefix with the length, then the
//! message) and holds, from one [`PartialMessages`] budget, as many bytes as
//! the message received in part has: daemon-wide at most [`PartialMessages::max`],
//! for one caller at most half of that (its token, else its client
//! certificate, else its address; a call without a valid token never has
//! its body read, and the health service, which needs none, takes messages
//! of at most [`HEALTH_MESSAGE_BYTES`]). A message that does not fit ends
//! its stream with `RESOURCE_EXHAUSTED` (the shim tries another daemon or runs
//! the real nvlink); its bytes and the stream's reservation are dropped. A
//! whole message is the link's from then on, bounded elsewhere
//! (`link/admission.rs`, `--max-reply-memory`). The unix socket is not
//! budgeted: its peers are the daemon's own user.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use http_body::{Body, Frame, SizeHint};
use nvlinkd_core::stats::Kind;
use tonic::Status;
use tracing::{debug, warn};

use crate::net::incoming::{peer_group, LogLimit, LOG_EVERY};

/// The budget of bytes of messages received in part (see the module docs).
pub struct PartialMessages {
    /// Bytes daemon-wide.
    pub max: u64,
    /// Bytes of one caller ([`Who`]).
    pub per_peer: u64,
    held: AtomicU64,
    peers: Mutex<HashMap<Who, u64>>,
    refused: AtomicU64,
    refusal_log: LogLimit,
}

impl PartialMessages {
    /// `max` bytes daemon-wide (at least one full message), half per address.
    pub fn new(max: u64) -> Arc<PartialMessages> {
        let max = max.max(FULL_MESSAGE);
        Arc::new(PartialMessages {
            max,
            per_peer: (max / 2).max(FULL_MESSAGE),
            held: AtomicU64::new(0),
            peers: Mutex::new(HashMap::new()),
            refused: AtomicU64::new(0),
            refusal_log: LogLimit::default(),
        })
    }

    /// Take `n` more bytes for `peer`: false (nothing taken) past either bound.
    fn take(&self, peer: Option<Who>, n: u64) -> bool {
        let mut peers = self.peers.lock().unwrap_or_else(|p| p.into_inner());
        let mine = peer.map_or(0, |p| peers.get(&p).copied().unwrap_or(0));
        let held = self.held.load(Ordering::Relaxed);
        if held + n > self.max || (peer.is_some() && mine + n > self.per_peer) {
            return false;
        }
        self.held.fetch_add(n, Ordering::Relaxed);
        if let Some(p) = peer {
            *peers.entry(p).or_default() += n;
        }
        true
    }

    /// Give back `n` bytes of `peer`'s.
    fn give(&self, peer: Option<Who>, n: u64) {
        if n == 0 {
            return;
        }
        let mut peers = self.peers.lock().unwrap_or_else(|p| p.into_inner());
        self.held.fetch_sub(n, Ordering::Relaxed);
        if let Some(p) = peer {
            if let Some(mine) = peers.get_mut(&p) {
                *mine -= n;
                if *mine == 0 {
                    peers.remove(&p);
                }
            }
        }
    }

    fn refuse(&self, address: Option<std::net::IpAddr>) -> Status {
        self.refused.fetch_add(1, Ordering::Relaxed);
        let peer = address.map(|p| p.to_string()).unwrap_or_default();
        match self.refusal_log.allow() {
            Some(suppressed) => warn!(
                %peer,
                suppressed,
                max = self.max,
                per_peer = self.per_peer,
                "a remote stream ended: the daemon holds as many bytes of messages received in part as it may \
                 (logged at most every {}s; suppressed: refusals not logged since the last line)",
                LOG_EVERY.as_secs()
            ),
            None => debug!(%peer, "a remote stream ended: partial messages' budget"),
        }
        Status::resource_exhausted(
            "nvlinkd holds as many bytes of messages received in part as it may; run this link elsewhere",
        )
    }

    /// For `stats --json`.
    pub fn counters(&self) -> [(&'static str, u64, Kind); 2] {
        [
            ("partial_message_bytes", self.held.load(Ordering::Relaxed), Kind::Gauge),
            ("partial_messages_refused", self.refused.load(Ordering::Relaxed), Kind::Counter),
        ]
    }
}

/// Largest message the health service takes (its requests are a few bytes).
pub const HEALTH_MESSAGE_BYTES: usize = 1024;

/// Whom a budget counts bytes against: a digest of the call's bearer token,
/// else of its client certificate, else of its address (an IPv6 /64 as one).
pub type Who = [u8; 32];

/// [`Who`] of a call: its `authorization` header, its client certificate
/// (DER), its peer address.
pub fn who(authorization: Option<&str>, certificate: Option<&[u8]>, address: Option<std::net::IpAddr>) -> Option<Who> {
    let tagged = |tag: &[u8], bytes: &[u8]| *blake3::Hasher::new().update(tag).update(bytes).finalize().as_bytes();
    // The token as the gate reads it (`Bearer` however spaced and cased).
    if let Some(token) = authorization.and_then(crate::net::auth::bearer) {
        return Some(tagged(b"token\0", token.as_bytes()));
    }
    if let Some(c) = certificate {
        return Some(tagged(b"certificate\0", c));
    }
    address.map(|a| tagged(b"address\0", peer_group(a).to_string().as_bytes()))
}

/// One whole message, its prefix included.
const FULL_MESSAGE: u64 = nvlinkd_proto::MAX_MESSAGE_BYTES as u64 + PREFIX as u64;

/// The gRPC message prefix: a compression flag and a big-endian length.
const PREFIX: usize = 5;

/// Where a body is in the gRPC framing.
#[derive(Default)]
struct Framing {
    prefix: [u8; PREFIX],
    /// Bytes of the prefix seen (0: between messages).
    prefix_seen: usize,
    /// The message's declared length, once its prefix is whole.
    length: u64,
    /// Bytes of the message seen after its prefix.
    seen: u64,
}

impl Framing {
    /// Follow `data`; the bytes of the message now received in part.
    fn follow(&mut self, mut data: &[u8]) -> u64 {
        while !data.is_empty() {
            if self.prefix_seen < PREFIX {
                let n = (PREFIX - self.prefix_seen).min(data.len());
                self.prefix[self.prefix_seen..self.prefix_seen + n].copy_from_slice(&data[..n]);
                self.prefix_seen += n;
                data = &data[n..];
                if self.prefix_seen == PREFIX {
                    let p = self.prefix;
                    self.length = u64::from(u32::from_be_bytes([p[1], p[2], p[3], p[4]]));
                    self.seen = 0;
                }
            } else {
                let n = (self.length - self.seen).min(data.len() as u64);
                self.seen += n;
                data = &data[n as usize..];
            }
            if self.prefix_seen == PREFIX && self.seen == self.length {
                self.prefix_seen = 0;
            }
        }
        match self.prefix_seen {
            0 => 0,
            p if p < PREFIX => p as u64,
            _ => PREFIX as u64 + self.seen,
        }
    }
}

/// A request body whose message received in part holds bytes of a
/// [`PartialMessages`] budget (see the module docs).
pub struct Budgeted<B> {
    inner: B,
    budget: Arc<PartialMessages>,
    peer: Option<Who>,
    address: Option<std::net::IpAddr>,
    framing: Framing,
    held: u64,
    failed: bool,
}

impl<B> Budgeted<B> {
    /// `peer`: whom its bytes count against; `address`: for the log.
    pub fn new(
        inner: B,
        budget: Arc<PartialMessages>,
        peer: Option<Who>,
        address: Option<std::net::IpAddr>,
    ) -> Budgeted<B> {
        Budgeted { inner, budget, peer, address, framing: Framing::default(), held: 0, failed: false }
    }
}

impl<B> Drop for Budgeted<B> {
    fn drop(&mut self) {
        self.budget.give(self.peer, self.held);
    }
}

impl<B> Body for Budgeted<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        if this.failed {
            return Poll::Ready(None);
        }
        let frame = match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => frame,
            Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => return Poll::Ready(None),
            Poll::Pending => return Poll::Pending,
        };
        if let Some(data) = frame.data_ref() {
            let partial = this.framing.follow(data.chunk());
            if partial > this.held {
                if !this.budget.take(this.peer, partial - this.held) {
                    this.budget.give(this.peer, this.held);
                    this.held = 0;
                    this.failed = true;
                    return Poll::Ready(Some(Err(Box::new(this.budget.refuse(this.address)))));
                }
            } else {
                this.budget.give(this.peer, this.held - partial);
            }
            this.held = partial;
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.failed || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(len: usize) -> Vec<u8> {
        let mut m = vec![0u8];
        m.extend((len as u32).to_be_bytes());
        m.extend(std::iter::repeat_n(7u8, len));
        m
    }

    #[test]
    fn framing_counts_the_message_received_in_part() {
        let mut f = Framing::default();
        let two: Vec<u8> = [message(10), message(0), message(20)].concat();
        assert_eq!(f.follow(&two[..3]), 3, "a prefix in part");
        assert_eq!(f.follow(&two[3..9]), 9);
        assert_eq!(f.follow(&two[9..15]), 0, "the first message whole");
        assert_eq!(f.follow(&two[15..30]), 10, "the empty message whole, the third in part");
        assert_eq!(f.follow(&two[30..]), 0);
        assert_eq!(f.follow(&[0, 0]), 2);
    }

    #[test]
    fn the_budget_holds_daemon_wide_and_per_caller() {
        let b = PartialMessages::new(4 * FULL_MESSAGE);
        let (p, q, r) = (Some([1; 32]), Some([2; 32]), Some([3; 32]));
        assert!(b.take(p, 2 * FULL_MESSAGE));
        assert!(!b.take(p, 1), "past one caller's half");
        assert!(b.take(q, 2 * FULL_MESSAGE));
        assert!(!b.take(r, 1), "past the daemon-wide bound");
        b.give(p, FULL_MESSAGE);
        assert!(b.take(r, FULL_MESSAGE));
        b.give(p, FULL_MESSAGE);
        b.give(q, 2 * FULL_MESSAGE);
        b.give(r, FULL_MESSAGE);
        assert_eq!(b.counters()[0].1, 0);
        assert!(b.peers.lock().unwrap().is_empty());
    }
}

#[cfg(test)]
mod who {
    use super::*;

    #[test]
    fn a_token_outweighs_a_certificate_and_an_address_counts_by_its_64() {
        let a = |s: &str| Some(s.parse::<std::net::IpAddr>().unwrap());
        assert_eq!(who(Some("Bearer x"), Some(b"cert"), a("10.0.0.1")), who(Some("Bearer x"), None, a("10.0.0.2")));
        assert_eq!(
            who(Some("Bearer x"), None, None),
            who(Some(" bearer    x "), None, None),
            "one token, spelled twice"
        );
        assert_ne!(who(Some("Bearer x"), None, None), who(Some("Bearer y"), None, None));
        assert_eq!(who(None, Some(b"cert"), a("10.0.0.1")), who(None, Some(b"cert"), a("10.0.0.9")));
        assert_eq!(who(None, None, a("2001:db8:1:2::1")), who(None, None, a("2001:db8:1:2:ff::9")));
        assert_ne!(who(None, None, a("10.0.0.1")), who(None, None, a("10.0.0.2")));
        assert_eq!(who(None, None, None), None);
    }
}
