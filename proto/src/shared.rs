//! What the shim and the daemon must agree on besides the protocol itself,
//! defined once so the two sides (and the tests' clients) cannot drift apart.

use std::path::PathBuf;

use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint, Uri};

/// Environment variables that change what nvlink does; only these travel from
/// the invoking process to the daemon, and the daemon keeps only these of what
/// a client sends (`nvlinkd_core::request::LINK_ENV`, the same list).
pub const RELEVANT_ENV: &[&str] = &["LIBRARY_PATH"];

/// HTTP/2 stream and connection windows, on both ends: large enough that whole
/// input files (tens of MB) flow without waiting for window updates.
pub const WINDOW_BYTES: u32 = 32 << 20;

/// The shim's receive windows: what a daemon may have in flight towards it
/// unread. Smaller than the daemon's, because it bounds the shim's memory
/// while a large output arrives (with the shim's spill threshold, the most of
/// an output it holds); still 80 MB/s at 100 ms round trips.
pub const SHIM_WINDOW_BYTES: u32 = 8 << 20;

/// Largest HTTP/2 frame each end accepts (HTTP/2's default is 16 KiB): a
/// message of file contents (up to `CHUNK_BYTES`) then crosses in one or a
/// few frames instead of 64, each a wakeup and a copy on both sides.
pub const FRAME_BYTES: u32 = 1 << 20;

/// Connects `endpoint` over the unix socket at `path` (tonic's endpoints speak
/// TCP; the URI is a placeholder that no one resolves).
pub async fn connect_unix(endpoint: Endpoint, path: PathBuf) -> Result<Channel, tonic::transport::Error> {
    endpoint
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(path).await?)) }
        }))
        .await
}

/// [`connect_unix`] to a daemon of this user's or root's only: another user's
/// process behind the socket (in a directory it made first) is refused
/// (`PermissionDenied`), before anything is sent.
pub async fn connect_unix_own(endpoint: Endpoint, path: PathBuf) -> Result<Channel, tonic::transport::Error> {
    let me = crate::paths::uid();
    endpoint
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(&path).await?;
                let peer = stream.peer_cred()?.uid();
                if peer != me && peer != 0 {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::PermissionDenied,
                        format!("the daemon at {} runs as uid {peer}, not as this user", path.display()),
                    ));
                }
                Ok::<_, std::io::Error>(TokioIo::new(stream))
            }
        }))
        .await
}

/// An endpoint for a unix socket: the URI only names the `:authority` sent.
pub fn unix_endpoint() -> Endpoint {
    Endpoint::from_static("http://nvlinkd.local")
}
