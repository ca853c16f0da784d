//! The shared cache tier on a Remote Execution API v2 server (REAPI: BuildGrid,
//! bazel-remote, Buildbarn, NativeLink, BuildBuddy): `--remote-cache`.
//!
//! Every cache entry of the core (a whole link's entry, an NVVM, ptxas or JIT
//! artifact) is an ActionResult in the server's ActionCache, under an action
//! digest that is a deterministic function of the entry's kind and nvlinkd's
//! content key:
//!
//! - `Command { arguments: ["nvlinkd-cache", FORMAT, <kind>, <key hex>], output_paths: ["value"] }`
//! - `Action { command_digest: digest(Command), input_root_digest: digest(empty Directory) }`
//! - action digest = digest(Action), with the server's digest function
//!   (SHA-256, the REAPI default, unless the server offers only BLAKE3).
//!
//! The ActionResult has one output file, `value`, whose CAS blob is the entry
//! in an envelope naming its kind and key (`nvlkdr01`, kind, key, payload): a
//! blob is accepted only when it hashes to the digest the ActionResult names
//! *and* its envelope names the kind and key asked for, so neither a damaged
//! blob nor an ActionResult pointing at another entry's blob is ever used. The
//! Action and Command are uploaded too, so REAPI tools can show what an entry
//! is. Uploads ask `FindMissingBlobs` first and send only what is missing
//! (`BatchUpdateBlobs` for small blobs, ByteStream `Write` in chunks beyond the
//! server's batch limit); downloads use `BatchReadBlobs` or ByteStream `Read`.
//!
//! **The fleet key** (`--remote-cache-key FILE`). A digest proves nothing to
//! a reader: anyone with write access to the ActionCache and CAS can store an
//! ActionResult whose blob is a well-formed envelope of a wrong output. With a
//! fleet key, every envelope carries a MAC (keyed BLAKE3, the key derived from
//! the file's bytes) over its kind, key and payload (magic `nvlkdr02`), and an
//! entry whose MAC does not verify — written without the key, under another
//! key, or altered — is a miss, counted in `remote_cache_rejected`, never
//! served. The ActionResult carries a second MAC, over the action digest and
//! the digest (hash and size) of its blob (`execution_metadata`'s
//! `auxiliary_metadata`, a `BytesValue`): it is checked before the blob is
//! downloaded, so a forger without the key cannot make a lookup read a large
//! blob (each could cost up to [`MAX_BLOB`]) only to refuse it. Keyed entries
//! live under their own action digests (format `2k`; `1k` entries, without
//! the second MAC, are never looked up), so daemons with and without a key
//! never overwrite each other's entries.
//! Who must hold what: docs/trust.md, "Threat model of the farm".
//!
//! The tier is an optimisation, never a condition. Every call has a deadline
//! (`--remote-timeout`; a lookup as a whole too), failures are misses, and after
//! [`BREAKER_FAILURES`] failures in a row the tier is skipped for
//! [`BREAKER_OPEN`] (counted in `remote_cache_skipped`), so an unreachable or
//! slow server costs each link at most one deadline, and most links nothing.
//! A server that answers *busy* (`RESOURCE_EXHAUSTED`: BuildGrid past its
//! concurrent-RPC limit, a quota; REAPI's "the client may retry after a
//! delay") has not failed: the lookup or upload is made again after a short
//! pause, within the same deadline (counted in `remote_cache_busy`), and only
//! one still refused at its deadline is a failure. (Counted as failures, the
//! refusals of one burst of a fleet's replicas opened the breaker, and the
//! entries of that burst were never shared.)
//! Uploads run in the background (bounded by [`MAX_PENDING_UPLOAD_BYTES`];
//! beyond that they are dropped), so a link's answer never waits for them.
//!
//! The core is synchronous: [`RemoteCache`] implements the core's
//! `RemoteTier` by running the async client on the daemon's tokio runtime and
//! waiting for the answer from the link's (blocking) thread.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bazel_remote_apis::build::bazel::remote::execution::v2 as re;
use bazel_remote_apis::google::bytestream as bs;
use nvlinkd_core::cache::{Key, Kind, RemoteTier};
use prost::Message;
use re::action_cache_client::ActionCacheClient;
use re::capabilities_client::CapabilitiesClient;
use re::content_addressable_storage_client::ContentAddressableStorageClient;
use re::digest_function::Value as DigestFunction;
use tokio::sync::OnceCell;
use tonic::transport::{Channel, Endpoint};
use tracing::{debug, info, warn};

/// Part of every action: a new format of entries gets new action digests.
const FORMAT: &str = "1";
const ENVELOPE_MAGIC: &[u8; 8] = b"nvlkdr01";
/// Format and envelope of entries authenticated with a fleet key.
const FORMAT_KEYED: &str = "2k";
const ENVELOPE_MAGIC_KEYED: &[u8; 8] = b"nvlkdr02";
/// What an ActionResult's entry MAC is: `auxiliary_metadata` of this type.
const ENTRY_MAC_TYPE: &str = "type.googleapis.com/google.protobuf.BytesValue";
/// The first bytes MACed for an entry MAC (never an envelope's magic).
const ENTRY_MAC_DOMAIN: &[u8; 8] = b"nvlkdm01";
/// The BLAKE3 key-derivation context of fleet keys.
const FLEET_KEY_CONTEXT: &str = "nvlinkd 2026-11-26 shared cache fleet key v1";

/// The key that authenticates a fleet's shared-cache entries, derived from
/// the bytes of `--remote-cache-key`'s file (at least
/// [`MIN_SECRET`](crate::net::auth::MIN_SECRET) bytes besides surrounding
/// whitespace, as a token; 32 random bytes or more is the intent).
#[derive(Clone)]
pub struct FleetKey([u8; 32]);

impl FleetKey {
    pub fn from_file_bytes(bytes: &[u8]) -> FleetKey {
        FleetKey(blake3::derive_key(FLEET_KEY_CONTEXT, bytes))
    }
    fn mac(&self, data: &[u8]) -> blake3::Hash {
        blake3::keyed_hash(&self.0, data)
    }

    /// The MAC of an entry's ActionResult: that the action `action` names
    /// the blob `blob` was written with this key.
    fn entry_mac(&self, action: &re::Digest, blob: &re::Digest) -> blake3::Hash {
        let mut h = blake3::Hasher::new_keyed(&self.0);
        h.update(ENTRY_MAC_DOMAIN);
        for d in [action, blob] {
            h.update(&(d.hash.len() as u64).to_le_bytes());
            h.update(d.hash.as_bytes());
            h.update(&d.size_bytes.to_le_bytes());
        }
        h.finalize()
    }
}

/// The execution metadata carrying an entry MAC (see [`FleetKey::entry_mac`]).
fn with_entry_mac(mac: blake3::Hash) -> re::ExecutedActionMetadata {
    re::ExecutedActionMetadata {
        worker: "nvlinkd".into(),
        auxiliary_metadata: vec![bazel_remote_apis::google::protobuf::Any {
            type_url: ENTRY_MAC_TYPE.into(),
            value: mac.as_bytes().to_vec().encode_to_vec(),
        }],
        ..Default::default()
    }
}

/// The entry MAC an ActionResult carries, if any.
fn entry_mac_of(result: &re::ActionResult) -> Option<blake3::Hash> {
    let metadata = result.execution_metadata.as_ref()?;
    let any = metadata.auxiliary_metadata.iter().find(|a| a.type_url == ENTRY_MAC_TYPE)?;
    let bytes: [u8; 32] = Vec::<u8>::decode(&any.value[..]).ok()?.try_into().ok()?;
    Some(blake3::Hash::from_bytes(bytes))
}

impl std::fmt::Debug for FleetKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FleetKey(..)")
    }
}
/// The output file of every nvlinkd action.
const OUTPUT: &str = "value";
/// Failures in a row after which the tier is skipped for a while.
const BREAKER_FAILURES: u32 = 3;
/// How long the tier is skipped after that.
const BREAKER_OPEN: Duration = Duration::from_secs(30);
/// The first pause before a lookup or upload the server refused as busy is
/// made again; it doubles with each refusal, up to [`BUSY_PAUSE_MAX`].
const BUSY_PAUSE: Duration = Duration::from_millis(20);
/// The longest pause between two tries of a call refused as busy.
const BUSY_PAUSE_MAX: Duration = Duration::from_millis(500);
/// Bytes of entries waiting to be uploaded; more are dropped (not shared).
const MAX_PENDING_UPLOAD_BYTES: u64 = 256 << 20;
/// Uploads running at once.
const MAX_UPLOADS: usize = 4;
/// Largest entry downloaded: no daemon uploads an entry larger than its
/// upload queue (`MAX_PENDING_UPLOAD_BYTES`, plus the envelope), so a larger
/// one is a forgery, refused before a byte of it is read (a forged 384 MiB
/// entry cost every lookup 10 s and 400 MB of memory).
const MAX_BLOB: i64 = MAX_PENDING_UPLOAD_BYTES as i64 + (1 << 20);
/// ByteStream chunk size (well under gRPC's default 4 MiB message limit).
const CHUNK: usize = 1 << 20;
/// The batch limit used when the server states none.
const DEFAULT_BATCH: i64 = 4 << 20;

/// `--remote-*` settings.
#[derive(Clone, Debug)]
pub struct RemoteOptions {
    /// `grpc://HOST:PORT` or `grpcs://HOST:PORT`.
    pub url: String,
    pub instance: String,
    /// Bearer token sent as `authorization` metadata.
    pub token: Option<String>,
    /// PEM CA certificate(s) for `grpcs://` (else the system roots).
    pub ca_pem: Option<Vec<u8>>,
    /// Deadline of each call, and of a lookup as a whole.
    pub timeout: Duration,
    /// Authenticates entries (`--remote-cache-key`): see the module doc.
    pub fleet_key: Option<FleetKey>,
}

#[derive(Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    errors: AtomicU64,
    /// Downloaded blobs that failed verification (digest or envelope).
    rejected: AtomicU64,
    /// Lookups and uploads skipped while the breaker is open.
    skipped: AtomicU64,
    /// Calls the server refused as busy, made again after a pause.
    busy: AtomicU64,
    uploads: AtomicU64,
    upload_errors: AtomicU64,
    uploads_dropped: AtomicU64,
    uploaded_bytes: AtomicU64,
    downloaded_bytes: AtomicU64,
    /// Bytes of CAS blobs received, kept or refused.
    bytes_read: AtomicU64,
    pending_uploads: AtomicU64,
    pending_upload_bytes: AtomicU64,
    /// Blobs moved with ByteStream (beyond the batch limit).
    stream_reads: AtomicU64,
    stream_writes: AtomicU64,
}

/// What the server said it supports (asked once).
#[derive(Clone, Copy, Debug)]
struct Caps {
    function: DigestFunction,
    max_batch: i64,
    update_enabled: bool,
}

struct Inner {
    channel: Channel,
    opts: RemoteOptions,
    caps: OnceCell<Caps>,
    counters: Counters,
    failures: AtomicU32,
    open_until: Mutex<Option<Instant>>,
    uploads: tokio::sync::Semaphore,
    upload_ids: AtomicU64,
}

/// The REAPI tier; see the module documentation.
pub struct RemoteCache {
    inner: Arc<Inner>,
    rt: tokio::runtime::Handle,
}

#[derive(Debug)]
enum Error {
    Rpc(tonic::Status),
    Timeout,
    /// The server's answer cannot be used (bad digest, bad envelope, missing output).
    Rejected(String),
    Unsupported(String),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Rpc(s) => write!(f, "{}: {}", s.code(), s.message()),
            Error::Timeout => write!(f, "deadline exceeded"),
            Error::Rejected(w) => write!(f, "rejected: {w}"),
            Error::Unsupported(w) => write!(f, "unsupported server: {w}"),
        }
    }
}

impl Error {
    /// The server refused the call as busy (`RESOURCE_EXHAUSTED`: its
    /// concurrency limit or a quota): it answers, and asks to be called again
    /// later; see the module doc.
    fn busy(&self) -> bool {
        matches!(self, Error::Rpc(s) if s.code() == tonic::Code::ResourceExhausted)
    }
}

impl From<tonic::Status> for Error {
    fn from(s: tonic::Status) -> Self {
        Error::Rpc(s)
    }
}

impl RemoteCache {
    /// A client for `opts.url`; connects lazily (an unreachable server at
    /// start is not an error: its lookups fail and are misses).
    pub fn new(opts: RemoteOptions, rt: tokio::runtime::Handle) -> Result<RemoteCache, String> {
        let (scheme, rest) = opts
            .url
            .split_once("://")
            .ok_or_else(|| format!("--remote-cache {}: expected grpc://HOST:PORT or grpcs://HOST:PORT", opts.url))?;
        let tls = match scheme {
            "grpc" | "http" => false,
            "grpcs" | "https" => true,
            _ => return Err(format!("--remote-cache {}: the scheme must be grpc:// or grpcs://", opts.url)),
        };
        let uri = format!("{}://{rest}", if tls { "https" } else { "http" });
        let mut endpoint = Endpoint::from_shared(uri)
            .map_err(|e| format!("--remote-cache {}: {e}", opts.url))?
            .connect_timeout(opts.timeout)
            .timeout(opts.timeout)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(30))
            .keep_alive_timeout(opts.timeout);
        if tls {
            let mut cfg = tonic::transport::ClientTlsConfig::new().with_native_roots();
            if let Some(pem) = &opts.ca_pem {
                cfg = cfg.ca_certificate(tonic::transport::Certificate::from_pem(pem));
            }
            endpoint = endpoint.tls_config(cfg).map_err(|e| format!("--remote-ca: {e}"))?;
        } else if opts.ca_pem.is_some() {
            return Err("--remote-ca needs a grpcs:// --remote-cache".into());
        }
        let channel = {
            let _in_runtime = rt.enter();
            endpoint.connect_lazy()
        };
        info!(url = %opts.url, instance = %opts.instance, "shared REAPI cache tier");
        Ok(RemoteCache {
            inner: Arc::new(Inner {
                channel,
                opts,
                caps: OnceCell::new(),
                counters: Counters::default(),
                failures: AtomicU32::new(0),
                open_until: Mutex::new(None),
                uploads: tokio::sync::Semaphore::new(MAX_UPLOADS),
                upload_ids: AtomicU64::new(0),
            }),
            rt,
        })
    }
}

impl RemoteTier for RemoteCache {
    fn get(&self, kind: Kind, key: &Key) -> Option<Vec<u8>> {
        let inner = &self.inner;
        let c = &inner.counters;
        if inner.breaker_open() {
            c.skipped.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let task = {
            let (inner, key) = (inner.clone(), *key);
            self.rt.spawn(async move {
                let deadline = Instant::now() + inner.opts.timeout;
                let lookup = inner.unless_busy(deadline, || inner.lookup(kind, &key));
                let got = tokio::time::timeout(inner.opts.timeout, lookup).await;
                let _ = tx.send(got.unwrap_or(Err(Error::Timeout)));
            })
        };
        // The task has its own deadline; this one only guards against a
        // runtime that is shutting down.
        let got = rx.recv_timeout(inner.opts.timeout + Duration::from_millis(200)).unwrap_or(Err(Error::Timeout));
        task.abort();
        match got {
            Ok(Some(v)) => {
                inner.success();
                c.hits.fetch_add(1, Ordering::Relaxed);
                c.downloaded_bytes.fetch_add(v.len() as u64, Ordering::Relaxed);
                Some(v)
            }
            Ok(None) => {
                inner.success();
                c.misses.fetch_add(1, Ordering::Relaxed);
                None
            }
            Err(Error::Rejected(why)) => {
                // The server answered: not a failure of the tier, but nothing usable.
                inner.success();
                warn!(kind, key = %hex(key), "shared cache entry rejected ({why}): a miss");
                c.rejected.fetch_add(1, Ordering::Relaxed);
                c.misses.fetch_add(1, Ordering::Relaxed);
                None
            }
            Err(e) => {
                c.errors.fetch_add(1, Ordering::Relaxed);
                c.misses.fetch_add(1, Ordering::Relaxed);
                inner.failure(&e);
                None
            }
        }
    }

    fn put(&self, kind: Kind, key: &Key, value: Arc<[u8]>) {
        let inner = &self.inner;
        let c = &inner.counters;
        if inner.breaker_open() {
            c.skipped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let size = value.len() as u64;
        if c.pending_upload_bytes.fetch_add(size, Ordering::Relaxed) + size > MAX_PENDING_UPLOAD_BYTES {
            c.pending_upload_bytes.fetch_sub(size, Ordering::Relaxed);
            c.uploads_dropped.fetch_add(1, Ordering::Relaxed);
            debug!("shared cache upload dropped: too many bytes waiting");
            return;
        }
        c.pending_uploads.fetch_add(1, Ordering::Relaxed);
        let (inner, key) = (inner.clone(), *key);
        self.rt.spawn(async move {
            let c = &inner.counters;
            let uploaded = match inner.uploads.acquire().await {
                Ok(_permit) => {
                    let deadline = Instant::now() + inner.opts.timeout;
                    inner.unless_busy(deadline, || inner.upload(kind, &key, &value)).await
                }
                Err(_) => Err(Error::Timeout),
            };
            match uploaded {
                Ok(bytes) => {
                    inner.success();
                    c.uploads.fetch_add(1, Ordering::Relaxed);
                    c.uploaded_bytes.fetch_add(bytes, Ordering::Relaxed);
                }
                Err(e) => {
                    c.upload_errors.fetch_add(1, Ordering::Relaxed);
                    if !matches!(e, Error::Unsupported(_)) {
                        inner.failure(&e);
                    }
                }
            }
            c.pending_upload_bytes.fetch_sub(size, Ordering::Relaxed);
            c.pending_uploads.fetch_sub(1, Ordering::Relaxed);
        });
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        let c = &self.inner.counters;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        vec![
            ("remote_cache_hits", l(&c.hits)),
            ("remote_cache_misses", l(&c.misses)),
            ("remote_cache_errors", l(&c.errors)),
            ("remote_cache_rejected", l(&c.rejected)),
            ("remote_cache_skipped", l(&c.skipped)),
            ("remote_cache_busy", l(&c.busy)),
            ("remote_cache_uploads", l(&c.uploads)),
            ("remote_cache_upload_errors", l(&c.upload_errors)),
            ("remote_cache_uploads_dropped", l(&c.uploads_dropped)),
            ("remote_cache_uploads_pending", l(&c.pending_uploads)),
            ("remote_cache_uploaded_bytes", l(&c.uploaded_bytes)),
            ("remote_cache_downloaded_bytes", l(&c.downloaded_bytes)),
            ("remote_cache_bytes_read", l(&c.bytes_read)),
            ("remote_cache_stream_reads", l(&c.stream_reads)),
            ("remote_cache_stream_writes", l(&c.stream_writes)),
        ]
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|b| format!("{b:02x}")).collect()
}

/// The digest of `data` with `f`.
fn digest(f: DigestFunction, data: &[u8]) -> re::Digest {
    let hash = match f {
        DigestFunction::Blake3 => hex(blake3::hash(data).as_bytes()),
        _ => {
            use sha2::Digest as _;
            hex(&sha2::Sha256::digest(data))
        }
    };
    re::Digest { hash, size_bytes: data.len() as i64 }
}

/// The blob of an entry: the payload in an envelope naming its kind and key,
/// followed, with a fleet key, by the MAC of everything before it.
fn envelope(kind: Kind, key: &Key, payload: &[u8], fleet: Option<&FleetKey>) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + 8 + kind.len() + 32 + payload.len() + 32);
    out.extend_from_slice(if fleet.is_some() { ENVELOPE_MAGIC_KEYED } else { ENVELOPE_MAGIC });
    out.extend_from_slice(&(kind.len() as u64).to_le_bytes());
    out.extend_from_slice(kind.as_bytes());
    out.extend_from_slice(key);
    out.extend_from_slice(payload);
    if let Some(k) = fleet {
        let mac = k.mac(&out);
        out.extend_from_slice(mac.as_bytes());
    }
    out
}

/// The payload of an envelope, if it is the one of `kind` and `key` and, with
/// a fleet key, its MAC verifies (`blake3::Hash` compares in constant time).
fn open_envelope(kind: Kind, key: &Key, mut blob: Vec<u8>, fleet: Option<&FleetKey>) -> Option<Vec<u8>> {
    let head = 8 + 8 + kind.len() + 32;
    let magic = if fleet.is_some() { ENVELOPE_MAGIC_KEYED } else { ENVELOPE_MAGIC };
    let tail = if fleet.is_some() { 32 } else { 0 };
    let ok = blob.len() >= head + tail
        && &blob[..8] == magic
        && blob[8..16] == (kind.len() as u64).to_le_bytes()
        && &blob[16..16 + kind.len()] == kind.as_bytes()
        && &blob[16 + kind.len()..head] == key;
    if !ok {
        return None;
    }
    if let Some(k) = fleet {
        let mac: [u8; 32] = blob.split_off(blob.len() - 32).try_into().ok()?;
        if k.mac(&blob) != blake3::Hash::from_bytes(mac) {
            return None;
        }
    }
    Some(blob.split_off(head))
}

/// The Action and Command of an entry, encoded: see the module documentation.
fn action_of(f: DigestFunction, kind: Kind, key: &Key, keyed: bool) -> (Vec<u8>, Vec<u8>) {
    let format = if keyed { FORMAT_KEYED } else { FORMAT };
    let command = re::Command {
        arguments: vec!["nvlinkd-cache".into(), format.into(), kind.into(), hex(key)],
        output_paths: vec![OUTPUT.into()],
        ..Default::default()
    }
    .encode_to_vec();
    let action = re::Action {
        command_digest: Some(digest(f, &command)),
        input_root_digest: Some(digest(f, &re::Directory::default().encode_to_vec())),
        ..Default::default()
    }
    .encode_to_vec();
    (action, command)
}

impl Inner {
    fn breaker_open(&self) -> bool {
        let mut open = self.open_until.lock().unwrap_or_else(|p| p.into_inner());
        match *open {
            Some(t) if Instant::now() < t => true,
            Some(_) => {
                // Half open: let calls try again; one more failure reopens it.
                *open = None;
                false
            }
            None => false,
        }
    }

    fn success(&self) {
        self.failures.store(0, Ordering::Relaxed);
    }

    fn failure(&self, e: &Error) {
        let n = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
        if n >= BREAKER_FAILURES {
            let mut open = self.open_until.lock().unwrap_or_else(|p| p.into_inner());
            if open.is_none() {
                warn!(url = %self.opts.url, failures = n, "shared cache unreachable or failing ({e}): skipped for {}s", BREAKER_OPEN.as_secs());
            }
            *open = Some(Instant::now() + BREAKER_OPEN);
        } else {
            warn!(url = %self.opts.url, "shared cache call failed ({e}): treated as a miss");
        }
    }

    /// `op`, made again after a pause while the server refuses it as busy
    /// ([`Error::busy`]), as long as the next try starts before `deadline`;
    /// the pause doubles from [`BUSY_PAUSE`], each between half and all of
    /// its length (so that replicas refused together do not all come back
    /// together). Each pause is counted in `remote_cache_busy`.
    async fn unless_busy<T, F, Fut>(&self, deadline: Instant, mut op: F) -> Result<T, Error>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, Error>>,
    {
        let mut pause = BUSY_PAUSE;
        loop {
            match op().await {
                Err(e) if e.busy() => {
                    // A fresh RandomState's keys differ from call to call.
                    let r = std::hash::BuildHasher::build_hasher(&std::collections::hash_map::RandomState::new());
                    let wait = pause / 2 + pause.mul_f64((std::hash::Hasher::finish(&r) % 1000) as f64 / 2000.0);
                    if Instant::now() + wait >= deadline {
                        return Err(e);
                    }
                    self.counters.busy.fetch_add(1, Ordering::Relaxed);
                    debug!(url = %self.opts.url, pause_ms = wait.as_millis() as u64, "shared cache busy ({e}): trying again");
                    tokio::time::sleep(wait).await;
                    pause = (pause * 2).min(BUSY_PAUSE_MAX);
                }
                done => return done,
            }
        }
    }

    /// A request with the deadline and the token.
    fn request<T>(&self, msg: T) -> tonic::Request<T> {
        let mut r = tonic::Request::new(msg);
        r.set_timeout(self.opts.timeout);
        if let Some(t) = &self.opts.token {
            if let Ok(v) = format!("Bearer {t}").parse() {
                r.metadata_mut().insert("authorization", v);
            }
        }
        r
    }

    fn digest_function_field(&self, caps: &Caps) -> i32 {
        // SHA-256 is the default: left unset for servers older than the field.
        if caps.function == DigestFunction::Sha256 {
            0
        } else {
            caps.function as i32
        }
    }

    async fn caps(&self) -> Result<Caps, Error> {
        self.caps
            .get_or_try_init(|| async {
                let mut client = CapabilitiesClient::new(self.channel.clone());
                let caps = client
                    .get_capabilities(
                        self.request(re::GetCapabilitiesRequest { instance_name: self.opts.instance.clone() }),
                    )
                    .await?
                    .into_inner();
                let cache = caps.cache_capabilities.unwrap_or_default();
                let offered = &cache.digest_functions;
                let function = if offered.is_empty() || offered.contains(&(DigestFunction::Sha256 as i32)) {
                    DigestFunction::Sha256
                } else if offered.contains(&(DigestFunction::Blake3 as i32)) {
                    DigestFunction::Blake3
                } else {
                    return Err(Error::Unsupported(format!("digest functions {offered:?} (need SHA256 or BLAKE3)")));
                };
                let mut max_batch =
                    if cache.max_batch_total_size_bytes > 0 { cache.max_batch_total_size_bytes } else { DEFAULT_BATCH };
                // Test hook: a smaller batch limit sends every blob through ByteStream.
                if let Some(n) = std::env::var("NVLINKD_TEST_REMOTE_BATCH_BYTES").ok().and_then(|v| v.parse().ok()) {
                    max_batch = n;
                }
                let update_enabled = cache.action_cache_update_capabilities.is_some_and(|u| u.update_enabled);
                let caps = Caps { function, max_batch, update_enabled };
                info!(?caps, "shared cache capabilities");
                Ok(caps)
            })
            .await
            .copied()
    }

    /// The verified entry of `kind`/`key`, or None when the server has none.
    async fn lookup(&self, kind: Kind, key: &Key) -> Result<Option<Vec<u8>>, Error> {
        let caps = self.caps().await?;
        let fleet = self.opts.fleet_key.as_ref();
        let (action, _) = action_of(caps.function, kind, key, fleet.is_some());
        let action = digest(caps.function, &action);
        let mut ac = ActionCacheClient::new(self.channel.clone());
        let result = ac
            .get_action_result(self.request(re::GetActionResultRequest {
                instance_name: self.opts.instance.clone(),
                action_digest: Some(action.clone()),
                digest_function: self.digest_function_field(&caps),
                ..Default::default()
            }))
            .await;
        let result = match result {
            Ok(r) => r.into_inner(),
            Err(s) if s.code() == tonic::Code::NotFound => return Ok(None),
            Err(s) => return Err(s.into()),
        };
        let Some(file) = result.output_files.iter().find(|f| f.path == OUTPUT) else {
            return Err(Error::Rejected("no output file".into()));
        };
        let Some(d) = file.digest.clone() else { return Err(Error::Rejected("output without digest".into())) };
        // Before a byte of the blob is read: the fleet key's word that this
        // action names this blob (`blake3::Hash` compares in constant time).
        if let Some(k) = fleet {
            if entry_mac_of(&result) != Some(k.entry_mac(&action, &d)) {
                return Err(Error::Rejected("the fleet key does not authenticate the entry".into()));
            }
        }
        if !(0..=MAX_BLOB).contains(&d.size_bytes) {
            return Err(Error::Rejected(format!("blob size {}", d.size_bytes)));
        }
        let blob = if d.size_bytes + 1024 <= caps.max_batch.min(DEFAULT_BATCH) {
            let mut cas = ContentAddressableStorageClient::new(self.channel.clone());
            let r = cas
                .batch_read_blobs(self.request(re::BatchReadBlobsRequest {
                    instance_name: self.opts.instance.clone(),
                    digests: vec![d.clone()],
                    digest_function: self.digest_function_field(&caps),
                    ..Default::default()
                }))
                .await?
                .into_inner();
            let Some(r) = r.responses.into_iter().find(|r| r.digest.as_ref() == Some(&d)) else {
                return Err(Error::Rejected("blob not in the batch answer".into()));
            };
            self.counters.bytes_read.fetch_add(r.data.len() as u64, Ordering::Relaxed);
            match r.status.map(|s| s.code).unwrap_or(0) {
                0 => r.data,
                // The ActionResult outlived its blob (evicted): a miss.
                5 => return Ok(None),
                c => return Err(Error::Rpc(tonic::Status::new(tonic::Code::from(c), "BatchReadBlobs"))),
            }
        } else {
            match self.read_stream(&caps, &d).await {
                Err(Error::Rpc(s)) if s.code() == tonic::Code::NotFound => return Ok(None),
                r => r?,
            }
        };
        if digest(caps.function, &blob) != d {
            return Err(Error::Rejected("blob does not match its digest".into()));
        }
        let why = match fleet {
            Some(_) => "blob is another entry's, or the fleet key does not authenticate it",
            None => "blob is another entry's",
        };
        open_envelope(kind, key, blob, fleet).map(Some).ok_or_else(|| Error::Rejected(why.into()))
    }

    fn blob_name(&self, caps: &Caps, d: &re::Digest) -> String {
        let f = if caps.function == DigestFunction::Blake3 { "blake3/" } else { "" };
        format!("blobs/{f}{}/{}", d.hash, d.size_bytes)
    }

    fn resource(&self, tail: String) -> String {
        if self.opts.instance.is_empty() {
            tail
        } else {
            format!("{}/{tail}", self.opts.instance)
        }
    }

    async fn read_stream(&self, caps: &Caps, d: &re::Digest) -> Result<Vec<u8>, Error> {
        let mut client = bs::byte_stream_client::ByteStreamClient::new(self.channel.clone());
        let mut stream = client
            .read(self.request(bs::ReadRequest {
                resource_name: self.resource(self.blob_name(caps, d)),
                read_offset: 0,
                read_limit: 0,
            }))
            .await?
            .into_inner();
        // Grown as bytes arrive: the size is the server's word, not yet checked.
        let mut out = Vec::new();
        while let Some(chunk) = stream.message().await? {
            self.counters.bytes_read.fetch_add(chunk.data.len() as u64, Ordering::Relaxed);
            if out.len() + chunk.data.len() > d.size_bytes as usize {
                return Err(Error::Rejected("blob longer than its digest says".into()));
            }
            out.extend_from_slice(&chunk.data);
        }
        self.counters.stream_reads.fetch_add(1, Ordering::Relaxed);
        Ok(out)
    }

    /// Upload an entry: the blobs the server lacks, then the ActionResult.
    /// Returns the bytes sent.
    async fn upload(&self, kind: Kind, key: &Key, value: &[u8]) -> Result<u64, Error> {
        let caps = self.caps().await?;
        if !caps.update_enabled {
            return Err(Error::Unsupported("the ActionCache does not accept updates".into()));
        }
        let f = caps.function;
        let fleet = self.opts.fleet_key.as_ref();
        let (action, command) = action_of(f, kind, key, fleet.is_some());
        let blob = envelope(kind, key, value, fleet);
        let (action_digest, blob_digest) = (digest(f, &action), digest(f, &blob));
        let blobs = [(action_digest.clone(), &action), (digest(f, &command), &command), (blob_digest.clone(), &blob)];
        let mut cas = ContentAddressableStorageClient::new(self.channel.clone());
        let missing = cas
            .find_missing_blobs(self.request(re::FindMissingBlobsRequest {
                instance_name: self.opts.instance.clone(),
                blob_digests: blobs.iter().map(|(d, _)| d.clone()).collect(),
                digest_function: self.digest_function_field(&caps),
            }))
            .await?
            .into_inner()
            .missing_blob_digests;
        let mut sent = 0u64;
        let mut batch = Vec::new();
        let mut batch_bytes = 0i64;
        for (d, data) in blobs.iter().filter(|(d, _)| missing.contains(d)) {
            if d.size_bytes + 1024 + batch_bytes <= caps.max_batch.min(DEFAULT_BATCH) {
                batch_bytes += d.size_bytes + 1024;
                batch.push(re::batch_update_blobs_request::Request {
                    digest: Some(d.clone()),
                    data: data.to_vec(),
                    compressor: 0,
                });
            } else {
                self.write_stream(&caps, d, data).await?;
            }
            sent += d.size_bytes as u64;
        }
        if !batch.is_empty() {
            let r = cas
                .batch_update_blobs(self.request(re::BatchUpdateBlobsRequest {
                    instance_name: self.opts.instance.clone(),
                    requests: batch,
                    digest_function: self.digest_function_field(&caps),
                }))
                .await?
                .into_inner();
            if let Some(bad) = r.responses.iter().find(|r| r.status.as_ref().is_some_and(|s| s.code != 0)) {
                let s = bad.status.clone().unwrap_or_default();
                return Err(Error::Rpc(tonic::Status::new(tonic::Code::from(s.code), s.message)));
            }
        }
        let mut ac = ActionCacheClient::new(self.channel.clone());
        let execution_metadata = fleet.map(|k| with_entry_mac(k.entry_mac(&action_digest, &blob_digest)));
        ac.update_action_result(self.request(re::UpdateActionResultRequest {
            instance_name: self.opts.instance.clone(),
            action_result: Some(re::ActionResult {
                output_files: vec![re::OutputFile {
                    path: OUTPUT.into(),
                    digest: Some(blob_digest),
                    ..Default::default()
                }],
                exit_code: 0,
                execution_metadata,
                ..Default::default()
            }),
            action_digest: Some(action_digest),
            digest_function: self.digest_function_field(&caps),
            ..Default::default()
        }))
        .await?;
        debug!(kind, key = %hex(key), bytes = blob.len(), "uploaded to the shared cache");
        Ok(sent)
    }

    async fn write_stream(&self, caps: &Caps, d: &re::Digest, data: &[u8]) -> Result<(), Error> {
        let id = self.upload_ids.fetch_add(1, Ordering::Relaxed);
        // Any unique string will do; REAPI suggests a UUID.
        let h = blake3::hash(format!("{}-{id}-{:?}", std::process::id(), Instant::now()).as_bytes());
        let u = hex(&h.as_bytes()[..16]);
        let uuid = format!("{}-{}-{}-{}-{}", &u[..8], &u[8..12], &u[12..16], &u[16..20], &u[20..]);
        let name = self.resource(format!("uploads/{uuid}/{}", self.blob_name(caps, d)));
        let total = data.len();
        let mut chunks = Vec::new();
        let mut offset = 0;
        loop {
            let end = (offset + CHUNK).min(total);
            chunks.push(bs::WriteRequest {
                resource_name: if offset == 0 { name.clone() } else { String::new() },
                write_offset: offset as i64,
                finish_write: end == total,
                data: data[offset..end].to_vec(),
            });
            offset = end;
            if offset == total {
                break;
            }
        }
        let mut client = bs::byte_stream_client::ByteStreamClient::new(self.channel.clone());
        let r = client.write(self.request(tokio_stream::iter(chunks))).await?.into_inner();
        if r.committed_size != total as i64 {
            return Err(Error::Rpc(tonic::Status::data_loss(format!(
                "ByteStream committed {} of {total} bytes",
                r.committed_size
            ))));
        }
        self.counters.stream_writes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelopes_only_open_for_their_own_entry() {
        let (k1, k2) = ([1u8; 32], [2u8; 32]);
        let e = envelope("link", &k1, b"payload", None);
        assert_eq!(open_envelope("link", &k1, e.clone(), None).as_deref(), Some(&b"payload"[..]));
        assert!(open_envelope("link", &k2, e.clone(), None).is_none());
        assert!(open_envelope("nvvm", &k1, e.clone(), None).is_none());
        for n in 0..8 + 8 + 4 + 32 {
            assert!(open_envelope("link", &k1, e[..n].to_vec(), None).is_none());
        }
    }

    /// With a fleet key an envelope opens only with that key, whole and
    /// unaltered; an unkeyed envelope (what anyone can write) never does.
    #[test]
    fn fleet_keyed_envelopes_open_only_with_their_key() {
        let k = [1u8; 32];
        let (fleet, other) = (FleetKey::from_file_bytes(b"fleet secret"), FleetKey::from_file_bytes(b"another"));
        let e = envelope("link", &k, b"payload", Some(&fleet));
        assert_eq!(open_envelope("link", &k, e.clone(), Some(&fleet)).as_deref(), Some(&b"payload"[..]));
        assert!(open_envelope("link", &k, e.clone(), Some(&other)).is_none());
        assert!(open_envelope("link", &k, e.clone(), None).is_none());
        let forged = envelope("link", &k, b"payload", None);
        assert!(open_envelope("link", &k, forged, Some(&fleet)).is_none());
        for i in 0..e.len() {
            let mut altered = e.clone();
            altered[i] ^= 1;
            assert!(open_envelope("link", &k, altered, Some(&fleet)).is_none(), "byte {i} altered");
        }
        for n in 0..e.len() {
            assert!(open_envelope("link", &k, e[..n].to_vec(), Some(&fleet)).is_none());
        }
        let f = DigestFunction::Sha256;
        assert_ne!(action_of(f, "link", &k, true).0, action_of(f, "link", &k, false).0);
    }

    /// The ActionResult's MAC binds the action to its blob's hash and size
    /// under the key; it is read back from the ActionResult as written.
    #[test]
    fn entry_macs_bind_the_action_to_its_blob() {
        let f = DigestFunction::Sha256;
        let (fleet, other) = (FleetKey::from_file_bytes(b"fleet secret"), FleetKey::from_file_bytes(b"another"));
        let (a1, a2) = (digest(f, b"action 1"), digest(f, b"action 2"));
        let (b1, b2) = (digest(f, b"blob 1"), digest(f, b"blob 2"));
        let mac = fleet.entry_mac(&a1, &b1);
        let bigger = re::Digest { size_bytes: b1.size_bytes + 1, ..b1.clone() };
        for (what, other_mac) in [
            ("another action", fleet.entry_mac(&a2, &b1)),
            ("another blob", fleet.entry_mac(&a1, &b2)),
            ("another size", fleet.entry_mac(&a1, &bigger)),
            ("the two swapped", fleet.entry_mac(&b1, &a1)),
            ("another key", other.entry_mac(&a1, &b1)),
        ] {
            assert_ne!(mac, other_mac, "{what}");
        }
        let result = re::ActionResult { execution_metadata: Some(with_entry_mac(mac)), ..Default::default() };
        let result = re::ActionResult::decode(&result.encode_to_vec()[..]).unwrap();
        assert_eq!(entry_mac_of(&result), Some(mac));
        assert_eq!(entry_mac_of(&re::ActionResult::default()), None);
    }

    /// A call the server refuses as busy is made again, after pauses that
    /// each count, until it is answered; any other error ends it at once; one
    /// busy until its deadline gives up before the deadline, with the refusal.
    #[test]
    fn busy_answers_are_tried_again_within_the_deadline() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let opts = RemoteOptions {
            url: "grpc://127.0.0.1:9".into(),
            instance: String::new(),
            token: None,
            ca_pem: None,
            timeout: Duration::from_secs(5),
            fleet_key: None,
        };
        let cache = RemoteCache::new(opts, rt.handle().clone()).unwrap();
        let inner = &cache.inner;
        let busy = || Error::Rpc(tonic::Status::resource_exhausted("Concurrent RPC limit exceeded!"));
        let pauses = || inner.counters.busy.load(Ordering::Relaxed);
        let tries = AtomicU32::new(0);
        let far = Instant::now() + Duration::from_secs(60);

        let answered = rt.block_on(inner.unless_busy(far, || {
            let n = tries.fetch_add(1, Ordering::Relaxed);
            async move {
                if n < 3 {
                    Err(busy())
                } else {
                    Ok(n)
                }
            }
        }));
        assert_eq!(answered.ok(), Some(3));
        assert_eq!(pauses(), 3);

        tries.store(0, Ordering::Relaxed);
        let failed = rt.block_on(inner.unless_busy(far, || {
            tries.fetch_add(1, Ordering::Relaxed);
            async { Err::<(), _>(Error::Rpc(tonic::Status::unavailable("connection refused"))) }
        }));
        assert!(matches!(failed, Err(Error::Rpc(s)) if s.code() == tonic::Code::Unavailable));
        assert_eq!((tries.load(Ordering::Relaxed), pauses()), (1, 3), "only a busy answer is tried again");

        let t0 = Instant::now();
        let deadline = t0 + Duration::from_millis(300);
        let refused = rt.block_on(inner.unless_busy(deadline, || async { Err::<(), _>(busy()) }));
        assert!(refused.as_ref().is_err_and(Error::busy), "{refused:?}");
        assert!(Instant::now() <= deadline, "tried past its deadline: {:?}", t0.elapsed());
        assert!(pauses() > 3 + 1, "paused {} times in 300 ms", pauses() - 3);
    }

    #[test]
    fn action_digests_are_deterministic_per_kind_and_key() {
        let f = DigestFunction::Sha256;
        let a = |kind, key: &Key| digest(f, &action_of(f, kind, key, false).0);
        assert_eq!(a("link", &[7; 32]), a("link", &[7; 32]));
        assert_ne!(a("link", &[7; 32]), a("nvvm", &[7; 32]));
        assert_ne!(a("link", &[7; 32]), a("link", &[8; 32]));
        // SHA-256 of the empty string, as REAPI names the empty blob.
        assert_eq!(digest(f, b"").hash, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
        assert_eq!(digest(DigestFunction::Blake3, b"").hash, hex(blake3::hash(b"").as_bytes()));
    }
}
