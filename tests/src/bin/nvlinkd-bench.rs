//! `nvlinkd-bench`: nvlink and nvlinkd side by side, in one run, on one machine.
//!
//! Every scenario runs the real nvlink and the shim (through a private daemon)
//! alternately on the same inputs, reports medians and the ratio, and checks
//! that every nvlinkd output is byte-identical to nvlink's. Run it through
//! `scripts/bench.sh` (release build).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use nvlinkd_tests::corpus;
use nvlinkd_tests::daemon::Daemon;
use nvlinkd_tests::env::{cuda_home, real_nvlink, shim, TempDir};

struct Measured {
    name: String,
    nvlink: Duration,
    nvlinkd: Duration,
    identical: bool,
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn run_once(program: &Path, args: &[String], cwd: &Path, env: &[(String, String)]) -> (Duration, bool) {
    let t = Instant::now();
    let st = Command::new(program)
        .args(args)
        .current_dir(cwd)
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .status()
        .expect("run");
    (t.elapsed(), st.success())
}

/// Alternate nvlink and the shim `reps` times on `args` (with `{OUT}` replaced
/// by a per-side output path); compare the last outputs.
fn pair(name: &str, args: &str, reps: usize, cwd: &Path, daemon: &Daemon, warm: bool) -> Measured {
    let out = TempDir::new("bench");
    let side = |tag: &str| -> Vec<String> {
        let lib = cuda_home().join("lib").display().to_string();
        let o = out.path().join(tag).display().to_string();
        args.replace("{L}", &lib).replace("{OUT}", &o).split_whitespace().map(String::from).collect()
    };
    let (a, b) = (side("nvlink.out"), side("nvlinkd.out"));
    let env = daemon.shim_env();
    if warm {
        run_once(&shim(), &b, cwd, &env);
        run_once(&real_nvlink(), &a, cwd, &[]);
    }
    let (mut ta, mut tb) = (Vec::new(), Vec::new());
    for _ in 0..reps {
        let (d, ok) = run_once(&real_nvlink(), &a, cwd, &[]);
        assert!(ok, "nvlink failed: {name}");
        ta.push(d);
        let (d, ok) = run_once(&shim(), &b, cwd, &env);
        assert!(ok, "nvlinkd failed: {name}");
        tb.push(d);
    }
    let identical =
        std::fs::read(out.path().join("nvlink.out")).ok() == std::fs::read(out.path().join("nvlinkd.out")).ok();
    Measured { name: name.into(), nvlink: median(ta), nvlinkd: median(tb), identical }
}

/// Milliseconds from the shim's main() to its request being on the socket,
/// from the shim's own `NVLINKD_TIMING` marks.
fn shim_startup(cwd: &Path, daemon: &Daemon, reps: usize) -> f64 {
    let mut v = Vec::new();
    for _ in 0..reps {
        let out = Command::new(shim())
            .arg("--version")
            .current_dir(cwd)
            .envs(daemon.shim_env())
            .env("NVLINKD_TIMING", "1")
            .output()
            .expect("shim");
        let err = String::from_utf8_lossy(&out.stderr);
        if let Some(ms) = err
            .lines()
            .find(|l| l.ends_with("request sent"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|t| t.parse::<f64>().ok())
        {
            v.push(ms);
        }
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn main() {
    let reps: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(21);
    let dir = corpus::dir().clone();
    let daemon = Daemon::start();
    println!("nvlinkd-bench: {reps} repetitions per side, medians; toolkit {}", cuda_home().display());
    let rows = vec![
        pair("nvlink --version (no link: process + round trip)", "--version", reps, &dir, &daemon, true),
        pair("tiny non-LTO link, warm daemon", "--arch=sm_90 accumulate.o scale.o -o {OUT}", reps, &dir, &daemon, true),
        pair(
            "libcudadevrt link (dynamic parallelism), warm",
            "--arch=sm_90 -L{L} cdp.o -lcudadevrt -o {OUT}",
            reps,
            &dir,
            &daemon,
            true,
        ),
    ];
    println!("\n{:<48} {:>12} {:>12} {:>8}  output", "scenario", "nvlink", "nvlinkd", "ratio");
    let mut all_identical = true;
    for r in &rows {
        let ratio = r.nvlink.as_secs_f64() / r.nvlinkd.as_secs_f64();
        all_identical &= r.identical;
        println!(
            "{:<48} {:>9.2} ms {:>9.2} ms {:>7.2}x  {}",
            r.name,
            r.nvlink.as_secs_f64() * 1e3,
            r.nvlinkd.as_secs_f64() * 1e3,
            ratio,
            if r.identical { "byte-identical" } else { "DIFFERS" }
        );
    }
    println!("\nratio = nvlink time / nvlinkd time (above 1: nvlinkd is faster)");
    println!("shim startup to first byte sent (median, from main()): {:.2} ms", shim_startup(&dir, &daemon, reps));
    println!("daemon stats: {}", daemon.control("stats").map(|(_, s)| s).unwrap_or_default().trim());
    if !all_identical {
        eprintln!("some nvlinkd outputs differ from nvlink's");
        std::process::exit(1);
    }
}
