//! The linker: one request in, one [`Outcome`] out.
//!
//! `Linker::link` is the whole of nvlink's behaviour as a function. It parses
//! the command line, dispatches on the mode, and for device links builds the
//! link plan, looks the result up in the cache, and runs an engine: in process
//! when the plan is one the finalizer reproduces byte for byte, otherwise the
//! real nvlink (on the caller's files when this process shares its filesystem,
//! otherwise on a sandboxed copy of them), or a fallback answer that tells the
//! shim to run nvlink itself.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use dashmap::DashMap;
use tracing::{debug, info_span, warn, Span};

use crate::cache::flight::Flights;
use crate::cache::{LinkEntry, Store};
use crate::cli::parse::{parse, Stop};
use crate::cli::spec::{HostScript, Mode, Spec};
use crate::declined::{Declined, Reason, ReasonCounts};
use crate::diag::{Diagnostic, Filters, Report, EXIT_FATAL};
use crate::elf::{header_machine, EM_CUDA};
use crate::engine::artifacts::Artifacts;
use crate::engine::inprocess;
use crate::engine::process;
use crate::engine::sandbox::{Sandbox, SandboxError};
use crate::fs::{absolute, HashMemo, InputFs};
use crate::ghls;
use crate::input::libsearch;
use crate::input::load::{LoadContext, LoadError};
use crate::input::memo::DecodeMemo;
use crate::linkcache::{self, MemoFs};
use crate::observe::{Ignore, LinkObs, Observer, Phase, Step};
use crate::plan;
use crate::regbin;
use crate::request::{EngineKind, Outcome, OutputFile, Request};
use crate::sched::{Priority, Scheduler, Slot};
use crate::stats::{bump, Stats};
use crate::toolkit::Toolkit;
use crate::worker::{Cancel, PoolConfig, Stopped, WorkerPool};

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
    in_flight: std::sync::atomic::AtomicU64,
    /// The last link id given out (see [`Linker::link_span`]).
    last_link_id: std::sync::atomic::AtomicU64,
    cache: Option<LinkCache>,
    /// Workers for parallel compile steps (`--jobs`).
    pool: rayon::ThreadPool,
    /// The same for background links, threads at idle CPU priority (`sched.rs`).
    bg_pool: rayon::ThreadPool,
    /// Admission of links that must compute (`sched.rs`).
    sched: Scheduler,
    /// Links running now by (working directory, output file): a newer link of
    /// the same output supersedes the older one (see [`Linker::claim_output`]).
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

/// One link's handles, passed down its steps: its control handle (priority,
/// cancellation) and its observation handle (`observe.rs`).
#[derive(Clone, Copy)]
struct Ctl<'a> {
    cancel: &'a Cancel,
    obs: &'a LinkObs,
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
const PREWARM_WORKERS: usize = 8;

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
                let tk = Toolkit::open(root).map(Arc::new).map_err(|e| e.to_string())?;
                // Before any link needs it (a few stats).
                tk.identity();
                if let Some(w) = &self.workers {
                    // Start the workers now (up to --jobs, at most
                    // PREWARM_WORKERS), one after another: loading nvJitLink
                    // costs tens of milliseconds, which a burst of first links
                    // would otherwise pay on its way.
                    let (w, lib) = (w.clone(), tk.jitlink_spec());
                    std::thread::spawn(move || w.prewarm(&lib, PREWARM_WORKERS));
                }
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
        let toolkits = Arc::new(Toolkits { workers: workers.clone(), ..Default::default() });
        for root in config.toolkits.iter().filter(|r| r.join("bin/nvlink").is_file()) {
            let (toolkits, root) = (toolkits.clone(), root.clone());
            let _ = std::thread::Builder::new().name("nvlinkd-toolkit".into()).spawn(move || toolkits.open(&root));
        }
        Linker {
            toolkits,
            stats: Stats::default(),
            routed: ReasonCounts::default(),
            fallback_reasons: ReasonCounts::default(),
            in_flight: Default::default(),
            last_link_id: Default::default(),
            cache,
            pool,
            bg_pool,
            sched: Scheduler::new(jobs),
            outputs: Default::default(),
            hooks: crate::hooks::TestHooks::from_env(),
            no_cache_flights: Flights::default(),
            decode_memo: DecodeMemo::new(config.cache_mem.min(DECODE_MEMO_MAX)),
            contents: Arc::new(crate::fs::ContentMemo::new(config.cache_mem.min(CONTENT_MEMO_MAX))),
            hashes: HashMemo::default(),
            workers,
            speculated: Default::default(),
            verifier: crate::verify::Verifier::new(config.verify, &config.cache_dir),
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
    fn fall_back(&self, why: Declined) -> Outcome {
        Outcome::fallback(why)
    }

    /// The in-process engine declined: the real nvlink serves the link.
    fn route(
        &self,
        tk: &Toolkit,
        req: &Request,
        fs: &dyn InputFs,
        spec: &Spec,
        ctl: Ctl<'_>,
        why: Declined,
    ) -> Outcome {
        debug!(reason = %why.reason, why = %why.detail, "routed to nvlink");
        self.routed.bump(why.reason);
        self.run_nvlink(tk, req, fs, spec, ctl).routed(why)
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

    fn scratch_dir(&self) -> PathBuf {
        self.config.cache_dir.join("tmp")
    }

    /// Where the real nvlink's scratch directories go, in order of preference.
    fn scratch_parents(&self) -> [PathBuf; 2] {
        process::scratch_parents(&self.scratch_dir())
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
    /// running (see [`Linker::claim_output`]).
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

    /// Register this link as the one computing `(cwd, output)`, superseding
    /// (cancelling) an older link of the same output still running: an IDE or
    /// a build on save starts a new link and abandons the old one, whose output
    /// would be overwritten anyway. A background link never supersedes a
    /// foreground one (it then does not register); a remote link neither
    /// supersedes nor is superseded. The registration ends when the guard drops.
    fn claim_output(&self, req: &Request, spec: &Spec, ctl: Ctl<'_>) -> Option<OutputClaim<'_>> {
        let cancel = ctl.cancel;
        // A speculative link writes no file: the real link of that output joins
        // its computation (`cache/flight.rs`) instead of superseding it.
        if req.speculative {
            return None;
        }
        // Only a caller sharing this daemon's filesystem (the local user, on the
        // unix socket) supersedes: two remote callers naming the same
        // directory and output are different machines, and neither may stop
        // the other's link.
        if !req.shared_fs {
            return None;
        }
        let out = spec.output.as_ref()?;
        let key = (req.cwd.clone(), absolute(&req.cwd, out));
        let mut map = self.outputs.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(older) = map.get(&key).filter(|older| !older.same(cancel)) {
            if older.priority() == Priority::Foreground && cancel.priority() == Priority::Background {
                return None;
            }
            debug!(output = %key.1.display(), "superseding an older link of the same output");
            older.supersede(ctl.obs.link());
        }
        map.insert(key.clone(), cancel.clone());
        Some(OutputClaim { linker: self, key, cancel: cancel.clone() })
    }

    /// Wait for a scheduler slot before computing (`sched.rs`): None when the
    /// link already holds one; Err with the answer when it was cancelled while
    /// queued.
    fn admit(&self, ctl: Ctl<'_>) -> Result<Option<Admission<'_>>, Box<Outcome>> {
        if !ctl.cancel.take_admission() {
            return Ok(None);
        }
        let Some(slot) = self.sched.admit(ctl.cancel.priority(), ctl.cancel, ctl.obs) else {
            ctl.cancel.end_admission();
            return Err(Box::new(self.fall_back(Declined::new(Reason::Worker, "the link was cancelled while queued"))));
        };
        let admitted = Admission { _slot: slot, cancel: ctl.cancel.clone() };
        if !self.hooks.hold_slot(ctl.cancel) {
            return Err(Box::new(self.fall_back(Declined::new(Reason::Worker, "the link was cancelled"))));
        }
        Ok(Some(admitted))
    }

    /// Wait for a plan permit (`sched.rs`, two stages): a link that must
    /// compute decodes its inputs and plans while others compute, and waits
    /// for a compute slot only then ([`Linker::admit`] in `compute_link`).
    /// Err with the answer when it was cancelled while queued.
    fn admit_plan(&self, ctl: Ctl<'_>) -> Result<Slot<'_>, Box<Outcome>> {
        match self.sched.admit_plan(ctl.cancel.priority(), ctl.cancel, ctl.obs) {
            Some(permit) => Ok(permit),
            None => Err(Box::new(self.fall_back(Declined::new(Reason::Worker, "the link was cancelled while queued")))),
        }
    }

    fn link_controlled(&self, req: &Request, fs: &dyn InputFs, ctl: Ctl<'_>) -> Outcome {
        if !req.speculative {
            bump(&self.stats.requests);
        }
        // One view of the files for the whole link: options files, the key and
        // the link all see the same reads and stats.
        let memo = MemoFs::new(fs);
        let fs = &memo;
        let tk = match self.toolkit(req) {
            Ok(tk) => tk,
            Err(reason) => return self.fall_back(Declined::new(Reason::NoToolkit, reason)),
        };
        let spec = match parse(&req.args, fs, &req.cwd) {
            Ok(parsed) => match Spec::from_parsed(parsed, &req.cwd, req.env.get("LIBRARY_PATH").map(String::as_str)) {
                Ok(s) => s,
                Err(d) => return self.fatal(d),
            },
            Err(Stop::Fatal(d)) => return self.fatal(d),
            Err(Stop::TooLarge(why)) => return self.fall_back(Declined::new(Reason::InputDeclined, why)),
        };
        if let Some(why) = libsearch::past_bounds(&spec.library_paths, req.env.get("LIBRARY_PATH"), &spec.libraries) {
            return self.fall_back(Declined::new(Reason::InputDeclined, why));
        }
        let warnings = spec.warnings_text();
        if spec.report_arch && spec.arch.is_none() && !matches!(spec.mode(), Ok(Mode::Help | Mode::Version)) {
            // nvlink 13.5 crashes (SIGSEGV) on `-report-arch` without `--arch`.
            return self.route(
                &tk,
                req,
                fs,
                &spec,
                ctl,
                Declined::new(Reason::NvlinkCrash, "-report-arch without --arch"),
            );
        }
        let mode = match spec.mode() {
            Ok(m) => m,
            // Another release's option checks are its own (13.0 knows no
            // `--nvvm-latest`): its nvlink answers.
            Err(_) if !tk.release.in_process_proven() => {
                return self.route(&tk, req, fs, &spec, ctl, unproven(&tk));
            }
            Err(d) => return self.fatal(report_arch(&spec, d)).after(warnings),
        };
        debug!(?mode, "dispatch");
        let _claim = match mode {
            Mode::Help | Mode::Version => None,
            _ => self.claim_output(req, &spec, ctl),
        };
        let outcome = match mode {
            Mode::Help => self.frontend(0, tk.help_text().into_bytes(), Vec::new()),
            Mode::Version => self.frontend(0, tk.release.banner.clone().into_bytes(), Vec::new()),
            Mode::HostLinkerScript(kind) => self.host_linker_script(&tk, req, &spec, kind, ctl),
            _ => self.device_link(&tk, req, &memo, &spec, mode, ctl),
        };
        // The real nvlink engine prints the parse warnings itself.
        if outcome.engine == EngineKind::NvlinkProcess {
            outcome
        } else {
            outcome.after(warnings)
        }
    }

    /// Modes H and I: the host linker script, made here (the daemon runs on the
    /// caller's machine when it shares its filesystem).
    fn host_linker_script(&self, tk: &Toolkit, req: &Request, spec: &Spec, kind: HostScript, ctl: Ctl<'_>) -> Outcome {
        if !req.shared_fs {
            return self
                .fall_back(Declined::new(Reason::NotHere, "host linker scripts come from the caller's host tools"));
        }
        let out = spec.output.as_deref().map(|o| absolute(&req.cwd, o));
        if out.as_ref().and_then(|o| o.parent()).is_some_and(|d| !d.is_dir()) {
            return self.run_nvlink(tk, req, &crate::fs::LocalFs, spec, ctl);
        }
        let scratch = match self.scratch_parents().iter().find_map(|p| process::Scratch::new(p).ok()) {
            Some(s) => s,
            None => return self.run_nvlink(tk, req, &crate::fs::LocalFs, spec, ctl),
        };
        let mut report = Report::new(Filters::default());
        match ghls::generate(spec, kind, &req.cwd, &scratch.0, &mut report) {
            Ok(script) => {
                bump(&self.stats.frontend);
                let outputs = match (script.file, out) {
                    (Some(data), Some(path)) => vec![OutputFile { path, data: data.into(), append: false }],
                    _ => Vec::new(),
                };
                Outcome::answer(EngineKind::Frontend, 0, report.stdout, report.stderr, outputs)
            }
            Err(why) => {
                // Not marked as routed: nvlink makes the script as the front end would.
                debug!(reason = %why.reason, why = %why.detail, "host linker script left to nvlink");
                self.routed.bump(why.reason);
                self.run_nvlink(tk, req, &crate::fs::LocalFs, spec, ctl)
            }
        }
    }

    /// Modes A to E, through the whole-link cache: a hit returns the stored
    /// result; identical links in flight are computed once.
    fn device_link(
        &self,
        tk: &Toolkit,
        req: &Request,
        memo: &MemoFs,
        spec: &Spec,
        mode: Mode,
        ctl: Ctl<'_>,
    ) -> Outcome {
        let Some(cache) = &self.cache else {
            let _planning = match self.admit_plan(ctl) {
                Ok(p) => p,
                Err(cancelled) => return *cancelled,
            };
            return self.compute_link(tk, req, memo, spec, mode, ctl);
        };
        let keys = ctl.obs.in_step(Step::Keys, || linkcache::keys(&tk.identity(), req, spec, mode, memo, &self.hashes));
        let Some(keys) = keys else {
            let _planning = match self.admit_plan(ctl) {
                Ok(p) => p,
                Err(cancelled) => return *cancelled,
            };
            return self.compute_link(tk, req, memo, spec, mode, ctl);
        };
        if let Some(o) = self.lookup(cache, &keys, req, spec) {
            if !req.speculative {
                bump(&self.stats.cache_hits);
                self.note_speculated_use(&keys.content);
            }
            return o;
        }
        // Only a link that must compute waits, first for a plan permit, then
        // (in `compute_link`) for a compute slot; one that waited here looks
        // again (an identical link may have filled the cache meanwhile).
        let planning = match self.admit_plan(ctl) {
            Ok(p) => p,
            Err(cancelled) => return *cancelled,
        };
        if planning.queued {
            if let Some(o) = self.lookup(cache, &keys, req, spec) {
                if !req.speculative {
                    bump(&self.stats.cache_hits);
                    self.note_speculated_use(&keys.content);
                }
                return o;
            }
        }
        if req.speculative {
            self.note_speculated(keys.content);
        } else {
            bump(&self.stats.cache_misses);
        }
        self.hooks.pause_after_key();
        // The slot (taken and given back in `compute_link`) and the plan
        // permit are held while the link computes, not while it stores its
        // entry: the next link starts meanwhile (identical links still wait
        // for the entry, on the flight).
        let planning = std::cell::RefCell::new(Some(planning));
        let mine = std::cell::RefCell::new(None);
        // A link that waits for an identical one gives back its plan permit
        // first: a speculative (background) leader waiting for a compute slot
        // is admitted only while no foreground link holds a permit.
        let give_back = || drop(planning.borrow_mut().take());
        let entry = cache.flights.run_or_wait(keys.content, give_back, || {
            let mismatch = || Declined::new(Reason::VerifyMismatch, "verification found the in-process answer wrong");
            let mut outcome = if self.verifier.mismatched(&keys.content) {
                self.route(tk, req, memo, spec, ctl, mismatch())
            } else {
                self.compute_link(tk, req, memo, spec, mode, ctl)
            };
            drop(planning.borrow_mut().take());
            let mut job = self.verification(tk, req, memo, spec, &keys, &outcome, &cache.store, ctl.obs);
            if self.verifier.mode == crate::verify::VerifyMode::Sync {
                if let Some(theirs) = job.take().and_then(|j| self.verifier.now(j, ctl.cancel)) {
                    // nvlink's answer, not ours (and the key is routed from now on).
                    let why = mismatch();
                    self.routed.bump(why.reason);
                    outcome = Outcome::answer(
                        EngineKind::NvlinkProcess,
                        theirs.exit_code,
                        theirs.stdout,
                        theirs.stderr,
                        theirs.outputs,
                    )
                    .routed(why);
                }
            }
            self.hooks.hold_store();
            let entry = self.entry_of(&outcome, req, spec, memo).map(Arc::new);
            match (job, &entry) {
                (Some(mut job), Some(e)) => {
                    job.heal.name_sensitive = e.name_sensitive;
                    self.verifier.later(job);
                }
                // Not stored (an input changed meanwhile): verified another time.
                (Some(job), None) => self.verifier.not_verified(&job.heal.content),
                (None, _) => {}
            }
            if req.speculative && entry.is_none() {
                // Nothing stored: a later real link that computes and stores
                // this key itself is no speculative hit.
                let mut s = self.speculated.lock().unwrap_or_else(|p| p.into_inner());
                s.retain(|k| *k != keys.content);
            }
            if let Some(e) = &entry {
                let _store = ctl.obs.step(Step::Store);
                let bytes = e.encode();
                // The named entry is read only when the content entry says the
                // result depends on names.
                if e.name_sensitive && keys.named != keys.content {
                    cache.store.store("link", &keys.named, bytes.clone());
                }
                cache.store.store("link", &keys.content, bytes);
            }
            *mine.borrow_mut() = Some(outcome);
            entry
        });
        if let Some(outcome) = mine.into_inner() {
            return outcome;
        }
        // Another request computed it: usable unless it depends on names.
        match entry.filter(|e| !e.name_sensitive).and_then(|e| self.outcome_of(&e, req, spec)) {
            Some(o) => {
                if !req.speculative {
                    self.note_speculated_use(&keys.content);
                }
                o
            }
            None => self.compute_link(tk, req, memo, spec, mode, ctl),
        }
    }

    /// The verification of a link just computed (`verify.rs`), when it is to
    /// be verified: its inputs mirrored now, while the link's view holds.
    #[allow(clippy::too_many_arguments)]
    fn verification(
        &self,
        tk: &Toolkit,
        req: &Request,
        fs: &MemoFs,
        spec: &Spec,
        keys: &linkcache::LinkKeys,
        outcome: &Outcome,
        store: &Arc<Store>,
        obs: &LinkObs,
    ) -> Option<crate::verify::Job> {
        let off = self.verifier.mode == crate::verify::VerifyMode::Off;
        if off || outcome.engine != EngineKind::InProcess || outcome.fallback.is_some() {
            return None;
        }
        let why_not = crate::verify::unverifiable(spec, req, fs).or_else(|| {
            device_only_registered(req, spec, fs)
                .then_some("a device-only input registered (its module id is its path)")
        });
        if !self.verifier.wants(&keys.content, why_not) {
            return None;
        }
        let sandbox = match Sandbox::prepare(&self.scratch_dir(), req, spec, fs, &tk.root.join("nvvm")) {
            Ok(s) => s,
            Err(e) => {
                debug!("not verified: the link's files cannot be mirrored: {e:?}");
                self.verifier.not_verified(&keys.content);
                return None;
            }
        };
        Some(crate::verify::Job {
            nvlink: tk.nvlink(),
            toolkit_root: tk.root.clone(),
            confine: self.config.confine.clone(),
            sandbox,
            spec: spec.clone(),
            req: req.clone(),
            ours: crate::verify::Answer {
                exit_code: outcome.exit_code,
                stdout: outcome.stdout.clone(),
                stderr: outcome.stderr.clone(),
                outputs: outcome.outputs.clone(),
            },
            heal: crate::verify::Heal {
                store: store.clone(),
                content: keys.content,
                named: keys.named,
                name_sensitive: true,
            },
            limit: self.config.worker_timeout.unwrap_or(DEFAULT_WORKER_TIMEOUT),
            scratch_parents: self.scratch_parents(),
            obs: obs.clone(),
        })
    }

    /// A speculative link is about to compute the entry under `key`.
    fn note_speculated(&self, key: crate::cache::Key) {
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
    fn note_speculated_use(&self, key: &crate::cache::Key) {
        let mut s = self.speculated.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = s.iter().position(|k| k == key) {
            s.remove(i);
            bump(&self.stats.speculative_hits);
        }
    }

    fn lookup(&self, cache: &LinkCache, keys: &linkcache::LinkKeys, req: &Request, spec: &Spec) -> Option<Outcome> {
        let entry = LinkEntry::decode(&cache.store.fetch("link", &keys.content)?)?;
        let entry =
            if entry.name_sensitive { LinkEntry::decode(&cache.store.fetch("link", &keys.named)?)? } else { entry };
        self.outcome_of(&entry, req, spec)
    }

    fn outcome_of(&self, e: &LinkEntry, req: &Request, spec: &Spec) -> Option<Outcome> {
        let outputs = linkcache::outputs_of(e, req, spec)?;
        Some(Outcome::answer(EngineKind::Cache, e.exit_code, e.stdout.clone(), e.stderr.clone(), outputs))
    }

    /// The stored form of an outcome, when it can be stored: only a result
    /// nvlink itself gives for these inputs, computed from one view of them.
    /// Not stored: fallbacks (environment faults of the engines end there, see
    /// `engine::process`), links during which an input changed (the key would
    /// name other contents than the link used), and a success without its
    /// output file or with an empty one (nvlink never succeeds so).
    fn entry_of(&self, o: &Outcome, req: &Request, spec: &Spec, fs: &MemoFs) -> Option<LinkEntry> {
        // A read the file view declined (an input not as announced, past the
        // budget, not regular) makes the link the caller's: never stored.
        if o.fallback.is_some() || o.engine == EngineKind::Frontend || fs.declined().is_some() {
            return None;
        }
        let view_held = match o.engine {
            // A sandboxed run read exactly the view (mirrored from it).
            EngineKind::NvlinkProcess if req.shared_fs => fs.unchanged_on_disk(),
            _ => fs.consistent(),
        };
        if !view_held {
            bump(&self.stats.uncached_changed_inputs);
            warn!("an input changed during the link: result not cached");
            return None;
        }
        let files = linkcache::entry_files(&o.outputs, req, spec)?;
        if o.exit_code == 0 && spec.output.is_some() && !files.iter().any(|(role, d)| role == "output" && !d.is_empty())
        {
            warn!("a successful link without its output: result not cached");
            return None;
        }
        let device_only_registered = device_only_registered(req, spec, fs);
        // An entry holds the link's messages without the parse warnings
        // (options given twice), which every answer gets from the front end,
        // a hit included; the real nvlink printed them first itself.
        let mut stderr = o.stderr.clone();
        if o.engine == EngineKind::NvlinkProcess && !spec.parsed.warnings.is_empty() {
            stderr = stderr.strip_prefix(spec.warnings_text().as_slice())?.to_vec();
        }
        Some(LinkEntry {
            exit_code: o.exit_code,
            stdout: o.stdout.clone(),
            stderr,
            files,
            name_sensitive: linkcache::name_sensitive(spec, &o.stdout, &o.stderr, device_only_registered),
        })
    }

    /// Modes A to E: plan, then the in-process engine or the real nvlink.
    fn compute_link(
        &self,
        tk: &Toolkit,
        req: &Request,
        fs: &dyn InputFs,
        spec: &Spec,
        mode: Mode,
        ctl: Ctl<'_>,
    ) -> Outcome {
        // A release the in-process engine is not proven on: its own nvlink.
        if !tk.release.in_process_proven() {
            return self.route(tk, req, fs, spec, ctl, unproven(tk));
        }
        if let Some(u) = spec.uidx_file.as_deref() {
            return match uidx_fatal(req, fs, spec, u) {
                Ok(d) => self.fatal(report_arch(spec, d)),
                // A FIFO or a device: only nvlink itself may read it.
                Err(_) if fs.declined().is_some() => {
                    let declined = fs.declined().unwrap_or_default();
                    self.fall_back(Declined::new(Reason::InputDeclined, declined))
                }
                Err(why) => self.route(tk, req, fs, spec, ctl, why),
            };
        }
        // nvlink writes the header of a `-time` file it creates before it reads
        // any input.
        let time_file_is_new = match time_file_is_new(req, fs, spec) {
            Ok(new) => new,
            Err(why) => return self.route(tk, req, fs, spec, ctl, why),
        };
        let mut plan = match self.plan_link(tk, req, fs, spec, ctl) {
            Ok(plan) => plan,
            Err(answered) => return *answered,
        };
        // Planned: now a compute slot (`sched.rs`; the plan permit goes back).
        let _admitted = match self.admit(ctl) {
            Ok(a) => a,
            Err(cancelled) => return *cancelled,
        };
        let timings = std::sync::Mutex::new(Vec::new());
        let linked = self.link_in_process(tk, spec, mode, &mut plan, ctl, &timings);
        let timings = timings.into_inner().unwrap_or_else(|p| p.into_inner());
        let outcome = match linked {
            Ok(output) => {
                bump(&self.stats.in_process);
                debug!("linked in process");
                self.in_process_outcome(req, fs, spec, mode, &plan, output)
            }
            Err(NotLinked::Fault(why)) => return self.fall_back(why),
            Err(NotLinked::Declined(why)) => return self.route(tk, req, fs, spec, ctl, why),
            Err(NotLinked::Errors(e))
                if spec.register_link_binaries.is_some() && e.written.is_none() && !e.registers =>
            {
                // Whether nvlink writes its registration file before failing
                // is not reproduced (but for its stack-size errors).
                let why = Declined::new(Reason::Diagnostics, "link errors with --register-link-binaries");
                return self.route(tk, req, fs, spec, ctl, why);
            }
            Err(NotLinked::Errors(errors)) => {
                bump(&self.stats.in_process);
                debug!("link errors answered in process");
                self.link_errors_outcome(req, fs, spec, mode, &plan, errors)
            }
        };
        with_time_table(outcome, req, spec, time_file_is_new, &timings)
    }

    /// The link plan, or the answer when there is none: nvlink's fatal
    /// messages, the real nvlink (a plan not reproduced in process, `-Werror`
    /// with input warnings) or a fallback (an input only nvlink may read).
    fn plan_link(
        &self,
        tk: &Toolkit,
        req: &Request,
        fs: &dyn InputFs,
        spec: &Spec,
        ctl: Ctl<'_>,
    ) -> Result<plan::Plan, Box<Outcome>> {
        let Some(target) = spec.target() else {
            let why = Declined::new(Reason::Arch, format!("--arch {:?}", spec.arch));
            return Err(Box::new(self.route(tk, req, fs, spec, ctl, why)));
        };
        let ctx = LoadContext {
            fs,
            cwd: &req.cwd,
            target,
            lto: spec.lto,
            suppress_arch_warning: spec.suppress_arch_warning,
            memo: Some(&self.decode_memo),
            cpu_machine: crate::input::load::cpu_machine(spec.cpu_arch.as_deref()),
        };
        let planned = ctl.obs.in_phase(Phase::Plan, || {
            fs.prefetch(&spec.files.input_paths());
            plan::build(spec, &ctx)
        });
        let plan = match planned {
            Ok(p) => p,
            Err(LoadError::Fatal(_)) if spec.time.is_some() => {
                let why = Declined::new(Reason::Options, "-time with an input fatal (the rows nvlink writes first)");
                return Err(Box::new(self.route(tk, req, fs, spec, ctl, why)));
            }
            Err(LoadError::Fatal(ds)) => {
                return Err(Box::new(self.fatals(ds.into_iter().map(|d| report_arch(spec, d)).collect())));
            }
            Err(LoadError::Declined(why)) => {
                // An input only nvlink itself may read (a FIFO, a device): not
                // even the real-nvlink engine runs it here.
                if let Some(declined) = fs.declined() {
                    debug!(reason = %why.reason, why = %why.detail, "plan not reproduced in process");
                    return Err(Box::new(self.fall_back(Declined::new(Reason::InputDeclined, declined))));
                }
                return Err(Box::new(self.route(tk, req, fs, spec, ctl, why)));
            }
        };
        if spec.warning_as_error && plan.warnings.iter().any(|w| w.severity == crate::diag::Severity::Error) {
            let why = Declined::new(Reason::Input, "-Werror with an input error (a member that does not decompress)");
            return Err(Box::new(self.route(tk, req, fs, spec, ctl, why)));
        }
        if spec.warning_as_error && !plan.warnings.is_empty() && spec.time.is_some() {
            let why = Declined::new(Reason::Options, "-time with -Werror and input warnings");
            return Err(Box::new(self.route(tk, req, fs, spec, ctl, why)));
        }
        if spec.warning_as_error && !plan.warnings.is_empty() {
            // nvlink stops at the first warning, printed as an error, with its
            // link step's fatal (`-w` or not).
            if plan.notes.is_empty() {
                let first = Diagnostic::error(plan.warnings[0].message.clone());
                let ds = vec![first, Diagnostic::fatal("elfLink internal error")];
                return Err(Box::new(self.fatals(ds.into_iter().map(|d| report_arch(spec, d)).collect())));
            }
            let why = Declined::new(Reason::Diagnostics, "-Werror with input warnings beside infos");
            return Err(Box::new(self.route(tk, req, fs, spec, ctl, why)));
        }
        Ok(plan)
    }

    /// The in-process engine on the `--jobs` pool: the output file's bytes.
    fn link_in_process(
        &self,
        tk: &Toolkit,
        spec: &Spec,
        mode: Mode,
        plan: &mut plan::Plan,
        ctl: Ctl<'_>,
        timings: &std::sync::Mutex<Vec<inprocess::TimeRow>>,
    ) -> Result<Vec<u8>, NotLinked> {
        let artifacts = Artifacts {
            store: self.cache.as_ref().map(|c| &*c.store),
            flights: self.cache.as_ref().map(|c| &c.artifact_flights).unwrap_or(&self.no_cache_flights),
            toolkit: if self.cache.is_some() { tk.identity() } else { [0; 32] },
            stats: &self.stats,
        };
        let scratch = self.scratch_dir();
        let fault = std::sync::Mutex::new(None);
        let errors = std::sync::Mutex::new(None);
        let cx = inprocess::Context {
            tk,
            artifacts: &artifacts,
            scratch: &scratch,
            workers: self.workers.as_deref(),
            cancel: ctl.cancel,
            obs: ctl.obs,
            limit: self.config.worker_timeout.unwrap_or(DEFAULT_WORKER_TIMEOUT),
            confine: &self.config.confine,
            fault: &fault,
            errors: &errors,
            timings,
        };
        // The pool's threads work inside this link's span.
        let span = Span::current();
        let pool = match ctl.cancel.priority() {
            Priority::Foreground => &self.pool,
            Priority::Background => &self.bg_pool,
        };
        let linked = pool.install(|| span.in_scope(|| inprocess::link(&cx, spec, mode, plan)));
        let cancelled = ctl.cancel.is_cancelled().then(|| "the link was cancelled".to_owned());
        if let Some(why) = fault.into_inner().unwrap_or_else(|p| p.into_inner()).or(cancelled) {
            // Not an nvlink answer: the shim runs nvlink; nothing is cached.
            warn!(%why, "link failed in its worker");
            return Err(NotLinked::Fault(Declined::new(Reason::Worker, why)));
        }
        linked.map_err(|why| match errors.into_inner().unwrap_or_else(|p| p.into_inner()) {
            Some(e) => NotLinked::Errors(e),
            None => NotLinked::Declined(why),
        })
    }

    /// nvlink's answer to a link its link stage rejects: the plan's messages,
    /// then the link errors; no output file, unless nvlink wrote one before
    /// failing (and then no registration file), and the registration file
    /// where nvlink writes it before failing (`LinkErrors::registers`).
    fn link_errors_outcome(
        &self,
        req: &Request,
        fs: &dyn InputFs,
        spec: &Spec,
        mode: Mode,
        plan: &plan::Plan,
        errors: inprocess::LinkErrors,
    ) -> Outcome {
        let mut report = Report::new(Filters {
            no_warnings: spec.disable_warnings,
            warnings_as_errors: spec.warning_as_error,
            no_infos: spec.disable_infos,
        });
        for d in plan.warnings.iter().chain(&plan.notes) {
            report.emit_raw(&format!("{}\n", report_arch(spec, d.clone())));
        }
        emit_link_warnings(&mut report, spec, plan);
        emit_tool_warnings(&mut report, spec, plan);
        for d in &errors.messages {
            report.emit_raw(&format!("{}\n", report_arch(spec, d.clone())));
        }
        let mut outputs = match (errors.written, &spec.output) {
            (Some(data), Some(o)) => vec![OutputFile { path: absolute(&req.cwd, o), data: data.into(), append: false }],
            _ => Vec::new(),
        };
        if let (true, Some(r)) = (errors.registers, &spec.register_link_binaries) {
            let order = if plan.partial_lto { Mode::Executable } else { mode };
            outputs.extend(regbin::output(&absolute(&req.cwd, r), spec, order, plan.module_ids(), fs));
        }
        Outcome::answer(EngineKind::InProcess, errors.exit_code, report.stdout, report.stderr, outputs)
    }

    /// The answer of a link made in process: the plan's messages as nvlink
    /// prints them, the output file and the `--register-link-binaries` file.
    fn in_process_outcome(
        &self,
        req: &Request,
        fs: &dyn InputFs,
        spec: &Spec,
        mode: Mode,
        plan: &plan::Plan,
        output: Vec<u8>,
    ) -> Outcome {
        let mut report = Report::new(Filters {
            no_warnings: spec.disable_warnings,
            warnings_as_errors: spec.warning_as_error,
            no_infos: spec.disable_infos,
        });
        for d in plan.warnings.iter().chain(&plan.notes) {
            report.emit_raw(&format!("{}\n", report_arch(spec, d.clone())));
        }
        emit_link_warnings(&mut report, spec, plan);
        emit_tool_warnings(&mut report, spec, plan);
        let mut outputs = Vec::new();
        let mut output = output;
        self.hooks.corrupt(&mut output);
        if let Some(o) = &spec.output {
            outputs.push(OutputFile { path: absolute(&req.cwd, o), data: output.into(), append: false });
        }
        if let Some(r) = &spec.register_link_binaries {
            let order = if plan.partial_lto { Mode::Executable } else { mode };
            outputs.extend(regbin::output(&absolute(&req.cwd, r), spec, order, plan.module_ids(), fs));
        }
        Outcome::answer(EngineKind::InProcess, 0, report.stdout, report.stderr, outputs)
    }

    fn frontend(&self, exit_code: i32, stdout: Vec<u8>, stderr: Vec<u8>) -> Outcome {
        bump(&self.stats.frontend);
        Outcome::answer(EngineKind::Frontend, exit_code, stdout, stderr, Vec::new())
    }

    /// Fatal messages of the input stage (printed in order, exit status 1).
    fn fatals(&self, ds: Vec<Diagnostic>) -> Outcome {
        let text: String = ds.iter().map(|d| format!("{d}\n")).collect();
        self.frontend(EXIT_FATAL, Vec::new(), text.into_bytes())
    }

    fn fatal(&self, d: Diagnostic) -> Outcome {
        self.frontend(EXIT_FATAL, Vec::new(), format!("{d}\n").into_bytes())
    }

    /// The real nvlink as the engine: on the caller's files where the daemon
    /// shares its filesystem, otherwise on the link's files mirrored into a
    /// sandbox (`engine/sandbox.rs`).
    fn run_nvlink(&self, tk: &Toolkit, req: &Request, fs: &dyn InputFs, spec: &Spec, ctl: Ctl<'_>) -> Outcome {
        // Routed after its plan was admitted to compute, the link holds its
        // slot already; routed from its plan, it waits for one here.
        let _admitted = match self.admit(ctl) {
            Ok(a) => a,
            Err(cancelled) => return *cancelled,
        };
        let limit = self.config.worker_timeout.unwrap_or(DEFAULT_WORKER_TIMEOUT);
        let _phase = ctl.obs.phase(Phase::Nvlink);
        let sandbox = if req.shared_fs {
            None
        } else {
            match Sandbox::prepare(&self.scratch_dir(), req, spec, fs, &tk.root.join("nvvm")) {
                Ok(s) => Some(s),
                Err(e) => return self.sandbox_failed(e),
            }
        };
        let run_req = sandbox.as_ref().map_or(req, |s| &s.request);
        // nvlink on a client's mirrored files runs confined (`confine.rs`).
        let confined = sandbox.as_ref().map(|s| process::Confined {
            policy: &self.config.confine,
            toolkit_root: &tk.root,
            sandbox: s.dir(),
        });
        match process::run(&tk.nvlink(), run_req, spec, &self.scratch_parents(), ctl.cancel, limit, confined.as_ref()) {
            Ok(r) => {
                let (stdout, stderr, outputs) = match &sandbox {
                    None => (r.stdout, r.stderr, r.outputs),
                    Some(s) => match s.unmirror(r.stdout, r.stderr, r.outputs, spec, &req.cwd) {
                        Ok(mapped) => mapped,
                        Err(e) => return self.sandbox_failed(e),
                    },
                };
                bump(&self.stats.nvlink_process);
                Outcome::answer(EngineKind::NvlinkProcess, r.exit_code, stdout, stderr, outputs)
            }
            Err(e) => {
                // Not an answer of nvlink for these inputs (a fault of the
                // daemon's environment, or nvlink killed): the shim runs nvlink
                // itself, and nothing is cached.
                warn!("no answer from the nvlink engine: {e}");
                let reason = match e {
                    process::RunError::Environment(_) => {
                        bump(&self.stats.environment_faults);
                        Reason::Environment
                    }
                    process::RunError::Signal(_) => Reason::Environment,
                    process::RunError::Unsupported(_) => Reason::NotHere,
                };
                self.fall_back(Declined::new(reason, format!("{}: {e}", Path::new(&tk.nvlink()).display())))
            }
        }
    }

    /// A link the sandbox cannot serve (see `engine/sandbox.rs`): the caller runs nvlink.
    fn sandbox_failed(&self, e: SandboxError) -> Outcome {
        match e {
            SandboxError::Unsupported(why) => {
                debug!(%why, "not run in a sandbox");
                self.fall_back(Declined::new(Reason::NotHere, format!("the daemon cannot mirror this link: {why}")))
            }
            SandboxError::Environment(why) => {
                warn!(%why, "sandbox failed");
                bump(&self.stats.environment_faults);
                self.fall_back(Declined::new(Reason::Environment, why))
            }
        }
    }
}

/// A link's scheduler slot (see [`Linker::admit`]).
struct Admission<'a> {
    _slot: Slot<'a>,
    cancel: Cancel,
}

impl Drop for Admission<'_> {
    fn drop(&mut self) {
        self.cancel.end_admission();
    }
}

/// A link's registration as the one computing an output (see [`Linker::claim_output`]).
struct OutputClaim<'a> {
    linker: &'a Linker,
    key: (PathBuf, PathBuf),
    cancel: Cancel,
}

impl Drop for OutputClaim<'_> {
    fn drop(&mut self) {
        let mut map = self.linker.outputs.lock().unwrap_or_else(|p| p.into_inner());
        // A newer link may have taken the output over: leave its registration.
        if map.get(&self.key).is_some_and(|c| c.same(&self.cancel)) {
            map.remove(&self.key);
        }
    }
}

/// Why the in-process engine gave no output.
enum NotLinked {
    /// A fault of the daemon's side (a worker died, was killed or cancelled):
    /// no answer at all, the shim runs nvlink.
    Fault(Declined),
    /// Not reproduced in process: the real nvlink serves the link.
    Declined(Declined),
    /// nvlink's link errors, reproduced: the answer is those messages.
    Errors(inprocess::LinkErrors),
}

/// What nvlink answers to a `--uidx-file`, which it reads before any input:
/// a missing file, an empty one, or one without the uidx magic
/// (`\x7fUFTINDX`) are fatal. A real uidx file (and a directory, which nvlink
/// meets with "Memory allocation failure", and anything with `-time`) is left
/// to nvlink.
/// Whether the link registers a device-only input (a cubin, PTX or fatbin
/// file): its module id is made from the input's path, so the result depends
/// on names.
fn device_only_registered(req: &Request, spec: &Spec, fs: &dyn InputFs) -> bool {
    spec.register_link_binaries.is_some()
        && spec.inputs.iter().any(|i| {
            matches!(i.rsplit('.').next(), Some("cubin" | "ptx" | "fatbin"))
                || fs.read(&absolute(&req.cwd, i)).map(|d| header_machine(&d) == Some(EM_CUDA)).unwrap_or(true)
        })
}

fn uidx_fatal(req: &Request, fs: &dyn InputFs, spec: &Spec, u: &str) -> Result<Diagnostic, Declined> {
    if spec.time.is_some() {
        return Err(Declined::new(Reason::Options, "--uidx-file with -time"));
    }
    match fs.read(&absolute(&req.cwd, u)) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Ok(Diagnostic::fatal(format!("Could not open input file '{u}'")))
        }
        Err(e) => Err(Declined::new(Reason::Options, format!("--uidx-file {u}: {e}"))),
        Ok(data) if data.is_empty() => Ok(Diagnostic::fatal(format!("Could not read file '{u}'"))),
        Ok(data) if !data.starts_with(b"\x7fUFTINDX") => Ok(Diagnostic::fatal("Internal error: not uidx input")),
        Ok(_) => Err(Declined::new(Reason::Options, format!("--uidx-file {u}: a uidx file (nvlink's use of it)"))),
    }
}

/// Whether the link's `-time` file is still to be created (nvlink then writes
/// the table's header first); `Ok(false)` without `-time` or with `-time -`.
/// A name that is there but not a regular file is left to nvlink.
fn time_file_is_new(req: &Request, fs: &dyn InputFs, spec: &Spec) -> Result<bool, Declined> {
    let Some(t) = spec.time.as_deref().filter(|t| *t != "-") else { return Ok(false) };
    match fs.stat(&absolute(&req.cwd, t)) {
        Ok(st) if !st.is_dir => Ok(false),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(true),
        Ok(_) => Err(Declined::new(Reason::Options, format!("-time {t}: a directory"))),
        Err(e) => Err(Declined::new(Reason::Options, format!("-time {t}: {e}"))),
    }
}

/// nvlink's `-time` table added to an in-process answer: on stdout (`-time
/// -`), header first, or appended to the file (the header only when the link
/// creates it), written before the other outputs as nvlink writes it first.
fn with_time_table(
    mut o: Outcome,
    req: &Request,
    spec: &Spec,
    file_is_new: bool,
    rows: &[inprocess::TimeRow],
) -> Outcome {
    let Some(t) = spec.time.as_deref() else { return o };
    let table = inprocess::time_rows(rows, spec.arch.as_deref().unwrap_or_default());
    if t == "-" {
        let mut stdout = format!("{}{table}", inprocess::TIME_HEADER).into_bytes();
        stdout.append(&mut o.stdout);
        o.stdout = stdout;
        return o;
    }
    let data = if file_is_new { format!("{}{table}", inprocess::TIME_HEADER) } else { table };
    if !data.is_empty() {
        o.outputs.insert(0, OutputFile { path: absolute(&req.cwd, t), data: data.into_bytes().into(), append: true });
    }
    o
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

/// Why a toolkit's links go to its own nvlink (`Release::in_process_proven`).
fn unproven(tk: &Toolkit) -> Declined {
    let (major, minor) = (tk.release.major, tk.release.minor);
    Declined::new(Reason::Release, format!("the in-process engine is not proven on CUDA {major}.{minor}"))
}

/// nvlink's link-stage warnings (`Plan::link_warnings`), already as it
/// prints them (`-w` does not hide them), tagged by `-report-arch`.
fn emit_link_warnings(report: &mut Report, spec: &Spec, plan: &plan::Plan) {
    for d in &plan.link_warnings {
        report.emit_raw(&format!("{}\n", report_arch(spec, d.clone())));
    }
}

/// `-report-arch`: every message nvlink prints once its options are read (not
/// the option parser's own) ends with ` (target: <--arch as given>)`, so that
/// the messages of nvcc's one-call-per-arch device links can be told apart.
/// The tools' own lines (ptxas's warnings under `-dlto -g`): printed whatever
/// `-w`, `-Werror` or `--disable-infos` say, tagged by `-report-arch`.
fn emit_tool_warnings(report: &mut Report, spec: &Spec, plan: &plan::Plan) {
    for line in &plan.tool_warnings {
        match (spec.report_arch, spec.arch.as_deref()) {
            (true, Some(arch)) => report.emit_raw(&format!("{line} (target: {arch})\n")),
            _ => report.emit_raw(&format!("{line}\n")),
        }
    }
}

fn report_arch(spec: &Spec, mut d: Diagnostic) -> Diagnostic {
    if let (true, Some(arch)) = (spec.report_arch, spec.arch.as_deref()) {
        d.message = format!("{} (target: {arch})", d.message);
    }
    d
}
