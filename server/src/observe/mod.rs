//! What the daemon tells: the event stream (`nvlinkd events`) and `/metrics`.

pub mod diagnostics;
pub mod events;
pub mod metrics;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use nvlinkd_core::stats::{Kind, Snapshot};
use nvlinkd_core::Linker;

/// Where a daemon's figures live: one [`Snapshot`] of them is what
/// `nvlinkd stats --json`, `status` and `/metrics` report.
#[derive(Clone)]
pub struct Figures {
    pub linker: Arc<Linker>,
    pub blobs: Arc<crate::blobs::BlobStore>,
    pub staged: Arc<crate::link::staging::Counters>,
    pub connections: Arc<crate::net::incoming::Counters>,
    pub auth_failures: Arc<AtomicU64>,
    pub remote_links: Arc<crate::link::admission::RemoteLinks>,
    pub reply_memory: Arc<crate::link::stream_fs::ReplyMemory>,
    /// The remote listener's tokens (`--token-file`): remote links per token.
    pub auth: Option<Arc<crate::net::auth::Auth>>,
    /// Remote links per client certificate subject (callers without a token).
    pub certificates: Arc<crate::net::auth::CertificateFigures>,
}

impl Figures {
    /// The daemon's own figures first, then the linker's.
    pub fn snapshot(&self) -> Snapshot {
        let mut s = self.linker.snapshot();
        let mut own = vec![("auth_failures", self.auth_failures.load(Ordering::Relaxed), Kind::Counter)];
        own.extend(self.blobs.counters());
        own.extend(self.staged.counters());
        own.extend(self.connections.counters());
        own.extend(self.remote_links.counters());
        own.extend(self.reply_memory.counters());
        s.prepend(own);
        s.tokens = self.auth.as_ref().map(|a| a.figures()).unwrap_or_default();
        s.certificates = self.certificates.figures();
        s
    }
}

/// What the daemon's own figures mean (the linker's: `nvlinkd_core::stats::help`).
const HELP: &[(&str, &str)] = &[
    ("auth_failures", "Calls refused for a missing or wrong token"),
    ("input_bytes_received", "Bytes of input files remote shims sent"),
    ("blob_hits", "Remote inputs found in the blob store by digest (not sent again)"),
    ("blob_misses", "Remote inputs the blob store lacked and asked the shim for"),
    ("blob_rejected", "Remote inputs refused: their bytes did not match the announced digest"),
    ("blob_mem_bytes", "Bytes of remote inputs (blobs) in memory"),
    ("blob_disk_bytes", "Bytes of remote inputs (blobs) on disk"),
    ("outputs_staged", "Output files written beside their target for local shims"),
    ("output_bytes_staged", "Bytes of output files written beside their target for local shims"),
    ("tcp_connections", "TCP connections open now"),
    ("tcp_connections_refused", "TCP connections closed at once: past the total or per-address cap"),
    (
        "tcp_connections_refused_reserved",
        "TCP connections refused (also in tcp_connections_refused) from addresses with no authenticated call in the \
         last hour: only the slots reserved for those were left",
    ),
    ("tcp_accept_backoffs", "Times accepting paused for want of file descriptors or memory"),
    ("tls_handshake_failures", "TLS handshakes that failed or timed out"),
    ("tcp_closed_unauthenticated", "TCP connections closed for making no authenticated call in time"),
    ("tcp_closed_idle", "TCP connections closed after a long time with no call open"),
    ("remote_links", "Remote links holding a slot now"),
    ("remote_links_waiting", "Remote links waiting for a slot"),
    ("partial_message_bytes", "Bytes of remote shims' messages received in part"),
    ("partial_messages_refused", "Remote streams ended: their message received in part did not fit the budget"),
    (
        "remote_links_refused",
        "Remote links refused: no slot within the wait, or too many waiting (their shims ran the real nvlink)",
    ),
    ("reply_memory_bytes", "Bytes of shims' file replies the daemon holds now (gathered pieces, replies links hold)"),
    (
        "reply_memory_refused",
        "File replies refused: past --max-reply-memory (their links were left to the real nvlink)",
    ),
    ("token_links", "Remote links served, by the name of their token (--token-file)"),
    ("certificate_links", "Remote links served, by the subject of their client certificate (--client-ca, no token)"),
    (
        "certificate_refused",
        "Remote links refused before they started (no slot in time), by client certificate subject",
    ),
    ("certificate_received_bytes", "Bytes of input files received from remote shims, by client certificate subject"),
    ("certificate_sent_bytes", "Bytes of answers sent to remote shims, by client certificate subject"),
    ("token_refused", "Remote links refused before they started (no slot in time), by the name of their token"),
    ("token_received_bytes", "Bytes of input files remote shims sent, by the name of their token"),
    ("token_sent_bytes", "Bytes of answers sent to remote shims, by the name of their token"),
    ("remote_cache_hits", "Links served from the shared (REAPI) cache tier"),
    ("remote_cache_misses", "Lookups the shared (REAPI) cache tier did not answer"),
    ("remote_cache_errors", "Shared-tier lookups that failed"),
    ("remote_cache_rejected", "Shared-tier entries refused: not signed with the fleet key, or damaged"),
    ("remote_cache_skipped", "Shared-tier lookups and writes skipped while the server was failing"),
    (
        "remote_cache_busy",
        "Shared-tier calls the server refused as busy (RESOURCE_EXHAUSTED), made again after a pause",
    ),
    ("remote_cache_uploads", "Entries written to the shared tier"),
    ("remote_cache_upload_errors", "Shared-tier writes that failed"),
    ("remote_cache_uploads_dropped", "Shared-tier writes dropped: the upload queue was full"),
    ("remote_cache_uploads_pending", "Shared-tier writes waiting or running"),
    ("remote_cache_uploaded_bytes", "Bytes written to the shared tier"),
    ("remote_cache_downloaded_bytes", "Bytes of the entries served from the shared tier"),
    (
        "remote_cache_bytes_read",
        "Bytes of shared-tier blobs received, kept or refused (downloaded_bytes counts the entries kept)",
    ),
    ("remote_cache_stream_reads", "Shared-tier blobs read through the ByteStream API"),
    ("remote_cache_stream_writes", "Shared-tier blobs written through the ByteStream API"),
];

/// What a figure of [`Figures::snapshot`] means, in one line.
pub fn help(name: &str) -> Option<String> {
    HELP.iter().find(|(n, _)| *n == name).map(|(_, h)| (*h).to_owned()).or_else(|| nvlinkd_core::stats::help(name))
}
