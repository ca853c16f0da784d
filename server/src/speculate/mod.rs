//! Speculative links: links the daemon computes before anyone asks for them,
//! so that the build's next call is a cache hit.
//!
//! Two things predict a link (see `nvlinkd_core::speculate` for why a
//! prediction never risks wrong bytes):
//!
//! - **Multi-arch** (on unless `serve --no-speculate`): nvcc links a
//!   multi-arch build once per arch, one call after the other. When the first
//!   call arrives, [`Speculator::on_link`] predicts the other archs' calls from
//!   its inputs and links them at once, in parallel with the first.
//! - **Watch** (`serve --watch`, `nvlinkd watch`): a recent link's input
//!   changed, its recipe is linked again (`watch.rs`).
//!
//! Every speculative link runs through one function,
//! [`Speculator::spawn_speculative`]: it marks the request speculative (the
//! background class: the result only goes into the cache, it is not counted
//! as a request), bounds how many run at once (past the bound a prediction is
//! dropped, `speculative_dropped`; watch retries its recipes later), and runs
//! the link on its own thread with the daemon's own view of the caller's files
//! (`LocalFs`: speculation exists only where the daemon shares the caller's
//! filesystem). Its `Cancel` kills the worker or child processes computing it
//! when a newer change makes it pointless.

use std::collections::{BTreeSet, VecDeque};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use nvlinkd_core::fs::{self as corefs, FileIdentity, FileStat, InputFs};
use nvlinkd_core::request::{Outcome, Request};
use nvlinkd_core::sched::Priority;

use crate::observe::events::Hub;
use nvlinkd_core::speculate::sibling_archs;
use nvlinkd_core::stats::bump;
pub mod watch;

use nvlinkd_core::worker::Cancel;
use nvlinkd_core::Linker;
use tracing::{debug, info, warn};

/// Why a speculative link runs.
#[derive(Clone, Debug)]
pub enum Reason {
    /// Another arch of the multi-arch nvcc step whose first link arrived.
    OtherArch(String),
    /// An input of a remembered recipe changed.
    InputChanged,
    /// `nvlinkd watch` asked for the link (its first run, or after a change).
    Watch,
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Reason::OtherArch(a) => write!(f, "other arch {a}"),
            Reason::InputChanged => f.write_str("input changed"),
            Reason::Watch => f.write_str("watch"),
        }
    }
}

/// What is told when a speculative link ends.
pub type OnDone = Box<dyn FnOnce(u64, &Outcome, std::time::Duration) + Send>;

/// How many nvcc steps are remembered to not predict the same arch twice.
const FAMILIES: usize = 64;

pub struct Speculator {
    linker: Arc<Linker>,
    /// The event stream: speculative links are announced like the others,
    /// with `speculative: true` (`events.rs`).
    events: Hub,
    /// Multi-arch prediction (`--no-speculate` turns it off).
    multi_arch: bool,
    /// Most speculative links computing at once.
    max_running: usize,
    running: AtomicUsize,
    /// Predictions reading their inputs now (bounded like the links).
    predicting: AtomicUsize,
    /// nvcc steps seen lately: their family and the archs already linked or started.
    families: Mutex<VecDeque<([u8; 32], BTreeSet<String>)>>,
    /// A file the daemon keeps, named as the `--register-link-binaries` file
    /// of predicted `-dlto` links (see `nvlinkd_core::speculate::sibling_archs`).
    existing_register: PathBuf,
    /// Most input bytes one link may read.
    max_link_input: u64,
}

impl Speculator {
    pub fn new(
        linker: Arc<Linker>,
        events: Hub,
        cache_dir: &Path,
        multi_arch: bool,
        max_running: usize,
        max_link_input: u64,
    ) -> Arc<Self> {
        let dir = cache_dir.join("speculation");
        let existing_register = dir.join("existing-register-file.c");
        if let Err(e) = std::fs::create_dir_all(&dir).and_then(|()| {
            if std::fs::metadata(&existing_register).is_ok_and(|m| m.is_file()) {
                Ok(())
            } else {
                std::fs::write(&existing_register, b"")
            }
        }) {
            warn!(path = %existing_register.display(), "cannot keep the placeholder file of speculative -dlto links: {e}");
        }
        Arc::new(Speculator {
            linker,
            events,
            multi_arch,
            max_running: max_running.max(1),
            running: AtomicUsize::new(0),
            predicting: AtomicUsize::new(0),
            families: Mutex::new(VecDeque::new()),
            existing_register,
            max_link_input,
        })
    }

    /// A real link arrived: when it is one arch of a multi-arch nvcc step,
    /// link the other archs in the background (the prediction itself reads
    /// the inputs, so it runs off the caller's path too).
    pub fn on_link(self: &Arc<Self>, req: &Request) {
        if !self.multi_arch || !req.shared_fs || req.speculative {
            return;
        }
        // A burst of links does not start a burst of threads reading inputs:
        // past the bound, a link predicts nothing (a later arch's call of the
        // same step predicts the same archs).
        if self.predicting.fetch_add(1, Ordering::SeqCst) >= self.max_running {
            self.predicting.fetch_sub(1, Ordering::SeqCst);
            return;
        }
        let (this, req) = (self.clone(), req.clone());
        let spawned = std::thread::Builder::new().name("nvlinkd-predict".into()).spawn(move || {
            let _predicting = Running(&this.predicting);
            this.predict(&req)
        });
        if spawned.is_err() {
            self.predicting.fetch_sub(1, Ordering::SeqCst);
        }
    }

    fn predict(self: &Arc<Self>, req: &Request) {
        let fs = SpeculativeFs::new(self.max_link_input);
        let known = |family: &[u8; 32]| {
            let families = self.families.lock().unwrap_or_else(|p| p.into_inner());
            families.iter().any(|(f, _)| f == family)
        };
        let Some(siblings) = sibling_archs(req, &fs, &self.existing_register, &known) else { return };
        // Each arch of one step once: nvcc's later calls predict the same archs.
        let todo: Vec<(String, Request)> = {
            let mut families = self.families.lock().unwrap_or_else(|p| p.into_inner());
            let at = match families.iter().position(|(f, _)| *f == siblings.family) {
                Some(i) => i,
                None => {
                    if families.len() >= FAMILIES {
                        families.pop_front();
                    }
                    families.push_back((siblings.family, BTreeSet::new()));
                    families.len() - 1
                }
            };
            let seen = &mut families[at].1;
            seen.insert(siblings.arch.clone());
            siblings.links.into_iter().filter(|(arch, _)| seen.insert(arch.clone())).collect()
        };
        for (arch, r) in todo {
            self.spawn_speculative(r, Reason::OtherArch(arch), Cancel::with_priority(Priority::Background), None);
        }
    }

    /// Run one speculative link (see the module documentation): `false` when
    /// the bound on speculative work refused it.
    pub fn spawn_speculative(
        self: &Arc<Self>,
        mut req: Request,
        reason: Reason,
        cancel: Cancel,
        on_done: Option<OnDone>,
    ) -> bool {
        // The background class: callers pass a `Cancel::with_priority(Background)`,
        // which the scheduler admits into idle slots at idle CPU priority.
        debug_assert_eq!(cancel.priority(), Priority::Background);
        req.speculative = true;
        req.shared_fs = true;
        if self.running.fetch_add(1, Ordering::SeqCst) >= self.max_running {
            self.running.fetch_sub(1, Ordering::SeqCst);
            bump(&self.linker.stats.speculative_dropped);
            debug!(%reason, "speculative work at its bound: prediction dropped");
            return false;
        }
        bump(&self.linker.stats.speculative_links);
        let this = self.clone();
        let spawned = std::thread::Builder::new().name("nvlinkd-speculative".into()).spawn(move || {
            let _running = Running(&this.running);
            let (link_id, span) = this.linker.link_span_with_id(&req);
            let _entered = span.enter();
            let origin = if matches!(reason, Reason::OtherArch(_)) { "speculative" } else { "watch" };
            this.events.started(crate::observe::events::Started {
                link: link_id,
                cwd: &req.cwd,
                args: &req.args,
                priority: Priority::Background.name(),
                origin,
                cancel: Some(cancel.clone()),
            });
            let t = Instant::now();
            let fs = SpeculativeFs::new(this.max_link_input);
            let linked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                this.linker.link_cancellable(link_id, &req, &fs, &cancel)
            }));
            let outcome = match linked {
                Ok(o) => o,
                Err(_) => {
                    warn!(%reason, "speculative link panicked");
                    this.linker.note_failure();
                    this.events.finished(
                        link_id,
                        crate::observe::events::Finished {
                            exit_code: 0,
                            ms: t.elapsed().as_secs_f64() * 1e3,
                            engine: "none",
                            fallback: Some("internal error in nvlinkd"),
                            stdout: b"",
                            stderr: b"",
                            written: Some(Vec::new()),
                        },
                    );
                    return;
                }
            };
            let outcome = match fs.declined() {
                Some(why) => Outcome::fallback(nvlinkd_core::declined::Declined::new(
                    nvlinkd_core::declined::Reason::InputDeclined,
                    why,
                )),
                None => outcome,
            };
            bump(&this.linker.stats.speculative_finished);
            match cancel.stopped() {
                Some(why) if outcome.fallback.is_some() => this.events.cancelled(link_id, why, cancel.superseded_by()),
                // Nothing speculative is written to the caller's files; an
                // `nvlinkd watch` writes what its command line names.
                _ => this.events.finished(
                    link_id,
                    crate::observe::events::Finished {
                        exit_code: outcome.exit_code,
                        ms: t.elapsed().as_secs_f64() * 1e3,
                        engine: crate::observe::events::engine_name(outcome.engine),
                        fallback: outcome.fallback.as_ref().map(|d| d.detail.as_str()),
                        stdout: &outcome.stdout,
                        stderr: &outcome.stderr,
                        written: if matches!(reason, Reason::Watch) { None } else { Some(Vec::new()) },
                    },
                ),
            }
            info!(
                %reason,
                exit = outcome.exit_code,
                engine = ?outcome.engine,
                cancelled = cancel.is_cancelled(),
                ms = t.elapsed().as_secs_f64() * 1e3,
                "speculative link done"
            );
            if let Some(done) = on_done {
                done(link_id, &outcome, t.elapsed());
            }
        });
        if let Err(e) = spawned {
            warn!("cannot start a speculative link: {e}");
            self.running.fetch_sub(1, Ordering::SeqCst);
            return false;
        }
        true
    }
}

/// One running speculative link, until its thread ends.
struct Running<'a>(&'a AtomicUsize);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The caller's files as a speculative link reads them: locally (the daemon
/// shares the caller's filesystem), only regular files, within the per-link
/// budget; like a shared-filesystem `LinkFs` without a stream.
pub struct SpeculativeFs {
    budget: u64,
    used: AtomicU64,
    declined: Mutex<Option<String>>,
}

impl SpeculativeFs {
    pub fn new(budget: u64) -> Self {
        SpeculativeFs { budget, used: AtomicU64::new(0), declined: Mutex::new(None) }
    }

    fn decline(&self, why: String) {
        self.declined.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(why);
    }
}

impl InputFs for SpeculativeFs {
    fn read(&self, path: &Path) -> io::Result<Arc<[u8]>> {
        let remaining = self.budget.saturating_sub(self.used.load(Ordering::Relaxed));
        let data = corefs::read_regular(path, remaining).inspect_err(|e| {
            if corefs::is_not_regular(e) {
                self.decline(format!("{} is not a regular file", path.display()));
            } else if e.kind() == io::ErrorKind::FileTooLarge {
                self.decline(format!("{} is larger than the daemon reads for one link", path.display()));
            }
        })?;
        let total = self.used.fetch_add(data.len() as u64, Ordering::Relaxed) + data.len() as u64;
        if total > self.budget {
            self.decline(format!("the link's inputs exceed the daemon's budget of {} bytes", self.budget));
            return Err(io::Error::new(io::ErrorKind::FileTooLarge, "past the link's input budget"));
        }
        Ok(data.into())
    }
    fn stat(&self, path: &Path) -> io::Result<FileStat> {
        corefs::LocalFs.stat(path)
    }
    fn identity(&self, path: &Path) -> Option<FileIdentity> {
        corefs::LocalFs.identity(path)
    }
    fn declined(&self) -> Option<String> {
        self.declined.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}
