//! The nvlink command line: the option table ([`options`]), the grammar
//! ([`parse`]), the typed link specification with nvlink's mode dispatch
//! ([`spec`]), and the link target and its arch rules ([`target`]).

pub mod options;
pub mod parse;
pub mod render;
pub mod spec;
pub mod target;

/// What a command line names as a file it writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Written {
    /// `-o X`, `-oX`, `-o=X`, `--output-file X`, `--output-file=X`.
    Output,
    /// `--register-link-binaries X` (and `=X`).
    Registration,
}

/// The files a command line names as written, in order, as typed (not
/// resolved, possibly empty): a quick scan of the raw arguments for callers
/// that have no parsed [`spec::Spec`] (the daemon's events and messages).
pub fn written_files(args: &[String]) -> Vec<(Written, &str)> {
    const SPACED: [(&str, Written); 5] = [
        ("-o", Written::Output),
        ("--output-file", Written::Output),
        ("-output-file", Written::Output),
        ("--register-link-binaries", Written::Registration),
        ("-register-link-binaries", Written::Registration),
    ];
    const JOINED: [(&str, Written); 5] = [
        ("--output-file=", Written::Output),
        ("-output-file=", Written::Output),
        ("-o=", Written::Output),
        ("--register-link-binaries=", Written::Registration),
        ("-register-link-binaries=", Written::Registration),
    ];
    let mut found = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if let Some(&(_, kind)) = SPACED.iter().find(|(name, _)| a == name) {
            if let Some(v) = it.next() {
                found.push((kind, v.as_str()));
            }
        } else if let Some((kind, v)) = JOINED.iter().find_map(|&(p, kind)| a.strip_prefix(p).map(|v| (kind, v))) {
            found.push((kind, v));
        } else if let Some(v) = a.strip_prefix("-o").filter(|v| !v.is_empty() && !a.starts_with("-op")) {
            found.push((Written::Output, v));
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_files_are_found_in_every_spelling() {
        let args: Vec<String> =
            ["-o", "a", "-ob", "--output-file=c", "-o=d", "--register-link-binaries", "r.c", "-optf", "f", "x.o"]
                .map(String::from)
                .to_vec();
        assert_eq!(
            written_files(&args),
            [
                (Written::Output, "a"),
                (Written::Output, "b"),
                (Written::Output, "c"),
                (Written::Output, "d"),
                (Written::Registration, "r.c")
            ]
        );
    }
}
