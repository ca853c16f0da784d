//! The one bounded read of a regular file, shared by the `nvlink` shim and the
//! daemon's core.
//!
//! Both sides read files of the invoking machine for a link: the shim answers
//! the daemon's file requests over the link's stream, the core reads local
//! inputs (`LocalFs`, `nvlinkd exec`, tests). Both must refuse the same things
//! the same way — nvlink reads a FIFO or a device its own way (a FIFO blocks it,
//! `/dev/zero` gives it one stdio buffer), so such a path is never opened
//! blocking nor read whole, and the link is handed back to the real nvlink. This
//! crate has no dependency but `libc`, so the shim stays small and the core
//! stays free of the gRPC stack.
//!
//! [`owner`] holds the other rule both sides share: whose a file or directory
//! they trust may be, and what other users may do with it.

pub mod owner;

use std::io;
use std::path::Path;

/// The error of a read of something other than a regular file or a directory
/// (a FIFO, a socket, a character or block device).
#[derive(Debug)]
pub struct NotRegular;

impl std::fmt::Display for NotRegular {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("not a regular file")
    }
}

impl std::error::Error for NotRegular {}

/// The io::Error carrying [`NotRegular`].
pub fn not_regular() -> io::Error {
    io::Error::new(io::ErrorKind::Unsupported, NotRegular)
}

/// Whether `e` says the path is not a regular file.
pub fn is_not_regular(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|inner| inner.is::<NotRegular>())
}

/// Read a regular file of at most `max` bytes. Anything else fails without
/// being read: a directory with `IsADirectory`, a FIFO, socket or device with
/// [`NotRegular`] (checked before opening, since opening a FIFO blocks, and
/// again on the opened file, which is opened non-blocking in case the path was
/// replaced in between), a larger file with `FileTooLarge`.
pub fn read_regular(path: &Path, max: u64) -> io::Result<Vec<u8>> {
    let (f, len) = open_regular(path, max)?;
    let mut data = Vec::with_capacity(len as usize);
    read_rest(f, &mut data, max)?;
    Ok(data)
}

/// [`read_regular`] into a shared buffer: the daemon's reads, which keep the
/// contents as `Arc<[u8]>`. A file that keeps its size while it is read is
/// read straight into the buffer (no second copy of its bytes); one that
/// shrinks or grows meanwhile is read as [`read_regular`] reads it.
pub fn read_regular_shared(path: &Path, max: u64) -> io::Result<std::sync::Arc<[u8]>> {
    use std::io::Read;
    use std::os::fd::AsRawFd;
    let (mut f, len) = open_regular(path, max)?;
    let len = usize::try_from(len).map_err(io::Error::other)?;
    let mut buf = std::sync::Arc::<[u8]>::new_uninit_slice(len);
    let uninit = std::sync::Arc::get_mut(&mut buf).expect("a new Arc has no other owner");
    let mut filled = 0;
    while filled < len {
        // SAFETY: the destination is the unfilled tail of `uninit`, which this
        // function owns exclusively; read(2) writes at most that many bytes.
        let n = unsafe { libc::read(f.as_raw_fd(), uninit[filled..].as_mut_ptr().cast(), len - filled) };
        match n {
            0 => break,
            n if n > 0 => filled += n as usize,
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
    // SAFETY: the first `filled` bytes were written by read(2); only they are
    // exposed (the tail of a shrunken file is copied out below).
    let head = |b: &std::sync::Arc<[std::mem::MaybeUninit<u8>]>| unsafe {
        std::slice::from_raw_parts(b.as_ptr().cast::<u8>(), filled).to_vec()
    };
    if filled < len {
        return Ok(head(&buf).into());
    }
    let mut probe = [0u8; 1];
    if f.read(&mut probe)? == 0 {
        // SAFETY: every byte was written by read(2) (filled == len).
        return Ok(unsafe { buf.assume_init() });
    }
    // It grew while it was read: the rest as read_regular reads it.
    let mut data = head(&buf);
    data.push(probe[0]);
    read_rest(f, &mut data, max)?;
    Ok(data.into())
}

/// Open a regular file of at most `max` bytes (see [`read_regular`]): the file and its length.
fn open_regular(path: &Path, max: u64) -> io::Result<(std::fs::File, u64)> {
    use std::os::unix::fs::OpenOptionsExt;
    let kind = |m: &std::fs::Metadata| {
        if m.is_dir() {
            Err(io::Error::new(io::ErrorKind::IsADirectory, "is a directory"))
        } else if !m.is_file() {
            Err(not_regular())
        } else if m.len() > max {
            Err(io::Error::new(io::ErrorKind::FileTooLarge, format!("{} bytes", m.len())))
        } else {
            Ok(m.len())
        }
    };
    kind(&std::fs::metadata(path)?)?;
    let f = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY).open(path)?;
    let len = kind(&f.metadata()?)?;
    Ok((f, len))
}

/// Append the rest of `f` to `data`, up to `max` bytes in all.
fn read_rest(f: std::fs::File, data: &mut Vec<u8>, max: u64) -> io::Result<()> {
    use std::io::Read;
    // The file may grow while it is read: never past the bound.
    f.take(max.saturating_add(1).saturating_sub(data.len() as u64)).read_to_end(data)?;
    if data.len() as u64 > max {
        return Err(io::Error::new(io::ErrorKind::FileTooLarge, format!("more than {max} bytes")));
    }
    Ok(())
}

/// Write `data` to a temporary file beside `path`, then rename it into place
/// (the shim's outputs, `nvlinkd watch`'s outputs), with the mode nvlink's
/// file would have ([`output_mode`]). See [`stage`] for the temporary file.
pub fn write_atomically(path: &Path, data: &[u8]) -> std::io::Result<()> {
    write_pieces_atomically(path, &[data])
}

/// [`write_atomically`] of the concatenation of `pieces` (an output as it
/// arrived, in messages), without joining them in memory first.
pub fn write_pieces_atomically<P: AsRef<[u8]>>(path: &Path, pieces: &[P]) -> std::io::Result<()> {
    let mode = output_mode(path);
    let staged = stage(path, pieces)?;
    commit(&staged, path, mode).inspect_err(|_| discard(&staged))
}

/// `target` with its directory resolved (every symlink in it followed,
/// absolute), as the kernel resolves it now: staging, committing and
/// discarding all happen in this one directory, so a directory symlink
/// swapped meanwhile cannot split them (nvlink's single `fopen` resolves it
/// once). A directory that cannot be resolved is kept as named.
pub fn resolved_dir(target: &Path) -> std::path::PathBuf {
    let dir = target.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    match (kernel_dir(dir), target.file_name()) {
        (Ok(real), Some(name)) => real.join(name),
        _ => target.to_owned(),
    }
}

/// Directory `dir` as the kernel resolves it for this process on the way to
/// a file in it (`dir/.`: every link in `dir` is one on the way, which
/// `fs.protected_symlinks` does not judge, as for nvlink's `fopen` of a file
/// there), opened (`O_PATH`) and named by the open directory's
/// `/proc/self/fd` link; where `/proc` is not mounted, `canonicalize`. Err:
/// the kernel's (no such directory, no search permission on the way).
pub fn kernel_dir(dir: &Path) -> std::io::Result<std::path::PathBuf> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut inside = dir.as_os_str().to_owned();
    inside.push("/.");
    let opened = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_PATH | libc::O_DIRECTORY).open(&inside)?;
    use std::os::fd::AsRawFd;
    match std::fs::read_link(format!("/proc/self/fd/{}", opened.as_raw_fd())) {
        Ok(real) if real.is_absolute() => Ok(real),
        _ => std::fs::canonicalize(dir),
    }
}

/// Where nvlink's `fopen(path, "w")` writes: the end of the chain of symlinks
/// at `path` (a relative link is read from its own directory; a dangling one
/// names the file created), at most 40 links deep, as the kernel resolves them.
pub fn output_target(path: &Path) -> std::path::PathBuf {
    let mut target = path.to_owned();
    for _ in 0..40 {
        match std::fs::read_link(&target) {
            Ok(next) => target = target.parent().unwrap_or(Path::new("/")).join(next),
            Err(_) => break,
        }
    }
    target
}

/// Whether `path` as spelled can only name a directory: it ends in `/`, or
/// its last component is `.` or `..`. The kernel refuses to open such a name
/// for writing (EISDIR, or ENOTDIR on a file), however `Path`'s own view,
/// which drops a trailing `/` and `.` components, sees it.
pub fn names_a_directory(path: &Path) -> bool {
    let b = path.as_os_str().as_encoded_bytes();
    b.ends_with(b"/") || b == b"." || b == b".." || b.ends_with(b"/.") || b.ends_with(b"/..")
}

/// [`output_target`], where the kernel would let nvlink open `path` for
/// writing: never a name that can only be a directory ([`names_a_directory`]);
/// a symlink is followed only if the kernel follows it for this process
/// (`fs.protected_symlinks`: not another user's link in a sticky,
/// world-writable directory), found by opening `path` itself as nvlink's
/// `fopen(path, "w")` does, without truncating; an existing file only where
/// this process may write it (its own permission, as `fopen` needs; root
/// may). Err: nvlink's "Could not open output file".
pub fn output_target_checked(path: &Path) -> std::io::Result<std::path::PathBuf> {
    if names_a_directory(path) {
        return Err(io::Error::from_raw_os_error(libc::EISDIR));
    }
    if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink()) {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new().write(true).create(true).truncate(false).mode(0o666).open(path)?;
    }
    // The directories on the way, as the kernel walks them for nvlink's
    // `fopen`: one it would not search is refused here too.
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    if let Err(e) = kernel_dir(dir) {
        if e.raw_os_error() == Some(libc::EACCES) {
            return Err(e);
        }
    }
    let target = output_target(path);
    if std::fs::metadata(&target).is_ok_and(|m| m.is_file()) {
        let c = std::ffi::CString::new(target.as_os_str().as_encoded_bytes())
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: a NUL-terminated path; faccessat only reads it.
        if unsafe { libc::faccessat(libc::AT_FDCWD, c.as_ptr(), libc::W_OK, libc::AT_EACCESS) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(target)
}

/// The mode of the file nvlink leaves at `target` (already resolved, see
/// [`output_target`]): nvlink truncates an existing file in place, so it keeps
/// its permission bits; a new one is created `0666` less the umask.
pub fn output_mode(target: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    match std::fs::metadata(target) {
        Ok(m) if m.is_file() => m.permissions().mode() & 0o777,
        _ => 0o666 & !umask(),
    }
}

/// This process's umask (read by setting it and putting it back: callers are
/// the shim, which creates no file meanwhile).
pub fn umask() -> u32 {
    // SAFETY: umask only swaps the process's file creation mask.
    let mask = unsafe { libc::umask(0o022) };
    // SAFETY: as above, putting the mask back.
    unsafe { libc::umask(mask) };
    mask
}

/// A complete output file written beside its target under a temporary name,
/// not yet renamed into place. Device and inode name exactly this file: the
/// shim renames a file the daemon staged only if it is still this one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Staged {
    pub path: std::path::PathBuf,
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
}

/// Write the concatenation of `pieces` to a new file beside `target` (in its
/// [`resolved_dir`]; a bare name's in the working directory), named
/// `.<name>.nvlinkd-<pid>-<n>.tmp`, mode 0600 until [`commit`] gives it its
/// final mode. The file is created exclusively (`O_CREAT|O_EXCL`, which never
/// follows a symlink): a name someone planted is skipped, never written
/// through. A failed write removes the file.
pub fn stage<P: AsRef<[u8]>>(target: &Path, pieces: &[P]) -> std::io::Result<Staged> {
    let mut s = Stager::new(target)?;
    for p in pieces {
        s.write(p.as_ref())?;
    }
    s.finish()
}

/// A file being staged beside its target piece by piece (as [`stage`] names
/// and creates it): what arrives over a stream goes to disk as it comes, and
/// memory holds one piece. Dropped unfinished, the file is removed.
pub struct Stager {
    file: Option<std::fs::File>,
    tmp: std::path::PathBuf,
}

impl Stager {
    pub fn new(target: &Path) -> std::io::Result<Stager> {
        use std::os::unix::fs::OpenOptionsExt;
        static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        // `x/` is no file beside `x`'s directory: nothing is staged for it.
        if names_a_directory(target) {
            return Err(io::Error::from_raw_os_error(libc::EISDIR));
        }
        // A bare name is in the working directory itself, as nvlink's fopen
        // of it is, whatever that directory is called by now: staged there
        // under a bare name too, not through a name of the directory.
        let bare = target.parent().is_some_and(|p| p.as_os_str().is_empty());
        let target = if bare { target.to_owned() } else { resolved_dir(target) };
        let dir = target.parent().unwrap_or(Path::new(""));
        let name = target.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let mut attempt = 0u32;
        loop {
            let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let tmp = dir.join(format!(".{name}.nvlinkd-{}-{n}.tmp", std::process::id()));
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .mode(0o600)
                .open(&tmp)
            {
                Ok(f) => return Ok(Stager { file: Some(f), tmp }),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && attempt < 100 => attempt += 1,
                Err(e) => return Err(e),
            }
        }
    }

    /// Append `data` (a failure leaves the stager to be dropped, which removes the file).
    pub fn write(&mut self, data: &[u8]) -> std::io::Result<()> {
        use std::io::Write;
        match &mut self.file {
            Some(f) => f.write_all(data),
            None => Err(std::io::Error::other("stager already finished")),
        }
    }

    /// The staged file, complete.
    pub fn finish(mut self) -> std::io::Result<Staged> {
        use std::io::Write;
        use std::os::unix::fs::MetadataExt;
        let mut f = self.file.take().ok_or_else(|| std::io::Error::other("stager already finished"))?;
        let done = f.flush().and_then(|()| f.metadata());
        match done {
            Ok(m) => Ok(Staged { path: std::mem::take(&mut self.tmp), dev: m.dev(), ino: m.ino(), size: m.size() }),
            Err(e) => {
                let _ = std::fs::remove_file(&self.tmp);
                Err(e)
            }
        }
    }
}

impl Drop for Stager {
    fn drop(&mut self) {
        if self.file.is_some() {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// Copy a staged file's bytes to the file `open` gives, if it is still the
/// one staged (checked as [`commit`] checks it, before `open` is called: a
/// staged file gone leaves the destination untouched), through a small buffer.
pub fn copy_staged(staged: &Staged, open: impl FnOnce() -> std::io::Result<std::fs::File>) -> std::io::Result<u64> {
    use std::io::{Read, Write};
    let mut from = open_staged(staged)?.take(staged.size);
    let mut to = open()?;
    let n = std::io::copy(&mut from, &mut to)?;
    to.flush()?;
    Ok(n)
}

/// Whether `staged` is a name [`stage`] gives a file beside `target`: an
/// absolute path (its [`resolved_dir`]) or one in `target`'s own directory.
pub fn is_staged_name(staged: &Path, target: &Path) -> bool {
    let (Some(name), Some(own)) = (staged.file_name(), target.file_name()) else { return false };
    let (name, own) = (name.to_string_lossy(), own.to_string_lossy());
    (staged.is_absolute() || staged.parent() == target.parent())
        && name
            .strip_prefix(&format!(".{own}.nvlinkd-"))
            .is_some_and(|rest| rest.ends_with(".tmp") && !rest.contains('/'))
}

/// Whether `staged` lies in the directory `target` names now, resolved
/// ([`resolved_dir`]): where [`commit`] puts it. Two bare names are both in
/// the working directory itself, whatever its name is by now (as [`stage`]
/// stages a bare name).
pub fn staged_beside(staged: &Staged, target: &Path) -> bool {
    let bare = |p: &Path| p.parent().is_some_and(|d| d.as_os_str().is_empty());
    (bare(&staged.path) && bare(target)) || staged.path.parent() == resolved_dir(target).parent()
}

/// Give the staged file `mode` and rename it to `target`'s name in the
/// staged file's own directory (the directory resolved once, when it was
/// staged) — only if it is still the file staged (a regular file, same device,
/// inode and size, owned by this user; opened without following a symlink).
/// Fails with `InvalidData` when it is not, leaving whatever is there alone.
pub fn commit(staged: &Staged, target: &Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    open_staged(staged)?.set_permissions(std::fs::Permissions::from_mode(mode))?;
    let name = target.file_name().ok_or_else(|| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    let dir = staged.path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::rename(&staged.path, dir.join(name))
}

/// The bytes of a staged file, if it is still the one staged (checked as
/// [`commit`] checks it).
pub fn read_staged(staged: &Staged) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut data = Vec::with_capacity(staged.size as usize);
    open_staged(staged)?.take(staged.size).read_to_end(&mut data)?;
    Ok(data)
}

/// The staged file, opened for reading without following a symlink, if it is
/// still the file staged: a regular file of the same device, inode and size,
/// owned by this user. `InvalidData` when it is not.
fn open_staged(staged: &Staged) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(&staged.path)?;
    let m = f.metadata()?;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if !m.is_file() || m.dev() != staged.dev || m.ino() != staged.ino || m.size() != staged.size || m.uid() != me {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "not the staged output file"));
    }
    Ok(f)
}

/// Remove a staged file that was not committed, if it is still the one staged.
pub fn discard(staged: &Staged) {
    use std::os::unix::fs::MetadataExt;
    if let Ok(m) = std::fs::symlink_metadata(&staged.path) {
        if m.is_file() && m.dev() == staged.dev && m.ino() == staged.ino {
            let _ = std::fs::remove_file(&staged.path);
        }
    }
}

/// This process's view of the filesystem: device and inode of its mount
/// namespace and of its root directory (zeros where they cannot be read).
/// Two processes with the same cwd see the same files only if these match too
/// (a private /tmp is another mount namespace; a chroot another root).
pub fn fs_view() -> [u64; 4] {
    use std::os::unix::fs::MetadataExt;
    let id = |p: &str| std::fs::metadata(p).map(|m| (m.dev(), m.ino())).unwrap_or((0, 0));
    let (ns, root) = (id("/proc/self/ns/mnt"), id("/"));
    [ns.0, ns.1, root.0, root.1]
}

/// nvlink's fatal message where it cannot open an output it writes, the
/// file as the command line named it ([`as_named`]): the `-time` table,
/// which it appends to, in its own words.
pub fn cannot_open(appended: bool, named: &str) -> String {
    if appended {
        format!("Cannot open file '{named}'")
    } else {
        format!("Could not open output file '{named}'")
    }
}

/// How an nvlink command line spelled the output file the daemon returned as the
/// absolute `path` (`cwd` joined with a relative name): an argument, or the
/// value after an option's `=`, that resolves to it; else `path` relative to
/// `cwd` where it lies below it (a name from an options file), else `path`.
pub fn as_named(path: &Path, args: &[String], cwd: &Path) -> String {
    let resolves = |name: &str| !name.is_empty() && cwd.join(name) == path;
    args.iter()
        .flat_map(|a| [Some(a.as_str()), a.split_once('=').map(|(_, v)| v)])
        .flatten()
        .find(|name| resolves(name))
        .map(str::to_owned)
        .or_else(|| path.strip_prefix(cwd).ok().map(|p| p.display().to_string()))
        .unwrap_or_else(|| path.display().to_string())
}

/// The words of an options file as nvlink splits it (measured with nvlink
/// 13.5): space, tab, newline and carriage return separate (not a form
/// feed, a vertical tab or any other control character); `"` groups (anywhere in a word: `s"c".o` is `sc.o`); `\`
/// takes the next character as it is, inside quotes too (`s\ c.o` is
/// `s c.o`); `'` is an ordinary character. The daemon's parser and the shim's
/// view of a command line use this one splitter, so both see the same names.
pub fn options_words(text: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let (mut in_word, mut quoted, mut escaped) = (false, false, false);
    for c in text.chars() {
        if escaped {
            cur.push(c);
            escaped = false;
            continue;
        }
        match c {
            '\\' => {
                escaped = true;
                in_word = true;
            }
            '"' => {
                quoted = !quoted;
                in_word = true;
            }
            ' ' | '\t' | '\n' | '\r' if !quoted => {
                if in_word {
                    words.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            _ => {
                cur.push(c);
                in_word = true;
            }
        }
    }
    if in_word {
        words.push(cur);
    }
    words
}

#[cfg(test)]
mod words {
    use super::options_words;

    #[test]
    fn options_files_split_on_ascii_whitespace_and_group_by_quotes() {
        assert_eq!(options_words(" -arch sm_90\n \"a b.o\" \"c\"d "), ["-arch", "sm_90", "a b.o", "cd"]);
        assert_eq!(options_words("'a b.o' s'c.o"), ["'a", "b.o'", "s'c.o"], "' is an ordinary character");
        assert_eq!(
            options_words(r#"s\ c.o s\c.o s\\c.o "s\"c.o" s"c".o"#),
            ["s c.o", "sc.o", "s\\c.o", "s\"c.o", "sc.o"]
        );
        assert_eq!(
            options_words("a\u{a0}b.o\tc\u{b}d\u{c}e\rf"),
            ["a\u{a0}b.o", "c\u{b}d\u{c}e", "f"],
            "no vertical tab or form feed (measured: `--arch=sm_90<FF>a.o` is one word)"
        );
    }
}
