//! What a remote link's `Start` announces: the files this shim would serve,
//! each with its stat and the BLAKE3 digest of its contents (`Start.files`).
//!
//! A remote daemon answers stats from the announcement and reads each file
//! from its blob store by digest, asking this shim only for the blobs it
//! lacks (and checking each against its digest): a warm relink sends no input
//! bytes and costs no round trip per file. Announced are the paths the command
//! line names (`policy.rs`; outputs by stat only) and, for each `-l`, its
//! candidates along `-L` and `LIBRARY_PATH` up to the one nvlink takes —
//! missing paths as missing, so the daemon's library search needs no round
//! trip either. Anything else the daemon still asks for by path.
//!
//! Digests are remembered in the per-user runtime directory by file identity
//! (device, inode, size, mtime, ctime), as the daemon's `HashMemo` does, once
//! a file has been unchanged for two seconds: an unchanged input is stat'ed,
//! not read. A unix-socket link announces nothing (that daemon reads the
//! files itself).

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use nvlinkd_proto::paths;
use nvlinkd_proto::v1::AnnouncedFile;

use nvlinkd_proto::policy::Policy;

/// Largest file announced by digest (what the shim serves at most).
const MAX_FILE: u64 = 4 << 30;
/// Most paths announced (what a daemon accepts).
const MAX_PATHS: usize = nvlinkd_proto::MAX_ANNOUNCED_FILES;
/// What one announcement costs in the message besides its path (an estimate
/// on the safe side: digest, numbers, framing).
const ENTRY_BYTES: usize = 64;
/// Digests the memo file keeps.
const MEMO_ENTRIES: usize = 8192;
/// How long a file must be unchanged before its digest is remembered.
const SETTLED_NS: i128 = 2_000_000_000;

/// The identity a digest is remembered under.
type Identity = (u64, u64, u64, i128, i128);

fn identity(m: &std::fs::Metadata) -> Identity {
    let ns = |s: i64, n: i64| i128::from(s) * 1_000_000_000 + i128::from(n);
    (m.dev(), m.ino(), m.size(), ns(m.mtime(), m.mtime_nsec()), ns(m.ctime(), m.ctime_nsec()))
}

/// The announcement of a link of `policy`'s command line in `cwd`, in at most
/// `room` bytes of the `Start` message (which is bounded): paths beyond are
/// not announced (the daemon asks for them by path).
pub fn files(policy: &Policy, cwd: &Path, room: usize) -> Vec<AnnouncedFile> {
    let mut memo = Memo::load();
    let mut out: Vec<AnnouncedFile> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut used = 0usize;
    let mut add = |path: &Path, out: &mut Vec<AnnouncedFile>, memo: &mut Memo| -> Option<std::fs::Metadata> {
        let m = std::fs::metadata(path);
        let Some(text) = path.to_str() else { return m.ok() };
        // By the name's bytes: `x` and `x/` are two names (the second fails).
        if !seen.insert(path.as_os_str().to_owned()) || out.len() >= MAX_PATHS || used + text.len() + ENTRY_BYTES > room
        {
            return m.ok();
        }
        let entry = match &m {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                AnnouncedFile { path: text.to_owned(), exists: false, ..Default::default() }
            }
            // Other errors (permissions): asked for by path, answered then.
            Err(_) => return None,
            Ok(m) if m.is_dir() => {
                AnnouncedFile { path: text.to_owned(), exists: true, is_dir: true, size: m.len(), blake3: vec![] }
            }
            // FIFOs, devices: asked for by path (the daemon then declines).
            Ok(m) if !m.is_file() => return Some(m.clone()),
            Ok(m) => {
                let digest = if policy.is_output(path) || m.len() > MAX_FILE { None } else { memo.digest(path, m) };
                let blake3 = digest.map(|d| d.to_vec()).unwrap_or_default();
                AnnouncedFile { path: text.to_owned(), exists: true, is_dir: false, size: m.len(), blake3 }
            }
        };
        used += text.len() + ENTRY_BYTES;
        out.push(entry);
        m.ok()
    };
    for path in policy.named() {
        add(path, &mut out, &mut memo);
    }
    library_candidates(policy, cwd, |path| add(path, &mut out, &mut memo));
    memo.save();
    out
}

/// `-l name`: its candidates in search order, up to the one nvlink takes
/// (a directory, or a file of more than 8 bytes; smaller ones are skipped),
/// each given to `visit`, which answers its metadata.
fn library_candidates(policy: &Policy, cwd: &Path, mut visit: impl FnMut(&Path) -> Option<std::fs::Metadata>) {
    let (dirs, libs) = policy.libraries();
    for name in libs {
        for dir in dirs {
            let trimmed = dir.trim_end_matches('/');
            let dir = if trimmed.is_empty() && dir.starts_with('/') { "" } else { trimmed };
            let path = cwd.join(format!("{dir}/lib{name}.a"));
            match visit(&path) {
                Some(m) if m.is_dir() || m.len() > 8 => break,
                _ => {}
            }
        }
    }
}

/// Two names of one regular file (a symlink, a hard link, a directory named
/// through a symlink) among the files a link of `policy` reads or writes.
/// nvlink takes such a file once (an archive named twice links once); a
/// remote daemon has the names only, and its sandbox would hold two files:
/// such a link is the real nvlink's, here.
pub fn one_file_twice(policy: &Policy, cwd: &Path) -> Option<(PathBuf, PathBuf)> {
    let mut names: HashMap<(u64, u64), PathBuf> = HashMap::new();
    let mut found = None;
    let mut visit = |path: &Path| {
        let m = std::fs::metadata(path).ok()?;
        if m.is_file() && found.is_none() {
            match names.get(&(m.dev(), m.ino())) {
                // One spelling of one place (`./a.o`, `a.o`) is one name.
                Some(other) if other != path => found = Some((other.clone(), path.to_owned())),
                Some(_) => {}
                None => {
                    names.insert((m.dev(), m.ino()), path.to_owned());
                }
            }
        }
        Some(m)
    };
    for path in policy.named() {
        visit(path);
    }
    library_candidates(policy, cwd, visit);
    found
}

/// Digests by file identity, in `<runtime dir>/digests`.
struct Memo {
    file: Option<PathBuf>,
    known: HashMap<Identity, [u8; 32]>,
    /// Digests computed by this link that may be remembered.
    new: Vec<(Identity, [u8; 32])>,
}

impl Memo {
    /// The memo of this user's runtime directory, if it is this user's own
    /// and writable by nobody else (a digest read from it names contents).
    fn load() -> Memo {
        let dir = paths::runtime_dir();
        // SAFETY: geteuid cannot fail.
        let me = unsafe { libc::geteuid() };
        let private =
            std::fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir() && m.uid() == me && m.mode() & 0o022 == 0);
        let mut memo = Memo { file: None, known: HashMap::new(), new: Vec::new() };
        if !private {
            return memo;
        }
        let file = dir.join("digests");
        if let Ok(text) = std::fs::read_to_string(&file) {
            for line in text.lines() {
                if let Some((id, d)) = parse(line) {
                    memo.known.insert(id, d);
                }
            }
        }
        memo.file = Some(file);
        memo
    }

    fn digest(&mut self, path: &Path, m: &std::fs::Metadata) -> Option<[u8; 32]> {
        let id = identity(m);
        if let Some(d) = self.known.get(&id) {
            return Some(*d);
        }
        let data = nvlinkd_fs::read_regular(path, MAX_FILE).ok()?;
        let digest = *blake3::hash(&data).as_bytes();
        // Remembered only if the file did not change around the read and has
        // been unchanged long enough that a later write moves its ctime.
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as i128)
            .unwrap_or(0);
        let after = std::fs::metadata(path).map(|m| identity(&m)).ok();
        if after == Some(id) && now - id.3 >= SETTLED_NS && now - id.4 >= SETTLED_NS {
            self.new.push((id, digest));
        }
        Some(digest)
    }

    /// Write the memo again (a temporary file renamed into place) when this
    /// link learned digests; the newest entries are kept.
    fn save(self) {
        let Some(file) = self.file.filter(|_| !self.new.is_empty()) else { return };
        let mut lines: Vec<String> = self.new.iter().map(|(id, d)| line(id, d)).collect();
        let fresh: std::collections::HashSet<Identity> = self.new.iter().map(|(id, _)| *id).collect();
        let old = std::fs::read_to_string(&file).unwrap_or_default();
        lines.extend(old.lines().filter(|l| parse(l).is_some_and(|(id, _)| !fresh.contains(&id))).map(str::to_owned));
        lines.truncate(MEMO_ENTRIES);
        let tmp = file.with_extension(format!("tmp{}", std::process::id()));
        if std::fs::write(&tmp, lines.join("\n") + "\n").is_err() || std::fs::rename(&tmp, &file).is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
    }
}

fn line(id: &Identity, d: &[u8; 32]) -> String {
    let hex: String = d.iter().map(|b| format!("{b:02x}")).collect();
    format!("{} {} {} {} {} {hex}", id.0, id.1, id.2, id.3, id.4)
}

fn parse(line: &str) -> Option<(Identity, [u8; 32])> {
    let mut f = line.split(' ');
    let id = (
        f.next()?.parse().ok()?,
        f.next()?.parse().ok()?,
        f.next()?.parse().ok()?,
        f.next()?.parse().ok()?,
        f.next()?.parse().ok()?,
    );
    let hex = f.next()?;
    if hex.len() != 64 || f.next().is_some() {
        return None;
    }
    let mut d = [0u8; 32];
    for (i, b) in d.iter_mut().enumerate() {
        *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some((id, d))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memo_lines_round_trip() {
        let id: Identity = (1, 2, 3, -4, 1_700_000_000_123_456_789);
        let d = *blake3::hash(b"x").as_bytes();
        assert_eq!(parse(&line(&id, &d)), Some((id, d)));
        assert_eq!(parse("1 2 3 4 5 abc"), None);
        assert_eq!(parse(&(line(&id, &d) + " extra")), None);
    }

    /// Names of one file through a hard link, a symlink or a symlinked `-L`
    /// directory are found; two spellings of one name and two files are not.
    #[test]
    fn two_names_of_one_file_are_found() {
        let dir = std::env::temp_dir().join(format!("nvlink-aliases-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("libmu.a"), b"!<arch>\nmembers").unwrap();
        std::fs::write(dir.join("copy.a"), b"!<arch>\nmembers").unwrap();
        std::fs::hard_link(dir.join("libmu.a"), dir.join("hard.a")).unwrap();
        std::os::unix::fs::symlink("libmu.a", dir.join("sym.a")).unwrap();
        std::os::unix::fs::symlink(".", dir.join("sub")).unwrap();
        let rows: &[(&[&str], bool)] = &[
            (&["libmu.a", "copy.a"], false),
            (&["libmu.a", "./libmu.a"], false),
            (&["libmu.a", "hard.a"], true),
            (&["libmu.a", "sym.a"], true),
            (&["-Lsub", "-lmu", "libmu.a"], true),
            (&["-Lsub", "-lmu", "copy.a"], false),
        ];
        for (args, twice) in rows {
            let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
            let policy = Policy::new(&args, &dir, None, None);
            assert_eq!(one_file_twice(&policy, &dir).is_some(), *twice, "{args:?}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn announces_named_files_outputs_by_stat_and_library_candidates() {
        let dir = std::env::temp_dir().join(format!("nvlink-announce-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("lib")).unwrap();
        std::fs::write(dir.join("a.o"), b"object").unwrap();
        std::fs::write(dir.join("out.cubin"), b"old output").unwrap();
        std::fs::write(dir.join("lib/libm.a"), b"!<arch>\nmembers").unwrap();
        std::fs::create_dir_all(dir.join("cuda/lib")).unwrap();
        std::fs::write(dir.join("cuda/lib/libcudadevrt.a"), b"!<arch>\ndevrt").unwrap();
        let args: Vec<String> =
            ["a.o", "-Lnone", "-Llib", "-Lother", "-lm", "-o", "out.cubin"].iter().map(|s| s.to_string()).collect();
        let policy = Policy::new(&args, &dir, None, Some(&dir.join("cuda")));
        let files = files(&policy, &dir, 1 << 20);
        let get = |p: &str| files.iter().find(|f| Path::new(&f.path) == dir.join(p));
        let a = get("a.o").unwrap();
        assert_eq!((a.exists, a.size, &a.blake3[..]), (true, 6, &blake3::hash(b"object").as_bytes()[..]));
        let out = get("out.cubin").unwrap();
        assert!(out.exists && out.blake3.is_empty(), "an output is announced by stat only");
        assert!(!get("none/libm.a").unwrap().exists);
        assert_eq!(get("lib/libm.a").unwrap().blake3, blake3::hash(b"!<arch>\nmembers").as_bytes().to_vec());
        assert!(get("lib").unwrap().is_dir);
        assert!(get("other/libm.a").is_none(), "a candidate after the one nvlink takes");
        assert!(get("cuda/lib/libcudadevrt.a").is_none(), "a library the command line does not use");
        let few = super::files(&policy, &dir, 3 * (dir.to_str().unwrap().len() + 12 + ENTRY_BYTES));
        assert!(
            !few.is_empty() && few.len() < files.len(),
            "{} of {} announced in a small room",
            few.len(),
            files.len()
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
