//! The content-addressed cache.
//!
//! Keys are BLAKE3 hashes of everything a result depends on — the toolkit's
//! identity, the options that shape the output, the contents of the inputs —
//! never of paths or times, so renaming or touching an input is still a hit.
//! [`store`] holds the bytes (memory over disk, both bounded, verified);
//! [`flight`] makes concurrent identical work run once; [`LinkEntry`] is the
//! stored form of a whole link's result; [`remote`] is the trait of a shared
//! tier behind memory and disk (the daemon's REAPI cache).

pub mod flight;
pub mod remote;
pub mod store;

pub use remote::{Kind, RemoteTier};
pub use store::{Key, Store};

/// Builds a key from typed, length-prefixed fields under a domain name, so
/// that different kinds of entries can never collide.
pub struct KeyBuilder(blake3::Hasher);

impl KeyBuilder {
    pub fn new(domain: &str) -> Self {
        let mut h = blake3::Hasher::new();
        h.update(b"nvlinkd-cache-v1\0");
        h.update(domain.as_bytes());
        h.update(b"\0");
        KeyBuilder(h)
    }
    pub fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.0.update(&(b.len() as u64).to_le_bytes());
        self.0.update(b);
        self
    }
    pub fn str(&mut self, s: &str) -> &mut Self {
        self.bytes(s.as_bytes())
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.0.update(&v.to_le_bytes());
        self
    }
    pub fn key(&mut self, k: &Key) -> &mut Self {
        self.0.update(k);
        self
    }
    pub fn finish(&self) -> Key {
        *self.0.finalize().as_bytes()
    }
}

/// A whole link's result, as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinkEntry {
    pub exit_code: i32,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// Output files by role (`output`, `register`), contents only.
    pub files: Vec<(String, Vec<u8>)>,
    /// Whether the result mentions input or output names (messages, verbose
    /// tool notes, path-derived module ids): then a hit also needs the same
    /// names and working directory.
    pub name_sensitive: bool,
}

const ENTRY_VERSION: u32 = 1;

fn put(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u64).to_le_bytes());
    out.extend_from_slice(b);
}

fn take<'a>(data: &mut &'a [u8]) -> Option<&'a [u8]> {
    let len = u64::from_le_bytes(data.get(..8)?.try_into().ok()?) as usize;
    let b = data.get(8..8usize.checked_add(len)?)?;
    *data = &data[8 + len..];
    Some(b)
}

impl LinkEntry {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&ENTRY_VERSION.to_le_bytes());
        out.extend_from_slice(&self.exit_code.to_le_bytes());
        out.push(u8::from(self.name_sensitive));
        put(&mut out, &self.stdout);
        put(&mut out, &self.stderr);
        out.extend_from_slice(&(self.files.len() as u32).to_le_bytes());
        for (role, data) in &self.files {
            put(&mut out, role.as_bytes());
            put(&mut out, data);
        }
        out
    }

    pub(crate) fn decode(mut data: &[u8]) -> Option<LinkEntry> {
        if u32::from_le_bytes(data.get(..4)?.try_into().ok()?) != ENTRY_VERSION {
            return None;
        }
        let exit_code = i32::from_le_bytes(data.get(4..8)?.try_into().ok()?);
        let name_sensitive = *data.get(8)? != 0;
        data = &data[9..];
        let stdout = take(&mut data)?.to_vec();
        let stderr = take(&mut data)?.to_vec();
        let n = u32::from_le_bytes(data.get(..4)?.try_into().ok()?) as usize;
        data = &data[4..];
        let mut files = Vec::with_capacity(n.min(16));
        for _ in 0..n {
            let role = String::from_utf8(take(&mut data)?.to_vec()).ok()?;
            files.push((role, take(&mut data)?.to_vec()));
        }
        data.is_empty().then_some(LinkEntry { exit_code, stdout, stderr, files, name_sensitive })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_roundtrip_and_garbage() {
        let e = LinkEntry {
            exit_code: 255,
            stdout: b"out".to_vec(),
            stderr: b"nvlink error   : x\n".to_vec(),
            files: vec![("output".into(), vec![1, 2, 3]), ("register".into(), b"#define".to_vec())],
            name_sensitive: true,
        };
        let b = e.encode();
        assert_eq!(LinkEntry::decode(&b), Some(e));
        for len in 0..b.len() {
            assert!(LinkEntry::decode(&b[..len]).is_none());
        }
    }

    #[test]
    fn keys_separate_domains_and_fields() {
        let a = KeyBuilder::new("link").str("ab").str("c").finish();
        let b = KeyBuilder::new("link").str("a").str("bc").finish();
        let c = KeyBuilder::new("jit").str("ab").str("c").finish();
        assert_ne!(a, b);
        assert_ne!(a, c);
    }
}
