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
//! real nvlink. A failure inside nvJitLink (an undefined symbol) is handed to
//! nvlink as well, which then prints its own diagnostics: errors stay nvlink's.
//!
//! nvJitLink runs in a worker process ([`crate::worker`]) when the linker has
//! a worker executable. A worker that dies while linking is recorded in
//! [`Context::fault`]: the link then has no result at all (the linker answers
//! "fall back" and caches nothing), since a crash is not an nvlink answer the
//! daemon could reproduce.

use std::collections::BTreeSet;
use std::path::Path;

use rayon::prelude::*;

use super::artifacts::{Artifacts, Level};
use super::ptxas;
use crate::cli::render;
use crate::cli::spec::{Mode, Spec};
use crate::declined::{declined, Declined, Reason};
use crate::finalize::{self, Fixups};
use crate::input::cubin;
use crate::input::load::Code;
use crate::input::ptx::PtxSymbols;
use crate::jitlink::{InputType, JitInput, JitOutput};
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
    /// Longest time one ptxas run may take (the daemon's worker time limit).
    pub limit: std::time::Duration,
    /// Set when the link failed because of its environment (a worker died or
    /// was killed): the linker then gives no result.
    pub fault: &'a std::sync::Mutex<Option<String>>,
}

impl Context<'_> {
    /// One nvJitLink link, in a worker when there are workers.
    fn jit_link(&self, options: &[String], inputs: &[JitInput<'_>], want_ptx: bool) -> Result<JitOutput, Declined> {
        let Some(pool) = self.workers else {
            let jit = self.tk.jitlink().map_err(|e| Declined::new(Reason::Tool, e.to_string()))?;
            return jit
                .link(options, inputs, want_ptx)
                .map_err(|e| Declined::new(Reason::Tool, format!("nvJitLink: {e}")));
        };
        pool.link(&self.tk.jitlink_spec(), options, inputs, want_ptx, self.cancel).map_err(|e| {
            if e.is_fault() {
                let mut f = self.fault.lock().unwrap_or_else(|p| p.into_inner());
                f.get_or_insert_with(|| e.to_string());
            }
            Declined::new(if e.is_fault() { Reason::Worker } else { Reason::Tool }, format!("nvJitLink: {e}"))
        })
    }
}

/// Options whose effect the in-process engine does not reproduce (yet).
pub(crate) fn check_options(spec: &Spec) -> Result<(), Declined> {
    let checks: &[(bool, &str)] = &[
        (!spec.kernels_used.is_empty(), "--kernels-used"),
        (!spec.variables_used.is_empty(), "--variables-used"),
        (spec.preserve_relocs, "--preserve-relocs"),
        (spec.suppress_debug_info, "--suppress-debug-info"),
        (spec.link_as_tools_patch, "--link-as-tools-patch"),
        (spec.uidx_file.is_some(), "--uidx-file"),
        (spec.dump_callgraph || spec.dump_callgraph_no_demangle, "--dump-callgraph"),
        (spec.verbose || spec.verbose2, "-v"),
        (spec.time.is_some(), "-time"),
        (spec.tool_name.is_some() || spec.verbose_tkinfo.is_some(), "hidden tkinfo options"),
        (!spec.unmodelled.is_empty(), "hidden options"),
        (spec.cpu_arch.as_deref().is_some_and(|c| c != "X86_64"), "a --cpu-arch other than X86_64"),
    ];
    match checks.iter().find(|(on, _)| *on) {
        Some((_, what)) => no(Reason::Options, format!("{what} is not reproduced in process")),
        None => Ok(()),
    }
}

/// Link `plan` in process; returns the output file.
pub fn link(cx: &Context<'_>, spec: &Spec, mode: Mode, plan: &mut Plan) -> Result<Vec<u8>, Declined> {
    match mode {
        Mode::Executable | Mode::Relocatable => {}
        Mode::LtoWhole | Mode::LtoEmitPtx => return link_lto(cx, spec, mode, plan),
        _ => return no(Reason::Options, format!("{mode:?} links")),
    }
    check_options(spec)?;
    let arch = spec.arch.as_deref().unwrap_or_default();
    if !arch.starts_with("sm_") {
        return no(Reason::Arch, format!("--arch {arch}"));
    }
    compile_ptx_modules(cx, spec, plan)?;
    plan.prune(spec, mode);
    check_duplicates(plan)?;

    let mut options = vec![format!("-arch={arch}")];
    // -g: nvJitLink keeps the debug sections and, like nvlink, all of
    // libcudadevrt's code; the plan does no host-reference pruning.
    if spec.debug {
        options.push("-g".into());
    }
    if mode == Mode::Relocatable {
        options.push("-r".into());
    }
    let mut inputs = Vec::new();
    let mut functions = Vec::new();
    for unit in &plan.units {
        for m in &unit.modules {
            match &m.code {
                Code::Cubin(data) => {
                    inputs.push(JitInput { kind: InputType::Cubin, data, name: &unit.name });
                    functions.push(m.info.as_deref().map(|i| i.functions.clone()).unwrap_or_default());
                }
                Code::Ptx(_) => return no(Reason::PtxJit, "PTX left uncompiled"),
                Code::LtoObject(_) => return no(Reason::PartialLto, "LTO IR in a non-LTO link"),
            }
        }
    }
    let run = |extra: &[String]| -> Result<Vec<u8>, Declined> {
        let mut opts = options.clone();
        opts.extend_from_slice(extra);
        let out = tracing::debug_span!("jitlink").in_scope(|| cx.jit_link(&opts, &inputs, false))?;
        out.cubin.ok_or_else(|| Declined::new(Reason::Tool, "nvJitLink returned no cubin"))
    };
    let pruning = plan.pruning.as_ref().filter(|p| p.removes_anything());
    let cubin = match pruning {
        None => run(&[])?,
        Some(p) => {
            if p.live_kernels.is_empty() {
                return no(Reason::KernelsUsed, "host references keep no kernel");
            }
            let cover = kernels_used_cover(&p.live_kernels, &p.dead_kernels)?;
            let cubin = run(&cover.iter().map(|k| format!("-kernels-used={k}")).collect::<Vec<_>>())?;
            // nvlink and nvJitLink must agree on what survives.
            let kept =
                cubin::read(&cubin).map_err(|e| Declined::new(Reason::Tool, format!("nvJitLink output: {e}")))?;
            let kept: BTreeSet<String> = kept.functions.into_iter().map(|f| f.name).collect();
            if kept != p.live_functions {
                return no(Reason::SafetyNet, "nvJitLink kept different device code than host-reference pruning");
            }
            cubin
        }
    };
    let fix = Fixups {
        linker_entry: Some(render::linker_entry(&spec.parsed, &cx.tk.release)),
        inputs: if pruning.is_some() { functions } else { Vec::new() },
    };
    let _phase = tracing::debug_span!("finalize").entered();
    finalize::finalize(&cubin, &fix).map_err(|e| Declined::new(Reason::Tool, format!("finalize: {e}")))
}

/// Compile every PTX module of the plan to a relocatable cubin, as nvlink's
/// embedded ptxas does at link time: in parallel, each cached by its text.
fn compile_ptx_modules(cx: &Context<'_>, spec: &Spec, plan: &mut Plan) -> Result<(), Declined> {
    let has_ptx = plan.units.iter().flat_map(|u| &u.modules).any(|m| matches!(m.code, Code::Ptx(_)));
    if !has_ptx {
        return Ok(());
    }
    if spec.maxrregcount.is_some()
        || !spec.xptxas.is_empty()
        || spec.ofast_compile.is_some()
        || spec.debug
        || spec.device_stack_protector.is_some()
    {
        return no(Reason::PtxJit, "ptxas options (or -g) for PTX compiled at link time");
    }
    let Some(target) = spec.target() else { return no(Reason::Arch, format!("--arch {:?}", spec.arch)) };
    let args = vec![format!("-arch={}", target.jit_arch()), "-m64".to_owned(), "-c".to_owned()];
    let modules: Vec<&mut crate::input::load::Module> =
        plan.units.iter_mut().flat_map(|u| u.modules.iter_mut()).collect();
    // Each module is compiled on the pool, inside the link's span.
    let link = tracing::Span::current();
    modules.into_par_iter().enumerate().try_for_each(|(i, m)| {
        let Code::Ptx(text) = &m.code else { return Ok(()) };
        let _phase = link.in_scope(|| tracing::debug_span!("jit", module = i, cached = false)).entered();
        let key = cx.artifacts.key(Level::Jit, &[text, args.join(" ").as_bytes()]);
        let bytes = cx
            .artifacts
            .get_or_compute(Level::Jit, key, || ptxas::compile(cx.tk, text, &args, cx.scratch, cx.cancel, cx.limit))?;
        let info = cubin::read(&bytes).map_err(|e| Declined::new(Reason::Tool, format!("ptxas output: {e}")))?;
        m.code = Code::Cubin(bytes);
        m.info = Some(std::sync::Arc::new(info));
        Ok(())
    })
}

/// nvJitLink accepts some duplicate definitions nvlink rejects; leave those
/// links (and nvlink's "Multiple definition" messages) to nvlink.
fn check_duplicates(plan: &Plan) -> Result<(), Declined> {
    let mut strong = std::collections::HashSet::new();
    for info in plan.units.iter().flat_map(|u| &u.modules).filter_map(|m| m.info.as_deref()) {
        for name in info.defined.iter().filter(|d| !info.weak.contains(d)) {
            if !strong.insert(name.as_str()) {
                return no(Reason::Diagnostics, format!("{name} is defined more than once"));
            }
        }
    }
    Ok(())
}

/// A short list of `-kernels-used` strings selecting exactly `live`.
///
/// nvJitLink keeps every kernel whose name contains one of the strings, and it
/// takes about 2 ms per string; so each live kernel not yet covered adds the
/// shortest prefix of its name that no dead kernel contains (one prefix usually
/// covers a whole family, e.g. libcudadevrt's kernels).
pub(crate) fn kernels_used_cover(live: &BTreeSet<String>, dead: &BTreeSet<String>) -> Result<Vec<String>, Declined> {
    let mut cover: Vec<String> = Vec::new();
    for k in live {
        if cover.iter().any(|c| k.contains(c.as_str())) {
            continue;
        }
        let safe = |p: &str| !dead.iter().any(|d| d.contains(p));
        let prefix =
            (1..=k.len()).filter(|&n| k.is_char_boundary(n)).map(|n| &k[..n]).find(|p| safe(p)).ok_or_else(|| {
                Declined::new(Reason::KernelsUsed, format!("kernel name {k} is contained in a removed kernel's name"))
            })?;
        cover.push(prefix.to_owned());
    }
    Ok(cover)
}

/// Functions and variables a whole program may leave to the driver.
const SYSTEM_EXTERNS: &[&str] = &["vprintf", "malloc", "free", "__assertfail"];

/// Whole-program LTO (`-dlto`) and `-dlto --emit-ptx`, when every linked unit is
/// LTO IR and the LTO modules form a closed program (nothing left for
/// libcudadevrt or non-LTO code: that is nvlink's partial LTO).
///
/// nvlink hands the host references to NVVM (`-host-ref-*`); nvJitLink's
/// `-kernels-used` (the host-referenced kernels) and `-optimize-unused-variables`
/// (no variable is host-referenced) tell it the same. NVVM's PTX is then
/// compiled by ptxas as a whole program: that cubin, tool note included, is
/// nvlink's output byte for byte.
fn link_lto(cx: &Context<'_>, spec: &Spec, mode: Mode, plan: &Plan) -> Result<Vec<u8>, Declined> {
    check_options(spec)?;
    check_lto_options(spec)?;
    let arch = spec.arch.as_deref().unwrap_or_default();
    let (objects, symbols) = lto_program(mode, plan)?;
    let mut options = vec![format!("-arch={arch}"), "-lto".to_owned(), "-ptx".to_owned()];
    // Host information as nvlink uses it: an object without device code (a
    // host-only object, libcudart_static's members) turns it off, as in a
    // non-LTO link, and NVVM then keeps every kernel and variable.
    if plan.uses_host_info(spec) {
        options.extend(host_ref_options(plan, &symbols)?);
    }
    let ptx = nvvm(cx, &objects, &options)?;
    if mode == Mode::LtoEmitPtx {
        return Ok(ptx.to_vec());
    }
    // ptxas: the whole program to the final cubin.
    let args = vec![format!("-arch={arch}"), "-m64".to_owned()];
    let key = cx.artifacts.key(Level::Ptxas, &[&ptx, args.join(" ").as_bytes()]);
    let _phase = tracing::debug_span!("ptxas", ptx_bytes = ptx.len(), cached = false).entered();
    let cubin = cx
        .artifacts
        .get_or_compute(Level::Ptxas, key, || ptxas::compile(cx.tk, &ptx, &args, cx.scratch, cx.cancel, cx.limit))?;
    Ok(cubin.to_vec())
}

/// Options nvlink forwards to NVVM or ptxas under `-dlto`: not reproduced yet.
fn check_lto_options(spec: &Spec) -> Result<(), Declined> {
    let lto_options: &[(bool, &str)] = &[
        (!spec.xnvvm.is_empty(), "-Xnvvm"),
        (!spec.xptxas.is_empty(), "-Xptxas"),
        (spec.maxrregcount.is_some(), "--maxrregcount"),
        (spec.ofast_compile.is_some(), "--Ofast-compile"),
        (spec.split_compile.is_some() || spec.split_compile_extended.is_some(), "split compilation"),
        (spec.nvvm_latest, "--nvvm-latest"),
        (spec.force_whole_lto || spec.force_partial_lto, "forced LTO kind"),
        (spec.debug, "-g"),
        (spec.keep_system_libraries, "--keep-system-libraries"),
        (spec.device_stack_protector.is_some(), "--device-stack-protector"),
    ];
    match lto_options.iter().find(|(on, _)| *on) {
        Some((_, what)) => no(Reason::LtoOptions, format!("{what} with -dlto is not reproduced in process")),
        None => Ok(()),
    }
}

/// The LTO modules of a whole program and their symbols: every linked unit is
/// LTO IR, libcudadevrt was found (unless `--emit-ptx`), and the modules close
/// over each other (anything else is nvlink's partial LTO).
fn lto_program(mode: Mode, plan: &Plan) -> Result<(Vec<JitInput<'_>>, Vec<&PtxSymbols>), Declined> {
    let mut objects = Vec::new();
    let mut symbols = Vec::new();
    for unit in plan.units.iter().filter(|u| !u.modules.is_empty()) {
        for m in &unit.modules {
            match (&m.code, &m.lto) {
                (Code::LtoObject(data), Some(syms)) => {
                    objects.push(JitInput { kind: InputType::Object, data, name: &unit.name });
                    symbols.push(syms);
                }
                _ => return no(Reason::PartialLto, "partial LTO (non-LTO device code in an LTO link)"),
            }
        }
    }
    if objects.is_empty() {
        return no(Reason::PartialLto, "-dlto without LTO objects");
    }
    if mode == Mode::LtoWhole && !plan.system_library_found {
        return no(Reason::PartialLto, "whole-program LTO without libcudadevrt");
    }
    // A closed program: every extern is defined by an LTO module.
    let defined: std::collections::HashSet<&str> = symbols
        .iter()
        .flat_map(|s| s.functions.iter().chain(&s.variables).chain(&s.kernels))
        .map(String::as_str)
        .collect();
    if let Some(open) = symbols
        .iter()
        .flat_map(|s| &s.externs)
        .find(|e| !defined.contains(e.as_str()) && !SYSTEM_EXTERNS.contains(&e.as_str()))
    {
        return no(Reason::PartialLto, format!("{open} is not defined by the LTO modules (partial LTO)"));
    }
    Ok((objects, symbols))
}

/// nvlink's host references as nvJitLink options: the host-referenced kernels
/// as a `-kernels-used` cover, and `-optimize-unused-variables` (no device
/// variable may be host-referenced: those are left to nvlink).
fn host_ref_options(plan: &Plan, symbols: &[&PtxSymbols]) -> Result<Vec<String>, Declined> {
    let refs: Vec<&crate::input::host::HostRefs> = plan.units.iter().filter_map(|u| u.host_refs.as_ref()).collect();
    if refs.iter().any(|r| {
        !(r.variables_external.is_empty()
            && r.variables_internal.is_empty()
            && r.constants_external.is_empty()
            && r.constants_internal.is_empty())
    }) {
        return no(Reason::LtoOptions, "host-referenced device variables with -dlto");
    }
    let patterns: Vec<&str> = refs.iter().flat_map(|r| r.kernel_patterns()).collect();
    let all: BTreeSet<String> = symbols.iter().flat_map(|s| s.kernels.iter().cloned()).collect();
    let live: BTreeSet<String> =
        all.iter().filter(|k| patterns.iter().any(|p| crate::input::host::glob_match(p, k))).cloned().collect();
    if live.is_empty() {
        return no(Reason::KernelsUsed, "host references keep no kernel");
    }
    let dead: BTreeSet<String> = all.difference(&live).cloned().collect();
    let mut options: Vec<String> =
        kernels_used_cover(&live, &dead)?.into_iter().map(|k| format!("-kernels-used={k}")).collect();
    options.push("-optimize-unused-variables".to_owned());
    Ok(options)
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
    let _phase = tracing::debug_span!("nvvm", cached = false).entered();
    cx.artifacts.get_or_compute(Level::Nvvm, key, || {
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
