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

/// `GET /metrics`: (status line, content type, body).
fn get(addr: SocketAddr, path: &str) -> (String, String, String) {
    let mut s = TcpStream::connect(addr).expect("connect to the metrics port");
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").unwrap();
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
            name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') && name.starts_with("nvlinkd_"),
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
