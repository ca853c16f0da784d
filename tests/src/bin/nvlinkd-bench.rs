//! `nvlinkd-bench`: nvlink and nvlinkd side by side, in one run, on one machine.
//!
//! Scenarios (medians of repetitions, ratios nvlink/nvlinkd):
//!   (a) cold LTO link of a CUB-heavy workload: nvlinkd with an empty cache vs
//!       nvlink, and vs nvlink with its best split option;
//!   (b) the same LTO link again (warm);
//!   (c) the LTO link after one unit's device code changed;
//!   (d) a tiny non-LTO link, warm (and (d0) with a cache-less daemon: the
//!       shim and daemon overhead against an nvlink process);
//!   (e) 8 concurrent distinct links through one daemon vs 8 nvlink processes;
//!   (f) peak memory of nvlink and of the daemon; daemon RSS after 10 and after
//!       1000 warm links;
//!   (g) a burst of 16 concurrent distinct links on a just-started daemon (no
//!       link before it) vs 16 concurrent nvlink processes: p50 latency and total;
//!   (h) the first link of a daemon the shim starts itself (no daemon running,
//!       auto-start included) vs nvlink;
//!   (i) the relink of recompiled but unchanged objects (the same sources
//!       compiled again: only nvcc's temporary file name differs), non-LTO as
//!       nvcc runs it (with a registration file) and LTO, after the link of the
//!       first compilation: a cache hit against nvlink's full link.
//! Every nvlinkd output is compared byte for byte with nvlink's.
//!
//!   nvlinkd-bench [REPS]        (scripts/bench.sh builds and runs it)

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
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn args(s: &str, out: &Path) -> Vec<String> {
    let tk = cuda_home().display().to_string();
    s.replace("{L}", &format!("{tk}/lib"))
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

/// Kibibytes of a /proc/<pid>/status field (VmRSS, VmHWM).
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

fn main() {
    let reps: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(3).max(1);
    let corpus = corpus::dir().clone();
    eprintln!("building the workload (once per machine)...");
    let work: PathBuf = corpus::workload().clone();
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let out = TempDir::new("bench");
    let o = |n: &str| out.path().join(n);
    let mut report = Report { rows: Vec::new(), all_identical: true };
    println!("nvlinkd-bench: {reps} repetitions, medians, {cpus} CPUs, toolkit {}", cuda_home().display());

    // `NVLINKD_BENCH_ONLY=fresh`: only the fresh-daemon rows (g) and (h);
    // `NVLINKD_BENCH_ONLY=recompiled`: only the rows (i).
    let only = std::env::var("NVLINKD_BENCH_ONLY").unwrap_or_default();
    if only == "recompiled" {
        recompiled_rows(&mut report, &corpus, &work, &o, reps);
        return print_report(&report, false, [0, 0, 0, 0]);
    }
    let only_fresh = only == "fresh";
    let (mut nv_rss, mut d_hwm, mut rss_10, mut rss_1000) = (0i64, 0u64, 0u64, 0u64);
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

        // (e) 8 concurrent distinct links through one daemon vs 8 nvlink processes.
        // Five pairs and three triples of units: eight distinct programs.
        let sets: [&[usize]; 8] = [&[1, 2], &[2, 3], &[3, 4], &[4, 5], &[5, 1], &[1, 2, 3], &[2, 3, 4], &[3, 4, 5]];
        let links: Vec<String> = sets
            .iter()
            .map(|set| {
                let tus: Vec<String> = set.iter().map(|t| format!("tu{t}.o")).collect();
                format!("--arch=sm_90 -L{{L}} {} transforms.o -lcudadevrt -o {{OUT}}", tus.join(" "))
            })
            .collect();
        let (mut p8, mut d8) = (Vec::new(), Vec::new());
        let mut identical = true;
        for _ in 0..reps {
            let d = fresh_daemon(&corpus);
            let run_all = |prog: &Path, env: &[(String, String)], tag: &str| {
                let t = Instant::now();
                std::thread::scope(|s| {
                    for (i, l) in links.iter().enumerate() {
                        let out = o(&format!("c{i}.{tag}"));
                        let work = &work;
                        s.spawn(move || assert!(timed(prog, &args(l, &out), work, env).ok, "concurrent link failed"));
                    }
                });
                t.elapsed()
            };
            d8.push(run_all(&shim(), &d.shim_env(), "nvlinkd"));
            p8.push(run_all(&real_nvlink(), &[], "nvlink"));
            for i in 0..links.len() {
                identical &= same(&o(&format!("c{i}.nvlink")), &o(&format!("c{i}.nvlinkd")));
            }
        }
        report.row("(e) 8 concurrent distinct links (cold cache)", median(p8), median(d8), identical, "");
    }

    // (g) a burst on a fresh daemon: 16 distinct cold links, all at once, on a
    // daemon that has linked nothing yet (toolkit not opened, nothing loaded).
    let mut burst: Vec<String> = Vec::new();
    for a in 1..=5 {
        for b in a + 1..=5 {
            burst.push(format!("tu{a}.o tu{b}.o"));
            for c in b + 1..=5 {
                burst.push(format!("tu{a}.o tu{b}.o tu{c}.o"));
            }
        }
    }
    let burst: Vec<String> = burst
        .into_iter()
        .take(16)
        .map(|tus| format!("--arch=sm_90 -L{{L}} {tus} transforms.o -lcudadevrt -o {{OUT}}"))
        .collect();
    let (mut p50_nv, mut p50_d, mut tot_nv, mut tot_d) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut identical = true;
    for _ in 0..reps {
        let run_all = |prog: &Path, env: &[(String, String)], tag: &str| {
            let t = Instant::now();
            let each: Vec<Duration> = std::thread::scope(|s| {
                let hs: Vec<_> = burst
                    .iter()
                    .enumerate()
                    .map(|(i, l)| {
                        let out = o(&format!("b{i}.{tag}"));
                        let work = &work;
                        s.spawn(move || {
                            let t = timed(prog, &args(l, &out), work, env);
                            assert!(t.ok, "burst link failed");
                            t.wall
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().expect("burst thread")).collect()
            });
            (median(each), t.elapsed())
        };
        let (p, t) = run_all(&real_nvlink(), &[], "nvlink");
        p50_nv.push(p);
        tot_nv.push(t);
        let d = Daemon::start();
        let (p, t) = run_all(&shim(), &d.shim_env(), "nvlinkd");
        p50_d.push(p);
        tot_d.push(t);
        drop(d);
        for i in 0..burst.len() {
            identical &= same(&o(&format!("b{i}.nvlink")), &o(&format!("b{i}.nvlinkd")));
        }
    }
    report.row("(g) 16-link burst on a fresh daemon, p50 latency", median(p50_nv), median(p50_d), identical, "");
    report.row("(g) 16-link burst on a fresh daemon, total", median(tot_nv), median(tot_d), identical, "");

    // (h) the first link of an auto-started daemon: no daemon runs on the
    // socket; the shim starts one (`nvlinkd start`) and links through it.
    let (mut nv_first, mut d_first) = (Vec::new(), Vec::new());
    let mut identical = true;
    for _ in 0..reps.max(5) {
        let home = TempDir::new("auto");
        let socket = home.path().join("sock");
        let env = vec![
            ("NVLINKD_SOCKET".to_string(), socket.display().to_string()),
            ("NVLINKD_CACHE_DIR".to_string(), home.path().join("cache").display().to_string()),
            ("NVLINKD_FALLBACK".to_string(), "never".to_string()),
            ("CUDA_HOME".to_string(), cuda_home().display().to_string()),
        ];
        nv_first.push(timed(&real_nvlink(), &args(TINY, &o("first.nvlink")), &corpus, &[]).wall);
        let t = timed(&shim(), &args(TINY, &o("first.nvlinkd")), &corpus, &env);
        assert!(t.ok, "first link through an auto-started daemon failed");
        d_first.push(t.wall);
        identical &= same(&o("first.nvlink"), &o("first.nvlinkd"));
        let _ = Command::new(nvlinkd_tests::env::nvlinkd()).arg("stop").arg("--socket").arg(&socket).output();
    }
    report.row("(h) first link of an auto-started daemon", median(nv_first), median(d_first), identical, "");

    if !only_fresh {
        recompiled_rows(&mut report, &corpus, &work, &o, reps);
    }
    print_report(&report, !only_fresh, [nv_rss as u64, d_hwm, rss_10, rss_1000]);
}

/// (i) Recompiled, unchanged: link the first compilation through the daemon,
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
        let row = format!("(i) {name} relink of recompiled unchanged objects");
        report.row(&row, median(nv), median(nvd), identical, if identical { " (a hit)" } else { " or not a hit" });
    }
}

fn print_report(report: &Report, memory: bool, [nv_rss, d_hwm, rss_10, rss_1000]: [u64; 4]) {
    println!("\n{:<52} {:>11} {:>11} {:>8}  output", "scenario", "nvlink", "nvlinkd", "ratio");
    for (name, a, b, note) in &report.rows {
        println!(
            "{:<52} {:>8.3} s {:>8.3} s {:>7.1}x  {}",
            name,
            a.as_secs_f64(),
            b.as_secs_f64(),
            a.as_secs_f64() / b.as_secs_f64(),
            note
        );
    }
    println!("ratio = nvlink time / nvlinkd time (above 1: nvlinkd is faster)");
    if memory {
        println!("\n(f) memory");
        println!("  nvlink peak RSS, LTO link:               {:>8} KiB", nv_rss);
        println!("  nvlinkd daemon peak RSS, cold LTO link:   {:>8} KiB", d_hwm);
        println!("  nvlinkd daemon RSS after 10 warm links:   {:>8} KiB", rss_10);
        println!("  nvlinkd daemon RSS after 1000 warm links: {:>8} KiB", rss_1000);
    }
    if !report.all_identical {
        eprintln!("some nvlinkd outputs differ from nvlink's");
        std::process::exit(1);
    }
}
