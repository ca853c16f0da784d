//! The linker checks itself against the real nvlink (`serve --verify`).
//!
//! Every link the daemon computes in process, under a content key it has not
//! verified before, is also run by the real nvlink of the same toolkit on the
//! same inputs, and the two answers — exit status, stdout, stderr, every
//! output file — are compared byte for byte. nvlink runs on a copy of the
//! link's inputs (the sandbox of `engine/sandbox.rs`): the contents the link
//! read are captured while it is answered (shared, not copied: the link's
//! view holds them), and written to disk only when the comparison runs, so a
//! caller that rewrites its files afterwards changes nothing and the answer
//! never waits for the copy.
//!
//! - `sync`: the comparison runs before the link is answered; on a mismatch
//!   the caller gets nvlink's answer.
//! - `background` (the default): after the answer, one link at a time on a
//!   thread of its own, once no link has been answered for 100 ms, nvlink at
//!   idle CPU priority (`SCHED_IDLE`), so a foreground link never waits for
//!   it and a burst never shares the machine with it. The queue is bounded,
//!   by jobs ([`QUEUE`]) and by the bytes of inputs they hold until they run
//!   ([`QUEUE_BYTES`]); what does not fit is dropped and counted
//!   (`verify_skipped`).
//! - `off`.
//!
//! On a mismatch the cache entry is replaced by nvlink's answer (memory, disk
//! and shared tier, through `Store::store`), the key is routed to the real
//! nvlink from then on (reason `verify_mismatch`), a repro bundle is written
//! under `<cache-dir>/verify/` (arguments, working directory, environment,
//! the inputs as mirrored, both answers, the differences, and `rerun.sh`,
//! which runs the comparison again), and one warning names it; the link's
//! observer is told ([`LinkEvent::VerifyMismatch`](crate::observe::LinkEvent),
//! `verify_mismatch` on the event stream).
//!
//! Not verified, counted in `verify_skipped`: remote links (mirroring reads
//! files nvlink would not, which a remote shim refuses), links with `-time`
//! (measured times differ), `-g` under `-dlto` (nvlink itself writes a random
//! section name there), `-dlto` with an existing registration file (nvlink
//! leaves it alone, the scratch copy has none), registered device-only inputs
//! (their module ids are their paths, the sandbox's), options given twice (the
//! parse warnings are printed apart), options files, links the sandbox cannot
//! mirror, and work the background queue has no room for.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tracing::{debug, warn};

use crate::cache::store::Store;
use crate::cache::{Key, LinkEntry};
use crate::cli::spec::Spec;
use crate::engine::process;
use crate::engine::sandbox::{Mirror, Sandbox};
use crate::fs::InputFs;
use crate::request::{OutputFile, Request};
use crate::sched::Priority;
use crate::worker::Cancel;

/// Background verifications waiting at most; more are dropped (counted).
pub const QUEUE: usize = 64;
/// Bytes of inputs the waiting verifications may hold at most (each keeps
/// what its link read until it runs); a verification past it is dropped
/// (counted in `verify_skipped`), as a link past the queue is.
pub const QUEUE_BYTES: u64 = 256 << 20;
/// Keys remembered as verified (then forgotten oldest first: verified again).
const REMEMBERED: usize = 100_000;
/// Inputs copied into a repro bundle at most; beyond, only their digests.
const BUNDLE_INPUT_BYTES: u64 = 64 << 20;

/// `--verify`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum VerifyMode {
    /// (A linker's default: `nvlinkd exec` and tests; `serve` defaults to
    /// `background`.)
    #[default]
    Off,
    Background,
    Sync,
}

impl std::str::FromStr for VerifyMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "off" => Ok(VerifyMode::Off),
            "background" => Ok(VerifyMode::Background),
            "sync" => Ok(VerifyMode::Sync),
            _ => Err(format!("'{s}': expected off, background or sync")),
        }
    }
}

/// The counters of `stats --json`.
#[derive(Default)]
pub struct Counters {
    /// Links compared with the real nvlink (equal or not).
    pub verified: AtomicU64,
    /// Comparisons that found a difference.
    pub mismatches: AtomicU64,
    /// Links not verified (see the module doc).
    pub skipped: AtomicU64,
    /// Background verifications queued or running.
    pub pending: AtomicU64,
}

/// What the verifier keeps across links.
struct State {
    counters: Counters,
    /// Keys verified (or queued), oldest first, and as a set.
    seen: Mutex<(std::collections::VecDeque<Key>, HashSet<Key>)>,
    /// Keys whose in-process answer differed: routed to nvlink from now on.
    mismatched: Mutex<HashSet<Key>>,
    /// Where repro bundles go.
    bundles: PathBuf,
    bundle_seq: AtomicU64,
    /// Bytes the waiting verifications hold ([`QUEUE_BYTES`]).
    pending_bytes: AtomicU64,
}

/// The answer of one engine, as compared.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    pub exit_code: i32,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub outputs: Vec<OutputFile>,
}

/// Where a verified link's entry lives: replaced by nvlink's answer on a mismatch.
#[derive(Clone)]
pub(crate) struct Heal {
    pub store: Arc<Store>,
    pub content: Key,
    pub named: Key,
    /// Whether the entry of the in-process answer depended on names.
    pub name_sensitive: bool,
}

/// One comparison to run.
pub(crate) struct Job {
    pub nvlink: PathBuf,
    pub toolkit_root: PathBuf,
    pub confine: crate::confine::Policy,
    /// The link's files, captured; taken and written to disk when the
    /// comparison runs.
    pub mirror: Option<Mirror>,
    pub spec: Spec,
    pub req: Request,
    pub ours: Answer,
    pub heal: Heal,
    pub limit: Duration,
    pub scratch_parents: [PathBuf; 2],
    /// The link's observation handle: its span, entered for the warning, and
    /// where the mismatch is reported (`observe.rs`).
    pub obs: crate::observe::LinkObs,
}

/// Wait until no link is being answered, and none was for [`QUIET`]: a
/// background comparison (the real nvlink, on a copy of the inputs) never
/// runs beside foreground links, even at idle CPU priority (its process
/// start, file copies and memory traffic slowed a burst of eight small
/// links 1.6x on two cores).
fn wait_until_idle(in_flight: &AtomicU64) {
    let mut quiet_since: Option<std::time::Instant> = None;
    loop {
        if in_flight.load(Ordering::Relaxed) > 0 {
            quiet_since = None;
        } else if quiet_since.get_or_insert_with(std::time::Instant::now).elapsed() >= QUIET {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// How long no link is answered before a background comparison starts.
const QUIET: Duration = Duration::from_millis(100);

pub(crate) struct Verifier {
    pub mode: VerifyMode,
    state: Arc<State>,
    queue: Option<std::sync::mpsc::SyncSender<Job>>,
}

impl Verifier {
    /// `in_flight`: the links being answered; a background comparison starts
    /// only once there are none (a burst is never shared with nvlink runs).
    pub fn new(mode: VerifyMode, cache_dir: &Path, in_flight: Arc<AtomicU64>) -> Verifier {
        let state = Arc::new(State {
            counters: Counters::default(),
            seen: Mutex::default(),
            mismatched: Mutex::default(),
            bundles: cache_dir.join("verify"),
            bundle_seq: AtomicU64::new(0),
            pending_bytes: AtomicU64::new(0),
        });
        let queue = (mode == VerifyMode::Background).then(|| {
            let (tx, rx) = std::sync::mpsc::sync_channel::<Job>(QUEUE);
            let st = state.clone();
            let spawned = std::thread::Builder::new().name("nvlinkd-verify".into()).spawn(move || {
                crate::sched::idle_priority();
                for job in rx {
                    wait_until_idle(&in_flight);
                    let cancel = Cancel::with_priority(Priority::Background);
                    let bytes = job.mirror.as_ref().map_or(0, Mirror::bytes);
                    let _ = run(&st, job, &cancel, true);
                    st.counters.pending.fetch_sub(1, Ordering::Relaxed);
                    st.pending_bytes.fetch_sub(bytes, Ordering::Relaxed);
                }
            });
            if let Err(e) = spawned {
                warn!("cannot start the verification thread: {e}; links are not verified");
            }
            tx
        });
        Verifier { mode, state, queue }
    }

    pub fn counters(&self) -> &Counters {
        &self.state.counters
    }

    /// Whether a verification of this key found the in-process answer wrong.
    pub fn mismatched(&self, key: &Key) -> bool {
        self.state.mismatched.lock().unwrap_or_else(|p| p.into_inner()).contains(key)
    }

    /// Whether a link of this key is to be verified now (not off, not verified
    /// before); marks it as verified. `why_not`: a reason it cannot be.
    pub fn wants(&self, key: &Key, why_not: Option<&str>) -> bool {
        if self.mode == VerifyMode::Off {
            return false;
        }
        let mut seen = self.state.seen.lock().unwrap_or_else(|p| p.into_inner());
        if seen.1.contains(key) {
            return false;
        }
        if let Some(why) = why_not {
            debug!(%why, "not verified");
            self.state.counters.skipped.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        seen.0.push_back(*key);
        seen.1.insert(*key);
        if seen.0.len() > REMEMBERED {
            if let Some(old) = seen.0.pop_front() {
                seen.1.remove(&old);
            }
        }
        true
    }

    /// The key could not be verified: counted, and it may be tried again.
    pub fn not_verified(&self, key: &Key) {
        self.state.counters.skipped.fetch_add(1, Ordering::Relaxed);
        self.forget(key);
    }

    /// The key's verification did not happen after all: it may be tried again.
    fn forget(&self, key: &Key) {
        let mut seen = self.state.seen.lock().unwrap_or_else(|p| p.into_inner());
        seen.1.remove(key);
        seen.0.retain(|k| k != key);
    }

    /// Verify now (`sync`): nvlink's answer when it differs from ours.
    pub fn now(&self, job: Job, cancel: &Cancel) -> Option<Answer> {
        let key = job.heal.content;
        // The link stores nvlink's answer itself (nothing of ours is stored yet).
        match run(&self.state, job, cancel, false) {
            Verdict::Mismatch(theirs) => Some(theirs),
            Verdict::Same => None,
            Verdict::NotRun => {
                self.forget(&key);
                None
            }
        }
    }

    /// Verify later (`background`), unless the queue is full.
    pub fn later(&self, job: Job) {
        let Some(tx) = &self.queue else { return };
        let key = job.heal.content;
        let bytes = job.mirror.as_ref().map_or(0, Mirror::bytes);
        let held = self.state.pending_bytes.fetch_add(bytes, Ordering::Relaxed);
        self.state.counters.pending.fetch_add(1, Ordering::Relaxed);
        if held + bytes > QUEUE_BYTES {
            debug!(bytes, held, "verification queue holds too many bytes: not verified");
        } else if tx.try_send(job).is_ok() {
            return;
        } else {
            debug!("verification queue full: not verified");
        }
        self.state.counters.pending.fetch_sub(1, Ordering::Relaxed);
        self.state.pending_bytes.fetch_sub(bytes, Ordering::Relaxed);
        self.state.counters.skipped.fetch_add(1, Ordering::Relaxed);
        self.forget(&key);
    }
}

/// Why a link cannot be verified, if it cannot (see the module doc).
pub(crate) fn unverifiable(spec: &Spec, req: &Request, fs: &dyn InputFs) -> Option<&'static str> {
    if !req.shared_fs {
        return Some("a remote link (its files are read only as nvlink reads them)");
    }
    if !spec.parsed.warnings.is_empty() {
        return Some("options given twice (nvlink prints its parse warnings itself)");
    }
    if spec.time.is_some() {
        return Some("-time (measured times differ)");
    }
    // (Read while parsing: the parsed options keep their contents, not them.)
    if crate::engine::sandbox::names_an_options_file(&req.args) {
        return Some("an options file (the sandbox does not mirror it as nvlink opens it)");
    }
    if spec.debug && spec.lto {
        return Some("-g with -dlto (nvlink's own output is not deterministic)");
    }
    if spec.lto && spec.files.written.register.as_ref().is_some_and(|r| fs.stat(&r.path).is_ok()) {
        return Some("-dlto with an existing registration file");
    }
    None
}

enum Verdict {
    Same,
    Mismatch(Answer),
    NotRun,
}

/// Run nvlink in the job's sandbox and compare; on a mismatch route, report
/// and, with `heal` (the in-process answer is stored already), put nvlink's
/// answer in its place.
fn run(st: &State, mut job: Job, cancel: &Cancel, heal_entry: bool) -> Verdict {
    let sandbox = match job.mirror.take().map(Mirror::write) {
        Some(Ok(s)) => s,
        Some(Err(e)) => {
            debug!("not verified: the link's files cannot be mirrored: {e:?}");
            st.counters.skipped.fetch_add(1, Ordering::Relaxed);
            return Verdict::NotRun;
        }
        None => return Verdict::NotRun,
    };
    let confined = process::Confined { policy: &job.confine, toolkit_root: &job.toolkit_root, sandbox: sandbox.dir() };
    let run = process::run(
        &job.nvlink,
        &sandbox.request,
        &job.spec,
        &job.scratch_parents,
        cancel,
        job.limit,
        Some(&confined),
    );
    let theirs = match run {
        Ok(r) => match sandbox.unmirror(r.stdout, r.stderr, r.outputs, &job.spec) {
            Ok((stdout, stderr, outputs)) => Answer { exit_code: r.exit_code, stdout, stderr, outputs },
            Err(e) => {
                debug!("not verified: {e:?}");
                st.counters.skipped.fetch_add(1, Ordering::Relaxed);
                return Verdict::NotRun;
            }
        },
        Err(e) => {
            debug!("not verified: nvlink gave no answer: {e}");
            st.counters.skipped.fetch_add(1, Ordering::Relaxed);
            return Verdict::NotRun;
        }
    };
    st.counters.verified.fetch_add(1, Ordering::Relaxed);
    let diffs = differences(&job.ours, &theirs);
    if diffs.is_empty() {
        return Verdict::Same;
    }
    st.counters.mismatches.fetch_add(1, Ordering::Relaxed);
    st.mismatched.lock().unwrap_or_else(|p| p.into_inner()).insert(job.heal.content);
    if heal_entry {
        heal(&job, &theirs);
    }
    let bundle = write_bundle(st, &job, &sandbox, &theirs, &diffs);
    let _in_link = job.obs.span().enter();
    warn!(
        verify = "mismatch",
        bundle = %bundle.as_deref().unwrap_or(Path::new("-")).display(),
        differences = %diffs.join("; "),
        "the in-process answer differs from nvlink's: the cache now holds nvlink's, and this link is routed to nvlink"
    );
    job.obs.verify_mismatch(bundle, diffs);
    Verdict::Mismatch(theirs)
}

/// What differs between two answers, in words (empty: nothing).
pub(crate) fn differences(ours: &Answer, theirs: &Answer) -> Vec<String> {
    let mut d = Vec::new();
    if ours.exit_code != theirs.exit_code {
        d.push(format!("exit status {} (nvlink {})", ours.exit_code, theirs.exit_code));
    }
    if ours.stdout != theirs.stdout {
        d.push("stdout".into());
    }
    if ours.stderr != theirs.stderr {
        d.push("stderr".into());
    }
    let files = |a: &Answer| -> BTreeMap<PathBuf, (bool, bytes::Bytes)> {
        a.outputs.iter().map(|f| (f.path.clone(), (f.append, f.data.clone()))).collect()
    };
    let (o, t) = (files(ours), files(theirs));
    for (path, (append, data)) in &t {
        match o.get(path) {
            None => d.push(format!("{}: written by nvlink only", path.display())),
            Some((a, bytes)) if a != append || bytes != data => {
                d.push(format!("{}: {} bytes, nvlink's {}", path.display(), bytes.len(), data.len()))
            }
            Some(_) => {}
        }
    }
    for path in o.keys().filter(|p| !t.contains_key(*p)) {
        d.push(format!("{}: not written by nvlink", path.display()));
    }
    d
}

/// Put nvlink's answer where the in-process one was stored.
fn heal(job: &Job, theirs: &Answer) {
    let Some(files) = crate::linkcache::entry_files(&theirs.outputs, &job.spec) else {
        return;
    };
    let name_sensitive = job.heal.name_sensitive || !theirs.stdout.is_empty() || !theirs.stderr.is_empty();
    let entry = LinkEntry {
        exit_code: theirs.exit_code,
        stdout: theirs.stdout.clone(),
        stderr: theirs.stderr.clone(),
        files,
        name_sensitive,
    };
    let bytes = entry.encode();
    if name_sensitive && job.heal.named != job.heal.content {
        job.heal.store.store("link", &job.heal.named, bytes.clone());
    }
    job.heal.store.store("link", &job.heal.content, bytes);
}

/// Repro bundles kept (the oldest are removed first): each may hold its
/// link's inputs, up to `BUNDLE_INPUT_BYTES`.
const BUNDLES_KEPT: usize = 64;

/// Remove the oldest bundles under `dir` past the newest `keep`.
fn keep_newest_bundles(dir: &Path, keep: usize) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let mut bundles: Vec<(std::time::SystemTime, PathBuf)> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| (e.metadata().and_then(|m| m.modified()).unwrap_or(std::time::UNIX_EPOCH), e.path()))
        .collect();
    if bundles.len() <= keep {
        return;
    }
    bundles.sort();
    for (_, old) in &bundles[..bundles.len() - keep] {
        let _ = std::fs::remove_dir_all(old);
    }
}

/// The repro bundle of a mismatch; its directory, if it could be written.
fn write_bundle(st: &State, job: &Job, sandbox: &Sandbox, theirs: &Answer, diffs: &[String]) -> Option<PathBuf> {
    let hex: String = job.heal.content[..8].iter().map(|b| format!("{b:02x}")).collect();
    let n = st.bundle_seq.fetch_add(1, Ordering::Relaxed);
    let dir = st.bundles.join(format!("{hex}-{}-{n}", std::process::id()));
    keep_newest_bundles(&st.bundles, BUNDLES_KEPT - 1);
    let written = (|| -> std::io::Result<()> {
        std::fs::create_dir_all(&dir)?;
        let lines = |v: &[String]| v.iter().map(|a| format!("{a}\n")).collect::<String>();
        std::fs::write(dir.join("args"), lines(&job.req.args))?;
        std::fs::write(dir.join("cwd"), format!("{}\n", job.req.cwd.display()))?;
        let env: Vec<String> = job.req.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        std::fs::write(dir.join("env"), lines(&env))?;
        std::fs::write(dir.join("differences"), lines(diffs))?;
        for (who, a) in [("nvlinkd", &job.ours), ("nvlink", theirs)] {
            let d = dir.join(who);
            std::fs::create_dir_all(&d)?;
            std::fs::write(d.join("exit_code"), format!("{}\n", a.exit_code))?;
            std::fs::write(d.join("stdout"), &a.stdout)?;
            std::fs::write(d.join("stderr"), &a.stderr)?;
            for f in &a.outputs {
                let name = f.path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                std::fs::write(d.join(format!("output.{name}")), &f.data)?;
            }
        }
        // The inputs as nvlink saw them: copied when small, else their digests.
        let root = sandbox.dir().join("root");
        let mut listing = String::new();
        let mut total = 0u64;
        let mut files = Vec::new();
        walk(&root, &mut files);
        for f in &files {
            let data = std::fs::read(f)?;
            total += data.len() as u64;
            let rel = f.strip_prefix(&root).unwrap_or(f);
            listing.push_str(&format!("{}  {}  /{}\n", blake3::hash(&data).to_hex(), data.len(), rel.display()));
        }
        std::fs::write(dir.join("inputs.blake3"), listing)?;
        if total <= BUNDLE_INPUT_BYTES {
            // Directories too, empty ones included (an output's).
            let mut dirs = Vec::new();
            walk_dirs(&root, &mut dirs);
            for d in &dirs {
                std::fs::create_dir_all(dir.join("inputs").join(d.strip_prefix(&root).unwrap_or(d)))?;
            }
            for f in &files {
                let to = dir.join("inputs").join(f.strip_prefix(&root).unwrap_or(f));
                if let Some(p) = to.parent() {
                    std::fs::create_dir_all(p)?;
                }
                std::fs::copy(f, &to)?;
            }
        }
        write_rerun(&dir, job, sandbox, &root.to_string_lossy())
    })();
    match written {
        Ok(()) => Some(dir),
        Err(e) => {
            warn!(dir = %dir.display(), "cannot write the verification bundle: {e}");
            None
        }
    }
}

fn walk_dirs(dir: &Path, out: &mut Vec<PathBuf>) {
    out.push(dir.to_owned());
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            walk_dirs(&e.path(), out);
        }
    }
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let Ok(t) = e.file_type() else { continue };
        if t.is_dir() {
            walk(&e.path(), out);
        } else if t.is_file() {
            out.push(e.path());
        }
    }
}

/// `rerun.sh`: the real nvlink, then `nvlinkd exec`, each on a fresh copy of
/// `inputs/` at the same place and writing its outputs to the same directory
/// (so that messages naming paths read alike), then the two answers compared.
fn write_rerun(dir: &Path, job: &Job, sandbox: &Sandbox, sandbox_root: &str) -> std::io::Result<()> {
    let quote = |s: &str| format!("'{}'", s.replace('\'', "'\\''"));
    // The outputs as given on the command line: written under "$out" instead.
    let outputs: Vec<&str> =
        [job.spec.output.as_deref(), job.spec.register_link_binaries.as_deref()].into_iter().flatten().collect();
    let arg = |a: &str| {
        if let Some(o) = outputs.iter().find(|o| a.ends_with(**o)) {
            let base = Path::new(o).file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            return format!("{}\"$out\"/{}", quote(&a[..a.len() - o.len()]), quote(&base));
        }
        // The sandbox's root in an argument becomes the copy's ("$root").
        match a.find(sandbox_root) {
            Some(i) => format!("{}\"$root\"{}", quote(&a[..i]), quote(&a[i + sandbox_root.len()..])),
            None => quote(a),
        }
    };
    let args: Vec<String> = sandbox.request.args.iter().map(|a| arg(a)).collect();
    let cwd = sandbox.request.cwd.to_string_lossy();
    let cwd = cwd.strip_prefix(sandbox_root).unwrap_or(&cwd);
    let nvlinkd = std::env::current_exe().map(|p| p.display().to_string()).unwrap_or_else(|_| "nvlinkd".into());
    let script = format!(
        "#!/bin/sh\n\
         # Runs this link again with the real nvlink and with nvlinkd's in-process\n\
         # engine (nvlinkd exec) on copies of inputs/, and compares the answers.\n\
         set -u\n\
         here=$(cd \"$(dirname \"$0\")\" && pwd)\n\
         NVLINK=${{NVLINK:-{nvlink}}}\n\
         NVLINKD=${{NVLINKD:-{nvlinkd}}}\n\
         export CUDA_HOME=${{CUDA_HOME:-{cuda}}}\n\
         root=\"$here/run\" out=\"$here/run.out\"\n\
         for tool in nvlink nvlinkd; do\n\
         \x20 rm -rf \"$root\" \"$out\" \"$here/$tool.out\" && cp -r \"$here/inputs\" \"$root\" && mkdir \"$out\"\n\
         \x20 if [ $tool = nvlink ]; then set -- \"$NVLINK\"; else set -- \"$NVLINKD\" exec --; fi\n\
         \x20 (cd \"$root\"{cwd} && \"$@\" {args} >\"$out/.stdout\" 2>\"$out/.stderr\"; echo $? >\"$out/.exit\")\n\
         \x20 mv \"$out\" \"$here/$tool.out\"\n\
         done\n\
         rm -rf \"$root\"\n\
         if diff -r \"$here/nvlink.out\" \"$here/nvlinkd.out\"; then echo 'same: yes'; else echo 'same: no'; exit 1; fi\n",
        nvlink = quote(&job.nvlink.to_string_lossy()),
        nvlinkd = quote(&nvlinkd),
        cuda = quote(&job.toolkit_root.to_string_lossy()),
        cwd = quote(cwd),
        args = args.join(" "),
    );
    let path = dir.join("rerun.sh");
    std::fs::write(&path, script)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(code: i32, out: &[u8], files: &[(&str, &[u8])]) -> Answer {
        Answer {
            exit_code: code,
            stdout: out.to_vec(),
            stderr: Vec::new(),
            outputs: files
                .iter()
                .map(|(p, d)| OutputFile {
                    path: PathBuf::from(p),
                    data: bytes::Bytes::copy_from_slice(d),
                    append: false,
                })
                .collect(),
        }
    }

    /// Every part of an answer counts: exit status, messages, each file's
    /// bytes, and which files there are.
    #[test]
    fn only_the_newest_bundles_are_kept() {
        let dir = std::env::temp_dir().join(format!("nvlinkd-bundles-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for i in 0..5 {
            std::fs::create_dir_all(dir.join(format!("b{i}"))).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(15));
        }
        keep_newest_bundles(&dir, 2);
        let mut left: Vec<String> =
            std::fs::read_dir(&dir).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
        left.sort();
        assert_eq!(left, ["b3", "b4"]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn answers_differ_in_every_part() {
        let a = answer(0, b"", &[("/w/x.cubin", b"abc"), ("/w/reg.c", b"r")]);
        assert!(differences(&a, &a.clone()).is_empty());
        assert_eq!(differences(&answer(1, b"", &[("/w/x.cubin", b"abc"), ("/w/reg.c", b"r")]), &a).len(), 1);
        assert_eq!(differences(&answer(0, b"w", &[("/w/x.cubin", b"abc"), ("/w/reg.c", b"r")]), &a), ["stdout"]);
        assert_eq!(differences(&answer(0, b"", &[("/w/x.cubin", b"abd"), ("/w/reg.c", b"r")]), &a).len(), 1);
        assert_eq!(differences(&answer(0, b"", &[("/w/x.cubin", b"abc")]), &a).len(), 1);
        assert_eq!(differences(&a, &answer(0, b"", &[("/w/x.cubin", b"abc")])).len(), 1);
    }

    #[test]
    fn modes_parse() {
        assert_eq!("sync".parse(), Ok(VerifyMode::Sync));
        assert_eq!("background".parse(), Ok(VerifyMode::Background));
        assert_eq!("off".parse(), Ok(VerifyMode::Off));
        assert!("on".parse::<VerifyMode>().is_err());
    }
}
