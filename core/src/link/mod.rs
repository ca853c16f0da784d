//! The linker: one request in, one [`Outcome`] out.
//!
//! [`Linker::link`] is the whole of nvlink's behaviour as a function. It
//! parses the command line, dispatches on the mode, and for device links
//! looks the result up in the cache, builds the link plan and runs an engine:
//! in process when the plan is one the finalizer reproduces byte for byte,
//! otherwise the real nvlink (on the caller's files when this process shares
//! its filesystem, otherwise on a sandboxed copy of them), or a fallback
//! answer that tells the shim to run nvlink itself.
//!
//! - `mod.rs` (here): [`Linker`], the state links share (toolkits, cache,
//!   scheduler, pools, memos, workers, counters), its construction, its
//!   figures ([`Linker::snapshot`]) and the entry points
//!   ([`Linker::link_cancellable`]), which count how a link ended;
//! - `pass.rs`: [`Link`], one link's value, whose methods are its
//!   passes in order: parse and mode, claim outputs, keys and lookup, plan,
//!   admit, engine, answer, store;
//! - `engine.rs`: the engines as a link runs them (the in-process engine on
//!   the `--jobs` pool, the real nvlink) and what their results become;
//! - `answer.rs`: nvlink's answer made from an engine's result.

mod answer;
mod engine;
mod pass;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use dashmap::DashMap;
use tracing::{info_span, Span};

use crate::cache::flight::Flights;
use crate::cache::{LinkEntry, Store};
use crate::declined::{Declined, Reason, ReasonCounts};
use crate::diag::{Diagnostic, EXIT_FATAL};
use crate::fs::{HashMemo, InputFs};
use crate::input::memo::DecodeMemo;
use crate::linkcache::MemoFs;
use crate::observe::{Ignore, LinkObs, Observer};
use crate::request::{EngineKind, Outcome, Request};
use crate::sched::Scheduler;
use crate::stats::{bump, Stats};
use crate::toolkit::Toolkit;
use crate::worker::{Cancel, PoolConfig, Stopped, WorkerPool};
use pass::{Ctl, Link};

/// How a linker is set up.
#[derive(Clone, Debug, Default)]
pub struct LinkerConfig {
    /// The toolkits this linker links with (roots, one per installed release;
    /// the first serves requests that name no release). Only these are ever
    /// executed or loaded: a request names a release, never a directory.
    pub toolkits: Vec<PathBuf>,
    /// Cache and scratch directory.
    pub cache_dir: PathBuf,
    /// Worker threads for parallel work (None: one per CPU).
    pub jobs: Option<usize>,
    /// In-memory cache bound, bytes.
    pub cache_mem: u64,
    /// On-disk cache bound, bytes.
    pub cache_size: u64,
    /// Executable whose `worker` subcommand runs libnvJitLink out of this
    /// process (`nvlinkd`); None loads the library into this process.
    pub worker_exe: Option<PathBuf>,
    /// Address-space limit of each worker, bytes (0: none).
    pub worker_mem: u64,
    /// Longest time one nvJitLink request may take in a worker (None: 30 min).
    pub worker_timeout: Option<std::time::Duration>,
    /// Whether links computed in process are checked against the real
    /// nvlink (`verify.rs`).
    pub verify: crate::verify::VerifyMode,
    /// How the processes that parse client bytes are confined (`confine.rs`).
    pub confine: crate::confine::Policy,
}

/// Default time limit of one nvJitLink request in a worker.
pub const DEFAULT_WORKER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30 * 60);

pub struct Linker {
    config: LinkerConfig,
    toolkits: Arc<Toolkits>,
    pub stats: Stats,
    /// Links the in-process engine passed to the real nvlink, per reason.
    routed: ReasonCounts,
    /// Links answered "fall back", per reason.
    fallback_reasons: ReasonCounts,
    /// Links the daemon is answering now (shared with the verifier, which
    /// waits for none before each background comparison).
    in_flight: Arc<std::sync::atomic::AtomicU64>,
    /// The last link id given out (see [`Linker::link_span`]).
    last_link_id: std::sync::atomic::AtomicU64,
    cache: Option<LinkCache>,
    /// Workers for parallel compile steps (`--jobs`).
    pool: rayon::ThreadPool,
    /// The same for background links, threads at idle CPU priority (`sched.rs`).
    bg_pool: rayon::ThreadPool,
    /// The same for remote callers' foreground links: a remote link blocks
    /// a thread for its whole NVVM compile or ptxas run, and two of them
    /// filling `pool` kept a local link waiting 118 s.
    remote_pool: rayon::ThreadPool,
    /// Admission of links that must compute (`sched.rs`).
    sched: Scheduler,
    /// Links running now by (working directory, output file): a newer link of
    /// the same output supersedes the older one (see `Link::claim_output`, `pass.rs`).
    outputs: std::sync::Mutex<std::collections::HashMap<(PathBuf, PathBuf), Cancel>>,
    /// Test hooks (`hooks.rs`), read from the environment once.
    hooks: crate::hooks::TestHooks,
    /// Single flight for artifacts when there is no cache.
    no_cache_flights: Flights<Arc<[u8]>>,
    /// Decoded SASS members of inputs, kept across requests.
    decode_memo: DecodeMemo,
    /// Contents of local input files, shared by the links reading them.
    contents: Arc<crate::fs::ContentMemo>,
    /// Content hashes of unchanged local inputs.
    hashes: HashMemo,
    /// Worker processes running libnvJitLink (see `worker.rs`).
    workers: Option<Arc<WorkerPool>>,
    /// Content keys of whole-link entries that speculative links computed (or
    /// are computing) and no real link has used yet, newest last; bounded.
    speculated: std::sync::Mutex<std::collections::VecDeque<crate::cache::Key>>,
    /// Checks links computed in process against the real nvlink (`verify.rs`).
    verifier: crate::verify::Verifier,
    /// When this linker started (`uptime_s` in the stats).
    started: std::time::Instant,
    /// Whoever watches links (`observe.rs`): told of phases, admissions and
    /// verification's mismatches.
    observer: Arc<dyn Observer>,
}

/// `text` with every scratch directory's name (`nvlinkd-<pid>-<n>-<hex>`,
/// `engine::process::Scratch`) as `<scratch>`: it names the daemon's pid.
fn scrub_scratch_names(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("nvlinkd-") {
        out.push_str(&rest[..at]);
        let tail = &rest[at + "nvlinkd-".len()..];
        let mut parts = tail.splitn(4, '-');
        let (pid, n) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
        let hex_len = parts.next().map_or(0, |h| h.bytes().take_while(u8::is_ascii_hexdigit).count());
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        if digits(pid) && digits(n) && hex_len > 0 {
            out.push_str("<scratch>");
            rest = &tail[pid.len() + n.len() + 2 + hex_len..];
        } else {
            out.push_str("nvlinkd-");
            rest = tail;
        }
    }
    out.push_str(rest);
    out
}

/// How many unused speculative entries are remembered for `speculative_hits`.
const SPECULATED_MAX: usize = 1024;

/// Upper bound of the decoded-member memo (it is also bounded by `--cache-mem`).
const DECODE_MEMO_MAX: u64 = 256 << 20;
/// Most bytes of local input files remembered by identity (`fs::ContentMemo`).
const CONTENT_MEMO_MAX: u64 = 128 << 20;

/// Most workers a toolkit gets started ahead of its links (`--jobs` bounds
/// them too); beyond, a link starts the one it needs. Each idle worker holds
/// about 6 MB of its own memory (the library's pages are shared).
const PREWARM_WORKERS: usize = 16;

/// A toolkit being opened, shared by the links waiting for it.
type Opening = std::sync::OnceLock<Result<Arc<Toolkit>, String>>;

/// The toolkits a linker opened, by root.
#[derive(Default)]
struct Toolkits {
    open: DashMap<PathBuf, Arc<Toolkit>>,
    /// Toolkits being opened (one opening per root, however many links wait).
    opening: DashMap<PathBuf, Arc<Opening>>,
    /// Where a newly opened toolkit gets its first worker started.
    workers: Option<Arc<WorkerPool>>,
    /// Where toolkits remember their content identity (`toolkit.rs`).
    identity_memo: Option<PathBuf>,
}

impl Toolkits {
    /// The toolkit at `root`, opened once and kept. Concurrent first links of
    /// a toolkit open it once (one `nvlink --version`) and share it; a failed
    /// opening is tried again by a later link.
    fn open(&self, root: &Path) -> Result<Arc<Toolkit>, String> {
        if let Some(tk) = self.open.get(root) {
            return Ok(tk.clone());
        }
        let cell = self.opening.entry(root.to_owned()).or_default().clone();
        let opened = cell
            .get_or_init(|| {
                let mut tk = Toolkit::open(root).map_err(|e| e.to_string())?;
                if let Some(dir) = &self.identity_memo {
                    tk = tk.with_identity_memo(dir.clone());
                }
                let tk = Arc::new(tk);
                if let Some(w) = &self.workers {
                    // Start the workers now (up to --jobs, at most
                    // PREWARM_WORKERS; see WorkerPool::prewarm): loading nvJitLink
                    // costs tens of milliseconds, which a burst of first links
                    // would otherwise pay on its way.
                    let (w, lib) = (w.clone(), tk.jitlink_spec());
                    std::thread::spawn(move || w.prewarm(&lib, PREWARM_WORKERS));
                }
                // The identity for keys: remembered (a few stats), or
                // hashed on a thread while the first links use a
                // provisional one (see Toolkit::key_identity).
                tk.prime();
                Ok(tk)
            })
            .clone();
        if let Ok(tk) = &opened {
            self.open.entry(root.to_owned()).or_insert_with(|| tk.clone());
        }
        self.opening.remove(root);
        opened
    }
}

/// The whole-link cache of a linker.
struct LinkCache {
    store: Arc<Store>,
    flights: Flights<Arc<LinkEntry>>,
    /// Single flight for intermediate artifacts (JIT, NVVM, ptxas).
    artifact_flights: Flights<Arc<[u8]>>,
}

/// See [`Linker::in_flight_guard`].
pub struct InFlight<'a>(&'a std::sync::atomic::AtomicU64);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Linker {
    /// A linker nobody observes ([`Linker::observed`] with [`Ignore`]).
    pub fn new(config: LinkerConfig) -> Self {
        Linker::observed(config, Arc::new(Ignore))
    }

    /// A linker whose links `observer` watches: their phases, admissions and
    /// verification's mismatches, as typed events (`observe.rs`).
    pub fn observed(config: LinkerConfig, observer: Arc<dyn Observer>) -> Self {
        let _ = std::fs::create_dir_all(config.cache_dir.join("tmp"));
        let in_flight = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let cache = (config.cache_mem > 0 || config.cache_size > 0).then(|| LinkCache {
            store: Arc::new(Store::open(
                (config.cache_size > 0).then_some(config.cache_dir.as_path()),
                config.cache_mem,
                config.cache_size,
            )),
            flights: Flights::default(),
            artifact_flights: Flights::default(),
        });
        let mut pool = rayon::ThreadPoolBuilder::new().thread_name(|i| format!("nvlinkd-worker-{i}"));
        if let Some(j) = config.jobs {
            pool = pool.num_threads(j);
        }
        let pool = pool.build().unwrap_or_else(|_| rayon::ThreadPoolBuilder::new().build().expect("thread pool"));
        let jobs = pool.current_num_threads();
        let bg_pool = rayon::ThreadPoolBuilder::new()
            .thread_name(|i| format!("nvlinkd-idle-{i}"))
            .num_threads(jobs)
            .start_handler(|_| crate::sched::idle_priority())
            .build()
            .unwrap_or_else(|_| rayon::ThreadPoolBuilder::new().build().expect("thread pool"));
        let remote_pool = rayon::ThreadPoolBuilder::new()
            .thread_name(|i| format!("nvlinkd-remote-{i}"))
            .num_threads(jobs)
            .build()
            .unwrap_or_else(|_| rayon::ThreadPoolBuilder::new().build().expect("thread pool"));
        let workers = config.worker_exe.clone().map(|exe| {
            WorkerPool::new(PoolConfig {
                exe,
                max: pool.current_num_threads(),
                mem_limit: config.worker_mem,
                timeout: config.worker_timeout.unwrap_or(DEFAULT_WORKER_TIMEOUT),
                confine: config.confine.clone(),
            })
        });
        // Open the default toolkit now, off the first link's path (a link
        // arriving meanwhile waits for this one opening, not a second one).
        let toolkits = Arc::new(Toolkits {
            workers: workers.clone(),
            identity_memo: Some(config.cache_dir.join("toolkits")),
            ..Default::default()
        });
        for root in config.toolkits.iter().filter(|r| r.join("bin/nvlink").is_file()) {
            let (toolkits, root) = (toolkits.clone(), root.clone());
            let _ = std::thread::Builder::new().name("nvlinkd-toolkit".into()).spawn(move || toolkits.open(&root));
        }
        Linker {
            toolkits,
            stats: Stats::default(),
            routed: ReasonCounts::default(),
            fallback_reasons: ReasonCounts::default(),
            in_flight: in_flight.clone(),
            last_link_id: Default::default(),
            cache,
            pool,
            bg_pool,
            remote_pool,
            sched: Scheduler::new(jobs),
            outputs: Default::default(),
            hooks: crate::hooks::TestHooks::from_env(),
            no_cache_flights: Flights::default(),
            decode_memo: DecodeMemo::new(config.cache_mem.min(DECODE_MEMO_MAX)),
            contents: Arc::new(crate::fs::ContentMemo::new(config.cache_mem.min(CONTENT_MEMO_MAX))),
            hashes: HashMemo::default(),
            workers,
            speculated: Default::default(),
            verifier: crate::verify::Verifier::new(config.verify, &config.cache_dir, in_flight),
            started: std::time::Instant::now(),
            config,
            observer,
        }
    }

    /// Put a shared cache tier (the daemon's REAPI cache) behind memory and
    /// disk, for whole links and artifacts. Without a cache, nothing.
    pub fn set_remote_tier(&self, remote: Arc<dyn crate::cache::RemoteTier>) {
        if let Some(c) = &self.cache {
            c.store.set_remote(remote);
        }
    }

    /// The toolkit identity a link keys with: the content identity where a
    /// shared tier is behind the cache (only it finds other hosts' entries:
    /// a fresh replica's first links wait for the hash rather than miss the
    /// tier), else [`Toolkit::key_identity`], which does not wait.
    pub(crate) fn key_identity(&self, tk: &Toolkit) -> [u8; 32] {
        match &self.cache {
            Some(c) if c.store.has_remote() => tk.identity(),
            _ => tk.key_identity(),
        }
    }

    /// The memo of local input files' contents, for the daemon's file views.
    pub fn contents(&self) -> &Arc<crate::fs::ContentMemo> {
        &self.contents
    }

    pub fn stats_json(&self) -> String {
        self.snapshot().to_json()
    }

    /// One reading of every figure of this linker (`stats.rs`).
    pub fn snapshot(&self) -> crate::stats::Snapshot {
        use std::sync::atomic::Ordering::Relaxed;
        let (mem, disk, corrupt, write_errors, disk_on) = match &self.cache {
            Some(c) => {
                let (m, d) = c.store.sizes();
                (m, d, c.store.corrupt.load(Relaxed), c.store.write_errors.load(Relaxed), c.store.has_disk())
            }
            None => (0, 0, 0, 0, false),
        };
        let mut s = crate::stats::Snapshot::default();
        self.stats.read_into(&mut s);
        s.gauge("in_flight", self.in_flight.load(Relaxed));
        s.gauge("cache_mem_bytes", mem);
        s.gauge("cache_disk_bytes", disk);
        s.counter("cache_corrupt_entries", corrupt);
        s.counter("cache_write_errors", write_errors);
        s.gauge("cache_disk", u64::from(disk_on));
        s.gauge("decoded_input_bytes", self.decode_memo.bytes());
        s.gauge("input_memo_bytes", self.contents.bytes());
        s.counter("input_memo_hits", self.contents.hits());
        s.counter("worker_crashes", self.workers.as_ref().map_or(0, |w| w.crashes.load(Relaxed)));
        s.gauge("workers", self.workers.as_ref().map_or(0, |w| w.live()));
        s.gauge("queued", self.sched.queued());
        s.gauge("running_foreground", self.sched.running().0);
        s.gauge("running_background", self.sched.running().1);
        s.gauge("uptime_s", self.started.elapsed().as_secs());
        // Toolkits whose links key with a provisional identity (see Toolkit::key_identity).
        let hashing = self.toolkits.open.iter().filter(|t| !t.identity_ready()).count() + self.toolkits.opening.len();
        s.gauge("toolkits_hashing", hashing as u64);
        let v = self.verifier.counters();
        s.counter("verified", v.verified.load(Relaxed));
        s.counter("verify_mismatches", v.mismatches.load(Relaxed));
        s.counter("verify_skipped", v.skipped.load(Relaxed));
        s.gauge("verify_pending", v.pending.load(Relaxed));
        for (name, value) in self.cache.as_ref().map(|c| c.store.remote_counters()).unwrap_or_default() {
            if name.ends_with("_pending") {
                s.gauge(name, value);
            } else {
                s.counter(name, value);
            }
        }
        s.routed = self.routed.pairs();
        s.fallback_reasons = self.fallback_reasons.pairs();
        s.toolkits = self.config.toolkits.iter().map(|t| t.display().to_string()).collect();
        s
    }

    /// "Run the real nvlink yourself" (counted with its reason where the link
    /// ends, [`Linker::link_cancellable`], unless the link was cancelled).
    pub(super) fn fall_back(&self, why: Declined) -> Outcome {
        Outcome::fallback(why)
    }

    /// Count a link as in flight until the guard drops (from the moment the
    /// daemon accepts it, before any work).
    pub fn in_flight_guard(&self) -> InFlight<'_> {
        self.in_flight.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        InFlight(&self.in_flight)
    }

    /// Count an internal failure (a link that panicked).
    pub fn note_failure(&self) {
        bump(&self.stats.failures);
    }

    /// The toolkit a request links with: the linker's own toolkit of the
    /// release the request names (the first one when it names none), opened
    /// once and kept. Nothing of the request is used as a path.
    /// Whether the default toolkit (the one links naming no release get) is
    /// open: its nvlink answered `--version` and links need not wait for it
    /// (a daemon's readiness, `/readyz`). Opening starts in [`Linker::new`].
    pub fn toolkit_ready(&self) -> bool {
        let mut roots = self.config.toolkits.iter().filter(|p| p.join("bin/nvlink").is_file());
        roots.next().is_some_and(|root| self.toolkits.open.contains_key(root))
    }

    fn toolkit(&self, req: &Request) -> Result<Arc<Toolkit>, String> {
        let mut roots = self.config.toolkits.iter().filter(|p| p.join("bin/nvlink").is_file());
        let Some(wanted) = req.toolkit.as_deref().filter(|t| !t.is_empty()) else {
            let root = roots.next().ok_or_else(|| "no CUDA toolkit known to the daemon".to_string())?;
            return self.toolkits.open(root);
        };
        for root in roots {
            if let Ok(tk) = self.toolkits.open(root) {
                if tk.release.identity() == wanted {
                    return Ok(tk);
                }
            }
        }
        let first = wanted.lines().next().unwrap_or(wanted);
        Err(format!("the daemon has no toolkit of this release ({first})"))
    }

    /// `text` as a caller on another host may read it: the daemon's own
    /// paths (its toolkits, its cache and scratch directories) named by
    /// their role, as its remote `Ping` and `Stats` do. A place inside what
    /// the caller `said` itself (its arguments, cwd, environment) is left as
    /// it is wherever it appears: were it redacted, the answer would tell the
    /// caller that its guess (`-L<guess>/../..`) is one of the daemon's paths.
    pub fn redact(&self, text: &str, said: &[&str]) -> String {
        let mut places: Vec<(String, &str)> =
            self.config.toolkits.iter().map(|t| (t.to_string_lossy().into_owned(), "<toolkit>")).collect();
        places.push((self.config.cache_dir.to_string_lossy().into_owned(), "<cache-dir>"));
        // The longest first: a toolkit inside the cache directory stays a toolkit.
        places.sort_by_key(|(p, _)| std::cmp::Reverse(p.len()));
        let mut out = text.to_owned();
        for (place, role) in places.iter().filter(|(p, _)| p.len() > 1) {
            if !said.iter().any(|s| s.contains(place.as_str())) {
                out = out.replace(place.as_str(), role);
            }
        }
        scrub_scratch_names(&out)
    }

    pub(super) fn scratch_dir(&self) -> PathBuf {
        self.config.cache_dir.join("tmp")
    }

    /// Longest time one worker request, ptxas or nvlink run may take.
    pub(super) fn worker_limit(&self) -> std::time::Duration {
        self.config.worker_timeout.unwrap_or(DEFAULT_WORKER_TIMEOUT)
    }

    /// Where the real nvlink's scratch directories go, in order of preference.
    pub(super) fn scratch_parents(&self) -> [PathBuf; 2] {
        crate::engine::process::scratch_parents(&self.scratch_dir())
    }

    /// Link one request, inside its own [`Linker::link_span`].
    pub fn link(&self, req: &Request, fs: &dyn InputFs) -> Outcome {
        let (id, span) = self.link_span_with_id(req);
        let _entered = span.enter();
        self.link_cancellable(id, req, fs, &Cancel::new())
    }

    /// The span of one link: a link id (unique in this linker) and a summary
    /// of its arguments, so that the lines of concurrent links can be told
    /// apart. Every phase of the link is a span inside it (`keys`, `store`,
    /// and the phases of `observe.rs`: `plan`, `jit`, `jitlink`, `nvvm`,
    /// `ptxas`, `finalize`, `nvlink`), entered again on the `--jobs` pool for
    /// parallel work. The daemon enters it around the whole link, its own
    /// lines included.
    pub fn link_span(&self, req: &Request) -> Span {
        self.link_span_with_id(req).1
    }

    /// [`Linker::link_span`] and the link id it carries (events name links by
    /// it: pass it to [`Linker::link_cancellable`]).
    pub fn link_span_with_id(&self, req: &Request) -> (u64, Span) {
        let id = self.last_link_id.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        (id, info_span!("link", id, args = %args_summary(&req.args)))
    }

    /// The admission of links that must compute (`sched.rs`): for work that
    /// computes outside [`Linker::link_cancellable`].
    pub fn scheduler(&self) -> &Scheduler {
        &self.sched
    }

    /// [`Linker::link`], with the link's control handle: its priority class
    /// (`Cancel::with_priority`; background links are admitted only into idle
    /// slots and compute at idle CPU priority, see `sched.rs`), and the power to
    /// cancel it: the worker or child process serving it is killed at once, a
    /// queued link leaves the queue, and the link answers "fall back"
    /// ([`Cancel::stopped`] says why). A link with an output file supersedes an
    /// older link of the same output from the same working directory still
    /// running (see `Link::claim_output`, `pass.rs`).
    ///
    /// `link` is the link's id ([`Linker::link_span_with_id`]): the
    /// observer's events about this link carry it. Called inside the link's
    /// span, whose children the phase spans are.
    pub fn link_cancellable(&self, link: u64, req: &Request, fs: &dyn InputFs, cancel: &Cancel) -> Outcome {
        let obs = LinkObs::new(link, self.observer.clone(), Span::current()).with_cancel(cancel);
        let outcome = self.link_controlled(req, fs, Ctl { cancel, obs: &obs });
        // A link that gives up is counted once, here: a stopped link as
        // `cancelled` (its caller no longer wants the answer), any other as a
        // `fallback`, with its reason.
        if let Some(why) = &outcome.fallback {
            match cancel.stopped() {
                Some(Stopped::TimedOut) | None => {
                    bump(&self.stats.fallbacks);
                    self.fallback_reasons.bump(why.reason);
                }
                Some(stopped) => {
                    bump(&self.stats.cancelled);
                    if stopped == Stopped::Superseded {
                        bump(&self.stats.cancelled_superseded);
                    }
                }
            }
        }
        outcome
    }

    /// The link's passes (`pass.rs`): its file view and toolkit, then the
    /// per-link [`Link`] value, which runs the rest.
    fn link_controlled(&self, req: &Request, fs: &dyn InputFs, ctl: Ctl<'_>) -> Outcome {
        if !req.speculative {
            bump(&self.stats.requests);
        }
        ctl.cancel.set_tenant(req.tenant());
        // One view of the files for the whole link: options files, the key and
        // the link all see the same reads and stats.
        let memo = MemoFs::new(fs);
        let tk = match self.toolkit(req) {
            Ok(tk) => tk,
            Err(reason) => return self.fall_back(Declined::new(Reason::NoToolkit, reason)),
        };
        if tk.changed_on_disk() {
            let why = format!(
                "the toolkit at {} changed on disk since the daemon opened it: restart the daemon (nvlinkd stop)",
                tk.root.display()
            );
            return self.fall_back(Declined::new(Reason::ToolkitChanged, why));
        }
        match Link::parse(self, tk, req, &memo, ctl) {
            Ok(link) => link.run(),
            Err(answered) => *answered,
        }
    }

    /// A speculative link is about to compute the entry under `key`.
    pub(super) fn note_speculated(&self, key: crate::cache::Key) {
        let mut s = self.speculated.lock().unwrap_or_else(|p| p.into_inner());
        if !s.contains(&key) {
            if s.len() >= SPECULATED_MAX {
                s.pop_front();
            }
            s.push_back(key);
        }
    }

    /// A real link was served from the entry under `key`: a speculative hit if
    /// a speculative link made it (counted once).
    pub(super) fn note_speculated_use(&self, key: &crate::cache::Key) {
        let mut s = self.speculated.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = s.iter().position(|k| k == key) {
            s.remove(i);
            bump(&self.stats.speculative_hits);
        }
    }

    pub(super) fn frontend(&self, exit_code: i32, stdout: Vec<u8>, stderr: Vec<u8>) -> Outcome {
        bump(&self.stats.frontend);
        Outcome::answer(EngineKind::Frontend, exit_code, stdout, stderr, Vec::new())
    }

    /// Fatal messages of the input stage (printed in order, exit status 1).
    pub(super) fn fatals(&self, ds: Vec<Diagnostic>) -> Outcome {
        let text: String = ds.iter().map(|d| format!("{d}\n")).collect();
        self.frontend(EXIT_FATAL, Vec::new(), text.into_bytes())
    }

    pub(super) fn fatal(&self, d: Diagnostic) -> Outcome {
        self.frontend(EXIT_FATAL, Vec::new(), format!("{d}\n").into_bytes())
    }
}

/// The arguments of a link as its span shows them: joined, at most 160 bytes.
/// A link's arguments for a log line: joined, cut at 160 bytes, and with
/// every control character escaped (`\n`, `\u{1b}`): arguments come from
/// clients, and a newline or a terminal escape in one must not forge a log
/// line or rewrite an operator's terminal.
pub fn args_summary(args: &[String]) -> String {
    let mut s = String::new();
    for (i, a) in args.iter().enumerate() {
        if i > 0 {
            s.push(' ');
        }
        for c in a.chars() {
            if c.is_control() {
                s.extend(c.escape_default());
            } else {
                s.push(c);
            }
        }
    }
    if s.len() > 160 {
        let mut cut = 157;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push_str("...");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scratch_names_are_scrubbed_of_the_pid() {
        let t = "<cache-dir>/tmp/nvlinkd-4242-7-1a2b3c/root/x.o: nvlinkd-fs and nvlinkd-1-x stay";
        assert_eq!(scrub_scratch_names(t), "<cache-dir>/tmp/<scratch>/root/x.o: nvlinkd-fs and nvlinkd-1-x stay");
        assert_eq!(scrub_scratch_names("nvlinkd-"), "nvlinkd-");
        assert_eq!(scrub_scratch_names("a nvlinkd-12-3-ff"), "a <scratch>");
    }
}
