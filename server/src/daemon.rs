//! `nvlinkd serve`: listeners, logging, signals and shutdown.
//!
//! The daemon listens on a unix socket (mode 0600) and, with `--listen`, on TCP
//! for remote shims. The TCP listener is TLS (rustls, terminated by the daemon
//! itself: `net/tls.rs`) and authenticates every call: bearer tokens
//! (`--token-file`, compared in constant time) and/or client certificates
//! (`--client-ca`). Without TLS and an authentication it refuses to start,
//! unless `--insecure` says a proxy does that job. Both listeners also serve
//! `grpc.health.v1` (tonic-health), unauthenticated: it tells only whether the
//! daemon serves.
//!
//! SIGHUP reopens the log file (logrotate) and reads the certificate, key,
//! client CA and token file again (`Remote::reload`): new connections and
//! calls use the new ones; a file that is missing, unparsable, a key that does
//! not match its certificate or a token file without tokens keeps the old
//! ones, with a warning. It never stops the daemon.
//!
//! SIGTERM, SIGINT, the `Shutdown` RPC and `--idle-exit` all start the same
//! shutdown: the health service says NOT_SERVING (and `/readyz` 503), then the
//! listeners close: no new connections or links; links in flight get the
//! grace period (`--shutdown-grace`) to finish, then are abandoned (their shims
//! fall back to the real nvlink; outputs are never half-written since the shim
//! writes them); the socket is removed and the process exits. A stuck client
//! never holds the daemon up longer than the grace period. `/metrics`,
//! `/healthz` and `/readyz` answer until the end.
//!
//! Logs go to `<cache dir>/nvlinkd.log`, and also to stderr unless the
//! daemon was detached by `nvlinkd start` ([`init_logging`]).
//!
//! The socket's directory belongs to someone: a directory the daemon has to
//! create is created private (0700); an existing one is never changed, only
//! checked (owned by us or root, and sticky if others may write to it, as /tmp
//! is). A file at the socket path is replaced only when it is a socket no daemon
//! answers on; anything else is refused.

use crate::net::auth::Auth;
use crate::net::listener::Remote;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nvlinkd_core::{Linker, LinkerConfig};
use nvlinkd_fs::owner;
use nvlinkd_proto::shared;
use nvlinkd_proto::v1::nvlinkd_server::NvlinkdServer;
use tokio::net::TcpListener;
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::sync::watch;
use tracing::{error, info, warn};
use tracing_subscriber::fmt::format::FmtSpan;

use crate::link::service::{Activity, Limits, Service};
use crate::observe::events::Hub;
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
    /// Most remote links at once (`--max-remote-links`; see `link/admission.rs`).
    pub max_remote_links: usize,
    /// The log file, reopened on SIGHUP.
    pub log_file: Option<Arc<LogFile>>,
    /// The log also goes to stderr (`serve` not detached).
    pub log_to_stderr: bool,
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

/// How log lines are written (`--log-format`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One line of text per event (`tracing`'s format).
    #[default]
    Text,
    /// One JSON object per line (`timestamp`, `level`, `target`, the event's
    /// fields flattened, `span` and `spans`), for log pipelines.
    Json,
}

/// The log file, reopened on SIGHUP: after logrotate moved it away, lines go
/// to a new file at the same path.
pub struct LogFile {
    path: PathBuf,
    file: Mutex<std::fs::File>,
}

impl LogFile {
    fn open(path: &Path) -> std::io::Result<std::fs::File> {
        use std::os::unix::fs::OpenOptionsExt;
        // Never through a symlink someone planted at the log's name.
        std::fs::OpenOptions::new().create(true).append(true).mode(0o600).custom_flags(libc::O_NOFOLLOW).open(path)
    }

    /// Open the file at the log's path again; on failure the old one stays.
    pub fn reopen(&self) -> Result<(), String> {
        let file = Self::open(&self.path).map_err(|e| format!("cannot open {}: {e}", self.path.display()))?;
        *self.file.lock().unwrap_or_else(|p| p.into_inner()) = file;
        Ok(())
    }
}

/// Where log lines go: the file and/or stderr. Written on the appender's own
/// thread, so a slow disk or a stalled reader of stderr holds up no link.
struct Sink {
    file: Option<Arc<LogFile>>,
    stderr: bool,
}

impl std::io::Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let len = buf.len();
        let escaped = one_line(buf);
        let buf = escaped.as_deref().unwrap_or(buf);
        // A line that cannot be written (disk full, stderr closed) is lost;
        // the daemon goes on.
        if let Some(f) = &self.file {
            let _ = f.file.lock().unwrap_or_else(|p| p.into_inner()).write_all(buf);
        }
        if self.stderr {
            let _ = std::io::stderr().write_all(buf);
        }
        Ok(len)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// One event, as one line: its text with every control character but a tab
/// escaped (`\n`, `\u{1b}`), and its final newline; None when there is
/// nothing to escape. Events carry what clients sent (arguments, paths), and
/// a newline or a terminal escape in them must not forge a line of the log or
/// reach an operator's terminal. (Each event arrives in one write.)
fn one_line(buf: &[u8]) -> Option<Vec<u8>> {
    let body = buf.strip_suffix(b"\n").unwrap_or(buf);
    // Bytes that start a control character: C0, DEL, and C1 (U+0080..U+009F, `\xc2` first).
    if !body.iter().any(|&b| (b < 0x20 && b != b'\t') || b == 0x7f || b == 0xc2) {
        return None;
    }
    let mut out = String::with_capacity(buf.len() + 16);
    for c in String::from_utf8_lossy(body).chars() {
        if c.is_control() && c != '\t' {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out.push('\n');
    Some(out.into_bytes())
}

/// Whether no other user can change where `dir` leads: along its path,
/// every symlink is this user's or root's, in a directory of theirs, and
/// every directory is theirs and not writable by others, or sticky (`/tmp`)
/// with the next entry theirs. (An adversarial run pointed a root daemon's
/// `--cache-dir` through another user's dangling symlink in `/tmp`, and
/// through that user's own directory: the user then owned the daemon's
/// scratch directories and had its LTO links compile the user's PTX.) A
/// part that does not exist yet ends the check: the daemon makes it.
fn trusted_path(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let next_shown = |at: &Path, part: &std::ffi::OsStr| at.join(part).display().to_string();
    let me = owner::euid();
    let ours = |uid: u32| uid == me || uid == 0;
    let mut at = std::path::absolute(dir).map_err(|e| format!("cache directory {}: {e}", dir.display()))?;
    // Resolved part by part; a symlink's target is checked the same way.
    let mut left: Vec<std::ffi::OsString> = at.components().skip(1).map(|c| c.as_os_str().to_owned()).collect();
    left.reverse();
    at = PathBuf::from("/");
    let mut links = 0;
    while let Some(part) = left.pop() {
        let parent = std::fs::metadata(&at).map_err(|e| format!("cache directory {}: {e}", dir.display()))?;
        let sticky = parent.mode() & 0o1000 != 0;
        if !ours(parent.uid()) {
            return Err(format!(
                "cache directory {}: {} is in a directory of uid {}: refusing (that user could redirect it)",
                dir.display(),
                next_shown(&at, &part),
                parent.uid()
            ));
        }
        let next = match part.to_str() {
            Some("..") => at.parent().map_or_else(|| PathBuf::from("/"), Path::to_owned),
            Some(".") => at.clone(),
            _ => at.join(&part),
        };
        let Ok(m) = std::fs::symlink_metadata(&next) else { return Ok(()) };
        if parent.mode() & 0o022 != 0 && !(sticky && ours(m.uid())) {
            return Err(format!(
                "cache directory {} lies in {}, which other users can write: refusing",
                dir.display(),
                at.display()
            ));
        }
        if m.file_type().is_symlink() {
            links += 1;
            if !ours(m.uid()) || links > 40 {
                return Err(format!(
                    "cache directory {}: {} is a symlink of uid {}: refusing",
                    dir.display(),
                    next.display(),
                    m.uid()
                ));
            }
            let target = std::fs::read_link(&next).map_err(|e| format!("cache directory {}: {e}", dir.display()))?;
            let mut more: Vec<std::ffi::OsString> = target.components().map(|c| c.as_os_str().to_owned()).collect();
            if target.is_absolute() {
                at = PathBuf::from("/");
                more.remove(0);
            }
            left.extend(more.into_iter().rev());
            continue;
        }
        at = next;
    }
    Ok(())
}

/// Make the cache directory this user's own before anything is read from it
/// or written to it: the cache decides what links answer, and the log names
/// every link. Created 0700; an existing one must be a directory owned by
/// this user, in a directory of this user's or root's (else another user
/// could swap it; every directory and symlink on the way is checked by
/// [`trusted_path`]), and is made 0700 (an older daemon made it readable by
/// all). A symlink is followed only where it is this user's or root's, in a
/// directory of theirs (systemd's `DynamicUser` cache directories are such
/// links). Refused otherwise, with why, and when it cannot be made; one that
/// exists but cannot be written (read-only, full) is left to the cache,
/// which then runs in memory.
pub fn private_cache_dir(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    let shown = dir.display();
    trusted_path(dir)?;
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        let _ = std::fs::create_dir_all(parent);
    }
    let made = std::fs::DirBuilder::new().mode(0o700).create(dir);
    // Again, now that every part exists: another user could have made one
    // of the missing parts between the check and the creation.
    trusted_path(dir)?;
    // One that cannot be made is refused: the daemon's scratch directories
    // would be made there later, through whatever is there then.
    let m = std::fs::symlink_metadata(dir).map_err(|e| {
        let why = made.err().unwrap_or(e);
        format!("cache directory {shown} cannot be made: {why}; give --cache-dir a directory of your own")
    })?;
    let me = owner::euid();
    // (`trusted_path` refused a symlink, or a directory it lies in, of
    // another user's.) The directory a symlink of ours leads to is checked
    // as the directory itself.
    if m.file_type().is_symlink() {
        return match std::fs::canonicalize(dir) {
            Ok(real) if real != dir => private_cache_dir(&real),
            _ => Ok(()),
        };
    }
    if !m.is_dir() {
        return Ok(());
    }
    if let Err(why) = owner::Rule::owned_by(owner::Owners::Me).check(&m) {
        return Err(format!(
            "cache directory {shown} {why}: refusing (another user could write what links answer); give \
             --cache-dir a directory of your own"
        ));
    }
    // What another user could have put in the directory: nothing, if it was
    // never open to them; else it must be empty. Whatever the mode, nvlinkd
    // makes no symlink and nothing of another user's at its top (a planted
    // `v2` or `toolkits` link would take the store or the toolkit identity
    // elsewhere).
    let entries: Vec<std::fs::DirEntry> = std::fs::read_dir(dir).map(|d| d.flatten().collect()).unwrap_or_default();
    if let (Err(owner::Refusal::Mode { mode, .. }), false) = (owner::Rule::OWN_DIR.check(&m), entries.is_empty()) {
        return Err(format!(
            "cache directory {shown} (mode {mode:03o}) could be written by other users and is not empty: what is \
             in it may be theirs; empty it or give --cache-dir a new directory"
        ));
    }
    // Two levels down (the store's shards: `v2/<xx>`), the same: nothing
    // planted, and, while the directory lets others in (it is made 0700
    // below), no directory inside that they could write into.
    let reachable_writers =
        (if m.mode() & 0o010 != 0 { 0o020 } else { 0 }) | (if m.mode() & 0o001 != 0 { 0o002 } else { 0 });
    // What nvlinkd never makes at `p`, in words.
    let foreign = |p: &Path| -> Option<String> {
        let em = std::fs::symlink_metadata(p).ok()?;
        if em.file_type().is_symlink() {
            Some("a symlink".to_owned())
        } else if em.uid() != me {
            Some(format!("an entry of uid {}", em.uid()))
        } else if em.is_dir() && em.mode() & reachable_writers != 0 {
            Some(format!("a directory others may write into (mode {:03o})", em.mode() & 0o777))
        } else {
            None
        }
    };
    let children = |p: &Path| -> Vec<PathBuf> {
        std::fs::read_dir(p).map(|d| d.flatten().map(|e| e.path()).collect()).unwrap_or_default()
    };
    for top in entries.iter().map(|e| e.path()) {
        let below = if top.is_symlink() || !top.is_dir() { Vec::new() } else { children(&top) };
        if let Some((p, what)) = std::iter::once(top.clone()).chain(below).find_map(|p| foreign(&p).map(|w| (p, w))) {
            return Err(format!(
                "cache directory {shown} holds {what}, {}, which nvlinkd never makes (another user may have \
                 planted it or written into it): remove it",
                p.display()
            ));
        }
    }
    if m.mode() & 0o077 != 0 {
        let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
    }
    Ok(())
}

/// The daemon's logging: dropping it flushes what is queued.
pub struct Logging {
    _guard: Option<tracing_appender::non_blocking::WorkerGuard>,
    /// The log file (none where it could not be opened), for SIGHUP.
    pub file: Option<Arc<LogFile>>,
}

/// Log to `<cache dir>/nvlinkd.log`, and also to stderr when `to_stderr` (a
/// daemon that is not detached: run in a terminal, or by a service manager
/// that collects stderr, as journald and `kubectl logs` do).
///
/// A cache directory that cannot hold the log (read-only, full, not a
/// directory) is not a reason to stop: the log goes to stderr instead, with one
/// line saying why, and the daemon serves (the cache then also runs without
/// its disk tier, see `cache::store`).
pub fn init_logging(cache_dir: &Path, format: LogFormat, to_stderr: bool) -> Logging {
    let path = cache_dir.join("nvlinkd.log");
    let file = std::fs::create_dir_all(cache_dir).and_then(|()| LogFile::open(&path));
    let filter = tracing_subscriber::EnvFilter::try_from_env("NVLINKD_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let (file, failed) = match file {
        Ok(f) => (Some(Arc::new(LogFile { path: path.clone(), file: Mutex::new(f) })), None),
        Err(e) => (None, Some(e)),
    };
    let sink = Sink { file: file.clone(), stderr: to_stderr || file.is_none() };
    let (writer, guard) = tracing_appender::non_blocking(sink);
    // At debug level each span's end is logged with its duration: a link's
    // phases (see `Linker::link_span`) are its timings.
    let timed = filter.max_level_hint().is_some_and(|l| l >= tracing_subscriber::filter::LevelFilter::DEBUG);
    let span_events = if timed { FmtSpan::CLOSE } else { FmtSpan::NONE };
    // One of the two (an absent layer does nothing).
    let (text, json) = match format {
        LogFormat::Text => {
            let layer = tracing_subscriber::fmt::layer().with_span_events(span_events).with_ansi(false);
            (Some(layer.with_writer(writer).with_filter(filter)), None)
        }
        LogFormat::Json => {
            let layer = tracing_subscriber::fmt::layer().with_span_events(span_events).with_ansi(false);
            (None, Some(layer.json().flatten_event(true).with_writer(writer).with_filter(filter)))
        }
    };
    let installed = tracing_subscriber::registry().with(text).with(json).try_init();
    if let Some(e) = failed {
        tracing::warn!(log = %path.display(), "cannot write the log file ({e}): logging to stderr");
    }
    Logging { _guard: installed.ok().map(|()| guard), file }
}

/// HTTP/2 windows large enough that whole input files flow without waiting
/// for window updates.
fn builder() -> tonic::transport::Server {
    tonic::transport::Server::builder()
        .initial_stream_window_size(Some(shared::WINDOW_BYTES))
        .initial_connection_window_size(Some(shared::WINDOW_BYTES))
        .max_frame_size(Some(shared::FRAME_BYTES))
}

/// The signals the daemon handles, installed first thing: from then on
/// SIGHUP cannot end it.
struct Signals {
    term: Signal,
    int: Signal,
    hup: Signal,
}

impl Signals {
    fn install() -> std::io::Result<Signals> {
        Ok(Signals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
            hup: signal(SignalKind::hangup())?,
        })
    }
}

/// SIGHUP: reopen the log file (logrotate moved it), then read the remote
/// listener's certificate, key, client CA and tokens again
/// ([`Remote::reload`]). What fails keeps what was in force, with a warning.
fn reload(log: Option<&LogFile>, remote: Option<&Remote>) {
    // First the log, so that what follows goes to the new file.
    match log.map(LogFile::reopen) {
        Some(Ok(())) => info!("SIGHUP: log file reopened"),
        Some(Err(why)) => warn!(%why, "SIGHUP: log file not reopened; logging on to the old one"),
        None => info!("SIGHUP: no log file to reopen (logging to stderr)"),
    }
    match remote {
        Some(remote) => remote.reload(),
        None => info!("SIGHUP: no --listen port, no TLS files or tokens to reload"),
    }
}

pub async fn serve(opts: ServeOptions) -> Result<(), Box<dyn std::error::Error>> {
    let mut signals = Signals::install().map_err(|e| format!("cannot handle signals: {e}"))?;
    // A stop was asked for (signal, RPC, idle exit).
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    // The listeners close: after the health service says NOT_SERVING.
    let (close_tx, close_rx) = watch::channel(false);
    // The daemon is done: `/metrics` answers until then.
    let (done_tx, done_rx) = watch::channel(false);
    let remote = opts.remote.map(Arc::new);
    // A farm daemon needs more descriptors than the usual soft limit of 1024.
    let nofile = crate::net::incoming::raise_fd_limit();
    let (unix, bound) = crate::net::listener::bind_unix(&opts.socket)
        .map_err(|e| format!("cannot serve on {}: {e}", opts.socket.display()))?;
    let jobs = opts.linker.jobs;
    // Without a whole-link cache a speculative link's result would go nowhere
    // (`nvlinkd watch`, which receives its results, still works).
    let cached = opts.linker.cache_mem > 0 || opts.linker.cache_size > 0;
    // This daemon's name in fallbacks the shim warns about, fixed now.
    let _ = crate::link::service::instance();
    // One line for whoever started `serve` in a terminal (the rest goes to the log).
    let listening = remote.as_ref().map(|r| format!(" and {}", r.listen)).unwrap_or_default();
    let toolkits: Vec<String> = opts.linker.toolkits.iter().map(|t| t.display().to_string()).collect();
    let started_line = format!(
        "nvlinkd {} serving on {}{listening} (pid {}; toolkit {}; cache and log in {})",
        env!("CARGO_PKG_VERSION"),
        opts.socket.display(),
        std::process::id(),
        toolkits.join(", "),
        opts.cache_dir.display()
    );
    // The event stream hears of phases, admissions and mismatches from the
    // linker itself (`observe/events.rs`).
    let linker = Arc::new(Linker::observed(opts.linker, Arc::new(opts.events.clone())));
    // `phase_progress` for long phases.
    opts.events.spawn_progress();
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
    if !opts.log_to_stderr {
        eprintln!("{started_line}");
    }

    // SIGTERM and SIGINT start the same graceful shutdown as the RPC; SIGHUP
    // reloads the listener's files and reopens the log, and never stops the
    // daemon. (The handlers were installed at the start of `serve`.)
    {
        let (stop, remote, log) = (shutdown_tx.clone(), remote.clone(), opts.log_file.clone());
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = signals.term.recv() => {
                        info!("SIGTERM: stopping");
                        let _ = stop.send(true);
                    }
                    _ = signals.int.recv() => {
                        info!("SIGINT: stopping");
                        let _ = stop.send(true);
                    }
                    _ = signals.hup.recv() => reload(log.as_deref(), remote.as_deref()),
                }
            }
        });
    }

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
    let remote_links = crate::link::admission::RemoteLinks::new(opts.max_remote_links, opts.limits.reply_timeout);
    let reply_memory = crate::link::stream_fs::ReplyMemory::new(opts.limits.max_reply_memory);
    let client_certificates =
        remote.as_ref().and_then(|r| r.tls.as_ref()).is_some_and(|t| t.requires_client_certificates());
    let certificates = Arc::new(crate::net::auth::CertificateFigures::default());
    let service = |local: bool, auth: Option<Arc<Auth>>| {
        let gate = crate::net::auth::Gate { auth: auth.clone(), failures: auth_failures.clone() };
        let server = NvlinkdServer::new(Service {
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
            remote_links: remote_links.clone(),
            client_certificates: !local && client_certificates,
            reply_memory: reply_memory.clone(),
            tokens: remote.as_ref().and_then(|r| r.auth.clone()),
            certificates: certificates.clone(),
            refusal_log: Arc::default(),
        })
        .max_decoding_message_size(nvlinkd_proto::MAX_MESSAGE_BYTES)
        .max_encoding_message_size(nvlinkd_proto::MAX_MESSAGE_BYTES)
        // Compressed only for a client that asks (remote shims, for their
        // outputs). Requests are never taken compressed: a 154-byte message
        // that decompresses to 4 MiB made each byte a caller sent cost the
        // daemon 27 000 times its work (the shim sends none).
        .send_compressed(tonic::codec::CompressionEncoding::Zstd);
        // The token is checked on a call's headers, before its body is read.
        tonic::service::interceptor::InterceptedService::new(server, gate)
    };
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let readiness = Arc::new(crate::observe::metrics::Readiness::default());
    if let Some(addr) = &opts.metrics_listen {
        let listener = TcpListener::bind(addr).await.map_err(|e| format!("cannot serve metrics on {addr}: {e}"))?;
        tokio::spawn(crate::observe::metrics::serve(
            listener,
            crate::observe::metrics::Sources {
                figures: crate::observe::Figures {
                    linker: linker.clone(),
                    blobs: blobs.clone(),
                    staged: staged.clone(),
                    connections: connections.clone(),
                    auth_failures: auth_failures.clone(),
                    remote_links: remote_links.clone(),
                    reply_memory: reply_memory.clone(),
                    auth: remote.as_ref().and_then(|r| r.auth.clone()),
                    certificates: certificates.clone(),
                },
                readiness: readiness.clone(),
            },
            stopped(done_rx),
        ));
    }

    // grpc.health.v1: SERVING until the daemon stops. A stop first says
    // NOT_SERVING (and `/readyz` 503), then closes the listeners: whoever
    // watches the health learns of the drain before connections are refused.
    let (health, health_service) = tonic_health::server::health_reporter();
    // Anyone may ask for health: its messages are a few bytes, and no
    // caller without a token holds more (`net/partial.rs`).
    let health_service = health_service.max_decoding_message_size(crate::net::partial::HEALTH_MESSAGE_BYTES);
    health.set_serving::<NvlinkdServer<Service>>().await;
    {
        let (health, rx, readiness) = (health.clone(), shutdown_rx.clone(), readiness.clone());
        tokio::spawn(async move {
            stopped(rx).await;
            readiness.drain();
            health.set_not_serving::<NvlinkdServer<Service>>().await;
            health.set_service_status("", tonic_health::ServingStatus::NotServing).await;
            let _ = close_tx.send(true);
        });
    }

    let unix_server =
        builder().add_service(health_service.clone()).add_service(service(true, None)).serve_with_incoming_shutdown(
            crate::net::local::guarded(
                unix,
                crate::net::local::LocalLimits::new(opts.max_connections, nofile),
                Arc::default(),
            ),
            stopped(close_rx.clone()),
        );
    type Served = std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), tonic::transport::Error>> + Send>>;
    let tcp_server: Option<Served> = match &remote {
        Some(remote) => {
            let listener = TcpListener::bind(&remote.listen).await?;
            if remote.tls.is_none() {
                warn!(listen = %remote.listen, "--insecure: serving remote shims without TLS");
            }
            if !remote.authenticated {
                warn!(listen = %remote.listen, "--insecure: serving remote shims without authentication");
            }
            let connection_limits = crate::net::incoming::ConnectionLimits::new(opts.max_connections, nofile);
            info!(
                listen = %remote.listen,
                tls = remote.tls.is_some(),
                tokens = remote.auth.is_some(),
                client_certificates,
                max_connections = connection_limits.total,
                per_peer = connection_limits.per_peer,
                reserved = connection_limits.reserved,
                max_remote_links = remote_links.max,
                per_caller = remote_links.per_caller,
                "serving remote shims over TCP"
            );
            let tcp = crate::net::incoming::guarded(listener, connection_limits, connections.clone());
            // A few streams per connection, and pings that find peers gone
            // (`incoming.rs`); the unix socket keeps hyper's defaults.
            // Messages received in part hold bytes of a budget (`net/partial.rs`).
            let partial = remote_links.partial.clone();
            let budgeted =
                tower::util::MapRequestLayer::new(move |req: tonic::codegen::http::Request<tonic::body::Body>| {
                    use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
                    let ext = req.extensions();
                    let tls = ext.get::<TlsConnectInfo<TcpConnectInfo>>();
                    let address = ext
                        .get::<TcpConnectInfo>()
                        .or_else(|| tls.map(|i| i.get_ref()))
                        .and_then(|i| i.remote_addr())
                        .map(|a| a.ip());
                    let certificate = tls.and_then(|t| t.peer_certs()).and_then(|c| c.first().map(|c| c.to_vec()));
                    // The token as the gate reads it (`Bearer` however spelled).
                    let token = req.headers().get("authorization").and_then(|v| v.to_str().ok());
                    let peer = crate::net::partial::who(token, certificate.as_deref(), address);
                    let partial = partial.clone();
                    req.map(|body| {
                        tonic::body::Body::new(crate::net::partial::Budgeted::new(body, partial, peer, address))
                    })
                });
            let router = builder()
                .layer(budgeted)
                .max_concurrent_streams(Some(crate::net::incoming::MAX_STREAMS))
                .http2_keepalive_interval(Some(crate::net::incoming::KEEPALIVE_INTERVAL))
                .http2_keepalive_timeout(Some(crate::net::incoming::KEEPALIVE_TIMEOUT))
                .add_service(health_service)
                .add_service(service(false, remote.auth.clone()));
            let close = stopped(close_rx.clone());
            Some(match &remote.tls {
                // TLS terminated here (`net/tls.rs`), so that SIGHUP can change its files.
                Some(tls) => Box::pin(router.serve_with_incoming_shutdown(
                    crate::net::tls::incoming(tcp, tls.clone(), connections.clone()),
                    close,
                )),
                None => Box::pin(router.serve_with_incoming_shutdown(tcp, close)),
            })
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
    readiness.listening();
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
    // Only the socket bound, where it was bound.
    bound.remove();
    if let Err(e) = &result {
        error!("server error: {e}");
    }
    info!("nvlinkd stopped");
    let _ = done_tx.send(true);
    result.map_err(Into::into)
}
