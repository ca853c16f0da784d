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
        // The code that computes answers (core/build.rs): a build with other
        // code reads no entry of this one, so a fix never meets the wrong
        // answers cached before it (in a cache directory kept across an
        // upgrade, or in the fleet's shared tier).
        h.update(b"nvlinkd-cache\0");
        h.update(env!("NVLINKD_ENGINE_DIGEST").as_bytes());
        h.update(b"\0");
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
    /// Output files by role (`output`, `register`), contents only: shared
    /// with the outcome that made the entry, or slices of the stored entry
    /// it was read from (never copied to answer a hit).
    pub files: Vec<(String, bytes::Bytes)>,
    /// Whether the result mentions input or output names (messages, verbose
    /// tool notes, path-derived module ids): then a hit also needs the same
    /// names and working directory.
    pub name_sensitive: bool,
}

const ENTRY_VERSION: u32 = 1;

fn take<'a>(data: &mut &'a [u8]) -> Option<&'a [u8]> {
    let len = u64::from_le_bytes(data.get(..8)?.try_into().ok()?) as usize;
    let b = data.get(8..8usize.checked_add(len)?)?;
    *data = &data[8 + len..];
    Some(b)
}

/// `pieces` concatenated into one shared buffer, written once: the stored
/// form of a link's result is its output file plus a few bytes, and building
/// it in a `Vec` first would copy the output twice (a `Vec` cannot become an
/// `Arc<[u8]>` in place).
fn concat(pieces: &[&[u8]]) -> std::sync::Arc<[u8]> {
    let len = pieces.iter().map(|p| p.len()).sum();
    let mut buf = std::sync::Arc::<[u8]>::new_uninit_slice(len);
    let dst = std::sync::Arc::get_mut(&mut buf).expect("a new Arc is unique");
    let mut at = 0;
    for p in pieces {
        let to = &mut dst[at..at + p.len()];
        // SAFETY: `to` is exactly `p.len()` elements of a buffer no one else
        // sees yet, and `MaybeUninit<u8>` has the layout of `u8`.
        unsafe { std::ptr::copy_nonoverlapping(p.as_ptr(), to.as_mut_ptr().cast::<u8>(), p.len()) };
        at += p.len();
    }
    // SAFETY: the pieces' lengths sum to `len`, so every element was written above.
    unsafe { buf.assume_init() }
}

impl LinkEntry {
    /// The stored form: `u32 version, i32 exit code, u8 name-sensitive`, stdout
    /// and stderr, `u32` file count, then role and contents of each file;
    /// every variable field is a `u64` length and its bytes.
    pub(crate) fn encode(&self) -> std::sync::Arc<[u8]> {
        let mut head = Vec::with_capacity(13);
        head.extend_from_slice(&ENTRY_VERSION.to_le_bytes());
        head.extend_from_slice(&self.exit_code.to_le_bytes());
        head.push(u8::from(self.name_sensitive));
        let count = (self.files.len() as u32).to_le_bytes();
        let len = |b: &[u8]| (b.len() as u64).to_le_bytes();
        let (out_len, err_len) = (len(&self.stdout), len(&self.stderr));
        let file_lens: Vec<[[u8; 8]; 2]> =
            self.files.iter().map(|(role, data)| [len(role.as_bytes()), len(data)]).collect();
        let mut pieces: Vec<&[u8]> = vec![&head, &out_len, &self.stdout, &err_len, &self.stderr, &count];
        for ((role, data), [role_len, data_len]) in self.files.iter().zip(&file_lens) {
            pieces.extend([&role_len[..], role.as_bytes(), &data_len[..], data]);
        }
        concat(&pieces)
    }

    /// The entry stored as `stored`; its files are slices of it.
    pub(crate) fn decode(stored: &std::sync::Arc<[u8]>) -> Option<LinkEntry> {
        let shared = bytes::Bytes::from_owner(stored.clone());
        let mut data: &[u8] = stored;
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
            files.push((role, shared.slice_ref(take(&mut data)?)));
        }
        data.is_empty().then_some(LinkEntry { exit_code, stdout, stderr, files, name_sensitive })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_belong_to_the_code_that_computes_answers() {
        let digest = env!("NVLINKD_ENGINE_DIGEST");
        assert!(digest.len() == 64 && digest.bytes().all(|b| b.is_ascii_hexdigit()), "{digest}");
        // The same fields under another build's code digest give another key.
        let mut other = blake3::Hasher::new();
        other.update(b"nvlinkd-cache\0").update(&[b'0'; 64]).update(b"\0").update(b"link\0");
        assert_ne!(KeyBuilder::new("link").finish(), *other.finalize().as_bytes());
        let mut same = blake3::Hasher::new();
        same.update(b"nvlinkd-cache\0").update(digest.as_bytes()).update(b"\0").update(b"link\0");
        assert_eq!(KeyBuilder::new("link").finish(), *same.finalize().as_bytes());
    }

    #[test]
    fn entry_roundtrip_and_garbage() {
        let e = LinkEntry {
            exit_code: 255,
            stdout: b"out".to_vec(),
            stderr: b"nvlink error   : x\n".to_vec(),
            files: vec![("output".into(), vec![1, 2, 3].into()), ("register".into(), b"#define".to_vec().into())],
            name_sensitive: true,
        };
        let b = e.encode();
        // The stored format, field by field (entries on disk and in the shared tier).
        let field = |f: &[u8]| [&(f.len() as u64).to_le_bytes()[..], f].concat();
        let want = [
            &1u32.to_le_bytes()[..],
            &255i32.to_le_bytes(),
            &[1],
            &field(b"out"),
            &field(b"nvlink error   : x\n"),
            &2u32.to_le_bytes(),
            &field(b"output"),
            &field(&[1, 2, 3]),
            &field(b"register"),
            &field(b"#define"),
        ]
        .concat();
        assert_eq!(&b[..], &want[..]);
        assert_eq!(LinkEntry::decode(&b), Some(e.clone()));
        for len in 0..b.len() {
            assert!(LinkEntry::decode(&b[..len].into()).is_none());
        }
        // No files: the count still follows stderr.
        let none = LinkEntry { files: Vec::new(), ..e };
        assert_eq!(LinkEntry::decode(&none.encode()), Some(none));
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
