//! Loading the inputs of a link into units of device code.
//!
//! nvlink decides what an input is from its file-name extension first
//! (`.cubin`, `.ptx`, `.fatbin`, `.nvvm`/`.ltoir`), then from an archive
//! magic, and treats everything else as a host object. This loader follows the
//! same decision tree for the cases whose nvlink behaviour is pinned down by the
//! parity tests; anything else is reported as [`LoadError::Unsupported`] and the
//! linker hands the whole link to the real nvlink.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::archive;
use super::classify::{classify, Content};
use super::cubin::{self, CubinInfo};
use super::host::{HostObject, HostRefs};
use super::libsearch;
use super::Bytes;
use crate::diag::Diagnostic;
use crate::elf::Elf;
use crate::fatbin::{self, MemberKind};
use crate::fs::{absolute, InputFs};
use crate::regbin::synthetic_module_id;

/// Device code of one module.
#[derive(Clone, Debug)]
pub enum Code {
    Cubin(Bytes),
    Ptx(Bytes),
    LtoIr(Bytes),
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
    pub info: Option<CubinInfo>,
}

/// One input file or archive member, as nvlink names it in messages.
#[derive(Clone, Debug)]
pub struct Unit {
    pub name: String,
    pub module_id: Option<String>,
    pub host_refs: Option<HostRefs>,
    pub modules: Vec<Module>,
    /// Came from an archive (`-l` or a named archive).
    pub from_archive: bool,
    /// The CUDA device runtime (`libcudadevrt`).
    pub is_cudadevrt: bool,
    /// A cubin or PTX file: device code without host code.
    pub device_only: bool,
}

#[derive(Debug)]
pub enum LoadError {
    /// nvlink stops with this message.
    Fatal(Diagnostic),
    /// A case the in-process engine does not reproduce.
    Unsupported(String),
}

impl From<Diagnostic> for LoadError {
    fn from(d: Diagnostic) -> Self {
        LoadError::Fatal(d)
    }
}

fn unsupported<T>(why: impl Into<String>) -> Result<T, LoadError> {
    Err(LoadError::Unsupported(why.into()))
}

/// What the loader needs to know about the link.
pub struct LoadContext<'a> {
    pub fs: &'a dyn InputFs,
    pub cwd: &'a Path,
    pub sm: u32,
    pub lto: bool,
}

/// A loaded archive: its members that carry device code, in order.
#[derive(Debug)]
pub struct Library {
    /// Path as nvlink names it.
    pub name: String,
    /// Absolute path, to load each archive once.
    pub path: PathBuf,
    pub members: Vec<Unit>,
}

impl Library {
    /// The CUDA device runtime is a "system library" nvlink trims.
    pub fn is_system(&self) -> bool {
        self.name.rsplit('/').next().is_some_and(|f| f.contains("cudadevrt"))
    }
}

fn extension(path: &str) -> &str {
    let file = path.rsplit('/').next().unwrap_or(path);
    match file.rfind('.') {
        Some(i) => &file[i + 1..],
        None => "",
    }
}

impl LoadContext<'_> {
    fn read(&self, given: &str) -> Result<Bytes, LoadError> {
        use std::io::ErrorKind::*;
        self.fs.read(&absolute(self.cwd, given)).map_err(|e| match e.kind() {
            NotFound | PermissionDenied | IsADirectory => {
                LoadError::Fatal(Diagnostic::fatal(format!("Could not open input file '{given}'")))
            }
            // Too large for the wire, or the caller went away: not nvlink's business.
            _ => LoadError::Unsupported(format!("cannot read {given}: {e}")),
        })
    }

    /// Load one input named on the command line.
    pub fn input(&self, given: &str) -> Result<InputItem, LoadError> {
        let data = self.read(given)?;
        let content = classify(&data);
        match (extension(given), content) {
            ("cubin", Content::Cubin) => Ok(InputItem::Unit(self.cubin_unit(given, data)?)),
            ("ptx", Content::Ptx) => Ok(InputItem::Unit(Unit {
                name: given.to_owned(),
                module_id: Some(synthetic_module_id(&absolute(self.cwd, given))),
                host_refs: None,
                modules: vec![Module { code: Code::Ptx(data), arch: self.sm, options: String::new(), info: None }],
                from_archive: false,
                is_cudadevrt: false,
                device_only: true,
            })),
            ("cubin" | "ptx" | "fatbin" | "nvvm" | "ltoir" | "bc", _) => {
                unsupported(format!("{given}: extension/content"))
            }
            (_, Content::Archive) => Ok(InputItem::Library(self.archive(given, data)?)),
            (_, Content::HostElf) => match self.host_unit(given, &data, false)? {
                Some(u) => Ok(InputItem::Unit(u)),
                None => Ok(InputItem::Nothing),
            },
            _ => unsupported(format!("{given}: {content:?} input")),
        }
    }

    /// Resolve and load `-l name`.
    pub fn library(&self, name: &str, dirs: &[PathBuf]) -> Result<Option<Library>, LoadError> {
        let Some(path) = libsearch::find(self.fs, dirs, name) else {
            return unsupported(format!("library {name} not found"));
        };
        let shown = path.to_string_lossy().into_owned();
        let data = self.read(&shown)?;
        if classify(&data) != Content::Archive {
            return unsupported(format!("{shown} is not an archive"));
        }
        Ok(Some(self.archive(&shown, data)?))
    }

    fn archive(&self, shown: &str, data: Bytes) -> Result<Library, LoadError> {
        let (thin, members) =
            archive::members(&data).or_else(|_| unsupported(format!("{shown}: malformed archive")))?;
        if thin {
            return unsupported(format!("{shown}: thin archive"));
        }
        let mut units = Vec::new();
        for m in members {
            let Some(bytes) = m.data else { return unsupported("thin member") };
            let member_name = format!("{shown}:{}", m.name);
            if classify(bytes) != Content::HostElf {
                return unsupported(format!("{member_name}: archive member is not a host object"));
            }
            if let Some(mut u) = self.host_unit(&member_name, bytes, true)? {
                u.from_archive = true;
                units.push(u);
            }
        }
        let mut lib = Library { name: shown.to_owned(), path: absolute(self.cwd, shown), members: units };
        if lib.is_system() {
            for m in &mut lib.members {
                m.is_cudadevrt = true;
            }
        }
        Ok(lib)
    }

    fn cubin_unit(&self, name: &str, data: Bytes) -> Result<Unit, LoadError> {
        let info = cubin::read(&data).or_else(|e| unsupported(format!("{name}: {e}")))?;
        if !info.relocatable {
            return unsupported(format!("{name}: executable cubin input"));
        }
        if info.sm != self.sm {
            return unsupported(format!("{name}: cubin for sm_{} linked for sm_{}", info.sm, self.sm));
        }
        Ok(Unit {
            name: name.to_owned(),
            module_id: Some(synthetic_module_id(&absolute(self.cwd, name))),
            host_refs: None,
            modules: vec![Module { code: Code::Cubin(data), arch: info.sm, options: String::new(), info: Some(info) }],
            from_archive: false,
            is_cudadevrt: false,
            device_only: true,
        })
    }

    /// The device code of a host object: the member for the target arch.
    fn host_unit(&self, name: &str, data: &[u8], in_archive: bool) -> Result<Option<Unit>, LoadError> {
        let elf = Elf::parse(data).or_else(|e| unsupported(format!("{name}: {e}")))?;
        let host = HostObject::read(&elf);
        let Some(fatbin_bytes) = host.relfatbin else {
            if host.has_nv_fatbin {
                return unsupported(format!("{name}: whole-program (non -rdc) object"));
            }
            return if in_archive { Ok(None) } else { unsupported(format!("{name}: host object without device code")) };
        };
        let members = fatbin::parse(fatbin_bytes).or_else(|e| unsupported(format!("{name}: fatbin: {e}")))?;
        let pick = |kind: MemberKind| members.iter().find(|m| m.kind == kind && m.arch == self.sm);
        let module = if self.lto {
            return unsupported("LTO links");
        } else if let Some(m) = pick(MemberKind::Cubin) {
            let bytes: Bytes = m.contents().or_else(|e| unsupported(format!("{name}: {e}")))?.into_owned().into();
            let info = cubin::read(&bytes).or_else(|e| unsupported(format!("{name}: {e}")))?;
            Module { code: Code::Cubin(bytes), arch: m.arch, options: m.options.to_owned(), info: Some(info) }
        } else if let (true, Some(m)) = (members.iter().all(|m| m.kind == MemberKind::Ptx), pick(MemberKind::Ptx)) {
            // PTX only, for exactly this arch: nvlink compiles it at link time.
            let bytes: Bytes = m.contents().or_else(|e| unsupported(format!("{name}: {e}")))?.into_owned().into();
            Module { code: Code::Ptx(bytes), arch: m.arch, options: m.options.to_owned(), info: None }
        } else {
            return unsupported(format!("{name}: no sm_{} cubin member", self.sm));
        };
        Ok(Some(Unit {
            name: name.to_owned(),
            module_id: host.module_id,
            host_refs: host.host_refs,
            modules: vec![module],
            from_archive: in_archive,
            is_cudadevrt: false,
            device_only: false,
        }))
    }
}

/// What one command-line input contributes.
#[derive(Debug)]
pub enum InputItem {
    Unit(Unit),
    Library(Library),
    Nothing,
}

/// Archive semantics: take members that define a symbol still undefined, until
/// nothing changes.
pub fn select_members(units: &[Unit], lib: Library) -> Vec<Unit> {
    let mut defined: HashSet<String> = HashSet::new();
    let mut undefined: HashSet<String> = HashSet::new();
    let note = |u: &Unit, defined: &mut HashSet<String>, undefined: &mut HashSet<String>| {
        for m in &u.modules {
            if let Some(info) = &m.info {
                defined.extend(info.defined.iter().cloned());
                undefined.extend(info.undefined.iter().cloned());
            }
        }
    };
    for u in units {
        note(u, &mut defined, &mut undefined);
    }
    let mut remaining: Vec<Option<Unit>> = lib.members.into_iter().map(Some).collect();
    let mut chosen = Vec::new();
    loop {
        let need: HashSet<&String> = undefined.iter().filter(|s| !defined.contains(*s)).collect();
        let pos = remaining.iter().position(|m| {
            m.as_ref().is_some_and(|u| {
                u.modules.iter().any(|md| md.info.as_ref().is_some_and(|i| i.defined.iter().any(|d| need.contains(d))))
            })
        });
        let Some(pos) = pos else { break };
        let Some(u) = remaining[pos].take() else { break };
        note(&u, &mut defined, &mut undefined);
        chosen.push(u);
    }
    chosen
}

/// A convenient shared empty byte buffer.
pub fn empty() -> Bytes {
    Arc::from(Vec::new())
}
