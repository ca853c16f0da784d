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
    ];
    match checks.iter().find(|(on, _)| *on) {
        Some((_, what)) => no(format!("{what} is not reproduced in process")),
        None => Ok(()),
    }
}

/// Link `plan` in process; returns the output file.
pub fn link(tk: &Toolkit, spec: &Spec, mode: Mode, plan: &Plan) -> Result<Vec<u8>, Unsupported> {
    if !matches!(mode, Mode::Executable | Mode::Relocatable) {
        return no(format!("{mode:?} links"));
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
                    if plan.live_kernels.is_some() {
                        return no("host-reference pruning with PTX compiled at link time");
                    }
                    if spec.maxrregcount.is_some() || !spec.xptxas.is_empty() || spec.ofast_compile.is_some() {
                        return no("ptxas options for PTX compiled at link time");
                    }
                    inputs.push(JitInput { kind: InputType::Ptx, data, name: &unit.name });
                    ptxas_entries.push(jit_ptxas_entry(tk, arch));
                }
                Code::LtoIr(_) => return no("LTO IR"),
            }
        }
    }
    check_duplicates(plan)?;
    let jit = tk.jitlink().map_err(|e| Unsupported(e.to_string()))?;
    let run = |extra: &[String]| -> Result<Vec<u8>, Unsupported> {
        let mut opts = options.clone();
        opts.extend_from_slice(extra);
        let out = jit.link(&opts, &inputs, false).map_err(|e| Unsupported(format!("nvJitLink: {e}")))?;
        out.cubin.ok_or_else(|| Unsupported("nvJitLink returned no cubin".into()))
    };
    let cubin = match &plan.live_kernels {
        None => run(&[])?,
        Some(roots) => {
            let all = plan.kernels();
            if roots.is_empty() && !all.is_empty() {
                return no("host references keep no kernel");
            }
            // Pass 1: nvJitLink keeps the host-referenced kernels and whatever
            // device code reaches; the kernels in its output are the live set.
            let flags = |set: &BTreeSet<String>| set.iter().map(|k| format!("-kernels-used={k}")).collect::<Vec<_>>();
            let first = if roots.len() < all.len() { run(&flags(roots))? } else { run(&[])? };
            let live = output_kernels(&first)?;
            // nvJitLink matches -kernels-used by substring: a kept name inside a
            // removed one would keep that one too.
            for dead in all.difference(&live) {
                if live.iter().any(|l| dead.contains(l.as_str())) {
                    return no(format!("kernel name {dead} contains a kept kernel's name"));
                }
            }
            // nvlink lays out as if it had known the live set up front: pass 2
            // with the complete set (or none, when nothing is dead).
            if live == *roots || (roots.len() == all.len() && live == all) {
                first
            } else if live.len() == all.len() {
                run(&[])?
            } else {
                run(&flags(&live))?
            }
        }
    };
    let fix = Fixups {
        linker_entry: render::linker_entry(&spec.parsed, &tk.release),
        ptxas_entries,
        inputs: if plan.live_kernels.is_some() { functions } else { Vec::new() },
    };
    finalize::finalize(&cubin, &fix).map_err(|e| Unsupported(format!("finalize: {e}")))
}

/// The kernels (entry functions) defined in a linked cubin.
fn output_kernels(cubin: &[u8]) -> Result<BTreeSet<String>, Unsupported> {
    let info = crate::input::cubin::read(cubin).map_err(|e| Unsupported(format!("nvJitLink output: {e}")))?;
    Ok(info.kernels.into_iter().collect())
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
