//! Which toolkit this `nvlinkd` stands for when no `--cuda-home` names one
//! (`serve`, `start`, `exec`): a daemon never runs without a usable toolkit,
//! since every link of one without would fall back to the real nvlink,
//! silently, until it idled out.
//!
//! In order: the record of the overlay (or in-place install) this `nvlinkd`
//! belongs to, as the shim reads it; `CUDA_HOME`; the toolkit of the first
//! `nvlink` on `PATH` that belongs to one (an overlay's or in-place shim by
//! its record, else the directory above its `bin/`); `/usr/local/cuda`. A
//! record or a `CUDA_HOME` that names no toolkit is an error, not a reason to
//! look further: it was meant.

use std::path::{Path, PathBuf};

use nvlinkd_proto::paths::OverlayRecord;

/// Where a toolkit was found, in words (for messages).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub root: PathBuf,
    pub how: String,
}

/// The last place looked: the toolkit's conventional root.
pub const CONVENTIONAL: &str = "/usr/local/cuda";

/// A toolkit root: its `bin/nvlink` and `bin/ptxas` are files (the daemon runs
/// both). Asking for ptxas too keeps a stray `~/bin/nvlink` (the shim copied
/// there, say) from making `~` a "toolkit".
fn is_toolkit(root: &Path) -> bool {
    root.join("bin/nvlink").is_file() && root.join("bin/ptxas").is_file()
}

/// The toolkit this `nvlinkd` stands for; Err says where it looked and how to
/// name one.
pub fn find() -> Result<Found, String> {
    let record = OverlayRecord::of_current_exe();
    let cuda_home = std::env::var_os("CUDA_HOME").filter(|v| !v.is_empty()).map(PathBuf::from);
    let path = std::env::var_os("PATH").unwrap_or_default();
    find_in(record, cuda_home, &path, Path::new(CONVENTIONAL))
}

fn find_in(
    record: Option<OverlayRecord>,
    cuda_home: Option<PathBuf>,
    path: &std::ffi::OsStr,
    conventional: &Path,
) -> Result<Found, String> {
    if let Some(root) = record.and_then(|r| r.cuda_home) {
        if !root.join("bin/nvlink").is_file() {
            return Err(format!(
                "the toolkit this overlay was installed for, {}, has no bin/nvlink (install the overlay again, \
                 or give --cuda-home DIR)",
                root.display()
            ));
        }
        return Ok(Found { root, how: "this overlay's toolkit".into() });
    }
    if let Some(root) = cuda_home {
        if !root.join("bin/nvlink").is_file() {
            return Err(format!(
                "CUDA_HOME={} is not a CUDA toolkit (no bin/nvlink): set it to the toolkit's root, or give \
                 --cuda-home DIR",
                root.display()
            ));
        }
        return Ok(Found { root, how: "CUDA_HOME".into() });
    }
    for dir in std::env::split_paths(path).filter(|d| d.is_absolute()) {
        let nvlink = dir.join("nvlink");
        if !nvlink.is_file() {
            continue;
        }
        let root = match OverlayRecord::of_executable(&nvlink).and_then(|r| r.cuda_home) {
            Some(root) => root,
            None => match dir.parent() {
                Some(up) => up.to_path_buf(),
                None => continue,
            },
        };
        if is_toolkit(&root) {
            return Ok(Found { root, how: format!("the toolkit of {} (on PATH)", nvlink.display()) });
        }
    }
    if is_toolkit(conventional) {
        return Ok(Found { root: conventional.to_path_buf(), how: conventional.display().to_string() });
    }
    Err(format!(
        "no CUDA toolkit: none given (--cuda-home), no CUDA_HOME, no toolkit's nvlink on PATH, none at {}; give \
         --cuda-home DIR or set CUDA_HOME=DIR, DIR being the toolkit whose nvlink this daemon stands in for \
         (the directory holding bin/nvlink)",
        conventional.display()
    ))
}

/// The toolkits `serve` and `start` run with: the `--cuda-home` roots, each a
/// toolkit with an nvlink, else the one [`find`] finds.
pub fn usable(given: &[PathBuf]) -> Result<Vec<PathBuf>, String> {
    if given.is_empty() {
        return find().map(|f| vec![f.root]);
    }
    match given.iter().find(|r| !r.join("bin/nvlink").is_file()) {
        Some(bad) => Err(format!(
            "--cuda-home {}: not a CUDA toolkit (no bin/nvlink); give the toolkit's root, the directory holding \
             bin/nvlink",
            bad.display()
        )),
        None => Ok(given.to_vec()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toolkit(root: &Path) {
        std::fs::create_dir_all(root.join("bin")).unwrap();
        std::fs::write(root.join("bin/nvlink"), b"").unwrap();
        std::fs::write(root.join("bin/ptxas"), b"").unwrap();
    }

    /// The overlay's record, then CUDA_HOME, then the first nvlink on PATH
    /// that belongs to a toolkit (a shim by its record), then the
    /// conventional root; a record or CUDA_HOME naming no toolkit is an error.
    #[test]
    fn the_toolkit_is_found_where_a_user_would_look() {
        let base = std::env::temp_dir().join(format!("nvlinkd-find-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let (a, b, usr) = (base.join("a"), base.join("b"), base.join("usr-local-cuda"));
        for t in [&a, &b, &usr] {
            toolkit(t);
        }
        // An overlay: its bin/nvlink is a shim, its record names toolkit b.
        let overlay = base.join("overlay");
        std::fs::create_dir_all(overlay.join("bin")).unwrap();
        std::fs::write(overlay.join("bin/nvlink"), b"").unwrap();
        let rec = OverlayRecord { cuda_home: Some(b.clone()), ..Default::default() };
        std::fs::write(overlay.join(nvlinkd_proto::paths::OVERLAY_RECORD), rec.to_text()).unwrap();
        // A directory with an nvlink that is no toolkit's (a build's target/debug).
        let stray = base.join("target/debug");
        std::fs::create_dir_all(&stray).unwrap();
        std::fs::write(stray.join("nvlink"), b"").unwrap();
        let path = |dirs: &[&Path]| std::env::join_paths(dirs).unwrap();
        let root = |r: Result<Found, String>| r.map(|f| f.root);
        let none = base.join("none");

        let rec_a = OverlayRecord { cuda_home: Some(a.clone()), ..Default::default() };
        assert_eq!(root(find_in(Some(rec_a), Some(b.clone()), &path(&[]), &none)), Ok(a.clone()));
        assert_eq!(root(find_in(None, Some(b.clone()), &path(&[&a.join("bin")]), &none)), Ok(b.clone()));
        assert_eq!(root(find_in(None, None, &path(&[&stray, &a.join("bin")]), &none)), Ok(a.clone()));
        assert_eq!(root(find_in(None, None, &path(&[&overlay.join("bin"), &a.join("bin")]), &none)), Ok(b.clone()));
        assert_eq!(root(find_in(None, None, &path(&[&stray]), &usr)), Ok(usr.clone()));
        let refused = find_in(None, None, &path(&[&stray]), &none).unwrap_err();
        assert!(refused.contains("--cuda-home DIR") && refused.contains("CUDA_HOME"), "{refused}");
        let bad = OverlayRecord { cuda_home: Some(none.clone()), ..Default::default() };
        assert!(find_in(Some(bad), Some(a.clone()), &path(&[]), &usr).is_err(), "a record naming no toolkit");
        assert!(find_in(None, Some(none.clone()), &path(&[&a.join("bin")]), &usr).is_err(), "CUDA_HOME naming none");
        assert!(usable(&[none]).unwrap_err().contains("not a CUDA toolkit"));
        assert_eq!(usable(std::slice::from_ref(&a)), Ok(vec![a]));
        std::fs::remove_dir_all(&base).unwrap();
    }
}
