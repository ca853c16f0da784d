//! An overlay's paths in nvlink's arguments, written as the toolkit's own.
//!
//! nvcc derives paths from the location it was run from (`nvcc.profile`'s
//! `TOP = $(_HERE_)/..`): run as `<overlay>/bin/nvcc`, it passes nvlink
//! `-L<overlay>/bin/../lib/stubs`, `-L<overlay>/bin/../lib` and, for `-dlto`,
//! `-nvvmpath=<overlay>/bin/../nvvm`. nvlink records its options in every
//! cubin (`.note.nv.tkinfo`), so the overlay build's device code would differ
//! from the same build through the toolkit (`<toolkit>/bin/../lib`...).
//!
//! The shim of an overlay therefore rewrites, before anything else (the daemon
//! and the real nvlink both get the rewritten arguments), each argument path
//! that starts with the overlay (`<overlay>/bin/../…`, or the overlay's own
//! root) into the same path under the toolkit's root as `install` was given it
//! (its record's `CUDA_HOME_NAMED`), and only where both provably name the same
//! place: the text before `/bin/..` must be the directory holding this shim's
//! record, and the old and the new path must resolve to the same file (or,
//! where it does not exist, their nearest existing ancestors must be the same
//! directory with the same names below it). Anything else stays as written.
//!
//! The values are taken where nvcc and users put paths: a whole argument, the
//! value glued to `-L`, the value after the first `=`. Options files are not
//! rewritten: nvcc expands its own and never writes one for nvlink.

use std::path::{Component, Path, PathBuf};

use nvlinkd_proto::paths::OverlayRecord;

#[derive(Debug)]
pub struct Remap {
    /// The overlay's root, canonical (the directory holding the record).
    root: PathBuf,
    /// The toolkit's root as named at install (what replaces the overlay's).
    toolkit: String,
}

impl Remap {
    /// The rewrite of the overlay this shim belongs to; none for a shim that
    /// is not an overlay's (an in-place one, or one run on its own).
    pub fn of_current_exe() -> Option<Remap> {
        let exe = std::env::current_exe().ok()?;
        let (dir, record) = OverlayRecord::found_for(&exe)?;
        // An overlay's record is in the directory above the shim's bin/.
        if Some(dir.as_path()) != exe.parent().and_then(Path::parent) {
            return None;
        }
        Remap::new(&dir, &record)
    }

    pub fn new(overlay: &Path, record: &OverlayRecord) -> Option<Remap> {
        let toolkit = record.cuda_home_named.as_ref().or(record.cuda_home.as_ref())?;
        Some(Remap { root: overlay.canonicalize().ok()?, toolkit: toolkit.to_str()?.trim_end_matches('/').to_owned() })
    }

    /// `args` with the overlay's paths written as the toolkit's, resolved
    /// against `cwd`.
    pub fn args(&self, args: &[String], cwd: &Path) -> Vec<String> {
        args.iter().map(|a| self.arg(a, cwd).unwrap_or_else(|| a.clone())).collect()
    }

    fn arg(&self, arg: &str, cwd: &Path) -> Option<String> {
        let mut starts = vec![0];
        if arg.starts_with("-L") && arg.len() > 2 {
            starts.push(2);
        }
        if let Some(eq) = arg.find('=') {
            starts.push(eq + 1);
        }
        starts.into_iter().find_map(|s| self.path(&arg[s..], cwd).map(|p| format!("{}{p}", &arg[..s])))
    }

    /// `path` rewritten, when it starts with the overlay and the rewrite names
    /// the same place.
    fn path(&self, path: &str, cwd: &Path) -> Option<String> {
        let root = self.root.to_str()?;
        let mut heads: Vec<&str> = Vec::new();
        if path.strip_prefix(root).is_some_and(|rest| rest.is_empty() || rest.starts_with('/')) {
            heads.push(root);
        }
        // nvcc's `<dir>/bin/..`: the first one names nvcc's directory.
        if let Some(j) = find_bin_up(path) {
            heads.push(&path[..j]);
        }
        for head in heads {
            let dir = match head.trim_end_matches('/') {
                "" if head.is_empty() => cwd.to_path_buf(),
                "" => PathBuf::from("/"),
                h => cwd.join(h),
            };
            if dir.canonicalize().ok().as_deref() != Some(self.root.as_path()) {
                continue;
            }
            let rest = &path[head.len()..];
            let sep = if head.is_empty() || head.ends_with('/') { "/" } else { "" };
            let new = format!("{}{sep}{rest}", self.toolkit);
            if same_place(&cwd.join(path), &cwd.join(&new)) {
                return Some(new);
            }
        }
        None
    }
}

/// Where the first `bin/..` component pair starts in `path`.
fn find_bin_up(path: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(i) = path[from..].find("bin/..").map(|i| i + from) {
        let before_ok = i == 0 || path.as_bytes()[i - 1] == b'/';
        let after = &path[i + "bin/..".len()..];
        if before_ok && (after.is_empty() || after.starts_with('/')) {
            return Some(i);
        }
        from = i + 1;
    }
    None
}

/// Whether `a` and `b` name the same place: they resolve to the same file, or
/// neither exists and, their last components being equal, their parents do.
fn same_place(a: &Path, b: &Path) -> bool {
    let (mut a, mut b) = (a.to_path_buf(), b.to_path_buf());
    loop {
        match (a.canonicalize(), b.canonicalize()) {
            (Ok(x), Ok(y)) => return x == y,
            (Err(_), Err(_)) => {}
            _ => return false,
        }
        let (la, lb) = (a.components().next_back(), b.components().next_back());
        if la != lb || !matches!(la, Some(Component::Normal(_) | Component::ParentDir)) {
            return false;
        }
        a.pop_component();
        b.pop_component();
    }
}

trait PopComponent {
    fn pop_component(&mut self);
}

impl PopComponent for PathBuf {
    /// Drop the last component as written, `..` included.
    fn pop_component(&mut self) {
        let mut c = self.components();
        c.next_back();
        *self = c.as_path().to_path_buf();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// A toolkit and an overlay of it (symlinked entries, its own bin/): nvcc's
    /// paths under the overlay, however written, become the toolkit's as
    /// named; paths outside it, or naming another place, stay.
    #[test]
    fn overlay_paths_become_the_toolkits_only_where_they_name_the_same_place() {
        let base = std::env::temp_dir().join(format!("nvlinkd-remap-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let real = base.join("cuda-13.5");
        for d in ["bin", "lib/stubs", "nvvm"] {
            std::fs::create_dir_all(real.join(d)).unwrap();
        }
        let named = base.join("cuda");
        symlink(&real, &named).unwrap();
        let ovl = base.join("ovl");
        std::fs::create_dir_all(ovl.join("bin")).unwrap();
        for e in ["lib", "nvvm"] {
            symlink(named.join(e), ovl.join(e)).unwrap();
        }
        std::fs::create_dir(ovl.join("own")).unwrap();
        let rec =
            OverlayRecord { cuda_home: Some(real.clone()), cuda_home_named: Some(named.clone()), ..Default::default() };
        let r = Remap::new(&ovl, &rec).unwrap();
        let n = named.display().to_string();
        let o = ovl.display().to_string();
        let args: Vec<String> = [
            format!("-L{o}/bin/../lib/stubs"),
            format!("-L{o}/bin/../lib"),
            "-Lovl/bin/../lib64".into(),
            "-Lovl/bin/../lib/none".into(),
            "-nvvmpath=ovl/bin/../nvvm".into(),
            format!("{o}/lib/stubs"),
            format!("{o}/own"),
            format!("-L{}/bin/../lib", real.display()),
            "a.o".into(),
            "-o".into(),
            "/tmp/x/bin/../y.cubin".into(),
        ]
        .into();
        let got = r.args(&args, &base);
        let want: Vec<String> = [
            format!("-L{n}/bin/../lib/stubs"),
            format!("-L{n}/bin/../lib"),
            // Neither has lib64, but the roots differ: nothing proves it the same.
            "-Lovl/bin/../lib64".into(),
            // The same missing name in the same directory.
            format!("-L{n}/bin/../lib/none"),
            format!("-nvvmpath={n}/bin/../nvvm"),
            format!("{n}/lib/stubs"),
            // The overlay's own entry is not the toolkit's.
            format!("{o}/own"),
            format!("-L{}/bin/../lib", real.display()),
            "a.o".into(),
            "-o".into(),
            "/tmp/x/bin/../y.cubin".into(),
        ]
        .into();
        assert_eq!(got, want);
        let _ = std::fs::remove_dir_all(&base);
    }
}
