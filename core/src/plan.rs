//! The link plan: which device code goes into the link, in which order, and
//! what nvlink's host-reference pruning keeps.
//!
//! Inputs are taken in command-line order, then the `-l` libraries in `-l`
//! order (wherever they sit in argv). An archive contributes all its members,
//! once however often it is named; libcudadevrt contributes only what resolves
//! an undefined symbol. Host-reference pruning applies when linking
//! an executable (not `-r`, not `--ignore-host-info`) and every unit outside
//! libcudadevrt carries `.nvHR*` sections; the kernels kept are those matching
//! a host pattern of any unit.

use std::collections::{BTreeSet, HashSet};

use crate::cli::spec::{Mode, Spec};
use crate::diag::Diagnostic;
use crate::input::host::glob_match;
use crate::input::libsearch;
use crate::input::load::{select_members, InputItem, Library, LoadContext, LoadError, Unit};

#[derive(Debug)]
pub struct Plan {
    /// Units in link order.
    pub units: Vec<Unit>,
    /// Kernels kept by host-reference pruning; `None` when pruning does not apply.
    pub live_kernels: Option<BTreeSet<String>>,
    /// Messages nvlink prints while reading the inputs.
    pub infos: Vec<Diagnostic>,
}

impl Plan {
    /// All kernels defined by the units.
    pub fn kernels(&self) -> BTreeSet<String> {
        self.units
            .iter()
            .flat_map(|u| &u.modules)
            .filter_map(|m| m.info.as_ref())
            .flat_map(|i| i.kernels.iter().cloned())
            .collect()
    }
}

pub fn build(
    spec: &Spec,
    mode: Mode,
    ctx: &LoadContext<'_>,
    env_library_path: Option<&str>,
) -> Result<Plan, LoadError> {
    let mut units = Vec::new();
    let mut seen_archives = HashSet::new();
    for input in &spec.inputs {
        match ctx.input(input)? {
            InputItem::Unit(u) => units.push(u),
            InputItem::Library(l) => {
                if seen_archives.insert(l.path.clone()) {
                    add_library(&mut units, l, spec.keep_system_libraries);
                }
            }
            InputItem::Nothing => {}
        }
    }
    let dirs = libsearch::search_dirs(ctx.cwd, &spec.library_paths, env_library_path);
    for name in &spec.libraries {
        if let Some(lib) = ctx.library(name, &dirs)? {
            if seen_archives.insert(lib.path.clone()) {
                add_library(&mut units, lib, spec.keep_system_libraries);
            }
        }
    }
    let prune = mode == Mode::Executable
        && !spec.ignore_host_info
        && units.iter().filter(|u| !u.is_cudadevrt).all(|u| u.host_refs.is_some());
    let live_kernels = prune.then(|| {
        let patterns: Vec<&str> =
            units.iter().filter_map(|u| u.host_refs.as_ref()).flat_map(|h| h.kernel_patterns()).collect();
        units
            .iter()
            .flat_map(|u| &u.modules)
            .filter_map(|m| m.info.as_ref())
            .flat_map(|i| i.kernels.iter())
            .filter(|k| patterns.iter().any(|p| glob_match(p, k)))
            .cloned()
            .collect()
    });
    // Only a link that registers its binaries warns about device-only inputs.
    let infos = units
        .iter()
        .filter(|u| u.device_only && spec.register_link_binaries.is_some())
        .map(|u| {
            Diagnostic::info(format!(
                "Input '{}' has no host code, which could cause later host link error if there is a reference to it",
                u.name
            ))
        })
        .collect();
    Ok(Plan { units, live_kernels, infos })
}

/// nvlink links every member of an archive, except that the CUDA device
/// runtime (a "system library") contributes only what resolves an undefined
/// symbol, unless `--keep-system-libraries`.
fn add_library(units: &mut Vec<Unit>, lib: Library, keep_system: bool) {
    if lib.is_system() && !keep_system {
        let chosen = select_members(units, lib);
        units.extend(chosen);
    } else {
        units.extend(lib.members);
    }
}
