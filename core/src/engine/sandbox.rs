//! The real nvlink for a caller whose files the daemon does not share: the
//! link's files, read through its `InputFs`, mirrored into a sandbox.
//!
//! A fresh directory `S` (mode 0700, under the daemon's scratch directory,
//! removed on drop whatever happens) holds the caller's paths at `S/<path>`:
//! the working directory (so relative names stay as given, and nvlink prints
//! them as given), the inputs, the `-l` candidates along `-L` and
//! `LIBRARY_PATH`, the `--uidx-file` and the `-time` file. Absolute
//! names on the command line become `S/<name>`; `-nvvmpath` becomes a symlink
//! at its mirrored place to the daemon's own toolkit's `nvvm` (a caller never
//! chooses what the daemon loads). The daemon's own nvlink runs there (see
//! `process.rs`, which redirects `-o` and `--register-link-binaries`).
//! [`Mirror::capture`] takes what goes there from the link's view (no copy:
//! the view's bytes are shared) and [`Mirror::write`] writes it, so that a
//! background verification writes its sandbox on its own thread.
//!
//! Measured with nvlink 13.5 (the routed parity cases, paths moved so): the
//! only differences are the moved names themselves, in messages, in `-time`
//! rows and in the `-L`/`-nvvmpath` values nvlink records in its own
//! `.note.nv.tkinfo` entry. So `S` is removed from messages and from the
//! `-time` rows, and the output cubin's tool entries are rewritten without it
//! (the file laid out again by the finalizer's `CubinImage`, which must first
//! give nvlink's bytes back unchanged). A result that still names `S` anywhere
//! is no answer: the link falls back.
//!
//! Nothing the caller sends is a path here outside `S`: every name is joined
//! to `S` component by component (`..` may not climb out of `S`, nor pass the
//! `-nvvmpath` link); only directories and regular files the daemon creates are
//! in `S`, files are created exclusively and never through a symlink. A
//! name's directories before a `..` are made real ones (the caller's kernel
//! walks them, symlinks or not), and every place of `S` must hold what each
//! of the caller's names of it read (`agree`): otherwise the link falls back.
//! So does a link naming an options file (the parse keeps its options, not
//! its name).

use std::io::{ErrorKind, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};

use crate::cli::options::Opt;
use crate::cli::spec::Spec;
use crate::engine::process::Scratch;
use crate::finalize::image::CubinImage;
use crate::finalize::tkinfo;
use crate::fs::{absolute, InputFs};
use crate::regbin::{strip_id_prefix, synthetic_module_id};
use crate::request::{OutputFile, Request};

/// Why a link cannot run in a sandbox.
#[derive(Debug)]
pub enum SandboxError {
    /// Not mirrored faithfully (or not safely): the caller runs nvlink.
    Unsupported(String),
    /// The daemon's disk failed (a fault of the environment).
    Environment(String),
}

fn unsupported(why: impl Into<String>) -> SandboxError {
    SandboxError::Unsupported(why.into())
}

fn env_fault(e: std::io::Error) -> SandboxError {
    SandboxError::Environment(format!("sandbox: {e}"))
}

/// A link's files mirrored under a fresh directory, and the request that
/// runs nvlink on them.
pub struct Sandbox {
    dir: Scratch,
    /// The sandbox root as text (what is removed from results).
    root: String,
    /// The request as nvlink runs it there: arguments and `LIBRARY_PATH` moved,
    /// the mirrored working directory.
    pub request: Request,
    /// The caller's `-time` file: its place here and the bytes it had.
    time: Option<(PathBuf, usize)>,
}

/// The caller's absolute path `path` under `root`, walked component by
/// component: `..` never climbs above `root` and no step is `link` (the one
/// symlink in a sandbox).
fn mirror(root: &Path, cwd: &Path, path: &str, link: Option<&Path>) -> Result<PathBuf, SandboxError> {
    let p = Path::new(path);
    let (mut at, rest) = if p.is_absolute() {
        (root.to_owned(), p)
    } else {
        (mirror(root, Path::new("/"), &cwd.to_string_lossy(), link)?, p)
    };
    for c in rest.components() {
        match c {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(n) => at.push(n),
            Component::ParentDir => {
                if at == root {
                    return Err(unsupported(format!("'{path}' leaves the caller's root")));
                }
                at.pop();
            }
            Component::Prefix(_) => return Err(unsupported("path prefix")),
        }
        if link.is_some_and(|l| at == l) {
            return Err(unsupported(format!("'{path}' goes through -nvvmpath")));
        }
    }
    Ok(at)
}

/// The directories a name passes through before a `..` leaves them (`a/b`
/// of `a/b/../x.o`), mirrored: the caller's kernel walks them (a symlink
/// there leads elsewhere), so the sandbox makes them real directories and
/// `..` then leads where the spelling says; what the caller's name reads is
/// put there ([`Mirror::capture`] checks that no two names disagree).
fn spelled_dirs(root: &Path, cwd: &Path, path: &str) -> Vec<PathBuf> {
    let p = Path::new(path);
    let mut at = if p.is_absolute() { root.to_owned() } else { root.join(cwd.strip_prefix("/").unwrap_or(cwd)) };
    let mut dirs = Vec::new();
    for c in p.components() {
        match c {
            Component::Normal(n) => at.push(n),
            Component::ParentDir => {
                if at.starts_with(root) && at != root {
                    dirs.push(at.clone());
                }
                at.pop();
            }
            _ => {}
        }
    }
    dirs
}

/// Create `dir` and its missing parents under `root`, refusing anything that
/// is not a directory on the way (never following a symlink).
fn make_dirs(root: &Path, dir: &Path) -> Result<(), SandboxError> {
    let rel = dir.strip_prefix(root).map_err(|_| unsupported("outside the sandbox"))?;
    let mut at = root.to_owned();
    for c in rel.components() {
        at.push(c);
        match std::fs::symlink_metadata(&at) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => return Err(unsupported(format!("{} is a file and a directory", at.display()))),
            Err(_) => std::fs::DirBuilder::new().mode(0o700).create(&at).map_err(env_fault)?,
        }
    }
    Ok(())
}

/// Write a file at `at` (its parents made), exclusively, never through a symlink.
fn write_file(root: &Path, at: &Path, data: &[u8]) -> Result<(), SandboxError> {
    let parent = at.parent().ok_or_else(|| unsupported("no parent"))?;
    make_dirs(root, parent)?;
    if std::fs::symlink_metadata(at).is_ok() {
        // Mirrored already (one file named twice): only with the same bytes.
        return match std::fs::read(at) {
            Ok(d) if d == data => Ok(()),
            _ => Err(unsupported(format!("two names of {} read differently", at.display()))),
        };
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(at)
        .map_err(env_fault)?;
    f.write_all(data).map_err(env_fault)
}

/// Whether a command line names an options file: nvlink's (`-optf`,
/// `--options-file`), or one its ptxas reads (`-Xptxas --options-file=F`,
/// however spelled: nvlink splits an `-Xptxas` value on spaces and commas).
pub fn names_an_options_file(args: &[String]) -> bool {
    args.iter().any(|a| crate::cli::spec::names_options_file(a))
}

/// One thing a sandbox holds (paths under its root).
enum Entry {
    Dir(PathBuf),
    File(PathBuf, std::sync::Arc<[u8]>),
    /// The `-nvvmpath` place: the daemon's `nvvm`, or an empty directory.
    Nvvm {
        at: PathBuf,
        target: Option<PathBuf>,
    },
}

/// A sandbox captured from a link's view but not yet written: the files'
/// contents are the view's own (shared, not copied), so capturing costs the
/// link next to nothing and the disk writes happen where the sandbox is used
/// ([`Mirror::write`]; for a background verification, on its idle thread).
pub struct Mirror {
    dir: Scratch,
    root: PathBuf,
    root_s: String,
    entries: Vec<Entry>,
    request: Request,
    time: Option<(PathBuf, usize)>,
}

impl Mirror {
    /// What nvlink reads for `req` (read through `fs`), to be mirrored under
    /// a new directory of `parent` (created now, empty); `nvvm` is the
    /// daemon's toolkit's `nvvm`.
    pub fn capture(
        parent: &Path,
        req: &Request,
        spec: &Spec,
        fs: &dyn InputFs,
        nvvm: &Path,
    ) -> Result<Mirror, SandboxError> {
        if !req.cwd.is_absolute() {
            return Err(unsupported("the caller's working directory is not absolute"));
        }
        // The parse reads options files in place and keeps their options, not
        // their names: the file would be missing here (and the answer,
        // nvlink's "Could not open options file", cached).
        if names_an_options_file(&req.args) {
            return Err(unsupported("an options file"));
        }
        let _ = std::fs::create_dir_all(parent);
        let dir = Scratch::new(parent).map_err(env_fault)?;
        let root = dir.0.join("root");
        let root_s = root.to_str().ok_or_else(|| unsupported("sandbox path not UTF-8"))?.to_owned();
        let cwd = mirror(&root, Path::new("/"), &req.cwd.to_string_lossy(), None)?;
        // nvlink's getcwd there must be the root then the caller's own (the
        // names it prints and mangles are made from it): a working directory
        // as getcwd gives it, no `.`, `..`, `//` or trailing `/`.
        let literal =
            if req.cwd.as_os_str() == "/" { root_s.clone() } else { format!("{root_s}{}", req.cwd.display()) };
        if cwd.to_str() != Some(literal.as_str()) {
            return Err(unsupported("the caller's working directory is not as getcwd gives it"));
        }
        // What nvlink reads, as the spec resolved it (`input/files.rs`).
        let lib_path = req.env.get("LIBRARY_PATH").map(String::as_str);
        let dirs: Vec<&str> = spec.files.search_dirs.iter().map(|n| n.given.as_str()).collect();
        // Every name nvlink may open, as the caller wrote it.
        let mut named: Vec<&str> = spec.files.inputs.iter().map(|n| n.given.as_str()).collect();
        named.extend(spec.uidx_file.as_deref());
        let time = spec.time.as_deref().filter(|t| *t != "-");
        named.extend(time);
        // A value naming a file nvlink reads or writes that is not mirrored
        // (its embedded tools' options, a dot file) is not run here.
        let mirrored = [
            Opt::OptionsFile,
            Opt::LibraryPath,
            Opt::Library,
            Opt::Nvvmpath,
            Opt::Time,
            Opt::UidxFile,
            Opt::OutputFile,
            Opt::RegisterLinkBinaries,
            // Only host linker scripts run it (never a device link).
            Opt::HostCcbin,
        ];
        for o in &spec.parsed.options {
            if o.id == Opt::DotFile
                || (!mirrored.contains(&o.id) && o.value.as_deref().is_some_and(|v| v.contains('/')))
            {
                return Err(unsupported(format!("a file named by {:?}", o.id)));
            }
            // Names are moved one argument at a time: not inside a list.
            let token = o.at.and_then(|at| req.args.get(at.value.unwrap_or(at.option)));
            if matches!(o.id, Opt::LibraryPath | Opt::OptionsFile) && token.is_some_and(|t| t.contains(',')) {
                return Err(unsupported("a list of directories or options files"));
            }
        }
        let link = match spec.nvvmpath.as_deref() {
            Some(v) => Some(mirror(&root, &req.cwd, v, None)?),
            None => None,
        };
        let link = link.as_deref();
        let mut entries = vec![Entry::Dir(cwd.clone())];
        let mut time_at = None;
        let mut files: Vec<String> = named.iter().map(|s| s.to_string()).collect();
        // Places no name of the caller's found anything at.
        let mut absent: Vec<PathBuf> = Vec::new();
        for (i, d) in spec.files.search_dirs.iter().enumerate() {
            let at = mirror(&root, &req.cwd, &d.given, link)?;
            if fs.stat(&d.path).is_ok_and(|st| st.is_dir) {
                entries.extend(spelled_dirs(&root, &req.cwd, &d.given).into_iter().map(Entry::Dir));
                entries.push(Entry::Dir(at));
            } else {
                absent.push(at);
            }
            let candidates = spec.files.libraries.iter().filter_map(|l| l.candidates.get(i));
            files.extend(candidates.map(|c| c.given.clone()));
        }
        for name in &files {
            let at = mirror(&root, &req.cwd, name, link)?;
            let caller = absolute(&req.cwd, name);
            let is_time = time == Some(name.as_str());
            let spelled = || spelled_dirs(&root, &req.cwd, name).into_iter().map(Entry::Dir);
            // An input is what the link's key read of it (a caller answering
            // a stat otherwise is not believed).
            let is_input = spec.files.inputs.iter().any(|i| i.given == *name);
            if let Some(data) = is_input.then(|| fs.read(&caller).ok()).flatten() {
                entries.extend(spelled());
                entries.push(Entry::File(at, data));
                continue;
            }
            match fs.stat(&caller) {
                Ok(st) if st.is_dir => {
                    entries.extend(spelled());
                    entries.push(Entry::Dir(at));
                }
                Ok(_) => match fs.read(&caller) {
                    Ok(data) => {
                        if is_time {
                            time_at = Some((at.clone(), data.len()));
                        }
                        entries.extend(spelled());
                        entries.push(Entry::File(at, data));
                    }
                    Err(e) => {
                        if let Some(why) = fs.declined() {
                            return Err(unsupported(why));
                        }
                        return Err(unsupported(format!("{name}: {e}")));
                    }
                },
                Err(_) if is_time => {
                    // nvlink creates it (its header first).
                    entries.push(Entry::Dir(at.parent().unwrap_or(&root).to_owned()));
                    time_at = Some((at, 0));
                }
                // What nvlink's own open would also fail on.
                Err(e)
                    if matches!(
                        e.kind(),
                        ErrorKind::NotFound | ErrorKind::NotADirectory | ErrorKind::PermissionDenied
                    ) =>
                {
                    absent.push(at)
                }
                // Anything else (a name too long for the caller's side to
                // open whole, an I/O error) says nothing of what nvlink would
                // see: not mirrored as absent.
                Err(e) => return Err(unsupported(format!("{name}: {e}"))),
            }
            if let Some(why) = fs.declined() {
                return Err(unsupported(why));
            }
        }
        agree(&entries, &absent)?;
        if let Some(l) = link {
            // (Every directory above a mirrored path is made.)
            let made = |p: &Path| p.starts_with(l);
            let taken = entries.iter().any(|e| match e {
                Entry::Dir(p) | Entry::File(p, _) => made(p),
                Entry::Nvvm { .. } => false,
            });
            if taken {
                return Err(unsupported("-nvvmpath names a mirrored file"));
            }
            // The caller's nvlink would find no libNVVM there: neither does
            // this one (an empty directory), and it fails as the caller's would.
            let caller = spec.nvvmpath.as_deref().map(|v| absolute(&req.cwd, v));
            let empty = req.nvvm_stat && caller.is_some_and(|c| !crate::fs::has_libnvvm(fs, &c));
            entries.push(Entry::Nvvm { at: l.to_owned(), target: (!empty).then(|| nvvm.to_owned()) });
        }
        // Absolute names on the command line move under the root.
        let written = [spec.output.as_deref(), spec.register_link_binaries.as_deref()];
        if written.iter().flatten().any(|w| files.iter().any(|f| f == w) || dirs.contains(w)) {
            return Err(unsupported("an output is also read"));
        }
        let moved: Vec<&str> = files
            .iter()
            .map(String::as_str)
            .chain(dirs.iter().copied())
            .chain(spec.nvvmpath.as_deref())
            .filter(|v| v.starts_with('/'))
            .collect();
        let args = req.args.iter().map(|a| move_arg(a, &moved, &root_s)).collect();
        let mut env = req.env.clone();
        // The caller's CUDA_HOME names nothing here.
        env.remove("CUDA_HOME");
        if let Some(lp) = lib_path {
            let moved: Vec<String> =
                lp.split(':').map(|d| if d.starts_with('/') { format!("{root_s}{d}") } else { d.to_owned() }).collect();
            env.insert("LIBRARY_PATH".into(), moved.join(":"));
        }
        let request = Request { args, cwd, env, ..req.clone() };
        Ok(Mirror { dir, root, root_s, entries, request, time: time_at })
    }

    /// Bytes of the captured files (held until [`Mirror::write`]).
    pub fn bytes(&self) -> u64 {
        self.entries.iter().map(|e| if let Entry::File(_, d) = e { d.len() as u64 } else { 0 }).sum()
    }

    /// Write the captured files: the sandbox nvlink runs in.
    pub fn write(self) -> Result<Sandbox, SandboxError> {
        let root = &self.root;
        std::fs::DirBuilder::new().mode(0o700).create(root).map_err(env_fault)?;
        for e in &self.entries {
            match e {
                Entry::Dir(p) => make_dirs(root, p)?,
                Entry::File(p, data) => write_file(root, p, data)?,
                Entry::Nvvm { at, target } => {
                    make_dirs(root, at.parent().unwrap_or(root))?;
                    if std::fs::symlink_metadata(at).is_ok() {
                        return Err(unsupported("-nvvmpath names a mirrored file"));
                    }
                    match target {
                        Some(nvvm) => std::os::unix::fs::symlink(nvvm, at).map_err(env_fault)?,
                        None => make_dirs(root, at)?,
                    }
                }
            }
        }
        Ok(Sandbox { dir: self.dir, root: self.root_s, request: self.request, time: self.time })
    }
}

impl Sandbox {
    /// Mirror what nvlink reads for `req` (read through `fs`) into a new
    /// directory under `parent`; `nvvm` is the daemon's toolkit's `nvvm`.
    pub fn prepare(
        parent: &Path,
        req: &Request,
        spec: &Spec,
        fs: &dyn InputFs,
        nvvm: &Path,
    ) -> Result<Sandbox, SandboxError> {
        Mirror::capture(parent, req, spec, fs, nvvm)?.write()
    }

    /// The caller's view of what nvlink produced here: the sandbox's name
    /// removed from messages, `-time` rows and the output's tool entries,
    /// output paths back to the caller's. Err when the sandbox still shows.
    pub fn unmirror(
        &self,
        stdout: Vec<u8>,
        stderr: Vec<u8>,
        outputs: Vec<OutputFile>,
        spec: &Spec,
    ) -> Result<Answer, SandboxError> {
        let root = self.root.as_bytes();
        let mut mapped = Vec::with_capacity(outputs.len() + 1);
        let out_path = spec.files.written.output.as_ref().map(|o| &o.path);
        let reg_path = spec.files.written.register.as_ref().map(|o| &o.path);
        let root_id = synthetic_module_id(Path::new(&self.root));
        for mut f in outputs {
            f.path = self.caller_path(&f.path);
            if Some(&f.path) == reg_path {
                // nvlink names a cubin or PTX input by its mangled absolute path.
                f.data = strip_id_prefix(&f.data, &root_id).into();
            }
            if contains(&f.data, root) {
                if Some(&f.path) != out_path {
                    return Err(unsupported(format!("{} names the sandbox", f.path.display())));
                }
                f.data = unmirror_tkinfo(&f.data, &self.root)?.into();
            }
            mapped.push(f);
        }
        if let (Some((at, old)), Some(t)) = (&self.time, &spec.files.written.time) {
            let data = crate::engine::process::read_tool_output(at).map_err(env_fault)?;
            let added = data.get(*old..).ok_or_else(|| unsupported("the -time file shrank"))?;
            mapped.push(OutputFile { path: t.path.clone(), data: strip(added, root).into(), append: true });
        }
        let answer = (strip(&stdout, root), strip(&stderr, root), mapped);
        self.hidden(&answer)?;
        Ok(answer)
    }

    /// Err when the sandbox's directory (the daemon's cache path, pid and
    /// link counter are in its name) still shows in an answer, as written
    /// or as nvlink mangles a path into a module id.
    fn hidden(&self, (stdout, stderr, outputs): &Answer) -> Result<(), SandboxError> {
        let dir = self.dir.0.to_string_lossy();
        let id = synthetic_module_id(&self.dir.0);
        let texts = [&stdout[..], &stderr[..]].into_iter().chain(outputs.iter().map(|f| &f.data[..]));
        for t in texts {
            if contains(t, dir.as_bytes()) || contains(t, id.as_bytes()) {
                return Err(unsupported("the answer names the sandbox"));
            }
        }
        Ok(())
    }

    fn caller_path(&self, p: &Path) -> PathBuf {
        match p.to_str().and_then(|s| s.strip_prefix(self.root.as_str())) {
            Some(rest) if rest.starts_with('/') => PathBuf::from(rest),
            _ => p.to_owned(),
        }
    }

    /// The sandbox directory (everything mirrored is below it).
    pub fn dir(&self) -> &Path {
        &self.dir.0
    }
}

/// stdout, stderr and the output files of a run.
pub type Answer = (Vec<u8>, Vec<u8>, Vec<OutputFile>);

/// Whether every place of the sandbox holds what each caller's name of it
/// read: two names of one place (`sym/../x.o` and `x.o`, where `sym` is a
/// symlink; a remote caller answering as it likes) with other bytes, a file
/// and a directory, or something where another name found nothing, would
/// give nvlink other inputs than the link's key names.
fn agree(entries: &[Entry], absent: &[PathBuf]) -> Result<(), SandboxError> {
    let mut files: std::collections::HashMap<&Path, &[u8]> = std::collections::HashMap::new();
    let mut dirs: std::collections::HashSet<&Path> = std::collections::HashSet::new();
    for e in entries {
        match e {
            Entry::File(p, data) => {
                if files.insert(p, data).is_some_and(|other| other != &data[..]) {
                    return Err(unsupported(format!("two names of {} read differently", p.display())));
                }
            }
            Entry::Dir(p) => {
                dirs.insert(p);
            }
            Entry::Nvvm { .. } => {}
        }
    }
    // A directory above a file (or a file named as a directory) is one place.
    let made = |a: &Path| files.keys().chain(dirs.iter()).any(|p| p.starts_with(a));
    if let Some(p) = files.keys().find(|f| dirs.contains(*f) || files.keys().any(|g| g != *f && g.starts_with(f))) {
        return Err(unsupported(format!("{} is a file and a directory", p.display())));
    }
    if let Some(a) = absent.iter().find(|a| made(a)) {
        return Err(unsupported(format!("{}: one name finds it, another does not", a.display())));
    }
    Ok(())
}

/// `arg` with an absolute name of `moved` (the whole argument, after `=`, or
/// glued to `-L`) put under `root`.
fn move_arg(arg: &str, moved: &[&str], root: &str) -> String {
    if moved.contains(&arg) {
        return format!("{root}{arg}");
    }
    if let Some((opt, v)) = arg.split_once('=') {
        if opt.starts_with('-') && moved.contains(&v) {
            return format!("{opt}={root}{v}");
        }
    }
    if let Some(v) = arg.strip_prefix("-L").filter(|v| moved.contains(v)) {
        return format!("-L{root}{v}");
    }
    arg.to_owned()
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle)
}

/// `data` with every occurrence of `root` removed.
fn strip(data: &[u8], root: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len());
    let mut i = 0;
    while i < data.len() {
        if data[i..].starts_with(root) {
            i += root.len();
        } else {
            out.push(data[i]);
            i += 1;
        }
    }
    out
}

/// The output cubin with the sandbox's name removed from its tool entries,
/// laid out again; only when the layout gives nvlink's own bytes back
/// unchanged and nothing else names the sandbox.
fn unmirror_tkinfo(cubin: &[u8], root: &str) -> Result<Vec<u8>, SandboxError> {
    let no = |why: &str| unsupported(format!("the output names the sandbox ({why})"));
    let mut img = CubinImage::parse(cubin).map_err(|_| no("not a cubin"))?;
    if img.serialize() != cubin {
        return Err(no("layout not reproduced"));
    }
    let idx = img.section_index(".note.nv.tkinfo").ok_or_else(|| no("no tkinfo"))?;
    let mut entries = tkinfo::parse(&img.sections[idx].data).map_err(|_| no("tkinfo"))?;
    for e in &mut entries {
        for s in [&mut e.object, &mut e.tool, &mut e.release, &mut e.build, &mut e.options] {
            *s = s.replace(root, "");
        }
    }
    img.sections[idx].data = tkinfo::serialize(&entries);
    let out = img.serialize();
    if contains(&out, root.as_bytes()) {
        return Err(no("outside its tool entries"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A name's `..` leaves directories the sandbox must make real (the
    /// caller's kernel walks them, symlinks or not); names of one place
    /// agree or the link is not mirrored.
    #[test]
    fn names_of_one_place_must_agree() {
        let root = Path::new("/s/root");
        let cwd = Path::new("/w/p");
        assert_eq!(spelled_dirs(root, cwd, "sym/../x.o"), [PathBuf::from("/s/root/w/p/sym")]);
        assert_eq!(spelled_dirs(root, cwd, "/a/b/../../c.o"), [PathBuf::from("/s/root/a/b"), "/s/root/a".into()]);
        assert!(spelled_dirs(root, cwd, "x.o").is_empty());
        let file = |p: &str, d: &[u8]| Entry::File(p.into(), std::sync::Arc::from(d));
        let ok = [file("/s/root/w/p/x.o", b"A"), file("/s/root/w/p/x.o", b"A"), Entry::Dir("/s/root/w/p".into())];
        assert!(agree(&ok, &[]).is_ok());
        assert!(agree(&[file("/s/root/w/p/x.o", b"A"), file("/s/root/w/p/x.o", b"B")], &[]).is_err());
        assert!(agree(&[file("/s/root/w/p/x.o", b"A"), Entry::Dir("/s/root/w/p/x.o".into())], &[]).is_err());
        assert!(agree(&[file("/s/root/w/p/x.o", b"A"), file("/s/root/w/p/x.o/y", b"B")], &[]).is_err());
        assert!(agree(&[file("/s/root/w/p/x.o", b"A")], &[PathBuf::from("/s/root/w/p/x.o")]).is_err());
        assert!(agree(&[file("/s/root/w/p/sym/y.o", b"A")], &[PathBuf::from("/s/root/w/p/sym")]).is_err());
        assert!(agree(&[file("/s/root/w/p/x.o", b"A")], &[PathBuf::from("/s/root/w/p/z.o")]).is_ok());
    }

    #[test]
    fn mirrored_names_stay_inside_the_root() {
        let root = Path::new("/s/root");
        let cwd = Path::new("/w/b");
        let link = Path::new("/s/root/w/nvvm");
        let rows: &[(&str, Option<&str>)] = &[
            ("a.o", Some("/s/root/w/b/a.o")),
            ("/abs/x.o", Some("/s/root/abs/x.o")),
            ("../lib/libx.a", Some("/s/root/w/lib/libx.a")),
            ("../../x.o", Some("/s/root/x.o")),
            ("../../../etc/passwd", None),
            ("/../etc/passwd", None),
            ("./../nvvm/../x.o", None),
            ("../nvvm", None),
            ("/w//b/./c.o", Some("/s/root/w/b/c.o")),
        ];
        for (name, want) in rows {
            let got = mirror(root, cwd, name, Some(link)).ok();
            assert_eq!(got.as_deref(), want.map(Path::new), "{name}");
        }
    }

    #[test]
    fn only_named_absolute_values_move() {
        let moved = ["/c/lib", "/c/a.o"];
        let rows = [
            ("/c/a.o", "/R/c/a.o"),
            ("-L/c/lib", "-L/R/c/lib"),
            ("-L/c/lib,/c/lib", "-L/c/lib,/c/lib"),
            ("--library-path=/c/lib", "--library-path=/R/c/lib"),
            ("-o", "-o"),
            ("/c/other.o", "/c/other.o"),
            ("a.o", "a.o"),
        ];
        for (arg, want) in rows {
            assert_eq!(move_arg(arg, &moved, "/R"), want);
        }
        assert_eq!(strip(b"in '/R/c/a.o' and /R/x", b"/R"), b"in '/c/a.o' and /x");
    }
}
