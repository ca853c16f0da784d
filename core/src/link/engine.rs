//! Pass 6 of a link, the engines, and pass 7's choice of answer: the
//! in-process engine (`engine::inprocess`) on the `--jobs` pool, what each of
//! its results becomes (nvlink's answer, the real nvlink, a fallback), and
//! the real nvlink as the engine (`engine::process`, on the caller's files or
//! a sandboxed copy of them).

use std::path::Path;

use tracing::{debug, warn, Span};

use super::answer::{in_process_outcome, link_errors_outcome, with_time_table};
use super::pass::Link;
use crate::cli::spec::Mode;
use crate::declined::{Declined, Reason};
use crate::engine::artifacts::Artifacts;
use crate::engine::inprocess::{self, Linked, NotLinked};
use crate::engine::process;
use crate::engine::sandbox::{Sandbox, SandboxError};
use crate::observe::Phase;
use crate::plan;
use crate::request::{EngineKind, Outcome};
use crate::sched::Priority;
use crate::stats::bump;

impl Link<'_> {
    /// Passes 6 and 7 of a planned, admitted link: the in-process engine on
    /// the `--jobs` pool, and its result as the link's answer (the real
    /// nvlink for what it declines, a fallback for a fault).
    pub(super) fn in_process(&self, mode: Mode, plan: &mut plan::Plan, time_file_is_new: bool) -> Outcome {
        let (linker, spec) = (self.linker, &self.spec);
        let (outcome, timings) = match self.link_in_process(mode, plan) {
            Ok(Linked { mut output, timings }) => {
                bump(&linker.stats.in_process);
                debug!("linked in process");
                linker.hooks.corrupt(&mut output);
                (in_process_outcome(self.fs, spec, mode, plan, output), timings)
            }
            Err(NotLinked::Fault(why)) => {
                // Not an nvlink answer: the shim runs nvlink; nothing is cached.
                warn!(why = %why.detail, "link failed in its worker");
                return linker.fall_back(why);
            }
            Err(NotLinked::Declined(why)) => return self.route(why),
            Err(NotLinked::Errors(e, _))
                if spec.register_link_binaries.is_some() && e.written.is_none() && !e.registers =>
            {
                // Whether nvlink writes its registration file before failing
                // is not reproduced (but for its stack-size errors).
                let why = Declined::new(Reason::Diagnostics, "link errors with --register-link-binaries");
                return self.route(why);
            }
            Err(NotLinked::Errors(errors, timings)) => {
                bump(&linker.stats.in_process);
                debug!("link errors answered in process");
                (link_errors_outcome(self.fs, spec, mode, plan, errors), timings)
            }
        };
        with_time_table(outcome, spec, time_file_is_new, &timings)
    }

    /// The in-process engine (`engine::inprocess`) on the `--jobs` pool (at
    /// idle CPU priority for a background link, a pool of its own for a
    /// remote caller's), inside the link's span.
    fn link_in_process(&self, mode: Mode, plan: &mut plan::Plan) -> Result<Linked, NotLinked> {
        let (linker, tk, ctl) = (self.linker, &*self.tk, self.ctl);
        let artifacts = Artifacts {
            store: linker.cache.as_ref().map(|c| &*c.store),
            flights: linker.cache.as_ref().map(|c| &c.artifact_flights).unwrap_or(&linker.no_cache_flights),
            toolkit: if linker.cache.is_some() { linker.key_identity(tk) } else { [0; 32] },
            stats: &linker.stats,
        };
        let scratch = linker.scratch_dir();
        let cx = inprocess::Context {
            tk,
            artifacts: &artifacts,
            scratch: &scratch,
            workers: linker.workers.as_deref(),
            cancel: ctl.cancel,
            obs: ctl.obs,
            limit: linker.worker_limit(),
            confine: &linker.config.confine,
            notes: Default::default(),
        };
        // The pool's threads work inside this link's span.
        let span = Span::current();
        let pool = match ctl.cancel.priority() {
            Priority::Foreground if self.req.remote => &linker.remote_pool,
            Priority::Foreground => &linker.pool,
            Priority::Background => &linker.bg_pool,
        };
        pool.install(|| span.in_scope(|| inprocess::link(cx, &self.spec, mode, plan)))
    }

    /// The real nvlink as the engine, once the link holds a slot: its answer,
    /// or the fallback the shim gets where it gave none (nothing cached).
    pub(super) fn run_nvlink(&self) -> Outcome {
        // Routed after its plan was admitted to compute, the link holds its
        // slot already; routed from its plan, it waits for one here.
        let _admitted = match self.admit() {
            Ok(a) => a,
            Err(cancelled) => return *cancelled,
        };
        let _phase = self.ctl.obs.phase(Phase::Nvlink);
        match self.nvlink_engine() {
            Ok(r) => {
                bump(&self.linker.stats.nvlink_process);
                Outcome::answer(EngineKind::NvlinkProcess, r.exit_code, r.stdout, r.stderr, r.outputs)
            }
            Err(why) => self.linker.fall_back(why),
        }
    }

    /// The real nvlink on the caller's files where the daemon shares its
    /// filesystem, otherwise on the link's files mirrored into a sandbox
    /// (`engine/sandbox.rs`): nvlink's answer in the caller's terms, or why
    /// there is none (a fault of the daemon's environment, nvlink killed, a
    /// link the sandbox cannot mirror).
    fn nvlink_engine(&self) -> Result<NvlinkAnswer, Declined> {
        let (linker, tk, req, spec, ctl) = (self.linker, &self.tk, self.req, &self.spec, self.ctl);
        let sandbox = if req.shared_fs {
            None
        } else {
            let mirrored = Sandbox::prepare(&linker.scratch_dir(), req, spec, self.fs, &tk.root.join("nvvm"));
            Some(mirrored.map_err(|e| self.sandbox_failed(e))?)
        };
        let run_req = sandbox.as_ref().map_or(req, |s| &s.request);
        // nvlink on a client's mirrored files runs confined (`confine.rs`).
        let confined = sandbox.as_ref().map(|s| process::Confined {
            policy: &linker.config.confine,
            toolkit_root: &tk.root,
            sandbox: s.dir(),
        });
        let limit = linker.worker_limit();
        let run =
            process::run(&tk.nvlink(), run_req, spec, &linker.scratch_parents(), ctl.cancel, limit, confined.as_ref());
        let r = run.map_err(|e| {
            // Not an answer of nvlink for these inputs.
            warn!("no answer from the nvlink engine: {e}");
            let reason = match e {
                process::RunError::Environment(_) => {
                    bump(&linker.stats.environment_faults);
                    Reason::Environment
                }
                process::RunError::Signal(_) => Reason::Environment,
                process::RunError::Unsupported(_) => Reason::NotHere,
            };
            Declined::new(reason, format!("{}: {e}", Path::new(&tk.nvlink()).display()))
        })?;
        let (stdout, stderr, outputs) = match &sandbox {
            None => (r.stdout, r.stderr, r.outputs),
            Some(s) => s.unmirror(r.stdout, r.stderr, r.outputs, spec).map_err(|e| self.sandbox_failed(e))?,
        };
        Ok(NvlinkAnswer { exit_code: r.exit_code, stdout, stderr, outputs })
    }

    /// Why a link the sandbox cannot serve (see `engine/sandbox.rs`) falls back.
    fn sandbox_failed(&self, e: SandboxError) -> Declined {
        match e {
            SandboxError::Unsupported(why) => {
                debug!(%why, "not run in a sandbox");
                Declined::new(Reason::NotHere, format!("the daemon cannot mirror this link: {why}"))
            }
            SandboxError::Environment(why) => {
                warn!(%why, "sandbox failed");
                bump(&self.linker.stats.environment_faults);
                Declined::new(Reason::Environment, why)
            }
        }
    }
}

/// What the real nvlink answered, in the caller's terms.
struct NvlinkAnswer {
    exit_code: i32,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    outputs: Vec<crate::request::OutputFile>,
}
