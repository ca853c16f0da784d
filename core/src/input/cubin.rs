//! What the link plan needs to know about a device cubin: its target, its
//! functions in `.text` order and its names (for the finalizer's ghost names),
//! and the global symbols it defines and needs (for archive member selection
//! and diagnostics).

use std::sync::Arc;

use crate::elf::{Elf, ElfError, EM_CUDA};
use crate::finalize::strtab::InputFunction;

#[derive(Clone, Debug, Default)]
pub struct CubinInfo {
    /// SM number from `e_flags`.
    pub sm: u32,
    /// `ET_REL` (relocatable, linkable) vs `ET_EXEC`.
    pub relocatable: bool,
    /// Built for an arch-specific (`sm_90a`) target: `.nv.compat` marks it.
    pub accelerated: bool,
    /// Functions defined here, in symbol-table order.
    pub functions: Vec<InputFunction>,
    /// The names this cubin brings to a linked output's string tables (for
    /// the finalizer's ghost names): its section names, the names of its
    /// local symbols (section symbols aside), and `.nv_debug.shared`, which
    /// nvlink makes for a cubin that refers to an `extern __shared__` array.
    pub names: Arc<[String]>,
    /// Global and weak symbols defined here.
    pub defined: Vec<String>,
    /// Weak definitions among them.
    pub weak: Vec<String>,
    /// Functions referenced but not defined here, weak references included:
    /// the undefined symbols that ask libcudadevrt for its member
    /// ([`crate::input::load::select_members`]). Undefined variables, the
    /// linker's own symbols (`__UFT*`, `__UDT*`, `.nv.reservedSmem.*`) and
    /// `extern __shared__` arrays ask nothing, whatever their binding.
    pub undefined_functions: Vec<String>,
    /// Kernel (entry function) names, local ones included.
    pub kernels: Vec<String>,
    /// Local (static) function names, which resolve within this cubin only.
    pub local_functions: Vec<String>,
    /// References found in relocations: from a function's code, or from data.
    pub refs: Vec<Ref>,
    /// Some `.nv.info` section carries `EIATTR_TOOLS_PATCH_FUNC` (0x4b), which
    /// only a tools-patch compile writes (`--link-as-tools-patch` requires it).
    pub tools_patch: bool,
}

/// A relocation's reference to a symbol.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ref {
    /// The function whose code refers, or `None` for data (initializers,
    /// constant banks): data is always kept, so its targets are live.
    pub from: Option<String>,
    /// The symbol referred to (for a section symbol of `.text.F`: `F`).
    pub to: String,
}

/// The SM number encoded in a cubin's `e_flags` (bits 8..16 for the ABI of sm_75+).
pub(crate) fn sm_of(elf: &Elf<'_>) -> u32 {
    (elf.flags >> 8) & 0xff
}

/// `EIATTR_TOOLS_PATCH_FUNC`.
const EIATTR_TOOLS_PATCH_FUNC: u8 = 0x4b;

/// Whether an `.nv.info`-shaped section holds attribute `attr`, in any format.
fn has_attribute(data: &[u8], attr: u8) -> bool {
    info_entries(data).any(|e| e.attr == attr)
}

/// One entry of an `.nv.info`-shaped section ([`info_entries`]).
pub(crate) struct InfoEntry<'a> {
    pub format: u8,
    pub attr: u8,
    /// The 16-bit value (formats 1 to 3) or the size of what follows (format 4).
    pub value: u16,
    /// The whole entry, header included; `None` when the section ends inside it.
    pub bytes: Option<&'a [u8]>,
}

/// The entries of an `.nv.info`-shaped section: format byte, attribute byte,
/// then a 16-bit value (formats 1 to 3) or a 16-bit size and that many bytes
/// (format 4). Ends where fewer than 4 bytes are left.
pub(crate) fn info_entries(data: &[u8]) -> impl Iterator<Item = InfoEntry<'_>> {
    let mut at = 0;
    std::iter::from_fn(move || {
        let head = data.get(at..at + 4)?;
        let value = u16::from_le_bytes([head[2], head[3]]);
        let len = 4 + if head[0] == 4 { value as usize } else { 0 };
        let entry = InfoEntry { format: head[0], attr: head[1], value, bytes: data.get(at..at + len) };
        at += len;
        Some(entry)
    })
}

/// The value of attribute `attr` in a `.nv.compat` section (0 when absent).
/// Entries are `.nv.info` shaped: format byte, attribute byte, then a 16-bit
/// value (formats 1 to 3) or a 16-bit size and that many bytes (format 4).
fn compat_value(data: &[u8], attr: u8) -> u16 {
    info_entries(data).find(|e| e.format != 4 && e.attr == attr).map_or(0, |e| e.value)
}

/// An input cubin's information, when it has the shape ptxas writes
/// ([`super::canonical`]); an unusual one is `Malformed`, left to nvlink.
pub fn read_input(data: &[u8]) -> Result<CubinInfo, ElfError> {
    let elf = Elf::parse(data)?;
    let symbols = super::canonical::unusual_with_symbols(&elf).map_err(ElfError::Malformed)?;
    read_parsed(&elf, symbols)
}

/// The first way `data` differs from a cubin ptxas writes, if it does
/// (`Some("not an ELF file")` when it does not parse).
pub fn unusual(data: &[u8]) -> Option<&'static str> {
    match Elf::parse(data) {
        Ok(elf) => super::canonical::unusual(&elf),
        Err(_) => Some("not an ELF file"),
    }
}

pub fn read(data: &[u8]) -> Result<CubinInfo, ElfError> {
    let elf = Elf::parse(data)?;
    let symbols = elf.symbols()?;
    read_parsed(&elf, symbols)
}

fn read_parsed(elf: &Elf<'_>, symbols: Vec<crate::elf::Symbol>) -> Result<CubinInfo, ElfError> {
    if elf.machine != EM_CUDA {
        return Err(ElfError::Malformed("not a device ELF"));
    }
    // Functions in symbol-table order: the order nvlink's merge visits them.
    let functions: Vec<InputFunction> = symbols
        .iter()
        .filter(|s| s.kind() == object::elf::STT_FUNC.0 && s.is_defined())
        .filter(|s| {
            elf.sections.get(s.shndx as usize).is_some_and(|sec| sec.name.strip_prefix(".text.") == Some(&s.name))
        })
        .map(|s| InputFunction { name: s.name.clone(), is_kernel: s.is_entry() })
        .collect();
    let mut names: Vec<String> = elf.sections.iter().map(|s| s.name.clone()).filter(|n| !n.is_empty()).collect();
    names.extend(
        symbols
            .iter()
            .filter(|s| !s.is_global() && s.kind() != object::elf::STT_SECTION.0 && !s.name.is_empty())
            .map(|s| s.name.clone()),
    );
    if symbols.iter().any(|s| s.is_dynamic_shared()) {
        names.push(".nv_debug.shared".to_owned());
    }
    let mut info = CubinInfo {
        sm: sm_of(elf),
        relocatable: elf.e_type == object::elf::ET_REL.0,
        accelerated: elf.section(".nv.compat").is_some_and(|(_, c)| compat_value(elf.section_data(c), 0x09) > 0),
        kernels: functions.iter().filter(|f| f.is_kernel).map(|f| f.name.clone()).collect(),
        local_functions: symbols
            .iter()
            .filter(|s| s.kind() == object::elf::STT_FUNC.0 && s.is_defined() && !s.is_global())
            .map(|s| s.name.clone())
            .collect(),
        refs: relocation_refs(elf, &symbols)?,
        functions,
        names: names.into(),
        tools_patch: elf
            .sections
            .iter()
            .filter(|s| s.name == ".nv.info" || s.name.starts_with(".nv.info."))
            .any(|s| has_attribute(elf.section_data(s), EIATTR_TOOLS_PATCH_FUNC)),
        ..Default::default()
    };
    for s in symbols.iter().filter(|s| s.is_global() && !s.name.is_empty()) {
        if s.is_defined() {
            info.defined.push(s.name.clone());
            if s.is_weak() {
                info.weak.push(s.name.clone());
            }
        } else if s.kind() == object::elf::STT_FUNC.0 {
            // Only an undefined function makes nvlink take libcudadevrt, weak
            // or not. An nvcc cubin's references to the linker's symbols
            // (`__UFT`, `.nv.reservedSmem.offset0`, ...) are weak, nvlink
            // `-r` writes them global; both are objects, as are undefined
            // `extern __device__` variables (even one libcudadevrt defines)
            // and `extern __shared__` arrays (CUDA_OBJECT): none takes it.
            info.undefined_functions.push(s.name.clone());
        }
    }
    Ok(info)
}

/// Debug and line information (`-G`, `-lineinfo`): `.debug_*`, `.nv.debug_*`
/// and NVIDIA's `.nv_debug_line_sass`, `.nv_debug_ptx_txt.<N>`. Their
/// relocations name every function and keep none alive.
fn is_debug_section(name: &str) -> bool {
    name.starts_with(".debug") || name.starts_with(".nv.debug") || name.starts_with(".nv_debug")
}

const SHT_RELA: u32 = 4;
const SHT_REL: u32 = 9;

/// The symbol references of every relocation section, attributed to the
/// function whose `.text` they patch (or to data). Debug sections refer to
/// every function and keep nothing alive: they are skipped.
fn relocation_refs(elf: &Elf<'_>, symbols: &[crate::elf::Symbol]) -> Result<Vec<Ref>, ElfError> {
    let name_of = |idx: usize| -> Option<String> {
        let s = symbols.get(idx)?;
        if s.kind() == object::elf::STT_SECTION.0 {
            let sec = elf.sections.get(s.shndx as usize)?;
            return sec.name.strip_prefix(".text.").map(str::to_owned);
        }
        (!s.name.is_empty()).then(|| s.name.clone())
    };
    let mut refs = Vec::new();
    for rs in elf.sections.iter().filter(|s| s.sh_type == SHT_RELA || s.sh_type == SHT_REL) {
        let target = elf.sections.get(rs.info as usize).ok_or(ElfError::Malformed("relocation target"))?;
        if is_debug_section(&target.name) {
            continue;
        }
        let from = target.name.strip_prefix(".text.").map(str::to_owned);
        let entsize = if rs.sh_type == SHT_RELA { 24 } else { 16 };
        for entry in elf.section_data(rs).chunks_exact(entsize) {
            let info = u64::from_le_bytes(entry[8..16].try_into().map_err(|_| ElfError::Malformed("relocation"))?);
            if let Some(to) = name_of((info >> 32) as usize) {
                if from.as_deref() != Some(to.as_str()) {
                    refs.push(Ref { from: from.clone(), to });
                }
            }
        }
    }
    refs.extend(callgraph_refs(elf, symbols));
    refs.sort_by(|a, b| (&a.from, &a.to).cmp(&(&b.from, &b.to)));
    refs.dedup();
    Ok(refs)
}

/// The calls `.nv.callgraph` records: (caller, callee) symbol-index pairs;
/// indices from 0xfffffff0 up and caller 0 are markers, not calls. ptxas
/// records a call it inlined as an instruction (`__cuda_reduxsync_s32_add`
/// becomes `REDUX`), which leaves no relocation, and nvlink keeps the callee.
fn callgraph_refs<'e>(elf: &'e Elf<'_>, symbols: &'e [crate::elf::Symbol]) -> impl Iterator<Item = Ref> + 'e {
    let data = elf.section(".nv.callgraph").map(|(_, s)| elf.section_data(s)).unwrap_or_default();
    let function = move |idx: u32| -> Option<String> {
        let s = symbols.get(usize::try_from(idx).ok()?)?;
        (s.kind() == object::elf::STT_FUNC.0 && !s.name.is_empty()).then(|| s.name.clone())
    };
    data.chunks_exact(8).filter_map(move |e| {
        let caller = u32::from_le_bytes([e[0], e[1], e[2], e[3]]);
        let callee = u32::from_le_bytes([e[4], e[5], e[6], e[7]]);
        if caller == 0 || callee >= 0xffff_fff0 || caller == callee {
            return None;
        }
        Some(Ref { from: Some(function(caller)?), to: function(callee)? })
    })
}

#[cfg(test)]
mod compat_tests {
    use super::compat_value;

    #[test]
    fn compat_attributes() {
        // Shape of an sm_90a cubin's .nv.compat: the 0x09 attribute set.
        let data = [2, 9, 1, 0, 2, 0x0c, 0, 0, 4, 0x0b, 2, 0, 0xaa, 0xbb, 3, 0x0e, 0x40, 4];
        assert_eq!(compat_value(&data, 0x09), 1);
        assert_eq!(compat_value(&data, 0x0e), 0x0440);
        assert_eq!(compat_value(&data, 0x07), 0);
        // Truncated and oversized entries end the walk without a panic.
        assert_eq!(compat_value(&[4, 0x0b, 0xff, 0xff, 1], 0x09), 0);
        assert_eq!(compat_value(&[2, 9], 0x09), 0);
    }

    #[test]
    fn attributes_found_in_any_format() {
        use super::has_attribute;
        // A format-4 entry's payload is skipped, not read as attributes.
        let data = [4, 0x2f, 4, 0, 0x4b, 0x4b, 0x4b, 0x4b, 1, 0x4b, 0, 0];
        assert!(has_attribute(&data, 0x4b));
        assert!(has_attribute(&data, 0x2f));
        assert!(!has_attribute(&data[..8], 0x4b));
        assert!(!has_attribute(&[4, 0x2f, 0xff, 0xff], 0x4b));
    }
}

#[cfg(test)]
mod symbol_tests {
    use super::read;

    /// A relocatable sm_90 device ELF whose symbol table holds `symbols`
    /// (name, `st_info`, `st_other`, defined in its one `.text.f`).
    fn cubin(symbols: &[(&str, u8, u8, bool)]) -> Vec<u8> {
        let shstrtab = b"\0.shstrtab\0.strtab\0.symtab\0.text.f\0".to_vec();
        let mut strtab = vec![0u8];
        let mut symtab = vec![0u8; 24];
        for (name, info, other, defined) in symbols {
            let mut sym = [0u8; 24];
            sym[0..4].copy_from_slice(&(strtab.len() as u32).to_le_bytes());
            sym[4] = *info;
            sym[5] = *other;
            sym[6..8].copy_from_slice(&(if *defined { 4u16 } else { 0 }).to_le_bytes());
            symtab.extend_from_slice(&sym);
            strtab.extend_from_slice(name.as_bytes());
            strtab.push(0);
        }
        let text = vec![0u8; 16];
        // (name offset, type, link, entsize, contents)
        let sections: [(u32, u32, u32, u64, &[u8]); 4] =
            [(1, 3, 0, 0, &shstrtab), (11, 3, 0, 0, &strtab), (19, 2, 2, 24, &symtab), (27, 1, 0, 0, &text)];
        let mut body = Vec::new();
        let mut headers = vec![0u8; 64];
        for (name, kind, link, entsize, data) in sections {
            let mut h = [0u8; 64];
            h[0..4].copy_from_slice(&name.to_le_bytes());
            h[4..8].copy_from_slice(&kind.to_le_bytes());
            h[24..32].copy_from_slice(&(64 + body.len() as u64).to_le_bytes());
            h[32..40].copy_from_slice(&(data.len() as u64).to_le_bytes());
            h[40..44].copy_from_slice(&link.to_le_bytes());
            h[56..64].copy_from_slice(&entsize.to_le_bytes());
            headers.extend_from_slice(&h);
            body.extend_from_slice(data);
        }
        let mut elf = vec![0u8; 64];
        elf[0..7].copy_from_slice(b"\x7fELF\x02\x01\x01");
        elf[16..18].copy_from_slice(&1u16.to_le_bytes()); // ET_REL
        elf[18..20].copy_from_slice(&190u16.to_le_bytes()); // EM_CUDA
        elf[20..24].copy_from_slice(&1u32.to_le_bytes());
        elf[40..48].copy_from_slice(&(64 + body.len() as u64).to_le_bytes()); // e_shoff
        elf[48] = 5; // e_flags: sm_90
        elf[49] = 90;
        elf[52..54].copy_from_slice(&64u16.to_le_bytes()); // e_ehsize
        elf[58..60].copy_from_slice(&64u16.to_le_bytes()); // e_shentsize
        elf[60..62].copy_from_slice(&5u16.to_le_bytes()); // e_shnum
        elf[62..64].copy_from_slice(&1u16.to_le_bytes()); // e_shstrndx
        elf.extend_from_slice(&body);
        elf.extend_from_slice(&headers);
        elf
    }

    const GLOBAL: u8 = 1 << 4;
    const WEAK: u8 = 2 << 4;
    const NOTYPE: u8 = 0;
    const OBJECT: u8 = 1;
    const FUNC: u8 = 2;
    const CUDA_OBJECT: u8 = 13;

    /// Only undefined functions, weak ones too, ask libcudadevrt for its
    /// member: nvlink `-r` writes the linker's symbols as global references
    /// where nvcc writes them weak, and neither takes anything (measured with
    /// nvlink 13.5 on such cubins and on cubins edited to each case).
    #[test]
    fn only_undefined_functions_ask_for_a_definition() {
        let data = cubin(&[
            ("f", GLOBAL | FUNC, 0, true),
            // An nvcc cubin's references to the linker's symbols...
            ("__UFT", WEAK | OBJECT, 0, false),
            (".nv.reservedSmem.offset0", WEAK | OBJECT, 0, false),
            // ... and nvlink -r's.
            ("__UDT", GLOBAL | OBJECT, 0, false),
            (".nv.reservedSmem.cap", GLOBAL | OBJECT, 0, false),
            // An `extern __device__` variable, an `extern __shared__` array
            // (shared CUDA_OBJECT), a symbol without a type.
            ("missing_var", GLOBAL | OBJECT, 0, false),
            ("smem", WEAK | CUDA_OBJECT, 0x40, false),
            ("untyped", GLOBAL | NOTYPE, 0, false),
            // Calls.
            ("g", GLOBAL | FUNC, 0, false),
            ("h", WEAK | FUNC, 0, false),
        ]);
        let info = read(&data).expect("a cubin");
        assert_eq!(info.sm, 90);
        assert_eq!(info.defined, ["f"]);
        assert_eq!(info.undefined_functions, ["g", "h"]);
    }
}
