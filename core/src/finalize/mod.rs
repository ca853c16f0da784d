//! Turning an nvJitLink cubin into the cubin nvlink writes.
//!
//! nvJitLink shares nvlink's linker, so for the same inputs it produces the same
//! code, symbols, relocations and section order. What differs is bookkeeping:
//! the tool entries of `.note.nv.tkinfo` ([`tkinfo`]), the names dead kernels
//! leave in the string tables ([`strtab`]), and, as a consequence, every file
//! offset. [`finalize`] fixes the bookkeeping and lays the file out again with
//! nvlink's rules ([`image`]).

pub mod image;
pub mod strtab;
pub mod tkinfo;

use std::collections::{BTreeSet, HashSet};

use image::CubinImage;
use strtab::{InputObject, StrTab};

/// The build string nvJitLink's embedded ptxas writes for PTX it compiled itself.
pub const JIT_PTXAS_BUILD_PLACEHOLDER: &str = "Build system must define TOOLS_VERSION_EXTENDED";

#[derive(Debug, thiserror::Error)]
pub enum FinalizeError {
    #[error("nvJitLink output: {0}")]
    Elf(#[from] crate::elf::ElfError),
    #[error("tkinfo: {0}")]
    Note(#[from] tkinfo::NoteError),
    #[error("string table: {0}")]
    StrTab(#[from] strtab::StrTabError),
    #[error("nvJitLink output has no {0}")]
    Missing(&'static str),
    #[error("unexpected tkinfo entries: {0}")]
    UnexpectedEntries(String),
    #[error("not reproduced: {0}")]
    NotReproduced(&'static str),
}

/// What nvlink would have written that nvJitLink did not.
#[derive(Clone, Debug)]
pub struct Fixups {
    /// nvlink's own tkinfo entry (replaces nvJitLink's "nvJIT API" entry);
    /// `None` for whole-program LTO, where nvlink writes no entry of its own.
    pub linker_entry: Option<tkinfo::Entry>,
    /// The functions and names of each linked cubin in link order, to place
    /// ghost names of dead kernels; empty when nothing was removed.
    pub inputs: Vec<InputObject>,
}

/// Rewrite `jit_cubin` into nvlink's bytes.
pub fn finalize(jit_cubin: &[u8], fix: &Fixups) -> Result<Vec<u8>, FinalizeError> {
    let mut img = CubinImage::parse(jit_cubin)?;
    rewrite_tkinfo(&mut img, fix)?;
    // Mercury cubins (sm_100 and later: `.nv.merc.*` sections) get their string
    // tables written afresh by nvlink: dead kernels leave no names there.
    let mercury = img.sections.iter().any(|s| s.name.starts_with(".nv.merc."));
    if !fix.inputs.is_empty() && !mercury {
        insert_ghost_names(&mut img, &fix.inputs)?;
    }
    Ok(img.serialize())
}

/// Give the one tool entry of a cubin the toolkit's ptxas made the object
/// name and options nvlink's embedded ptxas records, and lay the file out
/// again (`-dlto -g`: nvlink's ptxas names its output `elf.o` and records no
/// input or output file).
pub fn rename_ptxas_entry(cubin: &[u8], object: &str, options: &str) -> Result<Vec<u8>, FinalizeError> {
    let mut img = CubinImage::parse(cubin)?;
    let idx = img.section_index(".note.nv.tkinfo").ok_or(FinalizeError::Missing(".note.nv.tkinfo"))?;
    let mut entries = tkinfo::parse(&img.sections[idx].data)?;
    match entries.as_mut_slice() {
        [e] if e.tool == "ptxas" => {
            e.object = object.to_owned();
            e.options = options.to_owned();
        }
        _ => return Err(FinalizeError::UnexpectedEntries("not one ptxas entry".into())),
    }
    img.sections[idx].data = tkinfo::serialize(&entries);
    Ok(img.serialize())
}

/// `EIATTR_MIN_STACK_SIZE`, an `.nv.info` entry of format 4: symbol index, bytes.
const EIATTR_MIN_STACK_SIZE: u8 = 0x12;

/// nvlink's `-g --suppress-debug-info` output from its `-g` output (`cubin`,
/// finalized): the `EIATTR_MIN_STACK_SIZE` entries of `.nv.info` naming one
/// of `removed` (the kernels host-reference pruning would remove, which `-g`
/// keeps) dropped, everything else as `-g` leaves it. Measured on programs
/// without libcudadevrt code. Not reproduced, an error: a local symbol named
/// `$...` (a function-scope `__shared__` variable), which nvlink drops from
/// the symbol table too, renumbering every symbol after it; Mercury cubins
/// (sm_100 and later), whose code nvlink compiles again without debug
/// information; device debug information (`nvcc -G` objects: `.debug_info`
/// and the like), whose relocations keep every kernel for the plan.
pub fn suppress_debug_info(cubin: &[u8], removed: &BTreeSet<String>) -> Result<Vec<u8>, FinalizeError> {
    let mut img = CubinImage::parse(cubin)?;
    if img.sections.iter().any(|s| s.name.starts_with(".nv.merc.")) {
        return Err(FinalizeError::NotReproduced("--suppress-debug-info of a Mercury cubin (sm_100 and later)"));
    }
    if img.sections.iter().any(|s| s.name.starts_with(".debug_") && s.name != ".debug_frame") {
        return Err(FinalizeError::NotReproduced("--suppress-debug-info with device debug information (-G)"));
    }
    let symtab =
        img.sections.iter().find(|s| s.sh_type == crate::elf::SHT_SYMTAB).ok_or(FinalizeError::Missing(".symtab"))?;
    let strtab = img.sections.get(symtab.link as usize).ok_or(FinalizeError::Missing(".strtab"))?;
    let mut names = Vec::new();
    for entry in symtab.data.chunks_exact(24) {
        let at = u32::from_le_bytes([entry[0], entry[1], entry[2], entry[3]]) as usize;
        let name = strtab
            .data
            .get(at..)
            .and_then(|t| t.split(|&b| b == 0).next())
            .ok_or(FinalizeError::Missing("symbol name"))?;
        let local = entry[4] >> 4 == 0;
        if local && name.starts_with(b"$") {
            return Err(FinalizeError::NotReproduced("--suppress-debug-info drops local `$` symbols"));
        }
        names.push(name.to_vec());
    }
    let idx = img.section_index(".nv.info").ok_or(FinalizeError::Missing(".nv.info"))?;
    let data = &img.sections[idx].data;
    let mut kept = Vec::with_capacity(data.len());
    let mut seen = 0;
    for e in crate::input::cubin::info_entries(data) {
        let entry = e.bytes.ok_or(FinalizeError::Missing("whole .nv.info entries"))?;
        seen += entry.len();
        let sym = entry.get(4..8).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize);
        let named = sym.and_then(|i| names.get(i)).and_then(|n| std::str::from_utf8(n).ok());
        let drop = e.format == 4 && e.attr == EIATTR_MIN_STACK_SIZE && named.is_some_and(|n| removed.contains(n));
        if !drop {
            kept.extend_from_slice(entry);
        }
    }
    if seen != data.len() {
        return Err(FinalizeError::Missing("whole .nv.info entries"));
    }
    img.sections[idx].data = kept;
    Ok(img.serialize())
}

fn rewrite_tkinfo(img: &mut CubinImage, fix: &Fixups) -> Result<(), FinalizeError> {
    let idx = img.section_index(".note.nv.tkinfo").ok_or(FinalizeError::Missing(".note.nv.tkinfo"))?;
    let mut entries = tkinfo::parse(&img.sections[idx].data)?;
    match (&fix.linker_entry, entries.first().map(|e| e.tool.as_str())) {
        (Some(own), Some("nvJIT API")) => entries[0] = own.clone(),
        (None, Some("nvJIT API")) => {
            entries.remove(0);
        }
        (None, _) => {}
        (Some(_), _) => return Err(FinalizeError::UnexpectedEntries("first entry is not nvJitLink's".into())),
    }
    // PTX is compiled by the toolkit's ptxas before linking; an entry nvJitLink's
    // own ptxas wrote would not be nvlink's.
    if entries.iter().any(|e| e.build == JIT_PTXAS_BUILD_PLACEHOLDER) {
        return Err(FinalizeError::UnexpectedEntries("nvJitLink compiled PTX itself".into()));
    }
    img.sections[idx].data = tkinfo::serialize(&entries);
    Ok(())
}

/// The functions present in a linked cubin (`.text.<name>` sections).
pub(crate) fn live_functions(img: &CubinImage) -> HashSet<String> {
    img.sections.iter().filter_map(|s| s.name.strip_prefix(".text.")).map(str::to_owned).collect()
}

fn insert_ghost_names(img: &mut CubinImage, inputs: &[InputObject]) -> Result<(), FinalizeError> {
    let live = live_functions(img);
    if inputs.iter().flat_map(|i| &i.functions).all(|f| !f.is_kernel || live.contains(&f.name)) {
        return Ok(());
    }
    // .shstrtab: section names.
    let shstr = img.section_index(".shstrtab").ok_or(FinalizeError::Missing(".shstrtab"))?;
    let old = StrTab::parse(&img.sections[shstr].data)?;
    let mut new = old.clone();
    strtab::insert_ghosts(&mut new.strings, inputs, &live)?;
    {
        let map = old.remap(&new)?;
        for s in img.sections.iter_mut() {
            s.sh_name = map(s.sh_name).ok_or(FinalizeError::Missing("section name after remap"))?;
        }
    }
    img.sections[shstr].data = new.to_bytes();

    // .strtab: symbol names (and section names again).
    let Some(symtab) = img.sections.iter().position(|s| s.sh_type == crate::elf::SHT_SYMTAB) else {
        return Ok(());
    };
    let strtab_idx = img.sections[symtab].link as usize;
    let old = StrTab::parse(&img.sections.get(strtab_idx).ok_or(FinalizeError::Missing(".strtab"))?.data)?;
    let mut new = old.clone();
    strtab::insert_ghosts(&mut new.strings, inputs, &live)?;
    {
        let map = old.remap(&new)?;
        let data = &mut img.sections[symtab].data;
        for entry in data.chunks_exact_mut(24) {
            let name = u32::from_le_bytes([entry[0], entry[1], entry[2], entry[3]]);
            let mapped = map(name).ok_or(FinalizeError::Missing("symbol name after remap"))?;
            entry[0..4].copy_from_slice(&mapped.to_le_bytes());
        }
    }
    img.sections[strtab_idx].data = new.to_bytes();
    Ok(())
}
