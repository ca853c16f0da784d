//! Parity on generated programs (`nvlinkd_tests::gen`): each seed's program is
//! compiled with the real nvcc, and each of its links runs through the real
//! nvlink and through shim + daemon (`NVLINKD_FALLBACK=never`): same exit
//! status, same stdout and stderr, output files equal (cubins up to
//! `.note.nv.tkinfo` at least).
//!
//! CI runs the fixed [`SEEDS`]. Soaks: `NVLINKD_GEN_PROGRAMS=N` runs N programs
//! from seed `NVLINKD_GEN_SEED_BASE` (default 1000, past the CI seeds) on
//! (`scripts/soak.sh N`). Repros: `NVLINKD_GEN_SEEDS=17,42` runs those seeds,
//! `NVLINKD_GEN_LINKS=nvcc-lto,archive` only the links of those names, and
//! `NVLINKD_GEN_KEEP=DIR` writes the sources of every program with a differing
//! link to `DIR/<seed>/`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use nvlinkd_tests::compare;
use nvlinkd_tests::daemon::Daemon;
use nvlinkd_tests::env::{real_nvlink, shim, TempDir};
use nvlinkd_tests::gen::{self, Program};
use nvlinkd_tests::run::{run, Invocation};

/// The CI programs: 19 programs, about 65 links (a few minutes on 2 cores,
/// much less with the objects of an earlier run), chosen from seeds 1..=90 for
/// their modes, link shapes and features, most linked in process. Among them,
/// one of each class the generator found differing before it was fixed:
/// dynamic shared memory with -lcudadevrt (8, 17: nvlinkd took libcudadevrt's
/// device runtime too), weak definitions in two objects beside a kernel
/// nobody launches (7, 40: string tables in another order), a kernel nobody
/// launches in -lineinfo objects (33, 42: kept), a unit whose kernels are all
/// dead beside a template kernel another unit defines first (35: the dead
/// kernels' names went after the unit's `.nv_debug.shared`, not before).
const SEEDS: &[u64] = &[2, 5, 7, 8, 16, 17, 21, 31, 33, 35, 40, 42, 44, 51, 56, 59, 64, 77, 79];

fn env_list(name: &str) -> Vec<String> {
    std::env::var(name)
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
}

fn seeds() -> Vec<u64> {
    let listed = env_list("NVLINKD_GEN_SEEDS");
    if !listed.is_empty() {
        return listed.iter().map(|s| s.parse().unwrap_or_else(|_| panic!("NVLINKD_GEN_SEEDS: {s:?}"))).collect();
    }
    match std::env::var("NVLINKD_GEN_PROGRAMS") {
        Ok(n) => {
            let n: u64 = n.trim().parse().expect("NVLINKD_GEN_PROGRAMS: a number");
            let base: u64 = std::env::var("NVLINKD_GEN_SEED_BASE")
                .map(|b| b.trim().parse().expect("NVLINKD_GEN_SEED_BASE: a number"))
                .unwrap_or(1000);
            (base..base + n).collect()
        }
        Err(_) => SEEDS.to_vec(),
    }
}

/// The engine that served the one link run between two reads of a daemon's
/// `stats --json`, with the routing reason when routed to the nvlink engine.
fn engine_between(before: &serde_json::Value, after: &serde_json::Value) -> String {
    let count = |v: &serde_json::Value| v.as_u64().unwrap_or(0);
    let mut engine = nvlinkd_tests::daemon::engine_between(before, after);
    if let Some(reasons) = after["routed"].as_object() {
        for (r, _) in reasons.iter().filter(|(r, n)| count(n) > count(&before["routed"][r.as_str()])) {
            engine.push_str(&format!(" ({r})"));
        }
    }
    engine
}

struct Outcome {
    seed: u64,
    link: String,
    args: String,
    dir: std::path::PathBuf,
    /// Which engine of the daemon served the link.
    engine: String,
    /// nvlink's exit status.
    code: i32,
    problems: Vec<String>,
}

#[test]
fn generated_programs_link_as_nvlink_links_them() {
    let programs: Vec<Program> = seeds().into_iter().map(gen::program).collect();
    let only = env_list("NVLINKD_GEN_LINKS");
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2);
    let dirs = gen::compile(&programs, threads);
    let links: Vec<(&Program, &std::path::PathBuf, &gen::Link)> = programs
        .iter()
        .zip(&dirs)
        .flat_map(|(p, d)| p.links.iter().map(move |l| (p, d, l)))
        .filter(|(_, _, l)| only.is_empty() || only.contains(&l.name))
        .collect();
    // One daemon per thread, one link at a time each, so that the change of
    // its counters tells which engine served it. Each checks itself against
    // nvlink before answering: a mismatch it finds is a difference too (its
    // answer, healed, would hide it).
    let daemons: Vec<Daemon> =
        (0..threads.min(4)).map(|_| Daemon::start_with(&["--no-speculate", "--verify=sync"])).collect();
    let outcomes = Mutex::new(Vec::new());
    let next = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for daemon in &daemons {
            let (links, outcomes, next) = (&links, &outcomes, &next);
            s.spawn(move || {
                while let Some(&(p, dir, link)) = links.get(next.fetch_add(1, Ordering::Relaxed)) {
                    let out = TempDir::new("gen");
                    let inv = Invocation::templated(&link.args, dir, &out);
                    let expected = run(&real_nvlink(), &inv, &[]);
                    let before = daemon.stats();
                    let actual = run(&shim(), &inv, &daemon.shim_env());
                    let after = daemon.stats();
                    let engine = engine_between(&before, &after);
                    let mut cmp = compare::runs(&expected, &actual);
                    if after["verify_mismatches"].as_u64() > before["verify_mismatches"].as_u64() {
                        cmp.problems.push(
                            "the daemon's verification found its in-process answer wrong (it answered nvlink's)".into(),
                        );
                    }
                    outcomes.lock().unwrap().push(Outcome {
                        seed: p.seed,
                        link: link.name.clone(),
                        args: link.args.clone(),
                        dir: dir.clone(),
                        engine,
                        code: expected.code,
                        problems: cmp.problems,
                    });
                }
            });
        }
    });
    let mut outcomes = outcomes.into_inner().unwrap();
    outcomes.sort_by(|a, b| (a.seed, &a.link).cmp(&(b.seed, &b.link)));
    let differ: Vec<&Outcome> = outcomes.iter().filter(|o| !o.problems.is_empty()).collect();
    let keep = std::env::var_os("NVLINKD_GEN_KEEP").map(std::path::PathBuf::from);
    for o in &differ {
        println!("\n== seed {} link {} ==\n{}", o.seed, o.link, o.problems.join("\n"));
        if let (Some(keep), Some(p)) = (&keep, programs.iter().find(|p| p.seed == o.seed)) {
            let _ = gen::write_sources(p, &keep.join(o.seed.to_string()));
        }
    }
    let repros: Vec<String> = differ
        .iter()
        .map(|o| {
            format!(
                "NVLINKD_GEN_SEEDS={} NVLINKD_GEN_LINKS={} cargo test -p nvlinkd-tests --test generated -- --nocapture  # in {}: nvlink {}",
                o.seed,
                o.link,
                o.dir.display(),
                o.args
            )
        })
        .collect();
    println!("\ngenerated programs' links:");
    for o in &outcomes {
        let verdict = if o.problems.is_empty() { "same" } else { "DIFFERS" };
        println!("  seed {:<6} {:<22} {:<8} exit {:<3} {}", o.seed, o.link, verdict, o.code, o.engine);
    }
    let in_process = outcomes.iter().filter(|o| o.engine == "in-process").count();
    let errors = outcomes.iter().filter(|o| o.code != 0).count();
    println!(
        "generated: {} programs, {} links, {} differ ({in_process} linked in process, {errors} failing in nvlink too)",
        programs.len(),
        outcomes.len(),
        differ.len()
    );
    assert_eq!(outcomes.len(), links.len(), "links not run");
    assert!(differ.is_empty(), "{} generated links differ from nvlink:\n{}", differ.len(), repros.join("\n"));
}
