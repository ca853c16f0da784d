//! IDE and background use: the scheduler's priority classes and bounded
//! admission, supersession of links of the same output, cancellation of
//! queued links, and the event stream (`nvlinkd events --json`).
//!
//! Order is observed through the event stream (`link_queued`,
//! `link_admitted`, `link_cancelled`), never through timing: the daemon's test
//! hook `NVLINKD_TEST_HOLD_SLOT` keeps every admitted link in its slot while a
//! file exists, so a test fills the slots, queues links, then releases them.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nvlinkd_tests::compare;
use nvlinkd_tests::corpus;
use nvlinkd_tests::daemon::{proc_stat_field, Daemon};
use nvlinkd_tests::env::{real_nvlink, shim, TempDir};
use nvlinkd_tests::events::Events;
use nvlinkd_tests::run::{run, Invocation, Run};
use serde_json::Value;

/// Longest wait for an event the test provoked (a broken daemon fails here
/// instead of hanging).
const PATIENCE: Duration = Duration::from_secs(120);

const LINK: &str = "--arch=sm_90 accumulate.o scale.o -o {OUT}/out.cubin";
const LTO: &str =
    "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} accumulate_lto.o scale_lto.o -lcudadevrt -o {OUT}/out.cubin";

fn inv(args: &str, out: &TempDir) -> Invocation {
    Invocation::templated(args, corpus::dir(), out)
}

fn same(expected: &Run, actual: &Run, what: &str) {
    let cmp = compare::runs(expected, actual);
    assert!(
        cmp.problems.is_empty() && cmp.identical,
        "{what}: {:?}\nstderr: {}",
        cmp.problems,
        String::from_utf8_lossy(&actual.stderr)
    );
}

/// The shim, started and left running.
fn spawn_shim(inv: &Invocation, env: &[(String, String)]) -> Child {
    let _ = std::fs::create_dir_all(&inv.out_dir);
    let mut cmd = Command::new(shim());
    cmd.args(&inv.args).current_dir(&inv.cwd).env_clear();
    for k in ["PATH", "HOME", "TMPDIR"] {
        if let Ok(v) = std::env::var(k) {
            cmd.env(k, v);
        }
    }
    cmd.envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the shim")
}

fn with(env: Vec<(String, String)>, extra: &[(&str, &str)]) -> Vec<(String, String)> {
    env.into_iter().chain(extra.iter().map(|(k, v)| (k.to_string(), v.to_string()))).collect()
}

/// A daemon whose admitted links wait while `hold` exists.
fn held_daemon(hold: &Path, extra: &[&str]) -> Daemon {
    Daemon::start_env(extra, &[("NVLINKD_TEST_HOLD_SLOT", &hold.display().to_string())])
}

/// `-o` names an output file per tag, so that links do not supersede each
/// other, and the inputs differ per tag: identical links (the same inputs and
/// options, another output name) wait for the first one's result on its
/// flight, never for a slot, and so are never queued.
fn link_to(tag: &str) -> String {
    let inputs = match tag {
        "b1" | "queued" => "scale.o accumulate.o",
        "f1" => "-w accumulate.o scale.o",
        "b2" => "-w scale.o accumulate.o",
        "f2" => "vars_def.o vars_use.o",
        _ => "accumulate.o scale.o",
    };
    LINK.replace("accumulate.o scale.o", inputs).replace("out.cubin", &format!("{tag}.cubin"))
}

fn str_field<'a>(v: &'a Value, f: &str) -> &'a str {
    v[f].as_str().unwrap_or_else(|| panic!("no string {f} in {v}"))
}

fn num_field(v: &Value, f: &str) -> f64 {
    v[f].as_f64().unwrap_or_else(|| panic!("no number {f} in {v}"))
}

/// The events of a cold LTO link, of the same link served from the cache, of
/// a link with nvlink's diagnostics and of cancelled links (queued and
/// computing), each with every field the schema names.
#[test]
fn event_stream_schema() {
    let work = TempDir::new("ev");
    let hold = work.path().join("hold");
    let d = held_daemon(&hold, &["--jobs", "1"]);
    let mut ev = Events::follow(&d);
    let out = TempDir::new("ev-out");

    // A cold LTO link: started, its phases, finished in process.
    let r = run(&shim(), &inv(LTO, &out), &d.shim_env());
    assert_eq!(r.code, 0, "{}", String::from_utf8_lossy(&r.stderr));
    let cold = ev.started("out.cubin");
    let started = ev.of("link_started", cold);
    assert_eq!(str_field(&started, "cwd"), corpus::dir().display().to_string());
    assert_eq!(started["args"].as_array().map(Vec::len), Some(inv(LTO, &out).args.len()));
    assert_eq!(str_field(&started, "priority"), "foreground");
    assert_eq!(started["speculative"], false);
    let finished = ev.of("link_finished", cold);
    assert_eq!(finished["exit_code"], 0);
    assert!(num_field(&finished, "ms") >= 0.0);
    assert_eq!(finished["cache_hit"], false);
    assert_eq!(str_field(&finished, "engine"), "in_process");
    let phases: Vec<Value> = ev.all("phase_finished", cold);
    let names: Vec<&str> = phases.iter().map(|p| str_field(p, "phase")).collect();
    for want in ["plan", "nvvm", "ptxas"] {
        assert!(names.contains(&want), "no {want} phase in {names:?}");
    }
    for p in &phases {
        assert_eq!(p["cached"], false, "a cold link's phase was cached: {p}");
        assert_eq!(p["aborted"], false, "{p}");
        assert!(num_field(p, "ms") >= 0.0);
    }
    // Each phase was announced when it began, before it ended.
    let began = ev.all("phase_started", cold);
    let started: Vec<&str> = began.iter().map(|p| str_field(p, "phase")).collect();
    assert_eq!(started.len(), names.len(), "{started:?} began, {names:?} ended");
    for name in &names {
        assert!(started.contains(name), "{name} ended without beginning");
    }
    // Every event of the link carries the envelope.
    for e in ev.seen.iter().filter(|e| e["link"] == cold) {
        assert_eq!(e["schema"], 1, "{e}");
        assert!(e["time"].as_str().is_some_and(|t| t.ends_with('Z') && t.len() >= 20), "{e}");
    }
    assert_eq!(finished["cwd"].as_str(), Some(corpus::dir().to_str().unwrap()));
    assert_eq!(finished["outputs"], serde_json::json!([out.path().join("out.cubin")]), "{finished}");
    assert!(ev.all("link_admitted", cold).len() == 1, "the cold link was not admitted once");

    // The same link again: a whole-link cache hit, never admitted.
    let r = run(&shim(), &inv(LTO, &out), &d.shim_env());
    assert_eq!(r.code, 0);
    let hit = ev.wait("a second link_started", |v| v["event"] == "link_started" && v["link"].as_u64() > Some(cold));
    let hit = hit["link"].as_u64().unwrap();
    let finished = ev.of("link_finished", hit);
    assert_eq!((finished["cache_hit"].as_bool(), finished["engine"].as_str()), (Some(true), Some("cache")));
    assert!(ev.all("link_admitted", hit).is_empty(), "a cache hit took a slot");

    // nvlink's diagnostics: an undefined reference (the real nvlink as engine).
    let r = run(&shim(), &inv("--arch=sm_90 missing.o -o {OUT}/missing.cubin", &out), &d.shim_env());
    assert_ne!(r.code, 0);
    let bad = ev.started("missing.cubin");
    let finished = ev.of("link_finished", bad);
    assert_eq!(finished["exit_code"].as_i64(), Some(r.code as i64));
    let diags = ev.all("diagnostic", bad);
    assert!(!diags.is_empty(), "no diagnostic for {}", String::from_utf8_lossy(&r.stderr));
    for (diag, line) in diags.iter().zip(String::from_utf8_lossy(&r.stderr).lines()) {
        assert_eq!(str_field(diag, "severity"), "error", "{diag}");
        assert!(line.ends_with(str_field(diag, "message")), "{diag} is not {line:?}");
    }
    // The undefined reference, in fields: the symbol (demangled) and the object.
    let undefined = &diags[0];
    assert_eq!(str_field(undefined, "code"), "undefined_reference", "{undefined}");
    assert_eq!(str_field(undefined, "symbol_demangled"), "missing_symbol(float)", "{undefined}");
    assert_eq!(str_field(undefined, "object"), "missing.o", "{undefined}");
    assert_eq!(str_field(undefined, "object_path"), corpus::dir().join("missing.o").to_str().unwrap());

    // Cancelled: one link computing (held in the only slot), one queued
    // behind it; their shims are killed.
    std::fs::write(&hold, b"").unwrap();
    let mut computing = spawn_shim(&inv(&link_to("computing"), &out), &d.shim_env());
    let a = ev.started("computing.cubin");
    ev.of("link_admitted", a);
    let mut queued = spawn_shim(&inv(&link_to("queued"), &out), &d.shim_env());
    let b = ev.started("queued.cubin");
    assert_eq!(str_field(&ev.of("link_queued", b), "priority"), "foreground");
    queued.kill().unwrap();
    queued.wait().unwrap();
    assert_eq!(str_field(&ev.of("link_cancelled", b), "reason"), "caller_gone");
    computing.kill().unwrap();
    computing.wait().unwrap();
    assert_eq!(str_field(&ev.of("link_cancelled", a), "reason"), "caller_gone");
    assert!(ev.all("link_admitted", b).is_empty(), "the queued link was admitted after its caller left");
    assert_eq!(d.stat("cancelled"), 2);
    assert_eq!(d.stat("fallbacks"), 0, "cancelled links are not fallbacks: {}", d.stats());
    assert_eq!(d.stat("queued"), 0);
    std::fs::remove_file(&hold).unwrap();
}

/// With one slot, waiting links start foreground first, then background,
/// each class in arrival order; all give nvlink's bytes.
#[test]
fn queued_links_start_by_priority_then_arrival() {
    let work = TempDir::new("prio");
    let hold = work.path().join("hold");
    let d = held_daemon(&hold, &["--jobs", "1"]);
    let mut ev = Events::follow(&d);
    let out = TempDir::new("prio-out");
    let bg = with(d.shim_env(), &[("NVLINKD_PRIORITY", "background")]);
    let fg = d.shim_env();

    std::fs::write(&hold, b"").unwrap();
    let mut shims = vec![spawn_shim(&inv(&link_to("first"), &out), &fg)];
    let first = ev.started("first.cubin");
    ev.of("link_admitted", first);
    let mut ids = Vec::new();
    for (tag, env) in [("b1", &bg), ("f1", &fg), ("b2", &bg), ("f2", &fg)] {
        shims.push(spawn_shim(&inv(&link_to(tag), &out), env));
        let id = ev.started(&format!("{tag}.cubin"));
        let queued = ev.of("link_queued", id);
        assert_eq!(str_field(&queued, "priority"), if tag.starts_with('b') { "background" } else { "foreground" });
        ids.push((tag, id));
    }
    std::fs::remove_file(&hold).unwrap();
    for (_, id) in &ids {
        ev.of("link_finished", *id);
    }
    for mut s in shims {
        assert!(s.wait().unwrap().success());
    }
    let admitted: Vec<&str> = ev
        .seen
        .iter()
        .filter(|v| v["event"] == "link_admitted")
        .filter_map(|v| ids.iter().find(|(_, id)| v["link"] == *id).map(|(tag, _)| *tag))
        .collect();
    assert_eq!(admitted, ["f1", "f2", "b1", "b2"]);
    let expected = run(&real_nvlink(), &inv(&link_to("b2"), &out), &[]);
    same(&expected, &run(&shim(), &inv(&link_to("b2"), &out), &bg), "a background link");
}

/// Cache hits and front-end answers are served while every slot is busy.
#[test]
fn cache_hits_do_not_wait_for_a_slot() {
    let work = TempDir::new("hits");
    let hold = work.path().join("hold");
    let d = held_daemon(&hold, &["--jobs", "1"]);
    let mut ev = Events::follow(&d);
    let out = TempDir::new("hits-out");
    // In the cache before the slot is taken.
    let expected = run(&real_nvlink(), &inv(LINK, &out), &[]);
    same(&expected, &run(&shim(), &inv(LINK, &out), &d.shim_env()), "first link");

    std::fs::write(&hold, b"").unwrap();
    let other = TempDir::new("hits-busy");
    let mut busy = spawn_shim(&inv(LTO, &other), &d.shim_env());
    let b = ev.started(&format!("{}/out.cubin", other.path().display()));
    ev.of("link_admitted", b);
    // Another link that must compute waits ...
    let mut waiting = spawn_shim(&inv("--arch=sm_90 vars_def.o vars_use.o -o {OUT}/waits.cubin", &out), &d.shim_env());
    let w = ev.started("waits.cubin");
    ev.of("link_queued", w);
    // ... a cache hit and --help do not.
    let (tx, rx) = std::sync::mpsc::channel();
    let (hit_inv, env) = (inv(LINK, &out), d.shim_env());
    std::thread::spawn(move || {
        let _ = tx.send((run(&shim(), &hit_inv, &env), run(&shim(), &inv("--help", &TempDir::new("h")), &env)));
    });
    let (hit, help) = rx.recv_timeout(PATIENCE).expect("a cache hit waited behind a busy slot");
    same(&expected, &hit, "cache hit while the slot is busy");
    assert_eq!(help.code, 0);
    assert!(matches!(busy.try_wait(), Ok(None)), "the busy link ended: the test proved nothing");
    assert_eq!(d.stat("running_foreground"), 1);
    assert_eq!(d.stat("queued"), 1);
    std::fs::remove_file(&hold).unwrap();
    assert!(busy.wait().unwrap().success());
    assert!(waiting.wait().unwrap().success());
}

/// A newer link of the same output from the same directory supersedes the
/// one still running: the older shim fails with one nvlink-style line and
/// does not run nvlink (its output is not written, though fallback is
/// allowed); the newer one gives nvlink's bytes.
#[test]
fn a_newer_link_of_the_same_output_supersedes_the_older() {
    let work = TempDir::new("sup");
    let hold = work.path().join("hold");
    let d = held_daemon(&hold, &[]);
    let mut ev = Events::follow(&d);
    let out = TempDir::new("sup-out");
    std::fs::write(&hold, b"").unwrap();
    let older = spawn_shim(&inv(LTO, &out), &d.fallback_env());
    let a = ev.started("out.cubin");
    ev.of("link_admitted", a);
    // The newer link: same directory, same -o (other inputs: an edit).
    let newer_args = LINK;
    let newer = spawn_shim(&inv(newer_args, &out), &d.shim_env());
    let cancelled = ev.of("link_cancelled", a);
    assert_eq!(str_field(&cancelled, "reason"), "superseded");
    // It names the link that superseded it.
    let b = ev.wait("the newer link", |v| v["event"] == "link_started" && v["link"].as_u64() > Some(a));
    assert_eq!(cancelled["superseded_by"], b["link"], "{cancelled}");
    assert_eq!(cancelled["outputs"][0].as_str(), Some(out.path().join("out.cubin").to_str().unwrap()), "{cancelled}");
    let older = older.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&older.stderr);
    assert_eq!(older.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with("nvlink fatal   : ") && stderr.contains("superseded"), "{stderr}");
    assert!(!out.path().join("out.cubin").exists(), "the superseded link's shim wrote an output (ran nvlink?)");
    std::fs::remove_file(&hold).unwrap();
    let newer = newer.wait_with_output().unwrap();
    assert!(newer.status.success(), "{}", String::from_utf8_lossy(&newer.stderr));
    let got = std::fs::read(out.path().join("out.cubin")).unwrap();
    let reference = TempDir::new("sup-ref");
    let expected = run(&real_nvlink(), &inv(newer_args, &reference), &[]);
    assert_eq!(Some(&got), expected.files.get("out.cubin"), "the newer link's output is not nvlink's");
    assert_eq!(d.stat("cancelled_superseded"), 1);
    assert_eq!(d.stat("cancelled"), 1);
    // The superseded link cached nothing partial: the LTO link computes afresh
    // and gives nvlink's bytes.
    let expected = run(&real_nvlink(), &inv(LTO, &reference), &[]);
    same(&expected, &run(&shim(), &inv(LTO, &out), &d.shim_env()), "the LTO link after its supersession");
}

/// Two remote callers naming the same directory and output are different
/// machines: the newer link does not stop the older one (a token holder could
/// otherwise fail anyone's link); both give nvlink's bytes.
#[test]
fn a_remote_link_supersedes_no_other_link() {
    use nvlinkd_tests::remote::{free_port, Pki};
    let work = TempDir::new("sup-remote");
    let hold = work.path().join("hold");
    let pki = Pki::new();
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let (cert, key, tokens) = (pki.file("cert.pem"), pki.file("key.pem"), pki.file("tokens"));
    let d = held_daemon(&hold, &["--listen", &listen, "--tls-cert", &cert, "--tls-key", &key, "--token-file", &tokens]);
    let mut ev = Events::follow(&d);
    let env = pki.shim_env(&format!("https://127.0.0.1:{port}"), "never");
    let out_a = TempDir::new("sup-remote-a");
    std::fs::write(&hold, b"").unwrap();
    let older = spawn_shim(&inv(LTO, &out_a), &env);
    let a = ev.started("out.cubin");
    ev.of("link_admitted", a);
    // The same directory and -o as the daemon sees them: the same template.
    let newer = spawn_shim(&inv(LINK, &out_a), &env);
    ev.started("out.cubin");
    std::fs::remove_file(&hold).unwrap();
    let older = older.wait_with_output().unwrap();
    let newer = newer.wait_with_output().unwrap();
    assert!(older.status.success(), "the older remote link failed: {}", String::from_utf8_lossy(&older.stderr));
    assert!(newer.status.success(), "{}", String::from_utf8_lossy(&newer.stderr));
    assert_eq!(d.stat("cancelled_superseded"), 0, "{}", d.stats());
}

/// Nice value and scheduling policy of a process (fields 19 and 41 of /proc/PID/stat).
fn policy(pid: u32) -> (i64, i64) {
    let field = |n| proc_stat_field(pid, n).unwrap().parse().unwrap();
    (field(19), field(41))
}

fn held_worker(hold: &Path) -> u32 {
    let prefix = format!("{}.", hold.file_name().unwrap().to_string_lossy());
    let deadline = Instant::now() + PATIENCE;
    loop {
        let found = std::fs::read_dir(hold.parent().unwrap())
            .unwrap()
            .flatten()
            .find_map(|e| e.file_name().to_string_lossy().strip_prefix(&prefix).and_then(|p| p.parse().ok()));
        if let Some(pid) = found {
            return pid;
        }
        assert!(Instant::now() < deadline, "no worker took the link");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A background link's nvJitLink worker runs at idle CPU priority
/// (`SCHED_IDLE`, or nice 19 where refused); a foreground link's does not.
#[test]
fn background_links_compute_at_idle_priority() {
    const SCHED_IDLE: i64 = 5;
    let work = TempDir::new("idle");
    let hold: PathBuf = work.path().join("hold");
    let d = Daemon::start_env(&[], &[("NVLINKD_TEST_WORKER_HOLD", &hold.display().to_string())]);
    let out = TempDir::new("idle-out");
    for (priority, link) in [("background", LINK), ("foreground", LTO)] {
        std::fs::write(&hold, b"").unwrap();
        let env = with(d.shim_env(), &[("NVLINKD_PRIORITY", priority)]);
        let shim = spawn_shim(&inv(link, &out), &env);
        let pid = held_worker(&hold);
        let (nice, sched) = policy(pid);
        let idle = sched == SCHED_IDLE || nice == 19;
        assert_eq!(idle, priority == "background", "{priority} worker {pid}: policy {sched}, nice {nice}");
        std::fs::remove_file(&hold).unwrap();
        let r = shim.wait_with_output().unwrap();
        assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
        let _ = std::fs::remove_file(format!("{}.{pid}", hold.display()));
    }
}

/// `NVLINKD_PROGRESS=1`: a link longer than a second shows one progress line
/// on stderr (not a terminal here: printed once); the link's answer is
/// nvlink's otherwise.
#[test]
fn progress_line_for_a_long_link() {
    let work = TempDir::new("progress");
    let hold = work.path().join("hold");
    let d = held_daemon(&hold, &[]);
    let mut ev = Events::follow(&d);
    let out = TempDir::new("progress-out");
    std::fs::write(&hold, b"").unwrap();
    let mut shim = spawn_shim(&inv(LINK, &out), &with(d.shim_env(), &[("NVLINKD_PROGRESS", "1")]));
    let id = ev.started("out.cubin");
    ev.of("link_admitted", id);
    // The line comes once the link has run for a second (it is held until then).
    let stderr = BufReader::new(shim.stderr.take().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        for l in stderr.lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    let line = rx.recv_timeout(PATIENCE).expect("no progress line from a held link");
    assert!(line.starts_with("nvlinkd: linking ") && line.contains("out.cubin"), "{line:?}");
    std::fs::remove_file(&hold).unwrap();
    assert!(shim.wait().unwrap().success());
    reader.join().unwrap();
    let rest: Vec<String> = rx.try_iter().collect();
    assert!(rest.is_empty(), "more than one progress line: {rest:?}");
    let reference = TempDir::new("progress-ref");
    let expected = run(&real_nvlink(), &inv(LINK, &reference), &[]);
    assert_eq!(std::fs::read(out.path().join("out.cubin")).ok().as_ref(), expected.files.get("out.cubin"));
}

/// A link holds its slot while it computes, not while it stores its entry:
/// with `--jobs 1`, a second link computes and answers while the first one
/// is held storing (`NVLINKD_TEST_HOLD_STORE`); then the first answers too,
/// both with nvlink's bytes.
#[test]
fn a_link_storing_its_entry_leaves_its_slot_to_the_next() {
    let work = TempDir::new("hold-store");
    let hold = work.path().join("hold");
    std::fs::write(&hold, b"").unwrap();
    let d = Daemon::start_env(&["--jobs", "1"], &[("NVLINKD_TEST_HOLD_STORE", &hold.display().to_string())]);
    const OTHER: &str = "--arch=sm_90 vars_def.o vars_use.o -o {OUT}/out.cubin";
    let (out_a, out_b) = (TempDir::new("store-a"), TempDir::new("store-b"));
    let expected_a = run(&real_nvlink(), &inv(LINK, &out_a), &[]);
    let expected_b = run(&real_nvlink(), &inv(OTHER, &out_b), &[]);

    let (tx_a, rx_a) = std::sync::mpsc::channel();
    let (a_inv, env) = (inv(LINK, &out_a), d.shim_env());
    std::thread::spawn(move || tx_a.send(run(&shim(), &a_inv, &env)));
    let storing = work.path().join("hold.storing");
    let t0 = Instant::now();
    while !storing.exists() {
        assert!(t0.elapsed() < PATIENCE, "the first link never reached its store");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (tx_b, rx_b) = std::sync::mpsc::channel();
    let (b_inv, env) = (inv(OTHER, &out_b), d.shim_env());
    std::thread::spawn(move || tx_b.send(run(&shim(), &b_inv, &env)));
    let b = rx_b.recv_timeout(Duration::from_secs(60));
    let a_still_storing = matches!(rx_a.try_recv(), Err(std::sync::mpsc::TryRecvError::Empty));
    std::fs::remove_file(&hold).unwrap();
    let b = b.expect("the second link waited for the first one's store (the slot was held while storing)");
    assert!(a_still_storing, "the first link was not held in its store: the test proved nothing");
    same(&expected_b, &b, "the link computed while another stored");
    let a = rx_a.recv_timeout(PATIENCE).expect("the held link never answered");
    same(&expected_a, &a, "the link held in its store");
    assert_eq!(d.stat("in_process"), 2);
}
