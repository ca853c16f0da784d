//! The daemon's listeners, checked before it starts: the TCP listener for
//! remote shims (TLS, tokens, client certificates; `--listen`) and the unix
//! socket (mode 0600, in a directory the daemon's user or root owns, bound and
//! removed through the open directory).

use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt};
use std::path::Path;
use std::sync::Arc;

use tokio::net::UnixListener;

use tracing::{info, warn};

use super::auth::Auth;
use super::tls::{Tls, TlsFiles};

/// The remote listener and its security, read and checked before the daemon
/// starts (a key that cannot be read, or does not match its certificate, or a
/// token file without tokens stop it). Both can be read again while it
/// serves ([`Remote::reload`], on SIGHUP).
pub struct Remote {
    pub listen: String,
    pub(crate) tls: Option<Arc<Tls>>,
    pub auth: Option<Arc<Auth>>,
    /// Tokens or client certificates are required.
    pub(crate) authenticated: bool,
}

impl Remote {
    pub fn configure(
        listen: String,
        tls: Option<(&Path, &Path)>,
        token_file: Option<&Path>,
        client_ca: Option<&Path>,
        insecure: bool,
    ) -> Result<Remote, String> {
        let auth = token_file.map(Auth::load).transpose()?.map(Arc::new);
        if client_ca.is_some() && tls.is_none() {
            return Err("--client-ca needs --tls-cert and --tls-key".into());
        }
        let tls = match tls {
            Some((cert, key)) => Some(Arc::new(Tls::load(TlsFiles {
                cert: cert.to_owned(),
                key: key.to_owned(),
                client_ca: client_ca.map(Path::to_owned),
            })?)),
            None => None,
        };
        let authenticated = auth.is_some() || client_ca.is_some();
        if !insecure && (tls.is_none() || !authenticated) {
            let missing = match (tls.is_none(), authenticated) {
                (true, false) => "TLS (--tls-cert, --tls-key) and authentication (--token-file and/or --client-ca)",
                (true, true) => "TLS (--tls-cert, --tls-key)",
                _ => "authentication (--token-file and/or --client-ca)",
            };
            return Err(format!(
                "refusing to serve --listen {listen} without {missing}: anyone reaching the port could link as this \
                 daemon; give them, or --insecure behind a TLS-terminating, authenticating proxy"
            ));
        }
        Ok(Remote { listen, tls, auth, authenticated })
    }

    /// Read the certificate, key, client CA and token file again (SIGHUP).
    /// Each part that reads and checks well replaces the one in force, for
    /// new connections and calls; one that does not keeps the old, with a
    /// warning saying why. Never fails the daemon.
    pub fn reload(&self) {
        if let Some(tls) = &self.tls {
            match tls.reload() {
                Ok(()) => info!(listen = %self.listen, client_ca = tls.requires_client_certificates(),
                                "SIGHUP: TLS certificate and key reloaded"),
                Err(why) => {
                    warn!(listen = %self.listen, %why, "SIGHUP: TLS files not reloaded; keeping the ones in use")
                }
            }
        }
        if let Some(auth) = &self.auth {
            match auth.reload() {
                Ok(names) => {
                    let tokens = names.len();
                    let names = names.join(" ");
                    info!(listen = %self.listen, tokens, %names, "SIGHUP: token file reloaded")
                }
                Err(why) => {
                    warn!(listen = %self.listen, %why, "SIGHUP: token file not reloaded; keeping the tokens in use")
                }
            }
        }
    }
}

/// What the daemon needs to remove exactly the unix socket it bound at the
/// end: its directory, held open (never found again by path: a path
/// re-pointed since cannot send the unlink elsewhere), and the socket's
/// device and inode.
pub struct BoundSocket {
    dir: std::fs::File,
    name: std::ffi::OsString,
    identity: (u64, u64),
}

impl BoundSocket {
    /// Remove the socket at the end of `serve`: only the one bound (a socket
    /// of its device and inode), in the directory it was bound in; another
    /// file of that name is left alone.
    pub fn remove(&self) {
        let Ok(name) = std::ffi::CString::new(self.name.as_bytes()) else { return };
        let dir = self.dir.as_raw_fd();
        // SAFETY: `st` is written by fstatat before it is read (on success).
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: a descriptor we own, a NUL-terminated name, a valid out pointer.
        let found = unsafe { libc::fstatat(dir, name.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) } == 0;
        let socket = st.st_mode & libc::S_IFMT == libc::S_IFSOCK;
        if found && socket && (st.st_dev as u64, st.st_ino as u64) == self.identity {
            // SAFETY: a descriptor we own and a NUL-terminated name.
            unsafe { libc::unlinkat(dir, name.as_ptr(), 0) };
        }
    }
}

/// The socket's directory, opened: created private when missing (with any
/// missing parents); the per-user runtime directory must then be this user's
/// own (`paths::private_dir`: not a symlink, ours, written by no one else);
/// another directory (`--socket`, `NVLINKD_SOCKET`) must belong to this user
/// or root and be sticky if others may write it. The checks are made on the
/// open directory, the one the socket is then bound in.
fn socket_dir(dir: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let refuse = |why: String| std::io::Error::new(std::io::ErrorKind::PermissionDenied, why);
    let runtime = dir == nvlinkd_proto::paths::runtime_dir();
    if std::fs::symlink_metadata(dir).is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound) {
        if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent)?;
        }
        match std::fs::DirBuilder::new().mode(0o700).create(dir) {
            // Another daemon starting at the same moment: check what it made.
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
    }
    if runtime {
        nvlinkd_proto::paths::private_dir(dir).map_err(|why| {
            refuse(format!(
                "{why} (another user may have made it): remove it, or set XDG_RUNTIME_DIR or --socket to a \
                 directory of your own"
            ))
        })?;
    }
    let nofollow = if runtime { libc::O_NOFOLLOW } else { 0 };
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC | nofollow)
        .open(dir)
        .map_err(|e| refuse(format!("the socket directory {}: {e}", dir.display())))?;
    let m = opened.metadata()?;
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    let owner_ok = if runtime { m.uid() == me } else { m.uid() == me || m.uid() == 0 };
    if !owner_ok {
        return Err(refuse(format!(
            "the socket directory {} belongs to uid {}, not to this user ({me})",
            dir.display(),
            m.uid()
        )));
    }
    let shared_ok = !runtime && m.mode() & 0o1000 != 0;
    if m.mode() & 0o022 != 0 && !shared_ok {
        return Err(refuse(format!(
            "the socket directory {} is writable by others{} (mode {:o})",
            dir.display(),
            if runtime { "" } else { " and not sticky" },
            m.mode() & 0o7777
        )));
    }
    Ok(opened)
}

/// Bind the unix socket: its directory made or checked and held open, a
/// stale socket of a dead daemon replaced, mode 0600 from the moment it
/// exists (made under umask 0177: no path is chmod-ed after). A path that
/// exists and is not a socket is refused, never deleted. Every step names
/// the socket through the open directory (`/proc/self/fd/N/NAME`), so a
/// directory re-pointed meanwhile changes nothing.
pub fn bind_unix(path: &Path) -> std::io::Result<(UnixListener, BoundSocket)> {
    let parent = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = path.file_name().ok_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{} names no socket", path.display()))
    })?;
    let dir = socket_dir(parent)?;
    let here = Path::new("/proc/self/fd").join(dir.as_raw_fd().to_string()).join(name);
    match std::fs::symlink_metadata(&here) {
        Ok(m) if m.file_type().is_socket() => {
            // A live daemon answers on it; a dead one left it behind.
            if std::os::unix::net::UnixStream::connect(&here).is_ok() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::AddrInUse,
                    "another nvlinkd is serving this socket",
                ));
            }
            std::fs::remove_file(&here)?;
        }
        Ok(_) => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                format!("{} exists and is not a socket; nvlinkd will not replace it", path.display()),
            ))
        }
        Err(_) => {}
    }
    let listener = {
        // SAFETY: umask cannot fail. It is the process's: a file another
        // thread makes in this instant is made 0600 too, never more open.
        let old = unsafe { libc::umask(0o177) };
        let bound = UnixListener::bind(&here);
        // SAFETY: as above.
        unsafe { libc::umask(old) };
        bound?
    };
    let m = std::fs::symlink_metadata(&here)?;
    Ok((listener, BoundSocket { dir, name: name.to_owned(), identity: (m.dev(), m.ino()) }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// The socket is 0600 from the moment it exists, and at stop only the
    /// socket bound is removed: a file put at its name since (the path
    /// re-pointed, or the socket replaced) is left alone.
    #[tokio::test]
    async fn only_the_socket_bound_is_removed_and_it_is_private() {
        let dir = std::env::temp_dir().join(format!("nvlinkd-bind-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        let path = dir.join("s.sock");
        let (listener, bound) = bind_unix(&path).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        drop(listener);
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, b"someone else's").unwrap();
        bound.remove();
        assert_eq!(std::fs::read(&path).unwrap(), b"someone else's");
        std::fs::remove_file(&path).unwrap();
        let (_listener, bound) = bind_unix(&path).unwrap();
        bound.remove();
        assert!(std::fs::symlink_metadata(&path).is_err(), "the socket bound was left behind");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
