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

use std::collections::HashSet;

use image::CubinImage;
use strtab::{InputFunction, StrTab};

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
}

/// What nvlink would have written that nvJitLink did not.
#[derive(Clone, Debug)]
pub struct Fixups {
    /// nvlink's own tkinfo entry (replaces nvJitLink's "nvJIT API" entry);
    /// `None` for whole-program LTO, where nvlink writes no entry of its own.
    pub linker_entry: Option<tkinfo::Entry>,
    /// The functions of each linked cubin in link order, to place ghost names
    /// of dead kernels; empty when nothing was removed.
    pub inputs: Vec<Vec<InputFunction>>,
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

fn insert_ghost_names(img: &mut CubinImage, inputs: &[Vec<InputFunction>]) -> Result<(), FinalizeError> {
    let live = live_functions(img);
    if inputs.iter().flatten().all(|f| !f.is_kernel || live.contains(&f.name)) {
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
