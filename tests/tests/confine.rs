//! Confinement of the processes that parse a client's bytes
//! (`core/src/confine.rs`): a probe in place of the toolkit's nvlink, run by a
//! TLS daemon for a token holder's routed link, tries to read a secret, write
//! outside its sandbox, connect over TCP and to the daemon's own socket, and
//! run a program: all refused, while writing its sandbox works. The same daemon
//! with `--confine=off` lets every attempt through (the probe reports what it
//! did). Workers running nvJitLink carry the seccomp filter and no new
//! privileges.

use std::path::{Path, PathBuf};

use nvlinkd_tests::corpus;
use nvlinkd_tests::daemon::Daemon;
use nvlinkd_tests::env::{bin_dir, cuda_home, real_nvlink, shim, TempDir};
use nvlinkd_tests::remote::{tls_daemon, Pki};
use nvlinkd_tests::run::{run, Invocation};

/// A toolkit like the test's, but with the probe as `bin/nvlink`: every other
/// entry a symlink into the real toolkit.
fn probe_toolkit(dir: &Path, conf: &str) -> PathBuf {
    let tk = dir.join("toolkit");
    std::fs::create_dir_all(tk.join("bin")).unwrap();
    for e in std::fs::read_dir(cuda_home()).unwrap().flatten() {
        if e.file_name() != "bin" {
            std::os::unix::fs::symlink(e.path(), tk.join(e.file_name())).unwrap();
        }
    }
    for e in std::fs::read_dir(cuda_home().join("bin")).unwrap().flatten() {
        if e.file_name() != "nvlink" {
            std::os::unix::fs::symlink(e.path(), tk.join("bin").join(e.file_name())).unwrap();
        }
    }
    std::fs::copy(bin_dir().join("nvlinkd-probe"), tk.join("bin/nvlink")).expect("the probe (cargo build --workspace)");
    std::fs::write(tk.join("bin/probe.conf"), conf).unwrap();
    tk
}

/// A routed link (`--preserve-relocs`) from a token holder over TLS to a daemon
/// whose nvlink is the probe; the probe's report.
fn probe_report(confine: &[&str]) -> (String, PathBuf, TempDir, std::net::TcpListener) {
    let dir = TempDir::new("confine");
    let secret = dir.path().join("secret");
    std::fs::write(&secret, "s3cret\n").unwrap();
    let outside = dir.path().join("outside");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let conf = format!(
        "real={}\nsecret={}\noutside={}\ntcp={}\nexec=/usr/bin/id\n",
        real_nvlink().display(),
        secret.display(),
        outside.display(),
        listener.local_addr().unwrap(),
    );
    let tk = probe_toolkit(dir.path(), &conf);
    let pki = Pki::new();
    let tk_s = tk.display().to_string();
    let mut args = vec!["--cuda-home", &tk_s];
    args.extend(confine);
    let (d, port) = tls_daemon(&pki, &args);
    // The daemon's own socket, known once it runs.
    std::fs::write(tk.join("bin/probe.conf"), format!("{conf}unix={}\n", d.socket().display())).unwrap();
    let out = TempDir::new("confine-out");
    let link = Invocation::templated("--arch=sm_90 --preserve-relocs scale.o -o {OUT}/out.cubin", corpus::dir(), &out);
    let r = run(&shim(), &link, &pki.shim_env(&format!("https://127.0.0.1:{port}"), "never"));
    let report = String::from_utf8_lossy(&r.stdout).into_owned();
    assert_eq!(r.code, 1, "the probe's answer: {report} {}", String::from_utf8_lossy(&r.stderr));
    assert!(d.stat("nvlink_process") >= 1, "the link did not run the daemon's nvlink: {}", d.stats());
    drop(d);
    (report, outside, dir, listener)
}

fn line<'a>(report: &'a str, what: &str) -> &'a str {
    report.lines().find(|l| l.starts_with(what)).unwrap_or_else(|| panic!("no '{what}' in the report:\n{report}"))
}

#[test]
fn nvlink_for_a_remote_link_reads_writes_and_connects_nothing_outside_its_sandbox() {
    if nvlinkd_core::confine::support().landlock.is_none() {
        eprintln!("skipped: this kernel has no Landlock");
        return;
    }
    let (report, outside, _dir, listener) = probe_report(&["--confine=require"]);
    for what in ["read secret", "write outside", "connect tcp", "connect unix", "run program"] {
        assert!(line(&report, what).contains("refused"), "{what} was not refused:\n{report}");
    }
    assert!(line(&report, "write sandbox").ends_with("allowed"), "the sandbox is not writable:\n{report}");
    assert!(!outside.exists(), "the probe wrote outside its sandbox");
    assert!(listener.accept().is_err(), "the probe reached a TCP listener");
    // The x32 ABI's number for socket is the filter's too (without the filter
    // it is a socket, or "not implemented" where the kernel has no x32).
    if cfg!(target_arch = "x86_64") {
        let x32 = line(&report, "x32 socket");
        assert!(x32.contains("Operation not permitted"), "x32 system calls pass the filter:\n{report}");
    }
}

#[test]
fn without_confinement_the_same_probe_gets_through() {
    let (report, outside, _dir, listener) = probe_report(&["--confine=off"]);
    for what in ["read secret", "write outside", "connect tcp", "connect unix", "run program"] {
        assert!(line(&report, what).ends_with("allowed"), "{what} was refused unconfined:\n{report}");
    }
    if cfg!(target_arch = "x86_64") {
        assert!(!line(&report, "x32 socket").contains("Operation not permitted"), "{report}");
    }
    assert!(outside.exists());
    assert!(listener.accept().is_ok());
}

fn root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

#[test]
fn a_sandbox_user_runs_the_probe_as_itself_and_confined() {
    if !root() || nvlinkd_core::confine::support().landlock.is_none() {
        eprintln!("skipped: needs root and Landlock");
        return;
    }
    let nobody = nvlinkd_core::confine::SandboxUser::lookup("nobody").expect("user nobody");
    let (report, outside, _dir, listener) = probe_report(&["--confine=require", "--sandbox-user", "nobody"]);
    assert_eq!(line(&report, "uid").trim_start_matches("uid: "), nobody.uid.to_string(), "{report}");
    for what in ["read secret", "write outside", "connect tcp", "connect unix", "run program"] {
        assert!(line(&report, what).contains("refused"), "{what} was not refused:\n{report}");
    }
    assert!(line(&report, "write sandbox").ends_with("allowed"), "the sandbox is not writable:\n{report}");
    assert!(!outside.exists());
    assert!(listener.accept().is_err());
}

/// Routed, LTO (workers) and PTX (ptxas) links from a token holder, with
/// every tool confined and run as `nobody`: nvlink's bytes.
#[test]
fn confined_tools_running_as_a_sandbox_user_give_nvlinks_bytes() {
    if !root() {
        eprintln!("skipped: needs root");
        return;
    }
    let pki = Pki::new();
    let (d, port) = tls_daemon(&pki, &["--sandbox-user", "nobody"]);
    let env = pki.shim_env(&format!("https://127.0.0.1:{port}"), "never");
    for args in [
        "--arch=sm_90 --preserve-relocs accumulate.o scale.o -o {OUT}/out.cubin",
        "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} accumulate_lto.o scale_lto.o -lcudadevrt -o {OUT}/out.cubin",
        "--arch=sm_80 saxpy_ptx80.o -o {OUT}/out.cubin",
    ] {
        let out = TempDir::new("confine-user");
        let link = Invocation::templated(args, corpus::dir(), &out);
        let expected = run(&real_nvlink(), &link, &[]);
        let actual = run(&shim(), &link, &env);
        assert_eq!(actual.code, expected.code, "{args}: {}", String::from_utf8_lossy(&actual.stderr));
        assert_eq!(actual.stderr, expected.stderr, "{args}");
        assert_eq!(actual.files, expected.files, "{args}: outputs differ from nvlink's");
    }
    assert!(d.stat("nvlink_process") >= 1 && d.stat("in_process") >= 2, "{}", d.stats());
}

/// A compromised nvlink that makes its output a symlink to a file only the
/// daemon may read gets nothing back: the daemon reads back only regular
/// files of the tool's own.
#[test]
fn a_planted_symlink_as_the_output_reads_nothing_for_the_tool() {
    let dir = TempDir::new("confine-plant");
    let secret = dir.path().join("secret");
    std::fs::write(&secret, "s3cret-plant\n").unwrap();
    let conf = format!("real={}\nplant={}\n", real_nvlink().display(), secret.display());
    let tk = probe_toolkit(dir.path(), &conf);
    let pki = Pki::new();
    let tk_s = tk.display().to_string();
    let (d, port) = tls_daemon(&pki, &["--cuda-home", &tk_s]);
    let out = TempDir::new("confine-plant-out");
    let link = Invocation::templated("--arch=sm_90 --preserve-relocs scale.o -o {OUT}/out.cubin", corpus::dir(), &out);
    let r = run(&shim(), &link, &pki.shim_env(&format!("https://127.0.0.1:{port}"), "never"));
    for (name, data) in &r.files {
        assert!(!String::from_utf8_lossy(data).contains("s3cret-plant"), "{name} carries the secret");
    }
    assert!(!String::from_utf8_lossy(&r.stdout).contains("s3cret-plant"));
    assert_ne!(r.code, 0, "a planted symlink was taken as nvlink's output");
    drop(d);
}

/// The `Seccomp` and `NoNewPrivs` fields of a process's status.
fn confinement_of(pid: u32) -> (String, String) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field =
        |k: &str| status.lines().find_map(|l| l.strip_prefix(k)).map(|v| v.trim().to_owned()).unwrap_or_default();
    (field("Seccomp:"), field("NoNewPrivs:"))
}

#[test]
fn nvjitlink_workers_run_confined() {
    let d = Daemon::start();
    let out = TempDir::new("confine-lto");
    let link = Invocation::templated(
        "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} accumulate_lto.o scale_lto.o -lcudadevrt -o {OUT}/out.cubin",
        corpus::dir(),
        &out,
    );
    let expected = run(&real_nvlink(), &link, &[]);
    let actual = run(&shim(), &link, &d.shim_env());
    assert_eq!(actual.code, expected.code);
    assert_eq!(actual.files.get("out.cubin"), expected.files.get("out.cubin"), "LTO through confined workers");
    let daemon = d.child.as_ref().unwrap().id();
    let workers: Vec<u32> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
            let ppid: u32 = after.split_whitespace().nth(1).and_then(|p| p.parse().ok()).unwrap_or(0);
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            ppid == daemon && cmdline.split(|b| *b == 0).any(|a| a == b"worker")
        })
        .collect();
    assert!(!workers.is_empty(), "no nvJitLink worker after an LTO link");
    for pid in workers {
        assert_eq!(confinement_of(pid), ("2".into(), "1".into()), "worker {pid}: (Seccomp, NoNewPrivs)");
    }
}
