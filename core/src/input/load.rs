//! Loading the inputs of a link into units of device code, following nvlink's
//! decision tree for each file (measured on nvlink 13.5, see docs/nvlink-behaviour.md):
//!
//! 1. Open and probe: unopenable → `Could not open input file`; empty → skipped;
//!    1–55 bytes → `Could not open input file` unless it starts like an archive.
//! 2. No `.` in the basename → skipped.
//! 3. The extension decides first: `.cubin`, `.ptx`, `.fatbin`, `.nvvm`/`.ltoir`, `.bc`.
//! 4. Then an archive magic makes it an archive; then `.so` is skipped.
//! 5. Otherwise only `e_type` counts: not `ET_REL` → skipped; a CUDA ELF named
//!    `.o` → cubin; anything else → host object.
//!
//! Host objects contribute the first fatbin of `__nv_relfatbin`, from which one
//! member is chosen for the target (exact or compatible SASS, else PTX to
//! compile). Paths this loader does not reproduce exactly are reported as
//! [`LoadError::Declined`], and the linker hands the link to the real nvlink.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rayon::prelude::*;

use super::archive;
use super::classify::{classify, is_ptx, Content};
use super::cubin::{self, CubinInfo};
use super::files::LibrarySearch;
use super::host::{HostObject, HostRefs};
use super::memo::{DecodeMemo, Decoded};
use super::ptx::{self, PtxSymbols};
use super::Bytes;
use crate::cli::target::{arch_name, Target};
use crate::declined::{Declined, Reason};
use crate::diag::Diagnostic;
use crate::elf::{header_machine, header_type, is_cuda_elf, is_elf, Elf, EM_CUDA, ET_REL};
use crate::fatbin::{self, Member, MemberKind};
use crate::fs::{absolute, InputFs};
use crate::regbin::synthetic_module_id;

/// Device code of one module.
#[derive(Clone, Debug)]
pub enum Code {
    Cubin(Bytes),
    Ptx(Bytes),
    /// A host object whose LTO IR member is linked (nvJitLink reads the member
    /// and its compile options from the object itself).
    LtoObject(Bytes),
}

/// One piece of device code going into the link.
#[derive(Clone, Debug)]
pub struct Module {
    pub code: Code,
    /// SM number of the member or file.
    pub arch: u32,
    /// Options recorded with a fatbin member.
    pub options: String,
    /// Parsed symbols and functions, for cubins.
    pub info: Option<Arc<CubinInfo>>,
    /// Declarations of the PTX twin of an LTO module (`None` for an LTO
    /// module without one: its symbols are known only after NVVM).
    pub lto: Option<PtxSymbols>,
}

/// One input file or archive member, as nvlink names it in messages.
#[derive(Clone, Debug, Default)]
pub struct Unit {
    pub name: String,
    /// Registration ids (`--register-link-binaries`), in order.
    pub module_ids: Vec<String>,
    pub host_refs: Option<HostRefs>,
    pub modules: Vec<Module>,
    /// Came from an archive (`-l` or a named archive).
    pub from_archive: bool,
    /// The CUDA device runtime (`libcudadevrt`).
    pub is_cudadevrt: bool,
    /// A cubin, PTX or fatbin file: device code without host code.
    pub device_only: bool,
}

#[derive(Debug)]
pub enum LoadError {
    /// nvlink stops with these messages (exit status 1).
    Fatal(Vec<Diagnostic>),
    /// A case the in-process engine does not reproduce.
    Declined(Declined),
}

impl From<Diagnostic> for LoadError {
    fn from(d: Diagnostic) -> Self {
        LoadError::Fatal(vec![d])
    }
}

fn unsupported<T>(reason: Reason, why: impl Into<String>) -> Result<T, LoadError> {
    Err(LoadError::Declined(Declined::new(reason, why)))
}

fn fatal<T>(msg: impl Into<String>) -> Result<T, LoadError> {
    Err(LoadError::Fatal(vec![Diagnostic::fatal(msg)]))
}

/// The words of a fatbin member's recorded options.
fn words(options: &str) -> Vec<&str> {
    options.split_whitespace().collect()
}

/// What the loader needs to know about the link.
pub struct LoadContext<'a> {
    pub fs: &'a dyn InputFs,
    pub cwd: &'a Path,
    pub target: Target,
    pub lto: bool,
    pub suppress_arch_warning: bool,
    /// Decoded SASS members kept across requests (the daemon's), if any.
    pub memo: Option<&'a DecodeMemo>,
    /// The host `e_machine` of `--cpu-arch` ([`cpu_machine`]): a `-l` archive
    /// none of whose leading ELF members has it is skipped as incompatible.
    pub cpu_machine: u16,
    /// Bytes of fatbin members this link decompressed so far (at most
    /// [`MAX_LINK_DECOMPRESSED`]).
    pub decompressed: std::sync::atomic::AtomicU64,
}

/// The most a link may decompress of its inputs' fatbin members: 1 GiB (a
/// 9 KB member may declare 256 MiB; twelve of them took the daemon to
/// 3.5 GB). Past it the link is left to nvlink.
pub const MAX_LINK_DECOMPRESSED: u64 = 1 << 30;

/// The most the links of this process may have decompressed at once: 2 GiB
/// (concurrent remote links each had their own GiB).
pub const MAX_DECOMPRESSED: u64 = 2 << 30;

/// Bytes decompressed by the links loading now (their [`LoadContext`]s) or
/// holding their plans ([`DecompressedHold`]).
static DECOMPRESSED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl Drop for LoadContext<'_> {
    fn drop(&mut self) {
        use std::sync::atomic::Ordering;
        DECOMPRESSED.fetch_sub(*self.decompressed.get_mut(), Ordering::Relaxed);
    }
}

impl LoadContext<'_> {
    /// The bytes decompressed so far, counted against [`MAX_DECOMPRESSED`]
    /// until the hold drops rather than the context: the plan keeps them.
    pub fn hold_decompressed(&self) -> DecompressedHold {
        DecompressedHold(self.decompressed.swap(0, std::sync::atomic::Ordering::Relaxed))
    }
}

/// Decompressed member bytes a plan holds, counted against
/// [`MAX_DECOMPRESSED`] while it lives.
#[derive(Debug, Default)]
pub struct DecompressedHold(u64);

impl Drop for DecompressedHold {
    fn drop(&mut self) {
        DECOMPRESSED.fetch_sub(self.0, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The `e_machine` nvlink expects of host objects for `--cpu-arch` (absent or
/// `unknown`: this host's, x86-64). Measured with nvlink 13.5 on archives whose
/// members' `e_machine` was set to each value.
pub fn cpu_machine(cpu_arch: Option<&str>) -> u16 {
    match cpu_arch {
        Some("AARCH64") => 183,
        Some("ARMv7") => 40,
        Some("PPC64LE") => 21,
        Some("RISCV64") => 243,
        Some("X86") => 3,
        _ => 62,
    }
}

/// Whether nvlink's `-l` search takes this archive for `machine`: walking its
/// members in order up to the first one that is not ELF (a text file, an empty
/// member), one has `machine` as its `e_machine` (other ELF members, cubins
/// included, are passed over). Otherwise nvlink says "Skipping incompatible".
fn archive_compatible(members: &[archive::Member<'_>], machine: u16) -> bool {
    for m in members {
        let Some(bytes) = m.data else { return false };
        if !is_elf(bytes) {
            return false;
        }
        if header_machine(bytes) == Some(machine) {
            return true;
        }
    }
    false
}

/// A loaded archive: its members that carry device code, in order.
#[derive(Debug)]
pub struct Library {
    /// Path as nvlink names it.
    pub name: String,
    /// Absolute path, to load each archive once.
    pub path: PathBuf,
    pub members: Vec<Unit>,
    /// Host objects without device code were skipped (their host references
    /// could matter to pruning).
    pub skipped_host_objects: bool,
}

impl Library {
    /// A path containing `cudadevrt` is a "system library" nvlink trims.
    pub(crate) fn is_system(&self) -> bool {
        self.name.contains("cudadevrt")
    }
}

/// What one command-line input contributes.
#[derive(Debug)]
pub enum InputItem {
    Unit(Unit),
    Library(Library),
    Nothing,
}

/// The messages a loader step printed and whether it produced something.
pub struct Loaded<T> {
    pub item: T,
    pub warnings: Vec<Diagnostic>,
}

/// The extension nvlink sees: after the last `.` of the basename; `None` without a dot.
pub(crate) fn extension(path: &str) -> Option<&str> {
    let file = path.rsplit('/').next().unwrap_or(path);
    file.rfind('.').map(|i| &file[i + 1..])
}

const PROBE: usize = 56;

fn is_archive_magic(d: &[u8]) -> bool {
    d.starts_with(b"!<arch>\n") || d.starts_with(b"!<thin>\n")
}

impl LoadContext<'_> {
    fn read(&self, given: &str) -> Result<Bytes, LoadError> {
        use std::io::ErrorKind::*;
        self.fs.read(&absolute(self.cwd, given)).map_err(|e| match e.kind() {
            NotFound | PermissionDenied | IsADirectory | NotADirectory => {
                LoadError::Fatal(vec![Diagnostic::fatal(format!("Could not open input file '{given}'"))])
            }
            // Too large for the wire, or the caller went away: not nvlink's business.
            _ => LoadError::Declined(Declined::new(Reason::InputDeclined, format!("cannot read {given}: {e}"))),
        })
    }

    fn synthetic_id(&self, given: &str) -> String {
        let p = Path::new(given);
        let full = if p.is_absolute() { given.to_owned() } else { format!("{}/{given}", self.cwd.display()) };
        synthetic_module_id(Path::new(&full))
    }

    /// Load one input named on the command line.
    pub fn input(&self, given: &str) -> Result<Loaded<InputItem>, LoadError> {
        let nothing = || Ok(Loaded { item: InputItem::Nothing, warnings: Vec::new() });
        let data = self.read(given)?;
        if data.is_empty() {
            return nothing();
        }
        if data.len() < PROBE && !is_archive_magic(&data) {
            return fatal(format!("Could not open input file '{given}'"));
        }
        let Some(ext) = extension(given) else { return nothing() };
        match ext {
            "cubin" => self.cubin_file(given, data),
            "ptx" => {
                if !is_ptx(&data) {
                    return unsupported(Reason::Input, format!("{given}: non-PTX content in a .ptx file"));
                }
                // Below sm_90 nvlink compiles a `.ptx` file and links none of
                // its code; for a suffixed target its tool note names the
                // plain arch. Neither is reproduced.
                if self.target.sm < 90 {
                    return unsupported(Reason::Arch, format!("{given}: a .ptx file linked below sm_90"));
                }
                if self.target.suffix.is_some() {
                    return unsupported(Reason::Arch, format!("{given}: a .ptx file for a suffixed target"));
                }
                let unit = Unit {
                    name: given.to_owned(),
                    module_ids: vec![self.synthetic_id(given)],
                    modules: vec![Module {
                        code: Code::Ptx(data),
                        arch: self.target.sm,
                        options: String::new(),
                        info: None,
                        lto: None,
                    }],
                    device_only: true,
                    ..Default::default()
                };
                Ok(Loaded { item: InputItem::Unit(unit), warnings: Vec::new() })
            }
            "fatbin" => {
                if !fatbin::is_fatbin(&data) {
                    return fatal("fatbin wrong format?");
                }
                let members =
                    fatbin::parse_first(&data).or_else(|e| unsupported(Reason::Input, format!("{given}: {e}")))?;
                let (modules, warnings) = self.select(given, &members, false, None)?;
                let unit = Unit {
                    name: given.to_owned(),
                    module_ids: vec![self.synthetic_id(given)],
                    modules,
                    device_only: true,
                    ..Default::default()
                };
                Ok(Loaded { item: InputItem::Unit(unit), warnings })
            }
            "nvvm" | "ltoir" if !self.lto => fatal("should only see nvvm files when -lto"),
            "nvvm" | "ltoir" => unsupported(Reason::PartialLto, "LTO IR files"),
            "bc" => fatal("should never see bc files"),
            _ if is_archive_magic(&data) => {
                Ok(Loaded { item: InputItem::Library(self.archive(given, data)?), warnings: Vec::new() })
            }
            "so" => nothing(),
            _ if header_type(&data) != Some(ET_REL) => nothing(),
            "o" if is_cuda_elf(&data) => self.cubin_file(given, data),
            _ => match self.host_object(given, &data, false)? {
                Some(loaded) => Ok(Loaded { item: InputItem::Unit(loaded.item), warnings: loaded.warnings }),
                None => nothing(),
            },
        }
    }

    /// Resolve `-l name`: the first of its candidates (`lib<name>.a` in the
    /// search directories, [`LinkFiles`](crate::input::files::LinkFiles))
    /// that is an archive for this machine; tiny files and archives for
    /// another machine are skipped with nvlink's warning. Returns `None`
    /// (silently) when none is.
    pub fn library(&self, search: &LibrarySearch) -> Result<Loaded<Option<Library>>, LoadError> {
        let mut warnings = Vec::new();
        let name = &search.name;
        for candidate in &search.candidates {
            let shown = &candidate.given;
            let Ok(stat) = self.fs.stat(&candidate.path) else { continue };
            if stat.is_dir {
                return unsupported(Reason::Input, format!("{shown} is a directory"));
            }
            if stat.size <= 8 {
                warnings
                    .push(Diagnostic::warning(format!("Skipping incompatible '{shown}' when searching for -l{name}")));
                continue;
            }
            let data = self.read(shown)?;
            if !data.starts_with(b"!<arch>\n") {
                return unsupported(Reason::Input, format!("{shown} is not an archive"));
            }
            let compatible = archive::members(&data).map(|(_, m)| archive_compatible(&m, self.cpu_machine));
            if compatible == Ok(false) {
                warnings
                    .push(Diagnostic::warning(format!("Skipping incompatible '{shown}' when searching for -l{name}")));
                continue;
            }
            return Ok(Loaded { item: Some(self.archive(shown, data)?), warnings });
        }
        Ok(Loaded { item: None, warnings })
    }

    fn archive(&self, shown: &str, data: Bytes) -> Result<Library, LoadError> {
        let (thin, members) =
            archive::members(&data).or_else(|_| unsupported(Reason::Input, format!("{shown}: malformed archive")))?;
        // A thin archive's members are files beside it that nvlink reads and
        // the daemon neither keys nor mirrors: the caller's nvlink links it.
        if thin {
            return unsupported(
                Reason::InputDeclined,
                format!("{shown}: a thin archive (its members are read by nvlink)"),
            );
        }
        /// What one member contributes.
        enum Member {
            Unit(Box<Unit>),
            CodeLess,
            Ignored,
        }
        // nvlink reads members up to the first one that is not ELF (a text
        // file, an empty member) and none after it.
        let read = members.iter().position(|m| m.data.is_some_and(|b| !is_elf(b))).unwrap_or(members.len());
        // Members are decoded in parallel (decompressing and parsing device
        // code is the costly part); the first error in member order stands, as
        // if they had been decoded one after another.
        let decoded: Vec<Result<Member, LoadError>> = members[..read]
            .par_iter()
            .map(|m| {
                let Some(bytes) = m.data else { return unsupported(Reason::Input, "thin member") };
                let member_name = format!("{shown}:{}", m.name);
                // Only host relocatable objects contribute; everything else is ignored.
                if classify(bytes) != Content::HostElf || header_type(bytes) != Some(ET_REL) {
                    if is_elf(bytes) && bytes.len() < 64 {
                        return unsupported(Reason::Input, format!("{member_name}: truncated ELF member"));
                    }
                    // nvlink links a host member of another `e_type` (measured
                    // with a damaged one); what it makes of each is not measured.
                    if classify(bytes) == Content::HostElf {
                        return unsupported(
                            Reason::Input,
                            format!("{member_name}: a host ELF member that is not ET_REL"),
                        );
                    }
                    // nvlink takes device code from a cubin member (its kernels
                    // stay; measured on an archive of a cubin and host objects).
                    if is_cuda_elf(bytes) {
                        return unsupported(Reason::Input, format!("{member_name}: a cubin member"));
                    }
                    return Ok(Member::Ignored);
                }
                // Read as nvlink's host-object reader reads a named object
                // (`Elf::parse_host`); a member that does not parse is left
                // to nvlink (whether it skips it or fails is not measured).
                match Elf::parse_host(bytes) {
                    Err(_) => return unsupported(Reason::Input, format!("{member_name}: a damaged host object")),
                    // No device code: skipped (with a fatbin segment but no
                    // fatbin, `host_object` answers as nvlink does).
                    Ok(e)
                        if HostObject::read(&e).relfatbin.is_none()
                            && (e.section(".nvFatBinSegment").is_none() || e.section(".nv_fatbin").is_some()) =>
                    {
                        return Ok(Member::CodeLess)
                    }
                    Ok(_) => {}
                }
                Ok(match self.host_object(&member_name, bytes, true)? {
                    Some(mut loaded) => {
                        loaded.item.from_archive = true;
                        Member::Unit(Box::new(loaded.item))
                    }
                    None => Member::Ignored,
                })
            })
            .collect();
        let mut units = Vec::new();
        let mut skipped_host_objects = false;
        for m in decoded {
            match m? {
                Member::Unit(u) => units.push(*u),
                Member::CodeLess => skipped_host_objects = true,
                Member::Ignored => {}
            }
        }
        let mut lib =
            Library { name: shown.to_owned(), path: absolute(self.cwd, shown), members: units, skipped_host_objects };
        if lib.is_system() {
            for m in &mut lib.members {
                m.is_cudadevrt = true;
            }
        }
        Ok(lib)
    }

    fn cubin_file(&self, name: &str, data: Bytes) -> Result<Loaded<InputItem>, LoadError> {
        let nothing = Ok(Loaded { item: InputItem::Nothing, warnings: Vec::new() });
        if !is_elf(&data) {
            return fatal("cubin not an elf?");
        }
        if header_machine(&data) != Some(EM_CUDA) {
            return fatal("cubin not a device elf?");
        }
        // A cubin this reader refuses nvlink's answers in ways not reproduced
        // here (skipped without a word, a fatal error, a crash: measured by
        // mutation, and depending on more than the first fault).
        let elf = match Elf::parse(&data) {
            Ok(elf) => elf,
            Err(e) => return unsupported(Reason::Input, format!("{name}: {e}")),
        };
        match elf.e_type {
            1 => {}
            2 => return nothing,
            _ => return unsupported(Reason::Input, format!("{name}: cubin of ELF type {}", elf.e_type)),
        }
        if elf.osabi != 0x41 {
            return unsupported(Reason::Input, format!("{name}: cubin without the CUDA ABI"));
        }
        let info = cubin::read_input(&data).or_else(|e| unsupported(Reason::Input, format!("{name}: {e}")))?;
        self.check_cubin_arch(name, &info)?;
        let unit = Unit {
            name: name.to_owned(),
            module_ids: vec![self.synthetic_id(name)],
            modules: vec![Module {
                code: Code::Cubin(data),
                arch: info.sm,
                options: String::new(),
                info: Some(Arc::new(info)),
                lto: None,
            }],
            device_only: true,
            ..Default::default()
        };
        Ok(Loaded { item: InputItem::Unit(unit), warnings: Vec::new() })
    }

    fn check_cubin_arch(&self, name: &str, info: &CubinInfo) -> Result<(), LoadError> {
        if info.sm == self.target.sm && self.target.suffix.is_none() && !info.accelerated {
            return Ok(());
        }
        // A pre-Mercury cubin for a Mercury target (sm_100+): nvlink warns
        // that the output is limited, then rejects it; an accelerated
        // (`sm_90a`) cubin for a plain target cannot be linked at all.
        if self.target.suffix.is_none() && (info.accelerated || (self.target.sm >= 100 && info.sm < 100)) {
            let mut ds = Vec::new();
            if self.target.sm >= 100 && info.sm < 100 {
                ds.push(Diagnostic::warning(format!(
                    "Output is limited to run on SM Arch '{}' only due to limitations in input file {name}",
                    self.target.sm
                )));
            }
            ds.push(Diagnostic::fatal(match info.accelerated {
                true => "cannot link accelerated arch to non-accelerated".to_owned(),
                false => format!("Input file '{name}' arch does not match target '{}'", self.target.name()),
            }));
            return Err(LoadError::Fatal(ds));
        }
        if info.accelerated || (self.target.sm >= 100 && info.sm < 100) {
            return unsupported(
                Reason::Arch,
                format!("{name}: sm_{} cubin (arch-specific or pre-sm_100) for {}", info.sm, self.target.name()),
            );
        }
        if info.sm / 10 != self.target.sm / 10 || info.sm > self.target.sm {
            return fatal(format!("Input file '{name}' arch does not match target '{}'", self.target.name()));
        }
        unsupported(Reason::Arch, format!("{name}: sm_{} cubin linked for {}", info.sm, self.target.name()))
    }

    /// The device code of a host object: `None` when it has none (skipped).
    fn host_object(&self, name: &str, data: &[u8], in_archive: bool) -> Result<Option<Loaded<Unit>>, LoadError> {
        let no_fatbin = || {
            Err(LoadError::Fatal(vec![
                Diagnostic::fatal(format!("Could not find fatbin in '{name}'")),
                Diagnostic::fatal("elfLink internal error"),
            ]))
        };
        let elf = match Elf::parse_host(data) {
            Ok(e) => e,
            Err(_) => return no_fatbin(),
        };
        match crate::input::host::refused(&elf) {
            Some(crate::input::host::Refused::Fatal) if !in_archive => return no_fatbin(),
            Some(crate::input::host::Refused::Fatal) => {
                return unsupported(
                    Reason::Input,
                    format!("{name}: a host object nvlink's reader refuses, in an archive"),
                )
            }
            Some(crate::input::host::Refused::Unmeasured(what)) => {
                return unsupported(Reason::Input, format!("{name}: a host object with {what}"))
            }
            None => {}
        }
        let host = HostObject::read(&elf);
        // An object without linkable device code contributes nothing, but its
        // host code may still reference device code: without host-reference
        // sections it turns nvlink's pruning off.
        let code_less = || {
            Ok(Some(Loaded {
                item: Unit { name: name.to_owned(), host_refs: host.host_refs.clone(), ..Default::default() },
                warnings: Vec::new(),
            }))
        };
        if elf.section(".nvFatBinSegment").is_none() {
            return if in_archive { Ok(None) } else { code_less() };
        }
        let Some(fatbin_bytes) = host.relfatbin else {
            if host.has_nv_fatbin {
                return if in_archive { Ok(None) } else { code_less() };
            }
            return Err(LoadError::Fatal(vec![
                Diagnostic::fatal(format!("Could not find fatbin in '{name}'")),
                Diagnostic::fatal("elfLink internal error"),
            ]));
        };
        let members = fatbin::parse_first(fatbin_bytes)
            .or_else(|e| unsupported(Reason::Input, format!("{name}: fatbin: {e}")))?;
        let (modules, warnings) = self.select(name, &members, in_archive, Some(data))?;
        let module_ids = match host.module_ids() {
            ids if ids.is_empty() => vec![self.synthetic_id(name)],
            // An `ld -r` merge of several objects: nvlink links the first
            // fatbin only and registers every id (`Plan::module_ids`);
            // measured on named objects without -dlto.
            ids if ids.len() > 1 && (in_archive || self.lto) => {
                return unsupported(Reason::Input, format!("{name}: several module ids (an ld -r object)"))
            }
            ids => ids,
        };
        let unit = Unit {
            name: name.to_owned(),
            module_ids,
            host_refs: host.host_refs,
            modules,
            from_archive: in_archive,
            ..Default::default()
        };
        Ok(Some(Loaded { item: unit, warnings }))
    }

    /// nvlink's member choice for the target: LTO IR (with `-dlto`), then SASS
    /// the target runs as is (see [`Target::takes_sass`]; other SASS of the
    /// same major is left to the real nvlink), then the newest plain PTX not
    /// newer than the target (compiled at link time).
    fn select(
        &self,
        name: &str,
        members: &[Member<'_>],
        in_archive: bool,
        object: Option<&[u8]>,
    ) -> Result<(Vec<Module>, Vec<Diagnostic>), LoadError> {
        let chosen = match self.lto {
            true => self.select_lto(name, members, object)?,
            false => None,
        };
        let mut warnings = Vec::new();
        let chosen = match chosen {
            Some(m) => Some(m),
            None => match self.select_sass(name, members)? {
                Sass::Found(m) => Some(m),
                Sass::None => self.select_ptx(name, members)?,
                // nvlink says so and goes on as if the object had no code for
                // the target (no PTX either); measured on a named host object.
                Sass::Uncompress
                    if !in_archive && object.is_some() && !members.iter().any(|m| m.kind == MemberKind::LtoIr) =>
                {
                    warnings.push(Diagnostic::error("Uncompress failed"));
                    None
                }
                Sass::Uncompress => {
                    return unsupported(Reason::Input, format!("{name}: a member that does not decompress"))
                }
            },
        };
        if let Some(module) = chosen {
            return Ok((vec![module], warnings));
        }
        if members.iter().any(|m| m.kind == MemberKind::LtoIr) {
            // nvlink's fatal is for IR it could link (not newer than the
            // target) without -dlto; IR only for newer archs (with -dlto or
            // not) it passes over with the arch warning and links the rest
            // ("Ignoring -dlto option because no LTO objects found"), which
            // is not reproduced here.
            let usable = members.iter().any(|m| m.kind == MemberKind::LtoIr && m.arch <= self.target.sm);
            if !self.lto && usable {
                return fatal("LTO objects found, use -dlto");
            }
            return unsupported(
                Reason::Arch,
                format!("{name}: LTO IR only for archs newer than {}", self.target.name()),
            );
        }
        if !in_archive && !self.suppress_arch_warning {
            warnings.push(Diagnostic::warning(format!("SM Arch ('{}') not found in '{name}'", self.target.name())));
        }
        Ok((Vec::new(), warnings))
    }

    /// With `-dlto`: the newest LTO IR not newer than the target, which must be
    /// for exactly the target, inside a host object; its PTX twin, when there
    /// is one, names the module's kernels and needs.
    fn select_lto(
        &self,
        name: &str,
        members: &[Member<'_>],
        object: Option<&[u8]>,
    ) -> Result<Option<Module>, LoadError> {
        let t = self.target;
        let ir = members.iter().filter(|m| m.kind == MemberKind::LtoIr && m.arch <= t.sm).max_by_key(|m| m.arch);
        let Some(ir) = ir else { return Ok(None) };
        if t.suffix.is_some() || ir.suffix().is_some() {
            return unsupported(Reason::Arch, format!("{name}: LTO IR linked for {}", t.name()));
        }
        let (Some(object), true) = (object, ir.arch == t.sm) else {
            return unsupported(Reason::Arch, format!("{name}: lto_{} IR linked for sm_{}", ir.arch, t.sm));
        };
        // Only nvcc's default options of LTO IR are reproduced (NVVM and its
        // ptxas take the recorded ones: `-maxrregcount`, fast math, ...).
        if words(ir.options) != ["-ftz=0", "-prec_div=1", "-prec_sqrt=1", "-fmad=1"] {
            return unsupported(
                Reason::LtoOptions,
                format!("{name}: LTO IR recorded with options '{}'", ir.options.trim()),
            );
        }
        // nvcc's `code=lto_XY` alone leaves no twin (the IR itself is not
        // readable here): the engine then learns the symbols from NVVM's output.
        let lto = match members.iter().find(|m| m.kind == MemberKind::Ptx && m.arch == ir.arch) {
            Some(twin) => {
                let text = self.contents(name, twin)?;
                Some(ptx::symbols(&String::from_utf8_lossy(&text)))
            }
            None => None,
        };
        Ok(Some(Module {
            code: Code::LtoObject(object.to_vec().into()),
            arch: ir.arch,
            options: ir.options.to_owned(),
            info: None,
            lto,
        }))
    }

    /// SASS for exactly this target first, then plain SASS of its SM number;
    /// other SASS of the same major is left to the real nvlink.
    fn select_sass(&self, name: &str, members: &[Member<'_>]) -> Result<Sass, LoadError> {
        let t = self.target;
        let same_major =
            || members.iter().filter(|m| m.kind == MemberKind::Cubin && m.arch / 10 == t.sm / 10 && m.arch <= t.sm);
        let sass = same_major().filter(|m| t.takes_sass(m.arch, m.suffix())).min_by_key(|m| {
            if m.suffix() == t.suffix {
                0
            } else {
                1
            }
        });
        let Some(m) = sass else {
            return match same_major().next() {
                Some(m) => unsupported(
                    Reason::Arch,
                    format!("{name}: {} SASS linked for {}", arch_name("sm", m.arch, m.suffix()), t.name()),
                ),
                None => Ok(Sass::None),
            };
        };
        let uncompress = fatbin::FatbinError::Uncompress.to_string();
        let Decoded { bytes, info } = match self.decode_sass(name, m) {
            Err(LoadError::Declined(d)) if d.detail.ends_with(&uncompress) => return Ok(Sass::Uncompress),
            decoded => decoded?,
        };
        Ok(Sass::Found(Module {
            code: Code::Cubin(bytes),
            arch: m.arch,
            options: m.options.to_owned(),
            info: Some(info),
            lto: None,
        }))
    }

    /// The newest plain PTX not newer than the target (suffixed PTX is left to
    /// the real nvlink).
    fn select_ptx(&self, name: &str, members: &[Member<'_>]) -> Result<Option<Module>, LoadError> {
        let t = self.target;
        let ptx = members.iter().filter(|m| m.kind == MemberKind::Ptx && m.arch <= t.sm);
        if let Some(m) = ptx.clone().find(|m| m.suffix().is_some()) {
            return unsupported(
                Reason::Arch,
                format!("{name}: {} PTX for {}", arch_name("compute", m.arch, m.suffix()), t.name()),
            );
        }
        let Some(m) = ptx.max_by_key(|m| m.arch) else { return Ok(None) };
        // The options nvcc recorded for the PTX (`-Xptxas`, `-maxrregcount`,
        // `-G`, `-lineinfo`) are nvlink's ptxas's too; only nvcc's default
        // is reproduced (an adversarial run found the others' cubins differ).
        if !matches!(words(m.options).as_slice(), [] | ["--compile-only"]) {
            return unsupported(
                Reason::PtxJit,
                format!("{name}: PTX recorded with ptxas options '{}'", m.options.trim()),
            );
        }
        let bytes: Bytes = self.contents(name, m)?.into_owned().into();
        Ok(Some(Module { code: Code::Ptx(bytes), arch: m.arch, options: m.options.to_owned(), info: None, lto: None }))
    }

    /// A member's contents, decompressed within the link's
    /// [`MAX_LINK_DECOMPRESSED`].
    fn contents<'m>(&self, name: &str, m: &Member<'m>) -> Result<std::borrow::Cow<'m, [u8]>, LoadError> {
        use std::sync::atomic::Ordering;
        if m.is_compressed() {
            let n = m.uncompressed_size();
            let all = DECOMPRESSED.fetch_add(n, Ordering::Relaxed) + n;
            let mine = self.decompressed.fetch_add(n, Ordering::Relaxed) + n;
            if mine > MAX_LINK_DECOMPRESSED {
                return unsupported(Reason::Input, format!("{name}: the link's fatbin members decompress past 1 GiB"));
            }
            if all > MAX_DECOMPRESSED {
                return unsupported(Reason::Input, format!("{name}: the links loading now decompress past 2 GiB"));
            }
        }
        m.contents().or_else(|e| unsupported(Reason::Input, format!("{name}: {e}")))
    }

    /// A SASS member's cubin and its parsed symbols, from the memo when it
    /// holds this member.
    fn decode_sass(&self, name: &str, m: &Member<'_>) -> Result<Decoded, LoadError> {
        let decode = || -> Result<Decoded, LoadError> {
            let bytes: Bytes = self.contents(name, m)?.into_owned().into();
            let info =
                Arc::new(cubin::read_input(&bytes).or_else(|e| unsupported(Reason::Input, format!("{name}: {e}")))?);
            Ok(Decoded { bytes, info })
        };
        let Some(memo) = self.memo else { return decode() };
        memo.get_or_decode(DecodeMemo::key(m), decode)
    }
}

/// The SASS member for the target: found, none, or one that does not decompress.
enum Sass {
    Found(Module),
    None,
    Uncompress,
}

/// Functions and variables a whole program may leave to the driver.
pub(crate) const SYSTEM_EXTERNS: &[&str] = &["vprintf", "malloc", "free", "__assertfail"];

/// The functions the driver provides, as nvlink 13.5 lists them (its table
/// of system calls, `vprintf` to `cudaSubgridSchedule...`), and `malloc`: an
/// undefined call of one takes nothing from libcudadevrt, and nvlink reports
/// no undefined reference for it. Each measured: a unit calling it alone
/// (compiled, or a cubin whose call was renamed to it) beside `-lcudadevrt`
/// links without the runtime's member; a call of any other name (`printf`,
/// `__cuda_foo`) takes it.
const DRIVER_FUNCTIONS: &[&str] = &[
    "vprintf",
    "malloc",
    "free",
    "vfprintf",
    "__assertfail",
    "__profile",
    "cnpGetParameterBuffer",
    "cnpLaunchDevice",
    "cnpCtxSynchronize",
    "cnpFuncGetAttribute",
    "cnpStreamCreate",
    "cnpStreamDestroy",
    "cnpStreamWaitEvent",
    "cnpEventCreate",
    "cnpEventRecord",
    "cnpEventDestroy",
    "cnpDeviceGetName",
    "cnpDeviceGetAttribute",
    "cnpGetDeviceCount",
    "cnpGetDevice",
    "cnpGetLastError",
    "cnpSetLastError",
    "cnpGetCacheConfig",
    "cnpGetSharedMemConfig",
    "cnpGetLimit",
    "cnpDeviceGetTotalMem",
    "cnpGetParameterBufferV2",
    "cnpLaunchDeviceV2",
    "cudaGraphLaunch",
    "cudaGraphSetConditional",
    "cudaGraphKernelNodeSetParam",
    "cudaGraphKernelNodeSetGridDim",
    "cudaGraphKernelNodeSetEnabled",
    "cudaFabricOpErrorStatusCount",
    "cudaFabricOpErrorStatusGet",
    "cudaResizeSharedMemory",
    "cudaDeviceMemcpyAsync",
    "cudaDeviceMemcpyBatchAsync",
    "cudaGraphKernelNodeUpdatesApply",
    "cudaSubgridSynchronousWorkspaceInitialize",
    "cudaSubgridSynchronousWorkspaceCompleteAndFetchWorkItem",
    "cudaSubgridSynchronousWorkspaceAdvanceWorkset",
    "cudaSubgridSynchronousWorkspaceGetWorksetUserData",
    "cudaSubgridWarpSpecializedWorkspaceInitialize",
    "cudaSubgridWarpSpecializedWorkspaceAdvanceWorkset",
    "cudaSubgridWarpSpecializedWorkspaceGetWorksetUserData",
    "cudaSubgridWarpSpecializedWorkspaceFetchWorkItem",
    "cudaSubgridWarpSpecializedWorkspaceWaitOnWorkItemDependencies",
    "cudaSubgridWarpSpecializedWorkspaceCompleteWorkItem",
    "cudaSubgridScheduleManageWarpSpecializedWorkspaceAndDependencies",
];

/// Whether the driver provides function `name`: [`DRIVER_FUNCTIONS`], or a
/// name of nvlink's `__cuda_syscall` prefix (`__cuda_syscall_cnpv2*`, which
/// libcudadevrt itself calls; a made-up `__cuda_syscall_foo` too).
pub(crate) fn is_driver_function(name: &str) -> bool {
    name.starts_with("__cuda_syscall") || DRIVER_FUNCTIONS.contains(&name)
}

/// libcudadevrt semantics: take the members that define a function still
/// undefined, until nothing changes; then, if a function is still undefined,
/// the rest. Only undefined functions count ([`CubinInfo::undefined_functions`]):
/// nvlink takes nothing for an undefined variable, even one the runtime
/// defines (`__CNPRT_VERSION_NUMBER__`: an undefined reference, no member).
///
/// [`CubinInfo::undefined_functions`]: crate::input::cubin::CubinInfo::undefined_functions
pub(crate) fn select_members(units: &[Unit], lib: Library) -> Vec<Unit> {
    use std::collections::HashSet;
    let note = |u: &Unit, defined: &mut HashSet<String>, undefined: &mut HashSet<String>| {
        for m in &u.modules {
            if let Some(info) = &m.info {
                defined.extend(info.defined.iter().cloned());
                undefined.extend(info.undefined_functions.iter().cloned());
            }
        }
    };
    let (mut defined, mut undefined) = (HashSet::new(), HashSet::new());
    for u in units {
        note(u, &mut defined, &mut undefined);
    }
    let mut remaining: Vec<Option<Unit>> = lib.members.into_iter().map(Some).collect();
    let mut chosen = Vec::new();
    loop {
        let need: HashSet<&String> = undefined.iter().filter(|s| !defined.contains(*s)).collect();
        let pos = remaining.iter().position(|m| {
            m.as_ref().is_some_and(|u| {
                u.modules
                    .iter()
                    .any(|md| md.info.as_deref().is_some_and(|i| i.defined.iter().any(|d| need.contains(d))))
            })
        });
        let Some(u) = pos.and_then(|p| remaining[p].take()) else { break };
        note(&u, &mut defined, &mut undefined);
        chosen.push(u);
    }
    // A function still undefined when the library is searched, one it does
    // not define and not one the driver provides (`malloc`, `vprintf`:
    // thrust's objects; `cnp*`), takes its member too (measured on the
    // toolkit's one-member libcudadevrt: `-lcudadevrt -lxcall`, where
    // `-lxcall` defines what the objects call, or a link that ends in an
    // undefined reference, registers `cuda_device_runtime`; `-lcudadevrt`
    // after `-lxcall` does not; an undefined variable takes nothing).
    if undefined.iter().any(|s| !defined.contains(s) && !is_driver_function(s)) {
        chosen.extend(remaining.into_iter().flatten());
    }
    chosen
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A link decompresses at most [`MAX_LINK_DECOMPRESSED`] of its members:
    /// past it, before decompressing, the link is left to nvlink.
    #[test]
    fn a_links_members_decompress_within_its_bound() {
        let zeros = zstd::encode_all(&vec![0u8; 1 << 20][..], 3).unwrap();
        let ctx = LoadContext {
            fs: &crate::fs::LocalFs,
            cwd: Path::new("/"),
            target: Target { sm: 90, suffix: None },
            lto: false,
            suppress_arch_warning: false,
            memo: None,
            cpu_machine: cpu_machine(None),
            decompressed: Default::default(),
        };
        let small = fatbin::Member::compressed_for_test(&zeros, 1 << 20);
        assert_eq!(ctx.contents("a.o", &small).map(|c| c.len()).ok(), Some(1 << 20));
        let declared = fatbin::Member::compressed_for_test(&zeros, MAX_LINK_DECOMPRESSED);
        match ctx.contents("b.o", &declared) {
            Err(LoadError::Declined(d)) => assert!(d.detail.contains("past 1 GiB"), "{}", d.detail),
            other => panic!("decompressed past the bound: {:?}", other.map(|c| c.len())),
        }
    }
}
