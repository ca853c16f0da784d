//! One line on stderr when the daemon hands a link back for a reason the user
//! can fix (`LinkResult.fixable`): the daemon has no toolkit of this nvlink's
//! release, or the link's inputs exceed its `--max-link-input`. Said once per
//! daemon (a restarted daemon is a new one) and reason, remembered in the
//! shim's private runtime directory (`warned-<daemon>-<reason>`, an empty
//! file); where there is no such directory, nothing is said rather than said
//! on every link. Never for the fallbacks that are nvlink's normal routing,
//! and never on stdout: nvlink's output and exit status stay nvlink's.
//!
//! The lines (README, "The shim"):
//!
//! ```text
//! nvlinkd: warning: the daemon has no toolkit of this nvlink's release (12.9, V12.9.99), so the real nvlink linked; fix: `nvlinkd stop` (the next link starts a daemon for /opt/cuda-12.9), or one daemon with both toolkits (--cuda-home twice) (said once per daemon)
//! nvlinkd: warning: this link's inputs exceed the daemon's --max-link-input, so the real nvlink linked; fix: `nvlinkd stop`, then `nvlinkd start --max-link-input SIZE` with a larger SIZE (said once per daemon)
//! ```
//!
//! (With `NVLINKD_ADDR`, the fix is to ask the daemon's operator.)

use std::path::Path;

use nvlinkd_proto::paths;

use crate::toolkit::Toolkit;

/// A fallback the daemon named as fixable.
#[derive(Debug, Clone)]
pub struct Fixable {
    /// `toolkit` or `budget` (others are ignored: a newer daemon's).
    pub what: String,
    /// The daemon process (`LinkResult.daemon`).
    pub daemon: String,
}

/// Say `f` on stderr, unless it was said for this daemon before.
pub fn once(f: &Fixable, tk: &Toolkit, remote: bool) {
    let Some(line) = line(f, tk, remote) else { return };
    // Daemon names are hex (a daemon that sends another is not warned about).
    let name_ok = !f.daemon.is_empty() && f.daemon.len() <= 64 && f.daemon.bytes().all(|b| b.is_ascii_hexdigit());
    if !name_ok {
        return;
    }
    let Some(dir) = paths::private_runtime_dir() else { return };
    if first_time(&dir.join(format!("warned-{}-{}", f.daemon, f.what))) {
        eprintln!("{line}");
    }
}

/// The warning for `f`, or None for a reason this shim does not know. Its
/// words are the shim's own (a daemon's text is not echoed).
fn line(f: &Fixable, tk: &Toolkit, remote: bool) -> Option<String> {
    let (why, fix) = match f.what.as_str() {
        "toolkit" => {
            let release = tk.release();
            let release = release
                .as_deref()
                .and_then(|r| r.lines().next())
                .and_then(|l| l.strip_prefix("Cuda compilation tools, release "))
                .map(|r| format!(" ({r})"))
                .unwrap_or_default();
            let why = format!("the daemon has no toolkit of this nvlink's release{release}");
            let fix = if remote {
                "ask the daemon's operator to add this release (--cuda-home)".to_string()
            } else {
                let home = tk.cuda_home.as_deref().map_or("this toolkit".into(), |h| h.display().to_string());
                format!("`nvlinkd stop` (the next link starts a daemon for {home}), or one daemon with both toolkits (--cuda-home twice)")
            };
            (why, fix)
        }
        "budget" => {
            let why = "this link's inputs exceed the daemon's --max-link-input".to_string();
            let fix = if remote {
                "ask the daemon's operator for a larger --max-link-input".to_string()
            } else {
                "`nvlinkd stop`, then `nvlinkd start --max-link-input SIZE` with a larger SIZE".to_string()
            };
            (why, fix)
        }
        _ => return None,
    };
    Some(format!("nvlinkd: warning: {why}, so the real nvlink linked; fix: {fix} (said once per daemon)"))
}

/// Creates `memo` (never through a symlink); true when this call made it.
fn first_time(memo: &Path) -> bool {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(memo)
        .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_fixable_reason_has_one_line_naming_a_fix() {
        let tk = Toolkit { cuda_home: Some("/opt/cuda-12.9".into()), ..Default::default() };
        let f = |what: &str| Fixable { what: what.into(), daemon: "ab12".into() };
        for (what, remote) in [("toolkit", false), ("toolkit", true), ("budget", false), ("budget", true)] {
            let l = line(&f(what), &tk, remote).expect("a line");
            assert!(!l.contains('\n'), "{l:?}");
            assert!(l.starts_with("nvlinkd: warning: ") && l.contains(", so the real nvlink linked; fix: "), "{l}");
            assert!(l.ends_with("(said once per daemon)"), "{l}");
        }
        assert!(line(&f("toolkit"), &tk, false).unwrap().contains("/opt/cuda-12.9"));
        assert!(line(&f("budget"), &tk, false).unwrap().contains("--max-link-input"));
        assert!(line(&f("something new"), &tk, false).is_none());
    }
}
