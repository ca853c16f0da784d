//! Prometheus metrics on `--metrics-listen HOST:PORT`, at `/metrics`.
//!
//! Two sources, one registry (prometheus-client, OpenMetrics text):
//!
//! - what the service sees of each link, recorded as it answers
//!   ([`record_link`]): `nvlinkd_links_total{engine,cache}`, the latency
//!   histogram `nvlinkd_link_duration_seconds{engine}`, and the bytes received
//!   from and sent to shims;
//! - the daemon's figures, read at each scrape ([`StatsCollector`], one
//!   [`Figures`] snapshot): the same figures as `nvlinkd stats --json` — every
//!   counter as `nvlinkd_<name>_total`, the gauges (links in flight, workers,
//!   cache bytes, connections) as `nvlinkd_<name>` (`uptime_s` as
//!   `nvlinkd_uptime_seconds`), and per cache level
//!   `nvlinkd_cache_hits_total{level}` / `nvlinkd_cache_misses_total{level}`
//!   (`link`, `jit`, `nvvm`, `ptxas`), and per token of `--token-file`
//!   `nvlinkd_token_links_total{token}`, `nvlinkd_token_refused_total{token}`,
//!   `nvlinkd_certificate_links_total{subject}` (and `_refused`, bytes) for
//!   callers identified by a client certificate alone,
//!   `nvlinkd_token_received_bytes_total{token}`,
//!   `nvlinkd_token_sent_bytes_total{token}` (by the token's name); each with
//!   its own HELP ([`crate::observe::help`]);
//! - `nvlinkd_build_info{version}` and the process's `process_*` figures (CPU
//!   seconds, resident memory, open and maximum descriptors, start time).
//!
//! Formats: OpenMetrics text to a scraper that asks for it (`Accept:
//! application/openmetrics-text`, as Prometheus does), else the classic text
//! format 0.0.4 (`promtool check metrics`, curl), converted from the same
//! encoding ([`classic`]).
//!
//! Beside it, probes for orchestrators and load balancers: `/healthz` answers
//! 200 while the process is alive, `/readyz` 200 while the daemon takes links
//! ([`Readiness`]: its listeners are up and its default toolkit is open) and
//! 503 before that and while it drains after a stop. The port answers until
//! the daemon is done, drain included.
//!
//! The endpoint has no authentication, by design (scrapers rarely carry
//! credentials): bind it to an internal address, never to the address the
//! shims reach. It serves plain HTTP/1.1 with hyper; anything but `GET` of
//! these three paths is a 404.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use nvlinkd_core::Linker;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tracing::{debug, info};

use crate::observe::Figures;
use nvlinkd_core::stats::Kind;

type Labels = Vec<(&'static str, &'static str)>;

/// What the service records per link.
struct LinkMetrics {
    links: Family<Labels, Counter>,
    latency: Family<Labels, Histogram, fn() -> Histogram>,
    received: Counter,
    sent: Counter,
}

fn latency_histogram() -> Histogram {
    // 1 ms to about 35 min: past the default worker time limit (30 min).
    Histogram::new(exponential_buckets(0.001, 2.0, 22))
}

static LINKS: OnceLock<LinkMetrics> = OnceLock::new();

fn links() -> &'static LinkMetrics {
    LINKS.get_or_init(|| LinkMetrics {
        links: Family::default(),
        latency: Family::new_with_constructor(latency_histogram as fn() -> Histogram),
        received: Counter::default(),
        sent: Counter::default(),
    })
}

/// Record one answered link: which engine answered (`in_process`, `nvlink`,
/// `frontend`, `cache`, `fallback`), whether it was a whole-link cache hit
/// (`hit`, `miss`, or `none` where no cache applies), how long it took, and the
/// bytes it received from and sent to the shim.
pub fn record_link(engine: &'static str, cache: &'static str, took: Duration, received: u64, sent: u64) {
    let m = links();
    m.links.get_or_create(&vec![("engine", engine), ("cache", cache)]).inc();
    m.latency.get_or_create(&vec![("engine", engine)]).observe(took.as_secs_f64());
    m.received.inc_by(received);
    m.sent.inc_by(sent);
}

/// The daemon's figures at scrape time.
struct StatsCollector(Figures);

impl std::fmt::Debug for StatsCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StatsCollector")
    }
}

/// Per-level cache counters: (level, hits, misses) in the stats.
const LEVELS: &[(&str, &str, &str)] = &[
    ("link", "cache_hits", "cache_misses"),
    ("jit", "jit_hits", "jit_misses"),
    ("nvvm", "nvvm_hits", "nvvm_misses"),
    ("ptxas", "ptxas_hits", "ptxas_misses"),
];

impl Collector for StatsCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let snapshot = self.0.snapshot();
        let stats = &snapshot;
        let get = |name: &str| stats.get(name).unwrap_or(0);
        for (hits_or_misses, pick) in [("hits", 1usize), ("misses", 2)] {
            let name = format!("cache_{hits_or_misses}");
            let help = format!("Cache {hits_or_misses} per level (link: whole links; jit, nvvm, ptxas: artifacts)");
            let kind = ConstCounter::new(0u64).metric_type();
            let mut family = encoder.encode_descriptor(&name, &help, None, kind)?;
            for level in LEVELS {
                let counter = if pick == 1 { level.1 } else { level.2 };
                let labels = [("level", level.0)];
                ConstCounter::new(get(counter)).encode(family.encode_family(&labels)?)?;
            }
        }
        for &(name, v, kind) in &stats.values {
            if LEVELS.iter().any(|l| l.1 == name || l.2 == name) {
                // Already in the per-level families above.
                continue;
            }
            let help = crate::observe::help(name).unwrap_or_else(|| format!("nvlinkd figure {name}"));
            // Prometheus spells units out.
            let name = if name == "uptime_s" { "uptime_seconds" } else { name };
            if kind == Kind::Gauge {
                let g = ConstGauge::new(v as i64);
                g.encode(encoder.encode_descriptor(name, &help, None, g.metric_type())?)?;
            } else {
                let c = ConstCounter::new(v);
                c.encode(encoder.encode_descriptor(name, &help, None, c.metric_type())?)?;
            }
        }
        // Per token (`--token-file`), labelled by its name (letters, digits, `.`, `_`, `-`);
        // per client certificate subject where callers present no token.
        for (figures, prefix, label) in
            [(&stats.tokens, "token", "token"), (&stats.certificates, "certificate", "subject")]
        {
            if figures.is_empty() {
                continue;
            }
            for (pick, what) in [(0usize, "links"), (1, "refused"), (2, "received_bytes"), (3, "sent_bytes")] {
                let family_name = format!("{prefix}_{what}");
                let help =
                    crate::observe::help(&family_name).unwrap_or_else(|| format!("nvlinkd figure {family_name}"));
                let kind = ConstCounter::new(0u64).metric_type();
                let mut family = encoder.encode_descriptor(&family_name, &help, None, kind)?;
                for (who, f) in figures {
                    let labels = [(label, who.as_str())];
                    ConstCounter::new(f.named()[pick].1).encode(family.encode_family(&labels)?)?;
                }
            }
        }
        let info = ConstGauge::new(1i64);
        let mut family = encoder.encode_descriptor("build_info", "The daemon's version", None, info.metric_type())?;
        info.encode(family.encode_family(&[("version", env!("CARGO_PKG_VERSION"))])?)?;
        Ok(())
    }
}

/// The process's own figures, as Prometheus's client libraries name them.
#[derive(Debug)]
struct ProcessCollector {
    started: f64,
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        // SAFETY: rusage and rlimit are plain data, zeroed is valid; the calls
        // fill them for this process.
        let (usage, files) = unsafe {
            let mut u: libc::rusage = std::mem::zeroed();
            libc::getrusage(libc::RUSAGE_SELF, &mut u);
            let mut l: libc::rlimit = std::mem::zeroed();
            libc::getrlimit(libc::RLIMIT_NOFILE, &mut l);
            (u, l)
        };
        let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
        let cpu = seconds(usage.ru_utime) + seconds(usage.ru_stime);
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as u64;
        let resident = std::fs::read_to_string("/proc/self/statm")
            .ok()
            .and_then(|s| s.split_whitespace().nth(1).and_then(|p| p.parse::<u64>().ok()))
            .map_or(0, |pages| pages * page);
        let open = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count());
        let c = ConstCounter::new(cpu);
        c.encode(encoder.encode_descriptor(
            "cpu_seconds",
            "CPU time of the daemon, user and system",
            None,
            c.metric_type(),
        )?)?;
        let gauges: [(&str, &str, f64); 4] = [
            ("resident_memory_bytes", "Resident memory of the daemon", resident as f64),
            ("open_fds", "File descriptors the daemon has open", open as f64),
            ("max_fds", "The daemon's soft limit of open files", files.rlim_cur as f64),
            ("start_time_seconds", "When the daemon started, seconds since the epoch", self.started),
        ];
        for (name, help, v) in gauges {
            let g = ConstGauge::new(v);
            g.encode(encoder.encode_descriptor(name, help, None, g.metric_type())?)?;
        }
        Ok(())
    }
}

fn registry(figures: Figures) -> Registry {
    let mut r = Registry::default();
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64() - figures.linker.snapshot().get("uptime_s").unwrap_or(0) as f64);
    r.sub_registry_with_prefix("process").register_collector(Box::new(ProcessCollector { started }));
    let r2 = r.sub_registry_with_prefix("nvlinkd");
    fill(r2, figures);
    r
}

fn fill(r: &mut Registry, figures: Figures) {
    let m = links();
    r.register("links", "Links answered, by engine and whole-link cache result", m.links.clone());
    r.register("link_duration_seconds", "Time from a link's start to its answer, by engine", m.latency.clone());
    r.register("link_received_bytes", "Input bytes received from shims", m.received.clone());
    r.register("link_sent_bytes", "Output bytes (files, stdout, stderr) sent to shims", m.sent.clone());
    r.register_collector(Box::new(StatsCollector(figures)));
}

/// Whether the daemon takes links, for `/readyz`.
#[derive(Default)]
pub struct Readiness {
    listening: AtomicBool,
    draining: AtomicBool,
}

impl Readiness {
    /// The listeners are up.
    pub fn listening(&self) {
        self.listening.store(true, Ordering::SeqCst);
    }
    /// A stop began: no new links.
    pub fn drain(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }
    /// Ready, or why not.
    fn check(&self, linker: &Linker) -> Result<(), &'static str> {
        if self.draining.load(Ordering::SeqCst) {
            Err("draining: the daemon is stopping")
        } else if !self.listening.load(Ordering::SeqCst) {
            Err("starting: the listeners are not up yet")
        } else if !linker.toolkit_ready() {
            Err("starting: the toolkit is not usable yet")
        } else {
            Ok(())
        }
    }
}

/// What the endpoint reports.
pub struct Sources {
    pub figures: Figures,
    pub readiness: Arc<Readiness>,
}

/// Connections of the metrics port open at once.
const MAX_CONNECTIONS: usize = 32;
/// Of them, from one address (an IPv6 /64 as one): one process keeping idle
/// connections open cannot take the probes' (the kubelet's, a scraper's).
/// Past it the address's oldest connection is closed for the new one: a
/// probe from the same address as a process holding idle connections (a
/// local user on 127.0.0.1, or the kubelet's node) still gets its answer.
const MAX_PER_ADDRESS: usize = MAX_CONNECTIONS / 4;

/// The metrics port's connections by address, oldest first; a slot given
/// back when dropped.
#[derive(Default)]
struct PerAddress {
    open: std::sync::Mutex<PerAddressState>,
}

#[derive(Default)]
struct PerAddressState {
    next: u64,
    /// Per address: each connection's id and the sender whose drop closes it.
    by_address: HashMap<std::net::IpAddr, VecDeque<(u64, tokio::sync::oneshot::Sender<()>)>>,
}

struct AddressSlot(Arc<PerAddress>, std::net::IpAddr, u64);

impl PerAddress {
    /// A slot for a new connection from `addr`, and what tells it to close;
    /// the address's oldest connection is told to close when it has
    /// [`MAX_PER_ADDRESS`] already.
    fn take(self: &Arc<Self>, addr: std::net::IpAddr) -> (AddressSlot, tokio::sync::oneshot::Receiver<()>) {
        let addr = crate::net::incoming::peer_group(addr);
        let mut st = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let id = st.next;
        st.next += 1;
        let (close, closed) = tokio::sync::oneshot::channel();
        let open = st.by_address.entry(addr).or_default();
        if open.len() >= MAX_PER_ADDRESS {
            // Dropping its sender closes it.
            open.pop_front();
        }
        open.push_back((id, close));
        (AddressSlot(self.clone(), addr, id), closed)
    }
}

impl Drop for AddressSlot {
    fn drop(&mut self) {
        let mut st = self.0.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(open) = st.by_address.get_mut(&self.1) {
            open.retain(|(id, _)| *id != self.2);
            if open.is_empty() {
                st.by_address.remove(&self.1);
            }
        }
    }
}

/// Serve `/metrics`, `/healthz` and `/readyz` on `listener` until `stop` resolves.
pub async fn serve(listener: TcpListener, sources: Sources, stop: impl std::future::Future<Output = ()>) {
    let Sources { figures, readiness } = sources;
    let linker = figures.linker.clone();
    let registry = Arc::new(registry(figures));
    if let Ok(a) = listener.local_addr() {
        info!(metrics = %a, "serving Prometheus metrics at /metrics, probes at /healthz and /readyz");
    }
    // Scrapers and probes are few: past MAX_CONNECTIONS a connection is
    // closed at once, and accepting waits out a lack of descriptors instead
    // of spinning (a flood of the port had the daemon at 87% CPU and local
    // links 100 times slower).
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let per_address = Arc::new(PerAddress::default());
    let accept = async {
        let mut backoff = Duration::from_millis(10);
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok((stream, peer)) => {
                    backoff = Duration::from_millis(10);
                    (stream, peer)
                }
                Err(e) if crate::net::incoming::out_of_resources(&e) => {
                    debug!("metrics port: accept failed ({e}); waiting {}ms", backoff.as_millis());
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                    continue;
                }
                Err(_) => continue,
            };
            let (mine, closed) = per_address.take(peer.ip());
            let Ok(slot) = slots.clone().try_acquire_owned() else {
                drop(stream);
                continue;
            };
            let (registry, linker, readiness) = (registry.clone(), linker.clone(), readiness.clone());
            tokio::spawn(async move {
                let _slot = (slot, mine);
                let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                    let ready = readiness.check(&linker);
                    let registry = registry.clone();
                    async move { Ok::<_, std::convert::Infallible>(answer(&req, &registry, ready)) }
                });
                let conn = hyper::server::conn::http1::Builder::new()
                    .timer(hyper_util::rt::TokioTimer::new())
                    .header_read_timeout(Duration::from_secs(2))
                    .serve_connection(TokioIo::new(stream), service);
                tokio::select! {
                    done = conn => {
                        if let Err(e) = done {
                            debug!("metrics connection: {e}");
                        }
                    }
                    // A newer connection from the same address took its place.
                    _ = closed => debug!("metrics connection closed for a newer one from its address"),
                }
            });
        }
    };
    tokio::select! {
        _ = accept => {}
        _ = stop => {}
    }
}

fn answer(
    req: &Request<hyper::body::Incoming>,
    registry: &Registry,
    ready: Result<(), &'static str>,
) -> Response<Full<Bytes>> {
    let reply = |status, ctype: &'static str, body: String| {
        let mut r = Response::new(Full::new(Bytes::from(body)));
        *r.status_mut() = status;
        r.headers_mut().insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static(ctype));
        r
    };
    if req.method() != hyper::Method::GET {
        return reply(StatusCode::NOT_FOUND, "text/plain", "not found: GET /metrics, /healthz or /readyz\n".into());
    }
    match req.uri().path() {
        "/metrics" => {}
        "/healthz" => return reply(StatusCode::OK, "text/plain", "ok\n".into()),
        "/readyz" => {
            return match ready {
                Ok(()) => reply(StatusCode::OK, "text/plain", "ready\n".into()),
                Err(why) => reply(StatusCode::SERVICE_UNAVAILABLE, "text/plain", format!("{why}\n")),
            }
        }
        _ => {
            return reply(StatusCode::NOT_FOUND, "text/plain", "not found: GET /metrics, /healthz or /readyz\n".into())
        }
    }
    let openmetrics = req
        .headers()
        .get_all(hyper::header::ACCEPT)
        .iter()
        .any(|v| v.to_str().is_ok_and(|v| v.contains("application/openmetrics-text")));
    let mut body = String::new();
    match prometheus_client::encoding::text::encode(&mut body, registry) {
        Ok(()) if openmetrics => {
            reply(StatusCode::OK, "application/openmetrics-text; version=1.0.0; charset=utf-8", body)
        }
        Ok(()) => reply(StatusCode::OK, "text/plain; version=0.0.4; charset=utf-8", classic(&body)),
        Err(_) => reply(StatusCode::INTERNAL_SERVER_ERROR, "text/plain", "encoding failed\n".into()),
    }
}

/// OpenMetrics text as the classic text format 0.0.4: a counter family's
/// `HELP` and `TYPE` name its `_total` samples, `UNIT` lines and `# EOF` go,
/// `unknown` is `untyped`. (prometheus-client writes OpenMetrics only; the
/// samples are the same.)
fn classic(openmetrics: &str) -> String {
    let counters: std::collections::HashSet<&str> =
        openmetrics.lines().filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" counter")).collect();
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let meta = ["# HELP ", "# TYPE "].into_iter().find_map(|p| Some((p, line.strip_prefix(p)?)));
        match meta {
            Some((prefix, rest)) => {
                let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
                let tail = if tail == "unknown" { "untyped" } else { tail };
                let total = if counters.contains(name) { "_total" } else { "" };
                out.push_str(&format!("{prefix}{name}{total} {tail}\n"));
            }
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::classic;

    #[test]
    fn classic_text_names_counters_by_their_samples() {
        let om = "# HELP x_requests Link requests.\n# TYPE x_requests counter\nx_requests_total 3\n\
                  # HELP x_up Up.\n# TYPE x_up gauge\n# UNIT x_up seconds\nx_up 1\n# EOF\n";
        assert_eq!(
            classic(om),
            "# HELP x_requests_total Link requests.\n# TYPE x_requests_total counter\nx_requests_total 3\n\
             # HELP x_up Up.\n# TYPE x_up gauge\nx_up 1\n"
        );
    }
}
