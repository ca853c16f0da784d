//! A link's files, and the link's ownership by its stream.
//!
//! A link runs on a blocking thread. In a daemon that does not share the
//! caller's filesystem, each read or stat sends a `FileRequest` to the shim and
//! waits for the matching `FileReply`, which the stream's reader task routes by
//! id ([`LinkChannel`]).
//!
//! The stream owns the link. When the shim half-closes its side, disconnects,
//! or the daemon shuts down, the reader task *closes* the channel: under the
//! same lock as every registration of a pending read, so no read can be
//! registered after the cleanup; every pending read fails at once (its sender
//! is dropped) and every later one fails before it is sent. Every wait of the
//! link thread is bounded: a reply not received within the reply timeout
//! (`--reply-timeout`) fails the read as if the shim were gone and closes the
//! channel, and sending a request waits at most as long. A link whose shim is
//! gone therefore ends within a moment and frees its thread.
//!
//! [`LinkFs`] is what the link reads through, for both a shared filesystem
//! (the daemon reads the files itself) and the stream. Over the stream, the
//! files the shim announced with its `Start` ([`announced`]) are stat'ed from
//! the announcement and read from the blob store by digest; the blobs the
//! store lacks are asked for all at once when the link starts, and waited for
//! on the runtime before the link takes a thread
//! ([`LinkFs::with_announced`]), and one whose bytes are not the announced
//! ones is refused and declines the link. The inputs read by path are asked
//! for all at once too (`prefetch`) and waited for on the link's own thread,
//! never on rayon's pool, where every link's inputs are digested and decoded:
//! a shim silent about its inputs holds no thread a local link needs (its link's
//! thread is bounded by the remote slots, `admission.rs`). It refuses reads once the
//! stream is closed, never reads a non-regular file (see `nvlinkd_core::fs`),
//! and bounds the bytes one link may read (`--max-link-input`); any of these
//! makes the link *declined*: no engine of the daemon runs it (a closed stream's
//! answer would go nowhere), and a shim still listening runs the real nvlink.
//!
//! The bytes of replies the daemon holds are bounded daemon-wide too
//! ([`ReplyMemory`], `--max-reply-memory`): one link's budget is 8 GiB, and a
//! client answering a read with a huge file grew the daemon by as much (a few
//! clients: by their sum). The room a reply's pieces are gathered in is
//! reserved as they arrive; a reply read by the link is held until the link
//! ends (the channel drops), a blob's until it is in the blob store (which
//! `--blob-mem` bounds). A piece that does not fit fails its read as too
//! large: the link is declined, like one past its own budget.

use std::collections::HashMap;
use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nvlinkd_core::fs::{self as corefs, FileIdentity, FileStat, InputFs, LocalFs};
use nvlinkd_core::request::{CwdDir, Request};
use nvlinkd_core::stats::Kind;
use nvlinkd_proto::v1::{
    file_error, file_reply, file_request, server_message, AnnouncedFile, FileReply, FileRequest, ServerMessage,
};
use tokio::sync::{mpsc, oneshot, watch};
use tonic::Status;
use tracing::{debug, warn};

use crate::blobs::{BlobStore, Claim, Digest, Flight, Landed};
use crate::net::incoming::{LogLimit, LOG_EVERY};

pub type Outbound = mpsc::Sender<Result<ServerMessage, Status>>;

/// Bytes of shims' file replies the daemon holds, all links together
/// (`--max-reply-memory`; see the module documentation).
pub struct ReplyMemory {
    max: u64,
    held: AtomicU64,
    /// Reads failed because their reply did not fit.
    refused: AtomicU64,
    refusal_log: LogLimit,
}

impl ReplyMemory {
    pub fn new(max: u64) -> Arc<ReplyMemory> {
        Arc::new(ReplyMemory {
            max,
            held: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            refusal_log: LogLimit::default(),
        })
    }

    /// Nothing reserved yet.
    fn none(self: &Arc<Self>) -> Held {
        Held { memory: self.clone(), bytes: 0 }
    }

    /// A read refused for want of room: counted, and logged at most once per
    /// [`LOG_EVERY`].
    fn refuse(&self, wanted: u64) {
        self.refused.fetch_add(1, Ordering::Relaxed);
        let held = self.held.load(Ordering::Relaxed);
        match self.refusal_log.allow() {
            Some(suppressed) => warn!(
                held,
                max = self.max,
                wanted,
                suppressed,
                "a shim's file reply refused: the daemon holds as many bytes of replies as --max-reply-memory allows; \
                 its link is left to the real nvlink (logged at most every {}s; suppressed: refusals not logged since \
                 the last line)",
                LOG_EVERY.as_secs()
            ),
            None => debug!(held, max = self.max, wanted, "a shim's file reply refused: --max-reply-memory"),
        }
    }

    /// For `stats --json`.
    pub fn counters(&self) -> [(&'static str, u64, Kind); 2] {
        [
            ("reply_memory_bytes", self.held.load(Ordering::Relaxed), Kind::Gauge),
            ("reply_memory_refused", self.refused.load(Ordering::Relaxed), Kind::Counter),
        ]
    }
}

/// Bytes reserved of a [`ReplyMemory`], given back when dropped.
struct Held {
    memory: Arc<ReplyMemory>,
    bytes: u64,
}

impl Held {
    /// Reserve `n` bytes more: false (nothing reserved) when they do not fit.
    fn grow(&mut self, n: u64) -> bool {
        let m = &self.memory;
        let fits =
            m.held.fetch_update(Ordering::AcqRel, Ordering::Acquire, |h| h.checked_add(n).filter(|t| *t <= m.max));
        if fits.is_ok() {
            self.bytes += n;
        }
        fits.is_ok()
    }

    /// Take over what `other` holds.
    fn absorb(&mut self, mut other: Held) {
        self.bytes += std::mem::take(&mut other.bytes);
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.memory.held.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

/// A reply, and the room its contents are held in.
type Reply = (FileReply, Held);

/// The link's side of its stream: pending reads by id, and whether the stream
/// still carries replies.
pub struct LinkChannel {
    state: Mutex<State>,
    closed: watch::Sender<bool>,
    tx: Outbound,
    rt: tokio::runtime::Handle,
    reply_timeout: Duration,
    /// Most bytes one file's pieces may add up to (the link's input budget).
    max_file: u64,
    /// Bytes of file contents the shim sent on this stream (read or not).
    received: AtomicU64,
    memory: Arc<ReplyMemory>,
    /// The room of the replies the link has read (held until it ends).
    kept: Mutex<Held>,
}

/// A read waiting for its reply, and the pieces of it received so far.
struct Pending {
    tx: oneshot::Sender<Reply>,
    data: Vec<u8>,
    /// The room reserved for `data` (its capacity), or for a reply in one piece.
    held: Held,
    /// Most bytes its pieces may add up to: the link's budget, or the size the
    /// shim announced for the file.
    limit: u64,
}

impl Pending {
    /// Room for a piece of `n` bytes (`last`: the reply's last one), reserved
    /// daemon-wide: false when it does not fit. Pieces are gathered in a
    /// buffer that doubles (up to the read's limit) or, where the doubled one
    /// does not fit or the piece is the last, grows to just what it needs; a
    /// reply in one piece is held as it came.
    fn room(&mut self, n: usize, last: bool) -> bool {
        if last && self.data.is_empty() {
            return self.held.grow(n as u64);
        }
        let need = self.data.len() + n;
        let cap = self.data.capacity();
        if need <= cap {
            return true;
        }
        let doubled = if last {
            need
        } else {
            need.max(cap.saturating_mul(2)).min(usize::try_from(self.limit).unwrap_or(usize::MAX)).max(need)
        };
        for want in [doubled, need] {
            if self.held.grow((want - cap) as u64) {
                self.data.reserve_exact(want - self.data.len());
                return true;
            }
        }
        false
    }
}

#[derive(Default)]
struct State {
    /// Why the stream no longer carries replies.
    closed: Option<&'static str>,
    pending: HashMap<u64, Pending>,
    next_id: u64,
}

impl LinkChannel {
    pub fn new(
        tx: Outbound,
        rt: tokio::runtime::Handle,
        reply_timeout: Duration,
        max_file: u64,
        memory: Arc<ReplyMemory>,
    ) -> Arc<Self> {
        Arc::new(LinkChannel {
            state: Mutex::new(State::default()),
            closed: watch::channel(false).0,
            tx,
            rt,
            reply_timeout,
            max_file,
            received: AtomicU64::new(0),
            kept: Mutex::new(memory.none()),
            memory,
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// No more replies will come: fail every pending read now and every later one
    /// before it is sent. Idempotent; the first reason stays.
    pub fn close(&self, why: &'static str) {
        let dropped = {
            let mut s = self.state();
            s.closed.get_or_insert(why);
            std::mem::take(&mut s.pending)
        };
        drop(dropped);
        self.closed.send_replace(true);
    }

    pub fn closed_reason(&self) -> Option<&'static str> {
        self.state().closed
    }

    /// Resolves once the channel is closed.
    pub async fn wait_closed(&self) {
        let mut rx = self.closed.subscribe();
        let _ = rx.wait_for(|c| *c).await;
    }

    /// A reply from the shim, to the read waiting for it (if any still is).
    /// The pieces of a read (`more`) are gathered up to the link's budget, in
    /// room reserved of the daemon's [`ReplyMemory`]; one piece past either
    /// answers the read "too large" (later pieces find no waiter and are
    /// dropped).
    pub fn deliver(&self, mut reply: FileReply) {
        if let Some(file_reply::Result::Data(d)) = &reply.result {
            self.received.fetch_add(d.len() as u64, Ordering::Relaxed);
        }
        let mut s = self.state();
        let Some(p) = s.pending.get_mut(&reply.id) else { return };
        if let Some(file_reply::Result::Data(d)) = &mut reply.result {
            let refusal = if p.data.len() as u64 + d.len() as u64 > p.limit {
                Some("larger than the daemon reads for one link")
            } else if !p.room(d.len(), !reply.more) {
                self.memory.refuse(d.len() as u64);
                Some("more than the daemon holds of its shims' files at once (--max-reply-memory)")
            } else {
                None
            };
            if let Some(message) = refusal {
                // What was gathered goes, and its room with it.
                let p = s.pending.remove(&reply.id).expect("present");
                let error =
                    nvlinkd_proto::v1::FileError { kind: file_error::Kind::TooLarge as i32, message: message.into() };
                let reply = FileReply { id: reply.id, result: Some(file_reply::Result::Error(error)), more: false };
                let _ = p.tx.send((reply, self.memory.none()));
                return;
            }
            if reply.more {
                p.data.extend_from_slice(d);
                return;
            }
            if !p.data.is_empty() {
                let mut all = std::mem::take(&mut p.data);
                all.extend_from_slice(d);
                *d = all.into();
            }
        } else if reply.more {
            // Only contents come in pieces.
            reply.result = Some(file_reply::Result::Error(nvlinkd_proto::v1::FileError {
                kind: file_error::Kind::Other as i32,
                message: "a reply in pieces that is not a file's contents".into(),
            }));
        }
        if let Some(p) = s.pending.remove(&reply.id) {
            let _ = p.tx.send((reply, p.held));
        }
    }

    /// Register a read: its id, the receiver of its reply and the request to
    /// send. Registration and the closed check share one lock: after `close`,
    /// nothing is registered.
    fn register(
        &self,
        path: &Path,
        op: file_request::Op,
        limit: u64,
    ) -> io::Result<(u64, oneshot::Receiver<Reply>, ServerMessage)> {
        let mut s = self.state();
        if let Some(why) = s.closed {
            return Err(gone(why));
        }
        s.next_id += 1;
        let id = s.next_id;
        let (tx, rx) = oneshot::channel();
        let held = self.memory.none();
        s.pending.insert(id, Pending { tx, data: Vec::new(), held, limit: limit.min(self.max_file) });
        let msg = ServerMessage {
            msg: Some(server_message::Msg::File(FileRequest {
                id,
                path: path.to_string_lossy().into_owned(),
                op: op as i32,
            })),
        };
        Ok((id, rx, msg))
    }

    /// Register a read and send its request (from the link thread).
    fn request(&self, path: &Path, op: file_request::Op, limit: u64) -> io::Result<oneshot::Receiver<Reply>> {
        let (id, rx, msg) = self.register(path, op, limit)?;
        if let Err(e) = self.send(msg, true) {
            self.state().pending.remove(&id);
            return Err(e);
        }
        Ok(rx)
    }

    /// [`LinkChannel::request`] on the runtime, before the link has a thread.
    async fn request_async(
        &self,
        path: &Path,
        op: file_request::Op,
        limit: u64,
    ) -> io::Result<oneshot::Receiver<Reply>> {
        let (id, rx, msg) = self.register(path, op, limit)?;
        if let Err(e) = self.send_async(msg, true).await {
            self.state().pending.remove(&id);
            return Err(e);
        }
        Ok(rx)
    }

    /// Send a message to the shim from the link thread: bounded by the reply
    /// timeout, and (for file requests) given up as soon as the channel closes.
    pub fn send(&self, msg: ServerMessage, until_closed: bool) -> io::Result<()> {
        self.rt.block_on(self.send_async(msg, until_closed))
    }

    /// [`LinkChannel::send`] on the runtime.
    async fn send_async(&self, msg: ServerMessage, until_closed: bool) -> io::Result<()> {
        let mut closed = self.closed.subscribe();
        tokio::select! {
            sent = self.tx.send(Ok(msg)) => sent.map_err(|_| gone("the shim went away")),
            _ = closed.wait_for(|c| *c), if until_closed => Err(gone(self.closed_reason().unwrap_or("closed"))),
            _ = tokio::time::sleep(self.reply_timeout) => {
                self.close("the shim stopped reading");
                Err(io::Error::new(io::ErrorKind::TimedOut, "the nvlink shim stopped reading"))
            }
        }
    }

    /// Wait for a reply, at most the reply timeout (then the shim counts as
    /// gone). Its room stays held until the link ends.
    fn wait(&self, rx: oneshot::Receiver<Reply>) -> io::Result<file_reply::Result> {
        let reply = self.rt.block_on(async { tokio::time::timeout(self.reply_timeout, rx).await });
        match reply {
            Ok(Ok((r, held))) => {
                self.kept.lock().unwrap_or_else(|p| p.into_inner()).absorb(held);
                r.result.ok_or_else(|| io::Error::other("empty file reply"))
            }
            Ok(Err(_)) => Err(gone(self.closed_reason().unwrap_or("the shim went away"))),
            Err(_) => {
                self.close("the shim stopped answering");
                Err(io::Error::new(io::ErrorKind::TimedOut, "the nvlink shim stopped answering"))
            }
        }
    }
}

fn gone(why: &str) -> io::Error {
    io::Error::new(io::ErrorKind::BrokenPipe, format!("the nvlink shim's stream is closed: {why}"))
}

fn to_io(e: nvlinkd_proto::v1::FileError) -> io::Error {
    let kind = match file_error::Kind::try_from(e.kind).unwrap_or(file_error::Kind::Other) {
        file_error::Kind::NotFound => io::ErrorKind::NotFound,
        file_error::Kind::PermissionDenied => io::ErrorKind::PermissionDenied,
        file_error::Kind::IsDirectory => io::ErrorKind::IsADirectory,
        file_error::Kind::TooLarge => io::ErrorKind::FileTooLarge,
        file_error::Kind::NotRegular => return corefs::not_regular(),
        file_error::Kind::Other => io::ErrorKind::Other,
    };
    io::Error::new(kind, e.message)
}

/// What the shim announced of one path when the link started (`Start.files`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Announced {
    pub exists: bool,
    pub is_dir: bool,
    pub size: u64,
    /// BLAKE3 of a regular file's contents; `None`: stat only.
    pub digest: Option<Digest>,
}

/// The announcements of a `Start`, by path: keyed by the name's bytes, since
/// `PathBuf`'s equality drops a trailing `/` and `.` components, which the
/// kernel does not (`x/` fails where `x` reads). Paths that are not absolute
/// and digests that are not 32 bytes are ignored (those paths are asked for
/// as before); the first announcement of a path stands.
pub fn announced(files: &[AnnouncedFile]) -> HashMap<OsString, Announced> {
    let mut map = HashMap::new();
    for f in files {
        let path = PathBuf::from(&f.path);
        if !path.is_absolute() {
            continue;
        }
        let digest = match f.blake3.len() {
            0 => None,
            32 => f.blake3.as_slice().try_into().ok(),
            _ => continue,
        };
        let a = Announced { exists: f.exists, is_dir: f.is_dir && f.exists, size: f.size, digest };
        map.entry(path.into_os_string()).or_insert(a);
    }
    map
}

/// The files a command line names, as far as the daemon can tell before the
/// link parses it: each argument as a path, its value after `=`, or after a
/// one-letter option it is glued to (`-L/x`), made absolute against the
/// working directory; and the `lib<name>.a` of each `-l name`, in any
/// directory. A superset of what the link reads first (options files name
/// more, read when the link reads them).
pub struct Named {
    paths: std::collections::HashSet<PathBuf>,
    libraries: std::collections::HashSet<OsString>,
}

impl Named {
    pub fn of(args: &[String], cwd: &Path) -> Named {
        let mut paths = std::collections::HashSet::new();
        let mut libraries = std::collections::HashSet::new();
        let mut after_l = false;
        for a in args {
            let values =
                [Some(a.as_str()), a.split_once('=').map(|(_, v)| v), a.get(2..).filter(|_| a.starts_with('-'))];
            for v in values.into_iter().flatten().filter(|v| !v.is_empty()) {
                paths.insert(cwd.join(v));
            }
            let library = if after_l { Some(a.as_str()) } else { a.strip_prefix("-l").filter(|n| !n.is_empty()) };
            if let Some(name) = library.or_else(|| a.strip_prefix("--library=")) {
                libraries.insert(OsString::from(format!("lib{name}.a")));
            }
            after_l = a == "-l" || a == "--library";
        }
        Named { paths, libraries }
    }

    /// Whether `path` (an announced, absolute one) is one of these.
    pub fn names(&self, path: &Path) -> bool {
        self.paths.contains(path) || path.file_name().is_some_and(|f| self.libraries.contains(f))
    }
}

/// A local link's working directory: its name and, once opened, the
/// directory itself.
struct Pinned {
    cwd: PathBuf,
    dir: Option<CwdDir>,
}

impl Pinned {
    /// Where this process opens `path` (see `Request::in_dir`).
    fn at(&self, path: &Path) -> PathBuf {
        match &self.dir {
            Some(dir) => dir.under(&self.cwd, path),
            None => path.to_owned(),
        }
    }
}

/// Where a link's files are.
enum Source {
    /// The daemon shares the caller's filesystem and reads the files itself:
    /// those under the caller's working directory through the directory it
    /// opened (`Request::in_dir`), as nvlink finds them through its own.
    Local(Pinned),
    /// Over the stream.
    Stream(Stream),
}

struct Stream {
    /// Replies to the reads of `prefetch`, waited for by the link's own thread.
    prefetched: Mutex<HashMap<OsString, io::Result<file_reply::Result>>>,
    /// What the shim announced: stats answered here, contents by digest.
    announced: HashMap<OsString, Announced>,
    blobs: Option<Arc<BlobStore>>,
    /// Blobs the store lacked at the start: on their way from this link's
    /// shim (owned: true) or another link's (see `blobs.rs`).
    flights: HashMap<Digest, (Arc<Flight>, bool)>,
}

/// What a link reads through (see the module documentation).
pub struct LinkFs {
    channel: Arc<LinkChannel>,
    source: Source,
    /// Input bytes this link may read in all.
    budget: u64,
    used: AtomicU64,
    declined: Mutex<Option<String>>,
    /// A read went past `budget` (`--max-link-input`): a fallback the user can fix.
    past_budget: AtomicBool,
    /// Local files' contents shared with the daemon's other links (`fs::ContentMemo`).
    contents: Option<Arc<corefs::ContentMemo>>,
}

impl LinkFs {
    /// A link of `req`: its files read here when `req.shared_fs`, else over
    /// the stream.
    pub fn new(channel: Arc<LinkChannel>, req: &Request, budget: u64) -> Self {
        let source = if req.shared_fs {
            Source::Local(Pinned { cwd: req.cwd.clone(), dir: req.cwd_dir.clone() })
        } else {
            Source::Stream(Stream {
                prefetched: Mutex::new(HashMap::new()),
                announced: HashMap::new(),
                blobs: None,
                flights: HashMap::new(),
            })
        };
        LinkFs {
            channel,
            source,
            budget,
            used: AtomicU64::new(0),
            declined: Mutex::new(None),
            past_budget: AtomicBool::new(false),
            contents: None,
        }
    }

    /// Read local files through the daemon's memo of their contents.
    pub fn with_contents(mut self, contents: Arc<corefs::ContentMemo>) -> Self {
        self.contents = Some(contents);
        self
    }

    /// The files the shim announced, read by digest from `blobs` (a link over
    /// the stream only; a local link reads its files itself). The blobs the
    /// store lacks of the files the command line names (`named`) are asked of
    /// the shim at once, all together (when they fit the link's budget),
    /// unless another link is fetching them already (`BlobStore::claim`);
    /// each is verified and stored as it arrives. The others are asked for
    /// (and verified, and kept) only if the link reads them — a whole-link
    /// hit whose key digests are remembered reads none, and a file announced
    /// and never read is never fetched.
    ///
    /// Runs on the runtime, before the link takes a thread, and returns once
    /// the blobs asked for have landed: a shim that announces files and then
    /// sends nothing holds no thread. Each blob is waited for at most the
    /// reply timeout after the one before it; one of this link's own that
    /// does not come in time closes the channel (the shim counts as gone, and
    /// the link ends at its first read). A flight of another link's that does
    /// not land in time is left to the link, which asks its own shim when it
    /// reads the file.
    pub async fn with_announced(
        mut self,
        files: HashMap<OsString, Announced>,
        named: &Named,
        blobs: Arc<BlobStore>,
        caller: crate::blobs::Caller,
    ) -> Self {
        let Source::Stream(st) = &mut self.source else { return self };
        let mut seen = std::collections::HashSet::new();
        let mut missing = Vec::new();
        for (path, a) in &files {
            let Some(d) = a.digest.filter(|_| a.exists && !a.is_dir && named.names(Path::new(path))) else { continue };
            if seen.insert(d) && !blobs.has(&d) {
                missing.push((path.clone(), a.size, d));
            }
        }
        st.announced = files;
        st.blobs = Some(blobs.clone());
        let wanted = missing.iter().fold(0u64, |n, (_, size, _)| n.saturating_add(*size));
        if wanted > self.budget {
            return self;
        }
        for (path, size, digest) in missing {
            let flight = match blobs.claim(&digest, &caller) {
                Claim::Wait(f) => {
                    st.flights.insert(digest, (f, false));
                    continue;
                }
                Claim::Own(f) => f,
            };
            st.flights.insert(digest, (flight.clone(), true));
            // A closed stream refuses the request: the flight fails, and
            // so does the read itself.
            let rx = self.channel.request_async(Path::new(&path), file_request::Op::Read, size).await.ok();
            let blobs = blobs.clone();
            self.channel.rt.spawn(async move {
                let (data, held) = match rx {
                    Some(rx) => match rx.await {
                        Ok((FileReply { result: Some(file_reply::Result::Data(d)), .. }, held)) => {
                            (Some(d), Some(held))
                        }
                        _ => (None, None),
                    },
                    None => (None, None),
                };
                // Hashing and the disk write are blocking work; the reply's
                // room is given back once the blob store has it.
                let _ = tokio::task::spawn_blocking(move || {
                    blobs.land(&digest, &caller, size, data.map(Vec::from), &flight);
                    drop(held);
                })
                .await;
            });
        }
        let mut late = Vec::new();
        for (digest, (flight, owned)) in &st.flights {
            let landed = tokio::select! {
                l = tokio::time::timeout(self.channel.reply_timeout, flight.landed()) => l.is_ok(),
                // Gone: the link ends at its first read.
                _ = self.channel.wait_closed() => break,
            };
            if !landed && *owned {
                self.channel.close("the shim did not send the files it announced in time");
                break;
            }
            if !landed {
                late.push(*digest);
            }
        }
        // Asked of this link's own shim if the link reads them.
        for digest in late {
            st.flights.remove(&digest);
        }
        self
    }

    /// Input bytes received from the shim on the link's stream, whether the
    /// link read them or not (none when the daemon reads the files itself, or
    /// finds them in its blob store).
    pub fn bytes_received(&self) -> u64 {
        self.channel.received.load(Ordering::Relaxed)
    }

    /// Whether the link was declined for reading past its budget
    /// (`--max-link-input`), the fallback a larger budget fixes.
    pub fn past_budget(&self) -> bool {
        self.past_budget.load(Ordering::Relaxed)
    }

    fn decline(&self, why: String) {
        let mut d = self.declined.lock().unwrap_or_else(|p| p.into_inner());
        d.get_or_insert(why);
    }

    fn open(&self) -> io::Result<()> {
        match self.channel.closed_reason() {
            Some(why) => Err(self.lost(gone(why))),
            None => Ok(()),
        }
    }

    /// A read that failed because the shim is gone or silent ends the link: no
    /// engine runs it (not even the real nvlink), its answer would go nowhere.
    fn lost(&self, e: io::Error) -> io::Error {
        if matches!(e.kind(), io::ErrorKind::BrokenPipe | io::ErrorKind::TimedOut) {
            self.decline(format!("the link's stream ended: {e}"));
        }
        e
    }

    /// Ask the shim and wait (or take the reply to an earlier request).
    fn ask(&self, st: &Stream, path: &Path, op: file_request::Op, limit: u64) -> io::Result<file_reply::Result> {
        let early = match op {
            file_request::Op::Read => st.prefetched.lock().ok().and_then(|mut m| m.remove(path.as_os_str())),
            file_request::Op::Stat => None,
        };
        if let Some(reply) = early {
            return reply.map_err(|e| self.lost(e));
        }
        let rx = self.channel.request(path, op, limit).map_err(|e| self.lost(e))?;
        self.channel.wait(rx).map_err(|e| self.lost(e))
    }

    /// The contents of `path` from the shim, by path.
    fn fetch(&self, st: &Stream, path: &Path, limit: u64) -> io::Result<Vec<u8>> {
        match self.ask(st, path, file_request::Op::Read, limit)? {
            file_reply::Result::Data(d) => Ok(d.into()),
            file_reply::Result::Error(e) => Err(to_io(e)),
            file_reply::Result::Stat(_) => Err(io::Error::other("unexpected stat reply")),
        }
    }

    /// An announced regular file: from the blob store (once its flight, if
    /// any, has landed), else from the shim, kept (and used) only if its bytes
    /// are the ones announced.
    fn blob(&self, st: &Stream, path: &Path, a: &Announced, digest: &Digest) -> io::Result<Arc<[u8]>> {
        let Some(blobs) = st.blobs.as_ref() else { return self.fetch(st, path, a.size).map(Arc::from) };
        let flight = st.flights.get(digest);
        let landed = flight.and_then(|(f, _)| f.wait(self.channel.reply_timeout));
        let owned = flight.is_some_and(|(_, owned)| *owned);
        if let Some(b) = blobs.get(digest, a.size) {
            // Sent by this link's shim, or by nobody for this link.
            let counter = if owned { &blobs.misses } else { &blobs.hits };
            counter.fetch_add(1, Ordering::Relaxed);
            return Ok(b);
        }
        let refused = || {
            warn!(path = ?path, "refused a blob that does not match the digest the shim announced");
            self.decline(format!("the shim sent {} with contents other than it announced", path.display()));
            Err(io::Error::new(io::ErrorKind::InvalidData, "contents do not match the announced digest"))
        };
        if owned && landed == Some(Landed::Rejected) {
            return refused();
        }
        // A blob evicted (or found damaged) since the link started, or whose
        // flight from another link failed, is asked for now.
        blobs.misses.fetch_add(1, Ordering::Relaxed);
        let data: Arc<[u8]> = match self.fetch(st, path, a.size) {
            Ok(d) => d.into(),
            Err(e) => {
                // Announced, then not served: the file changed while the link
                // ran (or the shim is gone); not an answer nvlink would give.
                self.decline(format!("{} could not be read as announced: {e}", path.display()));
                return Err(e);
            }
        };
        if !blobs.keep(digest, a.size, &data) {
            return refused();
        }
        Ok(data)
    }

    fn read_bytes(&self, path: &Path, remaining: u64) -> io::Result<Arc<[u8]>> {
        let st = match &self.source {
            Source::Local(req) => {
                let path = &req.at(path);
                return match &self.contents {
                    Some(memo) => memo.read(path, remaining),
                    None => corefs::read_regular_shared(path, remaining),
                };
            }
            Source::Stream(st) => st,
        };
        match st.announced.get(path.as_os_str()) {
            Some(a) if !a.exists => Err(io::Error::new(io::ErrorKind::NotFound, "No such file or directory")),
            Some(a) if a.is_dir => Err(io::Error::new(io::ErrorKind::IsADirectory, "is a directory")),
            Some(a) if a.size > remaining => {
                Err(io::Error::new(io::ErrorKind::FileTooLarge, "larger than the daemon reads for one link"))
            }
            Some(a @ Announced { digest: Some(d), .. }) => self.blob(st, path, a, d),
            _ => self.fetch(st, path, u64::MAX).map(Arc::from),
        }
    }
}

impl InputFs for LinkFs {
    fn read(&self, path: &Path) -> io::Result<Arc<[u8]>> {
        self.open()?;
        let remaining = self.budget.saturating_sub(self.used.load(Ordering::Relaxed));
        let data = self.read_bytes(path, remaining).inspect_err(|e| {
            if corefs::is_not_regular(e) {
                self.decline(format!("{} is not a regular file: nvlink reads it itself", path.display()));
            } else if e.kind() == io::ErrorKind::FileTooLarge {
                // Past the link's budget (--max-link-input: a fix the user can
                // make, said once by the shim), or the daemon's for replies.
                if !e.to_string().contains("--max-reply-memory") {
                    self.past_budget.store(true, Ordering::Relaxed);
                }
                self.decline(format!("{}: {e}", path.display()));
            }
        })?;
        let total = self.used.fetch_add(data.len() as u64, Ordering::Relaxed) + data.len() as u64;
        if total > self.budget {
            self.past_budget.store(true, Ordering::Relaxed);
            self.decline(format!(
                "the link's inputs exceed the daemon's budget of {} bytes (--max-link-input)",
                self.budget
            ));
            return Err(io::Error::new(io::ErrorKind::FileTooLarge, "the link's inputs exceed the daemon's budget"));
        }
        Ok(data)
    }

    /// Ask for all of `paths` at once, then wait for the replies here, on
    /// the link's own thread (held by its remote slot): the reads that
    /// follow, in parallel on rayon's pool (which local links share), wait on
    /// nothing a shim does.
    fn prefetch(&self, paths: &[PathBuf]) {
        let Source::Stream(st) = &self.source else { return };
        let mut asked = Vec::new();
        for p in paths {
            // Announced files are asked for (if at all) when the link starts.
            if st.announced.get(p.as_os_str()).is_some_and(|a| !a.exists || a.is_dir || a.digest.is_some()) {
                continue;
            }
            let known = st.prefetched.lock().map(|m| m.contains_key(p.as_os_str())).unwrap_or(true);
            if !known && !asked.iter().any(|(q, _): &(PathBuf, _)| q.as_os_str() == p.as_os_str()) {
                // A closed stream refuses the request: the read itself then fails.
                if let Ok(rx) = self.channel.request(p, file_request::Op::Read, u64::MAX) {
                    asked.push((p.clone(), rx));
                }
            }
        }
        for (p, rx) in asked {
            // Each bounded by the reply timeout; once one times out, the
            // channel is closed and the rest fail at once.
            let reply = self.channel.wait(rx);
            if let Ok(mut m) = st.prefetched.lock() {
                m.insert(p.into_os_string(), reply);
            }
        }
    }

    fn stat(&self, path: &Path) -> io::Result<FileStat> {
        self.open()?;
        let st = match &self.source {
            Source::Local(req) => return LocalFs.stat(&req.at(path)),
            Source::Stream(st) => st,
        };
        if let Some(a) = st.announced.get(path.as_os_str()) {
            return match a.exists {
                true => Ok(FileStat { is_dir: a.is_dir, size: a.size }),
                false => Err(io::Error::new(io::ErrorKind::NotFound, "No such file or directory")),
            };
        }
        match self.ask(st, path, file_request::Op::Stat, u64::MAX)? {
            file_reply::Result::Stat(s) => Ok(FileStat { is_dir: s.is_dir, size: s.size }),
            file_reply::Result::Error(e) => Err(to_io(e)),
            file_reply::Result::Data(_) => Err(io::Error::other("unexpected data reply")),
        }
    }

    fn identity(&self, path: &Path) -> Option<FileIdentity> {
        match &self.source {
            Source::Local(req) => LocalFs.identity(&req.at(path)),
            // Announced contents are known by their digest (and read only if
            // they are those): key digests of them are remembered by it.
            Source::Stream(st) => st
                .announced
                .get(path.as_os_str())
                .filter(|a| a.exists && !a.is_dir)
                .and_then(|a| Some(FileIdentity::of_contents(&a.digest?, a.size))),
        }
    }

    fn declined(&self) -> Option<String> {
        self.declined.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The files fetched when a link starts are those its command line names
    /// (and its libraries' archives); any other announced one waits until read.
    #[test]
    fn only_named_files_are_fetched_at_the_start() {
        let args: Vec<String> =
            ["--arch=sm_90", "a.o", "/abs/b.o", "-L/libs", "-lmu", "-l", "x", "--library=y", "-o", "out.cubin"]
                .map(String::from)
                .to_vec();
        let named = Named::of(&args, Path::new("/w"));
        for p in
            ["/w/a.o", "/w/./a.o", "/abs/b.o", "/libs", "/libs/libmu.a", "/w/libx.a", "/else/liby.a", "/w/out.cubin"]
        {
            assert!(named.names(Path::new(p)), "{p}");
        }
        for p in ["/w/c.o", "/w/0", "/abs/a.o", "/libs/libz.a"] {
            assert!(!named.names(Path::new(p)), "{p}");
        }
    }

    /// Two links' reads share one bound: one gathering 3 MiB (in a buffer
    /// doubled to 4 MiB) leaves no room for the other's first piece, whose
    /// read fails as too large and is counted; the first completes, its room
    /// held while its link holds the reply and given back when the link ends
    /// (the channel drops), and a read gathering when its channel closes
    /// gives its room back at once.
    #[test]
    fn replies_share_the_daemons_reply_memory_and_give_it_back() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let memory = ReplyMemory::new(4 << 20);
        let held = || memory.counters()[0].1;
        let (tx, _rx) = mpsc::channel(4);
        let channel =
            || LinkChannel::new(tx.clone(), rt.handle().clone(), Duration::from_secs(5), u64::MAX, memory.clone());
        let (a, b) = (channel(), channel());
        let piece = |id, more| FileReply {
            id,
            result: Some(file_reply::Result::Data(bytes::Bytes::from(vec![7u8; 1 << 20]))),
            more,
        };
        let (ida, rxa, _) = a.register(Path::new("/a"), file_request::Op::Read, u64::MAX).unwrap();
        let (idb, rxb, _) = b.register(Path::new("/b"), file_request::Op::Read, u64::MAX).unwrap();
        for _ in 0..3 {
            a.deliver(piece(ida, true));
        }
        assert_eq!(held(), 4 << 20, "the gathering buffer's room");
        b.deliver(piece(idb, true));
        let (refused, _) = rt.block_on(rxb).unwrap();
        match refused.result {
            Some(file_reply::Result::Error(e)) => assert_eq!(e.kind, file_error::Kind::TooLarge as i32, "{e:?}"),
            other => panic!("a piece past the bound was taken: {other:?}"),
        }
        assert_eq!(memory.counters()[1].1, 1, "the refusal is counted");
        a.deliver(piece(ida, false));
        match a.wait(rxa).unwrap() {
            file_reply::Result::Data(d) => assert_eq!(d.len(), 4 << 20),
            other => panic!("{other:?}"),
        }
        assert_eq!(held(), 4 << 20, "held while the link holds the reply");
        drop(a);
        assert_eq!(held(), 0, "given back when the link ends");
        let (idb, _rxb, _) = b.register(Path::new("/b2"), file_request::Op::Read, u64::MAX).unwrap();
        b.deliver(piece(idb, true));
        assert_eq!(held(), 1 << 20);
        b.close("the shim went away");
        assert_eq!(held(), 0, "a closed stream's pieces are given back");
    }

    #[test]
    fn announcements_are_taken_only_as_sent_rightly() {
        let file = |path: &str, digest: Vec<u8>| AnnouncedFile {
            path: path.into(),
            exists: true,
            is_dir: false,
            size: 3,
            blake3: digest,
        };
        let d = blake3::hash(b"abc").as_bytes().to_vec();
        let map = announced(&[
            file("relative.o", d.clone()),
            file("/w/short.o", vec![1, 2, 3]),
            file("/w/a.o", d.clone()),
            file("/w/a.o", vec![]),
            // Another spelling is another name (the kernel fails `a.o/`).
            file("/w/a.o/", vec![]),
            AnnouncedFile { path: "/w/gone".into(), exists: false, is_dir: true, ..Default::default() },
        ]);
        assert_eq!(map.len(), 3, "{map:?}");
        let a = &map[std::ffi::OsStr::new("/w/a.o")];
        assert_eq!((a.size, a.digest.map(|x| x.to_vec())), (3, Some(d)), "the first announcement of a path stands");
        assert_eq!(map[std::ffi::OsStr::new("/w/a.o/")].digest, None);
        assert!(!map[std::ffi::OsStr::new("/w/gone")].is_dir, "a missing path is no directory");
    }
}
