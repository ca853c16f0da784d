//! The daemon checks itself against the real nvlink (`serve --verify`): a
//! fault injected into the in-process engine (`NVLINKD_TEST_CORRUPT_IN_PROCESS`
//! damages its output files) is caught, healed, routed and reported, in both
//! modes; a healthy daemon verifies each new link once and finds nothing.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use nvlinkd_tests::compare;
use nvlinkd_tests::corpus;
use nvlinkd_tests::daemon::Daemon;
use nvlinkd_tests::env::{real_nvlink, shim, TempDir};
use nvlinkd_tests::events::Events;
use nvlinkd_tests::run::{run, Invocation, Run};

const LINK: &str = "--arch=sm_90 --register-link-binaries={OUT}/reg.c accumulate.o scale.o -o {OUT}/out.cubin";
const CORRUPT: (&str, &str) = ("NVLINKD_TEST_CORRUPT_IN_PROCESS", "1");

fn assert_same(expected: &Run, actual: &Run, what: &str) {
    let cmp = compare::runs(expected, actual);
    assert!(cmp.problems.is_empty() && cmp.identical, "{what}: {:?}", cmp.problems);
}

/// Wait until the daemon has no verification pending and has verified `n` links.
fn settle(d: &Daemon, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while d.stat("verify_pending") > 0 || d.stat("verified") < n {
        assert!(Instant::now() < deadline, "verification did not finish: {}", d.stats());
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The repro bundles under the daemon's cache directory.
fn bundles(d: &Daemon) -> Vec<PathBuf> {
    let mut b: Vec<PathBuf> = std::fs::read_dir(d.cache_dir().join("verify"))
        .map(|r| r.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    b.sort();
    b
}

/// A bundle has what it promises, and its script reproduces the comparison:
/// it finds the difference while the fault is injected, and none without.
fn check_bundle(bundle: &Path) {
    for f in ["args", "cwd", "env", "differences", "inputs.blake3", "rerun.sh", "nvlink/exit_code", "nvlinkd/stdout"] {
        assert!(bundle.join(f).exists(), "{} has no {f}", bundle.display());
    }
    let nvlink_out = bundle.join("nvlink/output.out.cubin");
    let ours_out = bundle.join("nvlinkd/output.out.cubin");
    assert_ne!(std::fs::read(&nvlink_out).unwrap(), std::fs::read(&ours_out).unwrap());
    let differences = std::fs::read_to_string(bundle.join("differences")).unwrap();
    assert!(differences.contains("out.cubin"), "{differences}");
    let rerun = |env: &[(&str, &str)]| {
        Command::new(bundle.join("rerun.sh")).envs(env.iter().copied()).output().expect("rerun.sh")
    };
    let faulty = rerun(&[CORRUPT]);
    assert!(
        !faulty.status.success(),
        "rerun.sh did not reproduce the mismatch: {}",
        String::from_utf8_lossy(&faulty.stdout)
    );
    let healthy = rerun(&[]);
    assert!(
        healthy.status.success(),
        "rerun.sh without the fault: {}{}",
        String::from_utf8_lossy(&healthy.stdout),
        String::from_utf8_lossy(&healthy.stderr)
    );
}

#[test]
fn sync_verification_answers_nvlinks_result_over_a_broken_engine() {
    let d = Daemon::start_env(&["--verify=sync"], &[CORRUPT]);
    let mut events = Events::follow(&d);
    let out = TempDir::new("verify-sync");
    let link = Invocation::templated(LINK, corpus::dir(), &out);
    let expected = run(&real_nvlink(), &link, &[]);
    assert_eq!(expected.code, 0);
    let actual = run(&shim(), &link, &d.shim_env());
    assert_same(&expected, &actual, "the answer under --verify=sync");
    assert_eq!(d.stat("verified"), 1, "{}", d.stats());
    assert_eq!(d.stat("verify_mismatches"), 1, "{}", d.stats());
    assert_eq!(d.reason_count("routed", "verify_mismatch"), 1);
    let ev = events.wait("verify_mismatch", |v| v["event"] == "verify_mismatch");
    assert!(ev["link"].as_u64().is_some_and(|l| l > 0), "the event names no link: {ev}");
    let bundle = ev["bundle"].as_str().expect("the event names its bundle");
    assert_eq!(bundles(&d), vec![PathBuf::from(bundle)]);
    assert!(d.log().contains("differs from nvlink's"), "no warning in the log");
    check_bundle(Path::new(bundle));
    // The cache holds nvlink's answer: the next identical link is a hit with its bytes.
    let again = run(&shim(), &link, &d.shim_env());
    assert_same(&expected, &again, "the cached answer after the mismatch");
    assert_eq!(d.stat("cache_hits"), 1, "{}\n{}", d.stats(), d.log());
    assert_eq!(d.stat("verified"), 1, "a cache hit was verified again");
}

#[test]
fn background_verification_heals_the_cache_and_routes_the_link() {
    // No room in the cache (1 byte of memory, no disk): every link computes,
    // so the second one shows the routing.
    let d = Daemon::start_env(&["--verify=background", "--cache-mem", "1", "--cache-size", "0"], &[CORRUPT]);
    let out = TempDir::new("verify-bg");
    let link = Invocation::templated(LINK, corpus::dir(), &out);
    let expected = run(&real_nvlink(), &link, &[]);
    // In the background the first answer is the engine's own (here: damaged).
    let first = run(&shim(), &link, &d.shim_env());
    assert!(!compare::runs(&expected, &first).identical, "the injected fault did not damage the output");
    settle(&d, 1);
    assert_eq!(d.stat("verify_mismatches"), 1, "{}", d.stats());
    let second = run(&shim(), &link, &d.shim_env());
    assert_same(&expected, &second, "the link after a background mismatch");
    assert_eq!(d.reason_count("routed", "verify_mismatch"), 1, "{}", d.stats());
    assert_eq!(d.stat("nvlink_process"), 1);
    assert_eq!(bundles(&d).len(), 1);

    // With a cache, the entry the mismatch replaced answers the next link.
    let c = Daemon::start_env(&["--verify=background"], &[CORRUPT]);
    let out = TempDir::new("verify-bg-cache");
    let link = Invocation::templated(LINK, corpus::dir(), &out);
    let _ = run(&shim(), &link, &c.shim_env());
    settle(&c, 1);
    assert_eq!(c.stat("verify_mismatches"), 1, "{}", c.stats());
    let healed = run(&shim(), &link, &c.shim_env());
    assert_same(&expected, &healed, "the cache entry after a background mismatch");
    assert_eq!(c.stat("cache_hits"), 1, "{}", c.stats());
}

/// A remote link's in-process answer is not verified (its files are read as
/// its caller sends them), but it enters the cache: a local link that hits
/// that entry has it verified with its own files, and the cache healed.
#[test]
fn a_remote_links_cached_answer_is_verified_when_a_local_link_hits_it() {
    use nvlinkd_tests::remote::{tls_daemon_env, Pki};
    let pki = Pki::new();
    let (d, port) = tls_daemon_env(&pki, &["--verify=background"], &[CORRUPT]);
    let out = TempDir::new("verify-remote-hit");
    let link = Invocation::templated(LINK, corpus::dir(), &out);
    let expected = run(&real_nvlink(), &link, &[]);
    let remote = run(&shim(), &link, &pki.shim_env(&format!("https://127.0.0.1:{port}"), "never"));
    assert!(!compare::runs(&expected, &remote).identical, "the injected fault did not damage the output");
    assert_eq!(d.stat("verified"), 0, "a remote link was verified: {}", d.stats());
    // The local link hits the remote link's entry (damaged), and has it verified.
    let _hit = run(&shim(), &link, &d.shim_env());
    assert_eq!(d.stat("cache_hits"), 1, "{}", d.stats());
    settle(&d, 1);
    assert_eq!(d.stat("verify_mismatches"), 1, "{}", d.stats());
    let healed = run(&shim(), &link, &d.shim_env());
    assert_same(&expected, &healed, "the local link after the hit's verification");
}

#[test]
fn a_healthy_daemon_verifies_each_new_link_once_and_finds_nothing() {
    let d = Daemon::start_with(&["--verify=background"]);
    let links = [
        LINK,
        "--arch=sm_90 -L{L} cdp.o -lcudadevrt -o {OUT}/out.cubin",
        "--arch=sm_90 -r accumulate.o scale.o -o {OUT}/out.o",
        "--arch=sm_90 missing.o -o {OUT}/out.cubin",
    ];
    let lib = nvlinkd_tests::env::cuda_home().join("lib").display().to_string();
    for pass in 0..2 {
        for (i, l) in links.iter().enumerate() {
            let out = TempDir::new(&format!("verify-ok-{pass}-{i}"));
            let link = Invocation::templated(&l.replace("{L}", &lib), corpus::dir(), &out);
            let expected = run(&real_nvlink(), &link, &[]);
            assert_same(&expected, &run(&shim(), &link, &d.shim_env()), l);
        }
        settle(&d, links.len() as u64);
    }
    assert_eq!(d.stat("verified"), links.len() as u64, "{}", d.stats());
    assert_eq!(d.stat("verify_mismatches"), 0, "{}", d.stats());
    assert!(bundles(&d).is_empty());
}

#[test]
fn verification_off_runs_nothing() {
    let d = Daemon::start_env(&["--verify=off"], &[CORRUPT]);
    let out = TempDir::new("verify-off");
    let link = Invocation::templated(LINK, corpus::dir(), &out);
    let _ = run(&shim(), &link, &d.shim_env());
    assert_eq!((d.stat("verified"), d.stat("verify_skipped"), d.stat("verify_pending")), (0, 0, 0));
}

/// Two names of one file in the verification's sandbox: `sym/../x.o`, where
/// `sym` is a symlink, reads the file beside the link's target, and `x.o`
/// another file. Mirrored by spelling, both landed on one path and nvlink
/// compared the wrong inputs; under `--verify=sync` the caller then got that
/// answer (background verification stored it under the real inputs' key, for
/// every host of a shared tier). Now such names are mirrored only where they
/// agree: the link is answered as nvlink answers it, nothing mismatches, and
/// a link of the same three files by plain names is nvlink's too.
#[test]
fn names_through_a_symlink_and_dot_dot_never_mix_inputs() {
    let d = Daemon::start_with(&["--verify=sync"]);
    let work = TempDir::new("verify-dotdot");
    let (p, q, v) = (work.path().join("p"), work.path().join("q"), work.path().join("v"));
    for dir in [&p, &q.join("deep"), &v] {
        std::fs::create_dir_all(dir).unwrap();
    }
    std::os::unix::fs::symlink("../q/deep", p.join("sym")).unwrap();
    let obj = |name: &str| corpus::dir().join(name);
    std::fs::copy(obj("accumulate.o"), q.join("x.o")).unwrap();
    std::fs::copy(obj("scale.o"), p.join("x.o")).unwrap();
    std::fs::copy(obj("mathlib_1.o"), q.join("deep/y.o")).unwrap();
    std::fs::copy(obj("accumulate.o"), v.join("a.o")).unwrap();
    std::fs::copy(obj("scale.o"), v.join("b.o")).unwrap();
    std::fs::copy(obj("mathlib_1.o"), v.join("c.o")).unwrap();
    let out = TempDir::new("verify-dotdot-out");
    for (cwd, args) in [
        (&p, "--arch=sm_90 sym/../x.o x.o sym/y.o -o {OUT}/out.cubin"),
        (&p, "--arch=sm_90 sym/../x.o -o {OUT}/out.cubin"),
        (&v, "--arch=sm_90 a.o b.o c.o -o {OUT}/out.cubin"),
    ] {
        let link = Invocation::templated(args, cwd, &out);
        let expected = run(&real_nvlink(), &link, &[]);
        // (The lone name links one object: nvlink's undefined reference.)
        assert!(
            expected.code == 0 || !args.contains("x.o x.o"),
            "{args}: {}",
            String::from_utf8_lossy(&expected.stderr)
        );
        assert_same(&expected, &run(&shim(), &link, &d.shim_env()), args);
    }
    assert_eq!(d.stat("verify_mismatches"), 0, "{}", d.stats());
}

/// Waiting background verifications hold the inputs their links read until
/// they run, and they run only once no link is in flight: three links of
/// 150 MiB inputs while links keep arriving held 450 MiB (ten held 2 GB).
/// The queue holds at most `QUEUE_BYTES` (256 MiB) of inputs; a verification
/// past it is dropped and counted, as one past the queue's length is. Every
/// link is still nvlink's.
#[test]
fn waiting_verifications_hold_a_bounded_number_of_bytes() {
    let d = Daemon::start_env(&["--verify=background"], &[("NVLINKD_TEST_SLOW_LINK_MS", "1500")]);
    let work = TempDir::new("verify-bytes");
    for i in 0..3u8 {
        // An object with 150 MiB after its ELF contents, which nvlink ignores;
        // the last byte makes each its own key.
        let mut data = std::fs::read(corpus::dir().join("accumulate.o")).unwrap();
        data.resize(150 << 20, 0);
        *data.last_mut().unwrap() = i + 1;
        std::fs::write(work.path().join(format!("big{i}.o")), data).unwrap();
    }
    std::fs::copy(corpus::dir().join("scale.o"), work.path().join("scale.o")).unwrap();
    let outs: Vec<TempDir> = (0..3).map(|_| TempDir::new("verify-bytes-out")).collect();
    let links: Vec<Invocation> = (0..3)
        .map(|i| {
            Invocation::templated(&format!("--arch=sm_90 big{i}.o scale.o -o {{OUT}}/out.cubin"), work.path(), &outs[i])
        })
        .collect();
    let expected: Vec<Run> = links.iter().map(|l| run(&real_nvlink(), l, &[])).collect();
    // All three in flight at once (each first waits 1.5 s): the first two
    // answered queue their verifications while the others still run.
    let env = d.shim_env();
    let actual: Vec<Run> = std::thread::scope(|s| {
        let handles: Vec<_> = links.iter().map(|l| s.spawn(|| run(&shim(), l, &env))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (e, a) in expected.iter().zip(&actual) {
        assert_same(e, a, "a link with a 150 MiB input");
    }
    settle(&d, 1);
    let s = d.stats();
    assert!(d.stat("verify_skipped") >= 1, "no verification was dropped for its bytes: {s}");
    assert!(d.stat("verified") >= 1, "{s}");
}
