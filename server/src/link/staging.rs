//! Outputs the daemon writes itself, for a shim on this machine.
//!
//! A link's output goes back to the shim in `CHUNK_BYTES` messages, and the
//! shim writes it: for a 1 MB cubin the shim spends about 2 ms of CPU (most of
//! it first touches of its receive buffers), a tenth of a cold link's. A shim
//! that shares this filesystem, as this user and group, can instead rename a
//! file the daemon wrote beside the output (`nvlinkd_fs::stage`): the bytes
//! cross no socket and the file is created by the user that nvlink would have
//! created it as.
//!
//! When: the unix socket, the shim's working directory the daemon's own
//! (`Request::shared_fs`), the peer's uid and gid (`SO_PEERCRED`) the daemon's
//! effective ones, a shim that `accepts_staged`, a file to replace, not to
//! append to, of at least [`MIN_BYTES`]. Anything else, or a failed write
//! (no room, no permission: the shim's own write then fails as nvlink's
//! would), goes back in messages as before.
//!
//! Nothing is left behind: the shim renames what it takes and removes what
//! it does not; what a shim that died leaves is removed here when its stream
//! ends ([`Staging::finish`]), if it is still the file staged.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use nvlinkd_fs::Staged;

/// Smaller outputs go back in messages (a staged file costs a few syscalls
/// on both sides, worth it only where the copies cost more).
pub const MIN_BYTES: usize = 64 << 10;

/// Counters for `nvlinkd stats`.
#[derive(Debug, Default)]
pub struct Counters {
    pub files: AtomicU64,
    pub bytes: AtomicU64,
}

impl Counters {
    pub fn counters(&self) -> [(&'static str, u64, nvlinkd_core::stats::Kind); 2] {
        use nvlinkd_core::stats::Kind::Counter;
        [
            ("outputs_staged", self.files.load(Ordering::Relaxed), Counter),
            ("output_bytes_staged", self.bytes.load(Ordering::Relaxed), Counter),
        ]
    }
}

/// Whether a peer of the unix socket is this process's user and group.
pub fn same_user(cred: Option<tokio::net::unix::UCred>) -> bool {
    // SAFETY: geteuid and getegid have no preconditions.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    cred.is_some_and(|c| c.uid() == uid && c.gid() == gid)
}

/// The files staged for one link.
#[derive(Debug, Default)]
pub struct Staging {
    state: Mutex<State>,
    /// The link's working directory, opened: outputs under it are staged
    /// in the directory itself, not in whatever has its name by then.
    cwd: Option<(std::path::PathBuf, nvlinkd_core::request::CwdDir)>,
}

#[derive(Debug, Default)]
struct State {
    files: Vec<Staged>,
    /// The stream ended: nothing more is staged.
    finished: bool,
}

impl Staging {
    /// Staging for a link of `req`.
    pub fn of(req: &nvlinkd_core::request::Request) -> Staging {
        Staging { cwd: req.cwd_dir.clone().map(|d| (req.cwd.clone(), d)), ..Default::default() }
    }

    /// Write `data` beside the output `path` for the shim to rename (see the
    /// module docs for when); None: send it in messages.
    pub fn stage(&self, path: &Path, data: &[u8], counters: &Counters) -> Option<Staged> {
        if data.len() < MIN_BYTES {
            return None;
        }
        let path = match &self.cwd {
            Some((cwd, dir)) => dir.under(cwd, path),
            None => path.to_owned(),
        };
        let target = nvlinkd_fs::output_target(&path);
        // A device, a FIFO or a directory: the shim writes (or fails) as nvlink would.
        match std::fs::metadata(&target) {
            Ok(m) if !m.is_file() => return None,
            _ => {}
        }
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if state.finished {
            return None;
        }
        match nvlinkd_fs::stage(&target, &[data]) {
            Ok(staged) if !self.in_opened_dir(&target, &staged) => {
                // Created by the directory's name while it was being moved:
                // not where the link's directory is (nobody else can read it,
                // 0600); gone again, and the bytes travel in messages.
                nvlinkd_fs::discard(&staged);
                tracing::debug!(output = %path.display(), "staged outside the link's directory: sent in messages");
                None
            }
            Ok(staged) => {
                counters.files.fetch_add(1, Ordering::Relaxed);
                counters.bytes.fetch_add(staged.size, Ordering::Relaxed);
                state.files.push(staged.clone());
                Some(staged)
            }
            Err(e) => {
                tracing::debug!(output = %path.display(), "output not staged ({e}): sent in messages");
                None
            }
        }
    }

    /// Whether `staged`, staged for `target`, lies in the link's opened
    /// directory when `target` is in it (a target elsewhere, through an
    /// output symlink, is as the kernel resolved it).
    fn in_opened_dir(&self, target: &Path, staged: &Staged) -> bool {
        use std::os::unix::fs::MetadataExt;
        let Some((_, dir)) = &self.cwd else { return true };
        let (Some(parent), Some(name)) = (target.parent(), staged.path.file_name()) else { return true };
        if !target.starts_with(dir.path()) {
            return true;
        }
        std::fs::symlink_metadata(parent.join(name)).is_ok_and(|m| (m.dev(), m.ino()) == (staged.dev, staged.ino))
    }

    /// The stream ended: remove whatever the shim did not rename.
    pub fn finish(&self) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.finished = true;
        for staged in state.files.drain(..) {
            nvlinkd_fs::discard(&staged);
        }
    }
}
