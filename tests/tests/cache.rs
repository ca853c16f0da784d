//! The whole-link cache: counters, content keys (renames hit, changes miss),
//! persistence across restarts, recovery from damaged entries, single flight,
//! and two daemons on one cache directory; the per-module JIT and the two LTO
//! steps (NVVM, ptxas) cached on their own. Every result is compared with the
//! real nvlink's.

use std::time::Duration;

use nvlinkd_tests::compare;
use nvlinkd_tests::corpus;
use nvlinkd_tests::daemon::Daemon;
use nvlinkd_tests::env::{real_nvlink, shim, TempDir};
use nvlinkd_tests::run::{run, Invocation, Run};

fn inv(args: &str, cwd: &std::path::Path, out: &TempDir) -> Invocation {
    Invocation::templated(args, cwd, out)
}

const LINK: &str =
    "--arch=sm_90 -L{L} --register-link-binaries={OUT}/reg.c cdp.o accumulate.o scale.o -lcudadevrt -o {OUT}/out.cubin";

fn same(expected: &Run, actual: &Run) {
    let cmp = compare::runs(expected, actual);
    assert!(cmp.problems.is_empty() && cmp.identical, "{:?}", cmp.problems);
}

#[test]
fn hits_misses_and_content_keys() {
    let d = Daemon::start();
    let dir = corpus::dir();
    let out = TempDir::new("c1");
    let expected = run(&real_nvlink(), &inv(LINK, dir, &out), &[]);
    let (h0, m0) = (d.stat("cache_hits"), d.stat("cache_misses"));
    same(&expected, &run(&shim(), &inv(LINK, dir, &out), &d.shim_env()));
    assert_eq!((d.stat("cache_hits") - h0, d.stat("cache_misses") - m0), (0, 1), "first link must miss");
    same(&expected, &run(&shim(), &inv(LINK, dir, &out), &d.shim_env()));
    assert_eq!(d.stat("cache_hits") - h0, 1, "same link again must hit");

    // Renamed and touched copies of the inputs, in another directory: a hit.
    let copy = TempDir::new("c1-copy");
    for (from, to) in [("cdp.o", "dyn.o"), ("accumulate.o", "acc.o"), ("scale.o", "sc.o")] {
        std::fs::copy(dir.join(from), copy.path().join(to)).unwrap();
    }
    let renamed = LINK.replace("cdp.o accumulate.o scale.o", "dyn.o acc.o sc.o");
    let expected_renamed = run(&real_nvlink(), &inv(&renamed, copy.path(), &out), &[]);
    same(&expected_renamed, &run(&shim(), &inv(&renamed, copy.path(), &out), &d.shim_env()));
    assert_eq!(d.stat("cache_hits") - h0, 2, "renamed, touched inputs must hit");

    // Option order nvlink ignores does not matter either.
    let reordered = "-L{L} -lcudadevrt cdp.o accumulate.o scale.o --arch sm_90 -o {OUT}/out.cubin --register-link-binaries {OUT}/reg.c";
    same(&expected, &run(&shim(), &inv(reordered, dir, &out), &d.shim_env()));
    assert_eq!(d.stat("cache_hits") - h0, 3, "reordered options must hit");

    // A changed input misses.
    std::fs::copy(dir.join("vars_def.o"), copy.path().join("sc.o")).unwrap();
    let m1 = d.stat("cache_misses");
    let expected_changed = run(&real_nvlink(), &inv(&renamed, copy.path(), &out), &[]);
    same(&expected_changed, &run(&shim(), &inv(&renamed, copy.path(), &out), &d.shim_env()));
    assert_eq!(d.stat("cache_misses") - m1, 1, "a changed input must miss");
}

#[test]
fn cache_survives_restart_and_recovers_from_damage() {
    let mut d = Daemon::start();
    let dir = corpus::dir();
    let out = TempDir::new("c2");
    let link = "--arch=sm_90 tmpl_a.o tmpl_b.o -o {OUT}/out.cubin";
    let expected = run(&real_nvlink(), &inv(link, dir, &out), &[]);
    same(&expected, &run(&shim(), &inv(link, dir, &out), &d.shim_env()));
    d.stop();
    d.spawn(&[]);
    same(&expected, &run(&shim(), &inv(link, dir, &out), &d.shim_env()));
    assert_eq!(d.stat("cache_hits"), 1, "restarted daemon did not find the entry on disk");

    // Damage every entry on disk, restart (empty memory tier): the damaged
    // entries are misses, recomputed correctly, and replaced.
    d.stop();
    let mut damaged = 0;
    for shard in std::fs::read_dir(d.cache_dir().join("v2")).unwrap().flatten() {
        for f in std::fs::read_dir(shard.path()).unwrap().flatten() {
            let mut b = std::fs::read(f.path()).unwrap();
            let n = b.len();
            b[n / 2] ^= 0xff;
            b.truncate(n - 1);
            std::fs::write(f.path(), b).unwrap();
            damaged += 1;
        }
    }
    assert!(damaged > 0);
    d.spawn(&[]);
    same(&expected, &run(&shim(), &inv(link, dir, &out), &d.shim_env()));
    assert_eq!(d.stat("cache_hits"), 0, "a damaged entry was served");
    assert!(d.stat("cache_corrupt_entries") >= 1);
    same(&expected, &run(&shim(), &inv(link, dir, &out), &d.shim_env()));
    assert_eq!(d.stat("cache_hits"), 1, "the recomputed entry was not stored again");
}

#[test]
fn concurrent_identical_links_are_computed_once() {
    // Every link waits before starting, so all of them are in flight together.
    let d = Daemon::start_env(&[], &[("NVLINKD_TEST_SLOW_LINK_MS", "500")]);
    let dir = corpus::dir();
    let link = "--arch=sm_90 -L{L} cdp.o -lcudadevrt -o {OUT}/out.cubin";
    let ref_out = TempDir::new("c3-ref");
    let expected = run(&real_nvlink(), &inv(link, dir, &ref_out), &[]);
    let env = d.shim_env();
    // The shims start together (the slow link keeps them overlapping).
    let start = std::sync::Barrier::new(4);
    let results: Vec<Run> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|_| {
                s.spawn(|| {
                    let out = TempDir::new("c3");
                    start.wait();
                    run(&shim(), &inv(link, dir, &out), &env)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for r in &results {
        same(&expected, r);
    }
    let computed = d.stat("in_process") + d.stat("nvlink_process");
    assert_eq!(computed, 1, "4 identical concurrent links computed {computed} times");
}

#[test]
fn two_daemons_share_one_cache_directory() {
    let a = Daemon::start();
    // A second daemon on its own socket, over the first one's cache directory.
    let b = Daemon::start_sharing(&a);
    let dir = corpus::dir();
    let links = [
        "--arch=sm_90 accumulate.o scale.o -o {OUT}/out.cubin",
        "--arch=sm_90 vars_def.o vars_use.o -o {OUT}/out.cubin",
        "--arch=sm_90 tmpl_a.o tmpl_b.o -o {OUT}/out.cubin",
        "--arch=sm_90 -Llib mathlib_main.o -ldevmath -o {OUT}/out.cubin",
    ];
    let expected: Vec<Run> = links
        .iter()
        .map(|l| {
            let out = TempDir::new("c4-ref");
            run(&real_nvlink(), &inv(l, dir, &out), &[])
        })
        .collect();
    for round in 0..3 {
        // Every link of a round, through both daemons, starts at once.
        let start = &std::sync::Barrier::new(2 * links.len());
        std::thread::scope(|s| {
            for (i, l) in links.iter().enumerate() {
                for dmn in [&a, &b] {
                    let expected = &expected[i];
                    s.spawn(move || {
                        let out = TempDir::new("c4");
                        start.wait();
                        same(expected, &run(&shim(), &inv(l, dir, &out), &dmn.shim_env()));
                    });
                }
            }
        });
        std::thread::sleep(Duration::from_millis(50 * round));
    }
    assert_eq!(a.stat("cache_corrupt_entries") + b.stat("cache_corrupt_entries"), 0);
    assert!(b.stat("cache_hits") > 0 && a.stat("cache_hits") > 0);
}

/// A whole-link miss whose pieces did not change reuses them: the LTO link
/// again with a registration file (another whole-link key) skips NVVM and
/// ptxas; PTX compiled at link time is reused by the next link that has it.
#[test]
fn lto_steps_and_jit_modules_are_cached_on_their_own() {
    let d = Daemon::start();
    let dir = corpus::dir();
    let out = TempDir::new("c-levels");
    let lto = "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} accumulate_lto.o scale_lto.o -lcudadevrt -o {OUT}/out.cubin";
    let expected = run(&real_nvlink(), &inv(lto, dir, &out), &[]);
    same(&expected, &run(&shim(), &inv(lto, dir, &out), &d.shim_env()));
    assert_eq!((d.stat("nvvm_misses"), d.stat("ptxas_misses")), (1, 1), "cold LTO runs both steps");
    let registered = format!("{lto} --register-link-binaries={{OUT}}/reg.c");
    let expected = run(&real_nvlink(), &inv(&registered, dir, &out), &[]);
    let m0 = d.stat("cache_misses");
    same(&expected, &run(&shim(), &inv(&registered, dir, &out), &d.shim_env()));
    assert_eq!(d.stat("cache_misses") - m0, 1, "another whole link must miss");
    assert_eq!((d.stat("nvvm_hits"), d.stat("ptxas_hits")), (1, 1), "unchanged LTO steps must be reused");
    assert_eq!((d.stat("nvvm_misses"), d.stat("ptxas_misses")), (1, 1));

    // PTX compiled at link time: the module is compiled once for both links.
    let jit = "--arch=sm_90 saxpy_ptx.o -o {OUT}/jit.cubin";
    let jit2 = "--arch=sm_90 saxpy_ptx.o accumulate.o scale.o -o {OUT}/jit.cubin";
    for args in [jit, jit2] {
        let expected = run(&real_nvlink(), &inv(args, dir, &out), &[]);
        same(&expected, &run(&shim(), &inv(args, dir, &out), &d.shim_env()));
    }
    assert_eq!((d.stat("jit_misses"), d.stat("jit_hits")), (1, 1), "the PTX module must be compiled once");
}

/// `-l` is resolved once, by the rule the link itself uses, and the key
/// covers every file that decided it: an incompatible `libvd.a` found first
/// is skipped (nvlink's warning) and the next one links; when that next one
/// changes (here: becomes incompatible too, so that nvlink finds no library
/// and reports the undefined references), the link misses and gives
/// nvlink's new answer instead of the old output.
#[test]
fn a_library_found_past_an_incompatible_one_is_in_the_key() {
    let d = Daemon::start();
    let dir = TempDir::new("lib-skip");
    let (first, second) = (dir.path().join("a"), dir.path().join("b"));
    for sub in [&first, &second] {
        std::fs::create_dir_all(sub).unwrap();
    }
    std::fs::copy(corpus::dir().join("vars_use.o"), dir.path().join("vars_use.o")).unwrap();
    std::fs::copy(corpus::dir().join("vars_def.o"), second.join("vars_def.o")).unwrap();
    std::fs::write(first.join("notes.txt"), b"not an object, so not this machine's archive\n").unwrap();
    std::fs::write(second.join("notes.txt"), b"neither is this one, of the second directory\n").unwrap();
    let ar = |d: &std::path::Path, member: &str| {
        let ok = std::process::Command::new("ar").args(["rcs", "libvd.a", member]).current_dir(d).status().unwrap();
        assert!(ok.success());
    };
    ar(&first, "notes.txt");
    ar(&second, "vars_def.o");
    let out = TempDir::new("lib-skip-out");
    let args = "--arch=sm_90 vars_use.o -La -Lb -lvd -o {OUT}/out.cubin";
    let expected = run(&real_nvlink(), &inv(args, dir.path(), &out), &[]);
    assert_eq!(expected.code, 0, "{}", String::from_utf8_lossy(&expected.stderr));
    assert!(String::from_utf8_lossy(&expected.stderr).contains("Skipping incompatible"), "not the case wanted");
    same(&expected, &run(&shim(), &inv(args, dir.path(), &out), &d.shim_env()));

    // The library that linked becomes incompatible: nvlink finds none.
    std::fs::remove_file(second.join("libvd.a")).unwrap();
    ar(&second, "notes.txt");
    let changed = run(&real_nvlink(), &inv(args, dir.path(), &out), &[]);
    assert_ne!(changed.code, 0, "{}", String::from_utf8_lossy(&changed.stderr));
    let hits = d.stat("cache_hits");
    same(&changed, &run(&shim(), &inv(args, dir.path(), &out), &d.shim_env()));
    assert_eq!(d.stat("cache_hits"), hits, "served from the cache: the key missed the library that changed");
}

/// What nvlink decides by a file's name or identity rather than its contents
/// is in the key: an input's extension (`acc` without a dot is skipped,
/// `acc.o` linked), one archive named twice (a symlink: taken once) against
/// two copies (both taken), and a registration file that is the output file.
/// Each pair has equal contents and different answers; the second link of
/// each pair must not be the first one's cache hit.
#[test]
fn what_nvlink_decides_by_name_or_file_is_in_the_key() {
    let d = Daemon::start();
    let dir = TempDir::new("by-name");
    let corpus = corpus::dir();
    std::fs::copy(corpus.join("accumulate.o"), dir.path().join("acc.o")).unwrap();
    std::fs::copy(corpus.join("accumulate.o"), dir.path().join("acc")).unwrap();
    std::fs::copy(corpus.join("scale.o"), dir.path().join("scale.o")).unwrap();
    let ar = std::process::Command::new("ar").args(["rcs", "libacc.a", "acc.o"]).current_dir(dir.path()).status();
    assert!(ar.unwrap().success());
    std::os::unix::fs::symlink("libacc.a", dir.path().join("link.a")).unwrap();
    std::fs::copy(dir.path().join("libacc.a"), dir.path().join("copy.a")).unwrap();
    let pairs = [
        ("--arch=sm_90 scale.o acc -o {OUT}/out.cubin", "--arch=sm_90 scale.o acc.o -o {OUT}/out.cubin"),
        (
            "--arch=sm_90 scale.o libacc.a link.a -o {OUT}/out.cubin",
            "--arch=sm_90 scale.o libacc.a copy.a -o {OUT}/out.cubin",
        ),
        (
            "--arch=sm_90 scale.o acc.o --register-link-binaries={OUT}/out.cubin -o {OUT}/out.cubin",
            "--arch=sm_90 scale.o acc.o --register-link-binaries={OUT}/reg.c -o {OUT}/out.cubin",
        ),
    ];
    for (first, second) in pairs {
        let runs: Vec<(Run, Run)> = [first, second]
            .iter()
            .map(|args| {
                let (a, b) = (TempDir::new("by-name-nvlink"), TempDir::new("by-name-shim"));
                (
                    run(&real_nvlink(), &inv(args, dir.path(), &a), &[]),
                    run(&shim(), &inv(args, dir.path(), &b), &d.shim_env()),
                )
            })
            .collect();
        let differ = compare::runs(&runs[0].0, &runs[1].0);
        assert!(!(differ.problems.is_empty() && differ.identical), "nvlink answers {first} and {second} alike");
        for (expected, actual) in &runs {
            same(expected, actual);
        }
    }
}
