//! Replicas: several stateless daemons behind a list of addresses, sharing the
//! REAPI tier (a real BuildGrid). The shim fails over between them: a replica
//! that dies mid-link costs a retry on the next address, never a wrong or
//! missing output, even with `NVLINKD_FALLBACK=never`. Every result is
//! compared with the real nvlink's on the same inputs.

use std::time::{Duration, Instant};

use nvlinkd_tests::buildgrid::BuildGrid;
use nvlinkd_tests::compare;
use nvlinkd_tests::corpus;
use nvlinkd_tests::daemon::Daemon;
use nvlinkd_tests::env::{real_nvlink, shim, TempDir};
use nvlinkd_tests::remote::{free_port, Pki};
use nvlinkd_tests::run::{run, Invocation, Run};

/// A replica: TLS and tokens on a 127.0.0.1 port, the shared tier at `tier`
/// (none: no shared tier), extra `serve` arguments and environment.
struct Replica {
    daemon: Daemon,
    port: u16,
}

impl Replica {
    fn start(pki: &Pki, tier: Option<&str>, extra: &[&str], env: &[(&str, &str)]) -> Replica {
        let port = free_port();
        let (listen, cert, key, tokens) =
            (format!("127.0.0.1:{port}"), pki.file("cert.pem"), pki.file("key.pem"), pki.file("tokens"));
        let mut args = vec!["--listen", &listen, "--tls-cert", &cert, "--tls-key", &key, "--token-file", &tokens];
        if let Some(url) = tier {
            args.extend(["--remote-cache", url, "--remote-timeout", "5s"]);
        }
        args.extend(extra);
        let daemon = Daemon::start_env(&args, env);
        // `Daemon` waits for the unix socket; the TCP listener comes up with it.
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "replica did not listen on {port}");
            std::thread::sleep(Duration::from_millis(20));
        }
        Replica { daemon, port }
    }

    fn addr(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }
}

fn same(expected: &Run, actual: &Run, what: &str) {
    let cmp = compare::runs(expected, actual);
    assert!(cmp.problems.is_empty() && cmp.identical, "{what}: {:?}", cmp.problems);
}

/// Wait until `d` has no upload of the shared tier waiting (each is queued
/// before its link answers), then check that none was lost: failed, dropped,
/// or skipped while the tier was taken for failing. A busy BuildGrid (past
/// its concurrent-RPC limit, as three replicas in a burst take it) is waited
/// for, not a failure; counted as one, it cost the replacement some of the
/// burst's links.
fn wait_uploads(d: &Daemon) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let s = d.stats();
        if s["remote_cache_uploads_pending"].as_u64() == Some(0) {
            for lost in ["remote_cache_upload_errors", "remote_cache_uploads_dropped", "remote_cache_skipped"] {
                assert_eq!(s[lost].as_u64(), Some(0), "{lost}: {s}");
            }
            return;
        }
        assert!(Instant::now() < deadline, "uploads did not finish: {s}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

const LINK: &str = "--arch=sm_90 -L{L} cdp.o accumulate.o scale.o -lcudadevrt -o {OUT}/out.cubin";

/// One link, held in its slot on the first replica (`NVLINKD_TEST_HOLD_SLOT`)
/// until that replica is killed: the shim goes on to the second, which
/// serves it; nvlink's bytes, nvlink's stderr (the retry is silent), with
/// `NVLINKD_FALLBACK=never`. With `NVLINKD_TIMING` the retry is named.
#[test]
fn a_replica_killed_mid_link_costs_a_retry() {
    let pki = Pki::new();
    let hold = TempDir::new("hold");
    let hold_file = hold.path().join("hold");
    for timing in [false, true] {
        std::fs::write(&hold_file, b"").unwrap();
        let mut first =
            Replica::start(&pki, None, &[], &[("NVLINKD_TEST_HOLD_SLOT", &hold_file.display().to_string())]);
        let second = Replica::start(&pki, None, &[], &[]);
        let out = TempDir::new("rep1");
        let inv = Invocation::templated(LINK, corpus::dir(), &out);
        let expected = run(&real_nvlink(), &inv, &[]);

        let mut env = pki.shim_env(&format!("{},{}", first.addr(), second.addr()), "never");
        if timing {
            env.push(("NVLINKD_TIMING".into(), "1".into()));
        }
        let handle = {
            let (inv, env) = (inv.clone(), env.clone());
            std::thread::spawn(move || run(&shim(), &inv, &env))
        };
        first.daemon.wait_stat("in_flight", 1);
        first.daemon.wait_stat("running_foreground", 1);
        first.daemon.kill();
        let mut actual = handle.join().expect("shim thread");
        assert_eq!(second.daemon.stat("requests"), 1, "the second replica did not serve the link");
        if timing {
            let stderr = String::from_utf8_lossy(&actual.stderr).into_owned();
            assert!(stderr.contains("next address: "), "the retry is not named: {stderr}");
            let kept: Vec<&str> = stderr.split_inclusive('\n').filter(|l| !l.starts_with("nvlinkd-timing ")).collect();
            actual.stderr = kept.concat().into_bytes();
        }
        same(&expected, &actual, "after the retry");
    }
}

/// Three replicas sharing BuildGrid; a burst of concurrent shims, each list
/// rotated so that every replica is first for a third of them; one replica
/// SIGKILLed while links are in flight on it. Every shim answers as nvlink
/// does; the survivors served what the dead one lost; and a replacement
/// replica with an empty cache gets the burst's links from the tier.
#[test]
fn three_replicas_survive_one_killed_during_a_burst() {
    let Some(bg) = BuildGrid::start() else { return };
    let pki = Pki::new();
    let url = bg.url();
    // The victim holds every admitted link in its slot (`NVLINKD_TEST_HOLD_SLOT`)
    // until it dies: its share of the burst is in flight when the last shim
    // arrives, however slowly the shims start (timing it failed on a loaded
    // 2-core CI machine).
    let victim = 0;
    let hold = TempDir::new("rep-hold");
    let hold_file = hold.path().join("hold");
    std::fs::write(&hold_file, b"").unwrap();
    let hold_env = [("NVLINKD_TEST_HOLD_SLOT", hold_file.to_str().unwrap())];
    let mut replicas: Vec<Replica> =
        (0..3).map(|k| Replica::start(&pki, Some(&url), &[], if k == victim { &hold_env[..] } else { &[] })).collect();

    // Distinct cold LTO links (NVVM and ptxas each time); each twice in the
    // burst.
    let links: Vec<String> = [32, 40, 48, 56, 64, 72]
        .iter()
        .map(|r| {
            format!("--arch=sm_90 -dlto -nvvmpath={{NVVM}} -L{{L}} --maxrregcount={r} warp_cub_lto.o -lcudadevrt -o {{OUT}}/out.cubin")
        })
        .collect();
    let outs: Vec<TempDir> = (0..links.len()).map(|i| TempDir::new(&format!("rep-nv{i}"))).collect();
    let expected: Vec<Run> = links
        .iter()
        .zip(&outs)
        .map(|(l, o)| run(&real_nvlink(), &Invocation::templated(l, corpus::dir(), o), &[]))
        .collect();
    assert!(expected.iter().all(|e| e.code == 0), "nvlink failed: {expected:?}");

    let shims = 2 * links.len();
    let (results, lost, received): (Vec<(usize, Run)>, u64, u64) = std::thread::scope(|s| {
        let handles: Vec<_> = (0..shims)
            .map(|i| {
                // Rotated: shim i tries replica i % 3 first.
                let order: Vec<String> = (0..3).map(|k| replicas[(i + k) % 3].addr()).collect();
                let env = pki.shim_env(&order.join(","), "never");
                let link = i % links.len();
                let out = TempDir::new(&format!("rep-b{i}"));
                let inv = Invocation::templated(&links[link], corpus::dir(), &out);
                s.spawn(move || {
                    let r = run(&shim(), &inv, &env);
                    drop(out);
                    (link, r)
                })
            })
            .collect();

        // Every shim reached a replica, and links are in flight on the victim.
        let deadline = Instant::now() + Duration::from_secs(120);
        let (lost, received) = loop {
            let stats: Vec<serde_json::Value> = replicas.iter().map(|r| r.daemon.stats()).collect();
            let requests: u64 = stats.iter().map(|s| s["requests"].as_u64().unwrap()).sum();
            let in_flight = stats[victim]["in_flight"].as_u64().unwrap();
            if requests == shims as u64 && in_flight > 0 {
                break (in_flight, stats[victim]["requests"].as_u64().unwrap());
            }
            assert!(Instant::now() < deadline, "the burst never had links in flight on the victim: {stats:?}");
            std::thread::sleep(Duration::from_millis(10));
        };
        replicas[victim].daemon.kill();
        eprintln!("killed replica {victim} with {lost} of its {received} links in flight");
        (handles.into_iter().map(|h| h.join().expect("shim thread")).collect(), lost, received)
    });

    for (i, (link, actual)) in results.iter().enumerate() {
        same(&expected[*link], actual, &format!("shim {i} ({})", links[*link]));
    }
    // What the victim lost was linked again by the survivors: links received
    // by all, counting the victim's before it died, exceed the shims.
    let survivors = [1, 2];
    let served: u64 = survivors.iter().map(|&k| replicas[k].daemon.stat("requests")).sum();
    let retried = served + received - shims as u64;
    eprintln!("the survivors received {served} links, {retried} of them retried after the kill");
    assert!(retried >= 1 && retried <= lost, "{retried} retries for {lost} links in flight on the victim");

    // A replacement replica with an empty cache: the burst's links are
    // whole-link hits from the tier, computed by the others.
    for &k in &survivors {
        wait_uploads(&replicas[k].daemon);
    }
    let fresh = Replica::start(&pki, Some(&url), &[], &[]);
    for (link, e) in links.iter().zip(&expected) {
        let out = TempDir::new("rep-fresh");
        let actual =
            run(&shim(), &Invocation::templated(link, corpus::dir(), &out), &pki.shim_env(&fresh.addr(), "never"));
        same(e, &actual, "replacement replica");
    }
    let s = fresh.daemon.stats();
    assert_eq!(s["cache_hits"].as_u64(), Some(links.len() as u64), "{s}");
    assert!(s["remote_cache_hits"].as_u64().unwrap() >= links.len() as u64, "{s}");
}
