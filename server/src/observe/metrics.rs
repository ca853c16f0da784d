//! Prometheus metrics on `--metrics-listen HOST:PORT`, at `/metrics`.
//!
//! Two sources, one registry (prometheus-client, OpenMetrics text):
//!
//! - what the service sees of each link, recorded as it answers
//!   ([`record_link`]): `nvlinkd_links_total{engine,cache}`, the latency
//!   histogram `nvlinkd_link_duration_seconds{engine}`, and the bytes received
//!   from and sent to shims;
//! - the daemon's figures, read at each scrape ([`StatsCollector`]): the
//!   same [`Figures`] snapshot as `nvlinkd stats --json` — every counter as
//!   `nvlinkd_<name>_total`, the gauges (links in flight, workers, cache bytes)
//!   as `nvlinkd_<name>`, and per cache level `nvlinkd_cache_hits_total{level}` /
//!   `nvlinkd_cache_misses_total{level}` (`link`, `jit`, `nvvm`, `ptxas`), the
//!   shared tier's `nvlinkd_remote_cache_*`, the blob store's `nvlinkd_blob_*`,
//!   `nvlinkd_input_bytes_received_total`, the TCP listener's `nvlinkd_tcp_*`
//!   and the remote links' `nvlinkd_remote_links*`. New counters appear
//!   without changes here.
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

use super::Figures;
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

/// The daemon's figures at scrape time, as `nvlinkd stats --json` has them.
struct StatsCollector(Figures);

impl std::fmt::Debug for StatsCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StatsCollector")
    }
}

/// What the figures that go up and down mean (whether a figure is a gauge is
/// the snapshot's word, `Kind`; this is only their help text).
const GAUGES: &[(&str, &str)] = &[
    ("in_flight", "Links being served now"),
    ("uptime_s", "Seconds since the daemon started"),
    ("workers", "nvJitLink worker processes alive"),
    ("cache_mem_bytes", "Bytes in the memory cache tier"),
    ("cache_disk_bytes", "Bytes in the disk cache tier"),
    ("cache_disk", "Whether the disk cache tier is on (1) or off (0)"),
    ("decoded_input_bytes", "Bytes of decoded inputs kept for reuse"),
    ("input_memo_bytes", "Bytes of local input files kept for the links reading them"),
    ("remote_cache_uploads_pending", "Shared-cache uploads waiting or running"),
    ("blob_mem_bytes", "Bytes of remote inputs (blobs) in memory"),
    ("blob_disk_bytes", "Bytes of remote inputs (blobs) on disk"),
    ("queued", "Links waiting for a slot"),
    ("running_foreground", "Foreground links computing now"),
    ("running_background", "Background links computing now"),
    ("verify_pending", "Links waiting to be checked against the real nvlink"),
    ("tcp_connections", "TCP connections open now"),
    ("remote_links", "Remote links holding a slot now"),
    ("remote_links_waiting", "Remote links waiting for a slot"),
];

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
            if kind == Kind::Gauge {
                let help = GAUGES.iter().find(|(g, _)| *g == name).map_or("nvlinkd gauge", |(_, h)| h);
                let g = ConstGauge::new(v as i64);
                g.encode(encoder.encode_descriptor(name, help, None, g.metric_type())?)?;
            } else {
                let c = ConstCounter::new(v);
                let help = format!("nvlinkd stats counter {name}");
                c.encode(encoder.encode_descriptor(name, &help, None, c.metric_type())?)?;
            }
        }
        Ok(())
    }
}

fn registry(figures: Figures) -> Registry {
    let mut r = Registry::with_prefix("nvlinkd");
    let m = links();
    r.register("links", "Links answered, by engine and whole-link cache result", m.links.clone());
    r.register("link_duration_seconds", "Time from a link's start to its answer, by engine", m.latency.clone());
    r.register("link_received_bytes", "Input bytes received from shims", m.received.clone());
    r.register("link_sent_bytes", "Output bytes (files, stdout, stderr) sent to shims", m.sent.clone());
    r.register_collector(Box::new(StatsCollector(figures)));
    r
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
    /// Every figure of `nvlinkd stats --json`.
    pub figures: Figures,
    pub readiness: Arc<Readiness>,
}

/// Serve `/metrics`, `/healthz` and `/readyz` on `listener` until `stop` resolves.
pub async fn serve(listener: TcpListener, sources: Sources, stop: impl std::future::Future<Output = ()>) {
    let Sources { figures, readiness } = sources;
    let linker = figures.linker.clone();
    let registry = Arc::new(registry(figures));
    if let Ok(a) = listener.local_addr() {
        info!(metrics = %a, "serving Prometheus metrics at /metrics, probes at /healthz and /readyz");
    }
    let accept = async {
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            let (registry, linker, readiness) = (registry.clone(), linker.clone(), readiness.clone());
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                    let ready = readiness.check(&linker);
                    let registry = registry.clone();
                    async move { Ok::<_, std::convert::Infallible>(answer(&req, &registry, ready)) }
                });
                let conn = hyper::server::conn::http1::Builder::new()
                    .timer(hyper_util::rt::TokioTimer::new())
                    .header_read_timeout(Duration::from_secs(10))
                    .serve_connection(TokioIo::new(stream), service);
                if let Err(e) = conn.await {
                    debug!("metrics connection: {e}");
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
    let mut body = String::new();
    match prometheus_client::encoding::text::encode(&mut body, registry) {
        Ok(()) => reply(StatusCode::OK, "application/openmetrics-text; version=1.0.0; charset=utf-8", body),
        Err(_) => reply(StatusCode::INTERNAL_SERVER_ERROR, "text/plain", "encoding failed\n".into()),
    }
}
