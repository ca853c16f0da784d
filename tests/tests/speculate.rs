//! Speculative links: the other archs of a multi-arch nvcc step linked ahead of
//! nvcc's calls (`--no-speculate` turns it off), relinks after a watched input
//! changed (`serve --watch`, debounced), and `nvlinkd watch`. Every result a
//! speculative link prepared is compared, when the real call takes it from the
//! cache, with the real nvlink's on the same inputs.

use std::io::BufRead;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nvlinkd_tests::compare;
use nvlinkd_tests::corpus;
use nvlinkd_tests::daemon::Daemon;
use nvlinkd_tests::env::{cuda_home, nvlinkd, real_nvlink, shim, TempDir};
use nvlinkd_tests::events::Events;
use nvlinkd_tests::run::{run, Invocation, Run};

fn same(what: &str, expected: &Run, actual: &Run) {
    let cmp = compare::runs(expected, actual);
    assert!(cmp.problems.is_empty() && cmp.identical, "{what}: {:?}", cmp.problems);
}

/// Wait until `cond` holds (polling the daemon), failing after a minute.
fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// nvcc's device link for one arch of a three-arch build (`-report-arch`, the
/// arch in `--arch` and in the output's name, the `.reg.c` file shared by the
/// calls of one step; nvcc numbers its temporary files, so the names differ by
/// more than the arch).
fn nvcc_link(lto: bool, sm: u32, n: u32, reg: &Path) -> String {
    let (objs, lto_opts) = if lto {
        ("xcall_main_lto3.o xcall_loop_lto3.o", " -dlto -nvvmpath={NVVM}")
    } else {
        ("xcall_main_3arch.o xcall_loop_3arch.o livedead_3arch.o", "")
    };
    format!(
        "-m64 --arch=sm_{sm} --register-link-binaries={reg}/d.reg.c -L{{L}}/stubs -L{{L}} -cpu-arch=X86_64 \
         -report-arch{lto_opts} {objs} -lcudadevrt -o {{OUT}}/tmpxft_00001-{n}_d.compute_{sm}.cubin --host-ccbin gcc",
        reg = reg.display()
    )
}

/// The first arch's link through the shim starts the others speculatively;
/// nvcc's call for the second arch is then served from that link (a
/// speculative hit), byte-identical to nvlink's, `.reg.c` included.
#[test]
fn other_archs_of_a_multi_arch_link_are_linked_ahead() {
    let dir = corpus::dir();
    let d = Daemon::start();
    let mut events = Events::follow(&d);
    for lto in [false, true] {
        let tag = if lto { "dlto" } else { "dlink" };
        // The real nvlink, as nvcc runs it: sm_80 then sm_90 with one .reg.c.
        let (real_reg, reg) = (TempDir::new("spec-reg-real"), TempDir::new("spec-reg"));
        let (out80, out90) = (TempDir::new("spec-80"), TempDir::new("spec-90"));
        let first = |reg: &Path| Invocation::templated(&nvcc_link(lto, 80, 5, reg), dir, &out80);
        let second = |reg: &Path| Invocation::templated(&nvcc_link(lto, 90, 6, reg), dir, &out90);
        let expected80 = run(&real_nvlink(), &first(real_reg.path()), &[]);
        let expected90 = run(&real_nvlink(), &second(real_reg.path()), &[]);
        assert_eq!((expected80.code, expected90.code), (0, 0), "{tag}: nvlink failed: {expected80:?}");

        let (started, finished) = (d.stat("speculative_links"), d.stat("speculative_finished"));
        same(tag, &expected80, &run(&shim(), &first(reg.path()), &d.shim_env()));
        // sm_100 and sm_90 are predicted from the objects' fatbins.
        wait_for("the speculative links", || d.stat("speculative_finished") >= finished + 2);
        assert_eq!(d.stat("speculative_links") - started, 2, "{tag}: sm_90 and sm_100 should be speculated");
        // Announced on the event stream as speculative background links.
        let started = events.wait(&format!("{tag}: the speculative sm_90 link"), |v| {
            let args = v["args"].as_array().map(|a| a.iter().filter_map(|x| x.as_str()).collect::<Vec<_>>());
            v["event"] == "link_started"
                && v["speculative"] == true
                && args
                    .is_some_and(|a| a.iter().any(|x| x.ends_with("compute_90.cubin")) && a.contains(&"-dlto") == lto)
        });
        assert_eq!(started["priority"], "background", "{tag}");
        let id = started["link"].as_u64().expect("link id");
        assert_eq!(events.of("link_finished", id)["exit_code"], 0, "{tag}: {:#?}", events.seen);

        let (hits, spec_hits) = (d.stat("cache_hits"), d.stat("speculative_hits"));
        same(tag, &expected90, &run(&shim(), &second(reg.path()), &d.shim_env()));
        assert_eq!(d.stat("cache_hits") - hits, 1, "{tag}: nvcc's sm_90 call was not a cache hit");
        assert_eq!(d.stat("speculative_hits") - spec_hits, 1, "{tag}: not served from the speculative link");
        assert_eq!(
            std::fs::read(real_reg.path().join("d.reg.c")).ok(),
            std::fs::read(reg.path().join("d.reg.c")).ok(),
            "{tag}: .reg.c differs from nvlink's"
        );
    }
    // Nothing speculative was written to the caller's files.
    let stray: Vec<_> = std::fs::read_dir(dir).unwrap().flatten().filter(|e| e.path().is_file()).collect();
    assert!(stray.iter().all(|e| !e.file_name().to_string_lossy().contains("tmpxft")), "speculation wrote a file");
}

#[test]
fn no_speculate_links_only_what_is_asked() {
    let dir = corpus::dir();
    let d = Daemon::start_with(&["--no-speculate"]);
    let reg = TempDir::new("nospec-reg");
    let (out80, out90) = (TempDir::new("nospec-80"), TempDir::new("nospec-90"));
    let first = Invocation::templated(&nvcc_link(false, 80, 5, reg.path()), dir, &out80);
    let second = Invocation::templated(&nvcc_link(false, 90, 6, reg.path()), dir, &out90);
    assert_eq!(run(&shim(), &first, &d.shim_env()).code, 0);
    let misses = d.stat("cache_misses");
    assert_eq!(run(&shim(), &second, &d.shim_env()).code, 0);
    assert_eq!(d.stat("cache_misses") - misses, 1, "the second arch should have been linked when asked");
    assert_eq!(d.stat("speculative_links"), 0, "--no-speculate still speculated");
}

/// A link of two objects in a directory of its own, whose `scale.o` the
/// tests replace by one compiled from a changed source (`dup/scale.o`).
struct Project {
    dir: TempDir,
    out: TempDir,
}

const LINK: &str = "--arch=sm_90 -L{L} accumulate.o scale.o -lcudadevrt -o {OUT}/out.cubin";

impl Project {
    fn new(tag: &str) -> Project {
        let dir = TempDir::new(tag);
        for f in ["accumulate.o", "scale.o"] {
            std::fs::copy(corpus::dir().join(f), dir.path().join(f)).unwrap();
        }
        Project { dir, out: TempDir::new(&format!("{tag}-out")) }
    }
    fn inv(&self) -> Invocation {
        Invocation::templated(LINK, self.dir.path(), &self.out)
    }
    /// What the real nvlink makes of the inputs as they are now.
    fn expected(&self) -> Run {
        let out = TempDir::new("watch-real");
        run(&real_nvlink(), &Invocation::templated(LINK, self.dir.path(), &out), &[])
    }
    /// Rewrite `scale.o` in place, as a compiler does.
    fn change_scale(&self, changed: bool) {
        let from = if changed { corpus::dir().join("dup/scale.o") } else { corpus::dir().join("scale.o") };
        std::fs::write(self.dir.path().join("scale.o"), std::fs::read(from).unwrap()).unwrap();
    }
}

/// With `--watch`, a changed input of a recent link is relinked in the
/// background; the build's next identical call is a hit with nvlink's bytes
/// for the changed input.
#[test]
fn watched_input_change_is_relinked_ahead() {
    let d = Daemon::start_with(&["--watch"]);
    let p = Project::new("watch");
    same("first link", &p.expected(), &run(&shim(), &p.inv(), &d.shim_env()));
    let finished = d.stat("speculative_finished");
    p.change_scale(true);
    wait_for("the relink", || d.stat("speculative_finished") > finished);
    let (hits, spec_hits) = (d.stat("cache_hits"), d.stat("speculative_hits"));
    let expected = p.expected();
    same("after the change", &expected, &run(&shim(), &p.inv(), &d.shim_env()));
    assert_eq!(d.stat("cache_hits") - hits, 1, "the link after the change was not a cache hit");
    assert_eq!(d.stat("speculative_hits") - spec_hits, 1, "not served from the relink");
}

/// Several writes in quick succession (a save, a compiler writing an object)
/// cause one relink, of the last contents.
#[test]
fn quick_writes_cause_one_relink() {
    let d = Daemon::start_with(&["--watch"]);
    let p = Project::new("debounce");
    assert_eq!(run(&shim(), &p.inv(), &d.shim_env()).code, 0);
    let (started, finished) = (d.stat("speculative_links"), d.stat("speculative_finished"));
    for i in 0..6 {
        p.change_scale(i % 2 == 1);
    }
    wait_for("the relink", || d.stat("speculative_finished") > finished);
    let spec_hits = d.stat("speculative_hits");
    same("after the writes", &p.expected(), &run(&shim(), &p.inv(), &d.shim_env()));
    assert_eq!(d.stat("speculative_hits") - spec_hits, 1, "the relink did not see the last contents");
    assert_eq!(d.stat("speculative_links") - started, 1, "six quick writes should cause one relink");
}

/// A change arriving while the relink of the previous one still runs cancels
/// that relink; the next relink links the newest contents.
#[test]
fn a_newer_change_cancels_the_running_relink() {
    // Every computed link pauses after its key: the first relink is still
    // running when the second change comes.
    let d = Daemon::start_env(&["--watch"], &[("NVLINKD_TEST_PAUSE_AFTER_KEY_MS", "3000")]);
    let p = Project::new("supersede");
    assert_eq!(run(&shim(), &p.inv(), &d.shim_env()).code, 0);
    let (started, finished) = (d.stat("speculative_links"), d.stat("speculative_finished"));
    // First change: another object entirely.
    std::fs::copy(corpus::dir().join("vars_def.o"), p.dir.path().join("scale.o")).unwrap();
    wait_for("the first relink to start", || d.stat("speculative_links") > started);
    p.change_scale(true);
    wait_for("both relinks to end", || d.stat("speculative_finished") >= finished + 2);
    assert_eq!(d.stat("speculative_cancelled"), 1, "the running relink was not cancelled by the newer change");
    let spec_hits = d.stat("speculative_hits");
    same("after both changes", &p.expected(), &run(&shim(), &p.inv(), &d.shim_env()));
    assert_eq!(d.stat("speculative_hits") - spec_hits, 1, "the newest contents were not relinked");
}

/// `nvlinkd watch` for a project, and its events.
struct WatchCmd {
    child: std::process::Child,
    events: std::sync::mpsc::Receiver<String>,
}

impl WatchCmd {
    fn start(d: &Daemon, p: &Project, env: &[(String, String)]) -> WatchCmd {
        WatchCmd::start_all(d, p, &[p.inv().args], env)
    }

    /// `nvlinkd watch -- A… -- B…` in the project's directory.
    fn start_all(d: &Daemon, p: &Project, targets: &[Vec<String>], env: &[(String, String)]) -> WatchCmd {
        let mut cmd = Command::new(nvlinkd());
        cmd.arg("watch").arg("--socket").arg(d.socket());
        for t in targets {
            cmd.arg("--").args(t);
        }
        let mut child = cmd
            .current_dir(p.dir.path())
            .env("CUDA_HOME", cuda_home())
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("nvlinkd watch");
        let (tx, events) = std::sync::mpsc::channel();
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        WatchCmd { child, events }
    }

    fn next_event(&self) -> serde_json::Value {
        let line = self.events.recv_timeout(Duration::from_secs(60)).expect("no event from nvlinkd watch");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"))
    }

    /// Ctrl-C ends it, successfully.
    fn interrupt(mut self) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let status = self.child.wait().unwrap();
        assert!(status.success(), "nvlinkd watch did not end cleanly on SIGINT: {status}");
    }
}

/// `nvlinkd watch -- <args>` links at once and rewrites the output when an
/// input changes, with nvlink's bytes; one JSON line per (re)link.
#[test]
fn nvlinkd_watch_keeps_the_output_fresh() {
    let d = Daemon::start();
    let p = Project::new("watchcmd");
    let w = WatchCmd::start(&d, &p, &[]);
    let output = p.out.path().join("out.cubin");
    let ev = w.next_event();
    assert_eq!((ev["event"].as_str(), ev["exit_code"].as_i64()), (Some("linked"), Some(0)), "{ev}");
    assert_eq!(std::fs::read(&output).ok().as_ref(), p.expected().files.get("out.cubin"), "first output");

    p.change_scale(true);
    let ev = w.next_event();
    assert_eq!(ev["event"].as_str(), Some("relinked"), "{ev}");
    let changed = ev["changed"].as_array().cloned().unwrap_or_default();
    assert!(changed.iter().any(|c| c.as_str().is_some_and(|c| c.ends_with("/scale.o"))), "{ev}");
    let expected = p.expected();
    assert!(expected.files.contains_key("out.cubin"));
    assert_eq!(std::fs::read(&output).ok().as_ref(), expected.files.get("out.cubin"), "output after the change");
    w.interrupt();
}

/// A link the daemon declines (here: past its per-link input budget) is run
/// by `nvlinkd watch` with the real nvlink, whose outputs it then has.
#[test]
fn nvlinkd_watch_runs_nvlink_when_the_daemon_declines() {
    let d = Daemon::start_with(&["--max-link-input", "1000"]);
    let p = Project::new("watchcmd-fallback");
    let env = [("NVLINKD_REAL_NVLINK".to_string(), real_nvlink().display().to_string())];
    let w = WatchCmd::start(&d, &p, &env);
    let ev = w.next_event();
    assert!(ev["fallback"] == true && ev["fallback_reason"].is_string() && ev["exit_code"].as_i64() == Some(0), "{ev}");
    let output = p.out.path().join("out.cubin");
    assert_eq!(std::fs::read(&output).ok().as_ref(), p.expected().files.get("out.cubin"), "nvlink's output");
    w.interrupt();
}

/// `nvlinkd watch` as the whole `--list`/`--forget` command, its stdout.
fn watch_cmd(d: &Daemon, args: &[&str]) -> (i32, String) {
    let out = Command::new(nvlinkd()).arg("watch").arg("--socket").arg(d.socket()).args(args).output().unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned())
}

/// One `nvlinkd watch` follows two links (`-- A… -- B…`); each line names
/// its target and its link id (the event stream's), in the events' engine
/// words, with the failing link's diagnostics in fields; the event stream
/// carries the same diagnostics for the watch's link.
#[test]
fn nvlinkd_watch_follows_several_links_with_ids_and_diagnostics() {
    let d = Daemon::start();
    let mut ev = Events::follow(&d);
    let p = Project::new("watch-two");
    std::fs::copy(corpus::dir().join("missing.o"), p.dir.path().join("missing.o")).unwrap();
    let good = p.inv().args;
    let bad: Vec<String> = ["--arch=sm_90", "missing.o", "-o"]
        .iter()
        .map(|s| s.to_string())
        .chain([p.dir.path().join("bad.cubin").display().to_string()])
        .collect();
    let w = WatchCmd::start_all(&d, &p, &[good, bad.clone()], &[]);
    let (a, b) = (w.next_event(), w.next_event());
    let (ok, failed) = if a["target"] == 0 { (a, b) } else { (b, a) };
    assert_eq!(
        (ok["target"].as_u64(), ok["exit_code"].as_i64(), ok["engine"].as_str()),
        (Some(0), Some(0), Some("in_process")),
        "{ok}"
    );
    assert_eq!((ok["schema"].as_u64(), ok["fallback"].as_bool()), (Some(1), Some(false)), "{ok}");
    assert_eq!(std::fs::read(p.out.path().join("out.cubin")).ok().as_ref(), p.expected().files.get("out.cubin"));
    let reference = TempDir::new("watch-two-ref");
    let expected = run(
        &real_nvlink(),
        &Invocation { args: bad, cwd: p.dir.path().to_owned(), env: Vec::new(), out_dir: reference.path().to_owned() },
        &[],
    );
    assert_eq!(failed["exit_code"].as_i64(), Some(expected.code as i64), "{failed}");
    let diag = &failed["diagnostics"][0];
    assert_eq!(
        (diag["code"].as_str(), diag["symbol"].as_str(), diag["object"].as_str()),
        (Some("undefined_reference"), Some("_Z14missing_symbolf"), Some("missing.o")),
        "{failed}"
    );
    assert!(String::from_utf8_lossy(&expected.stderr).contains(diag["message"].as_str().unwrap()), "{failed}");
    // The same link on the event stream: a watch link, with its diagnostic.
    let link = failed["link"].as_u64().expect("a link id");
    let started = ev.of("link_started", link);
    assert_eq!(
        (started["origin"].as_str(), started["speculative"].as_bool()),
        (Some("watch"), Some(true)),
        "{started}"
    );
    let d_ev = ev.of("diagnostic", link);
    assert_eq!(d_ev["symbol_demangled"].as_str(), Some("missing_symbol(float)"), "{d_ev}");
    assert_eq!(ev.of("link_finished", link)["exit_code"], failed["exit_code"]);
    // Both are followed recipes; --forget leaves followed recipes alone.
    let (code, list) = watch_cmd(&d, &["--list"]);
    assert_eq!(code, 0);
    let recipes: Vec<serde_json::Value> = list.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(recipes.len(), 2, "{list}");
    assert!(recipes.iter().all(|r| r["followed"] == true), "{list}");
    assert_eq!(watch_cmd(&d, &["--forget", "all"]).0, 0);
    assert_eq!(watch_cmd(&d, &["--list"]).1.lines().count(), 2);
    w.interrupt();
}

/// `serve --watch` remembers a build's link: `nvlinkd watch --list` shows it
/// (its id, directory, arguments, outputs, relinks) and `--forget ID` drops
/// it, so that a change no longer relinks it.
#[test]
fn nvlinkd_watch_lists_and_forgets_the_links_serve_watch_keeps_fresh() {
    let d = Daemon::start_with(&["--watch"]);
    let p = Project::new("watch-list");
    same("first link", &p.expected(), &run(&shim(), &p.inv(), &d.shim_env()));
    let (code, list) = watch_cmd(&d, &["--list"]);
    assert_eq!(code, 0, "{list}");
    let r: serde_json::Value = serde_json::from_str(list.lines().next().expect("a recipe")).unwrap();
    assert_eq!(r["cwd"].as_str(), Some(p.dir.path().to_str().unwrap()), "{r}");
    assert_eq!(r["args"].as_array().map(Vec::len), Some(p.inv().args.len()), "{r}");
    assert_eq!(r["outputs"][0].as_str(), Some(p.out.path().join("out.cubin").to_str().unwrap()), "{r}");
    assert_eq!((r["relinks"].as_u64(), r["followed"].as_bool()), (Some(0), Some(false)), "{r}");
    let finished = d.stat("speculative_finished");
    p.change_scale(true);
    wait_for("the relink", || d.stat("speculative_finished") > finished);
    let r: serde_json::Value = serde_json::from_str(watch_cmd(&d, &["--list"]).1.lines().next().unwrap()).unwrap();
    assert_eq!(r["relinks"].as_u64(), Some(1), "{r}");
    let id = r["id"].as_u64().unwrap().to_string();
    assert_eq!(watch_cmd(&d, &["--forget", &id]).0, 0);
    assert_eq!(watch_cmd(&d, &["--list"]).1, "", "forgotten");
    let started = d.stat("speculative_links");
    p.change_scale(false);
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(d.stat("speculative_links"), started, "a forgotten recipe was relinked");
    assert_ne!(watch_cmd(&d, &["--forget", "x"]).0, 0, "not an id");
}
