//! The daemon's listeners, checked before it starts: the TCP listener for
//! remote shims (TLS, tokens, client certificates; `--listen`) and the unix
//! socket (mode 0600, in a directory that belongs to someone).

use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
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

/// The socket's directory: created private when missing (with any missing
/// parents), checked and left as it is when it exists.
fn socket_dir(dir: &Path) -> std::io::Result<()> {
    let refuse = |why: String| std::io::Error::new(std::io::ErrorKind::PermissionDenied, why);
    match std::fs::metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
                std::fs::create_dir_all(parent)?;
            }
            match std::fs::DirBuilder::new().mode(0o700).create(dir) {
                Ok(()) => Ok(()),
                // Another daemon starting at the same moment: check what it made.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => socket_dir(dir),
                Err(e) => Err(e),
            }
        }
        Err(e) => Err(e),
        Ok(m) if !m.is_dir() => Err(refuse(format!("{} is not a directory", dir.display()))),
        Ok(m) => {
            // SAFETY: geteuid cannot fail.
            let me = unsafe { libc::geteuid() };
            if m.uid() != me && m.uid() != 0 {
                return Err(refuse(format!(
                    "the socket directory {} belongs to uid {}, not to this user ({me})",
                    dir.display(),
                    m.uid()
                )));
            }
            if m.mode() & 0o022 != 0 && m.mode() & 0o1000 == 0 {
                return Err(refuse(format!(
                    "the socket directory {} is writable by others and not sticky (mode {:o})",
                    dir.display(),
                    m.mode() & 0o7777
                )));
            }
            Ok(())
        }
    }
}

/// Bind the unix socket: its directory made or checked, a stale socket of a
/// dead daemon replaced, mode 0600. A path that exists and is not a socket is
/// refused, never deleted.
pub fn bind_unix(path: &Path) -> std::io::Result<UnixListener> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        socket_dir(dir)?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            // A live daemon answers on it; a dead one left it behind.
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::AddrInUse,
                    "another nvlinkd is serving this socket",
                ));
            }
            std::fs::remove_file(path)?;
        }
        Ok(_) => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                format!("{} exists and is not a socket; nvlinkd will not replace it", path.display()),
            ))
        }
        Err(_) => {}
    }
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}
