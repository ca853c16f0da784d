//! What a file is, judged by its bytes.
//!
//! nvlink itself first looks at the file name's extension (see
//! `crate::input::load` for how the two are combined); this module only says
//! what the content is.

use crate::elf::{is_cuda_elf, is_elf};
use crate::fatbin::is_fatbin;

/// LTO IR magic (NVVM container), little-endian `0x1EE55A01`.
pub const LTOIR_MAGIC: u32 = 0x1EE5_5A01;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Content {
    /// A host relocatable object or any non-CUDA ELF.
    HostElf,
    /// A device ELF (`e_machine == EM_CUDA`).
    Cubin,
    Fatbin,
    Ptx,
    LtoIr,
    /// `!<arch>\n`.
    Archive,
    /// `!<thin>\n`.
    ThinArchive,
    Empty,
    Unknown,
}

pub(crate) fn classify(data: &[u8]) -> Content {
    if data.is_empty() {
        return Content::Empty;
    }
    if data.starts_with(b"!<arch>\n") {
        return Content::Archive;
    }
    if data.starts_with(b"!<thin>\n") {
        return Content::ThinArchive;
    }
    if is_elf(data) {
        return if is_cuda_elf(data) { Content::Cubin } else { Content::HostElf };
    }
    if is_fatbin(data) {
        return Content::Fatbin;
    }
    let word = |o: usize| data.get(o..o + 4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
    if word(0) == Some(LTOIR_MAGIC) || (word(0) == Some(0) && word(4) == Some(LTOIR_MAGIC)) {
        return Content::LtoIr;
    }
    if is_ptx(data) {
        return Content::Ptx;
    }
    Content::Unknown
}

/// PTX: `.version` after whitespace and `//` or `/* */` comments.
pub(crate) fn is_ptx(data: &[u8]) -> bool {
    let mut i = 0;
    loop {
        while i < data.len() && data[i].is_ascii_whitespace() {
            i += 1;
        }
        if data[i..].starts_with(b"//") {
            match data[i..].iter().position(|&b| b == b'\n') {
                Some(n) => i += n + 1,
                None => return false,
            }
        } else if data[i..].starts_with(b"/*") {
            match data[i + 2..].windows(2).position(|w| w == b"*/") {
                Some(n) => i += 2 + n + 2,
                None => return false,
            }
        } else {
            return data[i..].starts_with(b".version");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sniffing() {
        assert_eq!(classify(b""), Content::Empty);
        assert_eq!(classify(b"!<arch>\nxx"), Content::Archive);
        assert_eq!(classify(b"!<thin>\nxx"), Content::ThinArchive);
        assert_eq!(classify(b"  // c\n/* x */ .version 9.5"), Content::Ptx);
        assert_eq!(classify(b"/* unterminated"), Content::Unknown);
        assert_eq!(classify(&[0x01, 0x5a, 0xe5, 0x1e, 0, 0]), Content::LtoIr);
        assert_eq!(classify(&[0, 0, 0, 0, 0x01, 0x5a, 0xe5, 0x1e]), Content::LtoIr);
        assert_eq!(classify(&[0x50, 0xed, 0x55, 0xba, 1, 0]), Content::Fatbin);
        assert_eq!(classify(b"hello"), Content::Unknown);
    }
}
