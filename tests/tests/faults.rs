//! Faults of clients and of the caller's files: streams that half-close, vanish
//! or stop answering in the middle of a link; stops with stuck clients;
//! `/dev/zero` and FIFOs as inputs; the socket in a shared directory or over a
//! regular file; a symlink planted at the shim's temporary output name; outputs
//! through symlinks and into devices; a daemon
//! that exits when idle. Every link is compared with the real nvlink's.
//!
//! The hostile clients speak the daemon's protocol directly (nvlinkd-proto):
//! they send a `Start` whose working directory does not match the daemon's view
//! (so the daemon reads the files over the stream, as for a remote shim) and
//! then misbehave once the first file request arrives.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nvlinkd_proto::shared;
use nvlinkd_proto::v1::{
    client_message, nvlinkd_client::NvlinkdClient, server_message, ClientMessage, ServerMessage, Start,
};
use nvlinkd_tests::compare;
use nvlinkd_tests::corpus;
use nvlinkd_tests::daemon::{proc_stat_field, Daemon};
use nvlinkd_tests::env::{cuda_home, nvlinkd, real_nvlink, shim, TempDir};
use nvlinkd_tests::run::{run, Invocation, Run};
use tokio::sync::mpsc;
use tonic::transport::Channel;

const LINK: &str = "--arch=sm_90 accumulate.o scale.o -o {OUT}/out.cubin";

fn inv(args: &str, cwd: &std::path::Path, out: &TempDir) -> Invocation {
    Invocation::templated(args, cwd, out)
}

/// Poll `cond` until it holds or `limit` passes (a bound on a hang, not a speed claim).
fn eventually(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() > end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn threads_of(pid: u32) -> usize {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status.lines().find_map(|l| l.strip_prefix("Threads:")).and_then(|v| v.trim().parse().ok()).unwrap_or(0)
}

fn alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks for existence.
    unsafe { libc::kill(pid as i32, 0) == 0 }
}

/// The daemon's process has exited (reaped) within `limit`.
fn exits_within(d: &mut Daemon, limit: Duration) -> bool {
    let Some(child) = d.child.as_mut() else { return true };
    let exited = eventually(limit, || matches!(child.try_wait(), Ok(Some(_))));
    if exited {
        d.child = None;
    }
    exited
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

async fn connect(socket: &Path) -> Channel {
    shared::connect_unix(shared::unix_endpoint(), socket.to_path_buf()).await.expect("connect to the daemon")
}

/// How a hostile client misbehaves once the daemon asks it for a file.
#[derive(Clone, Copy, Debug)]
enum Misbehave {
    /// End its side of the stream, keep reading the daemon's.
    HalfClose,
    /// Half-close, then drop the connection a moment later.
    Vanish,
    /// Keep the stream open and never answer.
    Silent,
}

/// Open a link in stream mode and misbehave at the first file request. Returns
/// what keeps the stream alive (dropped by the caller).
async fn hostile(socket: &Path, how: Misbehave) -> Option<Box<dyn std::any::Any + Send>> {
    let mut client = NvlinkdClient::new(connect(socket).await);
    let cwd = corpus::dir().clone();
    let out = std::env::temp_dir().join(format!("nvlt-hostile-{}.cubin", std::process::id()));
    let start = Start {
        args: ["--arch=sm_90", "accumulate.o", "scale.o", "-o", &out.display().to_string()].map(String::from).to_vec(),
        cwd: cwd.display().to_string(),
        env: Default::default(),
        toolkit_release: String::new(),
        // Not the daemon's view of the directory: it reads the files over the stream.
        cwd_dev: 0,
        cwd_ino: 0,
        ..Default::default()
    };
    let (tx, rx) = mpsc::channel::<ClientMessage>(8);
    tx.send(ClientMessage { msg: Some(client_message::Msg::Start(start)) }).await.ok()?;
    let mut inbound = client.link(tokio_stream::wrappers::ReceiverStream::new(rx)).await.ok()?.into_inner();
    // Wait for the daemon's first file request (the link is then reading); a
    // daemon whose links no longer start never sends one.
    let first = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            match inbound.message().await {
                Ok(Some(ServerMessage { msg: Some(server_message::Msg::File(_)) })) => return true,
                Ok(Some(_)) => continue,
                _ => return false,
            }
        }
    });
    if !first.await.unwrap_or(false) {
        return None;
    }
    match how {
        Misbehave::HalfClose => {
            drop(tx);
            // Keep reading what the daemon sends (it must end the link and close).
            tokio::spawn(async move { while let Ok(Some(_)) = inbound.message().await {} });
            Some(Box::new(client))
        }
        Misbehave::Vanish => {
            drop(tx);
            tokio::time::sleep(Duration::from_millis(5)).await;
            None
        }
        Misbehave::Silent => Some(Box::new((client, tx, inbound))),
    }
}

/// A normal link through the shim equals the real nvlink's.
fn normal_link_works(d: &Daemon) {
    let out = TempDir::new("flt-ref");
    let expected = run(&real_nvlink(), &inv(LINK, corpus::dir(), &out), &[]);
    assert_eq!(expected.code, 0);
    let invocation = inv(LINK, corpus::dir(), &out);
    let env = d.shim_env();
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = done_tx.send(run(&shim(), &invocation, &env));
    });
    let actual = done_rx.recv_timeout(Duration::from_secs(60)).expect("a normal link hangs");
    let cmp = compare::runs(&expected, &actual);
    assert!(cmp.problems.is_empty() && cmp.identical, "{:?}", cmp.problems);
}

#[test]
fn half_closed_and_vanished_streams_free_their_links() {
    let d = Daemon::start();
    let pid = d.pid().unwrap();
    let rt = runtime();
    for how in [Misbehave::HalfClose, Misbehave::Vanish] {
        let held = rt.block_on(hostile(&d.socket(), how));
        let freed = eventually(Duration::from_secs(20), || d.stat("in_flight") == 0);
        assert!(freed, "{how:?}: the link is still in flight after its stream closed");
        drop(held);
    }
    normal_link_works(&d);
    assert!(threads_of(pid) < 200, "daemon threads: {}", threads_of(pid));
}

#[test]
fn a_silent_client_times_out() {
    let d = Daemon::start_with(&["--reply-timeout", "1s"]);
    let rt = runtime();
    let held = rt.block_on(hostile(&d.socket(), Misbehave::Silent));
    assert!(held.is_some(), "no file request came");
    let freed = eventually(Duration::from_secs(20), || d.stat("in_flight") == 0);
    assert!(freed, "a link whose shim never answers is still in flight");
    normal_link_works(&d);
    drop(held);
}

#[test]
fn many_abandoned_streams_then_a_link_and_a_prompt_sigterm() {
    let mut d = Daemon::start();
    let pid = d.pid().unwrap();
    let rt = runtime();
    let socket = d.socket();
    // 600 streams (more than tokio's blocking pool), 50 at a time; half of them
    // half-close and stay connected, half vanish.
    let t0 = Instant::now();
    let held: Vec<_> = rt.block_on(async {
        let mut held = Vec::new();
        for batch in 0..12 {
            let tasks: Vec<_> = (0..50)
                .map(|i| {
                    let socket = socket.clone();
                    let how = if (batch + i) % 2 == 0 { Misbehave::HalfClose } else { Misbehave::Vanish };
                    tokio::spawn(async move { hostile(&socket, how).await })
                })
                .collect();
            for t in tasks {
                held.push(t.await.unwrap());
            }
        }
        held
    });
    let opened = t0.elapsed();
    let freed = eventually(Duration::from_secs(30), || d.stat("in_flight") == 0);
    eprintln!(
        "600 abandoned streams: opened in {:.2} s, all links freed {:.2} s after the last; daemon threads {}",
        opened.as_secs_f64(),
        (t0.elapsed() - opened).as_secs_f64(),
        threads_of(pid)
    );
    assert!(freed, "abandoned links still in flight: {}", d.stat("in_flight"));
    normal_link_works(&d);
    assert!(threads_of(pid) < 300, "daemon threads after 600 abandoned streams: {}", threads_of(pid));
    // Stuck clients still connected; a silent one mid-link too.
    let silent = rt.block_on(hostile(&socket, Misbehave::Silent));
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let t_term = Instant::now();
    let exited = exits_within(&mut d, Duration::from_secs(20));
    eprintln!("SIGTERM with 301 stuck clients: exited after {:.2} s", t_term.elapsed().as_secs_f64());
    assert!(exited, "nvlinkd ignores SIGTERM with stuck clients");
    drop((held, silent));
}

#[test]
fn stop_abandons_a_link_after_the_grace_period_and_the_shim_falls_back() {
    // The link computes "forever" (test hook); `nvlinkd stop` must not wait for it.
    let mut d = Daemon::start_env(&["--shutdown-grace", "200ms"], &[("NVLINKD_TEST_SLOW_LINK_MS", "600000")]);
    let out = TempDir::new("flt-stop");
    let expected = run(&real_nvlink(), &inv(LINK, corpus::dir(), &out), &[]);
    let mut env = d.shim_env();
    env.retain(|(k, _)| k != "NVLINKD_FALLBACK");
    env.push(("NVLINKD_REAL_NVLINK".into(), real_nvlink().display().to_string()));
    env.push(("NVLINKD_BIN".into(), "/nonexistent/nvlinkd".into()));
    let invocation = inv(LINK, corpus::dir(), &out);
    let handle = std::thread::spawn(move || run(&shim(), &invocation, &env));
    assert!(eventually(Duration::from_secs(20), || d.stat("in_flight") == 1), "link not in flight");
    // `stop` waits for the process to be gone: reap it meanwhile (it is our child).
    let mut stop = std::process::Command::new(nvlinkd())
        .arg("stop")
        .arg("--socket")
        .arg(d.socket())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let t_stop = Instant::now();
    let exited = exits_within(&mut d, Duration::from_secs(20));
    eprintln!("stop with a link computing, grace 200 ms: exited after {:.2} s", t_stop.elapsed().as_secs_f64());
    assert!(exited, "the daemon waits for a stuck link");
    assert!(stop.wait().unwrap().success(), "nvlinkd stop failed");
    let actual = handle.join().unwrap();
    let cmp = compare::runs(&expected, &actual);
    assert!(cmp.problems.is_empty() && cmp.identical, "{:?}", cmp.problems);
}

/// A directory of links to the corpus objects plus the odd inputs of a test.
fn scratch_inputs(tag: &str) -> TempDir {
    let dir = TempDir::new(tag);
    for f in ["accumulate.o", "scale.o"] {
        std::os::unix::fs::symlink(corpus::dir().join(f), dir.path().join(f)).unwrap();
    }
    dir
}

#[test]
fn dev_zero_inputs_are_answered_as_nvlink_does() {
    // A daemon that reads /dev/zero whole dies here instead of filling the machine.
    let d = Daemon::start_limited(&[], 4 << 30);
    let inputs = scratch_inputs("flt-zero");
    let cases: Vec<String> = ["o", "cubin", "ptx", "fatbin", "a"]
        .iter()
        .map(|ext| {
            let name = format!("zero.{ext}");
            std::os::unix::fs::symlink("/dev/zero", inputs.path().join(&name)).unwrap();
            format!("--arch=sm_90 accumulate.o scale.o {name} -o {{OUT}}/out.cubin")
        })
        .chain(["--arch=sm_90 accumulate.o /dev/zero scale.o -o {OUT}/out.cubin".to_string()])
        .collect();
    let before = d.stat("requests");
    for case in &cases {
        let out = TempDir::new("flt-zero-out");
        let expected = run(&real_nvlink(), &inv(case, inputs.path(), &out), &[]);
        let actual = run(&shim(), &inv(case, inputs.path(), &out), &d.fallback_env());
        let cmp = compare::runs(&expected, &actual);
        assert!(cmp.problems.is_empty() && cmp.identical, "{case}: {:?}", cmp.problems);
    }
    assert!(d.answers(), "the daemon died reading /dev/zero");
    // The daemon needs a few hundred MB at most; reading /dev/zero takes all the limit allows.
    let status = std::fs::read_to_string(format!("/proc/{}/status", d.pid().unwrap())).unwrap();
    let peak_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    eprintln!("daemon peak RSS after the /dev/zero links: {peak_kib} KiB");
    assert!(peak_kib < 1 << 20, "the daemon peaked at {peak_kib} KiB: it read /dev/zero");
    assert_eq!(d.stat("requests") - before, cases.len() as u64, "the daemon did not see the links");
    assert_eq!(d.stat("in_flight"), 0);
}

/// A file named with a trailing `/` or `/.` is not the file: the kernel fails
/// it (ENOTDIR) and nvlink says it could not open it, also after the same
/// file was read under its plain name in the same link, through a local
/// daemon and through a remote one (whose shim announces and sends files).
#[test]
fn an_input_named_with_a_trailing_slash_gets_nvlinks_answer_after_its_plain_name() {
    let d = Daemon::start();
    let pki = nvlinkd_tests::remote::Pki::new();
    let (remote, port) = nvlinkd_tests::remote::tls_daemon(&pki, &[]);
    let remote_env = pki.shim_env(&format!("https://127.0.0.1:{port}"), "never");
    let inputs = scratch_inputs("flt-slash");
    for case in [
        "--arch=sm_90 accumulate.o scale.o scale.o/ -o {OUT}/out.cubin",
        "--arch=sm_90 accumulate.o scale.o ./scale.o/. -o {OUT}/out.cubin",
        "--arch=sm_90 scale.o/ accumulate.o scale.o -o {OUT}/out.cubin",
    ] {
        let out = TempDir::new("flt-slash-out");
        let expected = run(&real_nvlink(), &inv(case, inputs.path(), &out), &[]);
        assert_ne!(expected.code, 0, "{case}: nvlink linked it");
        for (how, env) in [("local", d.fallback_env()), ("remote", remote_env.clone())] {
            let actual = run(&shim(), &inv(case, inputs.path(), &out), &env);
            let cmp = compare::runs(&expected, &actual);
            assert!(cmp.problems.is_empty() && cmp.identical, "{case} ({how}): {:?}", cmp.problems);
        }
    }
    assert!(remote.stat("requests") >= 3, "{}", remote.stats());
}

/// A working directory and relative input names that pass PATH_MAX only
/// once joined: nvlink opens them relative to its directory and links; a
/// remote daemon, which asks the shim for absolute names (that the shim
/// cannot open), does not take them for absent (it answered "Could not open
/// input file" from its sandbox) but declines, and the caller's nvlink links.
#[test]
fn inputs_past_path_max_only_when_joined_to_the_cwd_are_not_taken_for_absent() {
    let pki = nvlinkd_tests::remote::Pki::new();
    let (remote, port) = nvlinkd_tests::remote::tls_daemon(&pki, &[]);
    let base = TempDir::new("flt-deep");
    let level = "d".repeat(250);
    let cwd = (0..8).fold(base.path().to_path_buf(), |p, _| p.join(&level));
    std::fs::create_dir_all(&cwd).unwrap();
    let rel = vec!["e".repeat(250); 9].join("/");
    let made = std::process::Command::new("sh")
        .args(["-c", "mkdir -p \"$1\" && cp \"$2/accumulate.o\" \"$2/scale.o\" \"$1/\"", "sh", &rel])
        .arg(corpus::dir())
        .current_dir(&cwd)
        .status()
        .unwrap();
    assert!(made.success());
    assert!(cwd.as_os_str().len() + rel.len() > 4096, "not deep enough");
    let args = [
        "--arch=sm_90".to_string(),
        format!("{rel}/accumulate.o"),
        format!("{rel}/scale.o"),
        "-o".into(),
        "out.cubin".into(),
    ];
    let link = |program: &std::path::Path, env: &[(String, String)]| {
        let _ = std::process::Command::new("rm").args(["-f", "out.cubin"]).current_dir(&cwd).status();
        let o = std::process::Command::new(program)
            .args(&args)
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .current_dir(&cwd)
            .output()
            .unwrap();
        let cubin = std::process::Command::new("cat").arg("out.cubin").current_dir(&cwd).output().unwrap().stdout;
        (o.status.code(), o.stdout, o.stderr, cubin)
    };
    let expected = link(&real_nvlink(), &[]);
    assert_eq!(expected.0, Some(0), "nvlink: {}", String::from_utf8_lossy(&expected.2));
    let actual = link(&shim(), &pki.shim_env(&format!("https://127.0.0.1:{port}"), "auto"));
    assert_eq!(actual, expected, "through the remote daemon: {}", String::from_utf8_lossy(&actual.2));
    assert!(remote.stat("requests") >= 1, "{}", remote.stats());
    // The deep tree goes with its own relative names (its absolute ones are too long).
    let _ = std::process::Command::new("rm").args(["-rf", &level]).current_dir(base.path()).status();
}

#[test]
fn dev_zero_over_the_stream_is_never_read_whole() {
    // Over TCP the shim reads the files for the daemon: it must not read /dev/zero either.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr = format!("127.0.0.1:{port}");
    let d = Daemon::start_with(&["--listen", &addr, "--insecure"]);
    let inputs = scratch_inputs("flt-zero-tcp");
    std::os::unix::fs::symlink("/dev/zero", inputs.path().join("zero.cubin")).unwrap();
    let case = "--arch=sm_90 accumulate.o scale.o zero.cubin -o {OUT}/out.cubin";
    let out = TempDir::new("flt-zero-tcp-out");
    let expected = run(&real_nvlink(), &inv(case, inputs.path(), &out), &[]);
    let mut env = d.fallback_env();
    env.push(("NVLINKD_ADDR".into(), format!("http://{addr}")));
    let invocation = inv(case, inputs.path(), &out);
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = done_tx.send(run_measured(&shim(), &invocation, &env));
    });
    let (actual, peak_kib) = done_rx.recv_timeout(Duration::from_secs(120)).expect("the shim hangs on /dev/zero");
    let cmp = compare::runs(&expected, &actual);
    assert!(cmp.problems.is_empty() && cmp.identical, "{:?}", cmp.problems);
    // The shim (then nvlink in its place) needs a few MB; reading /dev/zero takes
    // whatever the limit allows.
    eprintln!("shim peak RSS on a /dev/zero link over TCP: {peak_kib} KiB");
    assert!(peak_kib < 256 << 10, "the shim peaked at {peak_kib} KiB: it read /dev/zero");
    assert!(d.answers());
}

/// Run `program` like `run` does, under a 2 GiB address-space limit, and return
/// its peak resident memory (KiB) besides.
fn run_measured(program: &Path, inv: &Invocation, extra_env: &[(String, String)]) -> (Run, i64) {
    use std::io::Read;
    use std::os::unix::process::CommandExt;
    let _ = std::fs::remove_dir_all(&inv.out_dir);
    std::fs::create_dir_all(&inv.out_dir).unwrap();
    let mut cmd = std::process::Command::new(program);
    cmd.args(&inv.args).current_dir(&inv.cwd).env_clear();
    for k in ["PATH", "HOME", "TMPDIR"] {
        if let Ok(v) = std::env::var(k) {
            cmd.env(k, v);
        }
    }
    cmd.envs(inv.env.iter().chain(extra_env).map(|(k, v)| (k, v)));
    cmd.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
    // SAFETY: setrlimit is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            let l = libc::rlimit { rlim_cur: 2 << 30, rlim_max: 2 << 30 };
            libc::setrlimit(libc::RLIMIT_AS, &l);
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap();
    let (mut out, mut err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let errs = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err.read_to_end(&mut v);
        v
    });
    let mut stdout = Vec::new();
    let _ = out.read_to_end(&mut stdout);
    let stderr = errs.join().unwrap();
    let mut status = 0;
    // SAFETY: a zeroed rusage is a valid out-parameter.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waiting for our own child, once (std never waits for it: `child` is forgotten).
    let pid = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    assert_eq!(pid, child.id() as i32, "wait4");
    std::mem::forget(child);
    let code = if libc::WIFEXITED(status) { libc::WEXITSTATUS(status) } else { -1 };
    let files = std::fs::read_dir(&inv.out_dir)
        .unwrap()
        .flatten()
        .filter(|e| e.path().is_file())
        .map(|e| (e.file_name().to_string_lossy().into_owned(), std::fs::read(e.path()).unwrap_or_default()))
        .collect();
    (Run { code, stdout, stderr, files }, usage.ru_maxrss)
}

/// Create a FIFO.
fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
}

/// Feeds `data` to every reader of a FIFO (nvlink opens an input twice: once to
/// probe its header, once to read it) until finished.
struct Feeder {
    fifo: PathBuf,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    handle: std::thread::JoinHandle<()>,
}

fn feed(fifo: PathBuf, data: Vec<u8>) -> Feeder {
    use std::sync::atomic::Ordering;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (path, flag) = (fifo.clone(), stop.clone());
    let handle = std::thread::spawn(move || {
        use std::io::Write;
        // Opening for writing blocks until a reader opens.
        while let Ok(mut f) = std::fs::OpenOptions::new().write(true).open(&path) {
            if flag.load(Ordering::SeqCst) {
                return;
            }
            // A reader that closes early (the header probe) breaks the pipe: fine.
            let _ = f.write_all(&data);
        }
    });
    Feeder { fifo, stop, handle }
}

impl Feeder {
    fn finish(self) {
        use std::os::unix::fs::OpenOptionsExt;
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        // Release a writer blocked in open.
        while !self.handle.is_finished() {
            let _ = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(&self.fifo);
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.handle.join();
    }
}

#[test]
fn a_fifo_input_never_blocks_the_daemon() {
    let d = Daemon::start();
    let inputs = scratch_inputs("flt-fifo");
    let fifo = inputs.path().join("piped.o");
    mkfifo(&fifo);
    let data = std::fs::read(corpus::dir().join("accumulate.o")).unwrap();
    let case = "--arch=sm_90 piped.o scale.o -o {OUT}/out.cubin";
    let out = TempDir::new("flt-fifo-out");
    let writer = feed(fifo.clone(), data.clone());
    let expected = run(&real_nvlink(), &inv(case, inputs.path(), &out), &[]);
    writer.finish();

    // No writer yet: nvlink would wait for one. The daemon must not: it hands the
    // link back to the shim, whose nvlink then waits for the writer.
    let before = d.stat("requests");
    let invocation = inv(case, inputs.path(), &out);
    let env = d.fallback_env();
    let handle = std::thread::spawn(move || run(&shim(), &invocation, &env));
    let answered = eventually(Duration::from_secs(30), || d.stat("requests") > before && d.stat("in_flight") == 0);
    let writer = feed(fifo.clone(), data);
    assert!(answered, "a FIFO input blocks a link in the daemon");
    let actual = handle.join().unwrap();
    writer.finish();
    let cmp = compare::runs(&expected, &actual);
    assert!(cmp.problems.is_empty() && cmp.identical, "{:?}", cmp.problems);
}

#[test]
fn a_socket_in_a_shared_sticky_directory_leaves_it_alone() {
    let shared = TempDir::new("flt-sticky");
    std::fs::set_permissions(shared.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    let socket = shared.path().join("nvlinkd.sock");
    let mut child = std::process::Command::new(nvlinkd())
        .args(["serve", "--socket"])
        .arg(&socket)
        .arg("--cache-dir")
        .arg(shared.path().join("cache"))
        .arg("--cuda-home")
        .arg(cuda_home())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let up = eventually(Duration::from_secs(30), || {
        std::process::Command::new(nvlinkd())
            .arg("status")
            .arg("--socket")
            .arg(&socket)
            .output()
            .is_ok_and(|o| o.status.success())
    });
    let mode = std::fs::metadata(shared.path()).unwrap().permissions().mode() & 0o7777;
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let _ = child.wait();
    assert!(up, "the daemon did not serve on a socket in a sticky directory");
    assert_eq!(mode, 0o1777, "the shared directory's mode was changed to {mode:o}");
    assert_eq!(std::fs::metadata(&socket).ok().map(|_| ()), None, "socket left behind");
}

/// `nvlinkd start --socket <socket>`: (success, stderr).
fn start_on(socket: &Path, cache: &Path) -> (bool, String) {
    let out = std::process::Command::new(nvlinkd())
        .args(["start", "--socket"])
        .arg(socket)
        .arg("--cache-dir")
        .arg(cache)
        .arg("--cuda-home")
        .arg(cuda_home())
        .output()
        .unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn stop_on(socket: &Path) {
    let _ = std::process::Command::new(nvlinkd()).arg("stop").arg("--socket").arg(socket).output();
}

#[test]
fn socket_directories_are_made_private_and_existing_ones_left_alone() {
    let base = TempDir::new("flt-dirs");
    // Missing: created 0700.
    let made = base.path().join("a/b");
    let (ok, err) = start_on(&made.join("s"), &base.path().join("c1"));
    let made_mode = std::fs::metadata(&made).map(|m| m.permissions().mode() & 0o777).ok();
    stop_on(&made.join("s"));
    assert!(ok, "{err}");
    assert_eq!(made_mode, Some(0o700));
    // Existing and ours (0755, e.g. a project directory): served in, mode kept.
    let mine = base.path().join("mine");
    std::fs::create_dir(&mine).unwrap();
    std::fs::set_permissions(&mine, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (ok, err) = start_on(&mine.join("s"), &base.path().join("c2"));
    stop_on(&mine.join("s"));
    assert!(ok, "{err}");
    let mode = std::fs::metadata(&mine).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o755, "the existing socket directory's mode was changed to {mode:o}");
}

#[test]
fn a_socket_directory_of_another_user_is_refused() {
    let base = TempDir::new("flt-other");
    let theirs = base.path().join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o777)).unwrap();
    let c = std::ffi::CString::new(theirs.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    if unsafe { libc::chown(c.as_ptr(), 54321, 54321) } != 0 {
        eprintln!("skipped: cannot give a directory to another user here (not root)");
        return;
    }
    let socket = theirs.join("s");
    let (ok, err) = start_on(&socket, &base.path().join("c"));
    if ok {
        stop_on(&socket);
    }
    assert!(!ok, "the daemon served in a directory another user controls");
    let mode = std::fs::metadata(&theirs).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o777, "another user's directory was changed");
    assert!(err.contains("54321") && err.contains(&theirs.display().to_string()), "unclear message: {err}");
}

#[test]
fn a_regular_file_at_the_socket_path_is_never_deleted() {
    let dir = TempDir::new("flt-file");
    let socket = dir.path().join("precious");
    std::fs::write(&socket, b"someone's data\n").unwrap();
    let mut child = std::process::Command::new(nvlinkd())
        .args(["serve", "--socket"])
        .arg(&socket)
        .arg("--cache-dir")
        .arg(dir.path().join("cache"))
        .arg("--cuda-home")
        .arg(cuda_home())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let exited = eventually(Duration::from_secs(30), || matches!(child.try_wait(), Ok(Some(_))));
    if !exited {
        let _ = child.kill();
    }
    let out = child.wait_with_output().unwrap();
    assert_eq!(std::fs::read(&socket).ok().as_deref(), Some(&b"someone's data\n"[..]), "the file was replaced");
    assert!(exited && !out.status.success(), "the daemon served over a regular file");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not a socket") && err.contains("precious"), "unclear message: {err}");
}

#[test]
fn a_planted_symlink_at_the_temporary_output_is_not_followed() {
    let d = Daemon::start();
    let victim_dir = TempDir::new("flt-victim");
    let victim = victim_dir.path().join("victim");
    std::fs::write(&victim, b"not yours\n").unwrap();
    let out = TempDir::new("flt-plant");
    let expected = run(&real_nvlink(), &inv(LINK, corpus::dir(), &out), &[]);
    // The shell plants the symlinks under its own pid, which `exec` hands to the
    // shim: every temporary name the shim may try first.
    let plant = format!(
        "for n in .out.cubin.nvlinkd-$$.tmp .out.cubin.nvlinkd-$$-0.tmp; do ln -s {} {}/$n; done; exec \"$0\" \"$@\"",
        victim.display(),
        out.path().display()
    );
    let invocation = inv(LINK, corpus::dir(), &out);
    let wrapped = Invocation {
        args: ["-c".to_string(), plant, shim().display().to_string()]
            .into_iter()
            .chain(invocation.args.clone())
            .collect(),
        ..invocation
    };
    let mut actual = run(Path::new("/bin/sh"), &wrapped, &d.shim_env());
    let victim_now = std::fs::read(&victim).unwrap();
    assert!(victim_now == b"not yours\n", "the shim wrote {} bytes through a planted symlink", victim_now.len());
    let planted: Vec<String> = actual.files.keys().filter(|k| k.starts_with(".out.cubin.nvlinkd-")).cloned().collect();
    for k in &planted {
        actual.files.remove(k);
    }
    assert!(!std::fs::symlink_metadata(out.path().join("out.cubin")).unwrap().file_type().is_symlink());
    let cmp = compare::runs(&expected, &actual);
    assert!(cmp.problems.is_empty() && cmp.identical, "{:?}", cmp.problems);
}

#[test]
fn an_auto_started_daemon_exits_when_idle() {
    let dir = TempDir::new("flt-idle");
    let sock = dir.path().join("s");
    let out = TempDir::new("flt-idle-out");
    let mut env = nvlinkd_tests::env::auto_start_env(&sock, &dir.path().join("cache"));
    env.push(("NVLINKD_IDLE_EXIT".into(), "1s".into()));
    let expected = run(&real_nvlink(), &inv(LINK, corpus::dir(), &out), &[]);
    let actual = run(&shim(), &inv(LINK, corpus::dir(), &out), &env);
    let cmp = compare::runs(&expected, &actual);
    assert!(cmp.problems.is_empty() && cmp.identical, "{:?}", cmp.problems);
    // The daemon logs its pid when it starts serving (it may be gone already).
    let log = std::fs::read_to_string(dir.path().join("cache/nvlinkd.log")).unwrap_or_default();
    let pid: u32 = log
        .lines()
        .find(|l| l.contains("nvlinkd serving"))
        .and_then(|l| l.split("pid=").nth(1))
        .and_then(|s| s.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no daemon was started: {log}"));
    let exited = eventually(Duration::from_secs(30), || !alive(pid) || is_zombie(pid));
    if !exited {
        let _ = std::process::Command::new(nvlinkd()).arg("stop").arg("--socket").arg(&sock).output();
    }
    assert!(exited, "the auto-started daemon is still running");
    assert!(std::fs::symlink_metadata(&sock).is_err(), "socket left behind");
}

/// Exited but not reaped (its parent, `nvlinkd start`, is gone: init reaps it).
fn is_zombie(pid: u32) -> bool {
    proc_stat_field(pid, 3).is_some_and(|state| state.starts_with('Z'))
}

/// A link whose shim goes away while nvJitLink computes it: the closed stream
/// cancels the link, which kills the worker process serving it at once (the
/// worker test hook holds it inside the link, so nothing else would end it
/// before the hook's own 60 s give-up), and the link is freed.
#[test]
fn a_closed_stream_kills_the_worker_computing_its_link() {
    use std::os::unix::fs::MetadataExt;
    let work = TempDir::new("cancel-hold");
    let hold = work.path().join("hold");
    std::fs::write(&hold, b"").unwrap();
    let d = Daemon::start_env(&[], &[("NVLINKD_TEST_WORKER_HOLD", &hold.display().to_string())]);
    let rt = runtime();
    let socket = d.socket();
    let held = rt.block_on(async {
        let mut client = NvlinkdClient::new(connect(&socket).await);
        let cwd = corpus::dir().clone();
        let meta = std::fs::metadata(&cwd).unwrap();
        let out = work.path().join("out.cubin");
        let start = Start {
            args: ["--arch=sm_90", "accumulate.o", "scale.o", "-o", &out.display().to_string()]
                .map(String::from)
                .to_vec(),
            cwd: cwd.display().to_string(),
            env: Default::default(),
            toolkit_release: String::new(),
            // The daemon's own view of the directory: it reads the files itself.
            cwd_dev: meta.dev(),
            cwd_ino: meta.ino(),
            ..Default::default()
        };
        let (tx, rx) = mpsc::channel::<ClientMessage>(8);
        tx.send(ClientMessage { msg: Some(client_message::Msg::Start(start)) }).await.unwrap();
        let inbound = client.link(tokio_stream::wrappers::ReceiverStream::new(rx)).await.unwrap().into_inner();
        (client, tx, inbound)
    });
    // The worker holding the link marks `<hold>.<pid>`.
    let prefix = "hold.";
    let mut pid = None;
    assert!(
        eventually(Duration::from_secs(60), || {
            pid = std::fs::read_dir(work.path())
                .unwrap()
                .flatten()
                .find_map(|e| e.file_name().to_string_lossy().strip_prefix(prefix).and_then(|p| p.parse::<u32>().ok()));
            pid.is_some()
        }),
        "no worker took the link"
    );
    let pid = pid.unwrap();
    assert_eq!(d.stat("in_flight"), 1);
    // The shim goes away.
    drop(held);
    drop(rt);
    assert!(
        eventually(Duration::from_secs(10), || !alive(pid) || is_zombie(pid)),
        "the worker computing an abandoned link is still running"
    );
    assert!(eventually(Duration::from_secs(10), || d.stat("in_flight") == 0), "the abandoned link is still in flight");
    assert_eq!(d.stat("in_process"), 0, "the abandoned link was counted as linked");
    std::fs::remove_file(&hold).unwrap();
    // A later link gets a fresh worker and nvlink's bytes.
    normal_link_works(&d);
    assert!(d.answers());
}

/// What is at `path` after a link wrote `-o path`: its kind, and the bytes
/// a regular file (or a symlink's target) holds.
fn output_state(path: &Path) -> (String, Option<Vec<u8>>) {
    use std::os::unix::fs::FileTypeExt;
    let kind = match std::fs::symlink_metadata(path).map(|m| m.file_type()) {
        Ok(t) if t.is_symlink() => format!("symlink to {}", std::fs::read_link(path).unwrap().display()),
        Ok(t) if t.is_char_device() => "character device".into(),
        Ok(t) if t.is_file() => "file".into(),
        Ok(_) => "other".into(),
        Err(_) => "absent".into(),
    };
    let bytes = std::fs::metadata(path).ok().filter(|m| m.is_file()).map(|_| std::fs::read(path).unwrap());
    (kind, bytes)
}

/// nvlink opens its outputs with `fopen(path, "w")`: it writes through a
/// symlink (the link stays), and into a device (`-o /dev/null` never replaces
/// the device; `/dev/full` fails the write). The shim must do the same, not
/// rename a new file over whatever is there. The devices are private nodes
/// (mknod) in a temporary directory, never the machine's own.
#[test]
fn outputs_are_written_where_nvlink_writes_them() {
    let d = Daemon::start();
    // (case, set up the directory, output name)
    type Setup = fn(&Path) -> bool;
    fn mknod(dir: &Path, minor: &str) -> bool {
        let ok = std::process::Command::new("mknod")
            .arg(dir.join("dev"))
            .args(["c", "1", minor])
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            eprintln!("SKIP: cannot mknod a character device here");
        }
        ok
    }
    let cases: &[(&str, Setup)] = &[
        ("symlink", |dir| {
            std::fs::write(dir.join("target"), b"old").unwrap();
            std::os::unix::fs::symlink("target", dir.join("out")).unwrap();
            true
        }),
        // Written in place by nvlink: the other name sees the new bytes.
        ("hard link", |dir| {
            std::fs::write(dir.join("target"), b"old").unwrap();
            std::fs::hard_link(dir.join("target"), dir.join("out")).unwrap();
            true
        }),
        ("dangling symlink", |dir| {
            std::os::unix::fs::symlink("created", dir.join("out")).unwrap();
            true
        }),
        ("null device", |dir| {
            let made = mknod(dir, "3");
            made && std::os::unix::fs::symlink("dev", dir.join("out")).is_ok()
        }),
        ("full device", |dir| mknod(dir, "7") && std::fs::rename(dir.join("dev"), dir.join("out")).is_ok()),
    ];
    for &(case, setup) in cases {
        let mut states = Vec::new();
        let mut runs = Vec::new();
        for (program, env) in [(real_nvlink(), Vec::new()), (shim(), d.shim_env())] {
            let dir = TempDir::new("flt-outs");
            if !setup(dir.path()) {
                return;
            }
            let out = TempDir::new("flt-outs-run");
            let link = format!("--arch=sm_90 accumulate.o scale.o -o {}", dir.path().join("out").display());
            runs.push(run(&program, &inv(&link, corpus::dir(), &out), &env));
            states.push(["out", "target", "created", "dev"].map(|name| output_state(&dir.path().join(name))).to_vec());
        }
        let (expected, actual) = (&runs[0], &runs[1]);
        assert_eq!(
            (expected.code, &expected.stderr),
            (actual.code, &actual.stderr),
            "{case}: {}",
            String::from_utf8_lossy(&actual.stderr)
        );
        // The same kinds of files at the same names (bytes compared separately:
        // the link's own outputs may differ only as the parity test allows).
        let kinds =
            |s: &[(String, Option<Vec<u8>>)]| s.iter().map(|(k, b)| (k.clone(), b.is_some())).collect::<Vec<_>>();
        assert_eq!(kinds(&states[0]), kinds(&states[1]), "{case}: nvlink's files vs the shim's");
        for ((_, a), (_, b)) in states[0].iter().zip(&states[1]) {
            if let (Some(a), Some(b)) = (a, b) {
                let verdict = compare::file(a, b);
                assert!(!matches!(verdict, compare::Verdict::Differ(_)), "{case}: {verdict:?}");
            }
        }
    }
}

/// A shim whose /tmp is private (another mount namespace, as systemd's
/// PrivateTmp and Bazel's sandbox give; nvcc's inputs live there) links
/// through the local daemon with nvlink's answer: under the same cwd the
/// daemon sees other files, so the shim serves them. (The daemon read its
/// own /tmp and answered "Could not open input file".)
#[test]
fn a_shim_with_a_private_tmp_gets_nvlinks_answer() {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: a mount namespace needs root");
        return;
    }
    let d = Daemon::start();
    let work = TempDir::new("ptmp");
    let private = work.path().join("private");
    let (real_out, shim_out) = (work.path().join("r"), work.path().join("n"));
    for dir in [&private, &real_out, &shim_out] {
        std::fs::create_dir(dir).unwrap();
    }
    // In a namespace of its own, a tmpfs over `private` with the inputs in
    // it; nvlink and the shim link them from there.
    let script = r#"mount -t tmpfs none "$1" && cp "$2/accumulate.o" "$2/scale.o" "$1/" || exit 99
        "$3" --arch=sm_90 "$1/accumulate.o" "$1/scale.o" -o "$5/out.cubin" || exit 98
        exec "$4" --arch=sm_90 "$1/accumulate.o" "$1/scale.o" -o "$6/out.cubin""#;
    let mut env = d.shim_env();
    env.push(("NVLINKD_FALLBACK".into(), "never".into()));
    let out = std::process::Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", script, "sh"])
        .args([&private, corpus::dir(), &real_nvlink(), &shim(), &real_out, &shim_out])
        .current_dir(work.path())
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.code() == Some(99) || stderr.starts_with("unshare:") {
        eprintln!("skipped: no private mount namespace here: {stderr}");
        return;
    }
    assert!(out.status.success(), "{out:?}");
    let expected = std::fs::read(real_out.join("out.cubin")).unwrap();
    let actual = std::fs::read(shim_out.join("out.cubin")).unwrap();
    let verdict = compare::file(&expected, &actual);
    assert!(!matches!(verdict, compare::Verdict::Differ(_)), "{verdict:?}");
    assert_eq!((d.stat("requests"), d.stat("fallbacks")), (1, 0), "{}", d.stats());
}

/// An output directory that is a symlink swapped between two directories
/// while staged links write through it (as a deploy script's `current`
/// link is): the daemon stages in the directory the link named then, and the
/// shim renames there or, if the link moved meanwhile, copies the staged bytes
/// to where the output path leads now. Every link succeeds with nvlink's
/// bytes; no temporary file and no empty output is left behind.
#[test]
fn a_directory_symlink_swapped_during_staged_links_costs_nothing() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let src = TempDir::new("swap-src");
    corpus::big_array_object(src.path(), 256 * 1024, false);
    let d = Daemon::start();
    let dirs = TempDir::new("swap-dirs");
    let (a, b, lnk) = (dirs.path().join("rA"), dirs.path().join("rB"), dirs.path().join("lnk"));
    std::fs::create_dir(&a).unwrap();
    std::fs::create_dir(&b).unwrap();
    std::os::unix::fs::symlink("rA", &lnk).unwrap();
    let link = |program: &Path, env: &[(String, String)], out: &Path| {
        let mut cmd = std::process::Command::new(program);
        cmd.args(["--arch=sm_90", "big.o", "-o"]).arg(out).current_dir(src.path()).env_clear();
        cmd.env("PATH", std::env::var("PATH").unwrap_or_default());
        cmd.envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str()))).output().expect("run a link")
    };
    let o = link(&real_nvlink(), &[], &dirs.path().join("expected"));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let expected = std::fs::read(dirs.path().join("expected")).unwrap();
    let staged_before = d.stat("outputs_staged");
    let links = 30;
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            let tmp = dirs.path().join("lnk.new");
            for k in 0.. {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let _ = std::fs::remove_file(&tmp);
                std::os::unix::fs::symlink(if k % 2 == 0 { "rB" } else { "rA" }, &tmp).unwrap();
                std::fs::rename(&tmp, &lnk).unwrap();
            }
        });
        // Stopped however the loop ends (a failed link must not hang the test).
        struct Stop<'a>(&'a AtomicBool);
        impl Drop for Stop<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Relaxed);
            }
        }
        let _stop = Stop(&stop);
        for i in 0..links {
            let o = link(&shim(), &d.shim_env(), &lnk.join(format!("out{i}")));
            assert!(o.status.success(), "link {i}: {}", String::from_utf8_lossy(&o.stderr));
        }
    });
    let mut found = 0;
    for dir in [&a, &b] {
        for e in std::fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            let name = e.file_name().to_string_lossy().into_owned();
            assert!(name.starts_with("out"), "left behind: {}", e.path().display());
            let bytes = std::fs::read(e.path()).unwrap();
            let verdict = compare::file(&expected, &bytes);
            assert!(!matches!(verdict, compare::Verdict::Differ(_)), "{name}: {verdict:?}");
            found += 1;
        }
    }
    assert_eq!(found, links, "every link's output, once");
    assert_eq!(d.stat("outputs_staged"), staged_before + links as u64, "the outputs were not staged");
}

/// A local link's large output is written by the daemon beside the output and
/// renamed into place by the shim (`server/src/link/staging.rs`), and must end as
/// nvlink's file: its bytes, under umask 027 its mode for a new file (0640),
/// an existing file's own mode (nvlink truncates in place), through a symlink
/// (which stays), no other file in the directory, and in place in a
/// directory that takes no new file. A client that takes a
/// staged output and vanishes leaves no temporary file either: the daemon
/// removes it when the stream ends.
#[test]
fn staged_outputs_are_nvlinks_files_and_never_left_behind() {
    use std::os::unix::fs::MetadataExt;
    let src = TempDir::new("stg-src");
    // 256 KiB of device data: the cubin is past staging's 64 KiB threshold.
    corpus::big_array_object(src.path(), 256 * 1024, false);
    let d = Daemon::start();
    let link = |program: &Path, env: &[(String, String)], out: &Path| {
        let mut cmd = std::process::Command::new("/bin/sh");
        cmd.arg("-c").arg("umask 027; exec \"$0\" \"$@\"").arg(program).args(["--arch=sm_90", "big.o", "-o"]);
        cmd.arg(out).current_dir(src.path()).env_clear().env("PATH", std::env::var("PATH").unwrap_or_default());
        cmd.envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str()))).output().expect("run a link")
    };
    type Setup = fn(&Path);
    let cases: &[(&str, Setup)] = &[
        ("new file", |_| {}),
        ("existing file of mode 0600", |dir| {
            std::fs::write(dir.join("out"), b"old").unwrap();
            std::fs::set_permissions(dir.join("out"), std::fs::Permissions::from_mode(0o600)).unwrap();
        }),
        ("symlink to an existing file", |dir| {
            std::fs::write(dir.join("target"), b"old").unwrap();
            std::fs::set_permissions(dir.join("target"), std::fs::Permissions::from_mode(0o604)).unwrap();
            std::os::unix::fs::symlink("target", dir.join("out")).unwrap();
        }),
    ];
    let staged_before = d.stat("outputs_staged");
    for &(case, setup) in cases {
        let mut seen = Vec::new();
        for (program, env) in [(real_nvlink(), Vec::new()), (shim(), d.shim_env())] {
            let dir = TempDir::new("stg-out");
            setup(dir.path());
            let o = link(&program, &env, &dir.path().join("out"));
            let mut names: Vec<String> = std::fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into())
                .collect();
            names.sort();
            let mode = std::fs::metadata(dir.path().join("out")).map(|m| m.mode() & 0o7777).unwrap_or(0);
            seen.push((o.status.code(), o.stderr, names, output_state(&dir.path().join("out")), mode));
        }
        let (expected, actual) = (&seen[0], &seen[1]);
        assert_eq!(expected.0, Some(0), "{case}: nvlink: {}", String::from_utf8_lossy(&expected.1));
        assert_eq!((expected.0, &expected.1), (actual.0, &actual.1), "{case}: {}", String::from_utf8_lossy(&actual.1));
        assert_eq!(expected.2, actual.2, "{case}: the files in the directory");
        assert_eq!(expected.3 .0, actual.3 .0, "{case}: what the output path is");
        let verdict = compare::file(expected.3 .1.as_deref().unwrap(), actual.3 .1.as_deref().unwrap_or_default());
        assert!(!matches!(verdict, compare::Verdict::Differ(_)), "{case}: {verdict:?}");
        assert_eq!(format!("{:o}", expected.4), format!("{:o}", actual.4), "{case}: the output's mode");
    }
    assert_eq!(d.stat("outputs_staged"), staged_before + cases.len() as u64, "every shim link staged its output");

    // A directory that takes no new file (immutable, which binds root too)
    // with a writable output in it: nvlink writes the file in place, so must
    // the shim (nothing can be staged or renamed there).
    let mut seen = Vec::new();
    for (program, env) in [(real_nvlink(), Vec::new()), (shim(), d.shim_env())] {
        let dir = TempDir::new("stg-imm");
        std::fs::write(dir.path().join("out"), b"old").unwrap();
        let chattr = |flag: &str| std::process::Command::new("chattr").arg(flag).arg(dir.path()).status();
        if !chattr("+i").is_ok_and(|s| s.success()) {
            eprintln!("SKIP: chattr +i is refused here (an immutable directory)");
            break;
        }
        let o = link(&program, &env, &dir.path().join("out"));
        let _ = chattr("-i");
        seen.push((o.status.code(), o.stderr, std::fs::read(dir.path().join("out")).unwrap()));
    }
    if let [expected, actual] = &seen[..] {
        assert_eq!(expected.0, Some(0), "immutable directory: nvlink: {}", String::from_utf8_lossy(&expected.1));
        assert_eq!((expected.0, &expected.1), (actual.0, &actual.1), "immutable directory");
        let verdict = compare::file(&expected.2, &actual.2);
        assert!(!matches!(verdict, compare::Verdict::Differ(_)), "immutable directory: {verdict:?}");
    }

    // A client that takes the staged output and goes away.
    let out = TempDir::new("stg-vanish");
    let target = out.path().join("out.cubin");
    let cwd_meta = std::fs::metadata(src.path()).unwrap();
    let staged = runtime().block_on(async {
        let mut client = NvlinkdClient::new(connect(&d.socket()).await);
        let start = Start {
            args: ["--arch=sm_90", "big.o", "-o", &target.display().to_string()].map(String::from).to_vec(),
            cwd: src.path().display().to_string(),
            cwd_dev: cwd_meta.dev(),
            cwd_ino: cwd_meta.ino(),
            accepts_staged: true,
            ..Default::default()
        };
        let (tx, rx) = mpsc::channel::<ClientMessage>(8);
        tx.send(ClientMessage { msg: Some(client_message::Msg::Start(start)) }).await.unwrap();
        let mut inbound = client.link(tokio_stream::wrappers::ReceiverStream::new(rx)).await.unwrap().into_inner();
        loop {
            match inbound.message().await {
                Ok(Some(ServerMessage { msg: Some(server_message::Msg::Output(f)) })) if !f.staged.is_empty() => {
                    let staged = PathBuf::from(f.staged);
                    assert!(staged.is_file(), "the staged file is not there");
                    break staged;
                }
                Ok(Some(_)) => continue,
                other => panic!("no staged output: {other:?}"),
            }
        }
    });
    assert_eq!(staged.parent(), Some(out.path()), "staged beside the output");
    assert!(eventually(Duration::from_secs(20), || !staged.exists()), "{} left behind", staged.display());
    assert!(!target.exists(), "the output was written without the shim");
}

/// Options files are split as nvlink splits them: `"` groups (also inside a
/// word), `'` is an ordinary character, a vertical tab or a form feed
/// separates nothing; a backslash anywhere is left to nvlink. Each word names an input file that exists
/// under the name nvlink reads (or not): the answer is nvlink's, the
/// daemon's own for the splitting measured (`fallbacks` counts the others).
#[test]
fn options_files_are_split_as_nvlink_splits_them() {
    let d = Daemon::start_with(&["--verify=off"]);
    let dir = TempDir::new("flt-words");
    for f in ["accumulate.o", "scale.o"] {
        std::fs::copy(corpus::dir().join(f), dir.path().join(f)).unwrap();
    }
    for name in ["s c.o", "sc.o", "s'c.o", "s\u{b}c.o", "s\u{c}c.o", "s\"c.o", "ab.o", "s"] {
        std::fs::copy(corpus::dir().join("scale.o"), dir.path().join(name)).unwrap();
    }
    // With nvlink's fallback: quoting whose splitting is not measured (`\"`,
    // a NUL, a quote left open) is left to nvlink, and the answer is its.
    let mut env = d.shim_env();
    env.push(("NVLINKD_FALLBACK".into(), "auto".into()));
    let words = [
        "\"s c.o\"",
        "s\\ c.o",
        "s\\c.o",
        "'s c.o'",
        "s'c.o",
        "s\u{b}c.o",
        "s\u{c}c.o",
        "\\ s",
        "\"s\\\"c.o\"",
        "s\"c\".o",
        "s\\\\c.o",
        "a\\\"b.o",
        "s\u{0}c.o",
        "\"s c.o\\\"",
    ];
    let texts = words
        .iter()
        .map(|word| format!("--arch=sm_90 accumulate.o {word} -o {{OUT}}/out.cubin\n"))
        // A backslash that ends the file (nvlink: "Stray ' ' character").
        .chain(["--arch=sm_90 accumulate.o scale.o -o {OUT}/out.cubin\\".to_owned()]);
    for (word, text) in words.iter().chain(&["a backslash last"]).zip(texts) {
        std::fs::write(dir.path().join("o.opts"), text).unwrap();
        let out = TempDir::new("flt-words-out");
        let text = std::fs::read_to_string(dir.path().join("o.opts"))
            .unwrap()
            .replace("{OUT}", &out.path().display().to_string());
        std::fs::write(dir.path().join("o.opts"), text).unwrap();
        let link = Invocation::templated("-optf o.opts", dir.path(), &out);
        let expected = run(&real_nvlink(), &link, &[]);
        let actual = run(&shim(), &link, &env);
        let cmp = compare::runs(&expected, &actual);
        assert!(cmp.problems.is_empty() && cmp.identical, "{word:?}: {:?}", cmp.problems);
    }
}

/// Options nvlink reads in its own way get its answer, never the daemon's
/// guess: numeric values it takes although they are odd (empty, `0x10`,
/// negative) or refuses (past 32 bits, past its bound), `-split-compile` for
/// PTX compiled at link time (its embedded ptxas takes it), `-force-whole-lto`
/// where nvlink reports a conflict, `-tool-name` (its messages carry that
/// name), `-Ofc=mid` under `-dlto` (its NVVM prints an info), and `-o .` in
/// an options file (the message names it as the file wrote it).
#[test]
fn options_nvlink_reads_its_own_way_get_nvlinks_answer() {
    let d = Daemon::start_with(&["--verify=off"]);
    let mut env = d.shim_env();
    env.push(("NVLINKD_FALLBACK".into(), "auto".into()));
    let base = "--arch=sm_90 accumulate.o scale.o -o {OUT}/out.cubin";
    let lto = "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} accumulate_lto.o scale_lto.o -lcudadevrt -o {OUT}/out.cubin";
    let mut cases: Vec<String> = [
        "-maxrregcount=",
        "-maxrregcount=0x10",
        "-maxrregcount=-1",
        "-maxrregcount=1000",
        "-maxrregcount=4294967296",
        "-split-compile=",
        "-split-compile-extended=99999999999",
        "-syscall-const-offset=",
        "-m=",
        "-m=0x40",
        "-m=+64",
        "-m=0100",
        "-m=4294967360",
        "-m=18446744073709551680",
        "-maxrregcount=99999999999999999999",
        "-force-whole-lto",
        "-tool-name=x missing.o",
        "-Xptxas -o=ptxas-out.cubin",
        "-tool-name=x --no-such-option",
    ]
    .iter()
    .map(|o| format!("{base} {o}"))
    .collect();
    cases.extend([
        "--arch=sm_90 saxpy_ptx.o -o {OUT}/out.cubin -split-compile=2".to_owned(),
        "--arch=sm_90 saxpy_ptx.o -o {OUT}/out.cubin -split-compile=1".to_owned(),
        format!("{lto} -force-whole-lto -r"),
        format!("{lto} -Ofc=mid"),
    ]);
    for args in &cases {
        let out = TempDir::new("flt-optvals");
        let link = Invocation::templated(args, corpus::dir(), &out);
        let expected = run(&real_nvlink(), &link, &[]);
        let actual = run(&shim(), &link, &env);
        let cmp = compare::runs(&expected, &actual);
        assert!(cmp.problems.is_empty() && cmp.identical, "{args}: {:?}", cmp.problems);
    }
    // `-o .` from an options file.
    let dir = TempDir::new("flt-optdot");
    for f in ["accumulate.o", "scale.o"] {
        std::fs::copy(corpus::dir().join(f), dir.path().join(f)).unwrap();
    }
    std::fs::write(dir.path().join("o.opts"), "--arch=sm_90 accumulate.o scale.o -o .\n").unwrap();
    let out = TempDir::new("flt-optdot-out");
    let link = Invocation::templated("-optf o.opts", dir.path(), &out);
    let cmp = compare::runs(&run(&real_nvlink(), &link, &[]), &run(&shim(), &link, &env));
    assert!(cmp.problems.is_empty(), "-o . in an options file: {:?}", cmp.problems);
}
