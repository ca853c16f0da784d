//! What a daemon may ask of the shim (and of `nvlinkd watch`, which writes
//! the outputs of the links it watches as the shim does): neither trusts a daemon.
//!
//! A daemon (a remote one above all) could ask the shim for any file it can
//! read (`/etc/shadow`, private keys, `/proc/self/environ`) or hand it any path
//! to write. The shim serves only reads and stats of files nvlink itself would
//! read for this command line, and writes only the files nvlink would write:
//!
//! - **Reads**: every name on the command line and in its options files (an
//!   argument, the value after `=`, the value glued to `-L` or `-l`, and
//!   each comma-separated piece of these), resolved against the working
//!   directory; `lib<name>.a` in a directory so named or in `LIBRARY_PATH`, for
//!   a `<name>` so named (what `-l` resolves to along `-L`); and the toolkit's
//!   own `libcudadevrt.a`. The options files are read here, by the shim, to
//!   learn their names. This over-approximates nvlink's reads (a name that is
//!   an option's value is allowed whether or not nvlink opens it) but never
//!   reaches a file the command line does not name.
//! - **Writes**: `-o`/`--output-file` and `--register-link-binaries`, replaced;
//!   the `-time` file, appended to.
//! - **Results**: an exit status nvlink can return (0..=255), and exit 0 of a
//!   link that names `-o` comes with that output file.
//!
//! Paths are compared by components (`a//b/./c` is `a/b/c`; `..` is kept, since
//! a symlink may make it mean something else), and the path the shim then opens
//! is the one compared.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

/// Options whose value nvlink writes to (replaced), by long and short name.
const OUTPUTS: &[&str] = &["output-file", "o", "register-link-binaries"];
/// Options whose value nvlink appends to.
const APPENDS: &[&str] = &["time"];
/// Options files, whose contents are more arguments.
const OPTIONS_FILES: &[&str] = &["options-file", "optf"];
/// Options that make nvlink print and exit without linking.
const NO_LINK: &[&str] = &["help", "h", "version", "V"];
/// How deep options files may name options files.
const MAX_DEPTH: usize = 15;
/// nvlink's options that take a value, by long and short name
/// (`core/src/cli/options.rs`): given apart (`-L dir`), the next argument is
/// that value, never an option of nvlink's (`-Xptxas -o=F` and
/// `-L --options-file=G` name no output and no options file of nvlink's).
const VALUED: &[&str] = &[
    "output-file",
    "o",
    "arch",
    "machine",
    "m",
    "library",
    "l",
    "library-path",
    "L",
    "register-link-binaries",
    "kernels-used",
    "variables-used",
    "cpu-arch",
    "time",
    "nvvmpath",
    "split-compile",
    "split-compile-extended",
    "Ofast-compile",
    "Ofc",
    "Xptxas",
    "Xnvvm",
    "maxrregcount",
    "device-stack-protector",
    "options-file",
    "optf",
    "gen-host-linker-script",
    "ghls",
    "uidx-file",
    "uidx",
    "host-ccbin",
    "tool-name",
    "verbose-tkinfo",
    "host-linker-options",
    "Xlinker",
    "dot-file",
    "dot",
    "disable-smem-reservation",
    "syscall-const-offset",
    "cuda-api-version",
    "nv-host",
    "enable-extended-smem",
    "device-stack-protector-frame-size-threshold",
];

/// Which of `args` are values given apart, walking them as nvlink's parser
/// does: an option that takes a value consumes the next argument.
fn separate_values(args: &[String]) -> Vec<bool> {
    let mut value = vec![false; args.len()];
    let mut i = 0;
    while i < args.len() {
        let t = &args[i];
        let takes_next = !t.contains('=') && option_name(t).is_some_and(|n| VALUED.contains(&n));
        if takes_next && i + 1 < args.len() {
            value[i + 1] = true;
            i += 2;
        } else {
            i += 1;
        }
    }
    value
}

#[derive(Debug, Default)]
pub struct Policy {
    /// Files that may be read or stat'ed (as the command line names them).
    reads: HashSet<PathBuf>,
    /// The toolkit's own `libcudadevrt.a`, which may be read too.
    devrt: HashSet<PathBuf>,
    /// Names a `-l` may have (any name on the command line).
    names: HashSet<String>,
    /// Directories `-l` searches (any name on the command line, `LIBRARY_PATH`).
    dirs: HashSet<PathBuf>,
    /// Files nvlink replaces.
    writes: HashSet<PathBuf>,
    /// Files nvlink appends to.
    appends: HashSet<PathBuf>,
    /// The `-o` file, when the command line names one and links.
    output: Option<PathBuf>,
    /// `-L` directories then `LIBRARY_PATH`'s, and `-l` names, as typed and in
    /// order (what the shim announces; reads are allowed by the sets above).
    lib_dirs: Vec<String>,
    lib_names: Vec<String>,
    /// The libNVVM nvlink loads from `-nvvmpath`: stat only (the daemon
    /// learns whether there is one, never its bytes).
    nvvm: HashSet<PathBuf>,
}

/// Where nvlink looks for libNVVM under `-nvvmpath`.
pub const NVVM_LIBRARIES: [&str; 2] = ["lib64/libnvvm.so", "lib/libnvvm.so"];

/// The option name of `token` (`--name`, `-name`, `--name=value`), if it is one.
fn option_name(token: &str) -> Option<&str> {
    let name = token.strip_prefix("--").or_else(|| token.strip_prefix('-'))?;
    Some(name.split_once('=').map_or(name, |(n, _)| n))
}

impl Policy {
    pub fn new(args: &[String], cwd: &Path, library_path: Option<&str>, cuda_home: Option<&Path>) -> Policy {
        let mut p = Policy::default();
        let mut tokens = Vec::new();
        let mut apart = Vec::new();
        expand_marked(args, cwd, &mut tokens, &mut apart, 0);
        let resolve = |name: &str| cwd.join(name);
        let mut no_link = false;
        let mut arch: Option<String> = None;
        // The values of options naming files nvlink only writes, and of
        // `--arch`: never read (nvlink opens an output for writing only).
        let not_read = |i: usize| {
            i.checked_sub(1).and_then(|p| tokens.get(p)).and_then(|p| option_name(p)).is_some_and(|n| {
                !tokens[i - 1].contains('=') && (OUTPUTS.contains(&n) || matches!(n, "arch" | "arch-name"))
            })
        };
        for (i, t) in tokens.iter().enumerate() {
            // Each value, and whether nvlink may read a file of that name.
            let mut values: Vec<(&str, bool)> = vec![(t.as_str(), !not_read(i))];
            if let Some((n, v)) = t.split_once('=') {
                let name = option_name(n).unwrap_or_default();
                values.push((v, !(OUTPUTS.contains(&name) || matches!(name, "arch" | "arch-name"))));
            }
            for glued in ["-L", "-l"] {
                if let Some(v) = t.strip_prefix(glued).filter(|v| !v.is_empty()) {
                    values.push((v, true));
                }
            }
            // An input named '': nvlink's open of it fails, and so does the
            // daemon's read of what it resolves to (the directory, `cwd/`).
            if t.is_empty() || t.ends_with('=') {
                p.reads.insert(resolve(""));
            }
            for (v, read) in values {
                for piece in std::iter::once(v).chain(v.split(',')).filter(|s| !s.is_empty()) {
                    if read {
                        p.reads.insert(resolve(piece));
                    }
                    p.dirs.insert(resolve(piece));
                    p.names.insert(piece.to_owned());
                }
            }
            let Some(name) = option_name(t).filter(|_| !apart[i]) else { continue };
            no_link |= NO_LINK.contains(&name);
            for (short, long, list) in
                [("-L", "--library-path", &mut p.lib_dirs), ("-l", "--library", &mut p.lib_names)]
            {
                let value = if t == short || t == long {
                    tokens.get(i + 1).map(String::as_str)
                } else {
                    // `-Ldir`, `-L=dir` (nvlink takes both).
                    t.strip_prefix(long)
                        .and_then(|v| v.strip_prefix('='))
                        .or_else(|| t.strip_prefix(short).map(|v| v.strip_prefix('=').unwrap_or(v)))
                };
                if !t.starts_with("--") || t == long || t.starts_with(&format!("{long}=")) {
                    list.extend(value.iter().flat_map(|v| v.split(',')).filter(|v| !v.is_empty()).map(str::to_owned));
                }
            }
            // The value: after `=`, else the next token.
            let value = t.split_once('=').map(|(_, v)| v.to_owned()).or_else(|| tokens.get(i + 1).cloned());
            if value.as_deref() == Some("") && name == "nvvmpath" {
                p.nvvm.extend(NVVM_LIBRARIES.iter().map(|l| resolve("").join(l)));
            }
            // `-o ''`, `-time ''`: nvlink cannot open it, and the shim's write
            // of what the daemon resolves it to (`cwd/`, a directory) fails
            // the same way.
            if value.as_deref() == Some("") && OUTPUTS.contains(&name) {
                p.writes.insert(resolve(""));
                if matches!(name, "o" | "output-file") {
                    p.output = Some(resolve(""));
                }
            } else if value.as_deref() == Some("") && APPENDS.contains(&name) {
                p.appends.insert(resolve(""));
            }
            let Some(value) = value.filter(|v| !v.is_empty()) else { continue };
            if matches!(name, "arch" | "arch-name") {
                arch = Some(value.clone());
            }
            if name == "nvvmpath" {
                p.nvvm.extend(NVVM_LIBRARIES.iter().map(|l| resolve(&value).join(l)));
            }
            if OUTPUTS.contains(&name) {
                p.writes.insert(resolve(&value));
                if matches!(name, "o" | "output-file") {
                    p.output = Some(resolve(&value));
                }
            } else if APPENDS.contains(&name) {
                p.appends.insert(resolve(&value));
            }
        }
        // For a virtual target (`--arch=compute_XY`) nvlink writes no `-o` file.
        if no_link || arch.is_some_and(|a| a.starts_with("compute_")) {
            p.output = None;
        }
        for d in library_path.unwrap_or_default().split(':').filter(|d| !d.is_empty()) {
            // Searched like a -L directory: the daemon may look at it (a
            // routed link's sandbox mirrors it), as at the -L ones.
            p.reads.insert(resolve(d));
            p.dirs.insert(resolve(d));
            p.lib_dirs.push(d.to_owned());
        }
        if let Some(home) = cuda_home {
            for lib in ["lib64", "lib"] {
                p.devrt.insert(home.join(lib).join("libcudadevrt.a"));
            }
        }
        p
    }

    /// May the daemon read or stat `path`?
    pub fn may_read(&self, path: &Path) -> bool {
        if !path.is_absolute() {
            return false;
        }
        if self.reads.contains(path) || self.devrt.contains(path) {
            return true;
        }
        // `-l name` along `-L dir`: `dir/libname.a`.
        let lib = path.file_name().and_then(|n| n.to_str()).and_then(|n| n.strip_prefix("lib")?.strip_suffix(".a"));
        match (lib, path.parent()) {
            (Some(name), Some(dir)) => self.names.contains(name) && self.dirs.contains(dir),
            _ => false,
        }
    }

    /// May the daemon have the shim stat `path` (what it may read, the files
    /// nvlink writes, and the libNVVM under `-nvvmpath`)?
    pub fn may_stat(&self, path: &Path) -> bool {
        self.may_read(path) || self.is_output(path) || self.nvvm.contains(path)
    }

    /// May the daemon have the shim write `path` (appending or replacing)?
    pub fn may_write(&self, path: &Path, append: bool) -> bool {
        path.is_absolute() && if append { self.appends.contains(path) } else { self.writes.contains(path) }
    }

    /// Every path the command line names (a superset of nvlink's inputs, and
    /// its outputs; not the toolkit's libcudadevrt, which is read only as a
    /// `-l` candidate).
    pub fn named(&self) -> impl Iterator<Item = &Path> {
        self.reads
            .iter()
            .chain(self.writes.iter().chain(&self.appends).filter(|w| !self.reads.contains(*w)))
            .map(PathBuf::as_path)
    }

    /// Whether nvlink writes or appends to `path`.
    pub fn is_output(&self, path: &Path) -> bool {
        self.writes.contains(path) || self.appends.contains(path)
    }

    /// The `-L` directories (then `LIBRARY_PATH`'s) and the `-l` names, in order.
    pub fn libraries(&self) -> (&[String], &[String]) {
        (&self.lib_dirs, &self.lib_names)
    }

    /// The `-o` file a successful link must write, if any.
    pub fn output(&self) -> Option<&Path> {
        self.output.as_deref()
    }
}

/// Whether the command line asks for a host linker script (`-ghls`, also in
/// an options file): made from the host's own `gcc` and `ld`, so by the
/// caller's machine, never by a remote daemon.
pub fn host_linker_script(args: &[String], cwd: &Path) -> bool {
    let mut tokens = Vec::new();
    expand(args, cwd, &mut tokens, 0);
    tokens.iter().filter_map(|t| option_name(t)).any(|n| matches!(n, "ghls" | "gen-host-linker-script"))
}

/// Whether the command line's `-nvvmpath` (also in an options file) names
/// another directory than the toolkit's own `nvvm` (or there is no toolkit
/// to compare with): nvlink loads the libNVVM found there, which a remote
/// daemon, holding its own toolkit's, cannot; the real nvlink runs here.
pub fn foreign_nvvm(args: &[String], cwd: &Path, cuda_home: Option<&Path>) -> bool {
    let tokens = expanded(args, cwd);
    let given = tokens.iter().enumerate().filter_map(|(i, t)| {
        (option_name(t) == Some("nvvmpath"))
            .then(|| t.split_once('=').map(|(_, v)| v.to_owned()).or_else(|| tokens.get(i + 1).cloned()))
            .flatten()
    });
    let own = cuda_home.and_then(|h| std::fs::canonicalize(h.join("nvvm")).ok());
    given.into_iter().any(|v| own.is_none() || std::fs::canonicalize(cwd.join(v)).ok() != own)
}

/// Whether the command line names a file of the calling process itself:
/// `/dev/stdout`, `/dev/stderr`, `/dev/stdin`, `/dev/fd/N`, `/proc/self/…`,
/// `/proc/thread-self/…` or `/dev/tty`, directly, through symbolic links
/// (a chain of them, or a directory link on the way: `d/fd/2` with `d` a link
/// to `/proc/self`), or relative to the working directory (`-o stdout` in
/// `/dev`), also in an options file. Such a name means the caller's
/// descriptors, which only a process of the caller's has: the real nvlink
/// runs here for it, never a daemon (whose `/dev/stdout` is its own).
pub fn names_caller_descriptors(args: &[String], cwd: &Path) -> bool {
    // The working directory resolved once: relative names walk from there.
    if passes_own(Path::new("/"), cwd) {
        return true;
    }
    let base = std::fs::canonicalize(cwd).unwrap_or_else(|_| cwd.to_path_buf());
    let mut tokens = Vec::new();
    expand(args, cwd, &mut tokens, 0);
    let named = tokens.iter().any(|t| {
        let values = [Some(t.as_str()), t.split_once('=').map(|(_, v)| v)];
        values
            .into_iter()
            .flatten()
            .flat_map(|v| v.split(','))
            .filter(|v| !v.is_empty())
            .any(|v| passes_own(&base, Path::new(v)))
    });
    // The libraries `-l` finds along `-L` and `LIBRARY_PATH`.
    named || {
        let library_path = std::env::var("LIBRARY_PATH").ok();
        let policy = Policy::new(args, cwd, library_path.as_deref(), None);
        let (dirs, names) = policy.libraries();
        dirs.iter().any(|d| names.iter().any(|n| passes_own(&base, &Path::new(d).join(format!("lib{n}.a")))))
    }
}

/// The names of the calling process's own files (see [`names_caller_descriptors`]).
const OWN: &[&str] =
    &["/dev/stdout", "/dev/stderr", "/dev/stdin", "/dev/fd", "/dev/tty", "/proc/self", "/proc/thread-self"];

/// Whether `path` (relative to `base`, a directory with no symbolic link on
/// its way) passes through one of [`OWN`] as the kernel resolves it: each
/// component in turn, each symbolic link's target in its place (at most 40,
/// as the kernel).
fn passes_own(base: &Path, path: &Path) -> bool {
    use std::path::Component;
    let own = |p: &Path| OWN.iter().any(|o| p.starts_with(o));
    let mut at = base.to_path_buf();
    let mut rest: std::collections::VecDeque<std::ffi::OsString> = std::collections::VecDeque::new();
    let push_front = |rest: &mut std::collections::VecDeque<std::ffi::OsString>, at: &mut PathBuf, p: &Path| {
        let mut parts = Vec::new();
        for c in p.components() {
            match c {
                Component::RootDir => {
                    *at = PathBuf::from("/");
                    parts.clear();
                }
                Component::Normal(n) => parts.push(n.to_owned()),
                Component::ParentDir => parts.push("..".into()),
                Component::CurDir | Component::Prefix(_) => {}
            }
        }
        for part in parts.into_iter().rev() {
            rest.push_front(part);
        }
    };
    push_front(&mut rest, &mut at, path);
    let mut links = 0;
    while let Some(part) = rest.pop_front() {
        if part == ".." {
            at.pop();
            continue;
        }
        let next = at.join(&part);
        if own(&next) {
            return true;
        }
        match std::fs::read_link(&next) {
            Ok(target) if links < 40 => {
                links += 1;
                push_front(&mut rest, &mut at, &target);
            }
            _ => at = next,
        }
    }
    false
}

/// The command line with the words of its options files in place (read
/// here): what nvlink names its files by (`-o .` in an options file).
pub fn expanded(args: &[String], cwd: &Path) -> Vec<String> {
    let mut tokens = Vec::new();
    expand(args, cwd, &mut tokens, 0);
    tokens
}

/// The command line with the contents of its options files (read here),
/// recursively up to [`MAX_DEPTH`].
fn expand(args: &[String], cwd: &Path, out: &mut Vec<String>, depth: usize) {
    expand_marked(args, cwd, out, &mut Vec::new(), depth)
}

/// [`expand`], marking in `apart` which tokens are values given apart.
fn expand_marked(args: &[String], cwd: &Path, out: &mut Vec<String>, apart: &mut Vec<bool>, depth: usize) {
    let values = separate_values(args);
    for (i, t) in args.iter().enumerate() {
        out.push(t.clone());
        apart.push(values[i]);
        let Some(name) = option_name(t).filter(|_| !values[i]) else { continue };
        if !OPTIONS_FILES.contains(&name) || depth >= MAX_DEPTH {
            continue;
        }
        let value = t.split_once('=').map(|(_, v)| v.to_owned()).or_else(|| args.get(i + 1).cloned());
        for file in value.iter().flat_map(|v| v.split(',')).filter(|f| !f.is_empty()) {
            // Never the caller's own descriptors (reading `/dev/stdin` here
            // would take what nvlink reads): [`names_caller_descriptors`]
            // sends such a link to the real nvlink.
            if passes_own(Path::new("/"), &cwd.join(file)) {
                continue;
            }
            // At most what the daemon would take as an options file, and a
            // regular file only (a FIFO would block here, `/dev/zero` never end).
            let path = cwd.join(file);
            if !std::fs::metadata(&path).is_ok_and(|m| m.is_file() && m.len() <= 1 << 20) {
                continue;
            }
            let Ok(text) = std::fs::read(&path) else { continue };
            let more = nvlinkd_fs::options_words(&String::from_utf8_lossy(&text));
            expand_marked(&more, cwd, out, apart, depth + 1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn an_empty_name_is_the_working_directory_whose_open_fails() {
        let cwd = Path::new("/w");
        let p = Policy::new(&args(&["--arch=sm_90", "a.o", "", "-o", ""]), cwd, None, None);
        assert!(p.may_read(Path::new("/w/")), "the daemon's read of the input named '' fails as nvlink's open");
        assert!(p.may_write(Path::new("/w/"), false), "so does the shim's write of -o ''");
        assert_eq!(p.output(), Some(Path::new("/w/")));
        let p = Policy::new(&args(&["--arch=sm_90", "--uidx-file=", "-dlto", "-nvvmpath=", "a.o"]), cwd, None, None);
        assert!(p.may_read(Path::new("/w/")), "--uidx-file= reads what '' resolves to");
        assert!(p.may_stat(Path::new("/w/lib64/libnvvm.so")), "-nvvmpath= looks in the directory");
        let p = Policy::new(&args(&["--arch=sm_90", "a.o", "-o", "x.cubin"]), cwd, None, None);
        assert!(!p.may_read(Path::new("/w/")), "no empty name, no reading the directory");
        assert!(!p.may_write(Path::new("/w/"), false));
    }

    #[test]
    fn an_options_files_quoted_names_are_the_daemons() {
        let dir = std::env::temp_dir().join(format!("nvlinkd-policy-quoted-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("opts"), "--arch=sm_90 \"sp ace.o\" b\\ c.o -o out.cubin\n").unwrap();
        let p = Policy::new(&args(&["--options-file", "opts"]), &dir, None, None);
        for name in ["sp ace.o", "b c.o"] {
            assert!(p.may_read(&dir.join(name)), "{name}: a quoted name is one word, as the daemon reads it");
        }
        assert!(!p.may_read(&dir.join("sp")));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn reads_only_what_the_command_line_names() {
        let cwd = Path::new("/w");
        let p = Policy::new(
            &args(&["--arch=sm_90", "a.o", "-Llib/", "-lfoo", "-L", "/opt/x", "-o", "out.cubin"]),
            cwd,
            Some("/lp"),
            Some(Path::new("/cuda")),
        );
        assert!(p.may_read(Path::new("/w/a.o")));
        for (argv, written) in [
            (
                &["a.o", "-o", "out.cubin", "--register-link-binaries=reg.c", "--arch=sm_90"][..],
                &["out.cubin", "reg.c", "sm_90"][..],
            ),
            (
                &["a.o", "--output-file=out.cubin", "-register-link-binaries", "reg.c", "-arch", "sm_90"],
                &["out.cubin", "reg.c", "sm_90"],
            ),
        ] {
            let q = Policy::new(&args(argv), cwd, None, None);
            for w in written {
                assert!(!q.may_read(&cwd.join(w)), "{w} of {argv:?}: nvlink never reads it");
            }
            assert!(q.may_read(&cwd.join("a.o")));
        }
        let both = Policy::new(&args(&["out.cubin", "-o", "out.cubin"]), cwd, None, None);
        assert!(both.may_read(&cwd.join("out.cubin")), "an input too");
        assert!(p.may_read(Path::new("/w/./a.o")));
        assert!(p.may_read(Path::new("/w/lib/libfoo.a")));
        assert!(p.may_read(Path::new("/w/lib//libfoo.a")));
        assert!(p.may_read(Path::new("/opt/x/libfoo.a")));
        assert!(p.may_read(Path::new("/lp/libfoo.a")));
        assert!(p.may_read(Path::new("/lp")), "a LIBRARY_PATH directory, as a -L one");
        assert!(p.may_read(Path::new("/opt/x")));
        assert!(p.may_read(Path::new("/cuda/lib64/libcudadevrt.a")));
        assert!(!p.may_read(Path::new("/etc/shadow")));
        assert!(!p.may_read(Path::new("/w/../etc/shadow")));
        assert!(!p.may_read(Path::new("/w/lib/libbar.a")));
        assert!(!p.may_read(Path::new("/etc/libfoo.a")));
        assert!(!p.may_read(Path::new("a.o")));
        assert!(p.may_write(Path::new("/w/out.cubin"), false));
        assert!(!p.may_write(Path::new("/w/out.cubin"), true));
        assert!(!p.may_write(Path::new("/w/a.o"), false));
        assert!(!p.may_write(Path::new("/w/../out.cubin"), false));
        assert_eq!(p.output(), Some(Path::new("/w/out.cubin")));
        let (dirs, names) = p.libraries();
        assert_eq!((dirs, names), (&["lib/".to_string(), "/opt/x".into(), "/lp".into()][..], &["foo".to_string()][..]));
        let q =
            Policy::new(&args(&["--library-path=a,b", "--library", "m", "-lx,y", "--lib-other=z"]), cwd, None, None);
        let (dirs, names) = q.libraries();
        assert_eq!((dirs, names), (&["a".to_string(), "b".into()][..], &["m".to_string(), "x".into(), "y".into()][..]));
    }

    #[test]
    fn outputs_and_time_file() {
        let cwd = Path::new("/w");
        let p = Policy::new(
            &args(&["--output-file=o.cubin", "--register-link-binaries=reg.c", "-time", "t.csv", "x.o"]),
            cwd,
            None,
            None,
        );
        assert!(p.may_write(Path::new("/w/o.cubin"), false));
        assert!(p.may_write(Path::new("/w/reg.c"), false));
        assert!(p.may_write(Path::new("/w/t.csv"), true));
        assert!(!p.may_write(Path::new("/w/t.csv"), false));
        let help = Policy::new(&args(&["--help", "-o", "x"]), cwd, None, None);
        assert_eq!(help.output(), None);
        let virt = Policy::new(&args(&["--arch=compute_90", "a.o", "-o", "x"]), cwd, None, None);
        assert_eq!(virt.output(), None, "nvlink writes no -o file for a virtual target");
        let real = Policy::new(&args(&["-arch", "compute_90", "-arch", "sm_90", "a.o", "-o", "x"]), cwd, None, None);
        assert!(real.output().is_some());
        // ptxas's own options (`-Xptxas -o=F`) are not nvlink's.
        let ptxas =
            Policy::new(&args(&["a.o", "-o", "out.cubin", "-Xptxas", "-o=F", "--Xnvvm", "-o"]), cwd, None, None);
        assert_eq!(ptxas.output(), Some(Path::new("/w/out.cubin")));
        assert!(!ptxas.may_write(Path::new("/w/F"), false));
    }

    #[test]
    fn only_nvlinks_own_options_files_are_read_and_only_regular_ones() {
        let dir = std::env::temp_dir().join(format!("nvlinkd-optf-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("ptxas.opts"), "-o named.cubin").unwrap();
        let passed = expanded(&args(&["-Xptxas", "--options-file=ptxas.opts", "-o", "x"]), &dir);
        assert!(!passed.iter().any(|t| t == "named.cubin"), "ptxas's options file read as nvlink's: {passed:?}");
        let own = expanded(&args(&["--options-file=ptxas.opts"]), &dir);
        assert!(own.iter().any(|t| t == "named.cubin"));
        // `-Xptxas` as another option's value passes nothing on: the options
        // file after it is nvlink's own.
        for valued in [&["-L", "-Xptxas"][..], &["-Xptxas", "-Xptxas"], &["-l", "-Xnvvm"]] {
            let mut a = valued.to_vec();
            a.push("--options-file=ptxas.opts");
            assert!(expanded(&args(&a), &dir).iter().any(|t| t == "named.cubin"), "{a:?}");
        }
        // A FIFO is not opened (it would block), `/dev/zero` not read.
        let fifo = dir.join("fifo");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: mkfifo on a NUL-terminated path this test owns.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let t0 = std::time::Instant::now();
        assert_eq!(expanded(&args(&["-optf", "fifo", "-optf=/dev/zero"]), &dir).len(), 3);
        assert!(t0.elapsed() < std::time::Duration::from_secs(5));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_callers_own_descriptors_are_recognised() {
        let cwd = Path::new("/nonexistent");
        for yes in [
            &["-o", "/dev/stdout", "a.o"][..],
            &["--output-file=/dev/fd/1"],
            &["--register-link-binaries=/proc/self/fd/2"],
            &["-time", "/dev/stderr"],
            &["/dev/stdin"],
        ] {
            assert!(names_caller_descriptors(&args(yes), cwd), "{yes:?}");
        }
        assert!(names_caller_descriptors(&args(&["-o", "stdout"]), Path::new("/dev")));
        for no in [&["--arch=sm_90", "a.o", "-o", "out.cubin"][..], &["-o", "/dev/null"], &["-o", "/tmp/dev/stdout"]] {
            assert!(!names_caller_descriptors(&args(no), cwd), "{no:?}");
        }
        // Through a symbolic link too.
        let dir = std::env::temp_dir().join(format!("nvlinkd-policy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let _ = std::fs::remove_file(dir.join("out.cubin"));
        std::os::unix::fs::symlink("/dev/stdout", dir.join("out.cubin")).unwrap();
        assert!(names_caller_descriptors(&args(&["-o", "out.cubin"]), &dir));
        // A chain of links, a directory link on the way, a working directory there.
        std::os::unix::fs::symlink("c", dir.join("a2")).unwrap();
        std::os::unix::fs::symlink("/dev/stderr", dir.join("c")).unwrap();
        std::os::unix::fs::symlink("/proc/self", dir.join("d")).unwrap();
        std::os::unix::fs::symlink("../..", dir.join("up")).unwrap();
        assert!(names_caller_descriptors(&args(&["--options-file", "a2", "a.o"]), &dir));
        assert!(names_caller_descriptors(&args(&["--options-file=d/fd/2", "a.o"]), &dir));
        assert!(names_caller_descriptors(&args(&["-o", "x.cubin"]), &dir.join("d/fd")));
        let up = format!("up/{}/d/fd/1", dir.strip_prefix("/").unwrap().display());
        assert!(names_caller_descriptors(&args(&["-o", &up]), &dir));
        assert!(!names_caller_descriptors(&args(&["-o", "up/x.cubin", "a.o"]), &dir));
        // A library `-l` finds.
        std::fs::create_dir(dir.join("lib")).unwrap();
        std::os::unix::fs::symlink("/dev/stderr", dir.join("lib/libfoo.a")).unwrap();
        assert!(names_caller_descriptors(&args(&["a.o", "-Lnone", "-Llib", "-lfoo"]), &dir));
        assert!(names_caller_descriptors(&args(&["a.o", "-L", "lib", "--library=foo"]), &dir));
        assert!(!names_caller_descriptors(&args(&["a.o", "-Llib", "-lbar"]), &dir));
        assert!(names_caller_descriptors(&args(&["a.o", "-L=lib", "-l=foo"]), &dir), "-L=dir, -l=name");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_foreign_nvvmpath_is_recognised() {
        let home = std::env::temp_dir().join(format!("nvlinkd-nvvm-{}", std::process::id()));
        std::fs::create_dir_all(home.join("nvvm")).unwrap();
        std::fs::create_dir_all(home.join("fake")).unwrap();
        let cwd = home.as_path();
        let own = Some(cwd);
        assert!(!foreign_nvvm(&args(&["-dlto", "a.o"]), cwd, own), "no -nvvmpath");
        assert!(!foreign_nvvm(&args(&["-nvvmpath=nvvm", "-dlto"]), cwd, own));
        assert!(!foreign_nvvm(&args(&["--nvvmpath", "./nvvm/"]), cwd, own));
        assert!(foreign_nvvm(&args(&["-nvvmpath=fake"]), cwd, own));
        assert!(foreign_nvvm(&args(&["-nvvmpath", "missing"]), cwd, own));
        assert!(foreign_nvvm(&args(&["-nvvmpath=nvvm"]), cwd, None), "no toolkit to compare with");
        let _ = std::fs::remove_dir_all(&home);
    }

    #[test]
    fn host_linker_scripts_are_recognised() {
        let cwd = Path::new("/nonexistent");
        for yes in [&["-ghls"][..], &["--gen-host-linker-script=lcs-aug", "-o", "x"], &["-v", "-ghls", "lcs-abs"]] {
            assert!(host_linker_script(&args(yes), cwd), "{yes:?}");
        }
        for no in [&["--arch=sm_90", "a.o"][..], &["ghls"], &["-o", "ghls.ld"]] {
            assert!(!host_linker_script(&args(no), cwd), "{no:?}");
        }
    }
}
