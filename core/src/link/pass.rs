//! One link, pass by pass: [`Link`], the per-link value, whose methods read
//! top to bottom in the order a link runs them.
//!
//! 1. **parse and mode** ([`Link::parse`], [`Link::run`]): argv → `Spec` →
//!    `Mode` (`cli/`); help, version and option errors are answered here,
//!    host linker scripts go to [`Link::host_linker_script`];
//! 2. **claim outputs** ([`Link::claim_output`]): a newer link of the same
//!    output supersedes an older one;
//! 3. **keys and lookup** ([`Link::device_link`], [`Link::keys`],
//!    [`Link::lookup`]): the whole-link keys (`linkcache::keys`, over the
//!    link's one file view) and the store; a miss takes a plan permit and
//!    computes inside a single flight;
//! 4. **plan** ([`Link::compute`], [`Link::plan`]): the inputs decoded and
//!    the plan built (`plan.rs`), or nvlink's fatal messages;
//! 5. **admit** ([`Link::admit`]): a compute slot (`sched.rs`);
//! 6. **engine** (`engine.rs`): the in-process engine, or the real nvlink
//!    ([`Link::route`]) for what it declines;
//! 7. **answer** (`answer.rs`): the engine's result as nvlink's answer;
//! 8. **store** ([`Link::store`]): verification queued, the entry written.
//!
//! A [`Link`] holds what every pass reads (the linker's shared state, the
//! toolkit, the request, the link's file view, its `Spec`, its control
//! handle), so passes take only what an earlier pass made (the mode, the
//! keys, the plan). Every pass that takes time is timed through the link's
//! observation handle ([`LinkObs::phase`] for the phases events report,
//! [`LinkObs::step`] for the others; `observe.rs`).

use std::path::PathBuf;
use std::sync::Arc;

use tracing::{debug, warn};

use super::answer::{device_only_registered, report_arch, time_file_is_new, uidx_fatal, unproven};
use super::{LinkCache, Linker};
use crate::cache::LinkEntry;
use crate::cli::parse::{parse, Stop};
use crate::cli::spec::{Mode, Spec};
use crate::declined::{Declined, Reason};
use crate::diag::Diagnostic;
use crate::engine::sandbox::Mirror;
use crate::fs::{absolute, InputFs};
use crate::input::libsearch;
use crate::input::load::{LoadContext, LoadError};
use crate::linkcache::{self, MemoFs};
use crate::observe::{LinkObs, Phase, Step};
use crate::plan;
use crate::request::{EngineKind, Outcome, Request};
use crate::sched::{Priority, Slot};
use crate::stats::bump;
use crate::toolkit::Toolkit;
use crate::worker::Cancel;

/// One link's handles, passed down its steps: its control handle (priority,
/// cancellation) and its observation handle (`observe.rs`).
#[derive(Clone, Copy)]
pub(super) struct Ctl<'a> {
    pub(super) cancel: &'a Cancel,
    pub(super) obs: &'a LinkObs,
}

/// One link: what its passes share. Made by [`Link::parse`] once the
/// toolkit is chosen and the command line read; lives for the link.
pub(super) struct Link<'a> {
    /// The linker's shared state (toolkits, cache, scheduler, pools, memos,
    /// workers, counters).
    pub(super) linker: &'a Linker,
    /// The toolkit the request names (by release).
    pub(super) tk: Arc<Toolkit>,
    pub(super) req: &'a Request,
    /// The link's one view of its files: options files, the key, the plan
    /// and the engines all see the same reads and stats.
    pub(super) fs: &'a MemoFs<'a>,
    /// The command line, typed; `spec.files` names every file the link reads.
    pub(super) spec: Spec,
    pub(super) ctl: Ctl<'a>,
}

impl<'a> Link<'a> {
    /// Pass 1, parse: the command line read into a `Spec` (with nvlink's
    /// fatal for a bad one), and `-l` searches checked against the bounds.
    pub(super) fn parse(
        linker: &'a Linker,
        tk: Arc<Toolkit>,
        req: &'a Request,
        fs: &'a MemoFs<'a>,
        ctl: Ctl<'a>,
    ) -> Result<Link<'a>, Box<Outcome>> {
        let spec = match parse(&req.args, fs, &req.cwd) {
            Ok(parsed) => match Spec::from_parsed(parsed, &req.cwd, req.env.get("LIBRARY_PATH").map(String::as_str)) {
                Ok(s) => s,
                Err(d) => return Err(Box::new(linker.fatal(d))),
            },
            Err(Stop::Fatal(d)) => return Err(Box::new(linker.fatal(d))),
            Err(Stop::TooLarge(why)) => {
                return Err(Box::new(linker.fall_back(Declined::new(Reason::InputDeclined, why))))
            }
        };
        if let Some(why) = libsearch::past_bounds(&spec.library_paths, req.env.get("LIBRARY_PATH"), &spec.libraries) {
            return Err(Box::new(linker.fall_back(Declined::new(Reason::InputDeclined, why))));
        }
        Ok(Link { linker, tk, req, fs, spec, ctl })
    }

    /// Pass 1, mode, and the dispatch on it: help and version answered, host
    /// linker scripts made, device links (modes A–E) through the cache.
    pub(super) fn run(&self) -> Outcome {
        let spec = &self.spec;
        let warnings = spec.warnings_text();
        if let Some(why) = &spec.unmeasured {
            return self.route(Declined::new(Reason::Options, why.clone()));
        }
        // (`-tool-name` is in `unmeasured`.) `-force-whole-lto` without
        // `-dlto`, or with a relocatable link, is one of several conflicts
        // nvlink reports in an order of its own.
        if spec.force_whole_lto && (!spec.lto || spec.relocatable) {
            return self.route(Declined::new(Reason::Options, "-force-whole-lto without whole-program -dlto"));
        }
        if spec.report_arch && spec.arch.is_none() && !matches!(spec.mode(), Ok(Mode::Help | Mode::Version)) {
            // nvlink 13.5 crashes (SIGSEGV) on `-report-arch` without `--arch`.
            return self.route(Declined::new(Reason::NvlinkCrash, "-report-arch without --arch"));
        }
        let mode = match spec.mode() {
            Ok(m) => m,
            // Another release's option checks are its own (13.0 knows no
            // `--nvvm-latest`): its nvlink answers.
            Err(_) if !self.tk.release.in_process_proven() => return self.route(unproven(&self.tk)),
            Err(d) => return self.linker.fatal(report_arch(spec, d)).after(warnings),
        };
        debug!(?mode, "dispatch");
        let _claim = match mode {
            Mode::Help | Mode::Version => None,
            _ => self.claim_output(),
        };
        let mut outcome = match mode {
            Mode::Help => self.linker.frontend(0, self.tk.help_text().into_bytes(), Vec::new()),
            Mode::Version => self.linker.frontend(0, self.tk.release.banner.clone().into_bytes(), Vec::new()),
            Mode::HostLinkerScript(_) => self.host_linker_script(),
            _ => self.device_link(mode),
        };
        if mode == Mode::LtoWhole && whole_program(spec, &outcome) {
            outcome.fwrite_output = spec.files.written.output.as_ref().map(|o| o.path.clone());
        }
        // The real nvlink engine prints the parse warnings itself.
        if outcome.engine == EngineKind::NvlinkProcess {
            outcome
        } else {
            outcome.after(warnings)
        }
    }

    /// Modes H and I: the host linker script. nvlink makes it from the
    /// caller's host tools (`gcc`, `ld`, the host compiler, found on the
    /// caller's PATH, with its environment), which no daemon has: the shim's
    /// real nvlink makes it (the shim runs it without asking when it sees
    /// `-ghls`; this answers a request it did not see, from an options file
    /// it could not read).
    fn host_linker_script(&self) -> Outcome {
        self.linker.fall_back(Declined::new(Reason::NotHere, "host linker scripts come from the caller's host tools"))
    }

    /// Pass 2: register this link as the one computing `(cwd, output)`,
    /// superseding (cancelling) an older link of the same output still
    /// running: an IDE or a build on save starts a new link and abandons the
    /// old one, whose output would be overwritten anyway. A background link
    /// never supersedes a foreground one (it then does not register); a
    /// remote link neither supersedes nor is superseded. The registration ends
    /// when the guard drops.
    fn claim_output(&self) -> Option<OutputClaim<'a>> {
        let (req, cancel) = (self.req, self.ctl.cancel);
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
        let out = self.spec.files.written.output.as_ref()?;
        let key = (req.cwd.clone(), out.path.clone());
        let mut map = self.linker.outputs.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(older) = map.get(&key).filter(|older| !older.same(cancel)) {
            if older.priority() == Priority::Foreground && cancel.priority() == Priority::Background {
                return None;
            }
            debug!(output = %key.1.display(), "superseding an older link of the same output");
            older.supersede(self.ctl.obs.link());
        }
        map.insert(key.clone(), cancel.clone());
        Some(OutputClaim { linker: self.linker, key, cancel: cancel.clone() })
    }

    /// Pass 3, modes A to E through the whole-link cache: a hit returns the
    /// stored result; identical links in flight are computed once.
    fn device_link(&self, mode: Mode) -> Outcome {
        let (linker, req) = (self.linker, self.req);
        self.ask_caller_first();
        let Some(cache) = &linker.cache else {
            let _planning = match self.admit_plan() {
                Ok(p) => p,
                Err(cancelled) => return *cancelled,
            };
            return self.compute(mode);
        };
        let Some(keys) = self.keys(mode) else {
            let _planning = match self.admit_plan() {
                Ok(p) => p,
                Err(cancelled) => return *cancelled,
            };
            return self.compute(mode);
        };
        if let Some(o) = self.lookup(cache, &keys) {
            if !req.speculative {
                bump(&linker.stats.cache_hits);
                linker.note_speculated_use(&keys.content);
            }
            self.verify_hit(cache, &keys, &o);
            return o;
        }
        // Only a link that must compute waits, first for a plan permit, then
        // (in `compute`) for a compute slot; one that waited here looks
        // again (an identical link may have filled the cache meanwhile).
        let planning = match self.admit_plan() {
            Ok(p) => p,
            Err(cancelled) => return *cancelled,
        };
        if planning.queued {
            if let Some(o) = self.lookup(cache, &keys) {
                if !req.speculative {
                    bump(&linker.stats.cache_hits);
                    linker.note_speculated_use(&keys.content);
                }
                self.verify_hit(cache, &keys, &o);
                return o;
            }
        }
        if req.speculative {
            linker.note_speculated(keys.content);
        } else {
            bump(&linker.stats.cache_misses);
        }
        linker.hooks.pause_after_key();
        // The slot (taken and given back in `compute`) and the plan permit
        // are held while the link computes, not while it stores its entry:
        // the next link starts meanwhile (identical links still wait for the
        // entry, on the flight).
        let planning = std::cell::RefCell::new(Some(planning));
        let mine = std::cell::RefCell::new(None);
        // A link that waits for an identical one gives back its plan permit
        // first: a speculative (background) leader waiting for a compute slot
        // is admitted only while no foreground link holds a permit.
        let give_back = || drop(planning.borrow_mut().take());
        // A link whose files come over its caller's stream (a remote shim)
        // leads or joins flights of such links of the same caller only: its
        // caller answers file requests at its own pace, up to the reply
        // timeout, and a local link or another tenant's must never wait on
        // that.
        let flight = if req.shared_fs {
            keys.content
        } else {
            let caller = req.caller.unwrap_or_default();
            crate::cache::KeyBuilder::new("flight-of-streamed-links").key(&keys.content).bytes(&caller).finish()
        };
        let entry = cache.flights.run_or_wait(flight, give_back, || {
            let outcome = if linker.verifier.mismatched(&keys.content) {
                self.route(verify_mismatch())
            } else {
                self.compute(mode)
            };
            drop(planning.borrow_mut().take());
            let (outcome, entry) = self.store(cache, &keys, outcome);
            *mine.borrow_mut() = Some(outcome);
            entry
        });
        if let Some(outcome) = mine.into_inner() {
            return outcome;
        }
        // Another request computed it: usable unless it depends on names.
        match entry.filter(|e| !e.name_sensitive).and_then(|e| self.outcome_of(&e)) {
            Some(o) => {
                if !req.speculative {
                    linker.note_speculated_use(&keys.content);
                }
                o
            }
            None => self.compute(mode),
        }
    }

    /// Pass 3, keys: the content and named keys (`linkcache::keys`), read
    /// through the link's view; None for a link that has none (`-time`,
    /// `--uidx-file`).
    fn keys(&self, mode: Mode) -> Option<linkcache::LinkKeys> {
        let linker = self.linker;
        self.ctl.obs.in_step(Step::Keys, || {
            let own_nvvm = self.tk.root.join("nvvm");
            let identity = linker.key_identity(&self.tk);
            linkcache::keys(&identity, self.req, &self.spec, mode, self.fs, &linker.hashes, Some(&own_nvvm))
        })
    }

    /// A caller that does not share this filesystem (a remote shim) answers
    /// file requests at its own pace: what the link may ask it (its inputs
    /// and `-l` candidates read, the search directories, `-time` and
    /// `--uidx-file` names, the libNVVM under `-nvvmpath`) is asked here,
    /// before any plan permit, and the link's view ([`MemoFs`]) keeps the
    /// answers, so a slow caller holds nothing another link waits for.
    fn ask_caller_first(&self) {
        let (fs, req, files) = (self.fs, self.req, &self.spec.files);
        if req.shared_fs {
            return;
        }
        fs.prefetch(&files.input_paths());
        for input in &files.inputs {
            let _ = fs.read(&input.path);
        }
        for dir in &files.search_dirs {
            let _ = fs.stat(&dir.path);
        }
        // What the sandbox mirrors besides the inputs (`Mirror::capture`): a
        // stat, then the bytes of a file.
        let written = &files.written;
        let candidates = files.libraries.iter().flat_map(|l| &l.candidates);
        for named in candidates.chain(&written.time).chain(&written.uidx) {
            if fs.stat(&named.path).is_ok_and(|st| !st.is_dir) {
                let _ = fs.read(&named.path);
            }
        }
        // Under -dlto an existing registration file is left alone (`regbin.rs`).
        if let Some(register) = written.register.as_ref().filter(|_| self.spec.lto) {
            let _ = fs.stat(&register.path);
        }
        // The libNVVM under -nvvmpath: the key's (LTO) and the sandbox's (any mode).
        if let Some(given) = self.spec.nvvmpath.as_deref().filter(|_| req.nvvm_stat) {
            let _ = crate::fs::has_libnvvm(fs, &absolute(&req.cwd, given));
        }
    }

    /// Pass 3, lookup: the stored answer under the keys (the named key's
    /// when the content entry says the result depends on names).
    fn lookup(&self, cache: &LinkCache, keys: &linkcache::LinkKeys) -> Option<Outcome> {
        let entry = LinkEntry::decode(&cache.store.fetch("link", &keys.content)?)?;
        let entry =
            if entry.name_sensitive { LinkEntry::decode(&cache.store.fetch("link", &keys.named)?)? } else { entry };
        self.outcome_of(&entry)
    }

    fn outcome_of(&self, e: &LinkEntry) -> Option<Outcome> {
        let outputs = linkcache::outputs_of(e, &self.spec)?;
        Some(Outcome::answer(EngineKind::Cache, e.exit_code, e.stdout.clone(), e.stderr.clone(), outputs))
    }

    /// Wait for a plan permit (`sched.rs`, two stages): a link that must
    /// compute decodes its inputs and plans while others compute, and waits
    /// for a compute slot only then ([`Link::admit`] in [`Link::compute`]).
    /// Err with the answer when it was cancelled while queued.
    fn admit_plan(&self) -> Result<Slot<'a>, Box<Outcome>> {
        let ctl = self.ctl;
        match self.linker.sched.admit_plan_for(ctl.cancel.priority(), self.req.remote, ctl.cancel, ctl.obs) {
            Some(permit) => Ok(permit),
            None => Err(Box::new(
                self.linker.fall_back(Declined::new(Reason::Worker, "the link was cancelled while queued")),
            )),
        }
    }

    /// An LTO link whose `-nvvmpath` is not this toolkit's `nvvm`: nvlink
    /// loads the libNVVM found there (another release's, or none: "elfLink
    /// linker library load error"), which the in-process engine, holding its
    /// toolkit's, would not; the real nvlink answers. Where the daemon sees
    /// the caller's files, the directory must be this toolkit's own; else
    /// (a remote caller, whose `-nvvmpath` names its toolkit of the same
    /// release) it must hold a libNVVM on the caller's side, which the
    /// routed link's sandbox then reproduces (`engine/sandbox.rs`).
    fn foreign_nvvm(&self, mode: Mode) -> Option<Declined> {
        if !mode.is_lto() {
            return None;
        }
        let given = self.spec.nvvmpath.as_deref()?;
        let caller = absolute(&self.req.cwd, given);
        let foreign = if self.req.shared_fs {
            let real = |p: &std::path::Path| std::fs::canonicalize(p).ok();
            let own = real(&self.tk.root.join("nvvm"));
            own.is_none() || real(&caller) != own
        } else {
            self.req.nvvm_stat && !crate::fs::has_libnvvm(self.fs, &caller)
        };
        foreign.then(|| Declined::new(Reason::LtoOptions, format!("-nvvmpath {given} is not this toolkit's nvvm")))
    }

    /// An LTO link whose `-nvvmpath` holds no libNVVM (`lib64/libnvvm.so`,
    /// `lib/libnvvm.so`) as the caller sees it: nvlink loads it before it
    /// reads any input, and fails (`elfLink linker library load error`, exit
    /// 1, no output), with or without LTO objects. Left to nvlink with
    /// `-time` or `--uidx-file` (files it writes or reads first).
    fn no_libnvvm(&self, mode: Mode) -> bool {
        let spec = &self.spec;
        let Some(given) = spec.nvvmpath.as_deref().filter(|_| mode.is_lto()) else { return false };
        if spec.time.is_some() || spec.files.written.uidx.is_some() {
            return false;
        }
        let asked = self.req.shared_fs || self.req.nvvm_stat;
        asked && !crate::fs::has_libnvvm(self.fs, &absolute(&self.req.cwd, given))
    }

    /// Passes 4 to 7, modes A to E: plan, a compute slot, then the in-process
    /// engine or the real nvlink, and the answer.
    fn compute(&self, mode: Mode) -> Outcome {
        let (tk, fs, spec) = (&self.tk, self.fs, &self.spec);
        // A release the in-process engine is not proven on: its own nvlink.
        if !tk.release.in_process_proven() {
            return self.route(unproven(tk));
        }
        if self.no_libnvvm(mode) {
            let d = Diagnostic::fatal("elfLink linker library load error");
            return self.linker.fatal(report_arch(spec, d));
        }
        if let Some(why) = self.foreign_nvvm(mode) {
            return self.route(why);
        }
        if let Some(u) = &spec.files.written.uidx {
            return match uidx_fatal(fs, spec, u) {
                Ok(d) => self.linker.fatal(report_arch(spec, d)),
                // A FIFO or a device: only nvlink itself may read it.
                Err(_) if fs.declined().is_some() => {
                    let declined = fs.declined().unwrap_or_default();
                    self.linker.fall_back(Declined::new(Reason::InputDeclined, declined))
                }
                Err(why) => self.route(why),
            };
        }
        // nvlink writes the header of a `-time` file it creates before it reads
        // any input.
        let time_file_is_new = match time_file_is_new(fs, spec) {
            Ok(new) => new,
            Err(why) => return self.route(why),
        };
        let mut plan = match self.plan() {
            Ok(plan) => plan,
            Err(answered) => return *answered,
        };
        // Planned: now a compute slot (`sched.rs`; the plan permit goes back).
        let _admitted = match self.admit() {
            Ok(a) => a,
            Err(cancelled) => return *cancelled,
        };
        self.in_process(mode, &mut plan, time_file_is_new)
    }

    /// Pass 4: the link plan, or the answer when there is none: nvlink's
    /// fatal messages, the real nvlink (a plan not reproduced in process,
    /// `-Werror` with input warnings) or a fallback (an input only nvlink
    /// may read).
    fn plan(&self) -> Result<plan::Plan, Box<Outcome>> {
        let (fs, spec) = (self.fs, &self.spec);
        let Some(target) = spec.target() else {
            let why = Declined::new(Reason::Arch, format!("--arch {:?}", spec.arch));
            return Err(Box::new(self.route(why)));
        };
        let ctx = LoadContext {
            fs,
            cwd: &self.req.cwd,
            target,
            lto: spec.lto,
            suppress_arch_warning: spec.suppress_arch_warning,
            memo: Some(&self.linker.decode_memo),
            cpu_machine: crate::input::load::cpu_machine(spec.cpu_arch.as_deref()),
            decompressed: Default::default(),
        };
        let planned = self.ctl.obs.in_phase(Phase::Plan, || {
            fs.prefetch(&spec.files.input_paths());
            plan::build(spec, &ctx)
        });
        let plan = match planned {
            Ok(mut p) => {
                p.decompressed = ctx.hold_decompressed();
                p
            }
            Err(LoadError::Fatal(_)) if spec.time.is_some() => {
                let why = Declined::new(Reason::Options, "-time with an input fatal (the rows nvlink writes first)");
                return Err(Box::new(self.route(why)));
            }
            // Under -g nvlink compiles a PTX input as it reads it, and its
            // ptxas warns (`.debug_info section not found` for PTX without
            // debug information) before a later input's fatal is printed.
            Err(LoadError::Fatal(_)) if spec.debug => {
                let why = Declined::new(Reason::Diagnostics, "-g with an input fatal (warnings of nvlink's JIT first)");
                return Err(Box::new(self.route(why)));
            }
            Err(LoadError::Fatal(ds)) => {
                return Err(Box::new(self.linker.fatals(ds.into_iter().map(|d| report_arch(spec, d)).collect())));
            }
            Err(LoadError::Declined(why)) => {
                // An input only nvlink itself may read (a FIFO, a device, a
                // thin archive's members): not even the real-nvlink engine
                // runs it here, and nothing is stored.
                if why.reason == Reason::InputDeclined {
                    return Err(Box::new(self.linker.fall_back(why)));
                }
                if let Some(declined) = fs.declined() {
                    debug!(reason = %why.reason, why = %why.detail, "plan not reproduced in process");
                    return Err(Box::new(self.linker.fall_back(Declined::new(Reason::InputDeclined, declined))));
                }
                return Err(Box::new(self.route(why)));
            }
        };
        if spec.warning_as_error && plan.warnings.iter().any(|w| w.severity == crate::diag::Severity::Error) {
            let why = Declined::new(Reason::Input, "-Werror with an input error (a member that does not decompress)");
            return Err(Box::new(self.route(why)));
        }
        if spec.warning_as_error && !plan.warnings.is_empty() && spec.time.is_some() {
            let why = Declined::new(Reason::Options, "-time with -Werror and input warnings");
            return Err(Box::new(self.route(why)));
        }
        if spec.warning_as_error && !plan.warnings.is_empty() {
            // nvlink stops at the first warning, printed as an error, with its
            // link step's fatal (`-w` or not), where no PTX was compiled by
            // then and a host object or archive follows the warned input (or
            // a `-l` search warned). Otherwise it answers in other ways (the
            // error alone, exit 255, after the last input; `elfLink fatbinary
            // error` before a .ptx or .fatbin file; after compiled PTX the
            // warning stays a warning and the link goes on): left to nvlink.
            let host_file_follows = |i: usize| {
                spec.inputs.get(i + 1).is_some_and(|next| {
                    !matches!(
                        crate::input::load::extension(next),
                        Some("ptx" | "fatbin" | "cubin" | "nvvm" | "ltoir" | "bc")
                    )
                })
            };
            let stops = match plan.first_warning {
                Some(w) if !w.after_ptx => w.input.is_none_or(host_file_follows),
                _ => false,
            };
            if stops && plan.notes.is_empty() {
                let first = Diagnostic::error(plan.warnings[0].message.clone());
                let ds = vec![first, Diagnostic::fatal("elfLink internal error")];
                return Err(Box::new(self.linker.fatals(ds.into_iter().map(|d| report_arch(spec, d)).collect())));
            }
            let why = Declined::new(Reason::Diagnostics, "-Werror with input warnings (nvlink's answer varies)");
            return Err(Box::new(self.route(why)));
        }
        Ok(plan)
    }

    /// Pass 5: wait for a scheduler slot before computing (`sched.rs`): None
    /// when the link already holds one; Err with the answer when it was
    /// cancelled while queued.
    pub(super) fn admit(&self) -> Result<Option<Admission<'a>>, Box<Outcome>> {
        let (linker, ctl) = (self.linker, self.ctl);
        if !ctl.cancel.take_admission() {
            return Ok(None);
        }
        let Some(slot) = linker.sched.admit_for(ctl.cancel.priority(), self.req.remote, ctl.cancel, ctl.obs) else {
            ctl.cancel.end_admission();
            return Err(Box::new(
                linker.fall_back(Declined::new(Reason::Worker, "the link was cancelled while queued")),
            ));
        };
        let admitted = Admission { _slot: slot, cancel: ctl.cancel.clone() };
        if !linker.hooks.hold_slot(ctl.cancel) {
            return Err(Box::new(linker.fall_back(Declined::new(Reason::Worker, "the link was cancelled"))));
        }
        Ok(Some(admitted))
    }

    /// Pass 6, the in-process engine declined: the real nvlink serves the
    /// link. With [`Linker::fall_back`], the only place a `Declined` becomes
    /// an outcome.
    pub(super) fn route(&self, why: Declined) -> Outcome {
        debug!(reason = %why.reason, why = %why.detail, "routed to nvlink");
        self.linker.routed.bump(why.reason);
        self.run_nvlink().routed(why)
    }

    /// Pass 8, store: verification (`verify.rs`) queued, or run now under
    /// `--verify=sync` (whose mismatch makes nvlink's answer the link's),
    /// and the entry written (memory, disk, offered to the REAPI tier) when
    /// the outcome may be stored ([`Link::entry_of`]). Returns the answer and
    /// the entry, for the links waiting on the flight.
    fn store(
        &self,
        cache: &LinkCache,
        keys: &linkcache::LinkKeys,
        mut outcome: Outcome,
    ) -> (Outcome, Option<Arc<LinkEntry>>) {
        let linker = self.linker;
        let mut job = self.verification(keys, &outcome, &cache.store);
        if linker.verifier.mode == crate::verify::VerifyMode::Sync {
            if let Some(theirs) = job.take().and_then(|j| linker.verifier.now(j, self.ctl.cancel)) {
                // nvlink's answer, not ours (and the key is routed from now on).
                let why = verify_mismatch();
                linker.routed.bump(why.reason);
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
        linker.hooks.hold_store();
        let entry = self.entry_of(&outcome).map(Arc::new);
        match (job, &entry) {
            (Some(mut job), Some(e)) => {
                job.heal.name_sensitive = e.name_sensitive;
                linker.verifier.later(job);
            }
            // Not stored (an input changed meanwhile): verified another time.
            (Some(job), None) => linker.verifier.not_verified(&job.heal.content),
            (None, _) => {}
        }
        if self.req.speculative && entry.is_none() {
            // Nothing stored: a later real link that computes and stores
            // this key itself is no speculative hit.
            let mut s = linker.speculated.lock().unwrap_or_else(|p| p.into_inner());
            s.retain(|k| *k != keys.content);
        }
        if let Some(e) = &entry {
            let _store = self.ctl.obs.step(Step::Store);
            let bytes = e.encode();
            // The named entry is read only when the content entry says the
            // result depends on names.
            if e.name_sensitive && keys.named != keys.content {
                cache.store.store("link", &keys.named, bytes.clone());
            }
            cache.store.store("link", &keys.content, bytes);
        }
        (outcome, entry)
    }

    /// A hit of an entry this daemon has not verified (made by a remote link,
    /// which is not verified, by a daemon before a restart, or by another
    /// daemon of the shared tier): verified in the background with this local
    /// link's files, once per key, as a computed link is (an adversarial run
    /// had a remote caller's unverified answer served to local links).
    fn verify_hit(&self, cache: &LinkCache, keys: &linkcache::LinkKeys, hit: &Outcome) {
        if !self.req.shared_fs || self.linker.verifier.mode == crate::verify::VerifyMode::Off {
            return;
        }
        let as_computed = Outcome { engine: EngineKind::InProcess, ..hit.clone() };
        if let Some(job) = self.verification(keys, &as_computed, &cache.store) {
            self.linker.verifier.later(job);
        }
    }

    /// The verification of a link just computed (`verify.rs`), when it is to
    /// be verified: its inputs captured now, while the link's view holds (the
    /// view's own bytes, shared; written to disk by the verification itself).
    fn verification(
        &self,
        keys: &linkcache::LinkKeys,
        outcome: &Outcome,
        store: &Arc<crate::cache::Store>,
    ) -> Option<crate::verify::Job> {
        let (linker, tk, req, fs, spec) = (self.linker, &self.tk, self.req, self.fs, &self.spec);
        let off = linker.verifier.mode == crate::verify::VerifyMode::Off;
        if off || outcome.engine != EngineKind::InProcess || outcome.fallback.is_some() {
            return None;
        }
        let why_not = crate::verify::unverifiable(spec, req, fs).or_else(|| {
            device_only_registered(spec, fs).then_some("a device-only input registered (its module id is its path)")
        });
        if !linker.verifier.wants(&keys.content, why_not) {
            return None;
        }
        let mirror = match Mirror::capture(&linker.scratch_dir(), req, spec, fs, &tk.root.join("nvvm")) {
            Ok(s) => s,
            Err(e) => {
                debug!("not verified: the link's files cannot be mirrored: {e:?}");
                linker.verifier.not_verified(&keys.content);
                return None;
            }
        };
        Some(crate::verify::Job {
            nvlink: tk.nvlink(),
            toolkit_root: tk.root.clone(),
            confine: linker.config.confine.clone(),
            mirror: Some(mirror),
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
            limit: linker.worker_limit(),
            scratch_parents: linker.scratch_parents(),
            obs: self.ctl.obs.clone(),
        })
    }

    /// The stored form of an outcome, when it can be stored: only a result
    /// nvlink itself gives for these inputs, computed from one view of them.
    /// Not stored: fallbacks (environment faults of the engines end there, see
    /// `engine::process`), links during which an input changed (the key would
    /// name other contents than the link used), and a success without its
    /// output file or with an empty one (nvlink never succeeds so).
    fn entry_of(&self, o: &Outcome) -> Option<LinkEntry> {
        let (req, spec, fs) = (self.req, &self.spec, self.fs);
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
            bump(&self.linker.stats.uncached_changed_inputs);
            warn!("an input changed during the link: result not cached");
            return None;
        }
        let files = linkcache::entry_files(&o.outputs, spec)?;
        if o.exit_code == 0 && spec.output.is_some() && !files.iter().any(|(role, d)| role == "output" && !d.is_empty())
        {
            warn!("a successful link without its output: result not cached");
            return None;
        }
        let device_only_registered = device_only_registered(spec, fs);
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
}

/// What a key verification found wrong is: routed to the real nvlink.
fn verify_mismatch() -> Declined {
    Declined::new(Reason::VerifyMismatch, "verification found the in-process answer wrong")
}

/// A link's scheduler slot (see [`Link::admit`]).
pub(super) struct Admission<'a> {
    _slot: Slot<'a>,
    cancel: Cancel,
}

impl Drop for Admission<'_> {
    fn drop(&mut self) {
        self.cancel.end_admission();
    }
}

/// A link's registration as the one computing an output (see [`Link::claim_output`]).
pub(super) struct OutputClaim<'a> {
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

/// Whether a successful `-dlto` link was whole-program LTO, nvlink writing
/// the cubin nvJitLink made with `fwrite`: nvlink says when it does partial
/// LTO instead (an input without LTO IR, every engine and cache entry keeps
/// the line) or ignores `-dlto` (no LTO IR at all). Under `--disable-infos`
/// nothing tells, and the link counts as not whole-program.
fn whole_program(spec: &Spec, o: &Outcome) -> bool {
    let says = |what: &[u8]| o.stderr.windows(what.len()).any(|w| w == what);
    o.exit_code == 0
        && o.fallback.is_none()
        && !spec.disable_infos
        && !says(b"so doing partial LTO")
        && !says(b"Ignoring -dlto option")
}
