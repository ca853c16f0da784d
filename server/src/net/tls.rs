//! TLS of the `--listen` port, terminated here (rustls through tokio-rustls)
//! rather than by tonic, so that the certificate, its key and the client CA
//! can be read again while the daemon serves (SIGHUP, see `daemon.rs`).
//!
//! [`Tls`] holds the files' paths and the `ServerConfig` made of them; a
//! reload builds a whole new configuration and swaps it in only if every file
//! was read, parsed and consistent (the key matches the certificate), so a
//! bad file never leaves the listener half-configured: it keeps the old one
//! and the reason is returned. Each accepted connection takes the
//! configuration in force when its handshake starts; connections already open
//! keep theirs.
//!
//! [`incoming`] runs the handshakes of the admitted TCP connections
//! (`incoming.rs`), each on its own task within its connection's time (10 s;
//! 1 s under pressure, see `incoming.rs`), so a slow or silent client holds
//! only its own connection slot. Failed handshakes are
//! counted (`tls_handshake_failures`) and logged with the peer's address, at
//! most once per [`LOG_EVERY`] (a peer that only connects and closes, as TCP
//! health checks do, at `debug`).

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLock};

use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{RootCertStore, ServerConfig};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tokio_stream::{Stream, StreamExt};
use tracing::{debug, warn};

use super::incoming::{Counters, Guarded, LOG_EVERY};

/// The files the listener's TLS is made of.
#[derive(Clone, Debug)]
pub struct TlsFiles {
    /// Certificate chain (PEM), `--tls-cert`.
    pub cert: PathBuf,
    /// Private key (PEM), `--tls-key`.
    pub key: PathBuf,
    /// CA whose client certificates are required (PEM), `--client-ca`.
    pub client_ca: Option<PathBuf>,
}

/// The listener's TLS configuration, reloadable.
pub struct Tls {
    files: TlsFiles,
    config: RwLock<Arc<ServerConfig>>,
}

impl Tls {
    /// Read and check the files (a daemon refuses to start on a bad one).
    pub fn load(files: TlsFiles) -> Result<Tls, String> {
        let config = server_config(&files)?;
        Ok(Tls { files, config: RwLock::new(Arc::new(config)) })
    }

    /// Read the files again; on success new handshakes use them, on failure
    /// the configuration in force stays and the error says why.
    pub fn reload(&self) -> Result<(), String> {
        let config = server_config(&self.files)?;
        *self.config.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(config);
        Ok(())
    }

    /// The configuration new handshakes use.
    pub fn current(&self) -> Arc<ServerConfig> {
        self.config.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Whether client certificates are required (`--client-ca`).
    pub fn requires_client_certificates(&self) -> bool {
        self.files.client_ca.is_some()
    }
}

fn read(what: &str, p: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(p).map_err(|e| format!("cannot read {what} {}: {e}", p.display()))
}

/// The certificates of a PEM file, at least one.
fn certificates(what: &str, p: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let pem = read(what, p)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{what} {}: not PEM certificates ({e})", p.display()))?;
    if certs.is_empty() {
        return Err(format!("{what} {}: no certificate in it", p.display()));
    }
    Ok(certs)
}

/// A server configuration from `files`: the certificate chain and its key
/// (which must match), client certificates required when a client CA is
/// given, HTTP/2 only (as tonic's own).
fn server_config(files: &TlsFiles) -> Result<ServerConfig, String> {
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let chain = certificates("--tls-cert", &files.cert)?;
    // The key as ssh takes a private key: the daemon's user's (or root's) alone.
    let key = PrivateKeyDer::from_pem_slice(&super::auth::read_private(&files.key, "--tls-key")?)
        .map_err(|e| format!("--tls-key {}: no private key in it ({e})", files.key.display()))?;
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?;
    let builder = match &files.client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for cert in certificates("--client-ca", ca)? {
                roots.add(cert).map_err(|e| format!("--client-ca {}: {e}", ca.display()))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| format!("--client-ca {}: {e}", ca.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|e| format!("--tls-cert {} with --tls-key {}: {e}", files.cert.display(), files.key.display()))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

/// The TLS connections of the admitted TCP connections `tcp`: each handshake
/// on a task of its own, within its connection's handshake time, with the configuration
/// in force when it starts. Ends when tonic stops reading it.
pub fn incoming(
    tcp: impl Stream<Item = std::io::Result<Guarded>> + Send + 'static,
    tls: Arc<Tls>,
    counters: Arc<Counters>,
) -> impl Stream<Item = std::io::Result<TlsStream<Guarded>>> {
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    tokio::spawn(async move {
        let mut tcp = std::pin::pin!(tcp);
        loop {
            let conn = tokio::select! {
                c = tcp.next() => c,
                // tonic stopped serving: stop accepting.
                _ = tx.closed() => return,
            };
            let Some(Ok(conn)) = conn else { return };
            let (tx, acceptor, counters) = (tx.clone(), TlsAcceptor::from(tls.current()), counters.clone());
            tokio::spawn(async move {
                let peer = conn.peer_addr();
                let connection = conn.connection().clone();
                // HANDSHAKE_TIMEOUT, or less under pressure (`incoming.rs`).
                let within = connection.handshake_timeout();
                let failed = match tokio::time::timeout(within, acceptor.accept(conn)).await {
                    Ok(Ok(stream)) => {
                        // Its first authenticated call is due within AUTH_TIMEOUT (`incoming.rs`).
                        connection.handshaken();
                        let _ = tx.send(Ok(stream)).await;
                        return;
                    }
                    Ok(Err(e)) => e,
                    Err(_) => std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("no handshake within {}s", within.as_secs()),
                    ),
                };
                counters.tls_handshake_failures.fetch_add(1, Ordering::Relaxed);
                let peer = peer.map(|p| p.to_string()).unwrap_or_else(|| "?".into());
                // A peer that closes before finishing (a TCP health check, a
                // port scan) is counted but not worth a warning.
                if failed.kind() == std::io::ErrorKind::UnexpectedEof {
                    debug!(%peer, why = %failed, "connection closed during the TLS handshake");
                    return;
                }
                match counters.handshake_log.allow() {
                    Some(suppressed) => warn!(
                        %peer,
                        why = %failed,
                        suppressed,
                        "TLS handshake failed (logged at most every {}s; suppressed: failures not logged since the last line)",
                        LOG_EVERY.as_secs()
                    ),
                    None => debug!(%peer, why = %failed, "TLS handshake failed"),
                }
            });
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}
