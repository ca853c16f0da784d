//! The `.note.nv.tkinfo` note: which tools produced a cubin, and how.
//!
//! The section is a sequence of ELF notes, owner `NVIDIA Corp`, type 2000. Each
//! descriptor is `u32 version (2)` and five `u32` offsets into a string area that
//! follows (object name, tool name, release string, build string, options),
//! padded to 4 bytes. nvlink writes its own entry first and then copies the
//! entries of the cubins it linked; nvJitLink does the same with an entry of its
//! own ("nvJIT API"), and entries for the PTX it compiled itself carry a
//! placeholder build string. The finalizer parses the note, swaps those entries
//! for the ones nvlink writes, and serializes it again.

const OWNER: &[u8] = b"NVIDIA Corp\0";
pub const NOTE_TYPE: u32 = 2000;
const DESC_VERSION: u32 = 2;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum NoteError {
    #[error("malformed tkinfo note")]
    Malformed,
}

/// One tool entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub object: String,
    pub tool: String,
    pub release: String,
    pub build: String,
    pub options: String,
}

fn u32_at(d: &[u8], o: usize) -> Result<u32, NoteError> {
    d.get(o..o + 4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])).ok_or(NoteError::Malformed)
}

fn str_at(area: &[u8], off: u32) -> Result<String, NoteError> {
    crate::elf::c_str_at(area, off as usize).map(str::to_owned).ok_or(NoteError::Malformed)
}

/// Parse a whole `.note.nv.tkinfo` section.
pub fn parse(section: &[u8]) -> Result<Vec<Entry>, NoteError> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < section.len() {
        let namesz = u32_at(section, pos)? as usize;
        let descsz = u32_at(section, pos + 4)? as usize;
        let ntype = u32_at(section, pos + 8)?;
        let name_start = pos + 12;
        let desc_start = name_start.checked_add(namesz.div_ceil(4) * 4).ok_or(NoteError::Malformed)?;
        let desc_end = desc_start.checked_add(descsz).ok_or(NoteError::Malformed)?;
        let desc = section.get(desc_start..desc_end).ok_or(NoteError::Malformed)?;
        if ntype != NOTE_TYPE || section.get(name_start..name_start + namesz) != Some(OWNER) || desc.len() < 24 {
            return Err(NoteError::Malformed);
        }
        let area = &desc[24..];
        let off = |i: usize| u32_at(desc, 4 + 4 * i);
        out.push(Entry {
            object: str_at(area, off(0)?)?,
            tool: str_at(area, off(1)?)?,
            release: str_at(area, off(2)?)?,
            build: str_at(area, off(3)?)?,
            options: str_at(area, off(4)?)?,
        });
        pos = desc_start + descsz.div_ceil(4) * 4;
    }
    Ok(out)
}

/// Serialize entries as nvlink lays them out. The object name of an entry is
/// stored first; an empty name is the string area's leading NUL, shared.
pub fn serialize(entries: &[Entry]) -> Vec<u8> {
    let mut out = Vec::new();
    for e in entries {
        let mut area = Vec::new();
        let mut put = |s: &str| {
            let off = area.len() as u32;
            area.extend_from_slice(s.as_bytes());
            area.push(0);
            off
        };
        let object = put(&e.object);
        let tool = put(&e.tool);
        let release = put(&e.release);
        let build = put(&e.build);
        let options = put(&e.options);
        let mut desc = Vec::with_capacity(24 + area.len() + 3);
        for v in [DESC_VERSION, object, tool, release, build, options] {
            desc.extend_from_slice(&v.to_le_bytes());
        }
        desc.extend_from_slice(&area);
        // The descriptor size nvlink records includes the padding.
        desc.resize(desc.len().div_ceil(4) * 4, 0);
        out.extend_from_slice(&(OWNER.len() as u32).to_le_bytes());
        out.extend_from_slice(&(desc.len() as u32).to_le_bytes());
        out.extend_from_slice(&NOTE_TYPE.to_le_bytes());
        out.extend_from_slice(OWNER);
        out.extend_from_slice(&desc);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip() {
        let e = vec![
            Entry {
                object: String::new(),
                tool: "nvlink".into(),
                release: "Cuda compilation tools, release 13.5, V13.5.37".into(),
                build: "Build cuda_13.5.r13.5/compiler.39125733_0".into(),
                options: "-arch sm_90 -m 64 ".into(),
            },
            Entry {
                object: String::new(),
                tool: "ptxas".into(),
                release: "r".into(),
                build: "b".into(),
                options: "".into(),
            },
        ];
        let bytes = serialize(&e);
        assert_eq!(bytes.len() % 4, 0);
        assert_eq!(parse(&bytes).unwrap(), e);
        for len in 0..bytes.len() {
            let _ = parse(&bytes[..len]);
        }
    }
}
