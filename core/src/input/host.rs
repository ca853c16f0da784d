//! Host relocatable objects that carry device code (`nvcc -dc` output).
//!
//! The pieces nvlink reads from a host object:
//! - `__nv_relfatbin`: the fatbin with the object's relocatable device code;
//!   `.nv_fatbin` holds whole-program (non-`-rdc`) code, which is not linked;
//! - `__nv_module_id`: the module id, for `--register-link-binaries`;
//! - `.nvHRKE .nvHRKI .nvHRDE .nvHRDI .nvHRCE .nvHRCI`: NUL-separated name
//!   patterns of the kernels, device variables and constants the host code
//!   references (external / internal linkage), used to remove dead device code.
//!
//! And one piece nvlink does not read, which changes with every compilation:
//! the name of nvcc's temporary translation unit (see [`key_digest`]).

use std::ops::Range;

use crate::elf::{Elf, EM_CUDA, ET_REL, SHT_SYMTAB};
use object::elf;

/// Device names host code refers to, as glob patterns (`_Z10accumulate*`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostRefs {
    pub kernels_external: Vec<String>,
    pub kernels_internal: Vec<String>,
    pub variables_external: Vec<String>,
    pub variables_internal: Vec<String>,
    pub constants_external: Vec<String>,
    pub constants_internal: Vec<String>,
}

impl HostRefs {
    pub(crate) fn kernel_patterns(&self) -> impl Iterator<Item = &str> {
        self.kernels_external.iter().chain(&self.kernels_internal).map(String::as_str)
    }
}

/// What nvlink uses from a host object.
#[derive(Clone, Debug, Default)]
pub struct HostObject<'a> {
    /// Contents of `__nv_module_id`: one NUL-terminated id per linked object.
    pub module_id_section: Option<&'a [u8]>,
    /// Contents of `__nv_relfatbin`, if present.
    pub relfatbin: Option<&'a [u8]>,
    /// Whether `.nv_fatbin` (whole-program device code) is present.
    pub has_nv_fatbin: bool,
    /// `None` when the object has no `.nvHR*` sections at all.
    pub host_refs: Option<HostRefs>,
}

fn patterns(data: &[u8]) -> Vec<String> {
    data.split(|&b| b == 0).filter(|s| !s.is_empty()).map(|s| String::from_utf8_lossy(s).into_owned()).collect()
}

impl<'a> HostObject<'a> {
    pub fn read(elf: &Elf<'a>) -> Self {
        let sec = |n: &str| elf.section_data_by_name(n);
        let module_id_section = sec("__nv_module_id");
        let hr = ["nvHRKE", "nvHRKI", "nvHRDE", "nvHRDI", "nvHRCE", "nvHRCI"].map(|n| sec(&format!(".{n}")));
        let host_refs = hr.iter().any(Option::is_some).then(|| {
            let get = |i: usize| hr[i].map(patterns).unwrap_or_default();
            HostRefs {
                kernels_external: get(0),
                kernels_internal: get(1),
                variables_external: get(2),
                variables_internal: get(3),
                constants_external: get(4),
                constants_internal: get(5),
            }
        });
        HostObject {
            module_id_section,
            relfatbin: sec("__nv_relfatbin"),
            has_nv_fatbin: elf.section(".nv_fatbin").is_some(),
            host_refs,
        }
    }
}

impl HostObject<'_> {
    /// The module ids, in order (an `ld -r` object carries several).
    pub(crate) fn module_ids(&self) -> Vec<String> {
        self.module_id_section.map(patterns).unwrap_or_default()
    }
}

/// `st_info` type of a source-file symbol.
const STT_FILE: u8 = 4;

/// The digest of an input for the whole-link key: the BLAKE3 of its bytes,
/// except that in a host relocatable object (named, or a member of a regular
/// archive) the names of `STT_FILE` symbols naming nvcc's temporary file
/// (`tmpxft_<pid>_<n>-<k>_<unit>.cudafe1.cpp`) count as any other string of
/// their length.
///
/// Measured on nvcc 13.5: compiling a source twice in the same place gives
/// objects that differ in these bytes only (`.strtab`; the module id, the
/// `.nvHR*` lists and the whole `__nv_relfatbin`, LTO IR included, are equal),
/// and nvlink's outputs, messages and exit status are equal for every corpus
/// case (`tests/tests/parity.rs`, `recompiled_keys_match_nvlink`). Everything
/// else stays in the key as it is: a compilation elsewhere (another directory)
/// changes the module id, internal-linkage device names and the LTO IR, and
/// those are keyed. Masking is refused (the whole bytes are hashed) unless the
/// name bytes lie in a symbol string table that overlaps nothing else of the
/// file and no other symbol's name shares them.
pub(crate) fn key_digest(data: &[u8]) -> [u8; 32] {
    let names = if data.starts_with(b"!<arch>\n") { archive_tmpxft_names(data) } else { tmpxft_names(data) };
    match names {
        Some(ranges) if !ranges.is_empty() => masked_digest(data, ranges),
        _ => *blake3::hash(data).as_bytes(),
    }
}

/// The digest of `data` with every byte of `ranges` (in bounds) replaced by
/// 0xff, hashed as the bytes stream by: an object is megabytes and its names
/// a few dozen bytes, so it is not copied to be masked.
fn masked_digest(data: &[u8], mut ranges: Vec<Range<usize>>) -> [u8; 32] {
    const FILL: [u8; 64] = [0xff; 64];
    ranges.sort_by_key(|r| r.start);
    let mut h = blake3::Hasher::new_derive_key("nvlinkd 2026 host object, nvcc temporary file names masked");
    let mut at = 0;
    for r in ranges {
        let start = r.start.max(at);
        let end = r.end.max(start);
        h.update(&data[at..start]);
        let mut left = end - start;
        while left > 0 {
            let n = left.min(FILL.len());
            h.update(&FILL[..n]);
            left -= n;
        }
        at = end;
    }
    *h.update(&data[at..]).finalize().as_bytes()
}

/// The same in each member of a regular archive (a static library of objects
/// nvcc compiled): the ranges in the archive's bytes. The archive's own
/// headers and symbol index stay as they are. `None` for a thin or malformed
/// archive, or when any member refuses masking.
fn archive_tmpxft_names(data: &[u8]) -> Option<Vec<Range<usize>>> {
    let (thin, members) = super::archive::members(data).ok()?;
    if thin {
        return None;
    }
    let mut all = Vec::new();
    for m in members {
        let bytes = m.data?;
        let at = (bytes.as_ptr() as usize).checked_sub(data.as_ptr() as usize)?;
        if at + bytes.len() > data.len() {
            return None;
        }
        if crate::elf::is_elf(bytes) && crate::elf::header_type(bytes) == Some(ET_REL) {
            if crate::elf::header_machine(bytes) == Some(EM_CUDA) {
                continue;
            }
            all.extend(tmpxft_names(bytes)?.into_iter().map(|r| r.start + at..r.end + at));
        }
    }
    Some(all)
}

/// The file ranges of the names of nvcc's temporary files in a host
/// relocatable object's `STT_FILE` symbols; `None` when masking them could hide
/// anything else (see [`key_digest`]).
fn tmpxft_names(data: &[u8]) -> Option<Vec<Range<usize>>> {
    if crate::elf::header_machine(data) == Some(EM_CUDA) || crate::elf::header_type(data) != Some(ET_REL) {
        return None;
    }
    let elf = Elf::parse(data).ok()?;
    if !elf.segments.is_empty() {
        return None;
    }
    let (symtab_index, symtab) = elf.sections.iter().enumerate().find(|(_, s)| s.sh_type == SHT_SYMTAB)?;
    let strtab_index = symtab.link as usize;
    if strtab_index == elf.shstrndx || strtab_index == symtab_index {
        return None;
    }
    let strtab = elf.sections.get(strtab_index)?;
    let table = strtab.offset as usize..(strtab.offset + strtab.file_size()) as usize;
    // The string table shares its bytes with nothing: not the file header, not
    // the section header table, not another section.
    let shoff = u64::from_le_bytes(data.get(0x28..0x30)?.try_into().ok()?) as usize;
    let shtable = shoff..shoff.checked_add(elf.sections.len().checked_mul(64)?)?;
    let overlaps = |a: &Range<usize>, b: &Range<usize>| a.start < b.end && b.start < a.end;
    if overlaps(&table, &(0..64)) || overlaps(&table, &shtable) {
        return None;
    }
    for (i, s) in elf.sections.iter().enumerate() {
        let r = s.offset as usize..(s.offset + s.file_size()) as usize;
        if i != strtab_index && !r.is_empty() && overlaps(&table, &r) {
            return None;
        }
    }
    let symbols = elf.symbols().ok()?;
    let is_tmpxft = |s: &crate::elf::Symbol| s.kind() == STT_FILE && s.name.starts_with("tmpxft_");
    let names: Vec<Range<usize>> = symbols
        .iter()
        .filter(|s| is_tmpxft(s))
        .map(|s| table.start + s.st_name as usize..table.start + s.st_name as usize + s.name.len())
        .collect();
    // No other name (with its NUL) may share those bytes.
    for s in symbols.iter().filter(|s| !is_tmpxft(s)) {
        let r = table.start + s.st_name as usize..table.start + s.st_name as usize + s.name.len() + 1;
        if names.iter().any(|n| overlaps(n, &r)) {
            return None;
        }
    }
    Some(names)
}

/// Glob match as nvlink applies host-reference patterns: `*` matches any run
/// of characters, everything else matches itself.
pub(crate) fn glob_match(pattern: &str, name: &str) -> bool {
    let (p, n) = (pattern.as_bytes(), name.as_bytes());
    let (mut pi, mut ni) = (0, 0);
    let (mut star, mut mark) = (None, 0);
    while ni < n.len() {
        if pi < p.len() && p[pi] != b'*' && p[pi] == n[ni] {
            pi += 1;
            ni += 1;
        } else if pi < p.len() && p[pi] == b'*' {
            star = Some(pi);
            mark = ni;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ni = mark;
        } else {
            return false;
        }
    }
    while pi < p.len() && p[pi] == b'*' {
        pi += 1;
    }
    pi == p.len()
}

/// Why nvlink's host-object reader would not take a host object that parses.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Refused {
    /// It says "Could not find fatbin" (measured).
    Fatal,
    /// Something damaged whose answer was not measured: nvlink answers.
    Unmeasured(&'static str),
}

/// What nvlink's reader checks of a host object's sections beyond their
/// ranges (measured on damaged copies of nvcc's objects): the section-name
/// table is `SHT_STRTAB`; every `SHT_RELA` section has 24-byte entries and
/// links to a `SHT_SYMTAB`; a symbol table's entry size is not 0. A symbol
/// table of another entry size than 24 it reads with that stride, which is
/// left to nvlink.
pub(crate) fn refused(elf: &Elf<'_>) -> Option<Refused> {
    const ENTRY: u64 = 24;
    // The shape every compiler's relocatable object has: no program headers
    // (nvlink's answer for them depends on where `e_phoff` points: measured,
    // not understood) and a null section 0.
    let header = |at: usize, n: usize| elf.data.get(at..at + n).is_none_or(|b| b.iter().any(|&x| x != 0));
    if header(0x20, 8) || header(0x38, 2) {
        return Some(Refused::Unmeasured("program headers"));
    }
    let shoff = elf.data.get(0x28..0x30).map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")) as usize);
    if shoff.is_none_or(|at| header(at, 64)) {
        return Some(Refused::Unmeasured("a section 0 that is not null"));
    }
    if elf.sections.get(elf.shstrndx).is_none_or(|s| s.sh_type != elf::SHT_STRTAB.0) {
        return Some(Refused::Fatal);
    }
    if elf.sections.iter().filter(|s| s.sh_type == SHT_SYMTAB).count() > 1 {
        return Some(Refused::Unmeasured("several symbol tables"));
    }
    for s in &elf.sections {
        if s.sh_type == elf::SHT_RELA.0 {
            let to_symtab = elf.sections.get(s.link as usize).is_some_and(|t| t.sh_type == SHT_SYMTAB);
            if s.entsize != ENTRY || !to_symtab {
                return Some(Refused::Fatal);
            }
        }
        if s.sh_type == SHT_SYMTAB && s.entsize == 0 {
            return Some(Refused::Fatal);
        }
        if s.sh_type == SHT_SYMTAB && s.entsize != ENTRY {
            return Some(Refused::Unmeasured("a symbol table of another entry size than 24"));
        }
    }
    // Each relocation's symbol is one of its table's (`size / 24` of them).
    for s in elf.sections.iter().filter(|s| s.sh_type == elf::SHT_RELA.0) {
        let symbols = elf.sections[s.link as usize].size / ENTRY;
        let beyond = elf.section_data(s).chunks_exact(ENTRY as usize).any(|r| {
            let info = u64::from_le_bytes(r[8..16].try_into().expect("an 8-byte field"));
            info >> 32 >= symbols
        });
        if beyond {
            return Some(Refused::Fatal);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob_match("_Z10accumulate*", "_Z10accumulatePfPKfi"));
        assert!(!glob_match("_Z10accumulate*", "_Z13unused_kernelPf"));
        assert!(glob_match("__nv_static_51__x_*16memcpy_3d_device*", "__nv_static_51__x__Z16memcpy_3d_deviceIjEv"));
        assert!(glob_match("*", ""));
        assert!(!glob_match("a", ""));
        assert!(glob_match("a*b*c", "aXXbYYc"));
    }

    /// A minimal host relocatable object: a `.strtab` holding `names`, a
    /// symbol table with one symbol per name (its type given), a `.shstrtab`.
    fn object(names: &[(&str, u8)], st_name_override: Option<u32>) -> Vec<u8> {
        let mut strtab = vec![0u8];
        let mut syms = vec![0u8; 24];
        for (n, kind) in names {
            let at = strtab.len() as u32;
            strtab.extend_from_slice(n.as_bytes());
            strtab.push(0);
            let mut sym = vec![0u8; 24];
            sym[..4].copy_from_slice(&st_name_override.unwrap_or(at).to_le_bytes());
            sym[4] = *kind;
            syms.extend(sym);
        }
        let shstrtab = b"\0.strtab\0.symtab\0.shstrtab\0".to_vec();
        let mut data = vec![0u8; 64];
        let place = |data: &mut Vec<u8>, b: &[u8]| {
            let at = data.len();
            data.extend_from_slice(b);
            at
        };
        let str_at = place(&mut data, &strtab);
        let sym_at = place(&mut data, &syms);
        let shs_at = place(&mut data, &shstrtab);
        while !data.len().is_multiple_of(8) {
            data.push(0);
        }
        let shoff = data.len();
        let sh = |name: u32, ty: u32, off: usize, size: usize, link: u32, entsize: u64| {
            let mut h = vec![0u8; 64];
            h[..4].copy_from_slice(&name.to_le_bytes());
            h[4..8].copy_from_slice(&ty.to_le_bytes());
            h[24..32].copy_from_slice(&(off as u64).to_le_bytes());
            h[32..40].copy_from_slice(&(size as u64).to_le_bytes());
            h[40..44].copy_from_slice(&link.to_le_bytes());
            h[56..64].copy_from_slice(&entsize.to_le_bytes());
            h
        };
        data.extend(vec![0u8; 64]);
        data.extend(sh(1, 3, str_at, strtab.len(), 0, 0));
        data.extend(sh(9, 2, sym_at, syms.len(), 1, 24));
        data.extend(sh(17, 3, shs_at, shstrtab.len(), 0, 0));
        data[..4].copy_from_slice(b"\x7fELF");
        data[4] = 2;
        data[5] = 1;
        data[6] = 1;
        data[16..18].copy_from_slice(&ET_REL.to_le_bytes());
        data[18..20].copy_from_slice(&62u16.to_le_bytes());
        data[20..24].copy_from_slice(&1u32.to_le_bytes());
        data[0x28..0x30].copy_from_slice(&(shoff as u64).to_le_bytes());
        data[52..54].copy_from_slice(&64u16.to_le_bytes());
        data[58..60].copy_from_slice(&64u16.to_le_bytes());
        data[60..62].copy_from_slice(&4u16.to_le_bytes());
        data[62..64].copy_from_slice(&3u16.to_le_bytes());
        data
    }

    #[test]
    fn masked_digest_hashes_the_masked_copy() {
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7 % 251) as u8).collect();
        let cases: Vec<Vec<Range<usize>>> = vec![
            vec![10..20],
            vec![990..1000, 0..1],
            vec![100..200, 150..160, 180..300, 5..5],
            vec![0..1000],
            vec![400..410, 400..410, 50..60],
        ];
        for ranges in cases {
            let mut copy = data.clone();
            for r in &ranges {
                copy[r.clone()].fill(0xff);
            }
            let naive = *blake3::Hasher::new_derive_key("nvlinkd 2026 host object, nvcc temporary file names masked")
                .update(&copy)
                .finalize()
                .as_bytes();
            assert_eq!(masked_digest(&data, ranges.clone()), naive, "{ranges:?}");
        }
    }

    #[test]
    fn key_digest_ignores_only_nvcc_temporary_file_names() {
        let a = object(&[("tmpxft_00004af5_00000000-6_a.cudafe1.cpp", STT_FILE), ("_Z1fv", 2)], None);
        let b = object(&[("tmpxft_00004c28_00000000-6_a.cudafe1.cpp", STT_FILE), ("_Z1fv", 2)], None);
        assert!(Elf::parse(&a).is_ok());
        assert_ne!(a, b);
        assert_eq!(key_digest(&a), key_digest(&b));
        // Any other difference counts: another function name, a file name that
        // is not nvcc's, a non-FILE symbol named like one.
        let c = object(&[("tmpxft_00004c28_00000000-6_a.cudafe1.cpp", STT_FILE), ("_Z1gv", 2)], None);
        assert_ne!(key_digest(&a), key_digest(&c));
        let d = object(&[("host_00004af5.cpp", STT_FILE)], None);
        let e = object(&[("host_00004c28.cpp", STT_FILE)], None);
        assert_ne!(key_digest(&d), key_digest(&e));
        let f = object(&[("tmpxft_00004af5_00000000-6_a.cudafe1.cpp", 2)], None);
        let g = object(&[("tmpxft_00004c28_00000000-6_a.cudafe1.cpp", 2)], None);
        assert_ne!(key_digest(&f), key_digest(&g));
        // Another symbol naming the same bytes: not masked.
        let h = object(&[("tmpxft_00004af5_00000000-6_a.cudafe1.cpp", STT_FILE), ("x", 2)], Some(1));
        let i = object(&[("tmpxft_00004c28_00000000-6_a.cudafe1.cpp", STT_FILE), ("x", 2)], Some(1));
        assert_ne!(key_digest(&h), key_digest(&i));
        // The same in the members of a static library.
        let ar = |members: &[&[u8]]| {
            let mut out = b"!<arch>\n".to_vec();
            for (i, m) in members.iter().enumerate() {
                let header = format!("{:<16}{:<12}{:<6}{:<6}{:<8}{:<10}`\n", format!("m{i}.o/"), 0, 0, 0, 644, m.len());
                out.extend_from_slice(header.as_bytes());
                out.extend_from_slice(m);
                if m.len() % 2 == 1 {
                    out.push(b'\n');
                }
            }
            out
        };
        assert_eq!(key_digest(&ar(&[&a, &d])), key_digest(&ar(&[&b, &d])));
        assert_ne!(key_digest(&ar(&[&a, &d])), key_digest(&ar(&[&b, &e])));
        assert_ne!(key_digest(&ar(&[&a, &d])), key_digest(&ar(&[&c, &d])));
        assert_ne!(key_digest(&ar(&[&a])), key_digest(&a));
        // Not ELF, or damaged: the whole bytes.
        assert_eq!(key_digest(b"text"), *blake3::hash(b"text").as_bytes());
        let mut damaged = a.clone();
        damaged[0x28] = 0xff;
        assert_eq!(key_digest(&damaged), *blake3::hash(&damaged).as_bytes());
    }
}
