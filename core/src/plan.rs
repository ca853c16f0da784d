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
//!
//! An object without device code — a `g++ -c` object, a non-rdc `nvcc -c`
//! object, the members of `libcudart_static.a` that CMake adds to every device
//! link — carries no host references, and its host code might launch anything:
//! nvlink then prunes nothing, whether the object is named on the command line
//! or sits in an archive, and under `-dlto` as well (it hands NVVM no host
//! references: the output equals `--ignore-host-info`'s byte for byte).

use std::collections::{BTreeSet, HashMap, HashSet};

use rayon::prelude::*;

use crate::cli::spec::{Mode, Spec};
use crate::diag::Diagnostic;
use crate::input::cubin::CubinInfo;
use crate::input::host::glob_match;
use crate::input::libsearch;
use crate::input::load::{select_members, InputItem, Library, LoadContext, LoadError, Unit};

#[derive(Debug)]
pub struct Plan {
    /// Units in link order.
    pub units: Vec<Unit>,
    /// What host-reference pruning keeps; `None` when pruning does not apply.
    pub pruning: Option<Pruning>,
    /// Warnings nvlink prints while reading the inputs (`-w` does not hide them).
    pub warnings: Vec<Diagnostic>,
    /// Infos printed with `--register-link-binaries` (not filtered either).
    pub notes: Vec<Diagnostic>,
    /// A system library (a path containing `cudadevrt`) was loaded, whether or
    /// not any of it is linked.
    pub system_library_found: bool,
    /// An archive had members without device code (skipped, but they turn
    /// host-reference pruning off).
    pub codeless_archive_members: bool,
}

impl Plan {
    /// Module ids for `--register-link-binaries`, in load order.
    pub(crate) fn module_ids(&self) -> Vec<String> {
        self.units.iter().flat_map(|u| u.module_ids.iter().cloned()).collect()
    }

    /// All kernels defined by the units.
    pub fn kernels(&self) -> BTreeSet<String> {
        self.units
            .iter()
            .flat_map(|u| &u.modules)
            .filter_map(|m| m.info.as_deref())
            .flat_map(|i| i.kernels.iter().cloned())
            .collect()
    }
}

pub fn build(spec: &Spec, ctx: &LoadContext<'_>, env_library_path: Option<&str>) -> Result<Plan, LoadError> {
    if spec.inputs.is_empty() {
        if !spec.libraries.is_empty() {
            return Err(Diagnostic::fatal("No input files specified; use option --help for more information").into());
        }
        return Err(LoadError::Declined(crate::declined::Declined::new(
            crate::declined::Reason::Diagnostics,
            "no input files",
        )));
    }
    let mut units = Vec::new();
    let mut warnings = Vec::new();
    let mut seen_archives = HashSet::new();
    let mut skipped_host_objects = false;
    let mut system_library_found = false;
    // Inputs and libraries are decoded in parallel, then taken in command-line
    // order: the first error in that order stands, as if they had been decoded
    // one after another. On rayon's global pool, not the `--jobs` pool whose
    // threads wait on worker processes (the files were read for the key or
    // prefetched: decoding waits on nothing).
    let inputs: Vec<_> = spec.inputs.par_iter().map(|input| ctx.input(input)).collect();
    let dirs = libsearch::search_dirs(&spec.library_paths, env_library_path);
    let libraries: Vec<_> = spec.libraries.par_iter().map(|name| ctx.library(name, &dirs)).collect();
    for loaded in inputs {
        let loaded = loaded?;
        warnings.extend(loaded.warnings);
        match loaded.item {
            InputItem::Unit(u) => units.push(u),
            InputItem::Library(l) => {
                skipped_host_objects |= l.skipped_host_objects;
                system_library_found |= l.is_system();
                if seen_archives.insert(l.path.clone()) {
                    add_library(&mut units, l, spec.keep_system_libraries);
                }
            }
            InputItem::Nothing => {}
        }
    }
    for loaded in libraries {
        let loaded = loaded?;
        warnings.extend(loaded.warnings);
        if let Some(lib) = loaded.item {
            skipped_host_objects |= lib.skipped_host_objects;
            system_library_found |= lib.is_system();
            if seen_archives.insert(lib.path.clone()) {
                add_library(&mut units, lib, spec.keep_system_libraries);
            }
        }
    }
    // Only a link that registers its binaries mentions device-only inputs; and
    // --disable-infos does not silence it.
    let notes = units
        .iter()
        .filter(|u| u.device_only && spec.register_link_binaries.is_some())
        .map(|u| {
            Diagnostic::info(format!(
                "Input '{}' has no host code, which could cause later host link error if there is a reference to it",
                u.name
            ))
        })
        .collect();
    Ok(Plan {
        units,
        pruning: None,
        warnings,
        notes,
        system_library_found,
        codeless_archive_members: skipped_host_objects,
    })
}

impl Plan {
    /// Whether nvlink uses the host references of this link (to prune, or under
    /// `-dlto` to tell NVVM what the host uses): without `--ignore-host-info`,
    /// if every unit outside libcudadevrt carries host-reference sections —
    /// code-less host objects included, named or in an archive.
    pub(crate) fn uses_host_info(&self, spec: &Spec) -> bool {
        // A debug link (-g) keeps every kernel, as nvlink does.
        !spec.debug
            && !spec.ignore_host_info
            && !self.codeless_archive_members
            && self.units.iter().filter(|u| !u.is_cudadevrt).all(|u| u.host_refs.is_some())
    }

    /// Whether nvlink removes device code the host does not reference: when
    /// linking an executable with host information (see [`Self::uses_host_info`]).
    fn prunes(&self, spec: &Spec, mode: Mode) -> bool {
        mode == Mode::Executable && self.uses_host_info(spec)
    }

    /// Decide what pruning keeps; every module must be a cubin by now (PTX
    /// compiled), since liveness follows the cubins' relocations.
    pub(crate) fn prune(&mut self, spec: &Spec, mode: Mode) {
        self.pruning = self.prunes(spec, mode).then(|| {
            let patterns: Vec<&str> =
                self.units.iter().filter_map(|u| u.host_refs.as_ref()).flat_map(|h| h.kernel_patterns()).collect();
            liveness(&self.units, &patterns)
        });
    }
}

/// Device code that survives host-reference pruning.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pruning {
    pub live_kernels: BTreeSet<String>,
    pub dead_kernels: BTreeSet<String>,
    /// Names of the functions (kernels included) that survive.
    pub live_functions: BTreeSet<String>,
    /// How many functions (kernels included) are removed.
    pub dead_functions: usize,
}

impl Pruning {
    pub(crate) fn removes_anything(&self) -> bool {
        self.dead_functions > 0
    }
}

/// Which functions survive: the kernels host code references, everything data
/// refers to, and everything their code reaches through relocations (calls,
/// device-side launches). Static functions resolve within their own cubin.
fn liveness(units: &[Unit], patterns: &[&str]) -> Pruning {
    type Key<'a> = (Option<usize>, &'a str);
    let modules: Vec<&CubinInfo> = units.iter().flat_map(|u| &u.modules).filter_map(|m| m.info.as_deref()).collect();
    let locals: Vec<HashSet<&str>> =
        modules.iter().map(|i| i.local_functions.iter().map(String::as_str).collect()).collect();
    fn key_of<'a>(locals: &[HashSet<&str>], mi: usize, name: &'a str) -> (Option<usize>, &'a str) {
        (locals[mi].contains(name).then_some(mi), name)
    }
    let key = |mi: usize, name| key_of(&locals, mi, name);
    let mut edges: HashMap<Key<'_>, Vec<Key<'_>>> = HashMap::new();
    let mut work: Vec<Key<'_>> = Vec::new();
    for (mi, info) in modules.iter().enumerate() {
        for r in &info.refs {
            let to = key(mi, &r.to);
            match &r.from {
                Some(f) => edges.entry(key(mi, f)).or_default().push(to),
                None => work.push(to),
            }
        }
        for k in &info.kernels {
            if patterns.iter().any(|p| glob_match(p, k)) {
                work.push(key(mi, k));
            }
        }
    }
    let mut live: HashSet<Key<'_>> = HashSet::new();
    while let Some(k) = work.pop() {
        if live.insert(k) {
            if let Some(next) = edges.get(&k) {
                work.extend(next.iter().copied());
            }
        }
    }
    let mut p = Pruning::default();
    for (mi, info) in modules.iter().enumerate() {
        for f in &info.functions {
            let alive = live.contains(&key(mi, &f.name));
            if alive {
                p.live_functions.insert(f.name.clone());
            } else {
                p.dead_functions += 1;
            }
            if f.is_kernel {
                if alive {
                    p.live_kernels.insert(f.name.clone());
                } else {
                    p.dead_kernels.insert(f.name.clone());
                }
            }
        }
    }
    p
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
