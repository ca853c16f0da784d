//! A small, bounds-checked view of 64-bit little-endian ELF files.
//!
//! Both kinds of ELF that reach nvlink go through here: host relocatable objects
//! (x86-64 and friends, carrying device code in `__nv_relfatbin`) and device
//! cubins (`e_machine == EM_CUDA`). The reader keeps every header field, because
//! the output finalizer (`crate::finalize`) rewrites cubins field by field and
//! must reproduce what it does not change.
//!
//! All offsets and sizes come from untrusted bytes: every access is checked and a
//! malformed file is an [`ElfError`], never a panic.

use object::elf;
use object::read::elf::{FileHeader, SectionHeader as _, Sym as _};
use object::LittleEndian as LE;

/// `e_machine` of device code.
pub const EM_CUDA: u16 = elf::EM_CUDA.0;
/// `e_type` of a relocatable object.
pub const ET_REL: u16 = elf::ET_REL.0;
/// `st_other` bit that marks a kernel (an entry function) in a cubin.
pub const STO_CUDA_ENTRY: u8 = 0x10;
/// `st_info` type of CUDA objects (`CUDA_OBJECT` in cuobjdump).
pub const STT_CUDA_OBJECT: u8 = 13;
/// `st_other` bit of a `CUDA_OBJECT` in shared memory (cuobjdump's `SHARED`).
pub const STO_CUDA_SHARED: u8 = 0x40;
/// `sh_type` of NOBITS sections: they take no space in the file.
pub const SHT_NOBITS: u32 = elf::SHT_NOBITS.0;
/// `sh_type` of the symbol table.
pub const SHT_SYMTAB: u32 = elf::SHT_SYMTAB.0;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ElfError {
    #[error("not an ELF file")]
    NotElf,
    #[error("not a 64-bit little-endian ELF file")]
    UnsupportedClass,
    #[error("malformed ELF: {0}")]
    Malformed(&'static str),
}

/// One section header, all fields kept.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Section {
    pub name: String,
    pub sh_name: u32,
    pub sh_type: u32,
    pub flags: u64,
    pub addr: u64,
    pub offset: u64,
    pub size: u64,
    pub link: u32,
    pub info: u32,
    pub align: u64,
    pub entsize: u64,
}

/// CUDA section types that, like `SHT_NOBITS`, describe memory but take no
/// room in the file: `.nv.global` (0x70000007), `.nv.shared.*` (0x7000000a),
/// `.nv.shared.reserved.*` (0x70000015). They keep these types in relocatable
/// cubins; executables turn `.nv.global` into `SHT_NOBITS`.
pub const CUDA_NOBITS_TYPES: [u32; 3] = [0x7000_0007, 0x7000_000a, 0x7000_0015];

/// Whether a section of this type has bytes in the file.
pub(crate) fn occupies_file(sh_type: u32) -> bool {
    sh_type != SHT_NOBITS && !CUDA_NOBITS_TYPES.contains(&sh_type)
}

impl Section {
    /// Bytes this section occupies in the file (NOBITS-like: none).
    pub(crate) fn file_size(&self) -> u64 {
        if occupies_file(self.sh_type) {
            self.size
        } else {
            0
        }
    }
}

/// One symbol table entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Symbol {
    pub name: String,
    pub st_name: u32,
    pub info: u8,
    pub other: u8,
    pub shndx: u16,
    pub value: u64,
    pub size: u64,
}

impl Symbol {
    pub(crate) fn binding(&self) -> u8 {
        self.info >> 4
    }
    pub fn kind(&self) -> u8 {
        self.info & 0xf
    }
    pub(crate) fn is_defined(&self) -> bool {
        self.shndx != elf::SHN_UNDEF.0
    }
    pub(crate) fn is_global(&self) -> bool {
        self.binding() == elf::STB_GLOBAL.0 || self.binding() == elf::STB_WEAK.0
    }
    pub(crate) fn is_weak(&self) -> bool {
        self.binding() == elf::STB_WEAK.0
    }
    pub(crate) fn is_entry(&self) -> bool {
        self.other & STO_CUDA_ENTRY != 0
    }
    /// An `extern __shared__` array: a shared `CUDA_OBJECT` without a section.
    /// It is dynamic shared memory, sized at launch; nothing defines it.
    pub(crate) fn is_dynamic_shared(&self) -> bool {
        self.kind() == STT_CUDA_OBJECT && self.other & STO_CUDA_SHARED != 0 && !self.is_defined()
    }
}

/// One program header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    pub p_type: u32,
    pub flags: u32,
    pub offset: u64,
    pub vaddr: u64,
    pub paddr: u64,
    pub filesz: u64,
    pub memsz: u64,
    pub align: u64,
}

/// A parsed ELF file borrowing its bytes.
#[derive(Clone, Debug)]
pub struct Elf<'a> {
    pub data: &'a [u8],
    pub e_type: u16,
    pub machine: u16,
    pub flags: u32,
    pub abi_version: u8,
    pub osabi: u8,
    pub shstrndx: usize,
    pub sections: Vec<Section>,
    pub segments: Vec<Segment>,
}

/// True when `data` starts like any ELF file.
pub(crate) fn is_elf(data: &[u8]) -> bool {
    data.starts_with(&elf::ELFMAG)
}

/// A 16-bit field of a 64-bit little-endian file header, read from the bytes
/// alone (nvlink looks at these before, and whether or not, the rest parses);
/// `None` when `data` is too short to hold it.
fn header_u16(data: &[u8], offset: usize) -> Option<u16> {
    data.get(offset..offset + 2).map(|b| u16::from_le_bytes([b[0], b[1]]))
}

/// `e_type` of the file header (`ET_REL`, …), from the bytes alone.
pub(crate) fn header_type(data: &[u8]) -> Option<u16> {
    header_u16(data, std::mem::offset_of!(elf::FileHeader64<LE>, e_type))
}

/// `e_machine` of the file header (`EM_CUDA`, …), from the bytes alone.
pub(crate) fn header_machine(data: &[u8]) -> Option<u16> {
    header_u16(data, std::mem::offset_of!(elf::FileHeader64<LE>, e_machine))
}

/// A device ELF by its header: the ELF magic and `e_machine == EM_CUDA`
/// (whether or not the rest parses).
pub(crate) fn is_cuda_elf(data: &[u8]) -> bool {
    is_elf(data) && header_machine(data) == Some(EM_CUDA)
}

impl<'a> Elf<'a> {
    pub fn parse(data: &'a [u8]) -> Result<Self, ElfError> {
        Self::parse_as(data, false)
    }

    /// A host object, as nvlink's host-object reader takes one (measured with
    /// damaged copies of nvcc's objects): `EI_VERSION` is not looked at, a
    /// section name past the string table names nothing (the section stays,
    /// matched by no name), and a `SHT_NOBITS` section's offset is not
    /// checked against the file's size.
    pub fn parse_host(data: &'a [u8]) -> Result<Self, ElfError> {
        Self::parse_as(data, true)
    }

    fn parse_as(data: &'a [u8], host: bool) -> Result<Self, ElfError> {
        if !is_elf(data) {
            return Err(ElfError::NotElf);
        }
        if data.len() < 6 || data[4] != elf::ELFCLASS64.0 || data[5] != elf::ELFDATA2LSB.0 {
            return Err(ElfError::UnsupportedClass);
        }
        // `object` checks EI_VERSION; nvlink's host reader does not.
        let mut header = [0u8; std::mem::size_of::<elf::FileHeader64<LE>>()];
        let n = header.len().min(data.len());
        header[..n].copy_from_slice(&data[..n]);
        if host {
            header[6] = elf::EV_CURRENT.0;
        }
        let hdr = elf::FileHeader64::<LE>::parse(&header[..n]).map_err(|_| ElfError::Malformed("file header"))?;
        let e = LE;
        let sections_table = hdr.sections(e, data).map_err(|_| ElfError::Malformed("section headers"))?;
        let mut sections = Vec::with_capacity(sections_table.len());
        for sh in sections_table.iter() {
            let sh_name = sh.sh_name(e);
            let name = sections_table
                .section_name(e, sh)
                // `from_utf8` checks ASCII a word at a time; the lossy
                // conversion walks byte by byte, and a CUB object has over
                // a thousand section names of up to 400 bytes.
                .map(|n| {
                    std::str::from_utf8(n).map_or_else(|_| String::from_utf8_lossy(n).into_owned(), str::to_owned)
                });
            let name = match name {
                Ok(name) => name,
                // Matched by no name nvlink looks for.
                Err(_) if host => String::new(),
                Err(_) => return Err(ElfError::Malformed("section name")),
            };
            let s = Section {
                name,
                sh_name,
                sh_type: sh.sh_type(e).0,
                flags: sh.sh_flags(e).0,
                addr: sh.sh_addr(e),
                offset: sh.sh_offset(e),
                size: sh.sh_size(e),
                link: sh.sh_link(e),
                info: sh.sh_info(e),
                align: sh.sh_addralign(e),
                entsize: sh.sh_entsize(e),
            };
            let end = s.offset.checked_add(s.file_size()).ok_or(ElfError::Malformed("section range"))?;
            if end > data.len() as u64 && !(host && s.sh_type == SHT_NOBITS) {
                return Err(ElfError::Malformed("section extends past end of file"));
            }
            sections.push(s);
        }
        let phdrs = hdr.program_headers(e, data).map_err(|_| ElfError::Malformed("program headers"))?;
        let segments = phdrs
            .iter()
            .map(|p| {
                use object::read::elf::ProgramHeader as _;
                Segment {
                    p_type: p.p_type(e).0,
                    flags: p.p_flags(e).0,
                    offset: p.p_offset(e),
                    vaddr: p.p_vaddr(e),
                    paddr: p.p_paddr(e),
                    filesz: p.p_filesz(e),
                    memsz: p.p_memsz(e),
                    align: p.p_align(e),
                }
            })
            .collect();
        Ok(Elf {
            data,
            e_type: hdr.e_type(e).0,
            machine: hdr.e_machine(e).0,
            flags: hdr.e_flags(e).0,
            abi_version: data[8],
            osabi: data[7],
            shstrndx: hdr.shstrndx(e, data).map_err(|_| ElfError::Malformed("shstrndx"))? as usize,
            sections,
            segments,
        })
    }

    pub fn is_cubin(&self) -> bool {
        self.machine == EM_CUDA
    }

    pub fn section(&self, name: &str) -> Option<(usize, &Section)> {
        self.sections.iter().enumerate().find(|(_, s)| s.name == name)
    }

    /// The file bytes of a section (empty for NOBITS).
    pub fn section_data(&self, s: &Section) -> &'a [u8] {
        let start = s.offset as usize;
        // Ranges were checked in `parse`.
        &self.data[start..start + s.file_size() as usize]
    }

    pub(crate) fn section_data_by_name(&self, name: &str) -> Option<&'a [u8]> {
        self.section(name).map(|(_, s)| self.section_data(s))
    }

    /// The entries of the (first) SYMTAB section, names resolved.
    pub fn symbols(&self) -> Result<Vec<Symbol>, ElfError> {
        let Some((_, symtab)) = self.sections.iter().enumerate().find(|(_, s)| s.sh_type == SHT_SYMTAB) else {
            return Ok(Vec::new());
        };
        let strtab = self
            .sections
            .get(symtab.link as usize)
            .map(|s| self.section_data(s))
            .ok_or(ElfError::Malformed("symbol string table"))?;
        let data = self.section_data(symtab);
        let count = data.len() / 24;
        let mut out = Vec::with_capacity(count);
        for i in 0..count {
            let raw: &elf::Sym64<LE> = object::pod::from_bytes(&data[i * 24..(i + 1) * 24])
                .map(|(s, _)| s)
                .map_err(|_| ElfError::Malformed("symbol"))?;
            let st_name = raw.st_name(LE);
            out.push(Symbol {
                name: c_str_at(strtab, st_name as usize).ok_or(ElfError::Malformed("symbol name"))?.to_owned(),
                st_name,
                info: raw.st_info().0,
                other: raw.st_other().0,
                shndx: raw.st_shndx(LE).0,
                value: raw.st_value(LE),
                size: raw.st_size(LE),
            });
        }
        Ok(out)
    }
}

/// The NUL-terminated string at `offset` in a string table.
pub(crate) fn c_str_at(table: &[u8], offset: usize) -> Option<&str> {
    let rest = table.get(offset..)?;
    let end = rest.iter().position(|&b| b == 0)?;
    std::str::from_utf8(&rest[..end]).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_garbage_without_panicking() {
        assert_eq!(Elf::parse(b"hello").unwrap_err(), ElfError::NotElf);
        let mut bytes = b"\x7fELF\x02\x01\x01".to_vec();
        assert!(Elf::parse(&bytes).is_err());
        // A bare header: its string-table index names no section.
        bytes.resize(64, 0);
        assert_eq!(Elf::parse(&bytes).unwrap_err(), ElfError::Malformed("shstrndx"));
        for len in 0..64 {
            let _ = Elf::parse(&bytes[..len]);
        }
    }

    #[test]
    fn header_fields_are_read_at_nvlinks_offsets() {
        let mut h = b"\x7fELF\x02\x01\x01".to_vec();
        h.resize(20, 0);
        h[16..18].copy_from_slice(&ET_REL.to_le_bytes());
        h[18..20].copy_from_slice(&190u16.to_le_bytes());
        assert_eq!(header_type(&h), Some(1));
        assert_eq!(header_machine(&h), Some(190));
        assert!(is_cuda_elf(&h));
        assert_eq!(header_machine(&h[..19]), None);
        assert!(!is_cuda_elf(&h[..19]));
        h[18] = 62; // EM_X86_64
        assert!(!is_cuda_elf(&h));
        assert!(!is_cuda_elf(b"!<arch>\n                    "));
    }

    #[test]
    fn c_str_at_is_bounded() {
        assert_eq!(c_str_at(b"\0abc\0", 1), Some("abc"));
        assert_eq!(c_str_at(b"\0abc", 1), None);
        assert_eq!(c_str_at(b"", 5), None);
    }
}
