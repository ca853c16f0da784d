//! The daemon's listeners, checked before it starts: the TCP listener for
//! remote shims (TLS, tokens, client certificates; `--listen`) and the unix
//! socket (mode 0600, in a directory that belongs to someone).

use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;
use std::sync::Arc;

use tokio::net::UnixListener;

use super::auth::Auth;

/// The remote listener and its security, read and checked before the daemon
/// starts (a key that cannot be read or a token file without tokens stop it).
pub struct Remote {
    pub listen: String,
    pub(crate) tls: Option<tonic::transport::ServerTlsConfig>,
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
        let read =
            |what: &str, p: &Path| std::fs::read(p).map_err(|e| format!("cannot read {what} {}: {e}", p.display()));
        let auth = match token_file {
            Some(f) => {
                let text = String::from_utf8(read("--token-file", f)?)
                    .map_err(|_| format!("--token-file {} is not text", f.display()))?;
                let tokens: Vec<[u8; 32]> = text
                    .lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty() && !l.starts_with('#'))
                    .map(|t| *blake3::hash(t.as_bytes()).as_bytes())
                    .collect();
                if tokens.is_empty() {
                    return Err(format!("--token-file {} holds no token", f.display()));
                }
                Some(Arc::new(Auth { tokens }))
            }
            None => None,
        };
        if client_ca.is_some() && tls.is_none() {
            return Err("--client-ca needs --tls-cert and --tls-key".into());
        }
        let tls = match tls {
            Some((cert, key)) => {
                let identity = tonic::transport::Identity::from_pem(read("--tls-cert", cert)?, read("--tls-key", key)?);
                let mut config = tonic::transport::ServerTlsConfig::new().identity(identity);
                if let Some(ca) = client_ca {
                    config = config.client_ca_root(tonic::transport::Certificate::from_pem(read("--client-ca", ca)?));
                }
                Some(config)
            }
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
