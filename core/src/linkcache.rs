//! Whole-link caching: the key of a link, and the conversion between a link's
//! outcome and its stored entry.
//!
//! The content key covers the toolkit, the mode, the options in nvlink's own
//! canonical form (its tkinfo rendering: option order does not matter where
//! nvlink ignores it), the options nvlink does not render, which outputs are
//! asked for, the contents of the inputs in order and what each `-l` resolves
//! to. Paths are not part of it, so a renamed or touched input still hits. A
//! result that does mention names (messages, verbose tool notes, path-derived
//! module ids) is also keyed by the names: the arguments as given and the
//! working directory.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::cache::{Key, KeyBuilder, LinkEntry};
use crate::cli::options::Opt;
use crate::cli::render;
use crate::cli::spec::{Mode, Spec};
use crate::fs::{absolute, FileStat, HashMemo, InputFs};
use crate::input::libsearch;
use crate::request::{OutputFile, Request};

/// An `InputFs` that remembers what it read, so that computing the key and
/// then the link reads each file once.
pub struct MemoFs<'a> {
    inner: &'a dyn InputFs,
    reads: Mutex<HashMap<PathBuf, Arc<[u8]>>>,
}

impl<'a> MemoFs<'a> {
    pub fn new(inner: &'a dyn InputFs) -> Self {
        MemoFs { inner, reads: Mutex::new(HashMap::new()) }
    }
}

impl InputFs for MemoFs<'_> {
    fn read(&self, path: &Path) -> io::Result<Arc<[u8]>> {
        if let Some(d) = self.reads.lock().ok().and_then(|m| m.get(path).cloned()) {
            return Ok(d);
        }
        let d = self.inner.read(path)?;
        if let Ok(mut m) = self.reads.lock() {
            m.insert(path.to_owned(), d.clone());
        }
        Ok(d)
    }
    fn stat(&self, path: &Path) -> io::Result<FileStat> {
        self.inner.stat(path)
    }
    fn prefetch(&self, paths: &[PathBuf]) {
        self.inner.prefetch(paths)
    }
    fn identity(&self, path: &Path) -> Option<crate::fs::FileIdentity> {
        self.inner.identity(path)
    }
    fn declined(&self) -> Option<String> {
        self.inner.declined()
    }
}

/// The keys of a link: by content, and by content plus names.
pub struct LinkKeys {
    pub content: Key,
    pub named: Key,
}

/// Whether a link can be cached at all, and its keys. `None`: not cacheable
/// (an unreadable input, `-time` tables).
pub fn keys(
    identity: &[u8; 32],
    req: &Request,
    spec: &Spec,
    mode: Mode,
    fs: &dyn InputFs,
    hashes: &HashMemo,
) -> Option<LinkKeys> {
    if spec.time.is_some() {
        return None;
    }
    let mut k = KeyBuilder::new("link");
    k.bytes(identity).str(&format!("{mode:?}")).str(&render::options_string(&spec.parsed));
    // Options nvlink does not render (hidden ones), except output paths.
    for o in &spec.parsed.options {
        let rendered = crate::cli::options::def_of(o.id);
        if rendered.hidden {
            k.str(rendered.long).str(o.value.as_deref().unwrap_or(""));
        }
    }
    k.u64(u64::from(spec.output.is_some())).u64(u64::from(spec.register_link_binaries.is_some()));
    if spec.lto {
        // Under -dlto nvlink leaves an existing registration file alone.
        let exists = spec.register_link_binaries.as_deref().map(|r| fs.stat(&absolute(&req.cwd, r)).is_ok());
        k.u64(u64::from(exists == Some(true)));
    }
    fs.prefetch(&spec.inputs.iter().map(|i| absolute(&req.cwd, i)).collect::<Vec<_>>());
    for input in &spec.inputs {
        k.bytes(&hashes.hash(fs, &absolute(&req.cwd, input)).ok()?);
    }
    let dirs = libsearch::search_dirs(&spec.library_paths, req.env.get("LIBRARY_PATH").map(String::as_str));
    for name in &spec.libraries {
        k.str(name);
        for dir in &dirs {
            let candidate = libsearch::candidate(dir, name);
            let path = absolute(&req.cwd, &candidate);
            let Ok(st) = fs.stat(&path) else { continue };
            k.str(&candidate);
            if st.is_dir || st.size <= 8 {
                k.u64(st.size).u64(u64::from(st.is_dir));
                if st.is_dir {
                    break;
                }
                continue;
            }
            k.bytes(&hashes.hash(fs, &path).ok()?);
            break;
        }
    }
    let content = k.finish();
    let mut named = KeyBuilder::new("link-named");
    named.key(&content).bytes(req.cwd.as_os_str().as_encoded_bytes());
    for a in &req.args {
        named.str(a);
    }
    Some(LinkKeys { content, named: named.finish() })
}

/// The outputs of an outcome, by role.
pub fn entry_files(outputs: &[OutputFile], req: &Request, spec: &Spec) -> Option<Vec<(String, Vec<u8>)>> {
    let out = spec.output.as_deref().map(|o| absolute(&req.cwd, o));
    let reg = spec.register_link_binaries.as_deref().map(|r| absolute(&req.cwd, r));
    outputs
        .iter()
        .map(|f| {
            if f.append {
                None
            } else if Some(&f.path) == out.as_ref() {
                Some(("output".to_owned(), f.data.clone()))
            } else if Some(&f.path) == reg.as_ref() {
                Some(("register".to_owned(), f.data.clone()))
            } else {
                None
            }
        })
        .collect()
}

/// The outputs of a stored entry, for this request's paths.
pub fn outputs_of(entry: &LinkEntry, req: &Request, spec: &Spec) -> Option<Vec<OutputFile>> {
    entry
        .files
        .iter()
        .map(|(role, data)| {
            let path = match role.as_str() {
                "output" => spec.output.as_deref(),
                "register" => spec.register_link_binaries.as_deref(),
                _ => None,
            }?;
            Some(OutputFile { path: absolute(&req.cwd, path), data: data.clone(), append: false })
        })
        .collect()
}

/// Whether a result names inputs or outputs (so that it only fits the same names).
pub fn name_sensitive(spec: &Spec, stdout: &[u8], stderr: &[u8], device_only_registered: bool) -> bool {
    !stdout.is_empty()
        || !stderr.is_empty()
        || render::verbose_mode(&spec.parsed)
        || device_only_registered
        || spec.parsed.options.iter().any(|o| o.id == Opt::OptionsFile && o.value.is_some())
}
