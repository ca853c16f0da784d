//! An editable cubin and nvlink's file layout.
//!
//! nvlink (and nvJitLink, which shares its ELF writer) lays a cubin out in one
//! simple pass: the 64-byte ELF header, then every section in section-header
//! order, each at the next multiple of its alignment (NOBITS-like sections
//! take no room, see [`crate::elf::occupies_file`]), then the section header table (padded to 8
//! bytes by nvlink's linker, not by ptxas), then the
//! program header table right after it. A LOAD segment starts at its first
//! section and ends where its last file-backed section ends, or, for the data
//! segment, at the (aligned) offset of its last NOBITS section; the PHDR segment
//! (and the LOAD that maps it) covers the program header table.
//!
//! [`CubinImage`] keeps every header field of a parsed cubin, lets the finalizer
//! replace section contents, and [`CubinImage::serialize`] re-applies that layout.
//! Serializing an unmodified nvlink output gives back the same bytes; the parity
//! test checks this on every real nvlink output, and `layout_rules` below checks
//! each rule on small synthetic cubins.

use crate::elf::{occupies_file, Elf, ElfError};

const EHDR_SIZE: usize = 64;
const SHDR_SIZE: usize = 64;
const PHDR_SIZE: usize = 56;
const PT_PHDR: u32 = 6;
const PF_W: u32 = 2;
/// Largest section alignment accepted (cubins use at most 128).
const MAX_ALIGN: u64 = 1 << 16;

/// A section with its header fields and (owned) contents.
#[derive(Clone, Debug)]
pub struct ImageSection {
    pub name: String,
    pub sh_name: u32,
    pub sh_type: u32,
    pub flags: u64,
    pub addr: u64,
    pub link: u32,
    pub info: u32,
    pub align: u64,
    pub entsize: u64,
    /// For sections without file bytes: the size; otherwise `data.len()` is used.
    pub nobits_size: u64,
    pub data: Vec<u8>,
    /// A section that views the bytes of an earlier one instead of having its
    /// own (sm_100 cubins: `.nv.merc.nv.constant.user` maps `.nv.constant3`).
    /// It takes that section's offset and size and adds nothing to the layout.
    pub alias_of: Option<usize>,
}

impl ImageSection {
    fn size(&self) -> u64 {
        if occupies_file(self.sh_type) {
            self.data.len() as u64
        } else {
            self.nobits_size
        }
    }
}

/// What a program header maps, so that it can be recomputed after a relayout.
#[derive(Clone, Debug)]
enum SegmentSpan {
    /// The program header table itself.
    PhdrTable,
    /// The sections a segment maps, by index: the one it starts with, and every
    /// member whose (file) end bounds its file size. A data segment's file size
    /// runs up to the offset of its last NOBITS section (nvlink places those at
    /// their aligned position), not just to the end of its last initialized byte.
    Sections { first: usize, members: Vec<usize> },
    /// Anything we could not attribute: keep the raw offset and sizes.
    Opaque,
}

#[derive(Clone, Debug)]
struct ImageSegment {
    p_type: u32,
    flags: u32,
    vaddr: u64,
    paddr: u64,
    offset: u64,
    filesz: u64,
    /// memsz - filesz in the original, preserved (NOBITS tails).
    mem_extra: u64,
    align: u64,
    span: SegmentSpan,
}

/// An editable cubin.
#[derive(Clone, Debug)]
pub struct CubinImage {
    /// The original ELF header (offset fields are rewritten on output).
    header: [u8; EHDR_SIZE],
    /// Alignment of the section header table: nvlink's linker pads it to 8,
    /// ptxas (whole-program LTO outputs) does not.
    pub shdr_align: u64,
    pub sections: Vec<ImageSection>,
    segments: Vec<ImageSegment>,
}

impl CubinImage {
    pub fn parse(data: &[u8]) -> Result<Self, ElfError> {
        let elf = Elf::parse(data)?;
        let mut header = [0u8; EHDR_SIZE];
        header.copy_from_slice(data.get(..EHDR_SIZE).ok_or(ElfError::Malformed("header"))?);
        // Alignments are powers of two and small in every real cubin; anything
        // else would make the layout (and its allocation) absurd.
        if elf.sections.iter().any(|s| s.align > MAX_ALIGN || (s.align > 1 && !s.align.is_power_of_two())) {
            return Err(ElfError::Malformed("section alignment"));
        }
        // The first file-backed section at each (offset, size): a later one
        // there is an alias of it.
        let mut placed: std::collections::HashMap<(u64, u64), usize> = std::collections::HashMap::new();
        let sections: Vec<ImageSection> = elf
            .sections
            .iter()
            .enumerate()
            .map(|(i, s)| ImageSection {
                name: s.name.clone(),
                sh_name: s.sh_name,
                sh_type: s.sh_type,
                flags: s.flags,
                addr: s.addr,
                link: s.link,
                info: s.info,
                align: s.align,
                entsize: s.entsize,
                nobits_size: if occupies_file(s.sh_type) { 0 } else { s.size },
                data: elf.section_data(s).to_vec(),
                alias_of: (i > 0 && occupies_file(s.sh_type) && s.size > 0)
                    .then(|| *placed.entry((s.offset, s.size)).or_insert(i))
                    .filter(|&first| first != i),
            })
            .collect();
        let phoff = u64::from_le_bytes(header[0x20..0x28].try_into().unwrap_or_default());
        let segments = elf
            .segments
            .iter()
            .map(|p| {
                let span = if p.p_type == PT_PHDR || (p.offset == phoff && phoff != 0 && p.filesz != 0) {
                    SegmentSpan::PhdrTable
                } else {
                    Self::attribute(&elf, p.offset, p.filesz, p.flags & PF_W != 0)
                };
                ImageSegment {
                    p_type: p.p_type,
                    flags: p.flags,
                    vaddr: p.vaddr,
                    paddr: p.paddr,
                    offset: p.offset,
                    filesz: p.filesz,
                    mem_extra: p.memsz.saturating_sub(p.filesz),
                    align: p.align,
                    span,
                }
            })
            .collect();
        let shoff = u64::from_le_bytes(header[0x28..0x30].try_into().unwrap_or_default());
        let shdr_align = if shoff % 8 == 0 { 8 } else { 1 };
        Ok(CubinImage { header, sections, segments, shdr_align })
    }

    /// Find which sections a segment maps: the first section (in header order)
    /// starting at the segment's offset, the file-backed ones inside its file
    /// range, and, for a writable (data) segment, the NOBITS sections placed at
    /// or before its file end.
    fn attribute(elf: &Elf<'_>, offset: u64, filesz: u64, writable: bool) -> SegmentSpan {
        let end = offset + filesz;
        let in_range: Vec<usize> = elf
            .sections
            .iter()
            .enumerate()
            .skip(1)
            .filter(|(_, s)| {
                if occupies_file(s.sh_type) {
                    s.offset >= offset && s.offset + s.file_size() <= end && (s.offset < end || filesz == 0)
                } else {
                    writable && s.offset >= offset && s.offset <= end
                }
            })
            .map(|(i, _)| i)
            .collect();
        let Some(&first) = in_range.iter().find(|&&i| elf.sections[i].offset == offset) else {
            return SegmentSpan::Opaque;
        };
        let members = in_range
            .into_iter()
            .filter(|&i| !occupies_file(elf.sections[i].sh_type) || elf.sections[i].size > 0)
            .collect();
        SegmentSpan::Sections { first, members }
    }

    pub(crate) fn section_index(&self, name: &str) -> Option<usize> {
        self.sections.iter().position(|s| s.name == name)
    }

    /// Lay the image out as nvlink does and return the file bytes.
    pub fn serialize(&self) -> Vec<u8> {
        let mut offsets = Vec::with_capacity(self.sections.len());
        let mut pos = EHDR_SIZE as u64;
        for (i, s) in self.sections.iter().enumerate() {
            if i == 0 {
                offsets.push(0);
                continue;
            }
            if let Some(a) = s.alias_of.filter(|&a| a < i) {
                offsets.push(offsets[a]);
                continue;
            }
            let align = s.align.max(1);
            pos = pos.div_ceil(align) * align;
            offsets.push(pos);
            if occupies_file(s.sh_type) {
                pos += s.data.len() as u64;
            }
        }
        let shoff = pos.div_ceil(self.shdr_align) * self.shdr_align;
        let phoff = if self.segments.is_empty() { 0 } else { shoff + (self.sections.len() * SHDR_SIZE) as u64 };
        let total = if self.segments.is_empty() {
            shoff as usize + self.sections.len() * SHDR_SIZE
        } else {
            phoff as usize + self.segments.len() * PHDR_SIZE
        };
        let mut out = vec![0u8; total];
        out[..EHDR_SIZE].copy_from_slice(&self.header);
        out[0x20..0x28].copy_from_slice(&phoff.to_le_bytes());
        out[0x28..0x30].copy_from_slice(&shoff.to_le_bytes());
        out[0x38..0x3a].copy_from_slice(&(self.segments.len() as u16).to_le_bytes());
        out[0x3c..0x3e].copy_from_slice(&(self.sections.len() as u16).to_le_bytes());
        for (i, s) in self.sections.iter().enumerate() {
            let s_size = match s.alias_of {
                Some(a) => self.sections[a].size(),
                None => s.size(),
            };
            if occupies_file(s.sh_type) && !s.data.is_empty() && s.alias_of.is_none() {
                let o = offsets[i] as usize;
                out[o..o + s.data.len()].copy_from_slice(&s.data);
            }
            let h = shoff as usize + i * SHDR_SIZE;
            let w = &mut out[h..h + SHDR_SIZE];
            w[0..4].copy_from_slice(&s.sh_name.to_le_bytes());
            w[4..8].copy_from_slice(&s.sh_type.to_le_bytes());
            w[8..16].copy_from_slice(&s.flags.to_le_bytes());
            w[16..24].copy_from_slice(&s.addr.to_le_bytes());
            w[24..32].copy_from_slice(&offsets[i].to_le_bytes());
            w[32..40].copy_from_slice(&s_size.to_le_bytes());
            w[40..44].copy_from_slice(&s.link.to_le_bytes());
            w[44..48].copy_from_slice(&s.info.to_le_bytes());
            w[48..56].copy_from_slice(&s.align.to_le_bytes());
            w[56..64].copy_from_slice(&s.entsize.to_le_bytes());
        }
        for (j, seg) in self.segments.iter().enumerate() {
            let (offset, filesz) = match seg.span {
                SegmentSpan::PhdrTable => (phoff, (self.segments.len() * PHDR_SIZE) as u64),
                SegmentSpan::Sections { first, ref members } => {
                    let start = offsets[first];
                    let file_end = members
                        .iter()
                        .map(|&m| {
                            let s = &self.sections[m];
                            offsets[m] + if occupies_file(s.sh_type) { s.data.len() as u64 } else { 0 }
                        })
                        .max()
                        .unwrap_or(start);
                    (start, file_end.saturating_sub(start))
                }
                SegmentSpan::Opaque => (seg.offset, seg.filesz),
            };
            let h = phoff as usize + j * PHDR_SIZE;
            let w = &mut out[h..h + PHDR_SIZE];
            w[0..4].copy_from_slice(&seg.p_type.to_le_bytes());
            w[4..8].copy_from_slice(&seg.flags.to_le_bytes());
            w[8..16].copy_from_slice(&offset.to_le_bytes());
            w[16..24].copy_from_slice(&seg.vaddr.to_le_bytes());
            w[24..32].copy_from_slice(&seg.paddr.to_le_bytes());
            w[32..40].copy_from_slice(&filesz.to_le_bytes());
            w[40..48].copy_from_slice(&(filesz + seg.mem_extra).to_le_bytes());
            w[48..56].copy_from_slice(&seg.align.to_le_bytes());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    //! nvlink's layout rules on small synthetic cubins (no toolkit): each row
    //! is written out with a sloppy layout of its own (every section at a
    //! multiple of 256, the headers after them), parsed, optionally edited,
    //! serialized, and the offsets of the result compared with nvlink's rules
    //! worked out by hand.

    use super::*;
    use crate::elf::SHT_NOBITS;

    const PROGBITS: u32 = 1;
    const SHARED: u32 = 0x7000_000a;
    const PT_LOAD: u32 = 1;
    const R: u32 = 4;
    const X: u32 = 1;
    const W: u32 = 2;
    /// `.shstrtab`, always section 1, padded to 64 bytes: the row's sections
    /// start at offset 128 in nvlink's layout.
    const SHSTRTAB_SIZE: usize = 64;

    /// (name, sh_type, alignment, size, alias of row section).
    type Sec = (&'static str, u32, u64, u64, Option<usize>);
    /// (p_type, p_flags, row sections mapped; none: the program header table).
    type Seg = (u32, u32, &'static [usize]);

    /// Write a cubin-shaped ELF with these sections and segments, laid out
    /// unlike nvlink (gaps everywhere); `shdr_align` 1 puts the section header
    /// table at an odd offset, as ptxas may.
    fn sloppy_elf(secs: &[Sec], segs: &[Seg], shdr_align: u64) -> Vec<u8> {
        let mut names = vec![0u8];
        let mut sh_names = vec![0u32, 1];
        names.extend_from_slice(b".shstrtab\0");
        for (name, ..) in secs {
            sh_names.push(names.len() as u32);
            names.extend_from_slice(name.as_bytes());
            names.push(0);
        }
        assert!(names.len() <= SHSTRTAB_SIZE);
        names.resize(SHSTRTAB_SIZE, 0);
        // (type, align, offset, size) of every section, the null one first.
        let mut hdrs: Vec<(u32, u64, u64, u64)> = vec![(0, 0, 0, 0), (3, 1, 256, SHSTRTAB_SIZE as u64)];
        let mut out = vec![0u8; 512];
        out[256..256 + SHSTRTAB_SIZE].copy_from_slice(&names);
        for (i, &(_, ty, align, size, alias)) in secs.iter().enumerate() {
            if let Some(a) = alias {
                let (_, _, offset, size) = hdrs[a + 2];
                hdrs.push((ty, align, offset, size));
                continue;
            }
            let offset = out.len() as u64;
            hdrs.push((ty, align, offset, size));
            let room = if occupies_file(ty) { size as usize } else { 0 };
            out.extend((0..room).map(|b| (i * 16 + b) as u8));
            out.resize(out.len().div_ceil(256) * 256, 0xee);
        }
        let shoff = out.len() as u64 + if shdr_align == 1 { 1 } else { 0 };
        out.resize(shoff as usize, 0);
        for (i, &(ty, align, offset, size)) in hdrs.iter().enumerate() {
            let mut h = [0u8; SHDR_SIZE];
            h[0..4].copy_from_slice(&sh_names[i].to_le_bytes());
            h[4..8].copy_from_slice(&ty.to_le_bytes());
            h[24..32].copy_from_slice(&offset.to_le_bytes());
            h[32..40].copy_from_slice(&size.to_le_bytes());
            h[48..56].copy_from_slice(&align.to_le_bytes());
            out.extend_from_slice(&h);
        }
        let phoff = if segs.is_empty() { 0 } else { out.len() as u64 };
        for &(p_type, flags, members) in segs {
            let (offset, filesz, memsz) = if members.is_empty() {
                (phoff, (segs.len() * PHDR_SIZE) as u64, (segs.len() * PHDR_SIZE) as u64)
            } else {
                let m: Vec<_> = members.iter().map(|&i| hdrs[i + 2]).collect();
                let start = m[0].2;
                let end = m.iter().map(|&(ty, _, o, s)| o + if occupies_file(ty) { s } else { 0 }).max().unwrap();
                let mem_end = m.iter().map(|&(_, _, o, s)| o + s).max().unwrap();
                (start, end - start, mem_end - start)
            };
            let mut h = [0u8; PHDR_SIZE];
            h[0..4].copy_from_slice(&p_type.to_le_bytes());
            h[4..8].copy_from_slice(&flags.to_le_bytes());
            h[8..16].copy_from_slice(&offset.to_le_bytes());
            h[32..40].copy_from_slice(&filesz.to_le_bytes());
            h[40..48].copy_from_slice(&memsz.to_le_bytes());
            h[48..56].copy_from_slice(&8u64.to_le_bytes());
            out.extend_from_slice(&h);
        }
        let mut e = [0u8; EHDR_SIZE];
        e[..8].copy_from_slice(&[0x7f, b'E', b'L', b'F', 2, 1, 1, 0x41]);
        e[8] = 8;
        e[16..18].copy_from_slice(&2u16.to_le_bytes()); // ET_EXEC
        e[18..20].copy_from_slice(&crate::elf::EM_CUDA.to_le_bytes());
        e[20..24].copy_from_slice(&1u32.to_le_bytes());
        e[0x20..0x28].copy_from_slice(&phoff.to_le_bytes());
        e[0x28..0x30].copy_from_slice(&shoff.to_le_bytes());
        e[0x30..0x34].copy_from_slice(&0x5a02u32.to_le_bytes());
        e[0x34..0x36].copy_from_slice(&(EHDR_SIZE as u16).to_le_bytes());
        e[0x36..0x38].copy_from_slice(&(PHDR_SIZE as u16).to_le_bytes());
        e[0x38..0x3a].copy_from_slice(&(segs.len() as u16).to_le_bytes());
        e[0x3a..0x3c].copy_from_slice(&(SHDR_SIZE as u16).to_le_bytes());
        e[0x3c..0x3e].copy_from_slice(&(hdrs.len() as u16).to_le_bytes());
        e[0x3e..0x40].copy_from_slice(&1u16.to_le_bytes());
        out[..EHDR_SIZE].copy_from_slice(&e);
        out
    }

    struct Row {
        what: &'static str,
        secs: &'static [Sec],
        segs: &'static [Seg],
        shdr_align: u64,
        /// Resize a row section's contents before serializing.
        edit: Option<(usize, usize)>,
        /// nvlink's layout: (offset, size) of each row section...
        offsets: &'static [(u64, u64)],
        /// ... the section and program header tables' offsets...
        shoff: u64,
        phoff: u64,
        /// ... and each segment's (offset, file size).
        spans: &'static [(u64, u64)],
    }

    const TEXT_DATA: &[Sec] = &[
        (".text.k", PROGBITS, 128, 40, None),
        (".nv.constant0.k", PROGBITS, 4, 12, None),
        (".nv.global.init", PROGBITS, 8, 6, None),
        (".nv.global", SHT_NOBITS, 16, 64, None),
    ];
    const TEXT_DATA_SEGS: &[Seg] =
        &[(PT_PHDR, R, &[]), (PT_LOAD, R | X, &[0, 1]), (PT_LOAD, R | W, &[2, 3]), (PT_LOAD, R, &[])];

    const ROWS: &[Row] = &[
        Row {
            what: "each section at the next multiple of its alignment; NOBITS-like ones take no room (but are aligned)",
            secs: &[
                ("a", PROGBITS, 4, 10, None),
                ("b", PROGBITS, 128, 3, None),
                ("c", SHT_NOBITS, 16, 100, None),
                (".nv.shared.k", SHARED, 4, 8, None),
                ("e", PROGBITS, 8, 5, None),
            ],
            segs: &[],
            shdr_align: 8,
            edit: None,
            offsets: &[(128, 10), (256, 3), (272, 100), (272, 8), (272, 5)],
            shoff: 280,
            phoff: 0,
            spans: &[],
        },
        Row {
            what: "ptxas's section header table is not padded",
            secs: &[("a", PROGBITS, 4, 10, None), ("e", PROGBITS, 8, 5, None)],
            segs: &[],
            shdr_align: 1,
            edit: None,
            offsets: &[(128, 10), (144, 5)],
            shoff: 149,
            phoff: 0,
            spans: &[],
        },
        Row {
            what: "an alias takes its section's offset and size and no room",
            secs: &[
                (".nv.constant3", PROGBITS, 4, 16, None),
                (".nv.merc.nv.constant.user", PROGBITS, 4, 16, Some(0)),
                ("c", PROGBITS, 1, 3, None),
            ],
            segs: &[],
            shdr_align: 8,
            edit: None,
            offsets: &[(128, 16), (128, 16), (144, 3)],
            shoff: 152,
            phoff: 0,
            spans: &[],
        },
        Row {
            what: "segments: code to its last byte, data to its last NOBITS section's offset, PHDR over the table",
            secs: TEXT_DATA,
            segs: TEXT_DATA_SEGS,
            shdr_align: 8,
            edit: None,
            offsets: &[(128, 40), (168, 12), (184, 6), (192, 64)],
            shoff: 192,
            phoff: 192 + 6 * 64,
            spans: &[(576, 4 * 56), (128, 52), (184, 8), (576, 4 * 56)],
        },
        Row {
            what: "a grown section moves everything after it, segments follow",
            secs: TEXT_DATA,
            segs: TEXT_DATA_SEGS,
            shdr_align: 8,
            edit: Some((0, 100)),
            offsets: &[(128, 100), (228, 12), (240, 6), (256, 64)],
            shoff: 256,
            phoff: 256 + 6 * 64,
            spans: &[(640, 4 * 56), (128, 112), (240, 16), (640, 4 * 56)],
        },
    ];

    fn u64_at(b: &[u8], at: usize) -> u64 {
        u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
    }

    #[test]
    fn layout_rules() {
        for row in ROWS {
            let input = sloppy_elf(row.secs, row.segs, row.shdr_align);
            let mut img = CubinImage::parse(&input).unwrap_or_else(|e| panic!("{}: {e}", row.what));
            if let Some((i, len)) = row.edit {
                img.sections[i + 2].data.resize(len, 0x55);
            }
            let out = img.serialize();
            let elf = Elf::parse(&out).unwrap_or_else(|e| panic!("{}: output: {e}", row.what));
            let got: Vec<(u64, u64)> = elf.sections[2..].iter().map(|s| (s.offset, s.size)).collect();
            assert_eq!(got, row.offsets, "{}: section offsets", row.what);
            assert_eq!((elf.sections[1].offset, elf.sections[1].size), (64, SHSTRTAB_SIZE as u64), "{}", row.what);
            assert_eq!(u64_at(&out, 0x28), row.shoff, "{}: e_shoff", row.what);
            assert_eq!(u64_at(&out, 0x20), row.phoff, "{}: e_phoff", row.what);
            let spans: Vec<(u64, u64)> = elf.segments.iter().map(|p| (p.offset, p.filesz)).collect();
            assert_eq!(spans, row.spans, "{}: segments", row.what);
            // Memory beyond the file bytes (NOBITS tails) is kept.
            let before = Elf::parse(&input).unwrap();
            for (a, b) in before.segments.iter().zip(&elf.segments) {
                assert_eq!(a.memsz - a.filesz, b.memsz - b.filesz, "{}: memsz tail", row.what);
            }
            // Contents go where the headers say; the file ends with the last table.
            for (i, s) in img.sections.iter().enumerate().skip(1) {
                if occupies_file(s.sh_type) {
                    assert_eq!(elf.section_data(&elf.sections[i]), &s.data[..], "{}: contents of {}", row.what, s.name);
                }
            }
            let end = if row.segs.is_empty() {
                row.shoff + 64 * elf.sections.len() as u64
            } else {
                row.phoff + 56 * row.segs.len() as u64
            };
            assert_eq!(out.len() as u64, end, "{}: file size", row.what);
            // nvlink's layout is a fixed point.
            assert_eq!(CubinImage::parse(&out).unwrap().serialize(), out, "{}: not stable", row.what);
        }
    }
}
