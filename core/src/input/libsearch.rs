//! Library search: `-l name` looks for `lib<name>.a` in every `-L` directory,
//! in command-line order, then in the entries of `LIBRARY_PATH` (split on `:`;
//! empty entries mean nothing, not the current directory). Paths are shown as
//! typed, with trailing slashes removed.

/// The directories searched for `-l`, in order, as typed.
pub(crate) fn search_dirs(library_paths: &[String], env_library_path: Option<&str>) -> Vec<String> {
    let mut dirs: Vec<String> = library_paths.iter().filter(|d| !d.is_empty()).cloned().collect();
    if let Some(lp) = env_library_path {
        dirs.extend(lp.split(':').filter(|d| !d.is_empty()).map(str::to_owned));
    }
    dirs
}

/// The candidate for `-l name` in `dir`, as nvlink names it.
pub(crate) fn candidate(dir: &str, name: &str) -> String {
    let trimmed = dir.trim_end_matches('/');
    let dir = if trimmed.is_empty() && dir.starts_with('/') { "" } else { trimmed };
    format!("{dir}/lib{name}.a")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_keep_the_typed_path() {
        assert_eq!(candidate("c//", "b2"), "c/libb2.a");
        assert_eq!(candidate("./c/", "b2"), "./c/libb2.a");
        assert_eq!(candidate("c/../c", "b2"), "c/../c/libb2.a");
        assert_eq!(search_dirs(&["a".into(), "".into()], Some(":b::c")), vec!["a", "b", "c"]);
    }
}
