//! The in-process engine: libnvJitLink links the plan, the finalizer turns its
//! cubin into nvlink's bytes.
//!
//! Before linking, PTX modules are compiled to relocatable cubins the way
//! nvlink's embedded ptxas does (`ptxas -c`), in parallel and cached; nvlink's
//! output for a PTX input is the same as for that cubin. Whole-program LTO is
//! split as nvlink's own pipeline is: NVVM (nvJitLink `-lto -ptx`) then ptxas,
//! each step cached, so a relink whose optimized PTX did not change skips
//! ptxas.
//!
//! [`check_options`] and the checks along the way decline, with a reason, every
//! plan this engine does not reproduce exactly; the linker sends those to the
//! real nvlink. nvlink's link errors are answered here when they are known to
//! be nvlink's words ([`LinkErrors`]: nvJitLink's undefined references, one
//! multiply defined symbol); any other nvJitLink failure goes to nvlink, which
//! prints its own diagnostics.
//!
//! Partial LTO of one LTO module is nvlink's pipeline too: NVVM `--device-c`,
//! ptxas `-c`, then an ordinary link with that cubin first.
//!
//! nvJitLink runs in a worker process ([`crate::worker`]) when the linker has
//! a worker executable. A worker that dies while linking makes [`link`]'s
//! result [`NotLinked::Fault`]: the link then has no result at all (the
//! linker answers "fall back" and caches nothing), since a crash is not an
//! nvlink answer the daemon could reproduce. [`link`] returns everything the
//! linker uses ([`Linked`], [`NotLinked`]); what steps running in parallel
//! note on the way ([`Notes`]) stays the engine's.

use std::collections::BTreeSet;
use std::path::Path;

use rayon::prelude::*;

use super::artifacts::{Artifacts, Level};
use super::ptxas;
use crate::cli::render;
use crate::cli::spec::{Mode, Spec};
use crate::declined::{declined, Declined, Reason};
use crate::diag::Diagnostic;
use crate::finalize::strtab::InputObject;
use crate::finalize::{self, Fixups};
use crate::input::cubin;
use crate::input::host::HostRefs;
use crate::input::load::Code;
use crate::input::ptx::PtxSymbols;
use crate::jitlink::{InputType, JitInput, JitOutput};
use crate::observe::{LinkObs, Phase};
use crate::plan::Plan;
use crate::toolkit::Toolkit;
use crate::worker::{Cancel, WorkerPool};

/// `Err`: a plan (or step) this engine does not reproduce, and why.
fn no<T>(reason: Reason, why: impl Into<String>) -> Result<T, Declined> {
    declined(reason, why)
}

/// What an in-process link needs besides the plan.
pub struct Context<'a> {
    pub tk: &'a Toolkit,
    pub artifacts: &'a Artifacts<'a>,
    pub scratch: &'a Path,
    /// Worker processes running nvJitLink (None: the library in this process).
    pub workers: Option<&'a WorkerPool>,
    /// Cancels this link (kills the worker serving it).
    pub cancel: &'a Cancel,
    /// The link's observation handle: each step is a [`Phase`] of it, on
    /// whichever thread of the pool it runs.
    pub obs: &'a LinkObs,
    /// Longest time one ptxas run may take (the daemon's worker time limit).
    pub limit: std::time::Duration,
    /// How ptxas runs confined (`confine.rs`).
    pub confine: &'a crate::confine::Policy,
    /// What the link's steps noted on the way, on whichever thread they ran;
    /// [`link`] turns it into its result. (Start with `Notes::default()`.)
    pub notes: Notes,
}

/// What an in-process link's steps note while they run (some in parallel),
/// read once by [`link`] when the link ends.
#[derive(Default)]
pub struct Notes {
    /// Set when the link failed because of its environment (a worker died or
    /// was killed): the link then has no result at all, whatever else a
    /// step returned.
    fault: std::sync::Mutex<Option<String>>,
    /// Set when the link failed with nvlink's own link errors (undefined or
    /// multiply defined symbols): the answer is those, exit status and all,
    /// as nvlink's.
    errors: std::sync::Mutex<Option<LinkErrors>>,
    /// The rows of nvlink's `-time` table for the steps this link ran.
    timings: std::sync::Mutex<Vec<TimeRow>>,
}

/// An in-process link's result: the output file, and the rows of nvlink's
/// `-time` table for the steps it ran.
pub struct Linked {
    pub output: Vec<u8>,
    pub timings: Vec<TimeRow>,
}

/// Why the in-process engine gave no output.
pub enum NotLinked {
    /// A fault of the daemon's side (a worker died, was killed or cancelled):
    /// no answer at all, the shim runs nvlink.
    Fault(Declined),
    /// Not reproduced in process: the real nvlink serves the link.
    Declined(Declined),
    /// nvlink's link errors, reproduced: the answer is those messages (and
    /// the `-time` rows of the steps that ran first).
    Errors(LinkErrors, Vec<TimeRow>),
}

/// One row of nvlink's `-time` table: a step nvlink's own tools run (its
/// embedded ptxas on a PTX input, NVVM and ptxas under `-dlto`), timed here
/// around the same step (a cached artifact takes the time of the lookup).
#[derive(Clone, Debug, PartialEq)]
pub struct TimeRow {
    /// nvlink writes the rows in the order it runs the steps: the PTX inputs
    /// as it reads them (in input order), then the LTO steps.
    pub order: usize,
    pub source: String,
    pub phase: &'static str,
    pub inputs: String,
    pub output: String,
    pub ms: f64,
}

/// The header nvlink writes when it creates the `-time` file (and always on stdout).
pub const TIME_HEADER: &str =
    "source file name , phase name , phase input files , phase output file , arch , tool, metric , unit\n";

/// nvlink's `-time` table rows, in its order, for the target as given with `--arch`.
pub fn time_rows(rows: &[TimeRow], arch: &str) -> String {
    let mut rows = rows.to_vec();
    rows.sort_by_key(|r| r.order);
    rows.iter()
        .map(|r| {
            format!("{} , {} , {} , {} , {arch} , nvlink , {:.4} , ms\n", r.source, r.phase, r.inputs, r.output, r.ms)
        })
        .collect()
}

/// The order of the LTO steps' rows: after every PTX input's.
const NVVM_ROW: usize = usize::MAX - 1;
const PTXAS_ROW: usize = usize::MAX;

impl Context<'_> {
    /// Run `step`, recording its time as a `-time` row when the link asks for them.
    fn timed<T>(&self, spec: &Spec, row: impl FnOnce() -> TimeRow, step: impl FnOnce() -> T) -> T {
        let started = std::time::Instant::now();
        let out = step();
        if spec.time.is_some() {
            let mut r = row();
            r.ms = started.elapsed().as_secs_f64() * 1000.0;
            self.notes.timings.lock().unwrap_or_else(|p| p.into_inner()).push(r);
        }
        out
    }
}

/// The `-time` rows of the LTO steps: NVVM (nvlink names it `cicc`), then ptxas.
fn lto_row(phase: &'static str) -> TimeRow {
    let (order, source, output) =
        if phase == "cicc" { (NVVM_ROW, "lto.nvvm", "lto.ptx") } else { (PTXAS_ROW, "lto.ptx", "lto.cubin") };
    TimeRow { order, source: source.into(), phase, inputs: String::new(), output: output.into(), ms: 0.0 }
}

/// nvlink's answer to a link that fails in its link stage: the messages, in
/// order, and the exit status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinkErrors {
    pub messages: Vec<Diagnostic>,
    pub exit_code: i32,
    /// The output file nvlink writes before it fails (`-dlto` without
    /// libcudadevrt); it then writes no `--register-link-binaries` file.
    pub written: Option<Vec<u8>>,
    /// nvlink writes its `--register-link-binaries` file before failing (its
    /// stack-size warnings under `-Werror`, measured); otherwise whether it
    /// does is not reproduced and such a link goes to nvlink.
    pub registers: bool,
}

/// nvlink's link-stage warning for an entry function whose call graph reaches
/// recursion (a cycle of calls: a function calling itself, or functions
/// calling each other, across units too). Its linker (nvJitLink's is the same
/// code) checks each entry, in the order of its call graph's nodes; the
/// counts measured fit one warning per callee of the entry from which a cycle
/// is reachable (a kernel calling three self-recursive functions: three
/// times; a kernel calling one function that reaches two cycles, or a
/// self-recursive function that also enters another cycle: once; two callees
/// reaching the same recursive function: twice). Entries removed by
/// host-reference pruning are not checked (`-g` keeps and checks them), `-r`
/// checks nothing. Measured on nvlink 13.5 (sm_80, sm_90); nvJitLink's info
/// log was nvlink's in every case tried, and the engine takes the warnings
/// from there rather than from a model of the rule.
fn is_stack_size_message(m: &str) -> bool {
    let name = m
        .strip_prefix("Stack size for entry function '")
        .and_then(|r| r.strip_suffix("' cannot be statically determined"));
    name.is_some_and(|n| !n.is_empty() && !n.contains('\''))
}

/// The message of a stack-size warning line of nvJitLink's logs
/// (`warning : Stack size for entry function 'K' cannot be statically determined`).
fn stack_size_warning(line: &str) -> Option<&str> {
    line.strip_prefix("warning : ").filter(|m| is_stack_size_message(m))
}

/// The stack-size warnings of nvJitLink's info log after a link, in its
/// order; any other message there is not reproduced (nvlink would print it).
fn info_log_warnings(log: &str) -> Result<Vec<Diagnostic>, Declined> {
    log.lines()
        .map(str::trim_end)
        .filter(|l| !l.is_empty())
        .map(|l| match stack_size_warning(l) {
            Some(m) => Ok(Diagnostic::warning(m)),
            None => no(Reason::Diagnostics, format!("nvJitLink's info log: {l}")),
        })
        .collect()
}

/// nvlink's stack-size warnings ([`stack_size_warning`]) as it prints them,
/// other messages unchanged. `--suppress-stack-size-warning` drops them and
/// `-w` does not hide them. `--disable-infos` drops them, and `-Werror` makes
/// them errors (the link then fails: exit status 255, no output file, the
/// registration file written), unless nvlink `compiled` code before its link
/// stage (its embedded ptxas on a PTX input, even one without recursion, or
/// partial LTO): then they stay warnings whatever `-Werror` and
/// `--disable-infos` say (measured; nvlink's compiler seems to reset those
/// two settings).
fn stack_size_messages(spec: &Spec, compiled: bool, messages: Vec<Diagnostic>) -> Vec<Diagnostic> {
    let is_stack = |d: &Diagnostic| d.severity == crate::diag::Severity::Warning && is_stack_size_message(&d.message);
    let drop = spec.suppress_stack_size_warning || (spec.disable_infos && !compiled);
    let as_error = spec.warning_as_error && !compiled;
    messages
        .into_iter()
        .filter(|d| !(drop && is_stack(d)))
        .map(|d| match as_error && is_stack(&d) {
            true => Diagnostic::error(d.message),
            false => d,
        })
        .collect()
}

/// nvJitLink's error log when it says exactly what nvlink says: undefined
/// references only (`error   : Undefined reference to 'f' in 'a.o'`, the
/// message nvlink prints after `nvlink`, from the same linker), after the
/// stack-size warnings of its info log, if any (nvlink prints them first),
/// then its status line.
fn undefined_references(log: &str) -> Option<Vec<Diagnostic>> {
    // nvJitLink closes its log with its own status line (`ERROR 9: complete`).
    let trailer = |l: &str| l.strip_prefix("ERROR ").and_then(|r| r.split_once(": ")).is_some();
    let lines: Vec<&str> = log.lines().map(str::trim_end).filter(|l| !l.is_empty() && !trailer(l)).collect();
    let warnings = lines.iter().take_while(|l| stack_size_warning(l).is_some()).count();
    let (warnings, errors) = lines.split_at(warnings);
    let errors: Option<Vec<Diagnostic>> = errors
        .iter()
        .map(|l| {
            let m = l.strip_prefix("error   : ")?;
            (m.starts_with("Undefined reference to '") && m.ends_with('\'')).then(|| Diagnostic::error(m))
        })
        .collect();
    let errors = errors.filter(|m| !m.is_empty())?;
    let warnings = warnings.iter().filter_map(|l| stack_size_warning(l)).map(Diagnostic::warning);
    Some(warnings.chain(errors).collect())
}

impl Context<'_> {
    /// One nvJitLink link, in a worker when there are workers.
    fn jit_link(&self, options: &[String], inputs: &[JitInput<'_>], want_ptx: bool) -> Result<JitOutput, Declined> {
        let Some(pool) = self.workers else {
            let jit = self.tk.jitlink().map_err(|e| Declined::new(Reason::Tool, e.to_string()))?;
            return jit.link(options, inputs, want_ptx).map_err(|e| self.link_failed(&e));
        };
        pool.link(&self.tk.jitlink_spec(), options, inputs, want_ptx, self.cancel).map_err(|e| {
            if e.is_fault() {
                let mut f = self.notes.fault.lock().unwrap_or_else(|p| p.into_inner());
                f.get_or_insert_with(|| e.to_string());
                return Declined::new(Reason::Worker, format!("nvJitLink: {e}"));
            }
            match &e {
                crate::worker::WorkerError::JitLink(j) => self.link_failed(j),
                _ => Declined::new(Reason::Tool, format!("nvJitLink: {e}")),
            }
        })
    }

    /// An nvJitLink failure: nvlink's undefined-reference errors are kept as
    /// the link's answer (exit status 255); anything else is nvlink's to say.
    fn link_failed(&self, e: &crate::jitlink::JitLinkError) -> Declined {
        if let crate::jitlink::JitLinkError::Call { call: "complete", log, .. } = e {
            if let Some(messages) = undefined_references(log) {
                let mut errors = self.notes.errors.lock().unwrap_or_else(|p| p.into_inner());
                *errors = Some(LinkErrors {
                    messages,
                    exit_code: crate::diag::EXIT_LINK_ERROR,
                    written: None,
                    registers: false,
                });
                return Declined::new(Reason::Diagnostics, "undefined references");
            }
        }
        Declined::new(Reason::Tool, format!("nvJitLink: {e}"))
    }
}

/// Options whose effect the in-process engine does not reproduce (yet).
pub(crate) fn check_options(spec: &Spec) -> Result<(), Declined> {
    check_options_but(spec, false)
}

/// [`check_options`], `--suppress-debug-info` aside when `suppress_ok` (the
/// non-LTO link checks it itself: [`suppressed_debug_info`]).
fn check_options_but(spec: &Spec, suppress_ok: bool) -> Result<(), Declined> {
    let checks: &[(bool, &str)] = &[
        (spec.preserve_relocs, "--preserve-relocs (nvJitLink has no option to keep relocations)"),
        (
            spec.suppress_debug_info && !suppress_ok,
            "--suppress-debug-info with -dlto (nvlink's -g link without debug information)",
        ),
        (
            spec.dump_callgraph || spec.dump_callgraph_no_demangle,
            "--dump-callgraph (nvlink's EDG demangler and its merge's node numbers)",
        ),
        (spec.verbose, "-v (nvlink's report prints an uninitialized barrier count)"),
        (spec.extra_warnings, "-extrawarn (nvlink's warnings on address-taken functions without calls)"),
        (spec.tool_name.is_some() || spec.verbose_tkinfo.is_some(), "hidden tkinfo options"),
        (!spec.unmodelled.is_empty(), "hidden options"),
    ];
    match checks.iter().find(|(on, _)| *on) {
        Some((_, what)) => no(Reason::Options, format!("{what} is not reproduced in process")),
        None => Ok(()),
    }
}

/// Link `plan` in process: the output file, or why there is none. A fault
/// anywhere (a worker that died, the link cancelled) wins over what the steps
/// returned; then nvlink's link errors, when a step found them; else the
/// step's decline.
pub fn link(cx: Context<'_>, spec: &Spec, mode: Mode, plan: &mut Plan) -> Result<Linked, NotLinked> {
    let linked = link_plan(&cx, spec, mode, plan);
    let notes = cx.notes;
    let cancelled = cx.cancel.is_cancelled().then(|| "the link was cancelled".to_owned());
    if let Some(why) = notes.fault.into_inner().unwrap_or_else(|p| p.into_inner()).or(cancelled) {
        return Err(NotLinked::Fault(Declined::new(Reason::Worker, why)));
    }
    let timings = notes.timings.into_inner().unwrap_or_else(|p| p.into_inner());
    match linked {
        Ok(output) => Ok(Linked { output, timings }),
        Err(why) => match notes.errors.into_inner().unwrap_or_else(|p| p.into_inner()) {
            Some(e) => Err(NotLinked::Errors(e, timings)),
            None => Err(NotLinked::Declined(why)),
        },
    }
}

/// [`link`]'s steps; a fault and nvlink's link errors are noted in `cx.notes`.
fn link_plan(cx: &Context<'_>, spec: &Spec, mode: Mode, plan: &mut Plan) -> Result<Vec<u8>, Declined> {
    match mode {
        Mode::Executable | Mode::Relocatable => {}
        Mode::LtoWhole | Mode::LtoPartial | Mode::LtoEmitPtx => {}
        _ => return no(Reason::Options, format!("{mode:?} links")),
    }
    // `--emit-ptx` with `-r` (or `--force-partial-lto`): nvlink's PTX of a
    // partial link (nothing internalized, nothing dropped), which the
    // whole-program path here is not (found by an adversarial run).
    if mode == Mode::LtoEmitPtx && (spec.relocatable || spec.force_partial_lto) {
        return no(Reason::LtoOptions, "--emit-ptx of a relocatable (partial) LTO link");
    }
    if mode != Mode::Relocatable && mode != Mode::Executable {
        device_code_after_runtime(plan, true)?;
    }
    // After partial LTO the link goes on in the mode it returns.
    let mode = match mode {
        Mode::LtoWhole if is_partial(plan) => partial_lto_to_cubin(cx, spec, mode, plan)?,
        Mode::LtoEmitPtx if is_partial(plan) => return partial_lto_ptx(cx, spec, plan),
        Mode::LtoWhole | Mode::LtoEmitPtx => match link_lto(cx, spec, mode, plan)? {
            Some(output) => return Ok(output),
            // NVVM left the program relocatable (LTO IR alone whose device
            // runtime calls stay open): nvlink's partial LTO for libcudadevrt.
            None => partial_lto_to_cubin(cx, spec, Mode::LtoWhole, plan)?,
        },
        Mode::LtoPartial => partial_lto_to_cubin(cx, spec, mode, plan)?,
        m => m,
    };

    check_options_but(spec, true)?;
    let arch = spec.arch.as_deref().unwrap_or_default();
    if !arch.starts_with("sm_") {
        return no(Reason::Arch, format!("--arch {arch}"));
    }
    // Whether nvlink's embedded compiler ran before its link stage (see
    // `stack_size_messages`): partial LTO, or PTX compiled at link time.
    let compiled = spec.lto || plan.units.iter().flat_map(|u| &u.modules).any(|m| matches!(m.code, Code::Ptx(_)));
    if compile_ptx_modules(cx, spec, plan)? {
        // The device runtime's members were chosen when the PTX modules had no
        // symbols yet (a PTX-only `-dc` object's device-side launches need
        // __cudaCDP2*): choose them again from the compiled cubins, as nvlink,
        // which compiles PTX on input, does.
        plan.reselect_system_library(0);
    }
    device_code_after_runtime(plan, false)?;
    plan.prune(spec, mode);
    // Decided before linking: what nvlink's --suppress-debug-info drops.
    let suppress = match spec.suppress_debug_info {
        true => Some(suppressed_debug_info(spec, mode, plan)?),
        false => None,
    };
    check_duplicates(cx, plan)?;
    if spec.link_as_tools_patch {
        return tools_patch_check(cx, plan);
    }

    let mut options = vec![format!("-arch={arch}")];
    // -g: nvJitLink keeps the debug sections and, like nvlink, all of
    // libcudadevrt's code; the plan does no host-reference pruning.
    if spec.debug {
        options.push("-g".into());
    }
    if mode == Mode::Relocatable {
        options.push("-r".into());
    }
    let user_used = !spec.kernels_used.is_empty() || !spec.variables_used.is_empty();
    if user_used && spec.use_host_info {
        return no(Reason::Options, "--kernels-used/--variables-used with --use-host-info");
    }
    for k in spec.kernels_used.iter().flat_map(|k| k.split(',')).filter(|k| !k.is_empty()) {
        options.push(format!("-kernels-used={k}"));
    }
    for v in spec.variables_used.iter().flat_map(|v| v.split(',')).filter(|v| !v.is_empty()) {
        options.push(format!("-variables-used={v}"));
    }
    let mut inputs = Vec::new();
    let mut functions = Vec::new();
    for unit in &plan.units {
        for m in &unit.modules {
            match &m.code {
                Code::Cubin(data) => {
                    inputs.push(JitInput { kind: InputType::Cubin, data, name: &unit.name });
                    functions.push(
                        m.info
                            .as_deref()
                            .map(|i| InputObject { functions: i.functions.clone(), names: i.names.clone() })
                            .unwrap_or_default(),
                    );
                }
                Code::Ptx(_) => return no(Reason::PtxJit, "PTX left uncompiled"),
                Code::LtoObject(_) => return no(Reason::PartialLto, "LTO IR in a non-LTO link"),
            }
        }
    }
    // The cubin and the link's warnings (nvJitLink's info log).
    let run = |extra: &[String]| -> Result<(Vec<u8>, String), Declined> {
        let mut opts = options.clone();
        opts.extend_from_slice(extra);
        let out = cx.obs.in_phase(Phase::JitLink, || cx.jit_link(&opts, &inputs, false)).inspect_err(|_| {
            // Link errors: the stack-size warnings before them as nvlink prints them.
            if let Some(e) = cx.notes.errors.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
                e.messages = stack_size_messages(spec, compiled, std::mem::take(&mut e.messages));
            }
        })?;
        let cubin = out.cubin.ok_or_else(|| Declined::new(Reason::Tool, "nvJitLink returned no cubin"))?;
        Ok((cubin, out.info_log))
    };
    // The user's --kernels-used/--variables-used replace the host references
    // (nvlink then removes no ghost names either).
    let pruning = plan.pruning.as_ref().filter(|p| p.removes_anything() && !user_used);
    let (cubin, info_log) = match pruning {
        None => run(&[])?,
        Some(p) => {
            // After partial LTO nvlink keeps the host-referenced kernels and
            // what they reach: a cover of those alone gives its section
            // order (a cover of every live kernel does not). A kernel kept
            // only because a relocation names it (a device-side launch) must
            // stay out of the cover too: nvlink writes its `.nv.info` name
            // after the constant banks and no `.nv.shared` name, as nvJitLink
            // does for a kernel it keeps without being told.
            let (wanted, excluded) = match plan.partial_lto {
                true => {
                    let wanted = host_referenced(plan, &p.live_kernels);
                    let excluded = p.dead_kernels.iter().chain(p.live_kernels.difference(&wanted)).cloned().collect();
                    (wanted, excluded)
                }
                false => (p.live_kernels.clone(), p.dead_kernels.clone()),
            };
            let mut cover = kernels_used_cover(&wanted, &excluded)?;
            if cover.is_empty() {
                // No kernel at all, so nothing is kept (with no -kernels-used
                // nvJitLink would keep everything): a string no name contains.
                // Measured on device functions and variables alone; a program
                // whose kernels are all dead is left to nvlink.
                if !excluded.is_empty() {
                    return no(Reason::KernelsUsed, "host references keep none of the kernels");
                }
                cover.push("#".to_owned());
            }
            let (cubin, info_log) = run(&cover.iter().map(|k| format!("-kernels-used={k}")).collect::<Vec<_>>())?;
            // nvlink and nvJitLink must agree on what survives.
            let kept =
                cubin::read(&cubin).map_err(|e| Declined::new(Reason::Tool, format!("nvJitLink output: {e}")))?;
            let kept: BTreeSet<String> = kept.functions.into_iter().map(|f| f.name).collect();
            if kept != p.live_functions {
                let only_kept: Vec<&String> = kept.difference(&p.live_functions).take(3).collect();
                let only_planned: Vec<&String> = p.live_functions.difference(&kept).take(3).collect();
                return no(
                    Reason::SafetyNet,
                    format!(
                        "nvJitLink kept different device code than host-reference pruning \
                         (only kept: {only_kept:?}; only planned: {only_planned:?})"
                    ),
                );
            }

            (cubin, info_log)
        }
    };
    let warnings = stack_size_messages(spec, compiled, info_log_warnings(&info_log)?);
    if warnings.iter().any(|d| d.severity == crate::diag::Severity::Error) {
        // -Werror: nvlink fails after its link stage, with its registration file.
        let mut errors = cx.notes.errors.lock().unwrap_or_else(|p| p.into_inner());
        *errors = Some(LinkErrors {
            messages: warnings,
            exit_code: crate::diag::EXIT_LINK_ERROR,
            written: None,
            registers: true,
        });
        return no(Reason::Diagnostics, "-Werror: stack size of an entry function cannot be statically determined");
    }
    if !warnings.is_empty() && !plan.tool_warnings.is_empty() {
        return no(Reason::Diagnostics, "stack-size warnings beside ptxas's warnings (their order is not reproduced)");
    }
    plan.link_warnings = warnings;
    let fix = Fixups {
        linker_entry: Some(render::linker_entry(&spec.parsed, &cx.tk.release)),
        // nvlink's removal after partial LTO leaves no `.nv.shared` names.
        inputs: if pruning.is_some() && !plan.partial_lto { functions } else { Vec::new() },
    };
    let _phase = cx.obs.phase(Phase::Finalize);
    let out = finalize::finalize(&cubin, &fix).map_err(|e| Declined::new(Reason::Tool, format!("finalize: {e}")))?;
    match suppress {
        None => Ok(out),
        Some(removed) => finalize::suppress_debug_info(&out, &removed).map_err(|e| match e {
            finalize::FinalizeError::NotReproduced(why) => Declined::new(Reason::Options, why),
            e => Declined::new(Reason::Tool, format!("finalize: {e}")),
        }),
    }
}

/// `-g --suppress-debug-info` (the front end refuses it without `-g`): nvlink's
/// `-g` link less the `EIATTR_MIN_STACK_SIZE` entries of the kernels
/// host-reference pruning would remove ([`finalize::suppress_debug_info`]);
/// returns those kernels. Measured on executable links of objects with host
/// references. Declined: links naming libcudadevrt (nvlink drops symbols of
/// its code too: 16 of 670 for `cdp.o`); a removed function that is not a
/// kernel, a removed weak (template) kernel (nvlink keeps its entry) or one
/// that calls a function (nvlink also gives it its own register count, not
/// its callees'); the links not measured.
fn suppressed_debug_info(spec: &Spec, mode: Mode, plan: &Plan) -> Result<BTreeSet<String>, Declined> {
    if mode != Mode::Executable || plan.partial_lto {
        return no(Reason::Options, "--suppress-debug-info with -r or -dlto");
    }
    if plan.system_library_found {
        return no(Reason::Options, "--suppress-debug-info with libcudadevrt (nvlink drops symbols too)");
    }
    if !spec.kernels_used.is_empty() || !spec.variables_used.is_empty() {
        return no(Reason::Options, "--suppress-debug-info with --kernels-used/--variables-used");
    }
    let Some(p) = plan.pruning_but_for_debug(spec) else {
        return no(Reason::Options, "--suppress-debug-info without host information");
    };
    for info in plan.units.iter().flat_map(|u| &u.modules).filter_map(|m| m.info.as_deref()) {
        let functions: BTreeSet<&str> = info.functions.iter().map(|f| f.name.as_str()).collect();
        for f in info.functions.iter().filter(|f| !p.live_functions.contains(&f.name)) {
            let calls = info.refs.iter().any(|r| {
                r.from.as_deref() == Some(&f.name)
                    && (functions.contains(r.to.as_str()) || info.undefined_functions.contains(&r.to))
            });
            if !f.is_kernel || info.weak.contains(&f.name) || calls {
                return no(
                    Reason::Options,
                    format!(
                        "--suppress-debug-info removing {}: a device function, a weak kernel or one that calls \
                         (nvlink's entries for it are not reproduced)",
                        f.name
                    ),
                );
            }
        }
    }
    Ok(p.dead_kernels)
}

/// Whether a `-dlto` link is nvlink's partial LTO: LTO modules beside
/// non-LTO device code.
fn is_partial(plan: &Plan) -> bool {
    // libcudadevrt's members are there because the LTO modules need them, or
    // all of them (`--keep-system-libraries`): they decide nothing here.
    let modules = || plan.units.iter().filter(|u| !u.is_cudadevrt).flat_map(|u| &u.modules);
    if !modules().any(|m| matches!(m.code, Code::LtoObject(_))) {
        return false;
    }
    if modules().any(|m| !matches!(m.code, Code::LtoObject(_))) {
        return true;
    }
    // LTO modules needing what only libcudadevrt defines (dynamic parallelism).
    // Only an extern the device runtime defines tells: a PTX twin shows no
    // inline function its unit inlined at every call (`__forceinline__`,
    // `inline`: `linkonce_odr` in the LTO IR), which NVVM still links to
    // another unit's extern, and nvlink then compiles the whole program. Any
    // other open extern is left to NVVM (`link_lto`: relocatable PTX is
    // partial LTO there too).
    let symbols: Option<Vec<&PtxSymbols>> = modules().map(|m| m.lto.as_ref()).collect();
    symbols.is_some_and(|s| plan.system_library_found && open_externs(&s).any(|e| plan.runtime_defines(e)))
}

/// Partial LTO as nvlink does it: NVVM compiles the LTO modules relocatable
/// (`--device-c`), ptxas `-c` makes one cubin of them, which goes first into
/// an ordinary link with the rest. Beside non-LTO code, and for `-dlto -r` and
/// `--force-partial-lto`, NVVM gets `--force-device-c` and no host
/// references; for libcudadevrt alone (dynamic parallelism in LTO code)
/// `--device-c` and the host references (`-host-ref-*`), and the link then
/// prunes when the host launches some kernel (without host information,
/// `--device-c` alone and no pruning; with host references to variables
/// alone, no pruning either).
///
/// Returns the mode the link goes on in: `Relocatable` (`-dlto -r`),
/// `Executable` (pruned by the host references) or `LtoWhole` (an executable
/// link without host-reference pruning).
fn partial_lto_to_cubin(cx: &Context<'_>, spec: &Spec, mode: Mode, plan: &mut Plan) -> Result<Mode, Declined> {
    check_lto_options(spec)?;
    if spec.keep_system_libraries {
        return no(Reason::LtoOptions, "--keep-system-libraries with partial LTO");
    }

    if !spec.kernels_used.is_empty() || !spec.variables_used.is_empty() {
        return no(Reason::LtoOptions, "--kernels-used/--variables-used with -dlto");
    }
    let arch = spec.arch.as_deref().unwrap_or_default();
    let mut objects = Vec::new();
    for unit in &plan.units {
        for m in &unit.modules {
            if let Code::LtoObject(data) = &m.code {
                objects.push(JitInput { kind: InputType::Object, data, name: &unit.name });
            }
        }
    }
    if objects.is_empty() {
        // `-dlto -r` of non-LTO code: nvlink's infos, then its warning, then
        // an ordinary `-r` link.
        if !spec.relocatable || spec.warning_as_error || !plan.warnings.is_empty() || !plan.notes.is_empty() {
            return no(
                Reason::PartialLto,
                "-dlto without LTO modules: --force-partial-lto, -Werror (nvlink's 'Ignoring -dlto' warning)",
            );
        }
        push_partial_infos(plan);
        // --disable-infos silences this warning (and not the infos); -w does not.
        if !spec.disable_infos {
            plan.notes.push(Diagnostic::warning("Ignoring -dlto option because no LTO objects found"));
        }
        return Ok(Mode::Relocatable);
    }
    // Partial only for the device runtime (dynamic parallelism).
    let only_runtime = mode == Mode::LtoWhole
        && plan
            .units
            .iter()
            .filter(|u| !u.is_cudadevrt)
            .flat_map(|u| &u.modules)
            .all(|m| matches!(m.code, Code::LtoObject(_)));
    if !plan.warnings.is_empty() || !plan.notes.is_empty() {
        return no(Reason::PartialLto, "partial LTO with input messages (their order is not reproduced)");
    }
    // Nothing is pruned afterwards: the link goes on as a plain executable
    // (or `-r`) link without host information.
    let mut options =
        vec![format!("-arch={arch}"), "-lto".to_owned(), "-ptx".to_owned(), "-Xnvvm=--device-c".to_owned()];
    // As under whole-program LTO (see `link_lto`).
    if spec.debug {
        options.push("-g".to_owned());
    }
    if spec.nvvm_latest {
        options.push("-nvvm-latest".to_owned());
    }
    let mut next = if spec.relocatable { Mode::Relocatable } else { Mode::LtoWhole };
    if !only_runtime {
        options.push("-Xnvvm=--force-device-c".to_owned());
    } else if plan.uses_host_info(spec) {
        // NVVM gets the host references (`-host-ref-*`; as `-Xnvvm=` its PTX
        // is nvlink's) and still keeps every kernel; the link prunes by the
        // host's kernel references. Without any (variables alone, or no host
        // reference at all) nvlink passes NVVM no list and prunes nothing.
        options.extend(partial_host_info(plan));
        if host_launches_a_kernel(plan) {
            next = Mode::Executable;
        }
    }
    let (nvvm_extra, ptxas_extra) = lto_forwarding(spec)?;
    options.extend(nvvm_extra);
    let ptx = cx.timed(spec, || lto_row("cicc"), || nvvm(cx, &objects, &options))?;
    // As under whole-program LTO (`-g`: nvlink's ptxas options, tool entry and
    // warnings), relocatable.
    let args = vec![format!("-arch={arch}"), "-m64".to_owned(), "-c".to_owned()];
    let cubin = lto_ptxas(cx, spec, plan, &ptx, args, &ptxas_extra)?;
    let info = cubin::read(&cubin).map_err(|e| Declined::new(Reason::Tool, format!("ptxas output: {e}")))?;
    for unit in &mut plan.units {
        unit.modules.retain(|m| !matches!(m.code, Code::LtoObject(_)));
    }
    let module = crate::input::load::Module {
        code: Code::Cubin(cubin.into()),
        arch: info.sm,
        options: String::new(),
        info: Some(std::sync::Arc::new(info)),
        lto: None,
    };
    push_partial_infos(plan);
    // nvlink names it so in messages (`Undefined reference to 'f' in 'lto.cubin'`).
    // Its kernels' host references stay with the LTO units.
    let host_refs = Some(crate::input::host::HostRefs::default());
    let unit = crate::input::load::Unit {
        name: "lto.cubin".to_owned(),
        modules: vec![module],
        host_refs,
        ..Default::default()
    };
    plan.units.insert(0, unit);
    // The LTO cubin may need the device runtime (dynamic parallelism).
    plan.reselect_system_library(1);
    plan.partial_lto = true;
    Ok(next)
}

/// `--emit-ptx` of LTO modules that need libcudadevrt: NVVM's relocatable
/// PTX (`--device-c` and the host references), as nvlink writes it.
fn partial_lto_ptx(cx: &Context<'_>, spec: &Spec, plan: &Plan) -> Result<Vec<u8>, Declined> {
    check_options(spec)?;
    check_lto_options(spec)?;
    let non_lto = plan.units.iter().filter(|u| !u.is_cudadevrt).flat_map(|u| &u.modules);
    if non_lto.clone().any(|m| !matches!(m.code, Code::LtoObject(_))) {
        return no(Reason::PartialLto, "--emit-ptx beside non-LTO device code");
    }
    if spec.debug || spec.nvvm_latest || !spec.kernels_used.is_empty() || !spec.variables_used.is_empty() {
        return no(Reason::LtoOptions, "--emit-ptx of partial LTO with -g, --nvvm-latest or --kernels-used");
    }
    if !plan.warnings.is_empty() || !plan.notes.is_empty() {
        return no(Reason::PartialLto, "partial LTO with input messages (their order is not reproduced)");
    }
    let arch = spec.arch.as_deref().unwrap_or_default();
    let mut options =
        vec![format!("-arch={arch}"), "-lto".to_owned(), "-ptx".to_owned(), "-Xnvvm=--device-c".to_owned()];
    if plan.uses_host_info(spec) {
        options.extend(partial_host_info(plan));
    }
    let (nvvm_extra, _) = lto_forwarding(spec)?;
    options.extend(nvvm_extra);
    let objects: Vec<JitInput<'_>> = plan
        .units
        .iter()
        .flat_map(|u| u.modules.iter().map(move |m| (u, m)))
        .filter_map(|(u, m)| match &m.code {
            Code::LtoObject(data) => Some(JitInput { kind: InputType::Object, data, name: &u.name }),
            _ => None,
        })
        .collect();
    Ok(nvvm(cx, &objects, &options)?.to_vec())
}

/// nvlink's info for each non-LTO unit (libcudadevrt's aside), which
/// --disable-infos does not silence.
fn push_partial_infos(plan: &mut Plan) {
    let names: Vec<String> = plan
        .units
        .iter()
        .filter(|u| !u.is_cudadevrt && u.modules.iter().any(|m| !matches!(m.code, Code::LtoObject(_))))
        .map(|u| u.name.clone())
        .collect();
    for name in names {
        plan.notes.push(Diagnostic::info(format!("requested LTO but '{name}' not built for LTO so doing partial LTO")));
    }
}

/// Device code after a libcudadevrt nvlink links nothing of (or, under
/// `-dlto`, after libcudadevrt at all): nvlink's fatal, left to nvlink
/// ([`Plan::device_code_after_runtime`]).
fn device_code_after_runtime(plan: &Plan, lto: bool) -> Result<(), Declined> {
    match plan.device_code_after_runtime(lto) {
        Some(unit) => no(
            Reason::Diagnostics,
            format!("'{unit}' after libcudadevrt, none of which is linked (nvlink: unexpected object after cudadevrt)"),
        ),
        None => Ok(()),
    }
}

/// Compile every PTX module of the plan to a relocatable cubin, as nvlink's
/// embedded ptxas does at link time: in parallel, each cached by its text.
/// `true` when there was PTX to compile.
fn compile_ptx_modules(cx: &Context<'_>, spec: &Spec, plan: &mut Plan) -> Result<bool, Declined> {
    let has_ptx = plan.units.iter().flat_map(|u| &u.modules).any(|m| matches!(m.code, Code::Ptx(_)));
    if !has_ptx {
        return Ok(false);
    }
    if spec.verbose2 {
        return no(Reason::PtxJit, "-v2 with PTX compiled at link time (ptxas's report, with its compile times)");
    }
    // nvlink hands these to its embedded ptxas (`-split-compile` too: its
    // tkinfo note records it, and the code may differ).
    let split = spec.split_compile.is_some() || spec.split_compile_extended.is_some();
    if spec.maxrregcount.is_some() || !spec.xptxas.is_empty() || spec.ofast_compile.is_some() || spec.debug || split {
        return no(Reason::PtxJit, "ptxas options (or -g) for PTX compiled at link time");
    }
    let Some(target) = spec.target() else { return no(Reason::Arch, format!("--arch {:?}", spec.arch)) };
    let mut args = vec![format!("-arch={}", target.jit_arch()), "-m64".to_owned(), "-c".to_owned()];
    // nvlink hands its embedded ptxas the stack protector as ptxas's own option.
    if let Some(v) = &spec.device_stack_protector {
        args.insert(0, format!("-device-stack-protector={v}"));
    }
    // nvlink's `-time` row of each PTX module, by the unit it came from.
    let mut rows = Vec::new();
    for u in &plan.units {
        for m in &u.modules {
            let row = match crate::input::load::extension(&u.name) {
                _ if !matches!(m.code, Code::Ptx(_)) || spec.time.is_none() => None,
                // Not measured: how nvlink names these in its table.
                _ if u.from_archive => return no(Reason::Options, "-time with PTX in an archive member"),
                Some("fatbin") => return no(Reason::Options, "-time with PTX in a fatbin file"),
                Some("ptx") => Some((u.name.clone(), u.name.clone(), String::new())),
                _ => Some(("ptx".to_owned(), u.name.clone(), "cubin".to_owned())),
            };
            rows.push(row);
        }
    }
    let modules: Vec<&mut crate::input::load::Module> =
        plan.units.iter_mut().flat_map(|u| u.modules.iter_mut()).collect();
    // Each module is compiled on the pool, a phase of the link (`cx.obs`).
    modules.into_par_iter().zip(rows).enumerate().try_for_each(|(i, (m, row))| {
        let Code::Ptx(text) = &m.code else { return Ok(()) };
        let phase = cx.obs.phase(Phase::Jit).detail("module", i as u64);
        let key = cx.artifacts.key(Level::Jit, &[text, args.join(" ").as_bytes()]);
        let row = || {
            let (source, inputs, output) = row.unwrap_or_default();
            TimeRow { order: i, source, phase: "ptxas", inputs, output, ms: 0.0 }
        };
        let bytes = cx.timed(spec, row, || {
            cx.artifacts.get_or_compute(Level::Jit, key, &phase, || {
                ptxas::compile(cx.tk, text, &args, cx.scratch, cx.cancel, cx.limit, cx.confine)
            })
        })?;
        let info = cubin::read(&bytes).map_err(|e| Declined::new(Reason::Tool, format!("ptxas output: {e}")))?;
        m.code = Code::Cubin(bytes);
        m.info = Some(std::sync::Arc::new(info));
        Ok(())
    })?;
    Ok(true)
}

/// nvJitLink accepts some duplicate definitions nvlink rejects. One strong
/// symbol defined twice gets nvlink's answer (its error naming both units, then
/// the fatal of its merge step, exit status 1); more than one is left to nvlink
/// (which stops at the first file that has one).
fn check_duplicates(cx: &Context<'_>, plan: &Plan) -> Result<(), Declined> {
    let mut strong: std::collections::HashMap<&str, &str> = std::collections::HashMap::new();
    let mut dups = Vec::new();
    for unit in &plan.units {
        for info in unit.modules.iter().filter_map(|m| m.info.as_deref()) {
            for name in info.defined.iter().filter(|d| !info.weak.contains(d)) {
                if let Some(first) = strong.insert(name.as_str(), unit.name.as_str()) {
                    dups.push((name.as_str(), unit.name.as_str(), first));
                }
            }
        }
    }
    match dups.as_slice() {
        [] => Ok(()),
        [(name, unit, first)] => {
            let messages = vec![
                Diagnostic::error(format!("Multiple definition of '{name}' in '{unit}', first defined in '{first}'")),
                Diagnostic::fatal("merge_elf failed"),
            ];
            let mut errors = cx.notes.errors.lock().unwrap_or_else(|p| p.into_inner());
            *errors =
                Some(LinkErrors { messages, exit_code: crate::diag::EXIT_FATAL, written: None, registers: false });
            no(Reason::Diagnostics, format!("{name} is defined more than once"))
        }
        _ => no(Reason::Diagnostics, "several symbols are defined more than once"),
    }
}

/// `--link-as-tools-patch` (non-LTO): after merging the inputs (a multiple
/// definition is reported first), nvlink requires `EIATTR_TOOLS_PATCH_FUNC` of
/// every function and stops at the first, in input and symbol-table order,
/// without it, dead kernels included, before resolving symbols. Only a
/// tools-patch compile writes the attribute; nvlink's link of such code is
/// not reproduced.
fn tools_patch_check(cx: &Context<'_>, plan: &Plan) -> Result<Vec<u8>, Declined> {
    for unit in &plan.units {
        for info in unit.modules.iter().filter_map(|m| m.info.as_deref()) {
            if info.tools_patch {
                return no(Reason::Options, "--link-as-tools-patch with tools-patch code");
            }
            let Some(f) = info.functions.first() else { continue };
            if unit.from_archive {
                return no(Reason::Options, "--link-as-tools-patch: first function in an archive member");
            }
            let message = format!(
                "Function '{}' in '{}' is missing EIATTR_TOOLS_PATCH_FUNC attribute required by -astoolspatch option",
                f.name, unit.name
            );
            let mut errors = cx.notes.errors.lock().unwrap_or_else(|p| p.into_inner());
            *errors = Some(LinkErrors {
                messages: vec![Diagnostic::fatal(message)],
                exit_code: crate::diag::EXIT_FATAL,
                written: None,
                registers: false,
            });
            return no(Reason::Diagnostics, "--link-as-tools-patch: a function without the tools-patch attribute");
        }
    }
    no(Reason::Options, "--link-as-tools-patch without device functions")
}

/// A short list of `-kernels-used` strings selecting exactly `live`.
///
/// nvJitLink keeps every kernel whose name contains one of the strings, and it
/// takes about 2 ms per string; so each live kernel not yet covered adds the
/// shortest prefix of its name that no kernel of `dead` contains (one prefix
/// usually covers a whole family, e.g. libcudadevrt's kernels). `dead` is
/// every kernel the cover must leave out: the removed ones, and after partial
/// LTO also those kept only because a relocation names them.
pub(crate) fn kernels_used_cover(live: &BTreeSet<String>, dead: &BTreeSet<String>) -> Result<Vec<String>, Declined> {
    let mut cover: Vec<String> = Vec::new();
    for k in live {
        if cover.iter().any(|c| k.contains(c.as_str())) {
            continue;
        }
        let safe = |p: &str| !dead.iter().any(|d| d.contains(p));
        let prefix =
            (1..=k.len()).filter(|&n| k.is_char_boundary(n)).map(|n| &k[..n]).find(|p| safe(p)).ok_or_else(|| {
                Declined::new(
                    Reason::KernelsUsed,
                    format!("kernel name {k} is contained in the name of a kernel the cover must leave out"),
                )
            })?;
        cover.push(prefix.to_owned());
    }
    Ok(cover)
}

/// Whole-program LTO (`-dlto`) and `-dlto --emit-ptx`, when every linked unit is
/// LTO IR (anything else is nvlink's partial LTO).
///
/// nvJitLink's NVVM gets the options nvlink gives libNVVM of its own
/// ([`nvlink_nvvm_options`], [`host_ref_lists`]) as `-Xnvvm=`: its PTX is then
/// nvlink's, pruned by the host references as nvlink's is, and ptxas compiles
/// it as a whole program: that cubin, tool note included, is nvlink's output
/// byte for byte. No module's symbols are needed beforehand, so LTO IR
/// without a PTX twin (nvcc's `code=lto_XY`, what `-dlto` builds produce)
/// links the same way. A program NVVM leaves relocatable (open externs) is
/// nvlink's partial LTO for libcudadevrt alone: `Ok(None)`, the caller goes
/// on with [`partial_lto_to_cubin`] (without libcudadevrt, or under
/// `--emit-ptx`, declined).
fn link_lto(cx: &Context<'_>, spec: &Spec, mode: Mode, plan: &mut Plan) -> Result<Option<Vec<u8>>, Declined> {
    check_options(spec)?;
    if !spec.kernels_used.is_empty() || !spec.variables_used.is_empty() {
        return no(Reason::LtoOptions, "--kernels-used/--variables-used with -dlto");
    }
    check_lto_options(spec)?;
    let arch = spec.arch.as_deref().unwrap_or_default();
    let objects = lto_program(plan)?;
    let mut options = vec![format!("-arch={arch}"), "-lto".to_owned(), "-ptx".to_owned()];
    options.extend(nvlink_nvvm_options(spec, plan).into_iter().map(|o| format!("-Xnvvm={o}")));
    let (nvvm_extra, ptxas_extra) = lto_forwarding(spec)?;
    options.extend(nvvm_extra);
    // (Under -g too: nvlink then still hands NVVM the host references.)
    if plan.has_host_info(spec) {
        options.extend(host_ref_lists(plan).into_iter().map(|o| format!("-Xnvvm={o}")));
    }
    // -g: nvJitLink's `-g` is nvlink's NVVM `-g -opt=0` (the same PTX).
    if spec.debug {
        options.push("-g".to_owned());
    }
    // nvlink hands NVVM `-nvvm-version=nvvm-latest`; nvJitLink's own
    // `-nvvm-latest` gives that PTX (its `-Xnvvm=` of it does not).
    if spec.nvvm_latest {
        options.push("-nvvm-latest".to_owned());
    }
    let ptx = cx.timed(spec, || lto_row("cicc"), || nvvm(cx, &objects, &options))?;
    // Under --device-c (libcudadevrt in the link) NVVM answers nvlink whether
    // the program came out whole (100) or relocatable (0), and nvlink goes on
    // with its partial LTO for the latter. nvJitLink does not pass that answer
    // on, so the PTX tells it (see `external_function`).
    let text = String::from_utf8_lossy(&ptx);
    let symbols = crate::input::ptx::symbols(&text);
    let open = open_extern(&[&symbols]);
    if open.is_some() || (plan.system_library_found && symbols.kernels.is_empty()) {
        // With libcudadevrt in the link that is partial LTO for it alone
        // (`None`: the caller goes on with it); `--emit-ptx` is left to nvlink.
        if mode == Mode::LtoWhole && plan.system_library_found {
            return Ok(None);
        }
        let what = open.map_or("a program without kernels".to_owned(), |o| format!("{o} stays open"));
        return no(Reason::PartialLto, format!("{what} after NVVM (partial LTO)"));
    }
    if external_function(&text) {
        return no(Reason::SafetyNet, "NVVM left a function external: whole or relocatable is not told");
    }
    if mode == Mode::LtoEmitPtx {
        return Ok(Some(ptx.to_vec()));
    }
    // ptxas: the whole program to the final cubin.
    let args = vec![format!("-arch={arch}"), "-m64".to_owned()];
    let cubin = lto_ptxas(cx, spec, plan, &ptx, args, &ptxas_extra)?;
    if !plan.system_library_found {
        // nvlink writes the whole program, then misses the device runtime it
        // looks for afterwards (no registration file is written).
        let mut errors = cx.notes.errors.lock().unwrap_or_else(|p| p.into_inner());
        *errors = Some(LinkErrors {
            messages: vec![Diagnostic::fatal("expected libcudadevrt object")],
            exit_code: crate::diag::EXIT_FATAL,
            written: Some(cubin),
            registers: false,
        });
        return no(Reason::Diagnostics, "-dlto without libcudadevrt: nvlink's output, then its fatal");
    }
    Ok(Some(cubin))
}

/// Whether NVVM's PTX defines a function with external linkage. NVVM answers
/// nvlink whether a program came out whole (100) or relocatable (0; seen
/// through the logging `libnvvm.so` of `scripts/nvvm-tap`), and nvJitLink does
/// not pass that on, so the engine reads it off the PTX: relocatable when
/// references stay open (the device runtime: dynamic parallelism, even in a
/// kernel the host never launches) or when the program has no kernel at all
/// (device functions or variables only: the corpus's `lto-functions-only`,
/// `lto-variables-only`); whole otherwise. A whole program internalizes every
/// function (no `.visible`/`.weak .func` in any whole-program PTX of the
/// corpus), so a function left external means the two signs disagree: such a
/// link is declined (nvlink links it) rather than guessed.
fn external_function(text: &str) -> bool {
    text.lines().any(|l| l.starts_with(".visible .func") || l.starts_with(".weak .func"))
}

/// The ptxas step of LTO (whole program, or relocatable with `-c` in `args`),
/// cached by the PTX and the options, timed as nvlink's `-time` row; under
/// `-g` nvlink's debug options, tool entry and warnings ([`debug_ptxas`]).
fn lto_ptxas(
    cx: &Context<'_>,
    spec: &Spec,
    plan: &mut Plan,
    ptx: &[u8],
    mut args: Vec<String>,
    extra: &[String],
) -> Result<Vec<u8>, Declined> {
    if spec.debug {
        return cx.timed(spec, || lto_row("ptxas"), || debug_ptxas(cx, plan, ptx, args, extra));
    }
    args.extend_from_slice(extra);
    // The artifact is ptxas's cubin with its warnings, which nvlink's embedded
    // ptxas prints the same (whole-program code with recursion: `ptxas warning
    // : Stack size for entry function ...`); the key's last part keeps these
    // entries apart from those of a cubin alone.
    let key = cx.artifacts.key(Level::Ptxas, &[ptx, args.join(" ").as_bytes(), b"cubin and warnings"]);
    let phase = cx.obs.phase(Phase::Ptxas).detail("ptx_bytes", ptx.len() as u64);
    let compile = || {
        cx.artifacts.get_or_compute(Level::Ptxas, key, &phase, || {
            ptxas::compile_with_warnings(cx.tk, ptx, &args, cx.scratch, cx.cancel, cx.limit, cx.confine)
                .map(|(cubin, warnings)| ptxas::Warned::encode(&cubin, &warnings))
        })
    };
    let artifact = cx.timed(spec, || lto_row("ptxas"), compile)?;
    let Some(ptxas::Warned { cubin, warnings }) = ptxas::Warned::decode(&artifact) else {
        return no(Reason::Tool, "a ptxas artifact that does not decode");
    };
    if !warnings.is_empty() && args.iter().any(|a| a == "-c") {
        // Partial LTO's relocatable compile: whether nvlink prints them is not measured.
        return no(Reason::Tool, "ptxas printed messages (partial LTO)");
    }
    plan.tool_warnings.extend(warnings);
    Ok(cubin.to_vec())
}

/// The options nvlink's embedded ptxas adds under `-dlto -g`.
const DEBUG_PTXAS: [&str; 3] = ["-no-bb-merge", "-ret-end", "-g"];

/// ptxas for `-dlto -g`, as nvlink's embedded ptxas runs it: with
/// `-no-bb-merge -ret-end -g`, its warnings printed after the link's messages
/// (not cached as an artifact: they are part of the answer), and its tool
/// entry as nvlink's ptxas records it (object `elf.o`, no input or output
/// file among the options).
fn debug_ptxas(
    cx: &Context<'_>,
    plan: &mut Plan,
    ptx: &[u8],
    mut args: Vec<String>,
    extra: &[String],
) -> Result<Vec<u8>, Declined> {
    if !extra.is_empty() {
        return no(Reason::LtoOptions, "ptxas options with -dlto -g (how nvlink's tool note records them)");
    }
    args.extend(DEBUG_PTXAS.iter().map(|s| s.to_string()));
    let _phase = cx.obs.phase(Phase::Ptxas).detail("ptx_bytes", ptx.len() as u64);
    let (cubin, warnings) =
        ptxas::compile_with_warnings(cx.tk, ptx, &args, cx.scratch, cx.cancel, cx.limit, cx.confine)?;
    let fail = |why: String| Declined::new(Reason::Tool, format!("-dlto -g tool note: {why}"));
    // The ptxas program records `<input> -no-bb-merge  -ret-end  -g  -o <output> -arch sm_XY -m 64 `;
    // nvlink's ptxas `-no-bb-merge  -ret-end  -g  -arch sm_XY -m 64 `.
    let recorded = finalize::tkinfo::parse(
        &crate::finalize::image::CubinImage::parse(&cubin)
            .map_err(|e| fail(e.to_string()))?
            .sections
            .iter()
            .find(|s| s.name == ".note.nv.tkinfo")
            .ok_or_else(|| fail("no tool note".into()))?
            .data,
    )
    .map_err(|e| fail(e.to_string()))?;
    let [entry] = recorded.as_slice() else { return Err(fail("not one tool entry".into())) };
    let own = DEBUG_PTXAS.iter().map(|o| format!("{o}  ")).collect::<String>();
    let tail = entry
        .options
        .split_once(" -o ")
        .filter(|(head, _)| head.trim_end().ends_with(&format!(" {}", own.trim_end())))
        .and_then(|(_, rest)| rest.split_once(' '))
        .map(|(_, tail)| tail)
        .filter(|t| t.starts_with("-arch "))
        .ok_or_else(|| fail(format!("unexpected options {:?}", entry.options)))?;
    let cubin =
        finalize::rename_ptxas_entry(&cubin, "elf.o", &format!("{own}{tail}")).map_err(|e| fail(e.to_string()))?;
    plan.tool_warnings.extend(warnings);
    Ok(cubin)
}

/// The NVVM options nvlink adds of its own under `-dlto` and nvJitLink does
/// not (passed as `-Xnvvm=`): `--device-c` when libcudadevrt is in the link
/// (NVVM then decides whether the program comes out whole) and
/// `-has-global-host-info` unless `--ignore-host-info`; the host references
/// follow the forwarded options ([`host_ref_lists`]). Seen by logging
/// nvlink's calls into libNVVM (`nvvmCompileProgram`'s options) on every LTO
/// corpus case; /work/shared/reference/nvlink-nvvm-lto-input.md lists the
/// same. With them nvJitLink's NVVM gives nvlink's PTX, and a module without
/// a PTX copy needs no symbols of its own: NVVM prunes by the host
/// references, as in nvlink.
fn nvlink_nvvm_options(spec: &Spec, plan: &Plan) -> Vec<String> {
    let mut o = Vec::new();
    if plan.system_library_found {
        o.push("--device-c".to_owned());
    }
    if !spec.ignore_host_info {
        o.push("-has-global-host-info".to_owned());
    }
    o
}

/// `-host-ref-ek=...` and the five others, as nvlink builds them: the host
/// references of the linked units and of every member of libcudadevrt (at
/// its place on the command line, linked or not), in link order; each list
/// reversed, a pattern kept once (its first place in the reversed list);
/// empty lists left out. Compared with nvlink's own calls into libNVVM on the
/// corpus (see [`nvlink_nvvm_options`]).
fn host_ref_lists(plan: &Plan) -> Vec<String> {
    type Pick = fn(&HostRefs) -> &Vec<String>;
    let lists: [(&str, Pick); 6] = [
        ("ek", |r| &r.kernels_external),
        ("ik", |r| &r.kernels_internal),
        ("ec", |r| &r.constants_external),
        ("ic", |r| &r.constants_internal),
        ("eg", |r| &r.variables_external),
        ("ig", |r| &r.variables_internal),
    ];
    // Without a kernel the host launches (external or internal) nvlink passes
    // no list at all, its variables' and libcudadevrt's neither: NVVM then
    // keeps every kernel (the corpus's `lto-unlaunched-kernels`,
    // `lto-host-variable-only`).
    if !host_launches_a_kernel(plan) {
        return Vec::new();
    }
    let mut refs: Vec<&HostRefs> = Vec::new();
    let runtime = plan.system_library.as_ref().map(|l| l.host_refs());
    let (at, mut runtime) = match runtime {
        Some((at, r)) => (at, Some(r)),
        None => (usize::MAX, None),
    };
    for (i, unit) in plan.units.iter().enumerate() {
        if i == at {
            refs.extend(runtime.take().into_iter().flatten());
        }
        refs.extend(unit.host_refs.as_ref());
    }
    refs.extend(runtime.into_iter().flatten());
    lists
        .iter()
        .filter_map(|(tag, pick)| {
            let mut seen = std::collections::HashSet::new();
            let all: Vec<&str> = refs
                .iter()
                .rev()
                .flat_map(|r| pick(r).iter().rev().map(String::as_str))
                .filter(|p| seen.insert(*p))
                .collect();
            (!all.is_empty()).then(|| format!("-host-ref-{tag}={}", all.join(",")))
        })
        .collect()
}

/// Whether the host references of some unit (libcudadevrt's aside) name a
/// kernel, external or internal: a launch from the host.
fn host_launches_a_kernel(plan: &Plan) -> bool {
    let launches = |r: &HostRefs| !r.kernels_external.is_empty() || !r.kernels_internal.is_empty();
    plan.units.iter().filter(|u| !u.is_cudadevrt).filter_map(|u| u.host_refs.as_ref()).any(launches)
}

/// What nvlink forwards under `-dlto`: options for NVVM (as nvJitLink
/// options) and for ptxas.
fn lto_forwarding(spec: &Spec) -> Result<(Vec<String>, Vec<String>), Declined> {
    let (mut nvvm, mut ptxas) = (Vec::new(), Vec::new());
    if let Some(v) = &spec.device_stack_protector {
        ptxas.push(format!("-device-stack-protector={v}"));
    }
    if let Some(n) = spec.maxrregcount.filter(|n| *n > 0) {
        nvvm.push(format!("-maxrregcount={n}"));
        ptxas.push(format!("-maxrregcount={n}"));
    }
    for t in spec.xnvvm.iter().flat_map(|x| x.split(' ')).filter(|t| !t.is_empty()) {
        // nvlink drops a second -Ofast-compile, and math options change the
        // defaults it takes from the objects: those are nvlink's.
        if spec.ofast_compile.is_some() && t.starts_with("-Ofast-compile=") {
            continue;
        }
        if ["-ftz=", "-prec-div=", "-prec-sqrt=", "-fma=", "-prec_div=", "-prec_sqrt=", "-fmad="]
            .iter()
            .any(|m| t.starts_with(m))
        {
            return no(Reason::LtoOptions, format!("-Xnvvm {t}: nvlink's math-option defaults are not reproduced"));
        }
        nvvm.push(format!("-Xnvvm={t}"));
    }
    ptxas.extend(spec.xptxas.iter().flat_map(|x| x.split_whitespace()).map(str::to_owned));
    // With `mid`, nvlink's NVVM prints an info nvJitLink's does not
    // ("opt: Unknown command line argument '-enable-scalar-pre=false'").
    if spec.ofast_compile.as_deref() == Some("mid") {
        return no(Reason::LtoOptions, "-Ofc=mid (nvlink's NVVM prints an info of its own)");
    }
    if let Some(l) = spec.ofast_compile.as_deref().filter(|l| matches!(*l, "min" | "mid" | "max")) {
        nvvm.push(format!("-Xnvvm=-Ofast-compile={l}"));
        ptxas.push(format!("--Ofast-compile={l}"));
    }
    let split = (spec.split_compile.filter(|n| *n != 1), spec.split_compile_extended.filter(|n| *n != 1));
    if let (Some(_), Some(_)) = split {
        return no(Reason::LtoOptions, "-split-compile with -split-compile-extended (nvlink's warning)");
    }
    if let Some(n) = spec.split_compile.filter(|n| *n != 1) {
        nvvm.push(format!("-split-compile={n}"));
        ptxas.push(format!("--split-compile={n}"));
    }
    if split.1.is_some() {
        // Where NVVM splits the program, nvlink compiles each part with
        // ptxas `-c` and links them (a tool entry each, other bytes); the
        // engine's NVVM hands back one PTX, and whether NVVM split is not
        // known beforehand.
        return no(Reason::LtoOptions, "-split-compile-extended with -dlto (nvlink links the parts NVVM splits)");
    }
    Ok((nvvm, ptxas))
}

/// Options nvlink forwards to NVVM or ptxas under `-dlto`: not reproduced yet.
fn check_lto_options(spec: &Spec) -> Result<(), Declined> {
    let lto_options: &[(bool, &str)] = &[
        (spec.verbose2, "-v2 (ptxas's report, with its compile times)"),
        (spec.link_as_tools_patch, "--link-as-tools-patch"),
    ];
    match lto_options.iter().find(|(on, _)| *on) {
        Some((_, what)) => no(Reason::LtoOptions, format!("{what} with -dlto is not reproduced in process")),
        None => Ok(()),
    }
}

/// The LTO objects of a whole program: every linked unit is LTO IR (anything
/// else is nvlink's partial LTO); libcudadevrt kept whole
/// (`--keep-system-libraries`) is left out, as nvlink leaves it out of a
/// whole program (its output is the same).
fn lto_program(plan: &Plan) -> Result<Vec<JitInput<'_>>, Declined> {
    let mut objects = Vec::new();
    for unit in plan.units.iter().filter(|u| !u.modules.is_empty() && !u.is_cudadevrt) {
        for m in &unit.modules {
            let Code::LtoObject(data) = &m.code else {
                return no(Reason::PartialLto, "partial LTO (non-LTO device code in an LTO link)");
            };
            objects.push(JitInput { kind: InputType::Object, data, name: &unit.name });
        }
    }
    if objects.is_empty() {
        return no(Reason::PartialLto, "-dlto without LTO objects");
    }
    Ok(objects)
}

/// NVVM's host information for partial LTO for libcudadevrt alone (as
/// nvJitLink options): `-has-global-host-info` and nvlink's lists (variables'
/// and constants' included, as whole-program LTO passes them).
fn partial_host_info(plan: &Plan) -> Vec<String> {
    let lists = host_ref_lists(plan).into_iter().map(|o| format!("-Xnvvm={o}"));
    std::iter::once("-Xnvvm=-has-global-host-info".to_owned()).chain(lists).collect()
}

/// The kernels among `live` that a unit's host references name.
fn host_referenced(plan: &Plan, live: &BTreeSet<String>) -> BTreeSet<String> {
    let patterns = host_patterns(plan);
    live.iter().filter(|k| patterns.iter().any(|p| crate::input::host::glob_match(p, k))).cloned().collect()
}

/// The kernel patterns of every unit's host references.
fn host_patterns(plan: &Plan) -> Vec<&str> {
    plan.units.iter().filter_map(|u| u.host_refs.as_ref()).flat_map(|r| r.kernel_patterns()).collect()
}

/// An extern of the LTO modules that none of them defines (and the driver
/// does not provide).
fn open_extern<'a>(symbols: &[&'a PtxSymbols]) -> Option<&'a str> {
    open_externs(symbols).next()
}

/// The externs of the LTO modules that none of them defines (and the driver
/// does not provide), in module order.
fn open_externs<'a, 'b>(symbols: &'b [&'a PtxSymbols]) -> impl Iterator<Item = &'a str> + 'b {
    let defined: std::collections::HashSet<&str> = symbols
        .iter()
        .flat_map(|s| s.functions.iter().chain(&s.variables).chain(&s.kernels))
        .map(String::as_str)
        .collect();
    symbols
        .iter()
        .flat_map(|s| &s.externs)
        .map(String::as_str)
        .filter(move |e| !defined.contains(e) && !crate::input::load::SYSTEM_EXTERNS.contains(e))
}

/// NVVM: the LTO modules to optimized PTX, unsplit as nvlink runs it (cached).
/// NVVM `-split-compile` is not output-preserving: on a kernel calling a
/// looping device function of another unit it changes the machine code (the
/// `lto-cross-unit` parity case), so it is never added implicitly.
fn nvvm(cx: &Context<'_>, objects: &[JitInput<'_>], options: &[String]) -> Result<std::sync::Arc<[u8]>, Declined> {
    let mut parts: Vec<&[u8]> = objects.iter().map(|o| o.data).collect();
    let joined = options.join("\0");
    parts.push(joined.as_bytes());
    let key = cx.artifacts.key(Level::Nvvm, &parts);
    let phase = cx.obs.phase(Phase::Nvvm);
    cx.artifacts.get_or_compute(Level::Nvvm, key, &phase, || {
        let out = cx.jit_link(options, objects, true)?;
        out.ptx.ok_or_else(|| Declined::new(Reason::Tool, "nvJitLink returned no PTX"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    /// The `-kernels-used` cover: the shortest prefixes that select exactly
    /// the live kernels (nvJitLink keeps every kernel containing a string).
    #[test]
    fn kernels_used_cover_rules() {
        // (live kernels, dead kernels, the cover or None when there is none)
        type Row = (&'static [&'static str], &'static [&'static str], Option<&'static [&'static str]>);
        let rows: &[Row] = &[
            // Nothing dead: one letter per first letter.
            (&["_Z3addPf", "_Z5scalePf"], &[], Some(&["_"])),
            // A dead kernel sharing a prefix: the prefix grows until it differs.
            (&["_Z3addPf"], &["_Z5scalePf"], Some(&["_Z3"])),
            // One prefix covers a family.
            (&["cdp_a", "cdp_b", "k"], &["x"], Some(&["c", "k"])),
            // A live name contained in a dead one cannot be selected alone.
            (&["add"], &["_Z3addPf"], None),
            // Nothing live: nothing to say.
            (&[], &["a"], Some(&[])),
        ];
        for (live, dead, want) in rows {
            let got = kernels_used_cover(&set(live), &set(dead));
            match want {
                Some(w) => assert_eq!(got.unwrap(), w.iter().map(|s| s.to_string()).collect::<Vec<_>>(), "{live:?}"),
                None => assert_eq!(got.unwrap_err().reason, Reason::KernelsUsed, "{live:?}"),
            }
        }
    }

    /// Only a log of undefined references (and nvJitLink's status line) is
    /// nvlink's answer; any other message is nvlink's to print.
    #[test]
    fn undefined_reference_logs() {
        let one = "error   : Undefined reference to '_Z1fv' in 'a.o'\nERROR 9: complete\n";
        let got = undefined_references(one).unwrap();
        assert_eq!(got, vec![Diagnostic::error("Undefined reference to '_Z1fv' in 'a.o'")]);
        assert_eq!(got[0].to_string(), "nvlink error   : Undefined reference to '_Z1fv' in 'a.o'");
        let two =
            "error   : Undefined reference to 'g' in 'lib.a:b.o'\nerror   : Undefined reference to 'h' in 'b.o'\n";
        assert_eq!(undefined_references(two).unwrap().len(), 2);
        let other = "error   : Undefined reference to 'g' in 'b.o'\nerror   : Multiple definition of 'k'\n";
        assert!(undefined_references(other).is_none());
        assert!(undefined_references("ERROR 9: complete\n").is_none());
        assert!(undefined_references("").is_none());
        // The info log's stack-size warnings come first (nvlink prints them first).
        let with_warning = "warning : Stack size for entry function '_Z1kv' cannot be statically determined\n\
                            error   : Undefined reference to '_Z1fv' in 'a.o'\nERROR 9: complete\n";
        assert_eq!(
            undefined_references(with_warning).unwrap(),
            vec![
                Diagnostic::warning("Stack size for entry function '_Z1kv' cannot be statically determined"),
                Diagnostic::error("Undefined reference to '_Z1fv' in 'a.o'"),
            ]
        );
        let warning_only = "warning : Stack size for entry function '_Z1kv' cannot be statically determined\n";
        assert!(undefined_references(warning_only).is_none());
        let other_warning = "warning : something else\nerror   : Undefined reference to '_Z1fv' in 'a.o'\n";
        assert!(undefined_references(other_warning).is_none());
    }

    /// nvJitLink's info log after a link: its stack-size warnings, in order;
    /// any other line is not reproduced.
    #[test]
    fn info_log_stack_size_warnings() {
        let w = |k: &str| format!("Stack size for entry function '{k}' cannot be statically determined");
        assert!(info_log_warnings("").unwrap().is_empty());
        let log = format!("warning : {}\nwarning : {}\nwarning : {}\n", w("_Z2k2Pxi"), w("_Z2k1Pxi"), w("_Z2k1Pxi"));
        let got = info_log_warnings(&log).unwrap();
        assert_eq!(got, [w("_Z2k2Pxi"), w("_Z2k1Pxi"), w("_Z2k1Pxi")].map(Diagnostic::warning));
        assert_eq!(
            got[0].to_string(),
            "nvlink warning : Stack size for entry function '_Z2k2Pxi' cannot be statically determined"
        );
        for other in
            ["info    : something", "warning : Stack size for entry function '' cannot be statically determined"]
        {
            assert_eq!(info_log_warnings(other).unwrap_err().reason, Reason::Diagnostics, "{other}");
        }
    }

    /// How nvlink prints its stack-size warnings, by option and by whether
    /// its embedded compiler ran before the link stage.
    #[test]
    fn stack_size_messages_follow_the_options() {
        use crate::diag::Severity::{Error, Warning};
        let text = "Stack size for entry function '_Z1kv' cannot be statically determined";
        let undefined = Diagnostic::error("Undefined reference to '_Z1fv' in 'a.o'");
        // (options, compiled, the stack-size message's severity or None when dropped)
        let rows: &[(&[&str], bool, Option<crate::diag::Severity>)] = &[
            (&[], false, Some(Warning)),
            (&["-w"], false, Some(Warning)),
            (&["-Werror"], false, Some(Error)),
            (&["-Werror", "-w"], false, Some(Error)),
            (&["--disable-infos"], false, None),
            (&["--disable-infos", "-Werror"], false, None),
            (&["--suppress-stack-size-warning", "-Werror"], false, None),
            // After nvlink's embedded ptxas (PTX input, partial LTO).
            (&["-Werror"], true, Some(Warning)),
            (&["--disable-infos", "-Werror"], true, Some(Warning)),
            (&["--suppress-stack-size-warning"], true, None),
        ];
        for (options, compiled, want) in rows {
            let spec = Spec {
                disable_warnings: options.contains(&"-w"),
                warning_as_error: options.contains(&"-Werror"),
                disable_infos: options.contains(&"--disable-infos"),
                suppress_stack_size_warning: options.contains(&"--suppress-stack-size-warning"),
                ..Default::default()
            };
            let got = stack_size_messages(&spec, *compiled, vec![Diagnostic::warning(text), undefined.clone()]);
            let expected: Vec<Diagnostic> =
                want.iter().map(|s| Diagnostic::new(*s, text)).chain([undefined.clone()]).collect();
            assert_eq!(got, expected, "{options:?} compiled={compiled}");
        }
    }

    /// Whatever the cover, it keeps exactly the live kernels.
    #[test]
    fn kernels_used_cover_selects_exactly_the_live_kernels() {
        let live = set(&["_Z4gemmILi1EEvPf", "_Z4gemmILi2EEvPf", "_Z6reduceIfEvPf", "cdp_launch"]);
        let dead = set(&["_Z4gemmILi3EEvPf", "_Z6reduceIdEvPd", "cdp"]);
        let cover = kernels_used_cover(&live, &dead).unwrap();
        for k in live.iter().chain(&dead) {
            let kept = cover.iter().any(|c| k.contains(c.as_str()));
            assert_eq!(kept, live.contains(k), "{k} with cover {cover:?}");
        }
    }
}
