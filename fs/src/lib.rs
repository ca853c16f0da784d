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
/// (the shim's outputs, `nvlinkd watch`'s outputs).
/// The temporary file is created exclusively (`O_CREAT|O_EXCL`, which never
/// follows a symlink): a name someone planted is skipped, never written through.
pub fn write_atomically(path: &Path, data: &[u8]) -> std::io::Result<()> {
    write_pieces_atomically(path, &[data])
}

/// [`write_atomically`] of the concatenation of `pieces` (an output as it
/// arrived, in messages), without joining them in memory first.
pub fn write_pieces_atomically<P: AsRef<[u8]>>(path: &Path, pieces: &[P]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let mut attempt = 0u32;
    let (tmp, mut f) = loop {
        let tmp = dir.join(format!(".{name}.nvlinkd-{}-{attempt}.tmp", std::process::id()));
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .mode(0o666)
            .open(&tmp)
        {
            Ok(f) => break (tmp, f),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && attempt < 100 => attempt += 1,
            Err(e) => return Err(e),
        }
    };
    let result = (|| {
        for p in pieces {
            f.write_all(p.as_ref())?;
        }
        f.flush()?;
        drop(f);
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}
