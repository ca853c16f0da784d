//! `ar` archives, regular and thin.
//!
//! A regular archive carries its members; a thin archive only names them, by
//! paths relative to the archive's directory, and the files are read
//! separately.

use object::read::archive::ArchiveFile;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ArchiveError {
    #[error("malformed archive")]
    Malformed,
}

/// One member: its name, and its bytes (None for thin members).
#[derive(Clone, Debug)]
pub struct Member<'a> {
    pub name: String,
    pub data: Option<&'a [u8]>,
}

/// The members of an archive, in order, skipping the symbol and name tables.
pub(crate) fn members(data: &[u8]) -> Result<(bool, Vec<Member<'_>>), ArchiveError> {
    let ar = ArchiveFile::parse(data).map_err(|_| ArchiveError::Malformed)?;
    let thin = ar.is_thin();
    if !thin {
        gnu_headers(data)?;
    }
    let mut out = Vec::new();
    for m in ar.members() {
        let m = m.map_err(|_| ArchiveError::Malformed)?;
        let name = String::from_utf8_lossy(m.name()).into_owned();
        let data = if m.is_thin() { None } else { Some(m.data(data).map_err(|_| ArchiveError::Malformed)?) };
        out.push(Member { name, data });
    }
    Ok((thin, out))
}

/// The headers of a regular archive as nvlink's reader wants them, which is
/// stricter than `object`'s: every member, the symbol table included, lies
/// within the file (nvlink: `archive member size exceeds library bounds`;
/// `object` skips a symbol table cut short), and every name is GNU-style
/// (`name/`, `/N` into the long-name table, `/`, `//`, `/SYM64/`; nvlink:
/// `unexpected archive format` for a BSD or llvm-ar name without the `/`).
/// What this refuses the in-process engine declines, so nvlink answers it.
/// Headers `object` itself reads wrongly (a bad `fmag`, a size that is not a
/// number, a partial header at the end) are left to it.
fn gnu_headers(data: &[u8]) -> Result<(), ArchiveError> {
    const HEADER: usize = 60;
    let mut at = 8;
    while data.len().saturating_sub(at) >= HEADER {
        let header = &data[at..at + HEADER];
        if &header[58..60] != b"`\n" {
            return Ok(());
        }
        let Some(size) = std::str::from_utf8(&header[48..58]).ok().and_then(|s| s.trim_end().parse::<usize>().ok())
        else {
            return Ok(());
        };
        if !gnu_name(&header[..16]) {
            return Err(ArchiveError::Malformed);
        }
        let end = (at + HEADER).checked_add(size).ok_or(ArchiveError::Malformed)?;
        if end > data.len() {
            return Err(ArchiveError::Malformed);
        }
        at = end + (end & 1);
    }
    Ok(())
}

/// A GNU `ar` name field: `name/` (padded with spaces), `/N`, `/`, `//` or
/// `/SYM64/`.
fn gnu_name(field: &[u8]) -> bool {
    let name = field.trim_ascii_end();
    match name {
        b"/" | b"//" | b"/SYM64/" => true,
        [b'/', digits @ ..] => !digits.is_empty() && digits.iter().all(u8::is_ascii_digit),
        [first, .., b'/'] => *first != b'/' && !name[..name.len() - 1].contains(&b'/'),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A GNU archive of two members with short names, built by hand.
    fn archive(names: [&[u8]; 2], symtab_size: Option<&str>) -> Vec<u8> {
        let mut a = b"!<arch>\n".to_vec();
        let header = |a: &mut Vec<u8>, name: &[u8], size: &str| {
            let mut h = format!("{:16}{:12}{:6}{:6}{:8}{:10}`\n", "", "0", "0", "0", "644", size).into_bytes();
            h[..name.len()].copy_from_slice(name);
            a.extend_from_slice(&h);
        };
        header(&mut a, b"/", symtab_size.unwrap_or("4"));
        a.extend_from_slice(&[0, 0, 0, 0]);
        for name in names {
            header(&mut a, name, "3");
            a.extend_from_slice(b"abc\n");
        }
        a
    }

    #[test]
    fn gnu_names_are_read() {
        let (thin, m) = members(&archive([b"a.o/", b"b.o/"], None)).map(|(t, m)| (t, m.len())).unwrap_or((true, 0));
        assert!(!thin);
        assert_eq!(m, 2);
    }

    #[test]
    fn a_name_without_the_gnu_slash_is_malformed() {
        for name in [&b"a.o"[..], b"a o/x", b"#1/20", b"-1", b"/x", b"//a.o/"] {
            assert_eq!(
                members(&archive([b"a.o/", name], None)).map(|_| ()),
                Err(ArchiveError::Malformed),
                "{}",
                String::from_utf8_lossy(name)
            );
        }
    }

    #[test]
    fn a_symbol_table_past_the_end_is_malformed() {
        let whole = archive([b"a.o/", b"b.o/"], None);
        assert_eq!(members(&archive([b"a.o/", b"b.o/"], Some("99999999"))).map(|_| ()), Err(ArchiveError::Malformed));
        for cut in 68..72 {
            assert_eq!(members(&whole[..cut]).map(|_| ()), Err(ArchiveError::Malformed), "cut at {cut}");
        }
    }
}
