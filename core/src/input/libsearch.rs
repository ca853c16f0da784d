//! Library search: `-l name` finds `lib<name>.a` in the `-L` directories, in
//! order, then in the directories of `LIBRARY_PATH` (colon-separated).

use std::path::{Path, PathBuf};

use crate::fs::{absolute, InputFs};

/// The directories searched for `-l`, in order.
pub fn search_dirs(cwd: &Path, library_paths: &[String], env_library_path: Option<&str>) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = library_paths.iter().map(|p| absolute(cwd, p)).collect();
    if let Some(lp) = env_library_path {
        dirs.extend(lp.split(':').filter(|d| !d.is_empty()).map(|d| absolute(cwd, d)));
    }
    dirs
}

/// Find `lib<name>.a`; returns the path as nvlink would name it in messages
/// (directory as given, joined with the file name) and the absolute path.
pub fn find(fs: &dyn InputFs, dirs: &[PathBuf], name: &str) -> Option<PathBuf> {
    let file = format!("lib{name}.a");
    dirs.iter().map(|d| d.join(&file)).find(|p| fs.stat(p).map(|s| !s.is_dir).unwrap_or(false))
}
