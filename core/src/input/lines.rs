//! Where in the CUDA source a device object defines or uses a symbol, from the
//! line tables nvcc leaves in its cubins with `-lineinfo` or `-G`
//! (`.debug_line`): for the `source_file` and `line` of a diagnostic
//! (`Undefined reference to 'f' in 'a.o'`: the line of the call in `a.o`;
//! `Multiple definition of 'f' in 'b.o'`: the line where `b.o` defines it).
//!
//! A relocatable cubin keeps each function in its own `.text.<name>` section,
//! and its line program's `DW_LNE_set_address` operands are relocations
//! (`.rela.debug_line`) against those functions' symbols. The operands are
//! filled here with a synthetic address, the section's index above bit 40
//! and the offset within it below, so one line program covers every
//! function. A use is a relocation of a `.text.*` section naming the symbol;
//! a definition is the symbol's own section and value.
//!
//! Best effort and never trusted for linking: an object without line tables,
//! with an unexpected layout, or that does not parse gives `None`.

use std::borrow::Cow;

use crate::elf::Elf;

/// A place in a source file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceLine {
    /// As the line table names it: the directory joined with the file name
    /// (the path nvcc was given, made absolute where nvcc recorded it so).
    pub file: String,
    pub line: u64,
}

/// Where `object` (a host object with device code, a cubin, or an archive
/// member's bytes) defines `symbol`, else where its code first uses it.
pub fn locate(object: &[u8], symbol: &str) -> Option<SourceLine> {
    cubins(object).iter().find_map(|cubin| locate_in_cubin(cubin, symbol))
}

/// The same for member `member` of the archive `archive` (`lib.a:m.o`).
pub fn locate_in_member(archive: &[u8], member: &str, symbol: &str) -> Option<SourceLine> {
    let (_, members) = super::archive::members(archive).ok()?;
    members.iter().filter(|m| m.name == member).find_map(|m| locate(m.data?, symbol))
}

/// Whether the LTO code of `object` (a host object's device code) names
/// `symbol`. Under LTO nvlink and its ptxas report a symbol of the one module
/// NVVM made of every input (`'lto.cubin'`, or no object at all): the input a
/// diagnostic comes from is the one whose code names the symbol. NVVM's LTO
/// IR is not plain bitcode (its names cannot be read), so the PTX nvcc keeps
/// beside it (`-dlto`'s default, `compute_XX`) is read: it declares every
/// function and variable a module uses. An object with LTO IR alone is not
/// found, and a name inside a longer name matches too: best effort.
pub fn lto_code_names(object: &[u8], symbol: &str) -> bool {
    let needle = symbol.as_bytes();
    let has_lto = |m: &[crate::fatbin::Member<'_>]| m.iter().any(|m| m.kind == crate::fatbin::MemberKind::LtoIr);
    !needle.is_empty()
        && ptx_beside_lto(object, has_lto).iter().any(|ptx| ptx.windows(needle.len()).any(|w| w == needle))
}

/// The first member of `archive` whose LTO code names `symbol`.
pub fn lto_member_naming(archive: &[u8], symbol: &str) -> Option<String> {
    let (_, members) = super::archive::members(archive).ok()?;
    members.iter().find(|m| m.data.is_some_and(|d| lto_code_names(d, symbol))).map(|m| m.name.clone())
}

/// The PTX of a host object's device code, where `lto` says its members
/// hold LTO IR.
fn ptx_beside_lto(object: &[u8], lto: impl Fn(&[crate::fatbin::Member<'_>]) -> bool) -> Vec<Cow<'_, [u8]>> {
    let Ok(elf) = Elf::parse_host(object) else { return Vec::new() };
    let host = super::host::HostObject::read(&elf);
    let Some(fatbin) = host.relfatbin else { return Vec::new() };
    let Ok(members) = crate::fatbin::parse(fatbin) else { return Vec::new() };
    if !lto(&members) {
        return Vec::new();
    }
    members.iter().filter(|m| m.kind == crate::fatbin::MemberKind::Ptx).filter_map(|m| m.contents().ok()).collect()
}

/// The relocatable cubins of `object`: itself, or every cubin of a host
/// object's device code (`__nv_relfatbin`).
fn cubins(object: &[u8]) -> Vec<Cow<'_, [u8]>> {
    let Ok(elf) = Elf::parse(object) else { return Vec::new() };
    if elf.is_cubin() {
        return vec![Cow::Borrowed(object)];
    }
    let host = super::host::HostObject::read(&elf);
    let Some(fatbin) = host.relfatbin else { return Vec::new() };
    let Ok(members) = crate::fatbin::parse(fatbin) else { return Vec::new() };
    members.iter().filter(|m| m.kind == crate::fatbin::MemberKind::Cubin).filter_map(|m| m.contents().ok()).collect()
}

/// Bits below a section's index in a synthetic address.
const SECTION_SHIFT: u32 = 40;

fn locate_in_cubin(cubin: &[u8], symbol: &str) -> Option<SourceLine> {
    let elf = Elf::parse(cubin).ok()?;
    let symbols = elf.symbols().ok()?;
    let index = symbols.iter().position(|s| s.name == symbol)?;
    let text = |section: usize| elf.sections.get(section).is_some_and(|s| s.name.starts_with(".text."));
    let defined = &symbols[index];
    // Defined in code here: its own section; else the first use in code.
    let place = if defined.shndx != 0 && text(defined.shndx as usize) {
        Some((defined.shndx as usize, defined.value))
    } else {
        elf.sections
            .iter()
            .filter(|s| s.sh_type == SHT_RELA && text(s.info as usize))
            .find_map(|s| relocations(&elf, s).find(|r| r.symbol == index).map(|r| (s.info as usize, r.offset)))
    }?;
    let table = line_table(&elf, &symbols)?;
    table.at(synthetic(place.0, place.1)?)
}

const SHT_RELA: u32 = 4;

struct Relocation {
    offset: u64,
    symbol: usize,
    addend: i64,
}

/// The entries of a `SHT_RELA` section (64-bit: offset, info, addend).
fn relocations<'a>(elf: &Elf<'a>, section: &crate::elf::Section) -> impl Iterator<Item = Relocation> + 'a {
    elf.section_data(section).chunks_exact(24).map(|e| {
        let word = |i: usize| u64::from_le_bytes(e[i..i + 8].try_into().unwrap_or_default());
        Relocation { offset: word(0), symbol: (word(8) >> 32) as usize, addend: word(16) as i64 }
    })
}

fn synthetic(section: usize, offset: u64) -> Option<u64> {
    (offset < 1 << SECTION_SHIFT && (section as u64) < 1 << (64 - SECTION_SHIFT))
        .then_some(((section as u64) << SECTION_SHIFT) | offset)
}

/// A cubin's line rows by synthetic address.
struct LineTable {
    /// (address, file, line, end of sequence), in program order.
    rows: Vec<(u64, usize, u64, bool)>,
    files: Vec<String>,
}

impl LineTable {
    /// The row covering `address`: the last one at or before it in the same
    /// section, within a sequence that goes past it.
    fn at(&self, address: u64) -> Option<SourceLine> {
        let section = address >> SECTION_SHIFT;
        let mut best: Option<(u64, usize, u64)> = None;
        for pair in self.rows.windows(2) {
            let ((a, file, line, end), (next, ..)) = (pair[0], pair[1]);
            if end || a >> SECTION_SHIFT != section || a > address || next <= address || line == 0 {
                continue;
            }
            if best.is_none_or(|(b, ..)| a >= b) {
                best = Some((a, file, line));
            }
        }
        let (_, file, line) = best?;
        Some(SourceLine { file: self.files.get(file)?.clone(), line })
    }
}

fn line_table(elf: &Elf<'_>, symbols: &[crate::elf::Symbol]) -> Option<LineTable> {
    let (at, section) = elf.section(".debug_line")?;
    let mut data = elf.section_data(section).to_vec();
    // The set_address operands: each relocation's symbol's section and value.
    let rela = elf.sections.iter().find(|s| s.sh_type == SHT_RELA && s.info as usize == at)?;
    for r in relocations(elf, rela) {
        let s = symbols.get(r.symbol)?;
        let value = synthetic(s.shndx as usize, s.value.checked_add_signed(r.addend)?)?;
        let start = usize::try_from(r.offset).ok()?;
        data.get_mut(start..start.checked_add(8)?)?.copy_from_slice(&value.to_le_bytes());
    }
    let debug_line = gimli::DebugLine::new(&data, gimli::LittleEndian);
    let (mut rows, mut files) = (Vec::new(), Vec::new());
    let mut offset = 0usize;
    while offset < data.len() {
        let program = debug_line.program(gimli::DebugLineOffset(offset), 8, None, None).ok()?;
        let header = program.header();
        let next = offset + header.format().initial_length_size() as usize + header.unit_length();
        // Files of this program, by index, into `files`.
        let mut names = std::collections::HashMap::new();
        let mut program_rows = program.rows();
        while let Ok(Some((header, row))) = program_rows.next_row() {
            let file = match names.get(&row.file_index()) {
                Some(&f) => f,
                None => {
                    let name = row.file(header).map(|f| file_name(header, f)).unwrap_or_default();
                    files.push(name);
                    names.insert(row.file_index(), files.len() - 1);
                    files.len() - 1
                }
            };
            rows.push((row.address(), file, row.line().map_or(0, |l| l.get()), row.end_sequence()));
        }
        if next <= offset {
            break;
        }
        offset = next;
    }
    Some(LineTable { rows, files })
}

/// A file entry's path: its directory joined with its name, unless absolute.
fn file_name<R: gimli::Reader>(header: &gimli::LineProgramHeader<R>, file: &gimli::FileEntry<R>) -> String {
    let text = |v: gimli::AttributeValue<R>| match v {
        gimli::AttributeValue::String(s) => s.to_string_lossy().map(|s| s.into_owned()).unwrap_or_default(),
        _ => String::new(),
    };
    let name = text(file.path_name());
    if name.starts_with('/') {
        return name;
    }
    match file.directory(header).map(text).filter(|d| !d.is_empty()) {
        Some(dir) => format!("{}/{name}", dir.trim_end_matches('/')),
        None => name,
    }
}
