//! The in-process engine: libnvJitLink links the plan, the finalizer turns its
//! cubin into nvlink's bytes.
//!
//! [`supports`] decides up front whether a plan is one this engine reproduces
//! exactly (the cases the parity tests pin down); the linker sends every other
//! plan to the real nvlink. A failure inside nvJitLink (an undefined symbol, a
//! duplicate definition) is also handed to nvlink, which then prints its own
//! diagnostics: errors stay nvlink's, word for word.

use std::collections::BTreeSet;

use crate::cli::render;
use crate::cli::spec::{Mode, Spec};
use crate::finalize::{self, Fixups};
use crate::input::load::Code;
use crate::jitlink::{InputType, JitInput};
use crate::plan::Plan;
use crate::toolkit::Toolkit;

/// Why a plan goes to the real nvlink instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsupported(pub String);

fn no<T>(why: impl Into<String>) -> Result<T, Unsupported> {
    Err(Unsupported(why.into()))
}

/// Options whose effect the in-process engine does not reproduce (yet).
pub fn check_options(spec: &Spec) -> Result<(), Unsupported> {
    let checks: &[(bool, &str)] = &[
        (!spec.kernels_used.is_empty(), "--kernels-used"),
        (!spec.variables_used.is_empty(), "--variables-used"),
        (spec.preserve_relocs, "--preserve-relocs"),
        (spec.link_as_tools_patch, "--link-as-tools-patch"),
        (spec.debug, "-g"),
        (spec.uidx_file.is_some(), "--uidx-file"),
        (spec.dump_callgraph || spec.dump_callgraph_no_demangle, "--dump-callgraph"),
        (spec.verbose || spec.verbose2, "-v"),
        (spec.time.is_some(), "-time"),
        (spec.use_host_info, "--use-host-info"),
        (spec.keep_system_libraries, "--keep-system-libraries"),
        (spec.tool_name.is_some() || spec.verbose_tkinfo.is_some(), "hidden tkinfo options"),
        (!spec.unmodelled.is_empty(), "hidden options"),
        (spec.device_stack_protector.is_some(), "--device-stack-protector"),
        (spec.cpu_arch.as_deref().is_some_and(|c| c != "X86_64"), "a --cpu-arch other than X86_64"),
    ];
    match checks.iter().find(|(on, _)| *on) {
        Some((_, what)) => no(format!("{what} is not reproduced in process")),
        None => Ok(()),
    }
}

/// Link `plan` in process; returns the output file.
pub fn link(tk: &Toolkit, spec: &Spec, mode: Mode, plan: &Plan) -> Result<Vec<u8>, Unsupported> {
    match mode {
        Mode::Executable | Mode::Relocatable => {}
        Mode::LtoWhole | Mode::LtoEmitPtx => return link_lto(tk, spec, mode, plan),
        _ => return no(format!("{mode:?} links")),
    }
    check_options(spec)?;
    let arch = spec.arch.as_deref().unwrap_or_default();
    if !arch.starts_with("sm_") {
        return no(format!("--arch {arch}"));
    }
    let mut options = vec![format!("-arch={arch}")];
    if mode == Mode::Relocatable {
        options.push("-r".into());
    }
    let mut inputs = Vec::new();
    let mut functions = Vec::new();
    let mut ptxas_entries = Vec::new();
    for unit in &plan.units {
        for m in &unit.modules {
            match &m.code {
                Code::Cubin(data) => {
                    inputs.push(JitInput { kind: InputType::Cubin, data, name: &unit.name });
                    functions.push(m.info.as_ref().map(|i| i.functions.clone()).unwrap_or_default());
                }
                Code::Ptx(data) => {
                    if plan.pruning.is_some() {
                        return no("host-reference pruning with PTX compiled at link time");
                    }
                    if spec.maxrregcount.is_some() || !spec.xptxas.is_empty() || spec.ofast_compile.is_some() {
                        return no("ptxas options for PTX compiled at link time");
                    }
                    inputs.push(JitInput { kind: InputType::Ptx, data, name: &unit.name });
                    ptxas_entries.push(jit_ptxas_entry(tk, arch));
                }
                Code::LtoObject(_) => return no("LTO IR in a non-LTO link"),
            }
        }
    }
    check_duplicates(plan)?;
    let t_jit = std::time::Instant::now();
    let jit = tk.jitlink().map_err(|e| Unsupported(e.to_string()))?;
    let run = |extra: &[String]| -> Result<Vec<u8>, Unsupported> {
        let mut opts = options.clone();
        opts.extend_from_slice(extra);
        let out = jit.link(&opts, &inputs, false).map_err(|e| Unsupported(format!("nvJitLink: {e}")))?;
        out.cubin.ok_or_else(|| Unsupported("nvJitLink returned no cubin".into()))
    };
    let pruning = plan.pruning.as_ref().filter(|p| p.removes_anything());
    let cubin = match pruning {
        None => run(&[])?,
        Some(p) => {
            if p.live_kernels.is_empty() {
                return no("host references keep no kernel");
            }
            let cover = kernels_used_cover(&p.live_kernels, &p.dead_kernels)?;
            let cubin = run(&cover.iter().map(|k| format!("-kernels-used={k}")).collect::<Vec<_>>())?;
            // nvlink and nvJitLink must agree on what survives.
            let kept = crate::input::cubin::read(&cubin).map_err(|e| Unsupported(format!("nvJitLink output: {e}")))?;
            let kept: BTreeSet<String> = kept.functions.into_iter().map(|f| f.name).collect();
            if kept != p.live_functions {
                return no("nvJitLink kept different device code than host-reference pruning");
            }
            cubin
        }
    };
    tracing::debug!(jit_ms = t_jit.elapsed().as_secs_f64() * 1e3, "nvJitLink done");
    let fix = Fixups {
        linker_entry: Some(render::linker_entry(&spec.parsed, &tk.release)),
        ptxas_entries,
        inputs: if pruning.is_some() { functions } else { Vec::new() },
        ptxas_written: false,
    };
    finalize::finalize(&cubin, &fix).map_err(|e| Unsupported(format!("finalize: {e}")))
}

/// nvJitLink accepts some duplicate definitions nvlink rejects; leave those
/// links (and nvlink's "Multiple definition" messages) to nvlink.
fn check_duplicates(plan: &Plan) -> Result<(), Unsupported> {
    let mut strong = std::collections::HashSet::new();
    for info in plan.units.iter().flat_map(|u| &u.modules).filter_map(|m| m.info.as_ref()) {
        for name in info.defined.iter().filter(|d| !info.weak.contains(d)) {
            if !strong.insert(name.as_str()) {
                return no(format!("{name} is defined more than once"));
            }
        }
    }
    Ok(())
}

/// The tool entry nvlink's embedded ptxas writes for PTX it compiles at link time.
fn jit_ptxas_entry(tk: &Toolkit, arch: &str) -> crate::finalize::tkinfo::Entry {
    crate::finalize::tkinfo::Entry {
        object: String::new(),
        tool: "ptxas".into(),
        release: tk.release.tools_line.clone(),
        build: tk.release.build_line.clone(),
        options: format!("-arch {arch} -m 64 -c  "),
    }
}

/// A short list of `-kernels-used` strings selecting exactly `live`.
///
/// nvJitLink keeps every kernel whose name contains one of the strings, and it
/// takes about 2 ms per string; so each live kernel not yet covered adds the
/// shortest prefix of its name that no dead kernel contains (one prefix usually
/// covers a whole family, e.g. libcudadevrt's kernels).
pub fn kernels_used_cover(live: &BTreeSet<String>, dead: &BTreeSet<String>) -> Result<Vec<String>, Unsupported> {
    let mut cover: Vec<String> = Vec::new();
    for k in live {
        if cover.iter().any(|c| k.contains(c.as_str())) {
            continue;
        }
        let safe = |p: &str| !dead.iter().any(|d| d.contains(p));
        let prefix = (1..=k.len())
            .filter(|&n| k.is_char_boundary(n))
            .map(|n| &k[..n])
            .find(|p| safe(p))
            .ok_or_else(|| Unsupported(format!("kernel name {k} is contained in a removed kernel's name")))?;
        cover.push(prefix.to_owned());
    }
    // A prefix chosen for one kernel must not select a dead one (checked) and
    // must cover only live ones: anything it matches is live or absent.
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
/// (no variable is host-referenced) tell it the same. The output carries the
/// single tool entry of nvlink's embedded ptxas and no entry of nvlink's own.
fn link_lto(tk: &Toolkit, spec: &Spec, mode: Mode, plan: &Plan) -> Result<Vec<u8>, Unsupported> {
    check_options(spec)?;
    let lto_options: &[(bool, &str)] = &[
        (!spec.xnvvm.is_empty(), "-Xnvvm"),
        (!spec.xptxas.is_empty(), "-Xptxas"),
        (spec.maxrregcount.is_some(), "--maxrregcount"),
        (spec.ofast_compile.is_some(), "--Ofast-compile"),
        (spec.split_compile.is_some() || spec.split_compile_extended.is_some(), "split compilation"),
        (spec.nvvm_latest, "--nvvm-latest"),
        (spec.force_whole_lto || spec.force_partial_lto, "forced LTO kind"),
    ];
    if let Some((_, what)) = lto_options.iter().find(|(on, _)| *on) {
        return no(format!("{what} with -dlto is not reproduced in process"));
    }
    let arch = spec.arch.as_deref().unwrap_or_default();
    let mut objects = Vec::new();
    let mut symbols = Vec::new();
    for unit in plan.units.iter().filter(|u| !u.modules.is_empty()) {
        for m in &unit.modules {
            match (&m.code, &m.lto) {
                (Code::LtoObject(data), Some(syms)) => {
                    objects.push(JitInput { kind: InputType::Object, data, name: &unit.name });
                    symbols.push(syms);
                }
                _ => return no("partial LTO (non-LTO device code in an LTO link)"),
            }
        }
    }
    if objects.is_empty() {
        return no("-dlto without LTO objects");
    }
    if mode == Mode::LtoWhole && !plan.system_library_found {
        return no("whole-program LTO without libcudadevrt");
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
        return no(format!("{open} is not defined by the LTO modules (partial LTO)"));
    }
    let mut options = vec![format!("-arch={arch}"), "-lto".to_owned()];
    let host_info =
        !spec.ignore_host_info && plan.units.iter().filter(|u| !u.modules.is_empty()).all(|u| u.host_refs.is_some());
    if host_info {
        let refs: Vec<&crate::input::host::HostRefs> = plan.units.iter().filter_map(|u| u.host_refs.as_ref()).collect();
        if refs.iter().any(|r| {
            !(r.variables_external.is_empty()
                && r.variables_internal.is_empty()
                && r.constants_external.is_empty()
                && r.constants_internal.is_empty())
        }) {
            return no("host-referenced device variables with -dlto");
        }
        let patterns: Vec<&str> = refs.iter().flat_map(|r| r.kernel_patterns()).collect();
        let all: BTreeSet<String> = symbols.iter().flat_map(|s| s.kernels.iter().cloned()).collect();
        let live: BTreeSet<String> =
            all.iter().filter(|k| patterns.iter().any(|p| crate::input::host::glob_match(p, k))).cloned().collect();
        if live.is_empty() {
            return no("host references keep no kernel");
        }
        let dead: BTreeSet<String> = all.difference(&live).cloned().collect();
        options.extend(kernels_used_cover(&live, &dead)?.into_iter().map(|k| format!("-kernels-used={k}")));
        options.push("-optimize-unused-variables".to_owned());
    }
    let jit = tk.jitlink().map_err(|e| Unsupported(e.to_string()))?;
    if mode == Mode::LtoEmitPtx {
        options.push("-ptx".to_owned());
        let out = jit.link(&options, &objects, true).map_err(|e| Unsupported(format!("nvJitLink: {e}")))?;
        return out.ptx.ok_or_else(|| Unsupported("nvJitLink returned no PTX".into()));
    }
    let out = jit.link(&options, &objects, false).map_err(|e| Unsupported(format!("nvJitLink: {e}")))?;
    let cubin = out.cubin.ok_or_else(|| Unsupported("nvJitLink returned no cubin".into()))?;
    let fix = Fixups {
        linker_entry: None,
        ptxas_entries: vec![crate::finalize::tkinfo::Entry {
            object: String::new(),
            tool: "ptxas".into(),
            release: tk.release.tools_line.clone(),
            build: tk.release.build_line.clone(),
            options: format!("-arch {arch} -m 64 "),
        }],
        inputs: Vec::new(),
        ptxas_written: true,
    };
    finalize::finalize(&cubin, &fix).map_err(|e| Unsupported(format!("finalize: {e}")))
}
