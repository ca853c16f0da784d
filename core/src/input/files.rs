//! Every file a link reads, named once: right after its command line is
//! parsed ([`Spec::from_parsed`](crate::cli::spec::Spec::from_parsed)), each
//! input, options file and `-l` search is resolved against the caller's
//! working directory and `LIBRARY_PATH`, and every step that needs a file —
//! the whole-link key (`linkcache.rs`), the plan (`plan.rs`, `load.rs`), the
//! files speculation and `--watch` follow (`speculate.rs`) — reads this value
//! instead of joining paths or searching directories again. A `-l` search
//! lists every candidate in search order; which one nvlink takes is decided
//! by reading them (`load.rs`: skip a tiny file or an archive for another
//! machine, stop at a directory or a file that is no archive), so the key
//! covers every candidate that exists, not only the first.

use std::path::{Path, PathBuf};

use crate::cli::parse::Parsed;
use crate::fs::absolute;
use crate::input::libsearch;

/// A file as the command line names it, and where it is.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Named {
    /// As nvlink shows it (typed; a library candidate as nvlink builds it).
    pub given: String,
    /// Absolute, against the caller's working directory.
    pub path: PathBuf,
}

impl Named {
    /// `given` resolved against the caller's working directory `cwd`.
    pub fn resolved(cwd: &Path, given: &str) -> Named {
        Named { given: given.to_owned(), path: absolute(cwd, given) }
    }
}

/// The files a link writes, resolved once: every step that writes, stores,
/// claims or compares an output uses these paths.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Written {
    /// `-o`.
    pub output: Option<Named>,
    /// `--register-link-binaries`.
    pub register: Option<Named>,
    /// `-time FILE`, whose table is appended (not `-time -`, stdout).
    pub time: Option<Named>,
    /// `--uidx-file`, which nvlink reads before any input.
    pub uidx: Option<Named>,
}

/// One `-l name`: every candidate, in the order nvlink tries them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LibrarySearch {
    pub name: String,
    pub candidates: Vec<Named>,
}

/// Every file a link reads (besides the toolkit's), named once.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LinkFiles {
    /// The inputs, in command-line order.
    pub inputs: Vec<Named>,
    /// The `-l` searches, in command-line order.
    pub libraries: Vec<LibrarySearch>,
    /// The options files (`-optf`), in the order read.
    pub options_files: Vec<Named>,
    /// The directories `-l` searches, in order (`-L`, then `LIBRARY_PATH`);
    /// each search's candidates follow this order.
    pub search_dirs: Vec<Named>,
    /// What the link writes.
    pub written: Written,
}

impl LinkFiles {
    /// Resolve what `parsed` names against `cwd` and the caller's
    /// `LIBRARY_PATH`; `written`, what the link writes, already resolved.
    pub fn of(
        parsed: &Parsed,
        library_paths: &[String],
        libraries: &[String],
        cwd: &Path,
        library_path: Option<&str>,
        written: Written,
    ) -> LinkFiles {
        let named = |given: &str| Named::resolved(cwd, given);
        let dirs = libsearch::search_dirs(library_paths, library_path);
        LinkFiles {
            inputs: parsed.inputs.iter().map(|i| named(i)).collect(),
            libraries: libraries
                .iter()
                .map(|name| LibrarySearch {
                    name: name.clone(),
                    candidates: dirs.iter().map(|d| named(&libsearch::candidate(d, name))).collect(),
                })
                .collect(),
            options_files: parsed.options_files.iter().map(|f| named(f)).collect(),
            search_dirs: dirs.iter().map(|d| named(d)).collect(),
            written,
        }
    }

    /// The inputs' absolute paths.
    pub fn input_paths(&self) -> Vec<PathBuf> {
        self.inputs.iter().map(|n| n.path.clone()).collect()
    }

    /// Every path the link may read: inputs, every library candidate,
    /// options files.
    pub fn every_path(&self) -> impl Iterator<Item = &Path> {
        self.inputs
            .iter()
            .chain(self.libraries.iter().flat_map(|l| &l.candidates))
            .chain(&self.options_files)
            .map(|n| n.path.as_path())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_file_is_named_once_with_its_path() {
        let args: Vec<String> =
            ["a.o", "/abs/b.o", "-Llib/", "-L/sys", "-lm", "-lz"].iter().map(|s| s.to_string()).collect();
        let parsed = crate::cli::parse::parse(&args, &crate::fs::LocalFs, Path::new("/w")).unwrap();
        let spec = crate::cli::spec::Spec::from_parsed(parsed, Path::new("/w"), Some(":/env")).unwrap();
        let f = &spec.files;
        assert_eq!(f.inputs[0], Named { given: "a.o".into(), path: "/w/a.o".into() });
        assert_eq!(f.inputs[1].path, PathBuf::from("/abs/b.o"));
        let m = &f.libraries[0];
        assert_eq!(m.name, "m");
        let given: Vec<&str> = m.candidates.iter().map(|c| c.given.as_str()).collect();
        assert_eq!(given, ["lib/libm.a", "/sys/libm.a", "/env/libm.a"]);
        assert_eq!(m.candidates[0].path, PathBuf::from("/w/lib/libm.a"));
        let dirs: Vec<&str> = f.search_dirs.iter().map(|d| d.given.as_str()).collect();
        assert_eq!(dirs, ["lib/", "/sys", "/env"]);
        assert_eq!(f.every_path().count(), 2 + 6);
    }

    /// The options files a link reads are named too, nested ones included,
    /// each once (a change to any of them changes the link).
    #[test]
    fn options_files_are_named_nested_ones_too() {
        let dir = std::env::temp_dir().join(format!("nvlinkd-files-optf-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("outer.opts"), "a.o -optf inner.opts -optf inner.opts").unwrap();
        std::fs::write(dir.join("inner.opts"), "-arch=sm_90").unwrap();
        let args: Vec<String> = ["-optf", "outer.opts", "b.o"].iter().map(|s| s.to_string()).collect();
        let parsed = crate::cli::parse::parse(&args, &crate::fs::LocalFs, &dir).unwrap();
        let spec = crate::cli::spec::Spec::from_parsed(parsed, &dir, None).unwrap();
        let named: Vec<(&str, PathBuf)> =
            spec.files.options_files.iter().map(|n| (n.given.as_str(), n.path.clone())).collect();
        assert_eq!(named, [("outer.opts", dir.join("outer.opts")), ("inner.opts", dir.join("inner.opts"))]);
        assert_eq!(spec.files.every_path().count(), 2 + 2);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
