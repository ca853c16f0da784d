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

/// Most `-l` × directory lookups the daemon makes for one link. nvlink looks
/// for each library in each directory (10 000 `-L` by 10 000 `-l` is 10^8
/// lookups); a client's command line must not keep the daemon busy that
/// long, so such a link is left to the real nvlink of the caller.
const MAX_LOOKUPS: usize = 100_000;

/// Why a link's library search is past what the daemon does for one link.
pub(crate) fn past_bounds(
    library_paths: &[String],
    env_library_path: Option<&String>,
    libraries: &[String],
) -> Option<String> {
    let dirs = search_dirs(library_paths, env_library_path.map(String::as_str)).len();
    let lookups = dirs.saturating_mul(libraries.len());
    (lookups > MAX_LOOKUPS)
        .then(|| format!("{} libraries in {dirs} directories: past {MAX_LOOKUPS} library lookups", libraries.len()))
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

    #[test]
    fn lookups_past_the_bound_are_named() {
        let dirs: Vec<String> = (0..400).map(|i| format!("d{i}")).collect();
        let libs: Vec<String> = (0..250).map(|i| format!("l{i}")).collect();
        assert!(past_bounds(&dirs, None, &libs[..200]).is_none(), "80 000 lookups");
        let why = past_bounds(&dirs, Some(&"e1:e2".to_owned()), &libs).unwrap();
        assert_eq!(why, "250 libraries in 402 directories: past 100000 library lookups");
    }
}
