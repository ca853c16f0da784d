//! The link plan: which device code goes into the link, in which order, and
//! what nvlink's host-reference pruning keeps.
//!
//! Inputs are taken in command-line order, then the `-l` libraries in `-l`
//! order (wherever they sit in argv). An archive contributes all its members,
//! once however often it is named; libcudadevrt contributes only what resolves
//! an undefined function. Host-reference pruning applies when linking
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
use crate::input::host::{glob_match, HostRefs};
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
    /// The device runtime's members, to choose again (partial LTO).
    pub system_library: Option<SystemLibrary>,
    /// The LTO modules were compiled into one relocatable cubin (nvlink's
    /// partial LTO): registration follows load order, as in a non-LTO link.
    pub partial_lto: bool,
    /// Lines the link's tools print after the plan's messages, as nvlink's
    /// embedded ptxas prints them (its warnings under `-dlto -g`).
    pub tool_warnings: Vec<String>,
    /// nvlink's link-stage warnings (that an entry function's stack size
    /// cannot be statically determined), as it prints them: after the plan's
    /// messages, whatever `-w` says (`engine::inprocess`).
    pub link_warnings: Vec<Diagnostic>,
    /// The decompressed fatbin members it holds, counted daemon-wide while
    /// it lives.
    pub decompressed: crate::input::load::DecompressedHold,
    /// Where nvlink printed its first input warning; what `-Werror` makes
    /// of it depends on that (`Link::plan`).
    pub first_warning: Option<FirstWarning>,
}

/// Where the first input warning came from, and whether PTX had been
/// compiled by then (nvlink's embedded ptxas leaves later warnings
/// warnings under `-Werror`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FirstWarning {
    /// The input (index into `Spec::inputs`) that warned; `None`: a `-l` search.
    pub input: Option<usize>,
    /// A unit up to and including it holds PTX to compile.
    pub after_ptx: bool,
}

impl Plan {
    /// Module ids for `--register-link-binaries`, in load order.
    /// The ids nvlink registers, in its order: each unit's first id in load
    /// order, then the other ids of `ld -r` merged objects, the last one
    /// first (measured with two and three merged objects).
    pub(crate) fn module_ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self.units.iter().filter_map(|u| u.module_ids.first().cloned()).collect();
        let more: Vec<String> = self.units.iter().flat_map(|u| u.module_ids.iter().skip(1).cloned()).collect();
        ids.extend(more.into_iter().rev());
        ids
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

pub fn build(spec: &Spec, ctx: &LoadContext<'_>) -> Result<Plan, LoadError> {
    if spec.inputs.is_empty() {
        return Err(Diagnostic::fatal("No input files specified; use option --help for more information").into());
    }
    let mut units = Vec::new();
    let mut warnings = Vec::new();
    let mut seen_archives = HashSet::new();
    let mut skipped_host_objects = false;
    let mut system_library_found = false;
    let mut system_library = None;
    // Inputs and libraries are decoded in parallel, then taken in command-line
    // order: the first error in that order stands, as if they had been decoded
    // one after another. On rayon's global pool, not the `--jobs` pool whose
    // threads wait on worker processes (the files were read for the key or
    // prefetched: decoding waits on nothing).
    let inputs: Vec<_> = spec.inputs.par_iter().map(|input| ctx.input(input)).collect();
    let libraries: Vec<_> = spec.files.libraries.par_iter().map(|search| ctx.library(search)).collect();
    let mut first_warning = None;
    let has_ptx = |u: &Unit| u.modules.iter().any(|m| matches!(m.code, crate::input::load::Code::Ptx(_)));
    for (i, loaded) in inputs.into_iter().enumerate() {
        let loaded = loaded?;
        if first_warning.is_none() && !loaded.warnings.is_empty() {
            let this = matches!(&loaded.item, InputItem::Unit(u) if has_ptx(u));
            first_warning = Some(FirstWarning { input: Some(i), after_ptx: this || units.iter().any(has_ptx) });
        }
        warnings.extend(loaded.warnings);
        match loaded.item {
            InputItem::Unit(u) => units.push(u),
            InputItem::Library(l) => {
                skipped_host_objects |= l.skipped_host_objects;
                system_library_found |= l.is_system();
                if seen_archives.insert(l.path.clone()) {
                    add_library(&mut units, l, spec.keep_system_libraries, &mut system_library);
                }
            }
            InputItem::Nothing => {}
        }
    }
    for loaded in libraries {
        let loaded = loaded?;
        if first_warning.is_none() && !loaded.warnings.is_empty() {
            first_warning = Some(FirstWarning { input: None, after_ptx: units.iter().any(has_ptx) });
        }
        warnings.extend(loaded.warnings);
        if let Some(lib) = loaded.item {
            skipped_host_objects |= lib.skipped_host_objects;
            system_library_found |= lib.is_system();
            if seen_archives.insert(lib.path.clone()) {
                add_library(&mut units, lib, spec.keep_system_libraries, &mut system_library);
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
        system_library,
        partial_lto: false,
        tool_warnings: Vec::new(),
        link_warnings: Vec::new(),
        decompressed: Default::default(),
        first_warning,
    })
}

impl Plan {
    /// Whether nvlink uses the host references of this link (to prune, or under
    /// `-dlto` to tell NVVM what the host uses): without `--ignore-host-info`,
    /// if every unit outside libcudadevrt carries host-reference sections —
    /// code-less host objects included, named or in an archive.
    pub(crate) fn uses_host_info(&self, spec: &Spec) -> bool {
        // A debug link (-g) keeps every kernel, as nvlink does.
        !spec.debug && self.has_host_info(spec)
    }

    /// Whether the host references are there to use: [`Self::uses_host_info`]
    /// but for `-g`, which under `-dlto` still hands them to NVVM.
    pub(crate) fn has_host_info(&self, spec: &Spec) -> bool {
        !spec.ignore_host_info
            && !self.codeless_archive_members
            && self.units.iter().filter(|u| !u.is_cudadevrt).all(|u| u.host_refs.is_some())
    }

    /// Whether nvlink removes device code the host does not reference: when
    /// linking an executable with host information (see [`Self::uses_host_info`]).
    fn prunes(&self, spec: &Spec, mode: Mode) -> bool {
        mode == Mode::Executable && self.uses_host_info(spec)
    }

    /// What host-reference pruning would keep of this link were it not a
    /// debug link (`-g` keeps everything; `--suppress-debug-info` then treats
    /// the rest apart); `None` without host information.
    pub(crate) fn pruning_but_for_debug(&self, spec: &Spec) -> Option<Pruning> {
        self.has_host_info(spec).then(|| self.host_liveness(false))
    }

    /// What the host references keep (the units' kernel patterns as roots).
    fn host_liveness(&self, partial_lto: bool) -> Pruning {
        let patterns: Vec<&str> =
            self.units.iter().filter_map(|u| u.host_refs.as_ref()).flat_map(|h| h.kernel_patterns()).collect();
        liveness(&self.units, &patterns, partial_lto)
    }

    /// Decide what pruning keeps; every module must be a cubin by now (PTX
    /// compiled), since liveness follows the cubins' relocations.
    pub(crate) fn prune(&mut self, spec: &Spec, mode: Mode) {
        self.pruning = self.prunes(spec, mode).then(|| self.host_liveness(self.partial_lto));
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
///
/// After partial LTO (`referenced_kernels`) nvlink removes only the kernels
/// nothing names: a kernel a relocation names, even in removed code (a
/// launch in an unlaunched kernel), stays, with what it reaches.
fn liveness(units: &[Unit], patterns: &[&str], referenced_kernels: bool) -> Pruning {
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
    let all_kernels: HashSet<&str> = modules.iter().flat_map(|i| i.kernels.iter().map(String::as_str)).collect();
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
        if referenced_kernels {
            work.extend(info.refs.iter().filter(|r| all_kernels.contains(r.to.as_str())).map(|r| key(mi, &r.to)));
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
/// function, unless `--keep-system-libraries`.
fn add_library(units: &mut Vec<Unit>, lib: Library, keep_system: bool, system: &mut Option<SystemLibrary>) {
    if lib.is_system() && !keep_system {
        let at = units.len();
        let kept = system.is_none().then(|| (lib.name.clone(), lib.path.clone(), lib.members.clone()));
        let chosen = select_members(units, lib);
        if let Some((name, path, members)) = kept {
            *system = Some(SystemLibrary { at, chosen: chosen.len(), name, path, members });
        }
        units.extend(chosen);
    } else {
        units.extend(lib.members);
    }
}

/// The device runtime as the plan took it: where its chosen members sit in
/// `units` and all its members, to choose again when device code appears
/// later (the cubin of partial LTO).
#[derive(Debug)]
pub struct SystemLibrary {
    pub at: usize,
    pub chosen: usize,
    name: String,
    path: std::path::PathBuf,
    members: Vec<Unit>,
}

impl SystemLibrary {
    /// Where the device runtime sits among the units, and the host
    /// references of all its members (nvlink passes them to NVVM under
    /// `-dlto` whether or not a member is linked).
    pub(crate) fn host_refs(&self) -> (usize, impl Iterator<Item = &HostRefs>) {
        (self.at, self.members.iter().filter_map(|u| u.host_refs.as_ref()))
    }
}

impl Plan {
    /// Whether the device runtime defines `name`: any of its members, chosen
    /// or not (all of them under `--keep-system-libraries`).
    pub(crate) fn runtime_defines(&self, name: &str) -> bool {
        let members = self.system_library.iter().flat_map(|s| &s.members);
        members
            .chain(self.units.iter().filter(|u| u.is_cudadevrt))
            .flat_map(|u| &u.modules)
            .filter_map(|m| m.info.as_deref())
            .any(|i| i.defined.iter().any(|d| d == name))
    }

    /// Choose the device runtime's members again for the units as they are
    /// now (after `shift` units were inserted before it): from what the units
    /// before it leave undefined, as [`build`] chose them. The runtime stays
    /// recorded, at its new place, to be chosen again (PTX compiled later).
    pub(crate) fn reselect_system_library(&mut self, shift: usize) {
        let Some(sys) = self.system_library.as_mut() else { return };
        sys.at += shift;
        let at = sys.at;
        self.units.drain(at..at + sys.chosen);
        let lib = Library {
            name: sys.name.clone(),
            path: sys.path.clone(),
            members: sys.members.clone(),
            skipped_host_objects: false,
        };
        let chosen = select_members(&self.units[..at], lib);
        sys.chosen = chosen.len();
        self.units.splice(at..at, chosen);
    }

    /// A unit with device code for the target that comes after the device
    /// runtime when nvlink links none of the runtime, or after it at all
    /// under `-dlto` (`lto`), where the runtime is chosen only after NVVM.
    /// nvlink stops there: `nvlink fatal   : unexpected object after
    /// cudadevrt` (exit status 1, no output; measured with a `-l` archive, a
    /// named object after a named `libcudadevrt.a`, SASS or PTX members, and
    /// under `-dlto`, where an LTO member instead gives the whole program and
    /// `expected libcudadevrt object`). A runtime that was taken, a host-only
    /// member or one without code for the target lets the link go on.
    pub(crate) fn device_code_after_runtime(&self, lto: bool) -> Option<&str> {
        let sys = self.system_library.as_ref()?;
        if sys.chosen > 0 && !lto {
            return None;
        }
        let after = self.units.get(sys.at + sys.chosen..)?;
        after.iter().find(|u| !u.modules.is_empty()).map(|u| u.name.as_str())
    }
}

#[cfg(test)]
mod tests {
    //! The rules of the plan as tables, on synthetic units (no toolkit): each
    //! module is written as words — `k:K` a kernel, `f:F` a device function,
    //! `s:S` a static function (`sk:K` a static kernel), `A>B` a relocation in
    //! A's code to B, `>B` one in data, `u:U` an undefined function.

    use std::sync::Arc;

    use super::*;
    use crate::finalize::strtab::InputFunction;
    use crate::input::cubin::Ref;
    use crate::input::host::HostRefs;
    use crate::input::load::{Code, Module};

    fn module(text: &str) -> Module {
        let mut info = CubinInfo { sm: 90, relocatable: true, ..Default::default() };
        for word in text.split_whitespace() {
            let (kind, name) = word.split_once(':').unwrap_or(("", word));
            let name = name.to_owned();
            match kind {
                "k" | "f" | "s" | "sk" => {
                    let is_kernel = kind.ends_with('k');
                    info.functions.push(InputFunction { name: name.clone(), is_kernel });
                    if is_kernel {
                        info.kernels.push(name.clone());
                    }
                    if kind.starts_with('s') {
                        info.local_functions.push(name);
                    } else {
                        info.defined.push(name);
                    }
                }
                "u" => info.undefined_functions.push(name),
                _ => {
                    let (from, to) = word.split_once('>').expect("A>B or >B");
                    info.refs.push(Ref { from: (!from.is_empty()).then(|| from.to_owned()), to: to.to_owned() });
                }
            }
        }
        Module {
            code: Code::Cubin(Arc::from(&[][..])),
            arch: 90,
            options: String::new(),
            info: Some(Arc::new(info)),
            lto: None,
        }
    }

    /// A unit of one module; `kernels` are its host's kernel references
    /// (`None`: an object without `.nvHR*` sections).
    fn unit(name: &str, kernels: Option<&[&str]>, text: &str) -> Unit {
        Unit {
            name: name.into(),
            host_refs: kernels.map(|k| HostRefs {
                kernels_external: k.iter().map(|s| s.to_string()).collect(),
                ..Default::default()
            }),
            modules: vec![module(text)],
            ..Default::default()
        }
    }

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    /// Host-reference pruning: (host patterns, modules, live kernels, live
    /// functions, how many functions are removed).
    #[test]
    fn liveness_rules() {
        type Row =
            (&'static [&'static str], &'static [&'static str], &'static [&'static str], &'static [&'static str], usize);
        let rows: &[Row] = &[
            // Only the kernels the host names survive.
            (&["k1"], &["k:k1 k:k2"], &["k1"], &["k1"], 1),
            // Host patterns are globs.
            (
                &["_Z4fill*"],
                &["k:_Z4fillPf k:_Z4fillPi k:_Z5scalePf"],
                &["_Z4fillPf", "_Z4fillPi"],
                &["_Z4fillPf", "_Z4fillPi"],
                1,
            ),
            (&["*"], &["k:a k:b f:c"], &["a", "b"], &["a", "b"], 1),
            // Calls are followed, transitively; unreached functions go.
            (&["k1"], &["k:k1 f:f f:g f:h k1>f f>g"], &["k1"], &["f", "g", "k1"], 1),
            // A device-side launch keeps the launched kernel.
            (&["k1"], &["k:k1 k:k2 k:k3 k1>k2"], &["k1", "k2"], &["k1", "k2"], 1),
            // References from data (initializers, constant banks) are roots.
            (&[], &["k:k1 f:f >f"], &[], &["f"], 1),
            // References from a dead function keep nothing.
            (&["k1"], &["k:k1 k:k2 f:f k2>f"], &["k1"], &["k1"], 2),
            // Calls resolve across modules to global functions...
            (&["k1"], &["k:k1 u:g k1>g", "f:g f:h"], &["k1"], &["g", "k1"], 1),
            // ... but a static function only within its own module: the other
            // module's `h` of the same name is removed.
            (&["k1"], &["k:k1 s:h k1>h", "s:h"], &["k1"], &["h", "k1"], 1),
            // A static kernel matched by the host survives like any other.
            (&["sk"], &["sk:sk k:k2"], &["sk"], &["sk"], 1),
            // No host reference at all: every function is removed.
            (&[], &["k:k1 f:f k1>f"], &[], &[], 2),
        ];
        for (patterns, modules, live_kernels, live_functions, dead) in rows {
            let units: Vec<Unit> = modules.iter().map(|m| unit("a.o", Some(&[]), m)).collect();
            let p = liveness(&units, patterns, false);
            let row = format!("{patterns:?} {modules:?}");
            assert_eq!(p.live_kernels, set(live_kernels), "live kernels of {row}");
            assert_eq!(p.live_functions, set(live_functions), "live functions of {row}");
            assert_eq!(p.dead_functions, *dead, "removed functions of {row}");
            let all_kernels: BTreeSet<String> =
                modules.iter().flat_map(|m| module(m).info.unwrap().kernels.clone()).collect();
            let dead_kernels: BTreeSet<String> = all_kernels.difference(&p.live_kernels).cloned().collect();
            assert_eq!(p.dead_kernels, dead_kernels, "dead kernels of {row}");
        }
    }

    /// After partial LTO a kernel any relocation names stays, even one named
    /// only by removed code, with what it reaches; unnamed kernels go.
    #[test]
    fn liveness_after_partial_lto_keeps_named_kernels() {
        // (modules, live kernels, live functions)
        type Row = (&'static [&'static str], &'static [&'static str], &'static [&'static str]);
        let rows: &[Row] = &[
            // lto-cdp: a launched child stays, an unnamed dead kernel goes
            // (as without the rule).
            (&["k:p k:child k:dead p>child"], &["child", "p"], &["child", "p"]),
            // A kernel launched only by a removed kernel stays, with its callee.
            (&["k:p k:unused k:fill f:g unused>fill fill>g"], &["fill", "p"], &["fill", "g", "p"]),
            // Across modules too.
            (&["k:p k:unused u:fill unused>fill", "k:fill"], &["fill", "p"], &["fill", "p"]),
        ];
        for (i, (modules, live_kernels, live_functions)) in rows.iter().enumerate() {
            let units: Vec<Unit> = modules.iter().map(|m| unit("a.o", Some(&[]), m)).collect();
            let p = liveness(&units, &["p*"], true);
            assert_eq!(p.live_kernels, set(live_kernels), "{modules:?}");
            assert_eq!(p.live_functions, set(live_functions), "{modules:?}");
            // Without the rule only what the host reaches stays.
            let plain = liveness(&units, &["p*"], false);
            assert_eq!(plain.live_kernels.len() < p.live_kernels.len(), i > 0, "{modules:?}");
        }
    }

    fn spec(args: &str) -> Spec {
        let args: Vec<String> = args.split_whitespace().map(str::to_owned).collect();
        let parsed = crate::cli::parse::parse(&args, &crate::fs::LocalFs, std::path::Path::new("/")).unwrap();
        Spec::from_parsed(parsed, std::path::Path::new("/"), None).unwrap()
    }

    /// When pruning applies: (arguments, units as (has host references,
    /// is libcudadevrt), codeless archive members skipped, prunes).
    #[test]
    fn pruning_applies_rules() {
        type Row = (&'static str, &'static [(bool, bool)], bool, bool);
        let rows: &[Row] = &[
            // An executable whose every unit carries host references.
            ("-arch=sm_90 a.o b.o -o x", &[(true, false), (true, false)], false, true),
            // Not when relocatable, told to ignore host info, or debugging.
            ("-arch=sm_90 -r a.o b.o -o x", &[(true, false), (true, false)], false, false),
            ("-arch=sm_90 --ignore-host-info a.o b.o -o x", &[(true, false), (true, false)], false, false),
            ("-arch=sm_90 -g a.o b.o -o x", &[(true, false), (true, false)], false, false),
            // One unit without host references (a cubin, a host-less object) turns it off...
            ("-arch=sm_90 a.o b.o -o x", &[(true, false), (false, false)], false, false),
            // ... but libcudadevrt's members do not count.
            ("-arch=sm_90 a.o b.o -o x", &[(true, false), (false, true)], false, true),
            // Nor do code-less archive members: their host code may launch anything.
            ("-arch=sm_90 a.o b.o -o x", &[(true, false), (true, false)], true, false),
        ];
        for (args, kinds, codeless, prunes) in rows {
            let spec = spec(args);
            let mode = spec.mode().unwrap();
            let units = kinds
                .iter()
                .map(|&(refs, devrt)| Unit {
                    is_cudadevrt: devrt,
                    ..unit("a.o", refs.then_some(&["k1"][..]), "k:k1 k:k2")
                })
                .collect();
            let mut plan = Plan {
                units,
                pruning: None,
                warnings: Vec::new(),
                notes: Vec::new(),
                system_library_found: false,
                codeless_archive_members: *codeless,
                system_library: None,
                partial_lto: false,
                tool_warnings: Vec::new(),
                link_warnings: Vec::new(),
                decompressed: Default::default(),
                first_warning: None,
            };
            plan.prune(&spec, mode);
            assert_eq!(plan.pruning.is_some(), *prunes, "{args} {kinds:?} codeless={codeless}");
            if let Some(p) = &plan.pruning {
                assert_eq!(p.live_kernels, set(&["k1"]), "{args} {kinds:?}");
            }
        }
    }

    /// Which archive members a link takes: (archive name, `--keep-system-libraries`,
    /// the units before it, its members, the members taken in order).
    #[test]
    fn member_selection_rules() {
        type Row = (&'static str, bool, &'static [&'static str], &'static [&'static str], &'static [usize]);
        let rows: &[Row] = &[
            // An ordinary archive: every member, needed or not, in archive order.
            ("libfoo.a", false, &["k:k"], &["f:a", "f:b"], &[0, 1]),
            // libcudadevrt: only what resolves an undefined symbol...
            ("libcudadevrt.a", false, &["k:k u:b"], &["f:a", "f:b", "f:c"], &[1]),
            // ... nothing when nothing is undefined...
            ("libcudadevrt.a", false, &["k:k"], &["f:a", "f:b"], &[]),
            // ... nor for a symbol another unit already defines...
            ("libcudadevrt.a", false, &["k:k u:b", "f:b"], &["f:a", "f:b"], &[]),
            // ... and what the taken members need in turn, in the order needed,
            // not archive order.
            ("libcudadevrt.a", false, &["k:k u:b"], &["f:c", "f:b u:c", "f:d"], &[1, 0]),
            // The first member defining a needed symbol wins.
            ("libcudadevrt.a", false, &["k:k u:b"], &["f:a", "f:b", "f:b"], &[1]),
            // --keep-system-libraries takes every member.
            ("libcudadevrt.a", true, &["k:k u:b"], &["f:a", "f:b"], &[0, 1]),
            // A path naming cudadevrt is a system library wherever it is.
            ("/opt/x/libcudadevrt_static.a", false, &["k:k u:a"], &["f:a", "f:b"], &[0]),
            // A function undefined that it does not define takes all of it...
            ("libcudadevrt.a", false, &["k:k u:x"], &["f:a", "f:b"], &[0, 1]),
            ("libcudadevrt.a", false, &["k:k u:printf"], &["f:a"], &[0]),
            // ... but not one the driver provides.
            ("libcudadevrt.a", false, &["k:k u:malloc u:cnpGetLimit u:__cuda_syscall_cnpv2GetLimit"], &["f:a"], &[]),
        ];
        for (name, keep, before, members, taken) in rows {
            let mut units: Vec<Unit> = before.iter().map(|m| unit("a.o", Some(&[]), m)).collect();
            let lib = Library {
                name: name.to_string(),
                path: name.into(),
                members: members.iter().enumerate().map(|(i, m)| unit(&format!("m{i}"), Some(&[]), m)).collect(),
                skipped_host_objects: false,
            };
            add_library(&mut units, lib, *keep, &mut None);
            let got: Vec<String> = units[before.len()..].iter().map(|u| u.name.clone()).collect();
            let want: Vec<String> = taken.iter().map(|i| format!("m{i}")).collect();
            assert_eq!(got, want, "{name} keep={keep} after {before:?} from {members:?}");
        }
    }

    /// Device code after the device runtime: (units before, its members,
    /// units after — `-` one without device code —, `-dlto`, the unit nvlink
    /// stops at with `unexpected object after cudadevrt`).
    #[test]
    fn device_code_after_the_runtime() {
        type Row = (&'static [&'static str], &'static [&'static str], bool, Option<&'static str>);
        let rows: &[Row] = &[
            // Nothing of it linked, device code after it: nvlink stops there.
            (&["k:k"], &["f:v"], false, Some("after0")),
            (&["k:k"], &["-", "f:v"], false, Some("after1")),
            // Its member linked, or nothing with device code after it.
            (&["k:k u:a"], &["f:v"], false, None),
            (&["k:k"], &["-"], false, None),
            (&["k:k"], &[], false, None),
            // Under -dlto the runtime is chosen after NVVM: any device code after it.
            (&["k:k u:a"], &["f:v"], true, Some("after0")),
        ];
        for (before, after, lto, stops) in rows {
            let mut units: Vec<Unit> = before.iter().map(|m| unit("a.o", Some(&[]), m)).collect();
            let lib = Library {
                name: "libcudadevrt.a".into(),
                path: "libcudadevrt.a".into(),
                members: vec![unit("cuda_device_runtime.o", Some(&[]), "f:a")],
                skipped_host_objects: false,
            };
            let mut system = None;
            add_library(&mut units, lib, false, &mut system);
            for (i, m) in after.iter().enumerate() {
                let mut u = unit(&format!("after{i}"), Some(&[]), m.trim_start_matches('-'));
                if *m == "-" {
                    u.modules.clear();
                }
                units.push(u);
            }
            let plan = Plan {
                units,
                pruning: None,
                warnings: Vec::new(),
                notes: Vec::new(),
                system_library_found: true,
                codeless_archive_members: false,
                system_library: system,
                partial_lto: false,
                tool_warnings: Vec::new(),
                link_warnings: Vec::new(),
                decompressed: Default::default(),
                first_warning: None,
            };
            assert_eq!(plan.device_code_after_runtime(*lto), *stops, "{before:?} then {after:?} lto={lto}");
        }
    }
}
