//! The shape of a cubin ptxas writes, checked before a device cubin (a
//! `.cubin` input, or a fatbin member's SASS) is linked in process.
//!
//! nvlink and nvJitLink read a damaged cubin differently from each other and
//! from this crate's reader: an adversarial run's mutations of one cubin gave
//! a different answer from nvlink in one link of ten (nvlink failing with
//! "sass rtype out of range" or "Size doesn't match" where the in-process
//! link wrote a cubin, an undefined reference where nvlink linked, a tkinfo
//! note read from other offsets). Rather than reproduce each reader's
//! behaviour on each kind of damage, a cubin that differs in any checked way
//! from what ptxas writes is left to the real nvlink: a false alarm costs a
//! routed link, never a wrong answer.
//!
//! Beyond a wrong answer, damage can make nvJitLink read past a table (a
//! prototype's string offset), and its worker's memory holds what it linked
//! before: every entry that indexes another table is checked.
//!
//! The rules were read off every cubin in the parity corpus, in libcudadevrt
//! and in the fatbins nvcc makes (`-G`, `-lineinfo`, sm_75 to sm_120,
//! relocatable and executable): 650 cubins, all of which pass
//! (`tests/tests/damaged.rs` checks the corpus's and libcudadevrt's; the
//! parity corpus would route a link whose cubin did not).

use crate::elf::{Elf, Section, Symbol};

/// `e_ident[4..16]`: 64-bit, little-endian, version 1, the CUDA OS/ABI, then
/// the ABI version (any) and zero padding.
const IDENT: [u8; 3] = [2, 1, 1];
const OSABI_CUDA: u8 = 0x41;

/// The `e_flags` bits ptxas sets besides the SM number (bits 8..16).
const KNOWN_FLAGS: u32 = 0x0f00_ff06;

const SHT_PROGBITS: u32 = 1;
const SHT_SYMTAB: u32 = 2;
const SHT_STRTAB: u32 = 3;
const SHT_RELA: u32 = 4;
const SHT_NOTE: u32 = 7;
const SHT_NOBITS: u32 = 8;
const SHT_REL: u32 = 9;
/// `.nv.info` and `.nv.info.<function>`.
const SHT_CUDA_INFO: u32 = 0x7000_0000;
/// CUDA's own section types (`.nv.info`, `.nv.callgraph`, constant banks, ...).
const SHT_CUDA: std::ops::RangeInclusive<u32> = 0x7000_0000..=0x7000_00ff;

/// The section flags ptxas sets: write, alloc, exec, info; OS and processor bits.
const KNOWN_SECTION_FLAGS: u64 = 0x1300_0047;

/// The entry size ptxas gives each type of section (read off the corpus).
fn entry_size(sh_type: u32) -> u64 {
    match sh_type {
        SHT_SYMTAB | SHT_RELA | 0x7000_0082 | 0x7000_0085 => 24,
        SHT_REL => 16,
        0x7000_0001 | 0x7000_0002 | 0x7000_008a | 0x7000_008b => 8,
        _ => 0,
    }
}

/// Symbol types: none, object, function, section, and CUDA's object (13).
const SYMBOL_TYPES: [u8; 5] = [0, 1, 2, 3, 13];
/// Bindings: local, global, weak.
const BINDINGS: [u8; 3] = [0, 1, 2];
/// `st_other` bits ptxas sets: visibility (default or internal) and CUDA's
/// flags (entry, `extern __shared__`, ...).
const KNOWN_OTHER: u8 = 0xf1;

/// Relocation types: nvlink 13.5's table of names runs from `R_CUDA_NONE`
/// (0, which ptxas does not write) to `R_CUDA_CONST_FIELD22_37` (115);
/// nvlink fails on a type past it ("sass rtype out of range").
const RELOCATION_TYPES: std::ops::RangeInclusive<u32> = 1..=115;

/// The first way `elf` differs from a cubin ptxas writes, or `None`.
pub(crate) fn unusual(elf: &Elf<'_>) -> Option<&'static str> {
    unusual_with_symbols(elf).err()
}

/// [`unusual`], and the symbols (read once) of a cubin that is not.
pub(crate) fn unusual_with_symbols(elf: &Elf<'_>) -> Result<Vec<Symbol>, &'static str> {
    if let Some(what) = header(elf).or_else(|| sections(elf)) {
        return Err(what);
    }
    let symbols = elf.symbols().map_err(|_| "a symbol name outside its string table")?;
    let first = symbols_placed(elf, &symbols)
        .err()
        .or_else(|| relocations(elf, &symbols))
        .or_else(|| info_sections(elf, &symbols))
        .or_else(|| cross_references(elf, &symbols))
        .or_else(|| notes(elf));
    match first {
        Some(what) => Err(what),
        None => Ok(symbols),
    }
}

fn u16_at(d: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(d.get(at..at + 2)?.try_into().ok()?))
}
fn u32_at(d: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(d.get(at..at + 4)?.try_into().ok()?))
}
fn u64_at(d: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(d.get(at..at + 8)?.try_into().ok()?))
}

fn header(elf: &Elf<'_>) -> Option<&'static str> {
    let d = elf.data;
    // Relocatable, or executable (a whole-program fatbin's SASS).
    if !matches!(elf.e_type, 1 | 2) {
        return Some("an unusual e_type");
    }
    if d.get(4..7) != Some(&IDENT[..]) || d.get(7) != Some(&OSABI_CUDA) || d.get(9..16) != Some(&[0u8; 7][..]) {
        return Some("an unusual e_ident");
    }
    // e_version 1, e_entry 0, e_ehsize 64, e_shentsize 64.
    let fields = (u32_at(d, 0x14), u64_at(d, 0x18), u16_at(d, 0x34), u16_at(d, 0x3a));
    if fields != (Some(1), Some(0), Some(64), Some(64)) {
        return Some("an unusual ELF header");
    }
    // A relocatable cubin has no program headers (e_phoff and e_phnum 0,
    // e_phentsize 0 or 56); an executable one (a whole-program fatbin's) has.
    let program = (u64_at(d, 0x20), u16_at(d, 0x38), u16_at(d, 0x36));
    if elf.e_type != 2 && !matches!(program, (Some(0), Some(0), Some(0 | 56))) {
        return Some("program headers");
    }
    if elf.flags & !KNOWN_FLAGS != 0 {
        return Some("unknown e_flags bits");
    }
    None
}

fn sections(elf: &Elf<'_>) -> Option<&'static str> {
    let first = elf.sections.first()?;
    if (first.sh_name, first.sh_type, first.flags, first.offset, first.size, first.link, first.info)
        != (0, 0, 0, 0, 0, 0, 0)
    {
        return Some("a section 0 that is not null");
    }
    if elf.sections.get(elf.shstrndx).is_none_or(|s| s.sh_type != SHT_STRTAB) || elf.shstrndx == 0 {
        return Some("an unusual section-name table");
    }
    let known = |t: u32| {
        matches!(t, SHT_PROGBITS | SHT_SYMTAB | SHT_STRTAB | SHT_RELA | SHT_NOTE | SHT_NOBITS | SHT_REL)
            || SHT_CUDA.contains(&t)
    };
    for s in &elf.sections[1..] {
        if !known(s.sh_type) {
            return Some("a section of unknown type");
        }
        if s.align > 1 && !s.align.is_power_of_two() {
            return Some("a section alignment that is not a power of two");
        }
        if s.name.is_empty() {
            return Some("an unnamed section");
        }
        if s.entsize != entry_size(s.sh_type) {
            return Some("a section of an unusual entry size");
        }
        if s.flags & !KNOWN_SECTION_FLAGS != 0 || (elf.e_type == 1 && s.addr != 0) {
            return Some("a section of unusual flags or address");
        }
    }
    if elf.sections.iter().filter(|s| s.sh_type == SHT_SYMTAB).count() != 1 {
        return Some("not one symbol table");
    }
    if let Some(what) = layout(elf) {
        return Some(what);
    }
    let mut names: Vec<&str> = elf.sections[1..].iter().map(|s| s.name.as_str()).collect();
    names.sort_unstable();
    if names.windows(2).any(|w| w[0] == w[1]) {
        return Some("two sections of one name");
    }
    // An executable cubin (a whole-program fatbin's) has the linker's own
    // sections; only the structure above is checked of it.
    if elf.e_type != 1 {
        return None;
    }
    for s in &elf.sections[1..] {
        if !named_for_its_type(elf, s) {
            return Some("a section whose name and type do not go together");
        }
    }
    None
}

/// The file's layout as ptxas writes it: each section's bytes after the ELF
/// header, aligned, apart from the section headers and from each other.
fn layout(elf: &Elf<'_>) -> Option<&'static str> {
    let d = elf.data;
    let shoff = u64_at(d, 0x28)?;
    let headers = shoff..shoff + 64 * elf.sections.len() as u64;
    let mut ranges: Vec<(u64, u64)> = vec![(0, 64), (headers.start, headers.end)];
    // Uninitialised variables and shared memory have no bytes in the file.
    let bytes = |s: &&Section| !matches!(s.sh_type, SHT_NOBITS | 0x7000_0007 | 0x7000_000a | 0x7000_0015) && s.size > 0;
    for s in elf.sections[1..].iter().filter(bytes) {
        if s.align > 1 && s.offset % s.align != 0 {
            return Some("a section at an unaligned offset");
        }
        // sm_100's `.nv.merc.X` may be `X`'s bytes again.
        if !s.name.starts_with(".nv.merc.") {
            ranges.push((s.offset, s.offset + s.size));
        }
    }
    ranges.sort_unstable();
    if ranges.windows(2).any(|w| w[1].0 < w[0].1) {
        return Some("sections that overlap");
    }
    None
}

/// Whether a section's name and type are a pair ptxas writes (read off the
/// corpus); a relocation section is named after the section it relocates.
fn named_for_its_type(elf: &Elf<'_>, s: &Section) -> bool {
    let (n, t) = (s.name.as_str(), s.sh_type);
    let cuda = SHT_CUDA.contains(&t);
    if let Some(target) =
        n.strip_prefix(".rela").filter(|_| t == SHT_RELA).or(n.strip_prefix(".rel").filter(|_| t == SHT_REL))
    {
        return elf.sections.get(s.info as usize).is_some_and(|x| x.name == target);
    }
    match n {
        ".shstrtab" | ".strtab" => t == SHT_STRTAB,
        ".symtab" => t == SHT_SYMTAB,
        ".nv.info" => t == SHT_CUDA_INFO,
        ".nv.compat" | ".nv.callgraph" | ".nv.prototype" | ".nv_debug.shared" => cuda,
        _ if n.starts_with(".text.") => t == SHT_PROGBITS,
        _ if n.starts_with(".nv.info.") => t == SHT_CUDA_INFO,
        _ if n.starts_with(".debug_") || n.starts_with(".nv_debug_") => t == SHT_PROGBITS,
        _ if n.starts_with(".note.nv.") => t == SHT_NOTE,
        _ if n.starts_with(".nv.shared.") || n.starts_with(".nv.global") => cuda || t == SHT_NOBITS,
        _ if n.starts_with(".nv.constant") || n.starts_with(".nv.merc.") => cuda || t == SHT_PROGBITS,
        _ if n.starts_with(".nv.capmerc") => cuda,
        _ => false,
    }
}

/// The symbol table, and its symbols where they lie.
fn symbols_placed(elf: &Elf<'_>, symbols: &[Symbol]) -> Result<(), &'static str> {
    let (symtab, table) = symbol_table(elf).ok_or("not one symbol table")?;
    if table.entsize != 24 || table.size % 24 != 0 {
        return Err("a symbol table of another entry size than 24");
    }
    if elf.sections.get(table.link as usize).is_none_or(|s| s.sh_type != SHT_STRTAB) || table.link == 0 {
        return Err("a symbol table without a string table");
    }
    let first_global = table.info as usize;
    if first_global == 0 || first_global > symbols.len() {
        return Err("a symbol table's first-global index out of range");
    }
    if symbols.first().is_none_or(|s| (s.st_name, s.info, s.other, s.shndx, s.value, s.size) != (0, 0, 0, 0, 0, 0)) {
        return Err("a symbol 0 that is not null");
    }
    // (ptxas puts locals after globals too, and sets `sh_info` to the count.)
    for s in symbols.iter().skip(1) {
        let (kind, binding) = (s.info & 0xf, s.info >> 4);
        if !SYMBOL_TYPES.contains(&kind) || !BINDINGS.contains(&binding) || s.other & !KNOWN_OTHER != 0 {
            return Err("a symbol of unknown type, binding or flags");
        }
        symbol_place(elf, s)?;
    }
    // Each function's code section is named after it, and its `.nv.info.`
    // section points at that code section.
    for (i, sec) in elf.sections.iter().enumerate().filter(|(_, x)| elf.e_type == 1 && x.name.starts_with(".text.")) {
        let name = &sec.name[".text.".len()..];
        if !symbols.iter().any(|s| s.info & 0xf == 2 && s.shndx as usize == i && s.name == name) {
            return Err("a code section without its function");
        }
        // Its `sh_info` holds the function's symbol index (low 24 bits).
        let function = symbols.get((sec.info & 0xff_ffff) as usize);
        if function.is_none_or(|f| f.name != name || f.shndx as usize != i) || sec.link as usize != symtab {
            return Err("a code section that points at another symbol");
        }
    }
    for sec in elf.sections.iter().filter(|x| elf.e_type == 1 && x.name.starts_with(".nv.info.")) {
        let code = elf.sections.get(sec.info as usize).map(|x| x.name.as_str());
        if code.and_then(|c| c.strip_prefix(".text.")) != Some(&sec.name[".nv.info.".len()..])
            || sec.link as usize != symtab
        {
            return Err("a function's .nv.info section that points elsewhere");
        }
    }
    Ok(())
}

fn symbol_table<'e>(elf: &'e Elf<'_>) -> Option<(usize, &'e Section)> {
    elf.sections.iter().enumerate().find(|(_, s)| s.sh_type == SHT_SYMTAB)
}

/// A defined symbol lies in its section: a section symbol at 0, a function
/// or object inside the section's bytes (sections without bytes aside:
/// shared memory's symbols run past its size by their alignment).
fn symbol_place(elf: &Elf<'_>, s: &Symbol) -> Result<(), &'static str> {
    if s.shndx == 0 {
        return undefined(s);
    }
    let section = elf.sections.get(s.shndx as usize).ok_or("a symbol in a section that does not exist")?;
    if matches!(section.sh_type, SHT_SYMTAB | SHT_STRTAB | SHT_RELA | SHT_REL) {
        return Err("a symbol in a table section");
    }
    if s.info & 0xf == 3 {
        return match s.value == 0 && s.size == 0 && (s.name.is_empty() || s.name == section.name) {
            true => Ok(()),
            false => Err("an unusual section symbol"),
        };
    }
    let bytes = section.sh_type != SHT_NOBITS && !section.name.starts_with(".nv.shared");
    if bytes && s.value.checked_add(s.size).is_none_or(|end| end > section.size) {
        return Err("a symbol beyond its section");
    }
    Ok(())
}

/// An undefined symbol as ptxas writes one: a function at 0 of size 0; the
/// linker's tables (`__UFT*`, `__UDT*`) 8-byte objects at 0; its shared
/// memory reservations and constant-bank size 4-byte objects. Variables
/// (`extern __device__`, `extern __shared__`, whose value is its alignment)
/// keep their declared sizes, which nvlink compares with the definition's.
fn undefined(s: &Symbol) -> Result<(), &'static str> {
    let kind = s.info & 0xf;
    let fits = match kind {
        2 => (s.value, s.size) == (0, 0),
        3 => false,
        _ if s.name.starts_with("__UFT") || s.name.starts_with("__UDT") => {
            (kind, s.other, s.value, s.size) == (1, 0, 0, 8)
        }
        _ if s.name.starts_with(".nv.") => kind == 1 && s.other <= 1 && s.size == 4,
        _ => true,
    };
    match fits {
        true => Ok(()),
        false => Err("an unusual undefined symbol"),
    }
}

fn relocations(elf: &Elf<'_>, symbols: &[Symbol]) -> Option<&'static str> {
    let (symtab, table) = symbol_table(elf)?;
    let count = table.size / 24;
    for s in elf.sections.iter().filter(|s| s.sh_type == SHT_RELA || s.sh_type == SHT_REL) {
        let entry = if s.sh_type == SHT_RELA { 24 } else { 16 };
        if s.entsize != entry || s.size % entry != 0 || s.link as usize != symtab {
            return Some("an unusual relocation section");
        }
        let Some(target) = elf.sections.get(s.info as usize).filter(|_| s.info != 0) else {
            return Some("a relocation section for no section");
        };
        if matches!(target.sh_type, SHT_SYMTAB | SHT_STRTAB | SHT_RELA | SHT_REL | SHT_NOBITS) {
            return Some("relocations of a section without bytes");
        }
        for r in elf.section_data(s).chunks_exact(entry as usize) {
            let (offset, info) = (u64_at(r, 0)?, u64_at(r, 8)?);
            let (symbol, kind) = (info >> 32, (info & 0xffff_ffff) as u32);
            if symbol >= count || !RELOCATION_TYPES.contains(&kind) || offset >= target.size {
                return Some("an unusual relocation");
            }
            if !refers_as_ptxas_does(elf, target, symbols.get(symbol as usize)?) {
                return Some("a relocation of an unusual symbol");
            }
        }
    }
    None
}

/// What a relocation refers to in a ptxas cubin: a function (defined in
/// code, or undefined), a variable (in a `.nv.` section, or undefined), or,
/// from a debug section, another debug section.
fn refers_as_ptxas_does(elf: &Elf<'_>, target: &Section, s: &Symbol) -> bool {
    let home = elf.sections.get(s.shndx as usize).map(|x| x.name.as_str()).filter(|_| s.shndx != 0);
    match s.info & 0xf {
        // The null symbol: ptxas's code refers to it (a relocation with no target).
        _ if s.st_name == 0 && s.info & 0xf != 3 => s.info == 0 && s.shndx == 0 && target.name.starts_with(".text."),
        3 => target.name.starts_with(".debug_") && home.is_some_and(|h| h.starts_with(".debug_")),
        2 => home.is_none_or(|h| h.starts_with(".text.")),
        0 | 1 | 13 => home.is_none_or(|h| h.starts_with(".nv.") || h == ".nv_debug.shared"),
        _ => false,
    }
}

/// `.nv.info` sections (and `.nv.compat`): whole entries of known formats up
/// to the section's end.
fn info_sections(elf: &Elf<'_>, symbols: &[Symbol]) -> Option<&'static str> {
    let function = |i: u32| symbols.get(i as usize).is_some_and(|s| s.info & 0xf == 2);
    for s in elf.sections.iter().filter(|s| s.name.starts_with(".nv.info") || s.name == ".nv.compat") {
        let data = elf.section_data(s);
        let mut at = 0;
        for e in super::cubin::info_entries(data) {
            if !(1..=4).contains(&e.format) {
                return Some("an .nv.info entry of unknown format");
            }
            let Some(bytes) = e.bytes else { return Some("an .nv.info entry cut short") };
            at += bytes.len();
            // The whole-file attributes of a function (frame size, stack
            // sizes, register count): its symbol's index, then the value.
            if s.name == ".nv.info" && e.format == 4 {
                let of_function = matches!(e.attr, 0x11 | 0x12 | 0x23 | 0x2f) && e.value == 8;
                if !of_function || !u32_at(bytes, 4).is_some_and(function) {
                    return Some("an .nv.info attribute of another function or shape");
                }
            }
            // A kernel's parameter bank: a symbol of this cubin.
            if e.attr == 0x0a && e.format == 4 && u32_at(bytes, 4).is_none_or(|i| i as usize >= symbols.len()) {
                return Some("an .nv.info parameter bank of no symbol");
            }
        }
        if at != data.len() {
            return Some("an .nv.info section that ends inside an entry");
        }
    }
    None
}

/// `.nv.prototype` and `.nv.callgraph`, whose entries index the symbol table
/// and (prototypes) the string table: nvlink and nvJitLink read past either
/// without a check (an adversarial run read another link's names out of a
/// shared worker that way).
fn cross_references(elf: &Elf<'_>, symbols: &[Symbol]) -> Option<&'static str> {
    let (symtab, table) = symbol_table(elf)?;
    let strtab = elf.section_data(elf.sections.get(table.link as usize)?);
    let kind = |i: u32| symbols.get(i as usize).map(|s| s.info & 0xf);
    for s in elf.sections.iter().filter(|s| s.name == ".nv.prototype" || s.name == ".nv.callgraph") {
        let d = elf.section_data(s);
        if !d.len().is_multiple_of(8) || s.link as usize != symtab {
            return Some("an unusual .nv.prototype or .nv.callgraph section");
        }
        for e in d.chunks_exact(8) {
            let (a, b) = (u32_at(e, 0)?, u32_at(e, 4)?);
            let fits = match s.name.as_str() {
                // A function, and the offset of its prototype (`#ili`): a
                // whole string of the table, from its start.
                ".nv.prototype" => {
                    let at = b as usize;
                    kind(a) == Some(2)
                        && (at == 0 || strtab.get(at - 1) == Some(&0))
                        && strtab.get(at..).is_some_and(|r| r.first() == Some(&b'#') && r.contains(&0))
                }
                // A call (caller, callee or 0), or 0 and a marker.
                _ => match a {
                    0 => b >= 0xffff_fffc,
                    _ => kind(a) == Some(2) && (b == 0 || matches!(kind(b), Some(2 | 3))),
                },
            };
            if !fits {
                return Some("an .nv.prototype or .nv.callgraph entry of no symbol or string");
            }
        }
    }
    None
}

/// Notes: whole records to the section's end; a tkinfo note's strings laid
/// out one after another from its string area's start, as ptxas writes them.
fn notes(elf: &Elf<'_>) -> Option<&'static str> {
    for s in elf.sections.iter().filter(|s| s.sh_type == SHT_NOTE) {
        let d = elf.section_data(s);
        let mut at = 0usize;
        while at < d.len() {
            let (Some(namesz), Some(descsz)) = (u32_at(d, at), u32_at(d, at + 4)) else {
                return Some("a note cut short");
            };
            let desc_at = (at + 12).checked_add((namesz as usize).div_ceil(4) * 4)?;
            let end = desc_at.checked_add((descsz as usize).div_ceil(4) * 4)?;
            let Some(desc) = d.get(desc_at..desc_at + descsz as usize).filter(|_| end <= d.len()) else {
                return Some("a note cut short");
            };
            if d.get(at + 12..at + 12 + namesz as usize) != Some(&b"NVIDIA Corp\0"[..]) {
                return Some("a note of another owner");
            }
            if s.name == ".note.nv.tkinfo" && !tkinfo_laid_out(desc) {
                return Some("an unusual tkinfo note");
            }
            at = end;
        }
    }
    None
}

/// A tkinfo descriptor: version 2, then five offsets of NUL-terminated
/// strings that follow each other from the area's start, then at most 3
/// bytes of zero padding.
fn tkinfo_laid_out(desc: &[u8]) -> bool {
    let Some(area) = desc.get(24..) else { return false };
    if u32_at(desc, 0) != Some(2) {
        return false;
    }
    let mut next = 0usize;
    for i in 0..5 {
        if u32_at(desc, 4 + 4 * i).map(|o| o as usize) != Some(next) {
            return false;
        }
        let Some(len) = area.get(next..).and_then(|rest| rest.iter().position(|&b| b == 0)) else {
            return false;
        };
        next += len + 1;
    }
    area.len() - next <= 3 && area[next..].iter().all(|&b| b == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desc(strings: &[&str], pad: usize) -> Vec<u8> {
        let mut d = 2u32.to_le_bytes().to_vec();
        let mut area = Vec::new();
        for s in strings {
            d.extend_from_slice(&(area.len() as u32).to_le_bytes());
            area.extend_from_slice(s.as_bytes());
            area.push(0);
        }
        area.resize(area.len() + pad, 0);
        d.extend(area);
        d
    }

    #[test]
    fn a_tkinfo_note_is_ptxas_laid_out() {
        let strings = ["ptxas", "Cuda compilation tools", "-arch sm_90 -m 64", "", "--compile-only"];
        assert!(tkinfo_laid_out(&desc(&strings, 0)));
        assert!(tkinfo_laid_out(&desc(&strings, 3)));
        assert!(!tkinfo_laid_out(&desc(&strings, 4)));
        let mut moved = desc(&strings, 1);
        moved[12] += 1;
        assert!(!tkinfo_laid_out(&moved), "an offset inside the previous string");
        let mut version = desc(&strings, 1);
        version[0] = 3;
        assert!(!tkinfo_laid_out(&version));
        let mut unterminated = desc(&strings, 0);
        unterminated.pop();
        assert!(!tkinfo_laid_out(&unterminated));
    }
}
