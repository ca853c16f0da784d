//! The event stream as an editor uses it (`nvlinkd events --json`,
//! docs/events.md): links cancelled by their id, progress of long phases and
//! phases cut off, filters on the server, and diagnostics in fields — each
//! against a real daemon and the real toolkit's objects.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use nvlinkd_tests::corpus;
use nvlinkd_tests::daemon::Daemon;
use nvlinkd_tests::env::{nvlinkd, real_nvlink, shim, TempDir};
use nvlinkd_tests::events::Events;
use nvlinkd_tests::run::{run, Invocation};
use serde_json::Value;

const LTO: &str =
    "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} accumulate_lto.o scale_lto.o -lcudadevrt -o {OUT}/out.cubin";

fn inv(args: &str, cwd: &Path, out: &TempDir) -> Invocation {
    Invocation::templated(args, cwd, out)
}

/// `nvlinkd cancel ID`: its exit status and output.
fn cancel(d: &Daemon, link: u64) -> (i32, String) {
    let out =
        Command::new(nvlinkd()).arg("cancel").arg("--socket").arg(d.socket()).arg(link.to_string()).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), text)
}

/// A link held inside a phase (its worker waits while a file exists) is
/// reported with `phase_progress` after a second; `nvlinkd cancel ID` stops
/// it: its shim fails with one nvlink-style line and runs no nvlink, the cut
/// phase ends `aborted`, the link ends `link_cancelled` (`requested`), and it
/// counts as cancelled, not as a fallback.
#[test]
fn a_link_cancelled_by_its_id_ends_its_long_phase_aborted() {
    let work = TempDir::new("cancel-id");
    let hold = work.path().join("hold");
    std::fs::write(&hold, b"").unwrap();
    let d = Daemon::start_env(&[], &[("NVLINKD_TEST_WORKER_HOLD", &hold.display().to_string())]);
    let mut ev = Events::follow(&d);
    let out = TempDir::new("cancel-id-out");
    let link = inv(LTO, corpus::dir(), &out);
    let shim_run = Command::new(shim())
        .args(&link.args)
        .current_dir(&link.cwd)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(d.fallback_env().iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let id = ev.started("out.cubin");
    let progress = ev.wait("phase_progress", |v| v["event"] == "phase_progress" && v["link"] == id);
    assert!(progress["elapsed_ms"].as_u64() >= Some(900), "{progress}");
    let phase = progress["phase"].as_str().unwrap().to_owned();
    assert!(ev.all("phase_started", id).iter().any(|p| p["phase"] == phase.as_str()), "progress before the start");

    let (code, said) = cancel(&d, id);
    assert_eq!(code, 0, "{said}");
    let ended = shim_run.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&ended.stderr);
    assert_eq!(ended.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with("nvlink fatal   : ") && stderr.contains("cancelled by request"), "{stderr}");
    assert!(!out.path().join("out.cubin").exists(), "the cancelled link's shim ran nvlink");
    let cancelled = ev.of("link_cancelled", id);
    assert_eq!(cancelled["reason"], "requested", "{cancelled}");
    let cut = ev
        .wait("the phase's end", |v| v["event"] == "phase_finished" && v["link"] == id && v["phase"] == phase.as_str());
    assert_eq!(cut["aborted"], true, "{cut}");
    assert_eq!((d.stat("cancelled"), d.stat("fallbacks")), (1, 0), "{}", d.stats());
    assert!(ev.all("link_finished", id).is_empty(), "a cancelled link also finished");

    // No such link any more.
    let (code, said) = cancel(&d, id);
    assert_ne!(code, 0, "{said}");
    assert!(said.contains("no running link"), "{said}");
    std::fs::remove_file(&hold).unwrap();
}

/// Filters on the server: `--cwd DIR` sees only links run in DIR or below,
/// `--output PATH` (relative to `--cwd`) only the link writing PATH,
/// `--no-speculative` no link the daemon predicted; an unfiltered reader
/// sees them all.
#[test]
fn events_are_filtered_by_directory_output_and_speculation() {
    let d = Daemon::start();
    let (a, b) = (TempDir::new("filter-a"), TempDir::new("filter-b"));
    for f in ["xcall_main_3arch.o", "xcall_loop_3arch.o"] {
        std::fs::copy(corpus::dir().join(f), a.path().join(f)).unwrap();
    }
    for f in ["accumulate.o", "scale.o"] {
        std::fs::copy(corpus::dir().join(f), b.path().join(f)).unwrap();
    }
    let a_dir = a.path().display().to_string();
    let b_dir = b.path().display().to_string();
    let mut all = Events::follow(&d);
    let mut in_a = Events::follow_filtered(&d, &["--cwd", &a_dir], a.path(), "--version");
    let mut out_b =
        Events::follow_filtered(&d, &["--cwd", &b_dir, "--output", "b.cubin"], b.path(), "--version -o b.cubin");
    let mut no_spec = Events::follow_filtered(&d, &["--no-speculative"], corpus::dir(), "--version");

    // In a: a multi-arch nvcc step's first link (the daemon links the other
    // archs ahead, in a).
    let out = TempDir::new("filter-out");
    let nvcc_step = format!(
        "-m64 --arch=sm_80 --register-link-binaries={a_dir}/d.reg.c -L{{L}}/stubs -L{{L}} -cpu-arch=X86_64 \
         -report-arch xcall_main_3arch.o xcall_loop_3arch.o -lcudadevrt -o {a_dir}/tmpxft_00001-5_d.compute_80.cubin \
         --host-ccbin gcc"
    );
    assert_eq!(run(&shim(), &inv(&nvcc_step, a.path(), &out), &d.shim_env()).code, 0);
    // In b: two links, one writing b.cubin.
    let b_link = format!("--arch=sm_90 accumulate.o scale.o -o {b_dir}/b.cubin");
    let other = format!("--arch=sm_90 -w accumulate.o scale.o -o {b_dir}/other.cubin");
    for args in [&b_link, &other] {
        assert_eq!(run(&shim(), &inv(args, b.path(), &out), &d.shim_env()).code, 0);
    }

    let a_link = all.started("compute_80.cubin");
    let spec: Vec<u64> = ["compute_90.cubin", "compute_100.cubin"].iter().map(|o| all.started(o)).collect();
    let (b_id, other_id) = (all.started("/b.cubin"), all.started("/other.cubin"));
    for id in spec.iter().chain(&[a_link, b_id, other_id]) {
        all.of("link_finished", *id);
    }
    for id in &spec {
        assert_eq!(all.of("link_started", *id)["speculative"], true);
    }
    // Every reader has seen everything once its last link has come.
    in_a.wait("the last speculative end", |v| {
        v["event"] == "link_finished" && v["link"].as_u64() == spec.iter().max().copied()
    });
    out_b.of("link_finished", b_id);
    no_spec.of("link_finished", other_id);
    std::thread::sleep(Duration::from_millis(300));
    for r in [&mut in_a, &mut out_b, &mut no_spec] {
        while r.next(Duration::from_millis(200)).is_some() {}
    }
    let links = |e: &Events| -> BTreeSet<u64> {
        e.seen.iter().filter(|v| v["event"] == "link_started").filter_map(|v| v["link"].as_u64()).collect()
    };
    let want_a: BTreeSet<u64> = spec.iter().copied().chain([a_link]).collect();
    assert_eq!(links(&in_a), want_a, "--cwd {a_dir}: {:#?}", in_a.seen);
    assert_eq!(links(&out_b), [b_id].into(), "--output: {:#?}", out_b.seen);
    assert_eq!(links(&no_spec), [a_link, b_id, other_id].into(), "--no-speculative: {:#?}", no_spec.seen);
    // The filter passes a link's every event, not only its start.
    assert!(out_b.seen.iter().any(|v| v["event"] == "phase_finished" && v["link"] == b_id), "{:#?}", out_b.seen);
}

/// A diagnostic about an archive's member names the archive (and its path)
/// and the member apart, and the symbol demangled, while its message stays
/// nvlink's line.
#[test]
fn a_diagnostic_names_the_archive_and_member_apart() {
    let d = Daemon::start();
    let mut ev = Events::follow(&d);
    let dir = TempDir::new("diag-ar");
    std::fs::copy(corpus::dir().join("missing.o"), dir.path().join("missing.o")).unwrap();
    let ar = Command::new("ar").args(["rcs", "libmiss.a", "missing.o"]).current_dir(dir.path()).status().unwrap();
    assert!(ar.success());
    let out = TempDir::new("diag-ar-out");
    let args = "--arch=sm_90 libmiss.a -o {OUT}/miss.cubin";
    let expected = run(&real_nvlink(), &inv(args, dir.path(), &TempDir::new("diag-ar-ref")), &[]);
    let got = run(&shim(), &inv(args, dir.path(), &out), &d.shim_env());
    assert_eq!((got.code, &got.stderr), (expected.code, &expected.stderr), "not nvlink's answer");
    let id = ev.started("miss.cubin");
    ev.of("link_finished", id);
    let diags: Vec<Value> = ev.all("diagnostic", id);
    let line = String::from_utf8_lossy(&expected.stderr).lines().next().unwrap().to_owned();
    let d0 = &diags[0];
    assert!(line.ends_with(d0["message"].as_str().unwrap()), "{d0} is not {line}");
    assert_eq!((d0["object"].as_str(), d0["member"].as_str()), (Some("libmiss.a"), Some("missing.o")), "{d0}");
    assert_eq!(d0["object_path"].as_str(), Some(dir.path().join("libmiss.a").to_str().unwrap()), "{d0}");
    assert_eq!(
        (d0["symbol"].as_str(), d0["symbol_demangled"].as_str()),
        (Some("_Z14missing_symbolf"), Some("missing_symbol(float)"))
    );
    assert_eq!((d0["severity"].as_str(), d0["tool"].as_str()), (Some("error"), Some("nvlink")));
}

/// Under LTO nvlink reports an undefined reference in `'lto.cubin'` (and its
/// ptxas an unresolved extern in no object), the module NVVM made of every
/// input: the diagnostic's `object` is the input whose LTO IR names the
/// symbol, an archive's member apart, with its path; the message stays
/// nvlink's line.
#[test]
fn an_lto_diagnostic_names_the_input_that_uses_the_symbol() {
    let d = Daemon::start();
    let mut ev = Events::follow(&d);
    let dir = TempDir::new("diag-lto");
    for f in ["accumulate_lto.o", "saxpy_lto.o"] {
        std::fs::copy(corpus::dir().join(f), dir.path().join(f)).unwrap();
    }
    let ar = Command::new("ar").args(["rcs", "libacc.a", "accumulate_lto.o"]).current_dir(dir.path()).status().unwrap();
    assert!(ar.success());
    let out = TempDir::new("diag-lto-out");
    let cases = [
        (
            "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} saxpy_lto.o accumulate_lto.o -lcudadevrt -o {OUT}/a.cubin",
            "a.cubin",
            "nvlink",
            "accumulate_lto.o",
            None,
        ),
        (
            "--arch=sm_90 -dlto -nvvmpath={NVVM} saxpy_lto.o accumulate_lto.o -o {OUT}/b.cubin",
            "b.cubin",
            "ptxas",
            "accumulate_lto.o",
            None,
        ),
        (
            "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} saxpy_lto.o libacc.a -lcudadevrt -o {OUT}/c.cubin",
            "c.cubin",
            "nvlink",
            "libacc.a",
            Some("accumulate_lto.o"),
        ),
    ];
    for (args, output, tool, object, member) in cases {
        let expected = run(&real_nvlink(), &inv(args, dir.path(), &TempDir::new("diag-lto-ref")), &[]);
        let got = run(&shim(), &inv(args, dir.path(), &out), &d.shim_env());
        assert_eq!((got.code, &got.stderr), (expected.code, &expected.stderr), "{args}: not nvlink's answer");
        let said = String::from_utf8_lossy(&expected.stderr);
        assert!(said.contains("_Z5scalef"), "{args}: nvlink no longer reports the reference: {said}");
        let id = ev.started(output);
        ev.of("link_finished", id);
        let diags = ev.all("diagnostic", id);
        let d0 = diags.iter().find(|v| v["symbol"] == "_Z5scalef").unwrap_or_else(|| panic!("{args}: {diags:#?}"));
        assert!(said.contains(d0["message"].as_str().unwrap()), "{d0} is not nvlink's line");
        assert_eq!(d0["tool"].as_str(), Some(tool), "{args}: {d0}");
        assert_eq!((d0["object"].as_str(), d0["member"].as_str()), (Some(object), member), "{args}: {d0}");
        assert_eq!(d0["object_path"].as_str(), Some(dir.path().join(object).to_str().unwrap()), "{d0}");
    }
}

/// A diagnostic gives the source file and line of its symbol where the
/// object has line tables (nvcc `-lineinfo` or `-G`): for an undefined
/// reference, the line of the call; for a multiple definition, the line of
/// the definition; in an archive's member too. Without line tables they are
/// absent. The sources are written here and compiled by the real nvcc; the
/// lines expected are found by their text.
#[test]
fn a_diagnostic_gives_the_source_line_from_the_objects_line_tables() {
    let dir = TempDir::new("diag-lines");
    let main = "__device__ int helper(int x);\n\n__global__ void k(int *p) {\n    p[0] = helper(p[1]);\n}\n";
    let def = "// helpers\n\n__device__ int helper(int x) {\n    return x + 1;\n}\n";
    std::fs::write(dir.path().join("main.cu"), main).unwrap();
    std::fs::write(dir.path().join("def.cu"), def).unwrap();
    let line_of = |text: &str, needle: &str| text.lines().position(|l| l.contains(needle)).unwrap() as u64 + 1;
    let nvcc = nvlinkd_tests::env::cuda_home().join("bin/nvcc");
    for (src, obj, flag) in
        [("main.cu", "main.o", "-lineinfo"), ("def.cu", "def.o", "-G"), ("main.cu", "plain.o", "-O3")]
    {
        let ok = Command::new(&nvcc)
            .args(["-arch=sm_90", "-dc", flag, src, "-o", obj])
            .current_dir(dir.path())
            .status()
            .unwrap();
        assert!(ok.success(), "nvcc {flag} {src}");
    }
    assert!(Command::new("ar").args(["rcs", "libdef.a", "def.o"]).current_dir(dir.path()).status().unwrap().success());
    let d = Daemon::start();
    let mut ev = Events::follow(&d);
    let out = TempDir::new("diag-lines-out");
    let cases = [
        ("--arch=sm_90 main.o -o {OUT}/a.cubin", "a.cubin", Some(("main.cu", line_of(main, "helper(p[1])")))),
        ("--arch=sm_90 def.o def.o -o {OUT}/b.cubin", "b.cubin", Some(("def.cu", line_of(def, "int helper(int x) {")))),
        (
            "--arch=sm_90 def.o libdef.a -o {OUT}/c.cubin",
            "c.cubin",
            Some(("def.cu", line_of(def, "int helper(int x) {"))),
        ),
        ("--arch=sm_90 plain.o -o {OUT}/d.cubin", "d.cubin", None),
    ];
    for (args, output, want) in cases {
        let expected = run(&real_nvlink(), &inv(args, dir.path(), &TempDir::new("diag-lines-ref")), &[]);
        let got = run(&shim(), &inv(args, dir.path(), &out), &d.shim_env());
        assert_eq!((got.code, &got.stderr), (expected.code, &expected.stderr), "{args}: not nvlink's answer");
        let id = ev.started(output);
        ev.of("link_finished", id);
        let diags = ev.all("diagnostic", id);
        let first = diags.iter().find(|v| v["symbol"] == "_Z6helperi").unwrap_or_else(|| panic!("{args}: {diags:#?}"));
        match want {
            Some((file, line)) => {
                let path = dir.path().join(file);
                assert_eq!(
                    (first["source_file"].as_str(), first["line"].as_u64()),
                    (path.to_str(), Some(line)),
                    "{args}: {first}"
                );
            }
            None => assert!(first.get("source_file").is_none() && first.get("line").is_none(), "{args}: {first}"),
        }
    }
}

/// The example editor bridge (`examples/editor/nvlinkd-lsp-bridge.py`), run
/// as an editor runs it, against a real daemon: LSP messages on its stdout.
struct Bridge {
    child: std::process::Child,
    rx: std::sync::mpsc::Receiver<Value>,
    seen: Vec<Value>,
}

impl Bridge {
    fn start(d: &Daemon, cwd: &Path, extra: &[&str]) -> Bridge {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/editor/nvlinkd-lsp-bridge.py");
        let mut child = Command::new("python3")
            .arg(script)
            .arg("--socket")
            .arg(d.socket())
            .arg("--cwd")
            .arg(cwd)
            .args(extra)
            .env("NVLINKD", nvlinkd())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 and the bridge");
        let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
        let (tx, rx) = std::sync::mpsc::channel();
        let lines = !extra.is_empty();
        std::thread::spawn(move || {
            use std::io::{BufRead, Read};
            loop {
                let mut header = String::new();
                if stdout.read_line(&mut header).unwrap_or(0) == 0 {
                    return;
                }
                if lines {
                    let _ = tx.send(Value::String(header.trim_end().to_owned()));
                    continue;
                }
                let Some(len) = header.trim().strip_prefix("Content-Length: ").and_then(|l| l.parse::<usize>().ok())
                else {
                    continue;
                };
                let mut blank = String::new();
                stdout.read_line(&mut blank).unwrap();
                let mut body = vec![0; len];
                stdout.read_exact(&mut body).unwrap();
                if tx.send(serde_json::from_slice(&body).unwrap()).is_err() {
                    return;
                }
            }
        });
        Bridge { child, rx, seen: Vec::new() }
    }

    fn wait(&mut self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        loop {
            if let Some(v) = self.seen.iter().find(|v| pred(v)) {
                return v.clone();
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(v) => self.seen.push(v),
                Err(_) => panic!("the bridge sent no {what}; it sent {:#?}", self.seen),
            }
        }
    }

    /// Run `--version` links in `cwd` until the bridge reports one (it follows).
    fn until_following(&mut self, d: &Daemon, cwd: &Path, probe: impl Fn(&Value) -> bool) {
        let out = TempDir::new("bridge-probe");
        for _ in 0..600 {
            assert_eq!(run(&shim(), &inv("--version", cwd, &out), &d.shim_env()).code, 0);
            if let Ok(v) = self.rx.recv_timeout(Duration::from_millis(200)) {
                let hit = probe(&v);
                self.seen.push(v);
                if hit {
                    while let Ok(v) = self.rx.recv_timeout(Duration::from_millis(300)) {
                        self.seen.push(v);
                    }
                    self.seen.clear();
                    return;
                }
            }
        }
        panic!("the bridge never reported a link");
    }

    fn send(&mut self, message: Value) {
        use std::io::Write;
        let body = message.to_string();
        let stdin = self.child.stdin.as_mut().unwrap();
        write!(stdin, "Content-Length: {}\r\n\r\n{body}", body.len()).unwrap();
        stdin.flush().unwrap();
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A progress report of a phase running a second or more: `ptxas (1.0 s)`.
fn long_phase(message: &str) -> bool {
    let secs = message.rsplit_once('(').and_then(|(_, t)| t.strip_suffix(" s)")).and_then(|t| t.parse::<f64>().ok());
    secs.is_some_and(|s| s >= 1.0)
}

fn is_progress(v: &Value, kind: &str) -> bool {
    v["method"] == "$/progress" && v["params"]["value"]["kind"] == kind
}

/// An editor's problems panel and progress bar from the stream alone: the
/// bridge turns a failing link into `publishDiagnostics` for the object it
/// names (error, code, demangled symbol), clears it when the next link of the
/// same output succeeds, shows each link as begin/report/end progress, and
/// the editor's cancel of that progress cancels the link.
#[test]
fn the_example_editor_bridge_shows_problems_and_progress_and_cancels() {
    let work = TempDir::new("bridge");
    let hold = work.path().join("hold");
    let d = Daemon::start_env(&[], &[("NVLINKD_TEST_WORKER_HOLD", &hold.display().to_string())]);
    let dir = TempDir::new("bridge-src");
    for f in ["missing.o", "accumulate.o", "scale.o", "accumulate_lto.o", "scale_lto.o"] {
        std::fs::copy(corpus::dir().join(f), dir.path().join(f)).unwrap();
    }
    let mut b = Bridge::start(&d, dir.path(), &[]);
    b.until_following(&d, dir.path(), |v| is_progress(v, "begin"));
    let out = TempDir::new("bridge-out");
    let app = format!("{}/app.cubin", dir.path().display());

    // A failing link: its problem, on the object nvlink names.
    let r = run(&shim(), &inv(&format!("--arch=sm_90 missing.o -o {app}"), dir.path(), &out), &d.shim_env());
    assert_ne!(r.code, 0);
    let uri = format!("file://{}", dir.path().join("missing.o").display());
    let problems = b.wait("the problem", |v| {
        v["method"] == "textDocument/publishDiagnostics" && v["params"]["uri"] == uri.as_str()
    });
    let p = &problems["params"]["diagnostics"][0];
    assert_eq!(
        (p["severity"].as_u64(), p["code"].as_str(), p["source"].as_str()),
        (Some(1), Some("undefined_reference"), Some("nvlink")),
        "{p}"
    );
    assert!(String::from_utf8_lossy(&r.stderr).contains(p["message"].as_str().unwrap()), "{p}");
    assert_eq!(p["data"]["symbol_demangled"].as_str(), Some("missing_symbol(float)"), "{p}");
    let begin = b.wait("the link's progress", |v| {
        is_progress(v, "begin") && v["params"]["value"]["title"] == "nvlink app.cubin"
    });
    let token = begin["params"]["token"].clone();
    let end = b.wait("its end", |v| is_progress(v, "end") && v["params"]["token"] == token);
    assert!(end["params"]["value"]["message"].as_str().unwrap().starts_with(&format!("exit {}", r.code)), "{end}");

    // The same output linked without the error: the problem is cleared.
    b.seen.clear();
    let r = run(&shim(), &inv(&format!("--arch=sm_90 accumulate.o scale.o -o {app}"), dir.path(), &out), &d.shim_env());
    assert_eq!(r.code, 0);
    let cleared = b.wait("the problem cleared", |v| {
        v["method"] == "textDocument/publishDiagnostics" && v["params"]["uri"] == uri.as_str()
    });
    assert_eq!(cleared["params"]["diagnostics"], serde_json::json!([]), "{cleared}");

    // A long link (held in its worker): progress reports its phase; the
    // editor cancels the progress, and the link is cancelled.
    std::fs::write(&hold, b"").unwrap();
    let lto =
        format!("--arch=sm_90 -dlto -nvvmpath={{NVVM}} -L{{L}} accumulate_lto.o scale_lto.o -lcudadevrt -o {app}");
    let link = inv(&lto, dir.path(), &out);
    let shim_run = Command::new(shim())
        .args(&link.args)
        .current_dir(&link.cwd)
        .envs(d.shim_env().iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    b.seen.clear();
    let begin = b.wait("the held link's progress", |v| is_progress(v, "begin"));
    let token = begin["params"]["token"].clone();
    b.wait("a phase report", |v| {
        is_progress(v, "report")
            && v["params"]["token"] == token
            && v["params"]["value"]["message"].as_str().is_some_and(long_phase)
    });
    b.send(
        serde_json::json!({"jsonrpc": "2.0", "method": "window/workDoneProgress/cancel", "params": {"token": token}}),
    );
    let end = b.wait("the cancelled end", |v| is_progress(v, "end") && v["params"]["token"] == token);
    assert_eq!(end["params"]["value"]["message"], "cancelled (requested)", "{end}");
    let ended = shim_run.wait_with_output().unwrap();
    assert_eq!(ended.status.code(), Some(1), "{}", String::from_utf8_lossy(&ended.stderr));
    std::fs::remove_file(&hold).unwrap();

    // The task's problem matcher mode: one line per problem.
    // (It follows once a failing link's line comes.)
    let lines = Bridge::start(&d, dir.path(), &["--problem-matcher"]);
    let line = (0..300)
        .find_map(|_| {
            let r = run(&shim(), &inv(&format!("--arch=sm_90 missing.o -o {app}"), dir.path(), &out), &d.shim_env());
            assert_ne!(r.code, 0);
            lines.rx.recv_timeout(Duration::from_millis(300)).ok()
        })
        .expect("no problem line from the bridge");
    let want = format!("{}:1:1: error: ", dir.path().join("missing.o").display());
    assert!(
        line.as_str().unwrap().starts_with(&want) && line.as_str().unwrap().ends_with("[undefined_reference]"),
        "{line}"
    );
}
