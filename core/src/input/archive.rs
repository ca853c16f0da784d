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
    let mut out = Vec::new();
    for m in ar.members() {
        let m = m.map_err(|_| ArchiveError::Malformed)?;
        let name = String::from_utf8_lossy(m.name()).into_owned();
        let data = if m.is_thin() { None } else { Some(m.data(data).map_err(|_| ArchiveError::Malformed)?) };
        out.push(Member { name, data });
    }
    Ok((thin, out))
}
