//! Watch-driven speculative relinks (`serve --watch`) and `nvlinkd watch`.
//!
//! An IDE or a build-on-save loop recompiles an object and then links again
//! with the same command line. With `--watch` the daemon remembers the recipes
//! of recent links (arguments, working directory, environment, toolkit, and the
//! caller's files they read: `nvlinkd_core::speculate::watched_inputs`), at most
//! [`MAX_RECIPES`], least recently used first out. It watches the directories
//! of those files with `notify` (inotify on Linux; a directory, not the file,
//! so that a file replaced by a rename is still seen). When a recipe's input
//! changes it waits for a quiet period ([`QUIET`]: a save or a compiler writes
//! an object in several steps, each an event) and then relinks the recipe in
//! the background (`Speculator::spawn_speculative`): the result goes into the
//! cache, and the build's next identical call is a hit. A change arriving
//! while the recipe's relink still runs cancels that relink (its worker or
//! nvlink is killed) and, after the next quiet period, starts a new one.
//! A relink refused by the bound on speculative work is tried again after
//! another quiet period, so changes coalesce rather than queue.
//!
//! `nvlinkd watch -- <nvlink arguments>` subscribes one recipe: it is linked at
//! once and after every change, and each result is streamed to the command,
//! which writes the outputs as nvlink would (`cmd/watch.rs`). Its recipe stays
//! until the command goes away.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};

use notify::{EventKind, RecursiveMode, Watcher as _};
use nvlinkd_core::request::{Outcome, Request};
use nvlinkd_core::sched::Priority;
use nvlinkd_core::speculate::watched_inputs;
use nvlinkd_core::stats::bump;
use nvlinkd_core::worker::Cancel;
use nvlinkd_core::Linker;
use tracing::{debug, info, warn};

use crate::speculate::{Reason, SpeculativeFs, Speculator};

/// How long a recipe's inputs must stay quiet before it is relinked.
pub const QUIET: Duration = Duration::from_millis(200);
/// Most recipes remembered from builds (`nvlinkd watch` recipes come on top).
pub const MAX_RECIPES: usize = 64;

/// Told about every finished relink of a subscribed recipe: its number (0 is
/// the first link), its link id (events), the inputs whose change caused it,
/// the outcome, how long it took. Returns false once nobody listens any more.
pub type Subscriber = Arc<dyn Fn(u64, u64, &[PathBuf], &Outcome, Duration) -> bool + Send + Sync>;

/// A recipe as `nvlinkd watch --list` shows it.
pub struct RecipeInfo {
    pub id: u64,
    pub cwd: PathBuf,
    pub args: Vec<String>,
    pub relinks: u64,
    /// An `nvlinkd watch` follows it.
    pub followed: bool,
}

struct Recipe {
    id: u64,
    req: Request,
    /// The files it reads, each named under its directory's canonical path
    /// (the form `notify` reports events in).
    inputs: Vec<PathBuf>,
    /// The directories watched for it.
    dirs: Vec<PathBuf>,
    /// The last change not yet relinked, and which inputs changed.
    changed_at: Option<Instant>,
    changed: Vec<PathBuf>,
    /// Relinks started; the running one's `Cancel`.
    runs: u64,
    running: Option<Cancel>,
    subscriber: Option<Subscriber>,
    /// For least-recently-used eviction.
    used: Instant,
}

impl Recipe {
    fn same_link(&self, req: &Request) -> bool {
        self.req.args == req.args
            && self.req.cwd == req.cwd
            && self.req.env == req.env
            && self.req.toolkit == req.toolkit
    }
}

/// Changed paths not yet applied to the recipes, and whether a recipe became due.
#[derive(Default)]
struct Pending {
    paths: Vec<(PathBuf, Instant)>,
    kick: bool,
}

#[derive(Default)]
struct State {
    recipes: Vec<Recipe>,
    /// Watched directories and how many recipes need each.
    dirs: HashMap<PathBuf, usize>,
    next_id: u64,
}

pub struct Watcher {
    linker: Arc<Linker>,
    speculator: Arc<Speculator>,
    /// Whether the recipes of ordinary links are remembered (`--watch`).
    remember_builds: bool,
    max_link_input: u64,
    state: Mutex<State>,
    /// What the `notify` thread and `subscribe` hand to the debouncing
    /// thread. A lock of its own, never held while waiting on anything:
    /// `notify`'s watch and unwatch wait for its event thread, which may be
    /// delivering an event, so the event handler must never wait for `state`.
    pending: Mutex<Pending>,
    wake: Condvar,
    notify: Mutex<Option<notify::RecommendedWatcher>>,
}

impl Watcher {
    pub fn new(
        linker: Arc<Linker>,
        speculator: Arc<Speculator>,
        remember_builds: bool,
        max_link_input: u64,
    ) -> Arc<Self> {
        let w = Arc::new(Watcher {
            linker,
            speculator,
            remember_builds,
            max_link_input,
            state: Mutex::new(State::default()),
            pending: Mutex::new(Pending::default()),
            wake: Condvar::new(),
            notify: Mutex::new(None),
        });
        let weak = Arc::downgrade(&w);
        match notify::recommended_watcher(move |ev: notify::Result<notify::Event>| {
            if let (Some(w), Ok(ev)) = (weak.upgrade(), ev) {
                w.on_event(&ev);
            }
        }) {
            Ok(n) => *w.notify.lock().unwrap_or_else(|p| p.into_inner()) = Some(n),
            Err(e) => warn!("cannot watch files ({e}): no watch-driven relinks"),
        }
        let weak = Arc::downgrade(&w);
        let _ = std::thread::Builder::new().name("nvlinkd-watch".into()).spawn(move || debounce(weak));
        w
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A real link finished: remember its recipe (with `--watch`).
    pub fn remember(&self, req: &Request) {
        if !self.remember_builds || !req.shared_fs || req.speculative {
            return;
        }
        let mut st = self.lock();
        if let Some(r) = st.recipes.iter_mut().find(|r| r.same_link(req)) {
            r.used = Instant::now();
            return;
        }
        drop(st);
        let Some(inputs) = watched_inputs(req, &SpeculativeFs::new(self.max_link_input)) else { return };
        let mut st = self.lock();
        if st.recipes.iter().any(|r| r.same_link(req)) {
            return;
        }
        // Least recently used first out (subscribed recipes stay).
        while st.recipes.iter().filter(|r| r.subscriber.is_none()).count() >= MAX_RECIPES {
            let Some(oldest) =
                st.recipes.iter().filter(|r| r.subscriber.is_none()).min_by_key(|r| r.used).map(|r| r.id)
            else {
                break;
            };
            self.remove(&mut st, oldest);
        }
        self.insert(&mut st, req.clone(), &inputs, None);
    }

    /// `nvlinkd watch`: link `req` now and after every change of its inputs,
    /// telling `subscriber`. `None` when the link is not one to watch.
    pub fn subscribe(&self, req: Request, subscriber: Subscriber) -> Option<u64> {
        let inputs = watched_inputs(&req, &SpeculativeFs::new(self.max_link_input))?;
        let mut st = self.lock();
        let id = self.insert(&mut st, req, &inputs, Some(subscriber));
        drop(st);
        self.pending.lock().unwrap_or_else(|p| p.into_inner()).kick = true;
        self.wake.notify_all();
        Some(id)
    }

    /// The `nvlinkd watch` command went away.
    pub fn unsubscribe(&self, id: u64) {
        let mut st = self.lock();
        self.remove(&mut st, id);
    }

    /// The recipes kept fresh now, oldest first.
    pub fn recipes(&self) -> Vec<RecipeInfo> {
        let st = self.lock();
        let mut v: Vec<RecipeInfo> = st
            .recipes
            .iter()
            .map(|r| RecipeInfo {
                id: r.id,
                cwd: r.req.cwd.clone(),
                args: r.req.args.clone(),
                relinks: r.runs.saturating_sub(u64::from(r.subscriber.is_some())),
                followed: r.subscriber.is_some(),
            })
            .collect();
        v.sort_by_key(|r| r.id);
        v
    }

    /// Forget the build recipes `ids` (all of them: `None`); a recipe an
    /// `nvlinkd watch` follows stays (it ends with its command). How many
    /// were forgotten.
    pub fn forget(&self, ids: Option<&[u64]>) -> usize {
        let mut st = self.lock();
        let gone: Vec<u64> = st
            .recipes
            .iter()
            .filter(|r| r.subscriber.is_none() && ids.is_none_or(|ids| ids.contains(&r.id)))
            .map(|r| r.id)
            .collect();
        for id in &gone {
            self.remove(&mut st, *id);
        }
        gone.len()
    }

    fn insert(&self, st: &mut State, req: Request, inputs: &[PathBuf], subscriber: Option<Subscriber>) -> u64 {
        let mut named = Vec::new();
        let mut dirs = Vec::new();
        for input in inputs {
            let (Some(dir), Some(name)) = (input.parent(), input.file_name()) else { continue };
            let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_owned());
            named.push(dir.join(name));
            if !dirs.contains(&dir) {
                dirs.push(dir);
            }
        }
        for dir in &dirs {
            let n = st.dirs.entry(dir.clone()).or_insert(0);
            *n += 1;
            if *n == 1 {
                if let Some(w) = self.notify.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
                    if let Err(e) = w.watch(dir, RecursiveMode::NonRecursive) {
                        debug!(dir = %dir.display(), "cannot watch: {e}");
                    }
                }
            }
        }
        st.next_id += 1;
        let id = st.next_id;
        // A subscribed recipe is linked at once.
        let changed_at = subscriber.as_ref().map(|_| Instant::now() - QUIET);
        debug!(id, inputs = named.len(), "recipe remembered");
        st.recipes.push(Recipe {
            id,
            req,
            inputs: named,
            dirs,
            changed_at,
            changed: Vec::new(),
            runs: 0,
            running: None,
            subscriber,
            used: Instant::now(),
        });
        id
    }

    fn remove(&self, st: &mut State, id: u64) {
        let Some(i) = st.recipes.iter().position(|r| r.id == id) else { return };
        let r = st.recipes.swap_remove(i);
        if let Some(c) = r.running {
            c.cancel();
        }
        for dir in r.dirs {
            if let Some(n) = st.dirs.get_mut(&dir) {
                *n -= 1;
                if *n == 0 {
                    st.dirs.remove(&dir);
                    if let Some(w) = self.notify.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
                        let _ = w.unwatch(&dir);
                    }
                }
            }
        }
    }

    /// On `notify`'s thread: hand the paths over (see [`Watcher::pending`]).
    fn on_event(&self, ev: &notify::Event) {
        if matches!(ev.kind, EventKind::Access(_)) || ev.paths.is_empty() {
            return;
        }
        let now = Instant::now();
        self.pending.lock().unwrap_or_else(|p| p.into_inner()).paths.extend(ev.paths.iter().map(|p| (p.clone(), now)));
        self.wake.notify_all();
    }

    /// Mark the recipes that read a changed path.
    fn apply(st: &mut State, changes: Vec<(PathBuf, Instant)>) {
        for (path, at) in changes {
            for r in st.recipes.iter_mut().filter(|r| r.inputs.contains(&path)) {
                r.changed_at = Some(r.changed_at.map_or(at, |t| t.max(at)));
                if !r.changed.contains(&path) {
                    r.changed.push(path.clone());
                }
            }
        }
    }

    /// Relink the recipes whose inputs have been quiet for [`QUIET`]; how long
    /// until the next one is due.
    fn relink_due(self: &Arc<Self>, st: &mut State) -> Option<Duration> {
        let now = Instant::now();
        let mut next: Option<Duration> = None;
        for r in st.recipes.iter_mut() {
            let Some(at) = r.changed_at else { continue };
            let due = at + QUIET;
            if due > now {
                next = Some(next.map_or(due - now, |n| n.min(due - now)));
                continue;
            }
            // A build's input still missing (between remove and rewrite, or a
            // temporary file gone): its creation is another event. (`nvlinkd
            // watch` gets nvlink's answer, missing file or not.)
            if r.subscriber.is_none() && r.inputs.iter().any(|p| !p.exists()) {
                r.changed_at = None;
                continue;
            }
            if let Some(old) = r.running.take() {
                // (Its `link_cancelled` says `superseded`; the newer relink's
                // id is not known yet.)
                old.supersede(0);
                bump(&self.linker.stats.speculative_cancelled);
            }
            let cancel = Cancel::with_priority(Priority::Background);
            let run = r.runs;
            let changed = std::mem::take(&mut r.changed);
            let reason = if r.subscriber.is_some() { Reason::Watch } else { Reason::InputChanged };
            let on_done = {
                let (weak, id, subscriber, changed) =
                    (Arc::downgrade(self), r.id, r.subscriber.clone(), changed.clone());
                let cancel = cancel.clone();
                Box::new(move |link: u64, o: &Outcome, took: Duration| {
                    let Some(w) = weak.upgrade() else { return };
                    let current = {
                        let mut st = w.lock();
                        match st.recipes.iter_mut().find(|r| r.id == id) {
                            Some(r) if r.runs == run + 1 => {
                                r.running = None;
                                true
                            }
                            _ => false,
                        }
                    };
                    // A superseded or cancelled relink tells nobody.
                    if let (true, false, Some(s)) = (current, cancel.is_cancelled(), subscriber) {
                        if !s(run, link, &changed, o, took) {
                            w.unsubscribe(id);
                        }
                    }
                })
            };
            info!(recipe = r.id, run, changed = changed.len(), "relinking after a change");
            if self.speculator.spawn_speculative(r.req.clone(), reason, cancel.clone(), Some(on_done)) {
                r.runs += 1;
                r.running = Some(cancel);
                r.changed_at = None;
            } else {
                // At the bound: try again after another quiet period.
                r.changed = changed;
                r.changed_at = Some(now);
                next = Some(next.map_or(QUIET, |n| n.min(QUIET)));
            }
        }
        next
    }
}

/// The debouncing thread: wakes on changes, relinks what has been quiet long
/// enough, sleeps until the next recipe is due.
fn debounce(weak: Weak<Watcher>) {
    let Some(w) = weak.upgrade() else { return };
    let mut wait = Duration::ZERO;
    loop {
        let changes = {
            let mut p = w.pending.lock().unwrap_or_else(|p| p.into_inner());
            // Checked and waited for under the same lock: nothing handed over
            // in between goes unnoticed. Spurious wakeups only check again.
            if p.paths.is_empty() && !p.kick && !wait.is_zero() {
                p = w.wake.wait_timeout(p, wait).unwrap_or_else(|p| p.into_inner()).0;
            }
            p.kick = false;
            std::mem::take(&mut p.paths)
        };
        let mut st = w.lock();
        Watcher::apply(&mut st, changes);
        wait = w.relink_due(&mut st).unwrap_or(Duration::from_secs(60));
    }
}
