//! Fatbin containers: the device-code bundles inside host objects.
//!
//! A container starts with the magic `0xBA55ED50`, a version and the size of what
//! follows; then members follow back to back, each a header and a payload padded
//! to 8 bytes. Member kinds seen from nvcc 13.5: 1 = PTX, 2 = ELF (cubin),
//! 8 = LTO IR. A member carries its target arch, a code version, flags (bit 15:
//! payload compressed with zstd) and, in an extended header, the option string it
//! was compiled with (`--compile-only  ` for PTX, `-ftz=0 -prec_div=1 ...` for
//! LTO IR). Payloads are decompressed lazily and checked against their declared size.

use std::borrow::Cow;

pub const FATBIN_MAGIC: u32 = 0xBA55_ED50;
const CONTAINER_HEADER: usize = 16;
const MEMBER_HEADER_MIN: usize = 64;
/// Flag bit: payload is zstd-compressed.
const FLAG_COMPRESSED: u64 = 0x8000;
/// Every flag bit nvcc 13 sets on the members it makes (seen on the whole
/// corpus: 64-bit, debug, host Linux, compressed, LTO, arch-specific, family,
/// and one more of SASS members).
const KNOWN_FLAGS: u64 = 0x1 | 0x2 | 0x10 | FLAG_COMPRESSED | 0x1_0000 | 0x10_0000 | 0x20_0000 | 0x100_0000;
/// Member built for an arch-specific target (`sm_90a`, `compute_100a`).
const FLAG_ARCH_SPECIFIC: u64 = 0x10_0000;
/// Member built for an arch family (`sm_100f`, `compute_100f`).
const FLAG_FAMILY: u64 = 0x20_0000;
/// Upper bound on a decompressed member, to refuse decompression bombs.
/// 256 MiB, past any member a build makes: a 67 KB member that declared 2 GiB
/// of zeros took the daemon to 4.3 GB. A larger one is left to nvlink.
const MAX_MEMBER_SIZE: u64 = 256 << 20;

#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum FatbinError {
    #[error("bad fatbin magic")]
    BadMagic,
    #[error("truncated fatbin")]
    Truncated,
    #[error("corrupted fatbin member")]
    Corrupt,
    /// The compressed payload is not zstd data that decodes (nvlink's
    /// "Uncompress failed").
    #[error("fatbin member does not decompress")]
    Uncompress,
}

/// What a member holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemberKind {
    Ptx,
    Cubin,
    LtoIr,
    Other(u16),
}

impl MemberKind {
    fn from_raw(k: u16) -> Self {
        match k {
            1 => MemberKind::Ptx,
            2 => MemberKind::Cubin,
            8 => MemberKind::LtoIr,
            other => MemberKind::Other(other),
        }
    }
}

/// One member of a container.
#[derive(Clone, Debug)]
pub struct Member<'a> {
    pub kind: MemberKind,
    /// SM number the member is for (90 for sm_90 / compute_90).
    pub arch: u32,
    pub version_major: u16,
    pub version_minor: u16,
    pub flags: u64,
    /// The compile options recorded in the member, if any (trailing NULs removed).
    pub options: &'a str,
    payload: &'a [u8],
    uncompressed_size: u64,
}

impl<'a> Member<'a> {
    /// The arch suffix the member was built for: `a` (arch-specific), `f`
    /// (family), or none.
    pub(crate) fn suffix(&self) -> Option<char> {
        if self.flags & FLAG_ARCH_SPECIFIC != 0 {
            Some('a')
        } else if self.flags & FLAG_FAMILY != 0 {
            Some('f')
        } else {
            None
        }
    }

    /// A compressed cubin member of `payload` declaring `size` bytes (tests).
    #[cfg(test)]
    pub(crate) fn compressed_for_test(payload: &'a [u8], size: u64) -> Member<'a> {
        Member {
            kind: MemberKind::Cubin,
            arch: 90,
            version_major: 1,
            version_minor: 0,
            flags: FLAG_COMPRESSED,
            options: "",
            payload,
            uncompressed_size: size,
        }
    }

    /// The member's size once decompressed (its declared size).
    pub(crate) fn uncompressed_size(&self) -> u64 {
        self.uncompressed_size
    }

    pub(crate) fn is_compressed(&self) -> bool {
        self.flags & FLAG_COMPRESSED != 0 && self.payload.starts_with(&[0x28, 0xb5, 0x2f, 0xfd])
    }

    /// BLAKE3 of the member as stored: its flags, declared size and payload.
    pub(crate) fn fingerprint(&self) -> [u8; 32] {
        let mut h = blake3::Hasher::new();
        h.update(&self.flags.to_le_bytes());
        h.update(&self.uncompressed_size.to_le_bytes());
        h.update(self.payload);
        *h.finalize().as_bytes()
    }

    /// The member's contents, decompressed if needed.
    pub fn contents(&self) -> Result<Cow<'a, [u8]>, FatbinError> {
        if !self.is_compressed() {
            return Ok(Cow::Borrowed(self.payload));
        }
        if self.uncompressed_size > MAX_MEMBER_SIZE {
            return Err(FatbinError::Corrupt);
        }
        // The declared size is untrusted: grow with the data rather than reserve it.
        let mut out = Vec::with_capacity((self.uncompressed_size as usize).min(self.payload.len().saturating_mul(8)));
        // libzstd (the zstd crate) decodes several times faster than a pure-Rust
        // decoder; device links of CUB-heavy objects spend most of their input
        // time here.
        let mut decoder =
            zstd::stream::read::Decoder::with_buffer(self.payload).map_err(|_| FatbinError::Uncompress)?.single_frame();
        use std::io::Read;
        (&mut decoder).take(self.uncompressed_size + 1).read_to_end(&mut out).map_err(|_| FatbinError::Uncompress)?;
        if out.len() as u64 != self.uncompressed_size {
            return Err(FatbinError::Corrupt);
        }
        Ok(Cow::Owned(out))
    }
}

fn u16_at(d: &[u8], o: usize) -> Option<u16> {
    d.get(o..o + 2).map(|b| u16::from_le_bytes([b[0], b[1]]))
}
fn u32_at(d: &[u8], o: usize) -> Option<u32> {
    d.get(o..o + 4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}
fn u64_at(d: &[u8], o: usize) -> Option<u64> {
    d.get(o..o + 8).map(|b| {
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        u64::from_le_bytes(a)
    })
}

/// True when `data` starts with the fatbin magic.
pub(crate) fn is_fatbin(data: &[u8]) -> bool {
    u32_at(data, 0) == Some(FATBIN_MAGIC)
}

/// The members of the first container only: what nvlink reads from a host
/// object's `__nv_relfatbin` (an `ld -r` of two objects holds two containers,
/// and nvlink links only the first).
pub(crate) fn parse_first(data: &[u8]) -> Result<Vec<Member<'_>>, FatbinError> {
    if u32_at(data, 0) != Some(FATBIN_MAGIC) {
        return Err(FatbinError::BadMagic);
    }
    let header_size = u16_at(data, 6).ok_or(FatbinError::Truncated)? as usize;
    let fat_size = u64_at(data, 8).ok_or(FatbinError::Truncated)?;
    let end = usize::try_from(fat_size).ok().and_then(|s| header_size.checked_add(s)).ok_or(FatbinError::Truncated)?;
    if header_size < CONTAINER_HEADER {
        return Err(FatbinError::Corrupt);
    }
    if end > data.len() {
        return Err(FatbinError::Truncated);
    }
    parse(&data[..end])
}

/// Parse every container in `data` (a fatbin file or a fatbin section, which may
/// hold several containers back to back, possibly followed by zero padding).
pub fn parse(data: &[u8]) -> Result<Vec<Member<'_>>, FatbinError> {
    let mut members = Vec::new();
    let mut pos = 0usize;
    let mut first = true;
    while pos < data.len() {
        if !first && data[pos..].iter().all(|&b| b == 0) {
            break;
        }
        first = false;
        if u32_at(data, pos) != Some(FATBIN_MAGIC) {
            return Err(FatbinError::BadMagic);
        }
        // nvlink knows container version 1 only ("Can't load this binary kind").
        if u16_at(data, pos + 4) != Some(1) {
            return Err(FatbinError::Corrupt);
        }
        let header_size = u16_at(data, pos + 6).ok_or(FatbinError::Truncated)? as usize;
        let fat_size = u64_at(data, pos + 8).ok_or(FatbinError::Truncated)?;
        if header_size < CONTAINER_HEADER {
            return Err(FatbinError::Corrupt);
        }
        let body_start = pos + header_size;
        let end =
            usize::try_from(fat_size).ok().and_then(|s| body_start.checked_add(s)).ok_or(FatbinError::Truncated)?;
        if end > data.len() {
            return Err(FatbinError::Truncated);
        }
        let mut m = body_start;
        while m < end {
            let (member, next) = parse_member(&data[..end], m)?;
            members.push(member);
            m = next;
        }
        pos = end;
    }
    Ok(members)
}

fn parse_member(data: &[u8], at: usize) -> Result<(Member<'_>, usize), FatbinError> {
    let t = FatbinError::Truncated;
    let kind = u16_at(data, at).ok_or(t.clone())?;
    let header_size = u32_at(data, at + 4).ok_or(t.clone())? as usize;
    let padded = u64_at(data, at + 8).ok_or(t.clone())?;
    let data_size = u32_at(data, at + 16).ok_or(t.clone())? as usize;
    let version_minor = u16_at(data, at + 24).ok_or(t.clone())?;
    let version_major = u16_at(data, at + 26).ok_or(t.clone())?;
    let arch = u32_at(data, at + 28).ok_or(t.clone())?;
    let flags = u64_at(data, at + 40).ok_or(t.clone())?;
    let uncompressed_size = u64_at(data, at + 56).ok_or(t.clone())?;
    // An arch no toolkit names (nvlink: "Unknown arch name"; high bits set),
    // or flags nvcc never sets (what nvlink makes of them is not measured).
    if header_size < MEMBER_HEADER_MIN || arch >= 1000 || flags & !KNOWN_FLAGS != 0 {
        return Err(FatbinError::Corrupt);
    }
    let payload_start = at.checked_add(header_size).ok_or(FatbinError::Corrupt)?;
    let next = usize::try_from(padded).ok().and_then(|p| payload_start.checked_add(p)).ok_or(FatbinError::Corrupt)?;
    if next > data.len() || data_size as u64 > padded {
        return Err(FatbinError::Truncated);
    }
    // Uncompressed members (`-Xfatbin -compress-mode=none`) leave the size
    // field zero: the payload is the whole padded extent.
    let data_size = if flags & FLAG_COMPRESSED == 0 && data_size == 0 { next - payload_start } else { data_size };
    let payload = &data[payload_start..payload_start + data_size];
    // Extended header: the source file's name (with `-lineinfo` or `-G`,
    // located by (offset, size) at +32, the name itself from +64), then the
    // options string located by (offset, size) relative to the member, which
    // follows the name (8-aligned) or is at +64 without one.
    let (name_off, name_len) =
        (u32_at(data, at + 32).unwrap_or(0) as usize, u32_at(data, at + 36).unwrap_or(0) as usize);
    let pair = match name_off {
        0 => MEMBER_HEADER_MIN,
        _ if name_off < MEMBER_HEADER_MIN || name_off.saturating_add(name_len) > header_size => {
            return Err(FatbinError::Corrupt)
        }
        _ => (name_off + name_len).div_ceil(8) * 8,
    };
    let mut options = "";
    if header_size >= pair + 8 {
        let off = u32_at(data, at + pair).unwrap_or(0) as usize;
        let len = u32_at(data, at + pair + 4).unwrap_or(0) as usize;
        if off >= pair + 8 && off.saturating_add(len) <= header_size {
            let raw = &data[at + off..at + off + len];
            let raw = raw.split(|&b| b == 0).next().unwrap_or(&[]);
            options = std::str::from_utf8(raw).map_err(|_| FatbinError::Corrupt)?;
        }
    }
    Ok((
        Member {
            kind: MemberKind::from_raw(kind),
            arch,
            version_major,
            version_minor,
            flags,
            options,
            payload,
            uncompressed_size: if flags & FLAG_COMPRESSED != 0 { uncompressed_size } else { data_size as u64 },
        },
        next,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn container(members: &[(u16, u32, &[u8])]) -> Vec<u8> {
        let mut body = Vec::new();
        for (kind, arch, payload) in members {
            let padded = payload.len().div_ceil(8) * 8;
            let mut h = vec![0u8; 64];
            h[0..2].copy_from_slice(&kind.to_le_bytes());
            h[2..4].copy_from_slice(&0x0101u16.to_le_bytes());
            h[4..8].copy_from_slice(&64u32.to_le_bytes());
            h[8..16].copy_from_slice(&(padded as u64).to_le_bytes());
            h[16..20].copy_from_slice(&(payload.len() as u32).to_le_bytes());
            h[28..32].copy_from_slice(&arch.to_le_bytes());
            h[40..48].copy_from_slice(&0x11u64.to_le_bytes());
            body.extend_from_slice(&h);
            body.extend_from_slice(payload);
            body.resize(body.len() + padded - payload.len(), 0);
        }
        let mut out = Vec::new();
        out.extend_from_slice(&FATBIN_MAGIC.to_le_bytes());
        out.extend_from_slice(&1u16.to_le_bytes());
        out.extend_from_slice(&16u16.to_le_bytes());
        out.extend_from_slice(&(body.len() as u64).to_le_bytes());
        out.extend_from_slice(&body);
        out
    }

    #[test]
    fn a_member_declaring_more_than_the_bound_is_not_decompressed() {
        let zeros = zstd::encode_all(&vec![0u8; 1 << 20][..], 19).unwrap();
        let member = |size: u64| Member::compressed_for_test(&zeros, size);
        assert_eq!(member(1 << 20).contents().map(|c| c.len()), Ok(1 << 20));
        assert_eq!(member(MAX_MEMBER_SIZE + 1).contents().err(), Some(FatbinError::Corrupt), "past the bound");
    }

    #[test]
    fn parses_uncompressed_members() {
        let c = container(&[(2, 90, b"\x7fELFxyz"), (1, 90, b".version 9.5")]);
        let m = parse(&c).unwrap();
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].kind, MemberKind::Cubin);
        assert_eq!(m[0].arch, 90);
        assert_eq!(&*m[1].contents().unwrap(), b".version 9.5");
    }

    #[test]
    fn every_truncation_is_an_error_not_a_panic() {
        let c = container(&[(2, 90, b"\x7fELFxyz"), (1, 90, b".version 9.5")]);
        for len in 0..c.len() {
            assert!(parse(&c[..len]).is_err() || len == 0);
        }
        let mut bad = c.clone();
        bad[16 + 8] = 0xff; // absurd padded size
        assert!(parse(&bad).is_err());
    }

    #[test]
    fn corrupted_compressed_payload_is_detected() {
        let mut c = container(&[(2, 90, &[0x28, 0xb5, 0x2f, 0xfd, 1, 2, 3, 4])]);
        // mark compressed, claim 100 bytes uncompressed
        c[16 + 40..16 + 48].copy_from_slice(&0x8011u64.to_le_bytes());
        c[16 + 56..16 + 64].copy_from_slice(&100u64.to_le_bytes());
        let m = parse(&c).unwrap();
        // Not zstd data that decodes: nvlink's "Uncompress failed".
        assert_eq!(m[0].contents().unwrap_err(), FatbinError::Uncompress);
        // Zstd data, but not of the declared size: corrupt otherwise.
        let frame = zstd::bulk::compress(b"device code", 3).unwrap();
        let mut c = container(&[(2, 90, &frame)]);
        c[16 + 40..16 + 48].copy_from_slice(&0x8011u64.to_le_bytes());
        c[16 + 56..16 + 64].copy_from_slice(&100u64.to_le_bytes());
        let m = parse(&c).unwrap();
        assert_eq!(m[0].contents().unwrap_err(), FatbinError::Corrupt);
    }
}
