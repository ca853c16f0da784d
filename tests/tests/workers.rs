//! nvJitLink out of the daemon's address space: a crash inside NVIDIA code,
//! or a worker killed from outside, fails that link only (the shim then does
//! what nvlink does), nothing is cached from it, and every other link goes on.
//! Each case is compared with the real nvlink.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nvlinkd_tests::compare;
use nvlinkd_tests::corpus;
use nvlinkd_tests::daemon::Daemon;
use nvlinkd_tests::env::{real_nvlink, shim, TempDir};
use nvlinkd_tests::run::{run, Invocation, Run};

/// The worker test hook (`core/src/worker.rs`, `HOLD_ENV`).
const HOLD: &str = "NVLINKD_TEST_WORKER_HOLD";

const GOOD_LINK: &str = "--arch=sm_90 accumulate.o scale.o -o {OUT}/out.cubin";

fn inv(args: &str, cwd: &std::path::Path, out: &TempDir) -> Invocation {
    Invocation::templated(args, cwd, out)
}

fn same(expected: &Run, actual: &Run, what: &str) {
    let cmp = compare::runs(expected, actual);
    assert!(cmp.problems.is_empty(), "{what}: {:?}", cmp.problems);
    assert!(cmp.identical, "{what}: outputs differ from nvlink's");
}

/// The corpus's `scale.cubin` (sm_90) with one byte of its `.nv.callgraph`
/// section changed: the byte at offset 2 of the section XOR 0x10 (one bit of
/// the first call-graph edge). Found once by flipping each byte of the cubin in
/// turn and keeping those for which the real nvlink dies by SIGSEGV. It once
/// reached libnvJitLink, which segfaulted as nvlink does; now its call graph
/// names no symbol of the cubin (`input/canonical.rs`), so it never reaches a
/// worker: nvlink's crash is nvlink's.
fn crashing_cubin(dir: &Path) -> PathBuf {
    let src = std::fs::read(corpus::dir().join("scale.cubin")).expect("corpus scale.cubin");
    let elf = nvlinkd_core::elf::Elf::parse(&src).expect("scale.cubin is an ELF file");
    let (_, cg) = elf.section(".nv.callgraph").expect(".nv.callgraph");
    let at = cg.offset as usize + 2;
    let mut data = src.clone();
    data[at] ^= 0x10;
    let path = dir.join("crash.cubin");
    std::fs::write(&path, &data).expect("write crash.cubin");
    path
}

/// Wait until `n` workers hold a link (the hook marks `<hold>.<pid>`); their pids.
fn held_workers(hold: &Path, n: usize) -> Vec<i32> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let dir = hold.parent().expect("hold dir");
        let prefix = format!("{}.", hold.file_name().unwrap().to_string_lossy());
        let pids: Vec<i32> = std::fs::read_dir(dir)
            .expect("hold dir")
            .flatten()
            .filter_map(|e| e.file_name().to_string_lossy().strip_prefix(&prefix).and_then(|p| p.parse().ok()))
            .collect();
        if pids.len() >= n {
            return pids;
        }
        assert!(Instant::now() < deadline, "no nvJitLink worker took the link ({} of {n})", pids.len());
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn crashing_input_fails_only_its_link() {
    let work = TempDir::new("crash");
    let crash = crashing_cubin(work.path());
    let crash_link = format!("--arch=sm_90 {} -o {{OUT}}/out.cubin", crash.display());

    // The real nvlink dies by a signal on it.
    let out = TempDir::new("crash-ref");
    let status = std::process::Command::new(real_nvlink())
        .args(inv(&crash_link, work.path(), &out).args)
        .status()
        .expect("run nvlink");
    assert!(
        std::os::unix::process::ExitStatusExt::signal(&status).is_some(),
        "the real nvlink no longer crashes on the damaged cubin: {status}"
    );
    let expected_crash = run(&real_nvlink(), &inv(&crash_link, work.path(), &out), &[]);
    let out_good = TempDir::new("good-ref");
    let expected_good = run(&real_nvlink(), &inv(GOOD_LINK, corpus::dir(), &out_good), &[]);
    assert_eq!(expected_good.code, 0);

    // The good link is held in its worker while the crashing one runs.
    let hold = work.path().join("hold");
    std::fs::write(&hold, b"").unwrap();
    let d = Daemon::start_env(&["--jobs", "2"], &[(HOLD, &hold.display().to_string())]);
    let env = d.fallback_env();
    let (crash_run, good_run) = std::thread::scope(|s| {
        let g = s.spawn(|| {
            let out = TempDir::new("good-shim");
            run(&shim(), &inv(GOOD_LINK, corpus::dir(), &out), &d.shim_env())
        });
        held_workers(&hold, 1);
        let out = TempDir::new("crash-shim");
        let crashed = run(&shim(), &inv(&crash_link, work.path(), &out), &env);
        std::fs::remove_file(&hold).unwrap();
        (crashed, g.join().unwrap())
    });
    same(&expected_good, &good_run, "concurrent good link");
    same(&expected_crash, &crash_run, "crashing link");
    assert!(d.answers(), "the daemon died with the crashing link");
    assert_eq!(d.stat("worker_crashes"), 0, "the damaged cubin reached a worker");

    // Not cached: the same link is nvlink's crash again.
    let again = run(&shim(), &inv(&crash_link, work.path(), &TempDir::new("crash-again")), &d.fallback_env());
    same(&expected_crash, &again, "crashing link, again");
    assert_eq!(d.stat("cache_hits"), 0);
    assert!(d.answers());
    // And a good link is still served in process.
    let in_process = d.stat("in_process");
    let good = run(&shim(), &inv(GOOD_LINK, corpus::dir(), &TempDir::new("good-after")), &d.shim_env());
    same(&expected_good, &good, "good link after the crashes");
    assert!(d.stat("in_process") > in_process || d.stat("cache_hits") > 0);
}

#[test]
fn killed_worker_fails_only_its_link_and_is_replaced() {
    let work = TempDir::new("kill9");
    let out = TempDir::new("kill9-ref");
    let expected = run(&real_nvlink(), &inv(GOOD_LINK, corpus::dir(), &out), &[]);
    assert_eq!(expected.code, 0);

    let hold = work.path().join("hold");
    std::fs::write(&hold, b"").unwrap();
    let d = Daemon::start_env(&[], &[(HOLD, &hold.display().to_string())]);
    let env = d.fallback_env();
    let invocation = inv(GOOD_LINK, corpus::dir(), &out);
    let handle = std::thread::spawn(move || run(&shim(), &invocation, &env));
    let pids = held_workers(&hold, 1);
    // SAFETY: a kill(2) of the worker process the hook named.
    assert_eq!(unsafe { libc::kill(pids[0], libc::SIGKILL) }, 0, "kill worker {}", pids[0]);
    std::fs::remove_file(&hold).unwrap();
    let actual = handle.join().unwrap();
    same(&expected, &actual, "link whose worker was killed");
    assert!(d.answers(), "the daemon died with its worker");
    assert_eq!(d.stat("worker_crashes"), 1);
    assert_eq!(d.stat("in_process"), 0, "the killed link was counted as linked");
    assert_eq!(d.reason_count("fallback_reasons", "worker"), 1, "the fallback was not put down to the worker");

    // The next link: a fresh worker, in process, nvlink's bytes (nothing was cached).
    let out = TempDir::new("kill9-next");
    let next = run(&shim(), &inv(GOOD_LINK, corpus::dir(), &out), &d.shim_env());
    same(&expected, &next, "link after the kill");
    assert_eq!(d.stat("in_process"), 1, "the next link was not served in process");
    assert_eq!(d.stat("cache_hits"), 0);
    assert!(d.stat("workers") >= 1);
}

/// `scale.cubin` with byte 2 of the name offset of its fifth symbol (`.symtab`
/// entry 4) XOR 0x10: a name far outside the string table. nvlinkd's readers
/// decline it, so the daemon runs the real nvlink as its engine, which dies
/// by SIGSEGV (found by the same one-byte search as [`crashing_cubin`]).
fn bad_symbol_cubin(dir: &Path) -> PathBuf {
    let src = std::fs::read(corpus::dir().join("scale.cubin")).expect("corpus scale.cubin");
    let elf = nvlinkd_core::elf::Elf::parse(&src).expect("scale.cubin is an ELF file");
    let (_, symtab) = elf.section(".symtab").expect(".symtab");
    let mut data = src.clone();
    data[symtab.offset as usize + 4 * 24 + 2] ^= 0x10;
    let path = dir.join("badsym.cubin");
    std::fs::write(&path, &data).expect("write badsym.cubin");
    path
}

#[test]
fn nvlink_engine_killed_by_a_signal_is_no_result() {
    let work = TempDir::new("badsym");
    let bad = bad_symbol_cubin(work.path());
    let link = format!("--arch=sm_90 {} -o {{OUT}}/out.cubin", bad.display());
    let out = TempDir::new("badsym-ref");
    let status = std::process::Command::new(real_nvlink())
        .args(inv(&link, work.path(), &out).args)
        .status()
        .expect("run nvlink");
    assert!(
        std::os::unix::process::ExitStatusExt::signal(&status).is_some(),
        "the real nvlink no longer crashes on the damaged symbol table: {status}"
    );
    let expected = run(&real_nvlink(), &inv(&link, work.path(), &out), &[]);

    let d = Daemon::start();
    for round in ["first", "second"] {
        let actual = run(&shim(), &inv(&link, work.path(), &TempDir::new("badsym-shim")), &d.fallback_env());
        same(&expected, &actual, round);
    }
    assert!(d.answers());
    assert_eq!(d.stat("cache_hits"), 0, "a crash of the nvlink engine was cached");
    assert_eq!(d.stat("nvlink_process"), 0, "a crash of the nvlink engine was counted as its result");
    assert_eq!(d.stat("fallbacks"), 2);
    // Declined by the cubin reader, then no answer from the nvlink engine.
    assert_eq!(d.reason_count("routed", "input"), 2);
    assert_eq!(d.reason_count("fallback_reasons", "environment"), 2);
}

/// NVVM inside nvJitLink keeps option state from one compile to the next in a
/// process: after an `-Ofc max` LTO link (`-Xnvvm=-Ofast-compile=max`) in a
/// worker, a default LTO link of CUB's flagged selection in the same worker
/// gave other code for its three selection kernels than nvlink. So an NVVM
/// compile runs in a worker that has served nothing, which ends after it
/// (`WorkerPool::link`). One slot (`--jobs 1`): every link would share one
/// worker if workers were reused.
#[test]
fn an_nvvm_compile_leaves_nothing_behind_for_the_next_link() {
    const LTO: &str = "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} select_flagged_lto.o select_xform_lto.o -lcudadevrt -o {OUT}/out.cubin";
    const OFC: &str = "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} -Ofc max accumulate_lto.o scale_lto.o -lcudadevrt -o {OUT}/out.cubin";
    let d = Daemon::start_with(&["--jobs", "1", "--no-speculate"]);
    let env = d.shim_env();
    for (i, args) in [OFC, LTO].into_iter().enumerate() {
        let out = TempDir::new("nvvm-state");
        let expected = run(&real_nvlink(), &inv(args, corpus::dir(), &out), &[]);
        assert_eq!(expected.code, 0, "nvlink: {}", String::from_utf8_lossy(&expected.stderr));
        let actual_out = TempDir::new("nvvm-state-d");
        let actual = run(&shim(), &inv(args, corpus::dir(), &actual_out), &env);
        same(&expected, &actual, &format!("link {i} ({args})"));
        assert_eq!(d.stat("in_process"), i as u64 + 1, "link {i} was not linked in process");
    }
}

/// Links of the same local files share one read of each (`fs::ContentMemo`:
/// by file identity, once unchanged for two seconds), and a rewritten file
/// (a new ctime, however its size and mtime look) is read again: every link
/// gives nvlink's answer for the files as they are now.
#[test]
fn links_share_reads_of_unchanged_files_and_see_rewrites() {
    let work = TempDir::new("contents");
    for f in ["accumulate.o", "scale.o", "corrupt_fatbin.o"] {
        std::fs::copy(corpus::dir().join(f), work.path().join(f)).expect("copy corpus object");
    }
    // Settled: unchanged for two seconds (files just written are always read).
    std::thread::sleep(Duration::from_millis(2100));
    let d = Daemon::start();
    let check = |args: &str, what: &str| {
        let (out_nv, out_d) = (TempDir::new("contents-ref"), TempDir::new("contents-d"));
        let expected = run(&real_nvlink(), &inv(args, work.path(), &out_nv), &[]);
        let actual = run(&shim(), &inv(args, work.path(), &out_d), &d.shim_env());
        same(&expected, &actual, what);
    };
    check("--arch=sm_90 accumulate.o scale.o -o {OUT}/out.cubin", "first link");
    assert_eq!(d.stat("input_memo_hits"), 0);
    // Another link (not a whole-link hit) of the same files: no file read again.
    check("--arch=sm_90 scale.o accumulate.o -o {OUT}/out.cubin", "second link");
    assert_eq!(d.stat("input_memo_hits"), 2, "the second link read its files again");
    assert!(d.stat("input_memo_bytes") > 0);
    // Same size, same mtime, other contents (`corrupt_fatbin.o` is
    // `accumulate.o` with a damaged fatbin member: nvlink answers otherwise):
    // only its ctime tells, and that is part of the identity.
    let acc = work.path().join("accumulate.o");
    let mtime = std::fs::metadata(&acc).unwrap().modified().unwrap();
    let other = std::fs::read(work.path().join("corrupt_fatbin.o")).unwrap();
    assert_eq!(other.len() as u64, std::fs::metadata(&acc).unwrap().len());
    std::fs::write(&acc, &other).unwrap();
    std::fs::File::options().write(true).open(&acc).unwrap().set_modified(mtime).unwrap();
    std::thread::sleep(Duration::from_millis(2100));
    check("--arch=sm_90 accumulate.o scale.o -o {OUT}/out.cubin", "link after a rewrite");
}

/// NVVM compiles run in `nvlinkd-nvvm` workers, whose nvJitLink allocates
/// through jemalloc (`server/src/nvvm.rs`); non-LTO links in `nvlinkd worker`,
/// on glibc's malloc (nvJitLink's crash on a damaged cubin depends on it:
/// [`crashing_input_fails_only_its_link`]). The worker holding each link
/// (the test hook) is that executable, both answers are nvlink's, and with
/// every symbol bound at load (`LD_BIND_NOW`) the dynamic linker's log shows
/// libnvJitLink's `malloc`, `free`, `calloc`, `realloc` and `posix_memalign`
/// bound to `nvlinkd-nvvm` itself in one, to the C library in the other.
#[test]
fn nvvm_workers_allocate_through_jemalloc() {
    const LTO: &str =
        "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} accumulate_lto.o scale_lto.o -lcudadevrt -o {OUT}/out.cubin";
    let daemon = nvlinkd_tests::env::nvlinkd();
    let nvvm = daemon.with_file_name("nvlinkd-nvvm");
    let work = TempDir::new("wk-alloc");
    let hold = work.path().join("hold");
    let d = Daemon::start_env(&["--no-speculate"], &[(HOLD, &hold.display().to_string())]);
    for (args, exe) in [(LTO, &nvvm), (GOOD_LINK, &daemon)] {
        let out = TempDir::new("wk-alloc-ref");
        let expected = run(&real_nvlink(), &inv(args, corpus::dir(), &out), &[]);
        assert_eq!(expected.code, 0, "nvlink: {}", String::from_utf8_lossy(&expected.stderr));
        std::fs::write(&hold, b"").unwrap();
        let (env, invocation) = (d.shim_env(), inv(args, corpus::dir(), &out));
        let handle = std::thread::spawn(move || run(&shim(), &invocation, &env));
        let pids = held_workers(&hold, 1);
        let running = std::fs::read_link(format!("/proc/{}/exe", pids[0])).expect("worker executable");
        std::fs::remove_file(&hold).unwrap();
        same(&expected, &handle.join().unwrap(), args);
        for p in pids {
            let _ = std::fs::remove_file(format!("{}.{p}", hold.display()));
        }
        assert_eq!(&running, exe, "{args}: linked by {}", running.display());
    }

    let tk = nvlinkd_core::toolkit::Toolkit::open(nvlinkd_tests::env::cuda_home()).expect("toolkit");
    let lib = tk.jitlink_spec();
    for (exe, allocator) in [(&nvvm, nvvm.display().to_string()), (&daemon, "libc.so".to_string())] {
        let log = work.path().join("ld");
        let mut child = std::process::Command::new(exe)
            .arg("worker")
            .arg("--lib")
            .arg(&lib.path)
            .args(["--release", &format!("{}.{}", lib.major, lib.minor)])
            .env("LD_DEBUG", "bindings")
            .env("LD_DEBUG_OUTPUT", &log)
            .env("LD_BIND_NOW", "1")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("worker");
        // The handshake: 0 once the library is loaded; then end it.
        let mut loaded = [1u8];
        std::io::Read::read_exact(&mut child.stdout.take().expect("stdout"), &mut loaded).expect("handshake");
        assert_eq!(loaded, [0], "{} did not load {}", exe.display(), lib.path.display());
        drop(child.stdin.take());
        assert!(child.wait().expect("worker exit").success());
        let text = std::fs::read_to_string(format!("{}.{}", log.display(), child.id())).expect("ld.so log");
        for symbol in ["malloc", "free", "calloc", "realloc", "posix_memalign"] {
            let bound: Vec<&str> = text
                .lines()
                .filter(|l| l.contains("libnvJitLink") && l.contains(&format!("normal symbol `{symbol}'")))
                .filter_map(|l| l.split(" to ").nth(1).and_then(|t| t.split(" [").next()))
                .collect();
            assert!(
                !bound.is_empty() && bound.iter().all(|b| b.contains(&allocator)),
                "{}: libnvJitLink's {symbol} bound to {bound:?}, not {allocator}",
                exe.display()
            );
        }
    }
}

/// A fresh daemon starts its nvJitLink workers, as many as `--jobs`, before
/// any link arrives (one after another, in the background): the first links
/// of a burst find them running instead of each starting one on its way.
#[test]
fn a_fresh_daemon_starts_its_workers_before_the_first_link() {
    let d = Daemon::start_with(&["--jobs", "3"]);
    let deadline = Instant::now() + Duration::from_secs(20);
    while d.stat("workers") < 3 {
        assert!(
            Instant::now() < deadline,
            "{} of 3 workers started without a link (only the first is started ahead of links?)",
            d.stat("workers")
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // No more than --jobs, and no link was needed for them.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(d.stat("workers"), 3);
    assert_eq!(d.stat("requests"), 0);

    // They serve links as any worker does: nvlink's bytes.
    let out = TempDir::new("prewarmed-ref");
    let expected = run(&real_nvlink(), &inv(GOOD_LINK, corpus::dir(), &out), &[]);
    let out = TempDir::new("prewarmed");
    let actual = run(&shim(), &inv(GOOD_LINK, corpus::dir(), &out), &d.shim_env());
    same(&expected, &actual, "link on prewarmed workers");
    assert_eq!(d.stat("in_process"), 1);
}

/// A worker that linked for one tenant (a remote caller) never links for
/// another: nvJitLink reads some damaged inputs from memory past them, and a
/// worker's memory holds what it linked before. The host's own links and
/// remote ones have workers of their own, each up to `max`.
#[test]
fn a_worker_links_for_one_tenant_only() {
    let tk = Toolkit::open(cuda_home()).expect("toolkit");
    let lib = tk.jitlink_spec();
    let cubin = std::fs::read(corpus::dir().join("scale.cubin")).expect("scale.cubin");
    let inputs = [JitInput { kind: InputType::Cubin, data: &cubin, name: "scale.cubin" }];
    let opts = vec!["-arch=sm_90".to_string()];
    use nvlinkd_core::confine::Policy;
    use nvlinkd_core::jitlink::{InputType, JitInput};
    use nvlinkd_core::toolkit::Toolkit;
    use nvlinkd_core::worker::{Cancel, PoolConfig, WorkerPool};
    use nvlinkd_tests::env::{cuda_home, nvlinkd};
    // (Here, not in cancel.rs, whose tests set the worker hold hook in this
    // process's environment, which these workers would inherit.)
    let pool = WorkerPool::new(PoolConfig {
        exe: nvlinkd(),
        max: 1,
        mem_limit: 0,
        timeout: Duration::from_secs(600),
        confine: Policy::default(),
    });
    let as_tenant = |t: [u8; 32]| {
        let c = Cancel::new();
        c.set_tenant(t);
        pool.link(&lib, &opts, &inputs, false, &c).expect("link in a worker");
        pool.idle_pids()
    };
    let alice = as_tenant([7; 32]);
    assert_eq!(as_tenant([7; 32]), alice, "a tenant's next link reuses its worker");
    let bob = as_tenant([8; 32]);
    assert_eq!(bob.len(), 1, "one remote worker at most");
    assert_ne!(bob, alice, "another tenant's link ran in alice's worker");
    let local = as_tenant(nvlinkd_core::cancel::LOCAL);
    assert_eq!(local.len(), 2, "the host's own links have workers of their own");
    assert!(local.contains(&bob[0]));
}
