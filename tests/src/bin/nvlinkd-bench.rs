//! `nvlinkd-bench`: nvlink and nvlinkd side by side, in one run, on one machine.
//!
//! Scenarios (medians of repetitions, ratios nvlink/nvlinkd):
//!   (a) cold LTO link of a CUB-heavy workload: nvlinkd with an empty cache vs
//!       nvlink, and vs nvlink with its best split option ((a0): the same with
//!       the page cache emptied before each side, `NVLINKD_BENCH_DROP_CACHES=1`);
//!   (b) the same LTO link again (warm);
//!   (c) the LTO link after one unit's device code changed
//!       (`NVLINKD_BENCH_ONLY=cold` runs only (a) and (c), wall and CPU time,
//!       nvlink and nvlinkd in alternating order);
//!   (d) a tiny non-LTO link, warm (and (d0) with a cache-less daemon: the
//!       shim and daemon overhead against an nvlink process);
//!   (e) 8 concurrent distinct links through one daemon vs 8 nvlink processes,
//!       wall and CPU time, and how long the machine's cores sat idle during
//!       each burst (`NVLINKD_BENCH_ONLY=burst` runs only (e));
//!   (f) peak memory of nvlink and of the daemon; daemon RSS after 10 and after
//!       1000 warm links;
//!   (g) a burst of 16 concurrent distinct links vs 16 concurrent nvlink
//!       processes, p50 latency and total: on a just-started daemon (no link
//!       before it), on one started 2 s before, and on a warm daemon whose
//!       cache holds none of the 16;
//!   (h) the first link of a daemon the shim starts itself (no daemon running,
//!       auto-start included) vs nvlink;
//!   (i) links once routed to the real nvlink, now in process (nvcc's -dlto
//!       line with `code=lto_XY` objects, partial LTO, `--kernels-used`), cold
//!       and warm.
//!   (k) IDE: from killing a cold LTO link's shim to the daemon's CPU released
//!       (CPU time of the daemon and its children, from /proc);
//!   (l) IDE: a foreground cold LTO link alone, and while background links
//!       (`NVLINKD_PRIORITY=background`) fill every slot: wall time and the
//!       wait for its slot (`link_admitted.waited_ms` from `nvlinkd events`).
//!       Targets: (k) under 500 ms; (l) slot within 100 ms, under 1.3x idle.
//!       `NVLINKD_BENCH_ONLY=ide` runs only (k) and (l).
//!   (s1) a two-arch `-dlto` device link driven by nvcc (two `-gencode`): the
//!       overlay's nvcc through a fresh daemon (the second arch speculated while
//!       the first links) vs the same overlay with the real nvlink in its place;
//!   (s2) `nvlinkd watch`: from an input change to the relinked output on disk,
//!       vs one nvlink run of the changed link;
//!   (s3) with `serve --watch`: the build's next link after the speculative
//!       relink of a changed input, vs nvlink on the changed link.
//!       `NVLINKD_BENCH_ONLY=speculation` runs only (s1)–(s3).
//!   (j) the relink of recompiled but unchanged objects (the same sources
//!       compiled again: only nvcc's temporary file name differs), non-LTO as
//!       nvcc runs it (with a registration file) and LTO, after the link of the
//!       first compilation: a cache hit against nvlink's full link.
//!   (w) remote links over a simulated WAN (20 ms RTT, 100 Mbit/s each way:
//!       network namespaces and `tc netem`, or a user-space relay where
//!       netem is refused; `nvlinkd_tests::wan`), TLS and a token: (w1) the
//!       cold LTO link of the workload on a fresh remote daemon against the
//!       local nvlink, (w2) the same link again (warm), with bytes on the wire
//!       per link; (w3) 64 concurrent shims on three replicas sharing a
//!       BuildGrid (without it, no shared tier), NVLINKD_ADDR rotated: p50/p99
//!       against 64 concurrent nvlink processes, and the replicas' memory.
//!       Targets: (w2) under 4 RTT + 10 ms, no input bytes sent; (w1) within
//!       1.2x of nvlink's cold link. `NVLINKD_BENCH_ONLY=wan` runs only (w).
//!   (v) verification: the (e) burst of 8 concurrent distinct cold links on a
//!       daemon with `--verify=background` (each link then run again by the
//!       real nvlink, at idle priority, after its answer) against the same
//!       daemon with `--verify=off`; the left column is `off`. Target: under
//!       1.1x. `NVLINKD_BENCH_ONLY=verify` runs only (v).
//! Every nvlinkd output is compared byte for byte with nvlink's.
//!
//!   nvlinkd-bench `[REPS]`        (scripts/bench.sh builds and runs it)

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use nvlinkd_tests::corpus;
use nvlinkd_tests::daemon::Daemon;
use nvlinkd_tests::env::{cuda_home, real_nvlink, shim, TempDir};

struct Timed {
    wall: Duration,
    ok: bool,
    /// Peak resident set of the process, KiB.
    max_rss_kb: i64,
    /// CPU time (user + system) of the process.
    cpu: Duration,
}

/// Run and wait, with the child's peak RSS from wait4 (which reaps it).
#[allow(clippy::zombie_processes)]
fn timed(program: &Path, args: &[String], cwd: &Path, env: &[(String, String)]) -> Timed {
    let t = Instant::now();
    let child = Command::new(program)
        .args(args)
        .current_dir(cwd)
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .spawn()
        .expect("spawn");
    let mut status = 0;
    // SAFETY: an all-zero rusage is valid; wait4 fills it for our own child.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let pid = child.id() as i32;
    // SAFETY: waiting for our child, with valid out-pointers.
    unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    Timed {
        wall: t.elapsed(),
        ok: libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        max_rss_kb: usage.ru_maxrss,
        cpu: tv(usage.ru_utime) + tv(usage.ru_stime),
    }
}

fn tv(t: libc::timeval) -> Duration {
    Duration::from_micros(t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64)
}

/// `root` and its live descendants, `root` first (from `/proc/*/stat`).
fn process_tree(root: u32) -> Vec<u32> {
    let mut parent = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|p| p.parse::<u32>().ok()) else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        let Some((_, rest)) = stat.rsplit_once(')') else { continue };
        if let Some(ppid) = rest.split_whitespace().nth(1).and_then(|p| p.parse::<u32>().ok()) {
            parent.push((pid, ppid));
        }
    }
    let mut tree = vec![root];
    let mut i = 0;
    while i < tree.len() {
        let p = tree[i];
        tree.extend(parent.iter().filter(|(_, pp)| *pp == p).map(|(pid, _)| *pid));
        i += 1;
    }
    tree
}

/// CPU time (user + system) of `root`, its reaped children and its live
/// descendants (the daemon and its worker and ptxas processes).
fn tree_cpu(root: u32) -> Duration {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    let ticks = |pid: u32, with_children: bool| -> u64 {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return 0 };
        let Some((_, rest)) = stat.rsplit_once(')') else { return 0 };
        let f: Vec<u64> = rest.split_whitespace().map(|x| x.parse().unwrap_or(0)).collect();
        // Fields after the name: state(0) ppid(1) ... utime(11) stime(12) cutime(13) cstime(14).
        let own = f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0);
        own + if with_children { f.get(13).copied().unwrap_or(0) + f.get(14).copied().unwrap_or(0) } else { 0 }
    };
    let tree = process_tree(root);
    let t: u64 = tree.iter().enumerate().map(|(i, &p)| ticks(p, i == 0)).sum();
    Duration::from_micros(t * 1_000_000 / hz)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn args(s: &str, out: &Path) -> Vec<String> {
    let tk = cuda_home().display().to_string();
    // lib64 in a regular toolkit (the GPU machines'), lib in the PyPI one.
    let lib = if cuda_home().join("lib64/libcudadevrt.a").is_file() { "lib64" } else { "lib" };
    s.replace("{L}", &format!("{tk}/{lib}"))
        .replace("{NVVM}", &format!("{tk}/nvvm"))
        .replace("{OUT}", &out.display().to_string())
        .split_whitespace()
        .map(String::from)
        .collect()
}

fn same(a: &Path, b: &Path) -> bool {
    match (std::fs::read(a), std::fs::read(b)) {
        (Ok(x), Ok(y)) => x == y,
        _ => false,
    }
}

/// Kibibytes of a `/proc/<pid>/status` field (VmRSS, VmHWM).
fn proc_kb(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

struct Report {
    rows: Vec<(String, Duration, Duration, String)>,
    all_identical: bool,
}

impl Report {
    fn row(&mut self, name: &str, nvlink: Duration, nvlinkd: Duration, identical: bool, note: &str) {
        self.all_identical &= identical;
        let n = format!("{}{}", if identical { "byte-identical" } else { "DIFFERS" }, note);
        // Each row as soon as it is measured too: a run cut short keeps its rows.
        eprintln!("row: {name}: {:.3} s / {:.3} s, {n}", nvlink.as_secs_f64(), nvlinkd.as_secs_f64());
        self.rows.push((name.into(), nvlink, nvlinkd, n));
    }
}

const LTO: &str = "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} tu1_lto.o tu2_lto.o tu3_lto.o tu4_lto.o tu5_lto.o transforms_lto.o -lcudadevrt -o {OUT}";
const TINY: &str = "--arch=sm_90 accumulate.o scale.o -o {OUT}";

/// A daemon with an empty cache whose libraries are loaded (one tiny link).
fn fresh_daemon(corpus: &Path) -> Daemon {
    let d = Daemon::start();
    let out = TempDir::new("warmup");
    timed(&shim(), &args(TINY, &out.path().join("w.cubin")), corpus, &d.shim_env());
    d
}

/// (i) links the real nvlink used to serve (issue 12, item 3), now in
/// process: nvcc's -dlto line (LTO IR without PTX), partial LTO, the user's
/// --kernels-used; cold (a fresh daemon each time) and warm.
fn routed_rows(report: &mut Report, reps: usize, corpus: &Path, o: &dyn Fn(&str) -> PathBuf) {
    // (i) links the real nvlink used to serve (issue 12, item 3), now in
    // process: nvcc's -dlto line (LTO IR without PTX), partial LTO, the
    // user's --kernels-used; cold (a fresh daemon each time) and warm.
    let links = [
            ("nvcc -dlto (lto_XY only)", "--arch=sm_90 -report-arch -cpu-arch=X86_64 -dlto -nvvmpath={NVVM} -L{L} xcall_main_lto3.o xcall_loop_lto3.o -lcudadevrt -o {OUT}"),
            ("partial LTO", "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} accumulate_lto.o scale.o -lcudadevrt -o {OUT}"),
            ("--kernels-used", "--arch=sm_90 --kernels-used=accum accumulate.o scale.o -o {OUT}"),
        ];
    for (name, link) in links {
        let (mut nv, mut cold, mut warm) = (Vec::new(), Vec::new(), Vec::new());
        let mut identical = true;
        for _ in 0..reps {
            nv.push(timed(&real_nvlink(), &args(link, &o("i.nvlink")), corpus, &[]).wall);
            let d = fresh_daemon(corpus);
            cold.push(timed(&shim(), &args(link, &o("i.cold")), corpus, &d.shim_env()).wall);
            warm.push(timed(&shim(), &args(link, &o("i.warm")), corpus, &d.shim_env()).wall);
            identical &= same(&o("i.nvlink"), &o("i.cold")) && same(&o("i.nvlink"), &o("i.warm"));
        }
        report.row(&format!("(i) {name}, cold"), median(nv.clone()), median(cold), identical, "");
        report.row(&format!("(i) {name}, warm"), median(nv), median(warm), identical, "");
    }
}

fn print_rows(report: &Report) {
    println!("\n{:<52} {:>11} {:>11} {:>8}  output", "scenario", "nvlink", "nvlinkd", "ratio");
    for (name, a, b, note) in &report.rows {
        println!(
            "{:<52} {:>8.3} s {:>8.3} s {:>7.2}x  {}",
            name,
            a.as_secs_f64(),
            b.as_secs_f64(),
            a.as_secs_f64() / b.as_secs_f64(),
            note
        );
    }
    println!("ratio = nvlink time / nvlinkd time (above 1: nvlinkd is faster)");
}

/// Rows (r), the shared REAPI tier: a fresh daemon (empty cache directory)
/// whose LTO link another daemon already uploaded to a BuildGrid on loopback;
/// and a fresh daemon whose whole link differs (a register file asked for too)
/// but whose NVVM and ptxas steps come from BuildGrid. Skipped without BuildGrid.
fn remote_rows(report: &mut Report, work: &Path, reps: usize, o: &dyn Fn(&str) -> PathBuf) {
    let Some(bg) = nvlinkd_tests::buildgrid::BuildGrid::start() else { return };
    let url = bg.url();
    let remote = ["--remote-cache", url.as_str()];
    let uploader = Daemon::start_with(&remote);
    let registered = format!("{LTO} --register-link-binaries={}", o("reg.c").display());
    assert!(timed(&shim(), &args(LTO, &o("r.prime")), work, &uploader.shim_env()).ok);
    let deadline = Instant::now() + Duration::from_secs(120);
    while uploader.stat("remote_cache_uploads_pending") > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let (mut nv, mut nv_reg, mut hit, mut steps) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut identical = true;
    for _ in 0..reps {
        nv.push(timed(&real_nvlink(), &args(LTO, &o("r.nvlink")), work, &[]).wall);
        let d = Daemon::start_with(&remote);
        let t = timed(&shim(), &args(LTO, &o("r.hit")), work, &d.shim_env());
        assert!(t.ok && d.stat("remote_cache_hits") >= 1, "no shared-tier hit: {}", d.stats());
        hit.push(t.wall);
        identical &= same(&o("r.nvlink"), &o("r.hit"));
        let d = Daemon::start_with(&remote);
        let t = timed(&shim(), &args(&registered, &o("r.steps")), work, &d.shim_env());
        assert!(t.ok, "LTO link with shared steps failed");
        steps.push(t.wall);
        nv_reg.push(timed(&real_nvlink(), &args(&registered, &o("r.nvlink-reg")), work, &[]).wall);
        identical &= same(&o("r.nvlink-reg"), &o("r.steps"));
    }
    report.row("(r) LTO link, fresh daemon, shared-tier hit", median(nv.clone()), median(hit), identical, "");
    report.row("(r) LTO link, fresh daemon, shared NVVM+ptxas", median(nv_reg), median(steps), identical, "");
}

fn main() {
    let reps: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(3).max(1);
    let corpus = corpus::dir().clone();
    eprintln!("building the workload (once per machine)...");
    let out = TempDir::new("bench");
    let o = |n: &str| out.path().join(n);
    // `NVLINKD_BENCH_ONLY=routed`: only the rows (i), without the workload.
    if std::env::var("NVLINKD_BENCH_ONLY").is_ok_and(|v| v == "routed") {
        let mut report = Report { rows: Vec::new(), all_identical: true };
        routed_rows(&mut report, reps, &corpus, &o);
        print_rows(&report);
        std::process::exit(if report.all_identical { 0 } else { 1 });
    }
    let work: PathBuf = corpus::workload().clone();
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let mut report = Report { rows: Vec::new(), all_identical: true };
    println!("nvlinkd-bench: {reps} repetitions, medians, {cpus} CPUs, toolkit {}", cuda_home().display());

    if std::env::var("NVLINKD_BENCH_ONLY").is_ok_and(|v| v == "ide") {
        ide_rows(reps, &work, &o);
        return;
    }
    if std::env::var("NVLINKD_BENCH_ONLY").is_ok_and(|v| v == "speculation") {
        speculation_rows(&mut report, reps, &corpus, &work);
        print_rows(&report);
        std::process::exit(if report.all_identical { 0 } else { 1 });
    }

    // `NVLINKD_BENCH_ONLY=recompiled`: only the rows (j).
    if std::env::var("NVLINKD_BENCH_ONLY").is_ok_and(|v| v == "recompiled") {
        recompiled_rows(&mut report, &corpus, &work, &o, reps);
        print_rows(&report);
        return;
    }
    // `NVLINKD_BENCH_ONLY=wan`: only the WAN rows (w).
    if std::env::var("NVLINKD_BENCH_ONLY").is_ok_and(|v| v == "wan") {
        wan_rows(&mut report, reps, &corpus, &work);
        print_rows(&report);
        std::process::exit(if report.all_identical { 0 } else { 1 });
    }
    // `NVLINKD_BENCH_ONLY=cold`: only the rows (a) and (c), with CPU times.
    if std::env::var("NVLINKD_BENCH_ONLY").is_ok_and(|v| v == "cold") {
        cold_rows(&mut report, reps, &corpus, &work, &o);
        print_rows(&report);
        std::process::exit(if report.all_identical { 0 } else { 1 });
    }
    // `NVLINKD_BENCH_ONLY=verify`: only the row (v).
    if std::env::var("NVLINKD_BENCH_ONLY").is_ok_and(|v| v == "verify") {
        verify_rows(&mut report, reps, &corpus, &work, &o);
        print_rows(&report);
        std::process::exit(if report.all_identical { 0 } else { 1 });
    }
    // `NVLINKD_BENCH_ONLY=burst`: only the row (e), with CPU times.
    if std::env::var("NVLINKD_BENCH_ONLY").is_ok_and(|v| v == "burst") {
        burst_rows(&mut report, reps, &corpus, &work, &o);
        print_rows(&report);
        std::process::exit(if report.all_identical { 0 } else { 1 });
    }
    // `NVLINKD_BENCH_ONLY=fresh`: only the fresh-daemon rows (g) and (h).
    let only_fresh = std::env::var("NVLINKD_BENCH_ONLY").is_ok_and(|v| v == "fresh");
    // `NVLINKD_BENCH_ONLY=remote`: only the shared-tier rows (r).
    if std::env::var("NVLINKD_BENCH_ONLY").is_ok_and(|v| v == "remote") {
        remote_rows(&mut report, &work, reps, &o);
        for (name, a, b, note) in &report.rows {
            println!("{name:<52} {:>8.3} s {:>8.3} s  {note}", a.as_secs_f64(), b.as_secs_f64());
        }
        return;
    }
    let (mut nv_rss, mut d_hwm, mut rss_10, mut rss_1000) = (0i64, 0u64, 0u64, 0u64);
    // (a0) the cold LTO link as on a machine's first run: the page cache is
    // emptied before each side, so the toolkit's libraries come from disk.
    if !only_fresh && std::env::var("NVLINKD_BENCH_DROP_CACHES").is_ok_and(|v| v == "1") && drop_page_cache() {
        let (mut nv, mut nvd) = (Vec::new(), Vec::new());
        for _ in 0..reps {
            drop_page_cache();
            let d = fresh_daemon(&corpus);
            nvd.push(timed(&shim(), &args(LTO, &o("lto0.nvlinkd")), &work, &d.shim_env()).wall);
            drop(d);
            drop_page_cache();
            nv.push(timed(&real_nvlink(), &args(LTO, &o("lto0.nvlink")), &work, &[]).wall);
        }
        let identical = same(&o("lto0.nvlink"), &o("lto0.nvlinkd"));
        report.row("(a0) cold LTO link, page cache emptied before each", median(nv), median(nvd), identical, "");
    }
    if !only_fresh {
        // (a) cold LTO, (f) peak memory.
        let (mut nv, mut nvs, mut nvd) = (Vec::new(), Vec::new(), Vec::new());
        let mut identical = true;
        for _ in 0..reps {
            let d = fresh_daemon(&corpus);
            let t = timed(&shim(), &args(LTO, &o("lto.nvlinkd")), &work, &d.shim_env());
            assert!(t.ok, "nvlinkd LTO link failed");
            nvd.push(t.wall);
            d_hwm = d_hwm.max(d.child.as_ref().map(|c| proc_kb(c.id(), "VmHWM")).unwrap_or(0));
            let t = timed(&real_nvlink(), &args(LTO, &o("lto.nvlink")), &work, &[]);
            assert!(t.ok, "nvlink LTO link failed");
            nv.push(t.wall);
            nv_rss = nv_rss.max(t.max_rss_kb);
            identical &= same(&o("lto.nvlink"), &o("lto.nvlinkd"));
            let split = format!("{LTO} -split-compile={cpus}");
            nvs.push(timed(&real_nvlink(), &args(&split, &o("lto.split")), &work, &[]).wall);
        }
        report.row("(a) cold LTO link, vs nvlink default", median(nv.clone()), median(nvd.clone()), identical, "");
        report.row(
            &format!("(a) cold LTO link, vs nvlink -split-compile={cpus}"),
            median(nvs),
            median(nvd),
            identical,
            " (to nvlink default)",
        );

        // (b) warm: the same link again.
        let d = fresh_daemon(&corpus);
        timed(&shim(), &args(LTO, &o("lto.prime")), &work, &d.shim_env());
        let mut warm = Vec::new();
        let mut identical = true;
        for _ in 0..reps.max(5) {
            let t = timed(&shim(), &args(LTO, &o("lto.warm")), &work, &d.shim_env());
            warm.push(t.wall);
            identical &= same(&o("lto.nvlink"), &o("lto.warm"));
        }
        report.row("(b) the same LTO link again (warm)", median(nv.clone()), median(warm), identical, "");
        drop(d);

        // (c) after one unit's device code changed: cache warm with the old version.
        let changed = LTO.replace("tu3_lto.o", "tu3_changed_lto.o");
        let (mut nvc, mut nvdc) = (Vec::new(), Vec::new());
        let mut identical = true;
        for _ in 0..reps {
            let d = fresh_daemon(&corpus);
            timed(&shim(), &args(LTO, &o("lto.before")), &work, &d.shim_env());
            nvdc.push(timed(&shim(), &args(&changed, &o("changed.nvlinkd")), &work, &d.shim_env()).wall);
            nvc.push(timed(&real_nvlink(), &args(&changed, &o("changed.nvlink")), &work, &[]).wall);
            identical &= same(&o("changed.nvlink"), &o("changed.nvlinkd"));
        }
        report.row("(c) LTO link after a one-unit change", median(nvc), median(nvdc), identical, "");

        // (d0) the same tiny link with no cache at all: what the shim, the daemon
        // and the in-process engine cost against an nvlink process.
        let d = Daemon::start_with(&["--cache-mem", "0", "--cache-size", "0"]);
        timed(&shim(), &args(TINY, &o("tiny0.warmup")), &corpus, &d.shim_env());
        let (mut a, mut b) = (Vec::new(), Vec::new());
        let mut identical = true;
        for _ in 0..21 {
            a.push(timed(&real_nvlink(), &args(TINY, &o("tiny0.nvlink")), &corpus, &[]).wall);
            b.push(timed(&shim(), &args(TINY, &o("tiny0.nvlinkd")), &corpus, &d.shim_env()).wall);
            identical &= same(&o("tiny0.nvlink"), &o("tiny0.nvlinkd"));
        }
        report.row("(d0) tiny non-LTO link, no cache (overhead)", median(a), median(b), identical, "");
        drop(d);

        // (d) tiny non-LTO link, warm; (f) RSS after 10 and 1000 warm links.
        let d = fresh_daemon(&corpus);
        let pid = d.child.as_ref().map(|c| c.id()).unwrap_or(0);
        let (mut a, mut b) = (Vec::new(), Vec::new());
        let mut identical = true;
        for i in 0..1000 {
            if i < 21 {
                a.push(timed(&real_nvlink(), &args(TINY, &o("tiny.nvlink")), &corpus, &[]).wall);
            }
            let t = timed(&shim(), &args(TINY, &o("tiny.nvlinkd")), &corpus, &d.shim_env());
            if i < 21 {
                b.push(t.wall);
                identical &= same(&o("tiny.nvlink"), &o("tiny.nvlinkd"));
            }
            if i == 9 {
                rss_10 = proc_kb(pid, "VmRSS");
            }
        }
        rss_1000 = proc_kb(pid, "VmRSS");
        report.row("(d) tiny non-LTO link, warm", median(a), median(b), identical, "");
        drop(d);

        burst_rows(&mut report, reps, &corpus, &work, &o);
    }

    fresh_burst_rows(&mut report, reps, &corpus, &work, &o);

    if !only_fresh {
        routed_rows(&mut report, reps, &corpus, &o);
    }

    // (h) the first link of an auto-started daemon: no daemon runs on the
    // socket; the shim starts one (`nvlinkd start`) and links through it.
    let (mut nv_first, mut d_first) = (Vec::new(), Vec::new());
    let mut identical = true;
    for _ in 0..reps.max(5) {
        let home = TempDir::new("auto");
        let socket = home.path().join("sock");
        let env = nvlinkd_tests::env::auto_start_env(&socket, &home.path().join("cache"));
        nv_first.push(timed(&real_nvlink(), &args(TINY, &o("first.nvlink")), &corpus, &[]).wall);
        let t = timed(&shim(), &args(TINY, &o("first.nvlinkd")), &corpus, &env);
        assert!(t.ok, "first link through an auto-started daemon failed");
        d_first.push(t.wall);
        identical &= same(&o("first.nvlink"), &o("first.nvlinkd"));
        let _ = Command::new(nvlinkd_tests::env::nvlinkd()).arg("stop").arg("--socket").arg(&socket).output();
    }
    report.row("(h) first link of an auto-started daemon", median(nv_first), median(d_first), identical, "");
    if !only_fresh {
        speculation_rows(&mut report, reps, &corpus, &work);
    }

    // (r) the shared REAPI tier, when BuildGrid is installed.
    if !only_fresh && nvlinkd_tests::buildgrid::bgd().is_some() {
        remote_rows(&mut report, &work, reps, &o);
    }

    if !only_fresh {
        recompiled_rows(&mut report, &corpus, &work, &o, reps);
    }

    print_rows(&report);
    if !only_fresh {
        println!("\n(f) memory");
        println!("  nvlink peak RSS, LTO link:               {:>8} KiB", nv_rss);
        println!("  nvlinkd daemon peak RSS, cold LTO link:   {:>8} KiB", d_hwm);
        println!("  nvlinkd daemon RSS after 10 warm links:   {:>8} KiB", rss_10);
        println!("  nvlinkd daemon RSS after 1000 warm links: {:>8} KiB", rss_1000);
    }
    if !only_fresh {
        ide_rows(reps, &work, &o);
    }
    if !report.all_identical {
        eprintln!("some nvlinkd outputs differ from nvlink's");
        std::process::exit(1);
    }
}

/// (g) bursts of 16 distinct cold non-LTO links, all at once, against 16
/// nvlink processes: on a daemon that has linked nothing yet (toolkit not
/// opened, nothing loaded), on one started 2 s before, and on a warm daemon
/// (libraries loaded, libcudadevrt and the units decoded by four other links)
/// whose cache holds none of the 16.
fn fresh_burst_rows(report: &mut Report, reps: usize, corpus: &Path, work: &Path, o: &dyn Fn(&str) -> PathBuf) {
    let links = burst_links(20);
    let (burst, warmup) = links.split_at(16);
    let run_all = |prog: &Path, env: &[(String, String)], tag: &str| {
        let t = Instant::now();
        let each = at_once(prog, burst, env, work, |i| o(&format!("b{i}.{tag}")));
        (median(each.iter().map(|t| t.wall).collect()), t.elapsed())
    };
    let variants: [(&str, &dyn Fn() -> Daemon); 3] = [
        ("on a fresh daemon", &Daemon::start),
        ("2 s after the daemon started", &|| {
            let d = Daemon::start();
            std::thread::sleep(Duration::from_secs(2));
            d
        }),
        ("of new links on a warm daemon", &|| {
            let d = fresh_daemon(corpus);
            for (i, l) in warmup.iter().enumerate() {
                assert!(timed(&shim(), &args(l, &o(&format!("w{i}.warm"))), work, &d.shim_env()).ok);
            }
            d
        }),
    ];
    for (name, daemon) in variants {
        let (mut p50_nv, mut p50_d, mut tot_nv, mut tot_d) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut identical = true;
        for _ in 0..reps {
            let (p, t) = run_all(&real_nvlink(), &[], "nvlink");
            p50_nv.push(p);
            tot_nv.push(t);
            let d = daemon();
            let (p, t) = run_all(&shim(), &d.shim_env(), "nvlinkd");
            p50_d.push(p);
            tot_d.push(t);
            drop(d);
            for i in 0..burst.len() {
                identical &= same(&o(&format!("b{i}.nvlink")), &o(&format!("b{i}.nvlinkd")));
            }
        }
        report.row(&format!("(g) 16-link burst {name}, p50 latency"), median(p50_nv), median(p50_d), identical, "");
        report.row(&format!("(g) 16-link burst {name}, total"), median(tot_nv), median(tot_d), identical, "");
    }
}

/// Run every link of `links` at once with `prog` (link `i` writes `out(i)`),
/// each on a thread of its own; every one must succeed. Their timings, in order.
fn at_once(
    prog: &Path,
    links: &[String],
    env: &[(String, String)],
    work: &Path,
    out: impl Fn(usize) -> PathBuf,
) -> Vec<Timed> {
    std::thread::scope(|s| {
        let hs: Vec<_> = links
            .iter()
            .enumerate()
            .map(|(i, l)| {
                let out = out(i);
                s.spawn(move || {
                    let t = timed(prog, &args(l, &out), work, env);
                    assert!(t.ok, "link failed: {l}");
                    t
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("link thread")).collect()
    })
}

/// Empty the kernel's page cache (root; `NVLINKD_BENCH_DROP_CACHES=1`, for
/// machines lent to the bench alone). False where the kernel refuses.
fn drop_page_cache() -> bool {
    // SAFETY: sync has no preconditions.
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", "3\n").is_ok()
}

/// CPU time (ms) used so far by `root` and every live descendant, with the
/// children they reaped (`/proc/<pid>/stat` fields 14-17).
fn tree_cpu_ms(root: u32) -> f64 {
    let mut procs: Vec<(u32, u32, u64)> = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|p| p.parse::<u32>().ok()) else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        let Some((_, rest)) = stat.rsplit_once(')') else { continue };
        let f: Vec<u64> = rest.split_whitespace().map(|x| x.parse().unwrap_or(0)).collect();
        // rest[0] is field 3 (state): field n is f[n - 3].
        if f.len() > 14 {
            procs.push((pid, f[4 - 3] as u32, f[14 - 3] + f[15 - 3] + f[16 - 3] + f[17 - 3]));
        }
    }
    let mut tree = vec![root];
    let mut i = 0;
    while i < tree.len() {
        let p = tree[i];
        tree.extend(procs.iter().filter(|(_, ppid, _)| *ppid == p).map(|(pid, _, _)| *pid));
        i += 1;
    }
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let ticks: u64 = procs.iter().filter(|(pid, _, _)| tree.contains(pid)).map(|(_, _, t)| t).sum();
    ticks as f64 * 1000.0 / hz
}

fn spawn_link(args: &[String], cwd: &Path, env: &[(String, String)]) -> std::process::Child {
    Command::new(shim())
        .args(args)
        .current_dir(cwd)
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn the shim")
}

/// Rows (k) and (l): see the module docs.
fn ide_rows(reps: usize, work: &Path, o: &dyn Fn(&str) -> PathBuf) {
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    // (k) kill a cold LTO link's shim while it computes; wait for the daemon's
    // CPU use (with its workers and children) to stop growing.
    let mut release = Vec::new();
    for _ in 0..reps {
        let d = fresh_daemon(&corpus::dir().clone());
        let pid = d.pid().expect("daemon pid");
        let before = tree_cpu_ms(pid);
        let mut shim = spawn_link(&args(LTO, &o("cancel.nvlinkd")), work, &d.shim_env());
        let deadline = Instant::now() + Duration::from_secs(60);
        while tree_cpu_ms(pid) - before < 300.0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = shim.kill();
        let killed = Instant::now();
        let _ = shim.wait();
        // Released: no growth over 200 ms; the time is that of the last growth.
        let (mut last, mut last_change) = (tree_cpu_ms(pid), Duration::ZERO);
        while killed.elapsed() < last_change + Duration::from_millis(200) && killed.elapsed() < Duration::from_secs(60)
        {
            std::thread::sleep(Duration::from_millis(5));
            let now = tree_cpu_ms(pid);
            if now > last {
                (last, last_change) = (now, killed.elapsed());
            }
        }
        release.push(last_change);
    }
    // (l) a foreground cold LTO link alone, then with background links in
    // every slot. A daemon without a cache keeps every link cold.
    let d = Daemon::start_with(&["--cache-mem", "0", "--cache-size", "0"]);
    let mut events = Command::new(nvlinkd_tests::env::nvlinkd())
        .args(["events", "--json", "--socket"])
        .arg(d.socket())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("nvlinkd events");
    let lines = std::io::BufReader::new(events.stdout.take().expect("events stdout"));
    let (tx, rx) = std::sync::mpsc::channel::<serde_json::Value>();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for l in lines.lines().map_while(Result::ok) {
            if let Ok(v) = serde_json::from_str(&l) {
                let _ = tx.send(v);
            }
        }
    });
    let fg_wait = |rx: &std::sync::mpsc::Receiver<serde_json::Value>| -> f64 {
        rx.try_iter()
            .filter(|v| v["event"] == "link_admitted" && v["priority"] == "foreground")
            .filter_map(|v| v["waited_ms"].as_f64())
            .fold(0.0, f64::max)
    };
    let fg = |tag: &str| timed(&shim(), &args(LTO, &o(tag)), work, &d.shim_env());
    assert!(fg("fg-warmup.nvlinkd").ok);
    let (mut idle, mut loaded) = (Vec::new(), Vec::new());
    for _ in 0..reps {
        idle.push(fg("fg-idle.nvlinkd").wall);
    }
    let idle_wait = fg_wait(&rx);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let mut bg_env = d.shim_env();
    bg_env.push(("NVLINKD_PRIORITY".into(), "background".into()));
    std::thread::scope(|s| {
        for i in 0..cpus {
            let (stop, bg_env, out) = (&stop, &bg_env, o(&format!("bg{i}.nvlinkd")));
            s.spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    timed(&shim(), &args(LTO, &out), work, bg_env);
                }
            });
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        while d.stat_or_zero("running_background") < cpus as u64 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        for _ in 0..reps {
            loaded.push(fg("fg-loaded.nvlinkd").wall);
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    let loaded_wait = fg_wait(&rx);
    let _ = events.kill();
    let _ = events.wait();
    let (idle, loaded) = (median(idle), median(loaded));
    println!("\n(k)/(l) IDE and background use");
    println!(
        "  (k) caller killed -> daemon CPU released (median):  {:>8.0} ms   (target < 500 ms)",
        median(release).as_secs_f64() * 1e3
    );
    println!("  (l) foreground cold LTO link, idle daemon:          {:>8.3} s", idle.as_secs_f64());
    println!(
        "  (l) the same with {cpus} background links running:    {:>8.3} s   {:.2}x idle (target < 1.3x)",
        loaded.as_secs_f64(),
        loaded.as_secs_f64() / idle.as_secs_f64()
    );
    println!("  (l) longest foreground wait for a slot, idle/loaded: {idle_wait:.1} ms / {loaded_wait:.1} ms (target < 100 ms)");
}

const LTO2_OBJECTS: &str = "tu1_lto2.o tu2_lto2.o tu3_lto2.o tu4_lto2.o tu5_lto2.o transforms_lto2.o";

/// (s1)–(s3): speculative links (`server/src/speculate/mod.rs`, `watch.rs`).
fn speculation_rows(report: &mut Report, reps: usize, corpus: &Path, work: &Path) {
    let out = TempDir::new("bench-spec");
    let o = |n: &str| out.path().join(n);

    // (s1) nvcc -dlto -dlink with two -gencode, through one overlay whose
    // bin/nvlink is the shim (daemon) or the real nvlink (plain): same paths,
    // so the same bytes.
    let prefix = out.path().join("cuda");
    nvlinkd_tests::env::install_overlay(&prefix);
    let nvlink = prefix.join("bin/nvlink");
    let shim_copy = prefix.join("bin/nvlink.shim");
    std::fs::rename(&nvlink, &shim_copy).expect("move the overlay's shim");
    let nvcc = prefix.join("bin/nvcc");
    let nvcc_args = |dst: &Path| -> Vec<String> {
        let mut a: Vec<String> = "-dlto -dlink -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90"
            .split_whitespace()
            .map(String::from)
            .collect();
        a.extend(LTO2_OBJECTS.split_whitespace().map(String::from));
        a.extend(["-o".into(), dst.display().to_string()]);
        a
    };
    let use_nvlink = |program: &Path| {
        let _ = std::fs::remove_file(&nvlink);
        std::os::unix::fs::symlink(program, &nvlink).expect("overlay nvlink");
    };
    let (mut plain, mut daemon) = (Vec::new(), Vec::new());
    let mut identical = true;
    for _ in 0..reps {
        use_nvlink(&real_nvlink());
        let t = timed(&nvcc, &nvcc_args(&o("dlink2.plain.o")), work, &[]);
        assert!(t.ok, "nvcc -dlink (plain) failed");
        plain.push(t.wall);
        use_nvlink(&shim_copy);
        let d = fresh_daemon(corpus);
        let t = timed(&nvcc, &nvcc_args(&o("dlink2.nvlinkd.o")), work, &d.shim_env());
        assert!(t.ok, "nvcc -dlink (nvlinkd) failed");
        daemon.push(t.wall);
        if d.stat("speculative_hits") == 0 {
            eprintln!("(s1): the second arch was not served from a speculative link");
        }
        identical &= same(&o("dlink2.plain.o"), &o("dlink2.nvlinkd.o"));
    }
    report.row("(s1) nvcc -dlto -dlink, two -gencode (cold)", median(plain), median(daemon), identical, "");

    // The LTO link of (a)-(c) in a directory of its own, whose tu3 changes.
    let proj = TempDir::new("bench-watch");
    let objs = ["tu1_lto.o", "tu2_lto.o", "tu3_lto.o", "tu4_lto.o", "tu5_lto.o", "transforms_lto.o"];
    let set_tu3 = |changed: bool| {
        let from = if changed { "tu3_changed_lto.o" } else { "tu3_lto.o" };
        std::fs::write(proj.path().join("tu3_lto.o"), std::fs::read(work.join(from)).unwrap()).unwrap();
    };
    for f in objs {
        std::fs::copy(work.join(f), proj.path().join(f)).expect("copy the workload");
    }
    let expected = o("changed.nvlink");
    let mut nv = Vec::new();
    set_tu3(true);
    for _ in 0..reps {
        nv.push(timed(&real_nvlink(), &args(LTO, &expected), proj.path(), &[]).wall);
    }

    // (s2) nvlinkd watch: change → relinked output.
    let (mut to_output, mut identical) = (Vec::new(), true);
    for _ in 0..reps {
        set_tu3(false);
        let d = fresh_daemon(corpus);
        let dst = o("watched.cubin");
        let mut child = Command::new(nvlinkd_tests::env::nvlinkd())
            .arg("watch")
            .arg("--socket")
            .arg(d.socket())
            .arg("--")
            .args(args(LTO, &dst))
            .current_dir(proj.path())
            .env("CUDA_HOME", cuda_home())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("nvlinkd watch");
        let mut lines = std::io::BufRead::lines(std::io::BufReader::new(child.stdout.take().unwrap()));
        let first = lines.next();
        assert!(first.is_some(), "nvlinkd watch gave no event");
        let t = Instant::now();
        set_tu3(true);
        let relinked = lines.next();
        to_output.push(t.elapsed());
        assert!(relinked.is_some_and(|l| l.is_ok_and(|l| l.contains("\"relinked\""))), "no relink event");
        identical &= same(&expected, &dst);
        // SAFETY: signalling our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
        let _ = child.wait();
    }
    report.row(
        "(s2) nvlinkd watch: input change -> relinked output",
        median(nv.clone()),
        median(to_output),
        identical,
        "",
    );

    // (s3) serve --watch: the build's next link after the speculative relink.
    let (mut next, mut identical) = (Vec::new(), true);
    for _ in 0..reps {
        set_tu3(false);
        let d = Daemon::start_with(&["--watch"]);
        assert!(timed(&shim(), &args(LTO, &o("before.cubin")), proj.path(), &d.shim_env()).ok);
        let finished = d.stat("speculative_finished");
        set_tu3(true);
        let deadline = Instant::now() + Duration::from_secs(600);
        while d.stat("speculative_finished") == finished && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let t = timed(&shim(), &args(LTO, &o("next.cubin")), proj.path(), &d.shim_env());
        assert!(t.ok, "the link after the relink failed");
        next.push(t.wall);
        identical &= same(&expected, &o("next.cubin"));
    }
    report.row("(s3) next link after a --watch relink", median(nv), median(next), identical, "");
}

/// (j) Recompiled, unchanged: link the first compilation through the daemon,
/// then time the link of the second compilation (a hit) against nvlink's.
fn recompiled_rows(report: &mut Report, corpus: &Path, work: &Path, o: &dyn Fn(&str) -> PathBuf, reps: usize) {
    // Only units whose recompilation leaves the device code as it was: the CUB
    // units (tu1..tu5) get internal-linkage device names and a module id that
    // change with every compilation, so nvlink's outputs differ and no key
    // may call them equal.
    let units = ["transforms"];
    let link = |suffix: &str, dir: &str, lto: bool| {
        let objects: Vec<String> = units.iter().map(|u| format!("{dir}{u}{suffix}.o")).collect();
        let mode = if lto { "-dlto -nvvmpath={NVVM} " } else { "" };
        format!(
            "-m64 --arch=sm_90 {mode}--register-link-binaries={{OUT}}.reg.c -L{{L}}/stubs -L{{L}} -cpu-arch=X86_64 {} -lcudadevrt -o {{OUT}} --host-ccbin gcc",
            objects.join(" ")
        )
    };
    for (lto, suffix, name) in [(false, "", "non-LTO"), (true, "_lto", "LTO")] {
        let (first, again) = (link(suffix, "", lto), link(suffix, "recompiled/", lto));
        let (mut nv, mut nvd) = (Vec::new(), Vec::new());
        let mut identical = true;
        for _ in 0..reps {
            let d = fresh_daemon(corpus);
            let hits = d.stat("cache_hits");
            assert!(timed(&shim(), &args(&first, &o("rc.first")), work, &d.shim_env()).ok, "first link failed");
            let t = timed(&shim(), &args(&again, &o("rc.nvlinkd")), work, &d.shim_env());
            assert!(t.ok, "relink of the recompiled objects failed");
            nvd.push(t.wall);
            identical &= d.stat("cache_hits") == hits + 1;
            nv.push(timed(&real_nvlink(), &args(&again, &o("rc.nvlink")), work, &[]).wall);
            identical &= same(&o("rc.nvlink"), &o("rc.nvlinkd")) && same(&o("rc.nvlink.reg.c"), &o("rc.nvlinkd.reg.c"));
        }
        let row = format!("(j) {name} relink of recompiled unchanged objects");
        report.row(&row, median(nv), median(nvd), identical, if identical { " (a hit)" } else { " or not a hit" });
    }
}

/// Rows (a) and (c) alone, wall and CPU time (user + system: of the nvlink
/// process; of the shim, the daemon and its workers and ptxas), nvlink first
/// in even repetitions and nvlinkd first in odd ones.
fn cold_rows(report: &mut Report, reps: usize, corpus: &Path, work: &Path, o: &dyn Fn(&str) -> PathBuf) {
    let changed = LTO.replace("tu3_lto.o", "tu3_changed_lto.o");
    // (nvlink wall, nvlink CPU, nvlinkd wall, nvlinkd CPU) of (a) and of (c).
    let mut rows: [[Vec<Duration>; 4]; 2] = Default::default();
    let mut identical = true;
    for rep in 0..reps {
        for (row, link) in [LTO, changed.as_str()].into_iter().enumerate() {
            let d = fresh_daemon(corpus);
            if row == 1 {
                // (c): the cache holds the link before the change.
                assert!(timed(&shim(), &args(LTO, &o("cold.before")), work, &d.shim_env()).ok);
            }
            let pid = d.pid().expect("daemon pid");
            let nvlinkd = || {
                let before = tree_cpu(pid);
                let t = timed(&shim(), &args(link, &o("cold.nvlinkd")), work, &d.shim_env());
                assert!(t.ok, "nvlinkd LTO link failed");
                // Work after the answer (storing, the replacement worker) counts too.
                std::thread::sleep(Duration::from_millis(300));
                (t.wall, t.cpu + tree_cpu(pid) - before)
            };
            let nvlink = || {
                let t = timed(&real_nvlink(), &args(link, &o("cold.nvlink")), work, &[]);
                assert!(t.ok, "nvlink LTO link failed");
                (t.wall, t.cpu)
            };
            let ((nw, nc), (dw, dc)) = if rep % 2 == 0 {
                let n = nvlink();
                (n, nvlinkd())
            } else {
                let d = nvlinkd();
                (nvlink(), d)
            };
            let name = ["(a)", "(c)"][row];
            println!(
                "{name} nvlink {:.3} s wall, {:.3} s CPU; nvlinkd {:.3} s wall, {:.3} s CPU",
                nw.as_secs_f64(),
                nc.as_secs_f64(),
                dw.as_secs_f64(),
                dc.as_secs_f64()
            );
            for (v, x) in rows[row].iter_mut().zip([nw, nc, dw, dc]) {
                v.push(x);
            }
            identical &= same(&o("cold.nvlink"), &o("cold.nvlinkd"));
        }
    }
    for (row, name) in ["(a) cold LTO link", "(c) LTO link after a one-unit change"].into_iter().enumerate() {
        let [nw, nc, dw, dc] = std::mem::take(&mut rows[row]);
        report.row(name, median(nw), median(dw), identical, "");
        report.row(&format!("{} CPU time (user + system)", &name[..3]), median(nc), median(dc), identical, "");
    }
}

/// Row (e): 8 concurrent distinct links through one fresh daemon (warmed by one
/// tiny link) vs 8 nvlink processes, wall time and CPU time (user + system: of
/// the nvlink processes; of the shims, the daemon and its workers).
fn burst_rows(report: &mut Report, reps: usize, corpus: &Path, work: &Path, o: &dyn Fn(&str) -> PathBuf) {
    // Five pairs and three triples of units: eight distinct programs.
    let sets: [&[usize]; 8] = [&[1, 2], &[2, 3], &[3, 4], &[4, 5], &[5, 1], &[1, 2, 3], &[2, 3, 4], &[3, 4, 5]];
    let links: Vec<String> = sets
        .iter()
        .map(|set| {
            let tus: Vec<String> = set.iter().map(|t| format!("tu{t}.o")).collect();
            format!("--arch=sm_90 -L{{L}} {} transforms.o -lcudadevrt -o {{OUT}}", tus.join(" "))
        })
        .collect();
    let (mut p8, mut d8, mut pcpu, mut dcpu) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut identical = true;
    for _ in 0..reps {
        let d = fresh_daemon(corpus);
        let run_all = |prog: &Path, env: &[(String, String)], tag: &str| {
            let idle0 = machine_idle();
            let t = Instant::now();
            let cpu: Duration =
                at_once(prog, &links, env, work, |i| o(&format!("c{i}.{tag}"))).iter().map(|t| t.cpu).sum();
            let wall = t.elapsed();
            (wall, cpu, machine_idle().zip(idle0).map(|(b, a)| b.saturating_sub(a)))
        };
        let pid = d.pid().expect("daemon pid");
        let before = tree_cpu(pid);
        let (d_wall, shims, d_idle) = run_all(&shim(), &d.shim_env(), "nvlinkd");
        // Work the daemon does after the answers (storing, a replacement worker) counts too.
        std::thread::sleep(Duration::from_millis(300));
        let daemon = tree_cpu(pid) - before;
        let (p_wall, p_cpu, p_idle) = run_all(&real_nvlink(), &[], "nvlink");
        let idle = |i: Option<Duration>| i.map_or("?".to_owned(), |i| format!("{:.3}", i.as_secs_f64()));
        println!(
            "(e) nvlink {:.3} s wall, {:.3} s CPU, cores idle {} s; nvlinkd {:.3} s wall, {:.3} s CPU (shims {:.3} s, daemon and workers {:.3} s), cores idle {} s",
            p_wall.as_secs_f64(),
            p_cpu.as_secs_f64(),
            idle(p_idle),
            d_wall.as_secs_f64(),
            (shims + daemon).as_secs_f64(),
            shims.as_secs_f64(),
            daemon.as_secs_f64(),
            idle(d_idle)
        );
        d8.push(d_wall);
        dcpu.push(shims + daemon);
        p8.push(p_wall);
        pcpu.push(p_cpu);
        for i in 0..links.len() {
            identical &= same(&o(&format!("c{i}.nvlink")), &o(&format!("c{i}.nvlinkd")));
        }
    }
    report.row("(e) 8 concurrent distinct links (cold cache)", median(p8), median(d8), identical, "");
    report.row("(e) the same, CPU time (user + system)", median(pcpu), median(dcpu), identical, "");
}

/// (v): the (e) burst through a daemon verifying in the background against
/// one not verifying, alternating which goes first; every output compared
/// with nvlink's.
fn verify_rows(report: &mut Report, reps: usize, corpus: &Path, work: &Path, o: &dyn Fn(&str) -> PathBuf) {
    let links = burst_links(8);
    for (i, l) in links.iter().enumerate() {
        let t = timed(&real_nvlink(), &args(l, &o(&format!("v{i}.nvlink"))), work, &[]);
        assert!(t.ok, "nvlink failed: {l}");
    }
    let (mut off, mut bg) = (Vec::new(), Vec::new());
    let mut identical = true;
    let mut verified = 0;
    for rep in 0..reps {
        let modes: [&str; 2] = if rep % 2 == 0 { ["off", "background"] } else { ["background", "off"] };
        for mode in modes {
            let d = Daemon::start_with(&[&format!("--verify={mode}")]);
            let out = TempDir::new("warmup");
            timed(&shim(), &args(TINY, &out.path().join("w.cubin")), corpus, &d.shim_env());
            let t = Instant::now();
            at_once(&shim(), &links, &d.shim_env(), work, |i| o(&format!("v{i}.{mode}")));
            let wall = t.elapsed();
            if mode == "off" {
                off.push(wall);
            } else {
                // Let the verifications finish (counted), then the daemon goes.
                let deadline = Instant::now() + Duration::from_secs(120);
                while d.stat("verify_pending") > 0 && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(100));
                }
                verified += d.stat("verified");
                assert_eq!(d.stat("verify_mismatches"), 0, "verification found a mismatch: {}", d.stats());
                bg.push(wall);
            }
            for i in 0..links.len() {
                identical &= same(&o(&format!("v{i}.nvlink")), &o(&format!("v{i}.{mode}")));
            }
        }
    }
    println!("(v) {verified} links verified by the real nvlink in the background over {reps} repetitions");
    report.row("(v) 8 concurrent links: verify off | background", median(off), median(bg), identical, "");
}

/// Time all cores of the machine have spent idle so far: the residency of
/// every cpuidle state of every CPU (microseconds, updated as a CPU leaves a
/// state). Over a burst, idle cores on a loaded machine are time the links
/// waited on one another (hand-offs between shim, daemon and worker) rather
/// than computed. None where the kernel has no cpuidle.
fn machine_idle() -> Option<Duration> {
    // A CPU's residency counts an idle period only once the CPU leaves it:
    // wake every CPU first (a short spin on each), so that idle time up to
    // now is counted, and none before it is counted later.
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    std::thread::scope(|s| {
        for _ in 0..cpus {
            s.spawn(|| {
                let t = Instant::now();
                while t.elapsed() < Duration::from_millis(2) {
                    std::hint::spin_loop();
                }
            });
        }
    });
    let mut us = 0u64;
    let mut any = false;
    for cpu in std::fs::read_dir("/sys/devices/system/cpu").ok()?.flatten() {
        let name = cpu.file_name();
        let Some(n) = name.to_str().and_then(|n| n.strip_prefix("cpu")) else { continue };
        if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        for state in std::fs::read_dir(cpu.path().join("cpuidle")).into_iter().flatten().flatten() {
            if let Some(t) =
                std::fs::read_to_string(state.path().join("time")).ok().and_then(|t| t.trim().parse::<u64>().ok())
            {
                us += t;
                any = true;
            }
        }
    }
    any.then(|| Duration::from_micros(us))
}

/// The (g) burst's links: distinct non-LTO links of two or three CUB units
/// and `transforms.o`.
fn burst_links(n: usize) -> Vec<String> {
    let mut sets: Vec<String> = Vec::new();
    for a in 1..=5 {
        for b in a + 1..=5 {
            sets.push(format!("tu{a}.o tu{b}.o"));
            for c in b + 1..=5 {
                sets.push(format!("tu{a}.o tu{b}.o tu{c}.o"));
            }
        }
    }
    sets.into_iter()
        .take(n)
        .map(|tus| format!("--arch=sm_90 -L{{L}} {tus} transforms.o -lcudadevrt -o {{OUT}}"))
        .collect()
}

/// The `p`-th percentile (0..=1) of `v`, nearest rank.
fn percentile(mut v: Vec<Duration>, p: f64) -> Duration {
    v.sort();
    let rank = ((p * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

/// Resident memory (KiB) of `root` and its live descendants (the worker processes).
fn tree_rss_kb(root: u32) -> u64 {
    process_tree(root).iter().map(|&p| proc_kb(p, "VmRSS")).sum()
}

/// Rows (w): see the module docs.
fn wan_rows(report: &mut Report, reps: usize, corpus: &Path, work: &Path) {
    use nvlinkd_tests::wan::Wan;
    let wan = Wan::new(Duration::from_millis(20), 100);
    if let Some(why) = &wan.netem_refused {
        println!("(w) network namespaces with tc netem refused here ({why});");
        println!("    emulating the WAN with a user-space relay instead");
    }
    println!("(w) WAN: {}", wan.describe());
    let pki = nvlinkd_tests::remote::Pki::for_hosts(&wan.cert_hosts());
    let out = TempDir::new("bench-wan");
    let o = |n: &str| out.path().join(n);
    let bg = if nvlinkd_tests::buildgrid::bgd().is_some() {
        wan.on_server(nvlinkd_tests::buildgrid::BuildGrid::start)
    } else {
        println!("(w3) BuildGrid is not installed: the replicas share no tier");
        None
    };
    let url = bg.as_ref().map(|b| b.url());
    // A daemon on the server side, listening with TLS and a token; its
    // address for shims on the client side.
    let replica = |tier: bool| -> (Daemon, String) {
        wan.on_server(|| {
            let port = nvlinkd_tests::remote::free_port();
            let listen = format!("{}:{port}", wan.server_ip());
            let (cert, key, tokens) = (pki.file("cert.pem"), pki.file("key.pem"), pki.file("tokens"));
            let mut a = vec!["--listen", &listen, "--tls-cert", &cert, "--tls-key", &key, "--token-file", &tokens];
            if let (true, Some(url)) = (tier, &url) {
                a.extend(["--remote-cache", url.as_str()]);
            }
            let d = Daemon::start_with(&a);
            let deadline = Instant::now() + Duration::from_secs(30);
            while std::net::TcpStream::connect((wan.server_ip(), port)).is_err() {
                assert!(Instant::now() < deadline, "the daemon did not listen on {listen}");
                std::thread::sleep(Duration::from_millis(20));
            }
            (d, format!("https://{}", wan.expose(port)))
        })
    };
    wan.enter_client();
    let shim_env = |addr: &str| pki.shim_env(addr, "auto");
    // One link through the WAN: wall time and bytes (up, down).
    let remote = |link: &str, dst: &Path, addr: &str| {
        let before = wan.wire_bytes();
        let t = timed(&shim(), &args(link, dst), work, &shim_env(addr));
        assert!(t.ok, "remote link failed: {link}");
        let after = wan.wire_bytes();
        (t.wall, after.0 - before.0, after.1 - before.1)
    };
    // The link's input files: the objects and libcudadevrt.a.
    let inputs: Vec<u64> = LTO
        .split_whitespace()
        .filter(|a| a.ends_with(".o"))
        .map(|f| work.join(f))
        .chain([cuda_home().join("lib/libcudadevrt.a")])
        .map(|f| std::fs::metadata(f).map(|m| m.len()).unwrap_or(0))
        .collect();
    let (input_bytes, smallest_input) = (inputs.iter().sum::<u64>(), inputs.iter().copied().min().unwrap_or(0));

    // (w1) cold, (w2) warm: one fresh daemon (no shared tier) per repetition.
    let (mut nv, mut local, mut cold, mut warm) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut cold_bytes, mut warm_bytes) = ((0, 0), (0, 0));
    let (mut identical, mut served) = (true, true);
    for _ in 0..reps {
        nv.push(timed(&real_nvlink(), &args(LTO, &o("w.nvlink")), work, &[]).wall);
        // The same cold link through a local daemon (unix socket): what the
        // WAN adds is the difference.
        let d = fresh_daemon(corpus);
        local.push(timed(&shim(), &args(LTO, &o("w.local")), work, &d.shim_env()).wall);
        identical &= same(&o("w.nvlink"), &o("w.local"));
        drop(d);
        let (d, addr) = replica(false);
        // Libraries loaded, as in (a): one tiny link first.
        assert!(timed(&shim(), &args(TINY, &o("w.warmup")), corpus, &shim_env(&addr)).ok);
        let (t, up, down) = remote(LTO, &o("w.cold"), &addr);
        cold.push(t);
        cold_bytes = (up, down);
        let (t, up, down) = remote(LTO, &o("w.warm"), &addr);
        warm.push(t);
        warm_bytes = (up, down);
        served &= d.stat("fallbacks") == 0 && d.stat("cache_hits") >= 1;
        identical &= same(&o("w.nvlink"), &o("w.cold")) && same(&o("w.nvlink"), &o("w.warm"));
    }
    let how = if served { "" } else { " (the daemon declined: the shim ran nvlink)" };
    let nv = median(nv);
    report.row("(w1) cold LTO link, local daemon (reference)", nv, median(local.clone()), identical, "");
    report.row("(w1) cold LTO link, remote over the WAN", nv, median(cold.clone()), identical, how);
    report.row("(w2) the same LTO link again, remote (warm)", nv, median(warm.clone()), identical, how);

    // (w3) 64 concurrent shims on three replicas, lists rotated.
    let replicas: Vec<(Daemon, String)> = (0..3).map(|_| replica(true)).collect();
    for (_, addr) in &replicas {
        assert!(timed(&shim(), &args(TINY, &o("w.warmup")), corpus, &shim_env(addr)).ok);
    }
    let links = burst_links(16);
    let n = 64;
    let burst = |remote: bool| -> Vec<Duration> {
        std::thread::scope(|s| {
            let hs: Vec<_> = (0..n)
                .map(|i| {
                    let link = &links[i % links.len()];
                    let dst = o(&format!("w3.{i}.{}", if remote { "nvlinkd" } else { "nvlink" }));
                    let order: Vec<&str> = (0..3).map(|k| replicas[(i + k) % 3].1.as_str()).collect();
                    let env = if remote { shim_env(&order.join(",")) } else { Vec::new() };
                    let prog = if remote { shim() } else { real_nvlink() };
                    s.spawn(move || {
                        let t = timed(&prog, &args(link, &dst), work, &env);
                        assert!(t.ok, "burst link failed: {link}");
                        t.wall
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().expect("burst thread")).collect()
        })
    };
    let nearby = burst(false);
    let before = wan.wire_bytes();
    let far = burst(true);
    let after = wan.wire_bytes();
    let identical = (0..n).all(|i| same(&o(&format!("w3.{i}.nvlink")), &o(&format!("w3.{i}.nvlinkd"))));
    let note = format!(" ({} distinct links)", links.len());
    report.row(
        "(w3) 64 shims on 3 replicas, p50",
        percentile(nearby.clone(), 0.5),
        percentile(far.clone(), 0.5),
        identical,
        &note,
    );
    report.row("(w3) 64 shims on 3 replicas, p99", percentile(nearby, 0.99), percentile(far, 0.99), identical, &note);
    wan.leave_client();

    let kib = |b: u64| b as f64 / 1024.0;
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!("\n(w) bytes on the wire and latency, {}", wan.describe());
    println!(
        "  LTO link inputs (6 objects, libcudadevrt.a):  {:>10.1} KiB (smallest {:.1} KiB)",
        kib(input_bytes),
        kib(smallest_input)
    );
    println!(
        "  (w1) cold, up / down:                         {:>10.1} KiB / {:.1} KiB",
        kib(cold_bytes.0),
        kib(cold_bytes.1)
    );
    println!(
        "  (w2) warm, up / down:                         {:>10.1} KiB / {:.1} KiB",
        kib(warm_bytes.0),
        kib(warm_bytes.1)
    );
    let (w2, rtt) = (ms(median(warm)), 20.0);
    println!(
        "  (w2) warm relink: {w2:.1} ms = {:.1} RTT (target < 4 RTT + 10 ms = {:.0} ms); inputs sent: {}",
        w2 / rtt,
        4.0 * rtt + 10.0,
        // Fewer bytes up than the smallest input: no input went up whole.
        if warm_bytes.0 < smallest_input { "no" } else { "yes" }
    );
    println!(
        "  (w1) cold remote / local nvlink: {:.2}x (target <= 1.2x); remote / local daemon: {:.2}x",
        median(cold.clone()).as_secs_f64() / nv.as_secs_f64(),
        median(cold).as_secs_f64() / median(local).as_secs_f64()
    );
    println!(
        "  (w3) per link, up / down:                     {:>10.1} KiB / {:.1} KiB",
        kib((after.0 - before.0) / n as u64),
        kib((after.1 - before.1) / n as u64)
    );
    for (k, (d, _)) in replicas.iter().enumerate() {
        let pid = d.pid().unwrap_or(0);
        let s = d.stats();
        println!(
            "  (w3) replica {k}: {} links ({} hits, {} from the tier), daemon peak RSS {} KiB, with workers now {} KiB",
            s["requests"],
            s["cache_hits"],
            s["remote_cache_hits"],
            proc_kb(pid, "VmHWM"),
            tree_rss_kb(pid)
        );
    }
}
