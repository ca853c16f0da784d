//! The worker pool and the nvlink engine on their own: cancelling a link or
//! passing its time limit kills the process serving it at once; a worker gives
//! the library's own answer.
//!
//! The workers test sets the worker test hook in this binary's environment,
//! which the workers inherit (the other test here starts no worker).

use std::path::Path;
use std::time::{Duration, Instant};

use nvlinkd_core::confine::Policy;
use nvlinkd_core::jitlink::{InputType, JitInput};
use nvlinkd_core::toolkit::Toolkit;
use nvlinkd_core::worker::{Cancel, PoolConfig, WorkerError, WorkerPool, HOLD_ENV};
use nvlinkd_tests::corpus;
use nvlinkd_tests::env::{cuda_home, nvlinkd, TempDir};

fn held_pid(hold: &Path) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(60);
    let prefix = format!("{}.", hold.file_name().unwrap().to_string_lossy());
    loop {
        let found = std::fs::read_dir(hold.parent().unwrap())
            .unwrap()
            .flatten()
            .find_map(|e| e.file_name().to_string_lossy().strip_prefix(&prefix).and_then(|p| p.parse().ok()));
        if let Some(pid) = found {
            // A killed worker leaves its mark behind.
            let _ = std::fs::remove_file(format!("{}.{pid}", hold.display()));
            return pid;
        }
        assert!(Instant::now() < deadline, "no worker took the request");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A process that is gone (reaped: no /proc entry at all).
fn gone(pid: i32) -> bool {
    !Path::new(&format!("/proc/{pid}")).exists()
}

#[test]
fn cancel_and_time_limit_kill_the_worker_at_once() {
    let dir = TempDir::new("cancel");
    let hold = dir.path().join("hold");
    std::env::set_var(HOLD_ENV, &hold);
    let tk = Toolkit::open(cuda_home()).expect("toolkit");
    let lib = tk.jitlink_spec();
    let cubin = std::fs::read(corpus::dir().join("scale.cubin")).expect("scale.cubin");
    let inputs = [JitInput { kind: InputType::Cubin, data: &cubin, name: "scale.cubin" }];
    let opts = vec!["-arch=sm_90".to_string()];
    let config = |timeout| PoolConfig { exe: nvlinkd(), max: 1, mem_limit: 0, timeout, confine: Policy::default() };

    // Cancel while the worker holds the request.
    let pool = WorkerPool::new(config(Duration::from_secs(600)));
    std::fs::write(&hold, b"").unwrap();
    let cancel = Cancel::new();
    std::thread::scope(|s| {
        let h = s.spawn(|| pool.link(&lib, &opts, &inputs, false, &cancel));
        let pid = held_pid(&hold);
        cancel.cancel();
        let r = h.join().unwrap();
        assert!(matches!(r, Err(WorkerError::Cancelled)), "{r:?}");
        assert!(gone(pid), "worker {pid} still exists after cancel");
    });
    assert_eq!(pool.live(), 0);
    assert_eq!(pool.crashes.load(std::sync::atomic::Ordering::Relaxed), 0, "a cancel is not a crash");
    // A cancelled link starts no more work.
    std::fs::remove_file(&hold).unwrap();
    assert!(matches!(pool.link(&lib, &opts, &inputs, false, &cancel), Err(WorkerError::Cancelled)));
    assert_eq!(pool.live(), 0);

    // A fresh worker answers as the library does in this process.
    let by_worker = pool.link(&lib, &opts, &inputs, false, &Cancel::new()).expect("link in a worker");
    let direct = tk.jitlink().expect("load nvJitLink").link(&opts, &inputs, false).expect("link in process");
    assert!(by_worker.cubin.is_some());
    assert_eq!(by_worker.cubin, direct.cubin, "a worker's cubin differs from the library's");
    assert_eq!(by_worker.info_log, direct.info_log);
    assert_eq!(pool.live(), 1, "the worker is kept warm");

    // The time limit kills a request that outlives it.
    let pool = WorkerPool::new(config(Duration::from_millis(300)));
    std::fs::write(&hold, b"").unwrap();
    std::thread::scope(|s| {
        let h = s.spawn(|| pool.link(&lib, &opts, &inputs, false, &Cancel::new()));
        let pid = held_pid(&hold);
        let r = h.join().unwrap();
        assert!(matches!(r, Err(WorkerError::TimedOut(_))), "{r:?}");
        assert!(gone(pid), "worker {pid} still exists after its time limit");
    });
    std::fs::remove_file(&hold).unwrap();
    assert_eq!(pool.live(), 0);
}

/// The real nvlink as engine is under the same control: a cancelled link does
/// not start it, and one past its time limit is killed (it then ends by a
/// signal, which the linker never takes for a result).
#[test]
fn nvlink_engine_runs_are_cancellable_and_time_limited() {
    use nvlinkd_core::cli::{parse::parse, spec::Spec};
    use nvlinkd_core::engine::process;
    use nvlinkd_core::fs::LocalFs;
    use nvlinkd_core::request::Request;

    let out = TempDir::new("engine");
    let args: Vec<String> = ["--arch=sm_90", "accumulate.o", "scale.o", "-o", "out.cubin"].map(String::from).to_vec();
    let cwd = corpus::dir().clone();
    let spec = Spec::from_parsed(parse(&args, &LocalFs, &cwd).expect("parse"), &cwd, None).expect("spec");
    let req = Request::local(args, cwd);
    let nvlink = cuda_home().join("bin/nvlink");

    let scratch = [out.path().to_path_buf()];
    let ok = process::run(&nvlink, &req, &spec, &scratch, &Cancel::new(), Duration::from_secs(600), None).expect("run");
    assert_eq!((ok.exit_code, ok.outputs.len()), (0, 1), "{}", String::from_utf8_lossy(&ok.stderr));

    let cancelled = Cancel::new();
    cancelled.cancel();
    assert!(process::run(&nvlink, &req, &spec, &scratch, &cancelled, Duration::from_secs(600), None).is_err());

    let killed = process::run(&nvlink, &req, &spec, &scratch, &Cancel::new(), Duration::ZERO, None);
    assert!(
        matches!(killed, Err(process::RunError::Signal(libc::SIGKILL))),
        "nvlink was not killed at its time limit: {:?}",
        killed.err()
    );
}

/// ptxas runs under the link's `Cancel` and time limit too: a cancelled link
/// starts none, one over its limit is killed and yields no artifact, and an
/// unhindered run compiles the module (compared with ptxas run directly).
#[test]
fn ptxas_runs_are_cancellable_and_time_limited() {
    use nvlinkd_core::engine::ptxas;
    let tk = Toolkit::open(cuda_home()).expect("toolkit");
    let ptx = std::fs::read(corpus::dir().join("saxpy.ptx")).expect("corpus saxpy.ptx");
    let args: Vec<String> = ["-arch=sm_90", "-m64", "-c"].map(String::from).to_vec();
    let scratch = TempDir::new("ptxas-cancel");

    let ok =
        ptxas::compile(&tk, &ptx, &args, scratch.path(), &Cancel::new(), Duration::from_secs(600), &Policy::default())
            .expect("ptxas");
    let direct = scratch.path().join("direct.cubin");
    let status = std::process::Command::new(cuda_home().join("bin/ptxas"))
        .args(&args)
        .arg(corpus::dir().join("saxpy.ptx"))
        .arg("-o")
        .arg(&direct)
        .status()
        .expect("run ptxas");
    assert!(status.success());
    assert_eq!(ok, std::fs::read(&direct).unwrap(), "ptxas through the supervisor differs from ptxas");

    let cancelled = Cancel::new();
    cancelled.cancel();
    let t = Instant::now();
    assert!(ptxas::compile(&tk, &ptx, &args, scratch.path(), &cancelled, Duration::from_secs(600), &Policy::default())
        .is_err());
    let killed = ptxas::compile(&tk, &ptx, &args, scratch.path(), &Cancel::new(), Duration::ZERO, &Policy::default());
    let err = killed.expect_err("ptxas was not stopped at its time limit");
    assert!(err.detail.contains("killed"), "{}", err.detail);
    // Bound on a hang, not a speed claim: neither run compiled anything.
    assert!(t.elapsed() < Duration::from_secs(60));
}
