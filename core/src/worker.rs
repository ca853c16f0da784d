//! libnvJitLink in supervised worker processes.
//!
//! nvJitLink (and NVVM and ptxas inside it) is NVIDIA code that trusts its
//! inputs: a cubin member with a few flipped bits makes it segfault, and the
//! real nvlink crashes on the same input (docs/workers.md). Loaded into the daemon, one
//! such input would kill every link in flight. So the library runs in worker
//! processes (`nvlinkd worker`, [`serve`]): each loads it once and then links
//! request after request (warm), and the daemon keeps at most `--jobs` of them
//! ([`WorkerPool`]). A worker that dies (signal, abort, `exit()` inside the
//! library) fails only the link it was serving; the pool counts it
//! (`worker_crashes`) and starts a fresh one for the next link.
//!
//! Limits: the worker sets its own address-space limit (`RLIMIT_AS`,
//! `--worker-mem`) before loading the library, and the pool kills a worker
//! whose request outlives `--worker-timeout`. A [`Cancel`] handle kills the
//! worker serving a link at once.
//!
//! Protocol (stdin → worker, worker → stdout, little endian): after start the
//! worker writes a handshake (`0` loaded, or `1` + message). A request is
//! `u32 n_options, {u32 len, bytes}*, u32 n_inputs, {u8 kind, u32 len, name,
//! u64 len, data}*, u8 want_ptx`; the response `0, {u8 has, u64 len, bytes}`
//! for cubin and PTX, `u32 len, info log` or `1, u8 call (0 load, 1 call, 2
//! nul), i32 status, u32 len, message`. nvJitLink writes some diagnostics
//! straight to file descriptors 1 and 2: the worker moves the protocol to a
//! private descriptor and points fd 1 at fd 2, which the pool forwards to the
//! daemon log.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::jitlink::{InputType, JitInput, JitLink, JitLinkError, JitOutput};
use crate::sched::Priority;

/// Why a link through a worker failed.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// nvJitLink returned an error: an ordinary result of the link.
    #[error("{0}")]
    JitLink(#[from] JitLinkError),
    /// The worker died while linking (a crash, abort or exit inside NVIDIA
    /// code, or a signal from outside): a fault, not a result.
    #[error("worker {pid} died while linking: {how}")]
    Crashed { pid: u32, how: String },
    /// The link was cancelled; its worker was killed.
    #[error("link cancelled")]
    Cancelled,
    /// The request outlived the time limit; its worker was killed.
    #[error("worker killed after the time limit of {0:?}")]
    TimedOut(Duration),
    /// No worker could be started or spoken to.
    #[error("worker: {0}")]
    Spawn(String),
}

impl WorkerError {
    /// A failure of the environment (not an answer nvlink would give).
    /// A worker that cannot start is not one: the link then goes to the real
    /// nvlink, whose answer is nvlink's.
    pub(crate) fn is_fault(&self) -> bool {
        !matches!(self, WorkerError::JitLink(_) | WorkerError::Spawn(_))
    }
}

/// Which library a worker serves.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct LibSpec {
    pub path: PathBuf,
    pub major: u32,
    pub minor: u32,
}

impl LibSpec {
    /// The library at `path` of release `MAJOR.MINOR` (a worker's `--release`).
    pub fn with_release(path: PathBuf, release: &str) -> Option<LibSpec> {
        let (major, minor) = release.split_once('.')?;
        Some(LibSpec { path, major: major.parse().ok()?, minor: minor.parse().ok()? })
    }
}

// ---------------------------------------------------------------- wire format

fn put_u32(w: &mut impl Write, v: u32) -> std::io::Result<()> {
    w.write_all(&v.to_le_bytes())
}

fn put_u64(w: &mut impl Write, v: u64) -> std::io::Result<()> {
    w.write_all(&v.to_le_bytes())
}

fn put_bytes32(w: &mut impl Write, b: &[u8]) -> std::io::Result<()> {
    put_u32(w, u32::try_from(b.len()).map_err(std::io::Error::other)?)?;
    w.write_all(b)
}

fn get<const N: usize>(r: &mut impl Read) -> std::io::Result<[u8; N]> {
    let mut b = [0u8; N];
    r.read_exact(&mut b)?;
    Ok(b)
}

fn get_u32(r: &mut impl Read) -> std::io::Result<u32> {
    get::<4>(r).map(u32::from_le_bytes)
}

fn get_u64(r: &mut impl Read) -> std::io::Result<u64> {
    get::<8>(r).map(u64::from_le_bytes)
}

/// Room reserved ahead for one field of a message: its announced length, up
/// to this (a longer field grows as its bytes arrive, so a damaged length
/// never allocates more than the bytes that came).
const RESERVE_AHEAD: u64 = 64 << 20;

fn get_vec(r: &mut impl Read, len: u64) -> std::io::Result<Vec<u8>> {
    let mut v = Vec::new();
    append(r, &mut v, len)?;
    Ok(v)
}

/// Append exactly `len` bytes from `r` to `v`, reserved ahead (no regrowing
/// copies) and not zeroed first.
fn append(r: &mut impl Read, v: &mut Vec<u8>, len: u64) -> std::io::Result<()> {
    let start = v.len();
    v.reserve(len.min(RESERVE_AHEAD) as usize);
    r.take(len).read_to_end(v)?;
    if (v.len() - start) as u64 != len {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    Ok(())
}

fn get_string32(r: &mut impl Read) -> std::io::Result<String> {
    let n = get_u32(r)?;
    Ok(String::from_utf8_lossy(&get_vec(r, n.into())?).into_owned())
}

fn write_request(
    w: &mut impl Write,
    options: &[String],
    inputs: &[JitInput<'_>],
    want_ptx: bool,
) -> std::io::Result<()> {
    put_u32(w, options.len() as u32)?;
    for o in options {
        put_bytes32(w, o.as_bytes())?;
    }
    put_u32(w, inputs.len() as u32)?;
    for i in inputs {
        w.write_all(&[i.kind as u8])?;
        put_bytes32(w, i.name.as_bytes())?;
        put_u64(w, i.data.len() as u64)?;
        w.write_all(i.data)?;
    }
    w.write_all(&[want_ptx as u8])?;
    w.flush()
}

fn input_type(k: u8) -> Option<InputType> {
    Some(match k {
        1 => InputType::Cubin,
        2 => InputType::Ptx,
        3 => InputType::LtoIr,
        4 => InputType::Fatbin,
        5 => InputType::Object,
        6 => InputType::Library,
        _ => return None,
    })
}

/// A request as the worker reads it: `None` at a clean end of input. The
/// inputs' bytes are ranges of the arena given to [`read_request`], which the
/// worker keeps from one request to the next (its pages stay mapped: a warm
/// worker does not fault them in again for every link).
struct OwnedRequest {
    options: Vec<String>,
    inputs: Vec<(InputType, String, std::ops::Range<usize>)>,
    want_ptx: bool,
}

/// The size asked for the pipes to and from a worker.
const PIPE_BYTES: libc::c_int = 1 << 20;

/// The arena of a worker that held a larger request than this is given back
/// after it (a warm worker keeps at most this much).
const ARENA_KEEP: usize = 256 << 20;

fn read_request(r: &mut impl Read, arena: &mut Vec<u8>) -> std::io::Result<Option<OwnedRequest>> {
    arena.clear();
    let mut first = [0u8; 4];
    match r.read(&mut first[..1])? {
        0 => return Ok(None),
        _ => r.read_exact(&mut first[1..])?,
    }
    let n_opts = u32::from_le_bytes(first);
    let options = (0..n_opts).map(|_| get_string32(r)).collect::<std::io::Result<Vec<_>>>()?;
    let n_inputs = get_u32(r)?;
    let mut inputs = Vec::new();
    for _ in 0..n_inputs {
        let [k] = get::<1>(r)?;
        let kind = input_type(k).ok_or_else(|| std::io::Error::other("bad input kind"))?;
        let name = get_string32(r)?;
        let len = get_u64(r)?;
        let start = arena.len();
        append(r, arena, len)?;
        inputs.push((kind, name, start..arena.len()));
    }
    let [want_ptx] = get::<1>(r)?;
    Ok(Some(OwnedRequest { options, inputs, want_ptx: want_ptx != 0 }))
}

fn write_response(w: &mut impl Write, res: &Result<JitOutput, JitLinkError>) -> std::io::Result<()> {
    match res {
        Ok(out) => {
            w.write_all(&[0])?;
            for part in [&out.cubin, &out.ptx] {
                match part {
                    Some(b) => {
                        w.write_all(&[1])?;
                        put_u64(w, b.len() as u64)?;
                        w.write_all(b)?;
                    }
                    None => w.write_all(&[0])?,
                }
            }
            put_bytes32(w, out.info_log.as_bytes())?;
        }
        Err(e) => {
            w.write_all(&[1])?;
            let (call, status, msg) = match e {
                JitLinkError::Load { path, reason } => (0u8, 0i32, format!("{path}\0{reason}")),
                JitLinkError::Call { call, status, log } => (1, *status, format!("{call}\0{log}")),
                JitLinkError::Nul => (2, 0, String::new()),
            };
            w.write_all(&[call])?;
            w.write_all(&status.to_le_bytes())?;
            put_bytes32(w, msg.as_bytes())?;
        }
    }
    w.flush()
}

/// nvJitLink's call names, for errors that crossed the pipe.
fn call_name(s: &str) -> &'static str {
    ["create", "add", "complete", "ptx", "cubin", "log"].into_iter().find(|c| *c == s).unwrap_or("call")
}

fn read_response(r: &mut impl Read) -> std::io::Result<Result<JitOutput, JitLinkError>> {
    let [tag] = get::<1>(r)?;
    if tag == 0 {
        let mut parts = [None, None];
        for p in &mut parts {
            let [has] = get::<1>(r)?;
            if has != 0 {
                let n = get_u64(r)?;
                *p = Some(get_vec(r, n)?);
            }
        }
        let [cubin, ptx] = parts;
        let info_log = get_string32(r)?;
        return Ok(Ok(JitOutput { cubin, ptx, info_log }));
    }
    let [call] = get::<1>(r)?;
    let status = i32::from_le_bytes(get::<4>(r)?);
    let msg = get_string32(r)?;
    let (a, b) = msg.split_once('\0').unwrap_or((&msg, ""));
    Ok(Err(match call {
        0 => JitLinkError::Load { path: a.to_owned(), reason: b.to_owned() },
        1 => JitLinkError::Call { call: call_name(a), status, log: b.to_owned() },
        _ => JitLinkError::Nul,
    }))
}

// ---------------------------------------------------------------- the worker

/// Test hook of the worker: while the file named by this variable exists, a
/// request waits before linking, with `<file>.<pid>` present (tests kill the
/// worker, or release several links at once, in that window).
pub const HOLD_ENV: &str = "NVLINKD_TEST_WORKER_HOLD";

/// The worker's main loop (`nvlinkd worker`): load the library, then answer
/// requests on stdin until it closes. Returns the process exit status.
pub fn serve(lib: &LibSpec, mem_limit: u64) -> i32 {
    // Before the library loads: it allocates too (see heap.rs; no reserve
    // here).
    crate::heap::configure(None, KEEP_FREE);
    // SAFETY: dup/dup2 on the standard descriptors of this single-threaded
    // process: the protocol moves to a fresh descriptor, fd 1 becomes a copy of
    // fd 2 so that whatever the library prints cannot enter the protocol.
    let proto_fd = unsafe {
        let fd = libc::dup(1);
        if fd < 0 || libc::dup2(2, 1) < 0 {
            return 2;
        }
        fd
    };
    // SAFETY: proto_fd is a descriptor this process owns and nothing else uses.
    let mut out = BufWriter::with_capacity(1 << 16, unsafe { std::fs::File::from_raw_fd(proto_fd) });
    let mut input = BufReader::with_capacity(1 << 16, std::io::stdin().lock());
    if mem_limit > 0 {
        let lim = libc::rlimit { rlim_cur: mem_limit, rlim_max: mem_limit };
        // SAFETY: setrlimit with a valid struct.
        if unsafe { libc::setrlimit(libc::RLIMIT_AS, &lim) } != 0 {
            eprintln!("nvlinkd worker: cannot set the memory limit: {}", std::io::Error::last_os_error());
        }
    }
    let jit = match JitLink::load(&lib.path, lib.major, lib.minor) {
        Ok(j) => {
            if out.write_all(&[0]).and_then(|_| out.flush()).is_err() {
                return 1;
            }
            j
        }
        Err(e) => {
            let _ = out.write_all(&[1]).and_then(|_| put_bytes32(&mut out, e.to_string().as_bytes()));
            let _ = out.flush();
            return 1;
        }
    };
    let hold = std::env::var_os(HOLD_ENV).map(PathBuf::from);
    let mut arena = Vec::new();
    loop {
        if arena.capacity() > ARENA_KEEP {
            arena = Vec::new();
        }
        let req = match read_request(&mut input, &mut arena) {
            Ok(Some(r)) => r,
            Ok(None) => return 0,
            Err(e) => {
                eprintln!("nvlinkd worker: bad request: {e}");
                return 1;
            }
        };
        if let Some(h) = hold.as_ref().filter(|h| h.exists()) {
            // Say which worker holds a link (`<file>.<pid>`), then wait.
            let mark = PathBuf::from(format!("{}.{}", h.display(), std::process::id()));
            let _ = std::fs::write(&mark, b"");
            while h.exists() {
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = std::fs::remove_file(&mark);
        }
        let inputs: Vec<JitInput<'_>> = req
            .inputs
            .iter()
            .map(|(kind, name, range)| JitInput { kind: *kind, data: &arena[range.clone()], name })
            .collect();
        let res = jit.link(&req.options, &inputs, req.want_ptx);
        if write_response(&mut out, &res).is_err() {
            return 1;
        }
    }
}

/// Free heap a worker keeps from one request for the next (blocks under 32
/// MiB come from the heap, see heap.rs): a worker serves one request at a
/// time, so it holds at most about one request's peak.
const KEEP_FREE: usize = 128 << 20;

use crate::cancel::TIMED_OUT;
pub use crate::cancel::{Cancel, Stopped};

// ---------------------------------------------------------------- the pool

/// How the pool starts workers.
#[derive(Clone, Debug)]
pub struct PoolConfig {
    /// The executable whose `worker` subcommand is [`serve`] (`nvlinkd`).
    pub exe: PathBuf,
    /// Most live workers.
    pub max: usize,
    /// `RLIMIT_AS` of each worker in bytes (0: none).
    pub mem_limit: u64,
    /// Longest time one request may take.
    pub timeout: Duration,
    /// How workers are confined (`confine.rs`): they parse clients' LTO IR.
    pub confine: crate::confine::Policy,
}

struct Worker {
    lib: LibSpec,
    /// Background workers run at idle CPU priority, set when they start (a
    /// process cannot leave `SCHED_IDLE` again without privileges, and its
    /// threads inherit the policy it had when they were made).
    class: Priority,
    child: Child,
    stdin: BufWriter<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    /// Whether it has served a request. NVVM requests run only in workers
    /// that have not (see [`WorkerPool::link`]).
    used: bool,
    /// An NVVM worker ([`NVVM_WORKER`]): it serves one NVVM request only.
    nvvm: bool,
    /// Started for remote callers' links: counted apart ([`slots`]).
    remote: bool,
    /// Whom it served (once `used`): it serves no other tenant.
    tenant: crate::cancel::Tenant,
}

/// The index of a worker's budget in `State::live`: foreground and
/// background workers of the host's own links, and foreground workers of
/// remote callers' links, each up to `max`, so remote links holding every
/// worker (NVVM compiles of seconds) never keep a local link waiting.
fn slots(class: Priority, remote: bool) -> usize {
    match (class, remote) {
        (Priority::Foreground, true) => 2,
        (class, _) => class as usize,
    }
}

/// The executable of NVVM workers, beside the pool's own: `nvlinkd worker`
/// on jemalloc's `malloc` (`server/src/nvvm.rs`), which saves NVVM about 15%
/// of its CPU time. Non-LTO links keep glibc's `malloc`: nvJitLink's
/// crashes on damaged cubins (as nvlink's) depend on it. Without it, NVVM
/// workers are `nvlinkd worker` too.
pub const NVVM_WORKER: &str = "nvlinkd-nvvm";

#[derive(Default)]
struct State {
    idle: Vec<Worker>,
    /// Live worker processes (idle or busy), per budget ([`slots`]): each has
    /// its own `max` (background workers are idle-priority processes of their
    /// own, so a foreground link never waits for one; see `sched.rs`).
    live: [usize; 3],
    /// Libraries of workers being started ahead of any request ([`WorkerPool::prewarm`]):
    /// a request for one waits for that worker rather than starting another.
    prewarming: Vec<(LibSpec, Priority, bool)>,
}

/// Deadlines of the requests in flight, watched by one thread.
#[derive(Default)]
struct Watch {
    next: u64,
    deadlines: BTreeMap<u64, (Instant, Cancel)>,
}

/// Bounded pool of warm workers (see the module docs).
pub struct WorkerPool {
    /// This pool, for the threads that start replacement workers.
    me: std::sync::Weak<WorkerPool>,
    config: PoolConfig,
    /// [`NVVM_WORKER`] beside `config.exe`, or `config.exe`.
    nvvm_exe: PathBuf,
    state: Mutex<State>,
    freed: Condvar,
    watch: Arc<(Mutex<Watch>, Condvar)>,
    watcher: OnceLock<()>,
    /// Workers that died while linking.
    pub crashes: AtomicU64,
}

impl WorkerPool {
    pub fn new(config: PoolConfig) -> Arc<WorkerPool> {
        let nvvm_exe = config.exe.with_file_name(NVVM_WORKER);
        let nvvm_exe = if nvvm_exe.is_file() { nvvm_exe } else { config.exe.clone() };
        Arc::new_cyclic(|me| WorkerPool {
            me: me.clone(),
            nvvm_exe,
            config: PoolConfig { max: config.max.max(1), ..config },
            state: Mutex::new(State::default()),
            freed: Condvar::new(),
            watch: Arc::default(),
            watcher: OnceLock::new(),
            crashes: AtomicU64::new(0),
        })
    }

    /// The process ids of the idle workers.
    pub fn idle_pids(&self) -> Vec<u32> {
        self.lock().idle.iter().map(|w| w.child.id()).collect()
    }

    /// Live worker processes.
    pub fn live(&self) -> u64 {
        let st = self.lock();
        st.live.iter().sum::<usize>() as u64
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Start foreground workers for `lib` ahead of the first links until
    /// `want` of them live (at most `max`): a burst of links on a fresh daemon
    /// then finds them started rather than starting them on its way (tens of
    /// milliseconds each, and a link waits while one is starting). One after
    /// another on a small machine (the first is ready soonest), as many at
    /// once as half its cores on a bigger one.
    pub(crate) fn prewarm(&self, lib: &LibSpec, want: usize) {
        let at_once = std::thread::available_parallelism().map_or(1, |n| n.get() / 2).clamp(1, want.max(1));
        std::thread::scope(|s| {
            for _ in 0..at_once {
                s.spawn(|| while self.grow(lib, Priority::Foreground, want, at_once) {});
            }
        });
    }

    /// Start one worker of `lib` and `class` unless `want` of the class live
    /// already (or `max`) or `at_once` are starting; whether one was started.
    fn grow(&self, lib: &LibSpec, class: Priority, want: usize, at_once: usize) -> bool {
        let c = class as usize;
        self.start_ahead(lib, class, false, at_once, |st| st.live[c] >= want.min(self.config.max))
    }

    /// Start an unused worker of `lib`, `class` and kind (NVVM or not) unless
    /// one is idle or starting already, or every slot of the class is taken.
    fn prewarm_class(&self, lib: &LibSpec, class: Priority, nvvm: bool) {
        let c = class as usize;
        let unused_idle =
            |st: &State| st.idle.iter().any(|w| &w.lib == lib && w.class == class && w.nvvm == nvvm && !w.used);
        self.start_ahead(lib, class, nvvm, 1, |st| st.live[c] >= self.config.max || unused_idle(st));
    }

    /// Start a worker of `lib`, `class` and kind ahead of the links that will
    /// need it, unless `enough` or `at_once` of them are starting already;
    /// whether one was started (its slot is taken before, given back if it fails).
    fn start_ahead(
        &self,
        lib: &LibSpec,
        class: Priority,
        nvvm: bool,
        at_once: usize,
        enough: impl Fn(&State) -> bool,
    ) -> bool {
        let c = class as usize;
        let key = (lib.clone(), class, nvvm);
        {
            let mut st = self.lock();
            if enough(&st) || st.prewarming.iter().filter(|k| **k == key).count() >= at_once {
                return false;
            }
            st.live[c] += 1;
            st.prewarming.push(key.clone());
        }
        let spawned = self.spawn(lib, class, nvvm);
        let mut st = self.lock();
        if let Some(i) = st.prewarming.iter().position(|k| k == &key) {
            st.prewarming.swap_remove(i);
        }
        let ok = match spawned {
            Ok(w) => {
                st.idle.push(w);
                true
            }
            Err(e) => {
                tracing::warn!("cannot start an nvJitLink worker: {e}");
                st.live[c] -= 1;
                false
            }
        };
        drop(st);
        self.freed.notify_all();
        ok
    }

    /// End a worker that ran an NVVM compile, and start an unused NVVM worker
    /// in its place in the background, so that the next link does not wait for it.
    fn retire(&self, mut w: Worker) {
        let _ = w.child.kill();
        let _ = w.child.wait();
        self.release_slot(slots(w.class, w.remote));
        if let Some(me) = self.me.upgrade().filter(|_| !w.remote) {
            let (lib, class) = (w.lib.clone(), w.class);
            let _ = std::thread::Builder::new()
                .name("nvlinkd-worker-start".into())
                .spawn(move || me.prewarm_class(&lib, class, true));
        }
    }

    /// Link in a worker for `lib`.
    ///
    /// An NVVM compile (`-lto`) runs in a worker that has served no request
    /// yet, which ends after it. NVVM inside nvJitLink keeps option state
    /// from one compile to the next in a process: after a compile with
    /// `-Xnvvm=-opt=0` or `-Xnvvm=-Ofast-compile=max` (nvlink's `-Ofc max`),
    /// a later default compile of the benchmark's CUB units gave other code
    /// for three kernels than nvlink, which runs one compile per process. NVVM
    /// workers are [`NVVM_WORKER`] processes, which serve nothing else. Non-LTO
    /// links (no NVVM) reuse warm workers, preferring those already used.
    pub fn link(
        &self,
        lib: &LibSpec,
        options: &[String],
        inputs: &[JitInput<'_>],
        want_ptx: bool,
        cancel: &Cancel,
    ) -> Result<JitOutput, WorkerError> {
        if cancel.is_cancelled() {
            return Err(WorkerError::Cancelled);
        }
        let class = cancel.priority();
        let tenant = cancel.tenant();
        let nvvm = options.iter().any(|o| o == "-lto");
        let mut w = self.checkout(lib, class, nvvm, tenant)?;
        let pid = w.child.id();
        if !cancel.attach(pid) {
            self.checkin(w);
            return Err(WorkerError::Cancelled);
        }
        let id = self.watch_deadline(cancel);
        let res = write_request(&mut w.stdin, options, inputs, want_ptx).and_then(|_| read_response(&mut w.stdout));
        self.unwatch(id);
        cancel.detach();
        match res {
            Ok(r) => {
                if nvvm {
                    self.retire(w);
                } else {
                    w.used = true;
                    w.tenant = tenant;
                    self.checkin(w);
                }
                Ok(r?)
            }
            Err(e) => {
                // The worker is gone (or speaks nonsense): reap it, free its slot.
                let _ = w.child.kill();
                let status = w.child.wait();
                self.release_slot(slots(class, w.remote));
                let how = match status {
                    Ok(s) => describe(s),
                    Err(_) => format!("{e}"),
                };
                match cancel.stopped() {
                    Some(Stopped::Cancelled | Stopped::Superseded | Stopped::Requested) => Err(WorkerError::Cancelled),
                    Some(Stopped::TimedOut) => Err(WorkerError::TimedOut(self.config.timeout)),
                    None => {
                        self.crashes.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(pid, "nvJitLink worker died while linking: {how}");
                        Err(WorkerError::Crashed { pid, how })
                    }
                }
            }
        }
    }

    /// An idle worker for `lib` (an unused NVVM worker when `unused`; otherwise a
    /// used one first), or a new one when there is room; waits while all
    /// `max` workers are busy.
    fn checkout(
        &self,
        lib: &LibSpec,
        class: Priority,
        unused: bool,
        tenant: crate::cancel::Tenant,
    ) -> Result<Worker, WorkerError> {
        let mut st = self.lock();
        let remote = tenant != crate::cancel::LOCAL;
        let c = slots(class, remote);
        let key = (lib.clone(), class, unused);
        loop {
            // Of this kind, and unused or used by this tenant only.
            let fits = |w: &Worker| {
                &w.lib == lib
                    && w.class == class
                    && w.nvvm == unused
                    && w.remote == remote
                    && !(unused && w.used)
                    && (!w.used || w.tenant == tenant)
            };
            let pick = match unused {
                true => st.idle.iter().rposition(fits),
                false => st.idle.iter().rposition(|w| fits(w) && w.used).or_else(|| st.idle.iter().rposition(fits)),
            };
            if let Some(i) = pick {
                return Ok(st.idle.swap_remove(i));
            }
            if !remote && st.prewarming.contains(&key) {
                st = self.freed.wait(st).unwrap_or_else(|e| e.into_inner());
                continue;
            }
            if st.live[c] < self.config.max {
                st.live[c] += 1;
                break;
            }
            // Full: retire an idle worker this request cannot use (another
            // toolkit's, of the other kind, or another tenant's), or wait.
            if let Some(i) = st.idle.iter().rposition(|w| w.class == class && w.remote == remote) {
                let mut other = st.idle.swap_remove(i);
                drop(st);
                let _ = other.child.kill();
                let _ = other.child.wait();
                st = self.lock();
                // Its slot goes to this request.
                break;
            }
            st = self.freed.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        drop(st);
        match self.spawn(lib, class, unused) {
            Ok(mut w) => {
                w.remote = remote;
                Ok(w)
            }
            Err(e) => {
                self.release_slot(c);
                Err(e)
            }
        }
    }

    fn checkin(&self, w: Worker) {
        self.lock().idle.push(w);
        self.freed.notify_all();
    }

    fn release_slot(&self, slot: usize) {
        self.lock().live[slot] -= 1;
        self.freed.notify_all();
    }

    fn spawn(&self, lib: &LibSpec, class: Priority, nvvm: bool) -> Result<Worker, WorkerError> {
        let exe = if nvvm { &self.nvvm_exe } else { &self.config.exe };
        // A worker reads its own executable and the toolkit's libraries, and
        // writes nothing: requests and answers cross its pipes. Background
        // workers run at idle CPU priority (`sched.rs`).
        let mut read: Vec<PathBuf> = exe.canonicalize().into_iter().collect();
        if let Some(root) = lib.path.parent().and_then(Path::parent) {
            read.extend(crate::confine::toolkit_reads(root));
        }
        read.extend(lib.path.canonicalize().ok().and_then(|p| p.parent().map(Path::to_owned)));
        // Test hook: a held worker marks and polls a file in the hold's directory.
        let hold_dir = std::env::var_os(HOLD_ENV).and_then(|h| Path::new(&h).parent().map(Path::to_owned));
        let write: Vec<&Path> = hold_dir.as_deref().into_iter().collect();
        let idle = class == Priority::Background;
        let mut cmd = self.config.confine.command(exe, &read, &write, idle).map_err(WorkerError::Spawn)?;
        let mut child = cmd
            .arg("worker")
            .arg("--lib")
            .arg(&lib.path)
            .arg("--release")
            .arg(format!("{}.{}", lib.major, lib.minor))
            .arg("--mem")
            .arg(self.config.mem_limit.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| WorkerError::Spawn(format!("cannot run {}: {e}", exe.display())))?;
        let pid = child.id();
        let (Some(stdin), Some(stdout), Some(stderr)) = (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(WorkerError::Spawn("worker without pipes".into()));
        };
        // Requests (a link's device code, megabytes) and cubins cross these
        // pipes: with room for a whole megabyte, they take a few writes and
        // wake-ups instead of one per 64 KiB (the kernel's default). Where the
        // kernel refuses (over /proc/sys/fs/pipe-max-size), the default stays.
        for fd in [stdin.as_raw_fd(), stdout.as_raw_fd()] {
            // SAFETY: fcntl on a pipe descriptor this function owns.
            unsafe { libc::fcntl(fd, libc::F_SETPIPE_SZ, PIPE_BYTES) };
        }
        // What the library prints goes to the daemon log.
        let _ = std::thread::Builder::new().name(format!("nvlinkd-worker-log-{pid}")).spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                tracing::info!(pid, "worker: {line}");
            }
        });
        let mut w = Worker {
            lib: lib.clone(),
            class,
            child,
            stdin: BufWriter::with_capacity(1 << 16, stdin),
            stdout: BufReader::with_capacity(1 << 16, stdout),
            used: false,
            nvvm,
            remote: false,
            tenant: crate::cancel::LOCAL,
        };
        let hello = get::<1>(&mut w.stdout).and_then(|[t]| match t {
            0 => Ok(None),
            _ => get_string32(&mut w.stdout).map(Some),
        });
        match hello {
            Ok(None) => {
                tracing::debug!(pid, lib = %lib.path.display(), "nvJitLink worker started");
                Ok(w)
            }
            other => {
                let _ = w.child.kill();
                let status = w.child.wait().map(describe).unwrap_or_default();
                let why = match other {
                    Ok(Some(msg)) => msg,
                    _ => format!("worker did not start ({status})"),
                };
                Err(WorkerError::Spawn(why))
            }
        }
    }

    fn watch_deadline(&self, cancel: &Cancel) -> u64 {
        self.watcher.get_or_init(|| {
            let watch = self.watch.clone();
            let _ = std::thread::Builder::new().name("nvlinkd-worker-watch".into()).spawn(move || watch_loop(&watch));
        });
        let (m, cv) = &*self.watch;
        let mut w = m.lock().unwrap_or_else(|e| e.into_inner());
        let id = w.next;
        w.next += 1;
        w.deadlines.insert(id, (Instant::now() + self.config.timeout, cancel.clone()));
        cv.notify_one();
        id
    }

    fn unwatch(&self, id: u64) {
        self.watch.0.lock().unwrap_or_else(|e| e.into_inner()).deadlines.remove(&id);
    }
}

impl Drop for WorkerPool {
    fn drop(&mut self) {
        let st = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        for mut w in st.idle.drain(..) {
            let _ = w.child.kill();
            let _ = w.child.wait();
        }
    }
}

/// Kill the workers of requests past their deadline.
fn watch_loop(watch: &(Mutex<Watch>, Condvar)) {
    let (m, cv) = watch;
    let mut w = m.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let now = Instant::now();
        for (_, (_, cancel)) in w.deadlines.iter().filter(|(_, (at, _))| *at <= now) {
            cancel.stop(TIMED_OUT);
        }
        w.deadlines.retain(|_, (at, _)| *at > now);
        let wait = w.deadlines.values().map(|(at, _)| *at - now).min().unwrap_or(Duration::from_secs(3600));
        w = cv.wait_timeout(w, wait).unwrap_or_else(|e| e.into_inner()).0;
    }
}

fn describe(s: std::process::ExitStatus) -> String {
    match (s.code(), s.signal()) {
        (_, Some(sig)) => format!("killed by signal {sig}"),
        (Some(c), _) => format!("exited with status {c}"),
        _ => s.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_and_response_round_trip() {
        let data = vec![7u8; 100_000];
        let inputs = [
            JitInput { kind: InputType::Cubin, data: &data, name: "a.o" },
            JitInput { kind: InputType::Object, data: b"", name: "" },
        ];
        let mut buf = Vec::new();
        write_request(&mut buf, &["-arch=sm_90".into(), "-r".into()], &inputs, true).unwrap();
        let mut arena = vec![9u8; 10];
        let r = read_request(&mut &buf[..], &mut arena).unwrap().unwrap();
        assert_eq!(r.options, ["-arch=sm_90", "-r"]);
        assert_eq!(r.inputs.len(), 2);
        assert_eq!((r.inputs[0].0, r.inputs[0].1.as_str()), (InputType::Cubin, "a.o"));
        assert_eq!(&arena[r.inputs[0].2.clone()], &data[..]);
        assert_eq!(arena.len(), data.len(), "the arena holds this request's bytes only");
        assert!(r.inputs[1].2.is_empty());
        assert!(r.want_ptx);
        assert!(read_request(&mut &b""[..], &mut arena).unwrap().is_none());
        assert!(read_request(&mut &buf[..buf.len() - 1], &mut arena).is_err(), "a cut request is an error");
        // A length past what arrives is an error, and reserves no more than the limit.
        let mut cut = Vec::new();
        write_request(&mut cut, &[], &[JitInput { kind: InputType::Cubin, data: b"abc", name: "x" }], false).unwrap();
        let at = cut.len() - 1 - 3 - 8;
        cut[at..at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
        let mut arena = Vec::new();
        assert!(read_request(&mut &cut[..], &mut arena).is_err());
        assert!(arena.capacity() <= RESERVE_AHEAD as usize + 16);

        let mut buf = Vec::new();
        let ok = JitOutput { cubin: Some(vec![1, 2, 3]), ptx: None, info_log: "info".into() };
        write_response(&mut buf, &Ok(ok)).unwrap();
        let err = JitLinkError::Call { call: "complete", status: 4, log: "undefined x".into() };
        write_response(&mut buf, &Err(err)).unwrap();
        let mut r = &buf[..];
        let first = read_response(&mut r).unwrap().unwrap();
        assert_eq!(
            (first.cubin.as_deref(), first.ptx, first.info_log.as_str()),
            (Some(&[1u8, 2, 3][..]), None, "info")
        );
        match read_response(&mut r).unwrap() {
            Err(JitLinkError::Call { call: "complete", status: 4, log }) => assert_eq!(log, "undefined x"),
            other => panic!("{other:?}"),
        }
        assert!(r.is_empty());
    }

    #[test]
    fn cancel_before_attach_refuses() {
        let c = Cancel::new();
        assert!(c.attach(1));
        c.detach();
        c.cancel();
        assert!(c.is_cancelled());
        assert!(!c.attach(1));
    }
}
