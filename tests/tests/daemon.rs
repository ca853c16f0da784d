//! The daemon as a service: lifecycle commands, socket permissions, fallback
//! when it dies mid-link, concurrent links, graceful shutdown, auto-start.

use std::os::unix::fs::{MetadataExt, PermissionsExt};

use nvlinkd_tests::compare;
use nvlinkd_tests::corpus;
use nvlinkd_tests::daemon::{proc_stat_field, Daemon};
use nvlinkd_tests::env::{cuda_home, nvlinkd, real_nvlink, shim, TempDir};
use nvlinkd_tests::run::{run, Invocation};
use std::process::Command;

fn inv(args: &str, out: &TempDir) -> Invocation {
    Invocation::templated(args, corpus::dir(), out)
}

const CDP_LINK: &str = "--arch=sm_90 --register-link-binaries={OUT}/reg.c -L{L} cdp.o -lcudadevrt -o {OUT}/out.cubin";

#[test]
fn stats_json_has_integer_counters_and_status_reports() {
    let d = Daemon::start();
    let stats = d.stats();
    assert!(stats.is_object(), "not one JSON object: {stats}");
    for key in ["requests", "cache_hits", "cache_misses"] {
        assert!(stats[key].is_u64(), "{key} missing or not an integer in {stats}");
    }
    let (ok, status) = d.control("status").unwrap();
    assert!(ok && status.contains("running"), "{status}");
    // Status and plain `stats` speak words: toolkit, uptime, links and fallbacks.
    let out = TempDir::new("words");
    let link = inv("--arch=sm_90 accumulate.o scale.o -o {OUT}/out.cubin", &out);
    assert_eq!(run(&shim(), &link, &d.shim_env()).code, 0);
    let (_, status) = d.control("status").unwrap();
    let toolkit = cuda_home().display().to_string();
    assert!(status.contains(&format!("toolkits: {toolkit}")) && status.contains("1 links, 0 fell back"), "{status}");
    let words = Command::new(nvlinkd()).arg("stats").arg("--socket").arg(d.socket()).output().unwrap();
    let words = String::from_utf8_lossy(&words.stdout);
    assert!(words.contains("links: 1 answered") && words.contains("1 linked in process"), "{words}");
    assert!(serde_json::from_str::<serde_json::Value>(&words).is_err(), "plain stats printed JSON: {words}");
    let mode = std::fs::metadata(d.socket()).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "socket mode {mode:o}");
}

#[test]
fn start_is_idempotent_and_stop_stops() {
    let dir = TempDir::new("life");
    let sock = dir.path().join("s");
    let cache = dir.path().join("c");
    let cmd = |args: &[&str]| {
        std::process::Command::new(nvlinkd())
            .args(args)
            .arg("--socket")
            .arg(&sock)
            .env("NVLINKD_CACHE_DIR", &cache)
            .env("CUDA_HOME", cuda_home())
            .output()
            .unwrap()
    };
    let first = cmd(&["start"]);
    assert!(first.status.success(), "{}", String::from_utf8_lossy(&first.stderr));
    let second = cmd(&["start"]);
    assert!(second.status.success());
    assert!(String::from_utf8_lossy(&second.stdout).contains("already running"));
    assert!(cmd(&["status"]).status.success());
    assert!(cmd(&["stop"]).status.success());
    assert!(!cmd(&["status"]).status.success(), "daemon still answers after stop");
    assert!(!sock.exists(), "socket left behind");
}

#[test]
fn shim_falls_back_when_daemon_dies_mid_link() {
    let mut d = Daemon::start_env(&[], &[("NVLINKD_TEST_SLOW_LINK_MS", "3000")]);
    let out = TempDir::new("killed");
    let expected = run(&real_nvlink(), &inv(CDP_LINK, &out), &[]);
    assert_eq!(expected.code, 0);

    let env: Vec<(String, String)> = vec![
        ("NVLINKD_SOCKET".into(), d.socket().display().to_string()),
        ("NVLINKD_FALLBACK".into(), "auto".into()),
        ("NVLINKD_REAL_NVLINK".into(), real_nvlink().display().to_string()),
        // No auto-start of a replacement daemon in this test.
        ("NVLINKD_BIN".into(), "/nonexistent/nvlinkd".into()),
    ];
    let invocation = inv(CDP_LINK, &out);
    let handle = std::thread::spawn(move || run(&shim(), &invocation, &env));
    d.wait_stat("in_flight", 1);
    d.kill();
    let actual = handle.join().unwrap();
    let cmp = compare::runs(&expected, &actual);
    assert!(cmp.problems.is_empty(), "{:?}", cmp.problems);
    assert!(cmp.identical);
}

#[test]
fn fallback_never_fails_cleanly_without_partial_output() {
    let mut d = Daemon::start_env(&[], &[("NVLINKD_TEST_SLOW_LINK_MS", "3000")]);
    let out = TempDir::new("never");
    let env: Vec<(String, String)> = vec![
        ("NVLINKD_SOCKET".into(), d.socket().display().to_string()),
        ("NVLINKD_FALLBACK".into(), "never".into()),
        ("NVLINKD_BIN".into(), "/nonexistent/nvlinkd".into()),
    ];
    let invocation = inv(CDP_LINK, &out);
    let handle = std::thread::spawn(move || run(&shim(), &invocation, &env));
    d.wait_stat("in_flight", 1);
    d.kill();
    let r = handle.join().unwrap();
    assert_ne!(r.code, 0);
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(err.starts_with("nvlink fatal   : "), "{err}");
    assert!(r.files.is_empty(), "files left behind: {:?}", r.files.keys());
}

#[test]
fn sigterm_finishes_in_flight_links() {
    // Links still computing get the grace period (here long enough for this one).
    let mut d = Daemon::start_env(&["--shutdown-grace", "60s"], &[("NVLINKD_TEST_SLOW_LINK_MS", "1500")]);
    let out = TempDir::new("term");
    let expected = run(&real_nvlink(), &inv(CDP_LINK, &out), &[]);
    let invocation = inv(CDP_LINK, &out);
    let env = d.shim_env();
    let handle = std::thread::spawn(move || run(&shim(), &invocation, &env));
    d.wait_stat("in_flight", 1);
    d.stop();
    let actual = handle.join().unwrap();
    let cmp = compare::runs(&expected, &actual);
    assert!(cmp.problems.is_empty(), "in-flight link lost: {:?}", cmp.problems);
}

#[test]
fn concurrent_links_through_one_daemon() {
    let d = Daemon::start();
    let cases = [
        "--arch=sm_90 accumulate.o scale.o -o {OUT}/out.cubin",
        "--arch=sm_90 vars_def.o vars_use.o -o {OUT}/out.cubin",
        CDP_LINK,
        "--arch=sm_90 tmpl_a.o tmpl_b.o -o {OUT}/out.cubin",
        "--arch=sm_90 -Llib mathlib_main.o -ldevmath -o {OUT}/out.cubin",
        "--arch=sm_80 saxpy_2arch.o accumulate_2arch.o scale_2arch.o -o {OUT}/out.cubin",
        "--arch=sm_90 -r accumulate.o scale.o -o {OUT}/out.o",
        "--arch=sm_90 saxpy_ptx.o -o {OUT}/out.cubin",
    ];
    let expected: Vec<_> = cases
        .iter()
        .map(|c| {
            let out = TempDir::new("cc-ref");
            run(&real_nvlink(), &inv(c, &out), &[])
        })
        .collect();
    let before = d.stat("requests");
    let env = d.shim_env();
    // The shims start together, so their links overlap in the daemon.
    let start = &std::sync::Barrier::new(cases.len());
    let actual: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = cases
            .iter()
            .map(|c| {
                let env = env.clone();
                s.spawn(move || {
                    let out = TempDir::new("cc");
                    start.wait();
                    run(&shim(), &inv(c, &out), &env)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (i, (e, a)) in expected.iter().zip(&actual).enumerate() {
        let cmp = compare::runs(e, a);
        assert!(cmp.problems.is_empty(), "case {i} ({}): {:?}", cases[i], cmp.problems);
    }
    assert_eq!(d.stat("requests") - before, cases.len() as u64);
}

#[test]
fn shim_starts_a_daemon_when_none_answers() {
    let dir = TempDir::new("auto");
    let sock = dir.path().join("s");
    let out = TempDir::new("auto-out");
    let env = nvlinkd_tests::env::auto_start_env(&sock, &dir.path().join("cache"));
    let expected = run(&real_nvlink(), &inv(CDP_LINK, &out), &[]);
    let actual = run(&shim(), &inv(CDP_LINK, &out), &env);
    let stop = std::process::Command::new(nvlinkd()).arg("stop").arg("--socket").arg(&sock).output().unwrap();
    assert!(String::from_utf8_lossy(&stop.stdout).contains("stopped"), "no daemon was started");
    let cmp = compare::runs(&expected, &actual);
    assert!(cmp.problems.is_empty(), "{:?}", cmp.problems);
}

/// A shim that knows no toolkit (not in an overlay, no `CUDA_HOME`, no
/// `NVLINKD_REAL_NVLINK`) never starts a daemon, even where `nvlinkd` would
/// find a toolkit of its own (here: an nvlink on `PATH`): that daemon would
/// link with a toolkit the caller never named. The shim says why it cannot
/// link and fails; no daemon is left behind.
#[test]
fn a_shim_without_a_toolkit_starts_no_daemon() {
    let dir = TempDir::new("notk");
    let sock = dir.path().join("s");
    let marker = dir.path().join("started");
    // An nvlinkd that notes that it was run, then is nvlinkd.
    let wrapper = dir.path().join("nvlinkd");
    let script = format!("#!/bin/sh\necho \"$@\" >> '{}'\nexec '{}' \"$@\"\n", marker.display(), nvlinkd().display());
    std::fs::write(&wrapper, script).unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = Command::new(shim())
        .arg("--version")
        .env_remove("CUDA_HOME")
        .env_remove("NVLINKD_REAL_NVLINK")
        .env_remove("NVLINKD_ADDR")
        .env("PATH", format!("{}:/usr/bin:/bin", cuda_home().join("bin").display()))
        .env("NVLINKD_SOCKET", &sock)
        .env("NVLINKD_CACHE_DIR", dir.path().join("cache"))
        .env("NVLINKD_BIN", &wrapper)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    let run_as = std::fs::read_to_string(&marker).unwrap_or_default();
    if sock.exists() {
        let _ = Command::new(nvlinkd()).arg("stop").arg("--socket").arg(&sock).output();
    }
    assert!(run_as.is_empty(), "the shim ran nvlinkd {run_as}");
    assert!(!out.status.success(), "a shim without a toolkit answered: {said}");
    assert!(said.contains("CUDA_HOME"), "no word on naming a toolkit: {said}");
}

/// A fallback the user can fix gets one line on stderr, once per daemon,
/// naming the reason and the fix: here the link's inputs exceed the
/// daemon's `--max-link-input`, then the caller's nvlink is of a release the
/// daemon has no toolkit for (a toolkit whose nvlink says it is 12.9). Every
/// link's stdout, exit status and output are the real nvlink's, and its
/// stderr is nvlink's alone from the second link on; a restarted daemon is a
/// new one, warned about again. A fallback that is nvlink's normal routing
/// (an input that is not a regular file) is never warned about.
#[test]
fn a_fixable_fallback_is_said_once_per_daemon() {
    const WARNING: &str = "nvlinkd: warning: ";
    let budget = ["--max-link-input", "1000"];
    let mut d = Daemon::start_with(&budget);
    let rt = TempDir::new("warn-rt");
    let out = TempDir::new("warn-out");
    let link = inv("--arch=sm_90 accumulate.o scale.o -o {OUT}/out.cubin", &out);
    let expected = run(&real_nvlink(), &link, &[]);
    assert_eq!(expected.code, 0);
    // A toolkit whose nvlink says another release, and is the real one otherwise.
    let other = TempDir::new("warn-tk");
    std::fs::create_dir_all(other.path().join("bin")).unwrap();
    let fake = other.path().join("bin/nvlink");
    let script = format!(
        "#!/bin/sh\nif [ \"$1\" = --version ]; then\n  echo 'Cuda compilation tools, release 12.9, V12.9.99'\n  \
         echo 'Build cuda_12.9.r12.9/compiler.0_0'\n  exit 0\nfi\nexec '{}' \"$@\"\n",
        real_nvlink().display()
    );
    std::fs::write(&fake, script).unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let env = |d: &Daemon, toolkit: Option<&std::path::Path>| {
        let mut env = d.fallback_env();
        env.push(("XDG_RUNTIME_DIR".into(), rt.path().display().to_string()));
        if let Some(t) = toolkit {
            env.retain(|(k, _)| k != "CUDA_HOME" && k != "NVLINKD_REAL_NVLINK");
            env.push(("CUDA_HOME".into(), t.display().to_string()));
        }
        env
    };
    // (the daemon's options, the shim's toolkit, what the warning names)
    let cases = [(&budget[..], None, "--max-link-input"), (&[][..], Some(other.path()), "release (12.9, V12.9.99)")];
    for (serve, toolkit, named) in cases {
        d.stop();
        for restart in 0..2 {
            d.spawn(serve);
            for i in 0..2 {
                let actual = run(&shim(), &link, &env(&d, toolkit));
                assert_eq!((actual.code, &actual.stdout, &actual.files), (0, &expected.stdout, &expected.files));
                let said = String::from_utf8_lossy(&actual.stderr).into_owned();
                let (warned, rest): (Vec<&str>, Vec<&str>) =
                    said.split_inclusive('\n').partition(|l| l.starts_with(WARNING));
                assert_eq!(rest.concat().into_bytes(), expected.stderr, "nvlink's stderr: {said}");
                if i == 0 {
                    assert_eq!(warned.len(), 1, "daemon {restart}, link {i}: {said}");
                    assert!(warned[0].contains(named) && warned[0].contains("fix: "), "{said}");
                    assert!(said.starts_with(WARNING), "the warning comes first: {said}");
                } else {
                    assert!(warned.is_empty(), "said again to the same daemon: {said}");
                }
            }
            d.stop();
        }
    }
    // nvlink's normal routing: an input only nvlink may read.
    d.spawn(&[]);
    let fifo = inv("--arch=sm_90 accumulate.o /dev/null -o {OUT}/out.cubin", &out);
    let (expected, actual) = (run(&real_nvlink(), &fifo, &[]), run(&shim(), &fifo, &env(&d, None)));
    assert_eq!(d.stat("fallbacks"), 1, "the daemon handed the link back");
    assert_eq!((actual.code, &actual.stdout, &actual.stderr), (expected.code, &expected.stdout, &expected.stderr));
}

/// `status`, `stats` and `stop` with no daemon at the socket say so in words,
/// for a missing socket and for one nobody listens on (a killed daemon's):
/// `status` and `stats` fail, `stop` has nothing to do and succeeds.
#[test]
fn control_commands_without_a_daemon_say_so() {
    let dir = TempDir::new("nodaemon");
    let missing = dir.path().join("missing.sock");
    let stale = dir.path().join("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).expect("bind a socket"));
    for sock in [&missing, &stale] {
        let cmd = |c: &str| std::process::Command::new(nvlinkd()).arg(c).arg("--socket").arg(sock).output().unwrap();
        let absent = format!("no daemon is running at {}", sock.display());
        for c in ["status", "stats"] {
            let out = cmd(c);
            assert!(!out.status.success(), "nvlinkd {c} succeeded without a daemon");
            assert_eq!(
                String::from_utf8_lossy(&out.stderr),
                format!("nvlinkd: {absent} (start one with `nvlinkd start`)\n"),
                "nvlinkd {c}"
            );
        }
        // Stopping nothing succeeds (scripts stop unconditionally), said on stderr as status says it.
        let out = cmd("stop");
        assert!(out.status.success(), "nvlinkd stop failed: {}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(String::from_utf8_lossy(&out.stderr), format!("nvlinkd: {absent}\n"));
        assert!(out.stdout.is_empty());
    }
}

/// `nvlinkd stop` returns once the daemon process is gone, not before.
#[test]
fn stop_returns_once_the_daemon_has_exited() {
    let mut d = Daemon::start();
    let pid = d.pid().unwrap();
    let (ok, said) = d.control("stop").unwrap();
    assert!(ok, "nvlinkd stop failed");
    assert_eq!(said.trim(), format!("nvlinkd (pid {pid}) stopped"));
    let mut child = d.child.take().unwrap();
    assert!(child.try_wait().unwrap().is_some(), "nvlinkd stop returned while the daemon still ran");
    assert!(!d.socket().exists(), "socket left behind");
}

/// An output larger than one message piece (`CHUNK_BYTES`, 1 MiB): the daemon
/// sends it as slices of one buffer and the shim writes the pieces one after
/// another, computed and again from the cache (slices of the stored entry);
/// the file is nvlink's, byte for byte. The program is nvcc's own: a kernel
/// over a 2.5 MiB initialized device array (its zeros compress: the object is
/// 9 KB), so the cubin spans three pieces. nvlinkd sends this link to the
/// real nvlink (its host code references no kernel), whose result is stored
/// only when no input changed within `linkcache::TICK` before the link read
/// it: the test waits until the object is older than that, as any object is
/// by the time a build links it (CI once linked it 50 ms after nvcc wrote it).
#[test]
fn an_output_of_several_pieces_arrives_whole() {
    let src = TempDir::new("pieces-src");
    let object = corpus::big_array_object(src.path(), 2560 * 1024, false);
    let written = std::fs::metadata(object).unwrap();
    let ctime = std::time::UNIX_EPOCH + std::time::Duration::new(written.ctime() as u64, written.ctime_nsec() as u32);
    let settled = ctime + 2 * nvlinkd_core::linkcache::TICK;
    if let Ok(wait) = settled.duration_since(std::time::SystemTime::now()) {
        std::thread::sleep(wait);
    }
    let link = "--arch=sm_90 big.o -o {OUT}/out.cubin";
    let out = TempDir::new("pieces");
    let invocation = Invocation::templated(link, src.path(), &out);
    let expected = run(&real_nvlink(), &invocation, &[]);
    assert_eq!(expected.code, 0, "nvlink: {}", String::from_utf8_lossy(&expected.stderr));
    let size = expected.files.get("out.cubin").map_or(0, Vec::len);
    assert!(size > 2 * nvlinkd_proto::CHUNK_BYTES, "the cubin is {size} bytes: not three pieces");
    let d = Daemon::start();
    let env = d.shim_env();
    for (what, hits) in [("computed", 0), ("from the cache", 1)] {
        let actual = run(&shim(), &invocation, &env);
        let cmp = compare::runs(&expected, &actual);
        assert!(cmp.problems.is_empty() && cmp.identical, "{what}: {:?}", cmp.problems);
        let stats = d.stats();
        assert_eq!(stats["cache_hits"], hits, "{what}: {stats}\n{}", d.log());
    }
}

/// Minor page faults so far of process `pid`.
fn minor_faults(pid: u32) -> u64 {
    proc_stat_field(pid, 10).expect("the daemon's /proc stat").parse().expect("minflt")
}

/// The heap reserve (`core/src/heap.rs`, `serve --heap-reserve`): a fresh
/// daemon links in memory it touched when it started. A link of a 1 MiB
/// cubin, in process, right after a small link has run the code paths once:
/// without the reserve (`--heap-reserve 0`) the daemon faults the link's
/// buffers in page by page (thousands of faults), with it hardly at all. Both
/// answers are nvlink's, byte for byte.
#[test]
fn a_fresh_daemon_links_in_memory_it_touched_at_start() {
    let src = TempDir::new("heap-src");
    corpus::big_array_object(src.path(), 1 << 20, true);
    let out = TempDir::new("heap");
    let big = Invocation::templated("--arch=sm_90 big.o -o {OUT}/out.cubin", src.path(), &out);
    let small = inv("--arch=sm_90 accumulate.o scale.o -o {OUT}/small.cubin", &out);
    let expected = run(&real_nvlink(), &big, &[]);
    assert_eq!(expected.code, 0, "nvlink: {}", String::from_utf8_lossy(&expected.stderr));
    let mut faults = Vec::new();
    for reserve in ["64MiB by default", "0"] {
        let d = if reserve == "0" { Daemon::start_with(&["--heap-reserve", "0"]) } else { Daemon::start() };
        let env = d.shim_env();
        assert_eq!(run(&shim(), &small, &env).code, 0, "the small link failed:\n{}", d.log());
        let pid = d.pid().expect("daemon pid");
        let before = minor_faults(pid);
        let actual = run(&shim(), &big, &env);
        let after = minor_faults(pid);
        let cmp = compare::runs(&expected, &actual);
        assert!(cmp.problems.is_empty() && cmp.identical, "reserve {reserve}: {:?}", cmp.problems);
        assert_eq!(d.stat("in_process"), 2, "reserve {reserve}: not linked in process:\n{}", d.log());
        eprintln!("reserve {reserve}: the link faulted {} pages into the daemon", after - before);
        faults.push(after - before);
    }
    let (warm, cold) = (faults[0], faults[1]);
    assert!(cold > 500, "without the reserve the link faulted only {cold} pages in: it no longer measures the reserve");
    assert!(warm * 4 < cold, "the daemon's reserve was not used: {warm} faults, {cold} without");
}

/// Logs for pipelines: `nvlinkd serve` (run in a terminal, or by a service
/// manager collecting stderr: journald, `kubectl logs`) logs to stderr as
/// well as to its file, and with `--log-format=json` every line of both is a
/// JSON object; `nvlinkd start` detaches the daemon, which then logs to its
/// file only (nobody reads a detached daemon's stderr).
#[test]
fn serve_logs_to_stderr_and_a_detached_daemon_to_its_file_only() {
    use std::process::Stdio;
    use std::time::{Duration, Instant};
    let dir = TempDir::new("logs");
    let (sock, cache) = (dir.path().join("s"), dir.path().join("c"));
    let status = |sock: &std::path::Path| {
        Command::new(nvlinkd()).arg("status").arg("--socket").arg(sock).output().unwrap().status.success()
    };
    let serve = Command::new(nvlinkd())
        .args(["serve", "--log-format=json", "--verify=off", "--socket"])
        .arg(&sock)
        .arg("--cache-dir")
        .arg(&cache)
        .arg("--cuda-home")
        .arg(cuda_home())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !status(&sock) {
        assert!(Instant::now() < deadline, "nvlinkd serve did not come up");
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = TempDir::new("logs-out");
    let env = vec![
        ("NVLINKD_SOCKET".to_string(), sock.display().to_string()),
        ("NVLINKD_FALLBACK".to_string(), "never".to_string()),
    ];
    assert_eq!(run(&shim(), &inv("--arch=sm_90 accumulate.o scale.o -o {OUT}/out.cubin", &out), &env).code, 0);
    let stop = Command::new(nvlinkd()).arg("stop").arg("--socket").arg(&sock).output().unwrap();
    assert!(stop.status.success());
    let served = serve.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&served.stderr).into_owned();
    let file = std::fs::read_to_string(cache.join("nvlinkd.log")).unwrap();
    for (what, text) in [("stderr", &stderr), ("the log file", &file)] {
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{what}: not JSON ({e}): {l}\n{text}")))
            .collect();
        for message in ["nvlinkd serving", "link done", "nvlinkd stopped"] {
            assert!(
                lines.iter().any(|l| l["message"] == message && l["level"] == "INFO" && l["timestamp"].is_string()),
                "{what}: no INFO {message:?} line:\n{text}"
            );
        }
    }

    // Detached: the log file has the lines, the daemon's stderr none.
    let (sock, cache) = (dir.path().join("s2"), dir.path().join("c2"));
    let started = Command::new(nvlinkd())
        .arg("start")
        .arg("--socket")
        .arg(&sock)
        .env("NVLINKD_CACHE_DIR", &cache)
        .env("CUDA_HOME", cuda_home())
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&started.stdout).into_owned();
    assert!(started.status.success(), "{said}{}", String::from_utf8_lossy(&started.stderr));
    let pid: u32 = said
        .split("(pid ")
        .nth(1)
        .and_then(|r| r.split(')').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no pid in {said}"));
    let deadline = Instant::now() + Duration::from_secs(30);
    while !std::fs::read_to_string(cache.join("nvlinkd.log")).unwrap_or_default().contains("nvlinkd serving") {
        assert!(Instant::now() < deadline, "the detached daemon logged nothing to its file");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Its stderr (a memory file `start` reads back if it fails to start).
    let daemon_stderr = std::fs::read(format!("/proc/{pid}/fd/2")).unwrap_or_default();
    let daemon_stderr = String::from_utf8_lossy(&daemon_stderr);
    assert!(!daemon_stderr.contains(" INFO ") && !daemon_stderr.contains("nvlinkd serving"), "{daemon_stderr}");
    assert!(Command::new(nvlinkd()).arg("stop").arg("--socket").arg(&sock).status().unwrap().success());
}

/// `serve --config FILE`: the file's keys are serve's options (a switch, a
/// number, an address), the command line's options win over the file's (its
/// socket here), and a link through the daemon is nvlink's.
#[test]
fn a_config_file_sets_serve_options_and_the_command_line_wins() {
    let dir = TempDir::new("config");
    let metrics = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let file = dir.path().join("farm.toml");
    std::fs::write(
        &file,
        format!(
            "socket = \"/nonexistent/nvlinkd.sock\"\njobs = 1\nwatch = true\nmetrics-listen = \"{metrics}\"\n\
             verify = \"off\"\n"
        ),
    )
    .unwrap();
    let d = Daemon::start_with(&["--config", &file.display().to_string(), "--jobs", "2"]);
    assert!(d.answers(), "the daemon is not on the command line's socket");
    let lines = d.wait_log("speculative links", 1);
    assert!(lines[0].contains("watch=true") && lines[0].contains("jobs=Some(2)"), "{lines:?}");
    let mut s = std::net::TcpStream::connect(metrics).expect("the file's metrics-listen");
    std::io::Write::write_all(&mut s, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
    let mut answer = String::new();
    std::io::Read::read_to_string(&mut s, &mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let out = TempDir::new("config-out");
    let link = inv("--arch=sm_90 accumulate.o scale.o -o {OUT}/out.cubin", &out);
    let cmp = compare::runs(&run(&real_nvlink(), &link, &[]), &run(&shim(), &link, &d.shim_env()));
    assert!(cmp.problems.is_empty() && cmp.identical, "{:?}", cmp.problems);
    // An unknown key stops serve before anything starts, naming the key.
    std::fs::write(&file, "jbos = 2\n").unwrap();
    let out = Command::new(nvlinkd()).args(["serve", "--config"]).arg(&file).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown key 'jbos'"), "{out:?}");
}

/// The cache decides what links answer and the log names every link: serve
/// keeps its cache directory to its own user. A fresh one is made 0700, an
/// older one readable by all becomes 0700; one of another user's, a symlink,
/// or one inside another user's directory is refused before anything starts
/// (another user had it answer a poisoned entry and overwrite a file through
/// a planted temporary name).
#[test]
fn serve_keeps_its_cache_directory_to_its_own_user() {
    use std::os::unix::fs::{symlink, PermissionsExt};
    let root = TempDir::new("cache-owner");
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    let mut d = Daemon::start();
    assert_eq!(mode(&d.cache_dir()), 0o700, "a fresh cache directory");
    d.stop();
    std::fs::set_permissions(d.cache_dir(), std::fs::Permissions::from_mode(0o755)).unwrap();
    d.spawn(&[]);
    assert!(d.answers());
    assert_eq!(mode(&d.cache_dir()), 0o700, "an older cache directory readable by all");
    let older = d.cache_dir();
    let serve = |cache: &std::path::Path| {
        Command::new(nvlinkd())
            .args(["serve", "--socket"])
            .arg(root.path().join("s.sock"))
            .arg("--cache-dir")
            .arg(cache)
            .arg("--cuda-home")
            .arg(cuda_home())
            .output()
            .unwrap()
    };
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped the other user's cases: not root");
        return;
    }
    let linked = root.path().join("linked");
    symlink(&older, &linked).unwrap();
    std::os::unix::fs::lchown(&linked, Some(65534), Some(65534)).unwrap();
    let out = serve(&linked);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("is a symlink of uid 65534"), "{out:?}");
    let theirs = root.path().join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
    let out = serve(&theirs);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("belongs to uid 65534"), "{out:?}");
    let inside = theirs.join("cache");
    let out = serve(&inside);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("in a directory of uid 65534"), "{out:?}");
    // Anywhere on the way: another user's dangling symlink (they make its
    // target later, and own the daemon's scratch), or a symlink of root's
    // inside another user's directory (they point it elsewhere later).
    let dangling = root.path().join("dangling");
    symlink(root.path().join("nowhere"), &dangling).unwrap();
    std::os::unix::fs::lchown(&dangling, Some(65534), Some(65534)).unwrap();
    let out = serve(&dangling.join("cache"));
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("is a symlink of uid 65534"), "{out:?}");
    assert!(!root.path().join("nowhere").exists(), "the cache directory was made through their symlink");
    symlink(&older, theirs.join("l2")).unwrap();
    let out = serve(&theirs.join("l2/cache"));
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("in a directory of uid 65534"), "{out:?}");
    // Planted while the directory was open to others: a store elsewhere, a
    // file of another user; an open directory that is not empty.
    let planted = root.path().join("planted");
    std::fs::create_dir(&planted).unwrap();
    symlink(root.path(), planted.join("v2")).unwrap();
    let out = serve(&planted);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("holds a symlink"), "{out:?}");
    std::fs::remove_file(planted.join("v2")).unwrap();
    std::fs::create_dir(planted.join("toolkits")).unwrap();
    std::os::unix::fs::chown(planted.join("toolkits"), Some(65534), Some(65534)).unwrap();
    let out = serve(&planted);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("an entry of uid 65534"), "{out:?}");
    let open = root.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::write(open.join("nvlinkd.log"), "").unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = serve(&open);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("could be written by other users"), "{out:?}");
    // One level down: a store others could write into under a directory they
    // can reach, and a planted shard.
    let reach = root.path().join("reach");
    std::fs::create_dir_all(reach.join("v2")).unwrap();
    std::fs::set_permissions(&reach, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(reach.join("v2"), std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = serve(&reach);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("others may write into"), "{out:?}");
    std::fs::set_permissions(reach.join("v2"), std::fs::Permissions::from_mode(0o700)).unwrap();
    symlink(root.path(), reach.join("v2/90")).unwrap();
    let out = serve(&reach);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("holds a symlink"), "{out:?}");
}

/// An output nvlink cannot open (its directory missing, for `-o`, the
/// registration file or the `-time` table): nvlink's fatal line and exit
/// status, through the shim and through `nvlinkd exec` alike (exec printed an
/// OS error of its own; the `-time` table's has its own words).
#[test]
fn an_output_in_a_missing_directory_gets_nvlinks_fatal_through_shim_and_exec() {
    let d = Daemon::start();
    let out = TempDir::new("nodir");
    let env = [("CUDA_HOME".to_string(), cuda_home().display().to_string())];
    for args in [
        "--arch=sm_90 accumulate.o scale.o -o {OUT}/nodir/x.cubin",
        "--arch=sm_90 --register-link-binaries={OUT}/nodir/x.reg.c accumulate.o scale.o -o {OUT}/x.cubin",
        "--arch=sm_90 -time {OUT}/nodir/t.csv accumulate.o scale.o -o {OUT}/x.cubin",
    ] {
        let expected = run(&real_nvlink(), &inv(args, &out), &[]);
        assert_eq!(expected.code, 1, "{args}: nvlink did not fail");
        let through_shim = run(&shim(), &inv(args, &out), &d.shim_env());
        let mut exec = inv(args, &out);
        exec.args.splice(0..0, ["exec".to_string(), "--".to_string()]);
        let through_exec = run(&nvlinkd(), &exec, &env);
        for (how, actual) in [("shim", &through_shim), ("exec", &through_exec)] {
            let cmp = compare::runs(&expected, actual);
            assert!(cmp.problems.is_empty() && cmp.identical, "{args} through {how}: {:?}", cmp.problems);
        }
    }
}

/// An output named so that it can only be a directory (`x/`, `x/.`, `x//`):
/// nvlink cannot open it and fails, whatever is there. Through the shim (its
/// outputs in messages, or staged by the daemon when large) and through
/// `nvlinkd exec` alike: nvlink's fatal, and what was at `x` untouched (a file
/// or a symlink is never replaced by a rename; as root that was a device).
#[test]
fn an_output_named_as_a_directory_gets_nvlinks_fatal_and_leaves_what_is_there() {
    let d = Daemon::start();
    let out = TempDir::new("dirname-out");
    // What is there already, outside the directory each run empties.
    let there = TempDir::new("dirname-there");
    let at = |name: &str| there.path().join(name);
    let env = [("CUDA_HOME".to_string(), cuda_home().display().to_string())];
    std::fs::write(at("existing.cubin"), b"keep").unwrap();
    std::fs::write(at("target.txt"), b"target").unwrap();
    std::os::unix::fs::symlink("target.txt", at("lnk")).unwrap();
    let big = TempDir::new("dirname-big");
    corpus::big_array_object(big.path(), 1 << 20, true);
    let state = |name: &str| std::fs::symlink_metadata(at(name)).map(|m| (m.ino(), m.mode())).ok();
    let kept = [("existing.cubin", state("existing.cubin")), ("lnk", state("lnk"))];
    let t = there.path().display().to_string();
    let cases = [
        (format!("--arch=sm_90 accumulate.o scale.o -o {t}/x.cubin/"), corpus::dir().as_path()),
        (format!("--arch=sm_90 accumulate.o scale.o -o {t}/x.cubin/."), corpus::dir()),
        (format!("--arch=sm_90 accumulate.o scale.o -o {t}/x.cubin//"), corpus::dir()),
        (format!("--arch=sm_90 accumulate.o scale.o -o {t}/existing.cubin/"), corpus::dir()),
        (format!("--arch=sm_90 accumulate.o scale.o -o {t}/lnk/"), corpus::dir()),
        (
            format!("--arch=sm_90 --register-link-binaries={t}/r.h/ accumulate.o scale.o -o {{OUT}}/y.cubin"),
            corpus::dir(),
        ),
        // A large output: the daemon would stage it beside its target.
        (format!("--arch=sm_90 big.o -o {t}/existing.cubin/"), big.path()),
    ];
    for (args, cwd) in &cases {
        let link = Invocation::templated(args, cwd, &out);
        let expected = run(&real_nvlink(), &link, &[]);
        assert_eq!(expected.code, 1, "{args}: nvlink did not fail");
        let through_shim = run(&shim(), &link, &d.shim_env());
        let mut exec = link.clone();
        exec.args.splice(0..0, ["exec".to_string(), "--".to_string()]);
        let through_exec = run(&nvlinkd(), &exec, &env);
        for (how, actual) in [("shim", &through_shim), ("exec", &through_exec)] {
            let cmp = compare::runs(&expected, actual);
            assert!(cmp.problems.is_empty() && cmp.identical, "{args} through {how}: {:?}", cmp.problems);
        }
        for (name, was) in &kept {
            assert_eq!(&state(name), was, "{args}: {name} was replaced");
        }
        assert_eq!(std::fs::read(at("existing.cubin")).unwrap(), b"keep", "{args}");
        assert_eq!(std::fs::read(at("target.txt")).unwrap(), b"target", "{args}");
        for made in ["x.cubin", "r.h"] {
            assert!(!at(made).exists(), "{args}: {made} was written");
        }
    }
}

/// An existing output this user may not write (mode 0444, not root): nvlink
/// cannot open it, so the shim fails as nvlink does and leaves the file as
/// it was (a rename into its directory would have replaced it).
#[test]
fn a_read_only_output_of_another_run_is_left_alone_as_nvlink_does() {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root to act as another user");
        return;
    }
    let work = TempDir::new("ro-out");
    std::fs::set_permissions(work.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    for f in ["accumulate.o", "scale.o"] {
        std::fs::copy(corpus::dir().join(f), work.path().join(f)).unwrap();
    }
    let as_nobody = |args: &[String], env: &[(String, String)]| {
        Command::new("timeout")
            .args(["60", "setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"])
            .args(args)
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .current_dir(work.path())
            .output()
    };
    match as_nobody(&[nvlinkd().display().to_string(), "--version".into()], &[]) {
        Ok(o) if o.status.success() => {}
        other => {
            eprintln!("skipped: nobody cannot run nvlinkd here ({other:?})");
            return;
        }
    }
    let ro = work.path().join("ro.cubin");
    std::fs::write(&ro, b"old").unwrap();
    let nobody = nvlinkd_core::confine::SandboxUser::lookup("nobody").expect("user nobody");
    std::os::unix::fs::chown(&ro, Some(nobody.uid), Some(nobody.gid)).unwrap();
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o444)).unwrap();
    let link: Vec<String> =
        ["--arch=sm_90", "accumulate.o", "scale.o", "-o", "ro.cubin"].iter().map(|s| s.to_string()).collect();
    let with = |program: std::path::PathBuf| {
        std::iter::once(program.display().to_string()).chain(link.clone()).collect::<Vec<_>>()
    };
    let expected = as_nobody(&with(real_nvlink()), &[]).unwrap();
    assert!(!expected.status.success(), "nvlink wrote a read-only file: {expected:?}");
    let socket = work.path().join("run/nvlinkd.sock");
    // Its cache outside the open working directory (serve refuses a cache
    // directory in one that others can write).
    let caches = TempDir::new("ro-out-cache");
    let cache = caches.path().join("cache");
    std::fs::create_dir(&cache).unwrap();
    std::os::unix::fs::chown(&cache, Some(nobody.uid), Some(nobody.gid)).unwrap();
    let env = nvlinkd_tests::env::auto_start_env(&socket, &cache);
    let actual = as_nobody(&with(shim()), &env).unwrap();
    let stop = [nvlinkd().display().to_string(), "stop".into(), "--socket".into(), socket.display().to_string()];
    let _ = as_nobody(&stop, &[]);
    assert_eq!(
        (actual.status.code(), &actual.stdout, &actual.stderr),
        (expected.status.code(), &expected.stdout, &expected.stderr),
        "the shim as nobody: {}",
        String::from_utf8_lossy(&actual.stderr)
    );
    assert_eq!(std::fs::read(&ro).unwrap(), b"old");
    assert_eq!(std::fs::metadata(&ro).unwrap().mode() & 0o777, 0o444);
}

/// A toolkit changed in place under a running daemon: where only the files'
/// stats moved (the same bytes renamed into place) the daemon goes on with
/// its cache; where their contents changed (a patched ptxas) the caller's
/// nvlink links from then on (`toolkit_changed`), never the old answers.
#[test]
fn a_toolkit_changed_under_a_running_daemon_is_not_served_old_answers() {
    let host = TempDir::new("tk-changed");
    let home = host.path().join("cuda");
    nvlinkd_tests::env::install_toolkit_copy(&home);
    let h = home.display().to_string();
    let d = Daemon::start_with(&["--cuda-home", &h]);
    let mut env = d.shim_env();
    env.retain(|(k, _)| k != "CUDA_HOME" && k != "NVLINKD_FALLBACK");
    env.push(("CUDA_HOME".into(), h.clone()));
    let out = TempDir::new("tk-changed-out");
    let link = inv("--arch=sm_90 accumulate.o scale.o -o {OUT}/out.cubin", &out);
    let expected = run(&real_nvlink(), &link, &[]);
    // A new installation: its contents are hashed beside the first links,
    // which key with a provisional identity until then.
    let hashed = std::time::Instant::now();
    while d.stat("toolkits_hashing") > 0 {
        assert!(hashed.elapsed() < std::time::Duration::from_secs(60), "the toolkit was never hashed");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let same = |what: &str| {
        let cmp = compare::runs(&expected, &run(&shim(), &link, &env));
        assert!(cmp.problems.is_empty() && cmp.identical, "{what}: {:?}", cmp.problems);
    };
    same("first");
    // The same ptxas renamed into place: new inode and times, same bytes.
    let ptxas = home.join("bin/ptxas");
    std::fs::copy(&ptxas, home.join("bin/ptxas.new")).unwrap();
    std::fs::rename(home.join("bin/ptxas.new"), &ptxas).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1100));
    same("after a rename");
    assert_eq!(d.stat("cache_hits"), 1, "the same bytes lost the cache: {}", d.stats());
    // A patched ptxas (one byte more, which it ignores).
    let mut f = std::fs::OpenOptions::new().append(true).open(&ptxas).unwrap();
    std::io::Write::write_all(&mut f, b"\0").unwrap();
    drop(f);
    std::thread::sleep(std::time::Duration::from_millis(1100));
    same("after a patch");
    assert_eq!(d.reason_count("fallback_reasons", "toolkit_changed"), 1, "{}", d.stats());
    assert_eq!(d.stat("cache_hits"), 1, "an old answer was served: {}", d.stats());
}

/// Variables nvlink itself reads and no key holds (`FINALIZER_CUBIE`, which
/// dumps the finalizer's input and says so on stdout;
/// `FINALIZER_USE_LEGACY_ELF_BUILDER`, another ELF builder) make the shim
/// run the real nvlink: its stdout, files and bytes, and no request reaches
/// the daemon.
#[test]
fn variables_nvlink_reads_make_the_shim_run_nvlink() {
    let d = Daemon::start();
    let out = TempDir::new("nvlink-env");
    let link = inv("--arch=sm_90 dynsmem_ptx.o -o {OUT}/p.cubin", &out);
    for (name, value) in [
        ("FINALIZER_CUBIE", out.path().join("cubie.out").display().to_string()),
        ("FINALIZER_USE_LEGACY_ELF_BUILDER", "1".to_owned()),
    ] {
        let env = vec![(name.to_owned(), value)];
        let expected = run(&real_nvlink(), &link, &env);
        assert_eq!(expected.code, 0, "{name}: {}", String::from_utf8_lossy(&expected.stderr));
        let mut shim_env = d.shim_env();
        shim_env.extend(env);
        let actual = run(&shim(), &link, &shim_env);
        assert_eq!(
            (actual.code, &actual.stdout, &actual.stderr, &actual.files),
            (expected.code, &expected.stdout, &expected.stderr, &expected.files),
            "{name}"
        );
    }
    assert_eq!(d.stat("requests"), 0, "a link with nvlink's own variables reached the daemon");
}
