//! Whole-link caching: the key of a link, and the conversion between a link's
//! outcome and its stored entry.
//!
//! The content key covers the toolkit, the mode, the options in nvlink's own
//! canonical form (its tkinfo rendering: option order does not matter where
//! nvlink ignores it), the options nvlink does not render, which outputs are
//! asked for, the contents of the inputs in order and what each `-l` resolves
//! to — contents as nvlink reads them: the name of nvcc's temporary file in a
//! host object or an archive member is left out (see
//! `input::host::key_digest`). Paths are not part of it, so a renamed or
//! touched input still hits. A result that does mention names (messages, verbose tool notes, path-derived
//! module ids) is also keyed by the names: the arguments as given and the
//! working directory.

use std::collections::HashMap;
use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use rayon::prelude::*;

use crate::cache::{Key, KeyBuilder, LinkEntry};
use crate::cli::options::Opt;
use crate::cli::render;
use crate::cli::spec::{Mode, Spec};
use crate::fs::{FileIdentity, FileStat, HashMemo, InputFs};
use crate::request::{OutputFile, Request};

/// One view of the files per link: an `InputFs` that remembers every read,
/// every stat and every identity it answered (errors included), so that the
/// key of a link and the link itself see exactly the same files — the key is
/// computed from the reads and stats the link then uses, and each file is read
/// once.
///
/// Where the key did not read a file (its hash was remembered by identity,
/// see [`HashMemo`]), the link's read is checked against the identity the key
/// saw: a file rewritten in between makes the view inconsistent, and a link
/// with an inconsistent view is never cached (its result is still the answer:
/// nvlink run at that moment could have read either version). The real nvlink
/// engine reads the files itself, from disk: [`MemoFs::unchanged_on_disk`]
/// checks afterwards that every file of the view still has the identity the
/// key saw.
pub struct MemoFs<'a> {
    inner: &'a dyn InputFs,
    // Keyed by the name's bytes, not by `PathBuf`, whose equality drops a
    // trailing `/` and `.` components: `libbc.a/` fails where `libbc.a` reads.
    reads: Mutex<HashMap<OsString, Memo<Arc<[u8]>>>>,
    stats: Mutex<HashMap<OsString, Memo<FileStat>>>,
    identities: Mutex<HashMap<OsString, Option<FileIdentity>>>,
    consistent: AtomicBool,
    /// When the view was opened (identities newer than this are not trusted
    /// to tell versions apart: timestamps have a coarse tick).
    opened: std::time::SystemTime,
}

/// A remembered answer: the value, or the error's kind and message.
type Memo<T> = Result<T, (io::ErrorKind, String)>;

fn memo_err(e: &io::Error) -> (io::ErrorKind, String) {
    (e.kind(), e.to_string())
}

fn replay<T: Clone>(r: &Memo<T>) -> io::Result<T> {
    r.clone().map_err(|(k, m)| io::Error::new(k, m))
}

/// How recent a change may be for an identity to still be ambiguous: a write
/// within the same timestamp tick as the stat that saw the file could leave
/// size and times as they were.
pub const TICK: std::time::Duration = std::time::Duration::from_millis(50);

impl<'a> MemoFs<'a> {
    pub fn new(inner: &'a dyn InputFs) -> Self {
        MemoFs {
            inner,
            reads: Mutex::new(HashMap::new()),
            stats: Mutex::new(HashMap::new()),
            identities: Mutex::new(HashMap::new()),
            consistent: AtomicBool::new(true),
            opened: std::time::SystemTime::now(),
        }
    }

    /// Whether every file was seen as one version throughout the link (so far).
    pub(crate) fn consistent(&self) -> bool {
        self.consistent.load(Ordering::SeqCst)
    }

    fn taint(&self, path: &Path, why: &str) {
        tracing::debug!(path = %path.display(), why, "input changed during the link: result not cached");
        self.consistent.store(false, Ordering::SeqCst);
        // The identity no longer names what was read: nothing may be
        // remembered under it.
        if let Ok(mut m) = self.identities.lock() {
            m.insert(path.as_os_str().to_owned(), None);
        }
    }

    /// For the real nvlink engine, which reads the caller's files itself: every
    /// file this view read, stat'ed or identified is still as the key saw it
    /// (same identity, or still absent), and no identity was too fresh to tell
    /// versions apart. Any doubt is `false`.
    pub(crate) fn unchanged_on_disk(&self) -> bool {
        if !self.consistent() {
            return false;
        }
        let (Ok(reads), Ok(stats), Ok(ids)) = (self.reads.lock(), self.stats.lock(), self.identities.lock()) else {
            return false;
        };
        let doubt = |path: &Path, why: &str| {
            tracing::debug!(path = %path.display(), why, "the real nvlink's view is in doubt: result not cached");
            false
        };
        let fresh = |id: &FileIdentity| {
            let t = std::time::UNIX_EPOCH + std::time::Duration::from_nanos(id.ctime_ns().max(0) as u64);
            self.opened.duration_since(t).map(|age| age < TICK).unwrap_or(true)
        };
        for (name, read) in reads.iter() {
            let path = Path::new(name);
            match (read, ids.get(name).copied().flatten()) {
                (Ok(_), Some(id)) => {
                    if fresh(&id) {
                        return doubt(path, "changed too recently to tell versions apart");
                    }
                    if crate::fs::LocalFs.identity(path) != Some(id) {
                        return doubt(path, "changed since it was read");
                    }
                }
                // Read without an identity: cannot tell.
                (Ok(_), None) => return doubt(path, "read without an identity"),
                (Err(_), _) => {
                    if std::fs::metadata(path).is_ok() {
                        return doubt(path, "appeared since it failed to read");
                    }
                }
            }
        }
        for (name, st) in stats.iter() {
            let path = Path::new(name);
            let now = std::fs::metadata(path).map(|m| FileStat { is_dir: m.is_dir(), size: m.len() });
            match (st, now) {
                (Ok(a), Ok(b)) if *a == b => {}
                (Err(_), Err(_)) => {}
                _ => return doubt(path, "its stat changed"),
            }
            if let Some(Some(id)) = ids.get(name) {
                if fresh(id) {
                    return doubt(path, "changed too recently to tell versions apart");
                }
                if crate::fs::LocalFs.identity(path) != Some(*id) {
                    return doubt(path, "changed since it was stat'ed");
                }
            }
        }
        true
    }
}

impl InputFs for MemoFs<'_> {
    fn read(&self, path: &Path) -> io::Result<Arc<[u8]>> {
        if let Some(r) = self.reads.lock().ok().and_then(|m| m.get(path.as_os_str()).cloned()) {
            return replay(&r);
        }
        // The identity the rest of the link sees (the first one observed).
        let before = self.identity(path);
        let result = self.inner.read(path);
        if result.is_ok() && before.is_some() && self.inner.identity(path) != before {
            self.taint(path, "identity changed around the read");
        }
        let memo = result.as_ref().map(Arc::clone).map_err(memo_err);
        if let Ok(mut m) = self.reads.lock() {
            // Two threads reading the same path: the first answer stands.
            let r = m.entry(path.as_os_str().to_owned()).or_insert(memo).clone();
            return replay(&r);
        }
        result
    }
    fn stat(&self, path: &Path) -> io::Result<FileStat> {
        if let Some(r) = self.stats.lock().ok().and_then(|m| m.get(path.as_os_str()).cloned()) {
            return replay(&r);
        }
        let memo = self.inner.stat(path).map_err(|e| memo_err(&e));
        match self.stats.lock() {
            Ok(mut m) => replay(m.entry(path.as_os_str().to_owned()).or_insert(memo)),
            Err(_) => replay(&memo),
        }
    }
    fn prefetch(&self, paths: &[PathBuf]) {
        let Ok(reads) = self.reads.lock() else { return };
        let missing: Vec<PathBuf> = paths.iter().filter(|p| !reads.contains_key(p.as_os_str())).cloned().collect();
        drop(reads);
        if !missing.is_empty() {
            self.inner.prefetch(&missing)
        }
    }
    fn identity(&self, path: &Path) -> Option<FileIdentity> {
        if let Some(id) = self.identities.lock().ok().and_then(|m| m.get(path.as_os_str()).copied()) {
            return id;
        }
        let id = self.inner.identity(path);
        match self.identities.lock() {
            Ok(mut m) => *m.entry(path.as_os_str().to_owned()).or_insert(id),
            Err(_) => id,
        }
    }
    fn declined(&self) -> Option<String> {
        self.inner.declined()
    }
}

/// The keys of a link: by content, and by content plus names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinkKeys {
    pub content: Key,
    pub named: Key,
}

/// Whether a link can be cached at all, and its keys. `None`: not cacheable
/// (an unreadable input, `-time` tables, a `--uidx-file`: nvlink reads it
/// first, and its rendering of the options leaves it out).
pub fn keys(
    identity: &[u8; 32],
    req: &Request,
    spec: &Spec,
    mode: Mode,
    fs: &dyn InputFs,
    hashes: &HashMemo,
    own_nvvm: Option<&Path>,
) -> Option<LinkKeys> {
    if spec.time.is_some() || spec.uidx_file.is_some() {
        return None;
    }
    // ptxas reads an options file of its own (`-Xptxas --options-file=F`):
    // its contents are not in the key, so such a link is not cached.
    if spec.ptxas_reads_options_file() {
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
    // Every variable a link depends on (`request::LINK_ENV`, all the request holds).
    for (name, value) in &req.env {
        k.str(name).str(value);
    }
    if spec.lto {
        // Under -dlto nvlink leaves an existing registration file alone.
        let exists = spec.files.written.register.as_ref().map(|r| fs.stat(&r.path).is_ok());
        k.u64(u64::from(exists == Some(true)));
    }
    let files = &spec.files;
    fs.prefetch(&files.input_paths());
    // Digested in parallel (a cold link of large objects hashes megabytes),
    // keyed in order.
    let digests: Vec<Option<[u8; 32]>> = files
        .inputs
        .par_iter()
        .map(|input| hashes.digest(fs, &input.path, crate::input::host::key_digest).ok())
        .collect();
    for digest in digests {
        k.bytes(&digest?);
    }
    // What nvlink decides by name and by file rather than by contents: each
    // input's extension (`input/load.rs`: `.ptx`, `.fatbin`, `.cubin`, none,
    // `.so`... are read differently), and which inputs and existing `-l`
    // candidates are one file (nvlink takes an archive once, by identity).
    for input in &files.inputs {
        match crate::input::load::extension(&input.given) {
            Some(ext) => k.str("ext").str(ext),
            None => k.str("no ext"),
        };
    }
    let candidates = files.libraries.iter().flat_map(|l| &l.candidates);
    let identities: Vec<_> = files.inputs.iter().chain(candidates).map(|f| fs.identity(&f.path)).collect();
    for (i, id) in identities.iter().enumerate() {
        let first = id.and_then(|id| identities[..i].iter().position(|other| *other == Some(id)));
        // Equal contents known by digest only (a remote caller's files) are
        // not known to be one file: keyed apart from a local file named twice.
        match first {
            Some(j) if id.is_some_and(|id| id.is_contents()) => k.str("same contents as").u64(j as u64),
            Some(j) => k.str("same file as").u64(j as u64),
            None => k.str("a file of its own"),
        };
    }
    // Which written files are one (`-o F --register-link-binaries=F`: one
    // file, written twice), or an input.
    let written = [&files.written.output, &files.written.register];
    for (i, w) in written.iter().enumerate() {
        let Some(w) = w else { continue };
        let same_written = written[..i].iter().position(|o| o.as_ref().is_some_and(|o| o.path == w.path));
        let same_input = files.inputs.iter().position(|input| input.path == w.path);
        k.u64(same_written.map_or(u64::MAX, |j| j as u64)).u64(same_input.map_or(u64::MAX, |j| j as u64));
    }
    // Every candidate of a `-l` search that exists, up to a directory (where
    // the search stops): which one links is decided by reading them (a tiny
    // file or another machine's archive is skipped, `load.rs`), so a change
    // of any of them may change the answer.
    for search in &files.libraries {
        k.str(&search.name);
        for candidate in &search.candidates {
            let Ok(st) = fs.stat(&candidate.path) else { continue };
            k.str(&candidate.given);
            if st.is_dir || st.size <= 8 {
                k.u64(st.size).u64(u64::from(st.is_dir));
                if st.is_dir {
                    break;
                }
                continue;
            }
            k.bytes(&hashes.digest(fs, &candidate.path, crate::input::host::key_digest).ok()?);
        }
    }
    nvvm_key(&mut k, req, spec, mode, fs, hashes, own_nvvm)?;
    let content = k.finish();
    let mut named = KeyBuilder::new("link-named");
    named.key(&content).bytes(req.cwd.as_os_str().as_encoded_bytes());
    for a in &req.args {
        named.str(a);
    }
    Some(LinkKeys { content, named: named.finish() })
}

/// Under LTO nvlink loads the libNVVM under `-nvvmpath` (and its
/// libdevice): which one, or that there is none (`elfLink linker library
/// load error`), is the link's answer too. Where the daemon shares the
/// caller's files: the toolkit's own `nvvm` (the toolkit's identity is in the
/// key), else those files by content. For a remote caller: its answer to the
/// stat the routed link's sandbox mirrors (none, one, or not answered: an
/// older shim), asked here, before the link takes a plan permit, so a
/// caller's slow answer holds no permit (the link's view remembers it).
fn nvvm_key(
    k: &mut KeyBuilder,
    req: &Request,
    spec: &Spec,
    mode: Mode,
    fs: &dyn InputFs,
    hashes: &HashMemo,
    own_nvvm: Option<&Path>,
) -> Option<()> {
    let Some(given) = spec.nvvmpath.as_deref().filter(|_| mode.is_lto()) else { return Some(()) };
    let dir = crate::fs::absolute(&req.cwd, given);
    k.str("nvvmpath");
    if !req.shared_fs {
        k.u64(match (req.nvvm_stat, crate::fs::has_libnvvm(fs, &dir)) {
            (false, _) => 2,
            (true, true) => 1,
            (true, false) => 0,
        });
        return Some(());
    }
    let real = |p: &Path| std::fs::canonicalize(p).ok();
    if own_nvvm.and_then(real).is_some_and(|own| real(&dir) == Some(own)) {
        k.str("own");
        return Some(());
    }
    for lib in ["lib64/libnvvm.so", "lib/libnvvm.so", "libdevice/libdevice.10.bc"] {
        let path = dir.join(lib);
        k.str(lib);
        match fs.stat(&path) {
            Ok(st) if !st.is_dir => k.bytes(&hashes.digest(fs, &path, crate::input::host::key_digest).ok()?),
            _ => k.u64(0),
        };
    }
    Some(())
}

/// The keys the daemon's whole-link cache gives `req`, with the files read
/// from this machine and a fixed toolkit identity; `None` where the link is not
/// cached (front-end answers, parse errors, `-time`, unreadable inputs). For
/// tests that prove what the key covers: equal keys must mean nvlink's
/// outputs are equal.
pub fn keys_of(req: &Request) -> Option<LinkKeys> {
    let fs = MemoFs::new(&crate::fs::LocalFs);
    let library_path = req.env.get("LIBRARY_PATH").map(String::as_str);
    let spec =
        Spec::from_parsed(crate::cli::parse::parse(&req.args, &fs, &req.cwd).ok()?, &req.cwd, library_path).ok()?;
    let mode = spec.mode().ok()?;
    if matches!(mode, Mode::Help | Mode::Version | Mode::HostLinkerScript(_)) {
        return None;
    }
    keys(&[0; 32], req, &spec, mode, &fs, &HashMemo::default(), None)
}

/// The outputs of an outcome, by role.
pub(crate) fn entry_files(outputs: &[OutputFile], spec: &Spec) -> Option<Vec<(String, bytes::Bytes)>> {
    let out = spec.files.written.output.as_ref().map(|o| &o.path);
    let reg = spec.files.written.register.as_ref().map(|r| &r.path);
    outputs
        .iter()
        .map(|f| {
            if f.append {
                None
            } else if Some(&f.path) == out {
                Some(("output".to_owned(), f.data.clone()))
            } else if Some(&f.path) == reg {
                Some(("register".to_owned(), f.data.clone()))
            } else {
                None
            }
        })
        .collect()
}

/// The outputs of a stored entry, for this request's paths.
pub(crate) fn outputs_of(entry: &LinkEntry, spec: &Spec) -> Option<Vec<OutputFile>> {
    let written = &spec.files.written;
    entry
        .files
        .iter()
        .map(|(role, data)| {
            let named = match role.as_str() {
                "output" => written.output.as_ref(),
                "register" => written.register.as_ref(),
                _ => None,
            }?;
            Some(OutputFile { path: named.path.clone(), data: data.clone(), append: false })
        })
        .collect()
}

/// Whether a result names inputs or outputs (so that it only fits the same names).
pub(crate) fn name_sensitive(spec: &Spec, stdout: &[u8], stderr: &[u8], device_only_registered: bool) -> bool {
    !stdout.is_empty()
        || !stderr.is_empty()
        || render::verbose_mode(&spec.parsed)
        || device_only_registered
        || spec.parsed.options.iter().any(|o| o.id == Opt::OptionsFile && o.value.is_some())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::LocalFs;

    fn temp(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("nvlinkd-memofs-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// The keys of `args` run in `cwd` (a fresh view and hash memo each time).
    fn keys_of(cwd: &Path, args: &str) -> Option<LinkKeys> {
        let args: Vec<String> = args.split_whitespace().map(str::to_owned).collect();
        let req = Request { args, cwd: cwd.to_owned(), ..Default::default() };
        let spec = Spec::from_parsed(crate::cli::parse::parse(&req.args, &LocalFs, cwd).unwrap(), cwd, None).unwrap();
        let mode = spec.mode().unwrap();
        keys(&[7; 32], &req, &spec, mode, &MemoFs::new(&LocalFs), &HashMemo::default(), None)
    }

    /// A name with a trailing `/` or `/.` is its own name: the kernel fails it
    /// for a file (ENOTDIR, as nvlink reports), even after the plain name read.
    #[test]
    fn a_file_named_with_a_trailing_slash_fails_after_its_plain_name_read() {
        let d = temp("slash");
        std::fs::write(d.join("libbc.a"), b"!<arch>\n").unwrap();
        let memo = MemoFs::new(&LocalFs);
        assert!(memo.read(&d.join("libbc.a")).is_ok());
        assert!(memo.stat(&d.join("libbc.a")).is_ok());
        for name in ["libbc.a/", "libbc.a/."] {
            let p = PathBuf::from(format!("{}/{name}", d.display()));
            assert!(memo.read(&p).is_err(), "{name} read");
            assert!(memo.stat(&p).is_err(), "{name} stat");
            assert_eq!(memo.identity(&p), None, "{name} identity");
        }
    }

    /// What the whole-link key covers, one rule per row: the content key
    /// ignores names and spellings, the named key does not.
    #[test]
    fn link_key_rules() {
        let d = temp("keys");
        std::fs::write(d.join("a.o"), b"device code A").unwrap();
        std::fs::write(d.join("copy.o"), b"device code A").unwrap();
        std::fs::write(d.join("b.o"), b"device code B").unwrap();
        let base = "-arch=sm_90 -o out.cubin a.o";
        // (other command line, same content key, same named key)
        let rows: &[(&str, bool, bool)] = &[
            ("-arch=sm_90 -o out.cubin a.o", true, true),
            ("-arch sm_90 -o out.cubin a.o", true, false),
            ("-o out.cubin -arch=sm_90 a.o", true, false),
            ("-arch=sm_90 -o other.cubin a.o", true, false),
            ("-arch=sm_90 -o out.cubin copy.o", true, false),
            ("-arch=sm_90 -o out.cubin b.o", false, false),
            ("-arch=sm_80 -o out.cubin a.o", false, false),
            ("-arch=sm_90 -o out.cubin -r a.o", false, false),
            ("-arch=sm_90 -o out.cubin a.o b.o", false, false),
            ("-arch=sm_90 -o out.cubin b.o a.o", false, false),
            ("-arch=sm_90 -o out.cubin --register-link-binaries r.h a.o", false, false),
        ];
        let k0 = keys_of(&d, base).expect("cacheable");
        for (args, content, named) in rows {
            let k = keys_of(&d, args).expect("cacheable");
            assert_eq!(k.content == k0.content, *content, "content key of {args}");
            assert_eq!(k.named == k0.named, *named, "named key of {args}");
        }
        // Not cacheable: -time, --uidx-file, an input that cannot be read.
        assert!(keys_of(&d, "-arch=sm_90 -o out.cubin -time t.csv a.o").is_none());
        assert!(keys_of(&d, "-arch=sm_90 -o out.cubin --uidx-file=a.o a.o").is_none());
        assert!(keys_of(&d, "-arch=sm_90 -o out.cubin missing.o").is_none());
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn one_view_of_reads_stats_and_absences() {
        let d = temp("view");
        let f = d.join("a.o");
        std::fs::write(&f, b"first").unwrap();
        let memo = MemoFs::new(&LocalFs);
        assert!(memo.stat(&d.join("missing")).is_err());
        assert_eq!(&*memo.read(&f).unwrap(), b"first");
        assert_eq!(memo.stat(&f).unwrap().size, 5);
        // What the link sees later is what the key saw, whatever the disk says now.
        std::fs::write(&f, b"second version").unwrap();
        std::fs::write(d.join("missing"), b"now here").unwrap();
        assert_eq!(&*memo.read(&f).unwrap(), b"first");
        assert_eq!(memo.stat(&f).unwrap().size, 5);
        assert!(memo.stat(&d.join("missing")).is_err());
        assert!(memo.consistent());
        // But the files nvlink would read are not the key's any more.
        assert!(!memo.unchanged_on_disk());
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_link_naming_a_ptxas_options_file_has_no_key() {
        use crate::cli::spec::names_options_file as named;
        for v in ["--options-file=popts", "-optf", "-optf=x", "--options-file F", " -optf=F", "-O3 --options-file=F"] {
            assert!(named(v), "{v}");
        }
        assert!(named("-Xptxas=--options-file=F") && named("-O1,-optf,F") && named("--apply-controls=ctl"));
        assert!(!named("-O1") && !named("optf") && !named("--opt-level=1") && !named("popts"));
        let dir = std::env::temp_dir().join(format!("nvlinkd-ptxas-optf-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("x.o"), b"not an object, but a file").unwrap();
        assert!(keys_of(&dir, "--arch=sm_90 -Xptxas -O1 x.o -o y.cubin").is_some());
        assert!(keys_of(&dir, "--arch=sm_90 -Xptxas --options-file=popts x.o -o y.cubin").is_none());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_file_rewritten_after_its_identity_was_taken_taints_the_view() {
        let d = temp("taint");
        let f = d.join("a.o");
        std::fs::write(&f, b"first").unwrap();
        let memo = MemoFs::new(&LocalFs);
        let id = memo.identity(&f);
        assert!(id.is_some());
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&f, b"other").unwrap();
        assert_eq!(&*memo.read(&f).unwrap(), b"other");
        assert!(!memo.consistent());
        // Nothing may be remembered under the old identity.
        assert_eq!(memo.identity(&f), None);
        let _ = std::fs::remove_dir_all(&d);
    }
}
