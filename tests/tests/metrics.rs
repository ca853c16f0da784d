//! Prometheus metrics on `--metrics-listen`: scraped over HTTP and parsed
//! (names, labels, types); the link counters, the latency histogram and the
//! per-level cache counters move with real links.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};

use nvlinkd_tests::compare;
use nvlinkd_tests::corpus;
use nvlinkd_tests::daemon::Daemon;
use nvlinkd_tests::env::{real_nvlink, shim, TempDir};
use nvlinkd_tests::run::{run, Invocation};

/// `GET path` as Prometheus asks (OpenMetrics): (status line, content type, body).
fn get(addr: SocketAddr, path: &str) -> (String, String, String) {
    get_accepting(addr, path, "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5")
}

/// `GET path` with the given `Accept` (none when empty).
fn get_accepting(addr: SocketAddr, path: &str, accept: &str) -> (String, String, String) {
    let mut s = TcpStream::connect(addr).expect("connect to the metrics port");
    let accept = if accept.is_empty() { String::new() } else { format!("Accept: {accept}\r\n") };
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\n{accept}Connection: close\r\n\r\n").unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").expect("an HTTP answer");
    let status = head.lines().next().unwrap_or("").to_owned();
    let ctype = head
        .lines()
        .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-type:").map(|v| v.trim().to_owned()))
        .unwrap_or_default();
    (status, ctype, body.to_owned())
}

/// Samples by `name{labels}` (labels as written), and the declared type of
/// each family. Panics on a line that is not OpenMetrics text.
fn parse(body: &str) -> (BTreeMap<String, f64>, BTreeMap<String, String>) {
    let mut samples = BTreeMap::new();
    let mut types = BTreeMap::new();
    assert!(body.trim_end().ends_with("# EOF"), "no # EOF:\n{body}");
    for line in body.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, ty) = rest.split_once(' ').expect("# TYPE name type");
            types.insert(name.to_owned(), ty.to_owned());
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("not a sample: {line}"));
        let name_end = series.find('{').unwrap_or(series.len());
        let name = &series[..name_end];
        assert!(
            name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                && (name.starts_with("nvlinkd_") || name.starts_with("process_")),
            "bad metric name in {line}"
        );
        let v: f64 = value.parse().unwrap_or_else(|_| panic!("bad value in {line}"));
        assert!(samples.insert(series.to_owned(), v).is_none(), "duplicate series {series}");
    }
    (samples, types)
}

#[test]
fn metrics_are_prometheus_text_and_move_with_links() {
    let addr = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let d = Daemon::start_with(&["--metrics-listen", &addr.to_string()]);
    let (status, ctype, body) = get(addr, "/metrics");
    assert!(status.contains(" 200 "), "{status}");
    assert!(ctype.starts_with("application/openmetrics-text"), "{ctype}");
    let (before, _) = parse(&body);
    assert_eq!(before.get("nvlinkd_cache_hits_total{level=\"nvvm\"}"), Some(&0.0), "{body}");

    let out = TempDir::new("m1");
    let link = "--arch=sm_90 tmpl_a.o tmpl_b.o -o {OUT}/out.cubin";
    let inv = Invocation::templated(link, corpus::dir(), &out);
    let expected = run(&real_nvlink(), &inv, &[]);
    for _ in 0..2 {
        let got = run(&shim(), &inv, &d.shim_env());
        let cmp = compare::runs(&expected, &got);
        assert!(cmp.problems.is_empty() && cmp.identical, "{:?}", cmp.problems);
    }

    let (_, _, body) = get(addr, "/metrics");
    let (after, types) = parse(&body);
    // (Families of labelled series appear with their first series.)
    for (family, ty) in [
        ("nvlinkd_links", "counter"),
        ("nvlinkd_link_duration_seconds", "histogram"),
        ("nvlinkd_link_received_bytes", "counter"),
        ("nvlinkd_link_sent_bytes", "counter"),
        ("nvlinkd_cache_hits", "counter"),
        ("nvlinkd_cache_misses", "counter"),
        ("nvlinkd_requests", "counter"),
        ("nvlinkd_auth_failures", "counter"),
        // The TCP listener's and the remote links', as in `nvlinkd stats --json`.
        ("nvlinkd_tcp_connections", "gauge"),
        ("nvlinkd_tcp_closed_unauthenticated", "counter"),
        ("nvlinkd_remote_links", "gauge"),
        ("nvlinkd_remote_links_refused", "counter"),
        ("nvlinkd_in_flight", "gauge"),
        ("nvlinkd_workers", "gauge"),
        ("nvlinkd_cache_mem_bytes", "gauge"),
        ("nvlinkd_cache_disk_bytes", "gauge"),
    ] {
        assert_eq!(types.get(family).map(String::as_str), Some(ty), "family {family} in\n{body}");
    }
    let v = |k: &str| after.get(k).copied().unwrap_or_else(|| panic!("no {k} in\n{body}"));
    // The first link computed in process, the second a whole-link cache hit.
    assert_eq!(v("nvlinkd_links_total{engine=\"in_process\",cache=\"miss\"}"), 1.0);
    assert_eq!(v("nvlinkd_links_total{engine=\"cache\",cache=\"hit\"}"), 1.0);
    assert_eq!(v("nvlinkd_link_duration_seconds_count{engine=\"cache\"}"), 1.0);
    assert!(v("nvlinkd_link_duration_seconds_sum{engine=\"in_process\"}") > 0.0);
    assert_eq!(v("nvlinkd_link_duration_seconds_bucket{le=\"+Inf\",engine=\"in_process\"}"), 1.0);
    assert_eq!(v("nvlinkd_cache_hits_total{level=\"link\"}"), 1.0);
    assert_eq!(v("nvlinkd_cache_misses_total{level=\"link\"}"), 1.0);
    assert_eq!(v("nvlinkd_requests_total"), before["nvlinkd_requests_total"] + 2.0);
    // Both answers carried the output file to the shim.
    let output = std::fs::metadata(out.path().join("out.cubin")).unwrap().len() as f64;
    assert!(v("nvlinkd_link_sent_bytes_total") >= 2.0 * output);
    assert!(v("nvlinkd_cache_mem_bytes") > 0.0);

    let (status, _, _) = get(addr, "/other");
    assert!(status.contains(" 404 "), "{status}");
}

/// `GET path` on the metrics port: the status code.
fn status_of(addr: SocketAddr, path: &str) -> u16 {
    let (status, _, _) = get(addr, path);
    status.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or_else(|| panic!("status line {status}"))
}

/// The probes beside `/metrics`: `/healthz` 200 while the process lives,
/// `/readyz` 200 while it takes links. On SIGTERM with a link in flight, the
/// gRPC health service says NOT_SERVING and `/readyz` turns 503 while the
/// link finishes (nvlink's bytes), and the port keeps answering
/// (`/healthz`, `/metrics`) through the drain.
#[test]
fn healthz_and_readyz_answer_and_readyz_turns_503_while_draining() {
    use nvlinkd_tests::env::TempDir;
    use std::time::{Duration, Instant};
    use tonic_health::pb::health_check_response::ServingStatus;
    let addr = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let mut d = Daemon::start_env(
        &["--metrics-listen", &addr.to_string(), "--shutdown-grace", "60s"],
        &[("NVLINKD_TEST_SLOW_LINK_MS", "4000")],
    );
    assert_eq!(status_of(addr, "/healthz"), 200);
    // Ready once the toolkit is open (it opens in the background at start).
    let deadline = Instant::now() + Duration::from_secs(30);
    while status_of(addr, "/readyz") != 200 {
        assert!(Instant::now() < deadline, "never ready: {:?}", get(addr, "/readyz"));
        std::thread::sleep(Duration::from_millis(20));
    }

    // A health watcher on the local socket, from before the stop.
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let mut watch = rt.block_on(async {
        let channel = nvlinkd_proto::shared::connect_unix(nvlinkd_proto::shared::unix_endpoint(), d.socket())
            .await
            .expect("connect to the socket");
        let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
        let mut watch = health
            .watch(tonic_health::pb::HealthCheckRequest { service: String::new() })
            .await
            .expect("health watch")
            .into_inner();
        let first = watch.message().await.unwrap().unwrap();
        assert_eq!(first.status, ServingStatus::Serving as i32);
        watch
    });

    let out = TempDir::new("m-drain");
    let link = "--arch=sm_90 accumulate.o scale.o -o {OUT}/out.cubin";
    let inv = Invocation::templated(link, corpus::dir(), &out);
    let expected = run(&real_nvlink(), &inv, &[]);
    let env = d.shim_env();
    let shim_inv = inv.clone();
    let linking = std::thread::spawn(move || run(&shim(), &shim_inv, &env));
    d.wait_stat("in_flight", 1);
    d.signal(libc::SIGTERM);

    let deadline = Instant::now() + Duration::from_secs(10);
    while status_of(addr, "/readyz") != 503 {
        assert!(Instant::now() < deadline, "/readyz still {:?} while draining", get(addr, "/readyz"));
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!linking.is_finished(), "the link ended before /readyz said 503");
    let said = rt.block_on(async { tokio::time::timeout(Duration::from_secs(10), watch.message()).await });
    let said = said.expect("no health update after SIGTERM").expect("health watch").expect("a status");
    assert_eq!(said.status, ServingStatus::NotServing as i32);
    assert_eq!(status_of(addr, "/healthz"), 200, "not alive while draining");
    let (status, _, body) = get(addr, "/metrics");
    assert!(status.contains(" 200 "), "{status}");
    let (samples, _) = parse(&body);
    assert_eq!(samples.get("nvlinkd_in_flight"), Some(&1.0), "{body}");
    assert!(!linking.is_finished(), "the link ended before the drain was checked");

    let got = linking.join().unwrap();
    let cmp = compare::runs(&expected, &got);
    assert!(cmp.problems.is_empty() && cmp.identical, "the link in flight: {:?}", cmp.problems);
    drop(watch);
    d.stop();
}

/// Without an OpenMetrics `Accept` (curl, promtool) the endpoint answers the
/// classic text format, which `promtool check metrics` accepts without a
/// remark: every family has its own help (none generic), counters are named
/// by their samples, units are spelled out. The OpenMetrics answer failed it
/// with 31 lines. The daemon serves remote shims with named tokens, so the
/// per-token families are there too, one series per token name.
#[test]
fn classic_text_passes_promtool() {
    use nvlinkd_tests::remote::{tls_daemon, Pki, OTHER_TOKEN, TOKEN};
    let addr = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let pki = Pki::new();
    pki.replace("tokens", format!("ci:{TOKEN}\nnightly.x86_64:{OTHER_TOKEN}\n").as_bytes());
    let (d, port) = tls_daemon(&pki, &["--metrics-listen", &addr.to_string()]);
    // Links first, so the labelled families have series: a local one and a remote one of `ci`.
    let out = TempDir::new("m-classic");
    let inv = Invocation::templated("--arch=sm_90 tmpl_a.o tmpl_b.o -o {OUT}/out.cubin", corpus::dir(), &out);
    assert_eq!(run(&shim(), &inv, &d.shim_env()).code, 0);
    let remote = pki.shim_env(&format!("https://127.0.0.1:{port}"), "never");
    assert_eq!(run(&shim(), &inv, &remote).code, 0);
    let (status, ctype, body) = get_accepting(addr, "/metrics", "");
    assert!(status.contains(" 200 "), "{status}");
    assert!(ctype.starts_with("text/plain; version=0.0.4"), "{ctype}");
    assert!(!body.contains("# EOF") && !body.contains("# UNIT"), "{body}");
    assert!(body.contains("# TYPE nvlinkd_requests_total counter\n"), "{body}");
    for series in [
        "nvlinkd_token_links_total{token=\"ci\"} 1\n",
        "nvlinkd_token_links_total{token=\"nightly.x86_64\"} 0\n",
        "nvlinkd_token_refused_total{token=\"ci\"} 0\n",
        "# TYPE nvlinkd_token_received_bytes_total counter\n",
        "# TYPE nvlinkd_token_sent_bytes_total counter\n",
        "nvlinkd_reply_memory_bytes 0\n",
    ] {
        assert!(body.contains(series), "no {series:?} in\n{body}");
    }
    assert!(body.contains("nvlinkd_build_info{version=") && body.contains("process_resident_memory_bytes "), "{body}");
    assert!(!body.contains("nvlinkd figure "), "a figure without its own help:\n{body}");
    if std::process::Command::new("promtool").arg("--version").output().is_err() {
        println!("SKIP: no promtool (scripts/setup-validators.sh installs it where apt-get runs as root)");
        return;
    }
    let mut check = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    check.stdin.take().unwrap().write_all(body.as_bytes()).unwrap();
    let res = check.wait_with_output().unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&res.stdout), String::from_utf8_lossy(&res.stderr));
    assert!(res.status.success() && said.trim().is_empty(), "promtool check metrics:\n{said}");
}

/// One address keeping idle connections to the metrics port (40 of them,
/// past the port's 32) leaves room for the probes of another, and of its
/// own: `/healthz` from elsewhere and from that address still answers.
#[test]
fn idle_connections_from_one_address_leave_the_probes_room() {
    let addr = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let d = Daemon::start_with(&["--metrics-listen", &addr.to_string()]);
    assert_eq!(status_of(addr, "/healthz"), 200);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let idle = rt.block_on(async {
        let mut idle = Vec::new();
        for _ in 0..40 {
            let socket = tokio::net::TcpSocket::new_v4().unwrap();
            socket.bind("127.0.0.2:0".parse().unwrap()).unwrap();
            if let Ok(s) = socket.connect(addr).await {
                idle.push(s);
            }
        }
        idle
    });
    assert!(idle.len() >= 32, "the idle connections were not made");
    // Give the daemon time to take them all.
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(status_of(addr, "/healthz"), 200, "a probe found no room");
    // A probe from the address holding them: it takes the place of the
    // oldest, and answers.
    let probe = rt.block_on(async {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.2:0".parse().unwrap()).unwrap();
        let mut s = socket.connect(addr).await.unwrap();
        let ask = format!("GET /healthz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        s.write_all(ask.as_bytes()).await.unwrap();
        let mut raw = Vec::new();
        let _ = s.read_to_end(&mut raw).await;
        String::from_utf8_lossy(&raw).into_owned()
    });
    assert!(probe.starts_with("HTTP/1.1 200"), "a probe from the idle connections' address: {probe:?}");
    drop(idle);
    assert!(d.answers());
}
