//! What the link plan needs to know about a device cubin: its target, its
//! functions in `.text` order (for the finalizer's ghost names), and the global
//! symbols it defines and needs (for archive member selection and diagnostics).

use crate::elf::{Elf, ElfError, EM_CUDA};
use crate::finalize::strtab::InputFunction;

#[derive(Clone, Debug, Default)]
pub struct CubinInfo {
    /// SM number from `e_flags`.
    pub sm: u32,
    /// `ET_REL` (relocatable, linkable) vs `ET_EXEC`.
    pub relocatable: bool,
    /// Functions defined here, in symbol-table order.
    pub functions: Vec<InputFunction>,
    /// Global and weak symbols defined here.
    pub defined: Vec<String>,
    /// Weak definitions among them.
    pub weak: Vec<String>,
    /// Global symbols referenced but not defined.
    pub undefined: Vec<String>,
    /// Kernel (entry function) names, local ones included.
    pub kernels: Vec<String>,
}

/// The SM number encoded in a cubin's `e_flags` (bits 8..16 for the ABI of sm_75+).
pub fn sm_of(elf: &Elf<'_>) -> u32 {
    (elf.flags >> 8) & 0xff
}

pub fn read(data: &[u8]) -> Result<CubinInfo, ElfError> {
    let elf = Elf::parse(data)?;
    if elf.machine != EM_CUDA {
        return Err(ElfError::Malformed("not a device ELF"));
    }
    let symbols = elf.symbols()?;
    // Functions in symbol-table order: the order nvlink's merge visits them.
    let functions: Vec<InputFunction> = symbols
        .iter()
        .filter(|s| s.kind() == object::elf::STT_FUNC.0 && s.is_defined())
        .filter(|s| {
            elf.sections.get(s.shndx as usize).is_some_and(|sec| sec.name.strip_prefix(".text.") == Some(&s.name))
        })
        .map(|s| InputFunction { name: s.name.clone(), is_kernel: s.is_entry() })
        .collect();
    let mut info = CubinInfo {
        sm: sm_of(&elf),
        relocatable: elf.e_type == object::elf::ET_REL.0,
        kernels: functions.iter().filter(|f| f.is_kernel).map(|f| f.name.clone()).collect(),
        functions,
        ..Default::default()
    };
    for s in symbols.iter().filter(|s| s.is_global() && !s.name.is_empty()) {
        if s.is_defined() {
            info.defined.push(s.name.clone());
            if s.is_weak() {
                info.weak.push(s.name.clone());
            }
        } else if !s.is_weak() {
            info.undefined.push(s.name.clone());
        }
    }
    Ok(info)
}
