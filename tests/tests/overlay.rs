//! `nvlinkd install`: nvcc from the overlay device-links through the daemon, and
//! the result equals what the toolkit's own nvcc produces with the real nvlink.

use std::path::Path;
use std::process::Command;

use nvlinkd_tests::daemon::Daemon;
use nvlinkd_tests::env::{cuda_home, install_overlay, nvlinkd, real_nvlink, repo_root, shim, TempDir};
use nvlinkd_tests::run::{run, Invocation};
use nvlinkd_tests::{compare, corpus};

fn nvcc(prefix: &Path, args: &[&str], cwd: &Path, env: &[(String, String)]) {
    let out = Command::new(prefix.join("bin/nvcc"))
        .args(args)
        .current_dir(cwd)
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .output()
        .expect("run nvcc");
    assert!(
        out.status.success(),
        "nvcc {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn nvcc_through_the_overlay_links_via_the_daemon() {
    let d = Daemon::start();
    let env = d.shim_env();
    let prefix = TempDir::new("ovl");
    install_overlay(prefix.path());

    let work = TempDir::new("ovl-work");
    let demo = repo_root().join("demo");
    let sources: Vec<String> =
        ["main.cu", "poly.cu", "reduce.cu"].iter().map(|f| demo.join(f).display().to_string()).collect();
    let mut dc: Vec<&str> = vec!["-arch=sm_90", "-dc"];
    dc.extend(sources.iter().map(String::as_str));
    nvcc(cuda_home(), &dc, work.path(), &[]);

    // Device link and a full build through the shim.
    let before = d.stat("requests");
    let dlink = ["-arch=sm_90", "-dlink", "main.o", "poly.o", "reduce.o", "-o"];
    nvcc(prefix.path(), &[&dlink[..], &["shim.o"]].concat(), work.path(), &env);
    let mut full: Vec<&str> = vec!["-arch=sm_90", "-rdc=true", "-o", "app"];
    full.extend(sources.iter().map(String::as_str));
    nvcc(prefix.path(), &full, work.path(), &env);
    assert_eq!(d.stat("requests") - before, 2, "the device links did not go through nvlinkd");
    assert!(work.path().join("app").is_file());

    // The same device link through the toolkit's own nvcc and nvlink.
    nvcc(cuda_home(), &[&dlink[..], &["real.o"]].concat(), work.path(), &[]);
    let shim_out = std::fs::read(work.path().join("shim.o")).unwrap();
    let real_out = std::fs::read(work.path().join("real.o")).unwrap();
    assert!(shim_out == real_out, "device-link objects differ between the overlay and the toolkit");
}

/// A toolkit of the test's own to install into: symlinks to the shared
/// toolkit's entries and a private `bin/` whose nvlink is a copy (install and
/// uninstall rename inside `bin/`; the shared toolkit is never touched).
fn private_toolkit(dir: &Path) -> std::path::PathBuf {
    use std::os::unix::fs::symlink;
    let root = dir.join("cuda");
    std::fs::create_dir_all(root.join("bin")).unwrap();
    for e in std::fs::read_dir(cuda_home()).unwrap().flatten() {
        if e.file_name() != "bin" {
            symlink(e.path(), root.join(e.file_name())).unwrap();
        }
    }
    for e in std::fs::read_dir(cuda_home().join("bin")).unwrap().flatten() {
        let to = root.join("bin").join(e.file_name());
        if e.file_name() == "nvlink" {
            std::fs::copy(e.path(), &to).unwrap();
        } else {
            symlink(e.path(), &to).unwrap();
        }
    }
    root
}

fn nvlinkd_cmd(args: &[&str], cuda: &Path) -> std::process::Output {
    Command::new(nvlinkd()).args(args).arg("--cuda-home").arg(cuda).output().expect("run nvlinkd")
}

/// `nvlinkd install --in-place`: nvcc keeps the toolkit's own paths, so a build
/// through nvlinkd equals the plain build byte for byte (the device-link
/// objects, which embed every per-arch cubin and the registration code);
/// installing again changes nothing; `uninstall` restores the real nvlink.
#[test]
fn in_place_install_builds_the_plain_build_bytes() {
    let d = Daemon::start();
    let work = TempDir::new("inpl");
    let root = private_toolkit(work.path());
    let corpus = nvlinkd_tests::corpus::dir();
    let original = std::fs::read(root.join("bin/nvlink")).unwrap();
    // nvcc's device links of a two-arch build with CMake's -lcudart_static and
    // a host-only object, of an LTO build, and of a partial LTO build of two
    // LTO modules with --keep-system-libraries (which the daemon hands to the
    // real nvlink: it must find the one kept aside).
    let builds: [&[&str]; 3] = [
        &[
            "-gencode",
            "arch=compute_80,code=sm_80",
            "-gencode",
            "arch=compute_90,code=sm_90",
            "-dlink",
            "xcall_main_3arch.o",
            "xcall_loop_3arch.o",
            "livedead_3arch.o",
            "host_main.cpp.o",
            "-lcudart_static",
        ],
        &["-arch=sm_90", "-dlto", "-dlink", "xcall_main_lto.o", "xcall_loop_lto.o", "host_main.cpp.o"],
        &[
            "-arch=sm_90",
            "-dlto",
            "-Xnvlink",
            "--keep-system-libraries",
            "-dlink",
            "accumulate_lto.o",
            "scale_lto.o",
            "saxpy.o",
        ],
    ];
    let build = |tag: &str, env: &[(String, String)]| -> Vec<Vec<u8>> {
        builds
            .iter()
            .enumerate()
            .map(|(i, args)| {
                let out = work.path().join(format!("{tag}{i}.o"));
                let out_s = out.display().to_string();
                nvcc(&root, &[args, &["-o", &out_s][..]].concat(), corpus, env);
                std::fs::read(&out).unwrap()
            })
            .collect()
    };
    let plain = build("plain", &[]);

    let st = nvlinkd_cmd(&["install", "--in-place"], &root);
    assert!(st.status.success(), "{}", String::from_utf8_lossy(&st.stderr));
    assert_eq!(
        std::fs::read(root.join("bin/nvlink")).unwrap(),
        std::fs::read(shim()).unwrap(),
        "bin/nvlink is not the shim"
    );
    assert!(std::fs::read(root.join("bin/.nvlinkd/nvlink")).unwrap() == original, "the real nvlink was not kept");

    let mut env = d.shim_env();
    env.retain(|(k, _)| k != "CUDA_HOME");
    let before = d.stat("requests");
    let through = build("inplace", &env);
    assert_eq!(d.stat("requests") - before, 4, "the device links did not go through nvlinkd");
    assert!(d.stat("nvlink_process") >= 1, "the partial LTO link was not run by the real nvlink engine");
    for (i, (p, t)) in plain.iter().zip(&through).enumerate() {
        assert!(p == t, "build {i}: the device-link object differs from the plain build's");
    }

    // Again: idempotent, the real nvlink stays.
    let st = nvlinkd_cmd(&["install", "--in-place"], &root);
    assert!(st.status.success(), "{}", String::from_utf8_lossy(&st.stderr));
    assert!(std::fs::read(root.join("bin/.nvlinkd/nvlink")).unwrap() == original);

    for _ in 0..2 {
        let st = nvlinkd_cmd(&["uninstall"], &root);
        assert!(st.status.success(), "{}", String::from_utf8_lossy(&st.stderr));
        assert!(std::fs::read(root.join("bin/nvlink")).unwrap() == original, "uninstall did not restore nvlink");
        assert!(!root.join("bin/.nvlinkd").exists(), "uninstall left bin/.nvlinkd");
    }
}

/// A pip-managed toolkit (inside site-packages) and a read-only one are
/// refused with a message, and left as they were.
#[test]
fn in_place_install_refuses_managed_and_read_only_toolkits() {
    let work = TempDir::new("inpl-refuse");
    let pip_dir = work.path().join("lib/python3/site-packages/nvidia");
    std::fs::create_dir_all(&pip_dir).unwrap();
    let root = private_toolkit(&pip_dir);
    let original = std::fs::read(root.join("bin/nvlink")).unwrap();
    let st = nvlinkd_cmd(&["install", "--in-place"], &root);
    let msg = String::from_utf8_lossy(&st.stderr);
    assert!(!st.status.success() && msg.contains("managed by pip"), "pip-managed toolkit accepted: {msg}");
    assert!(msg.contains("overlay") && msg.contains("--prefix"), "the refusal does not name the overlay: {msg}");
    assert!(std::fs::read(root.join("bin/nvlink")).unwrap() == original && !root.join("bin/.nvlinkd").exists());

    // A symlink planted at bin/.nvlinkd (where the real nvlink is kept):
    // refused, and nothing written where it points.
    let planted = private_toolkit(&work.path().join("planted"));
    let elsewhere = work.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, planted.join("bin/.nvlinkd")).unwrap();
    for cmd in [&["install", "--in-place"][..], &["uninstall"][..]] {
        let st = nvlinkd_cmd(cmd, &planted);
        let msg = String::from_utf8_lossy(&st.stderr);
        if cmd[0] == "install" {
            assert!(!st.status.success() && msg.contains("not a directory"), "planted bin/.nvlinkd accepted: {msg}");
        }
        assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0, "{cmd:?} wrote through bin/.nvlinkd");
    }

    // A conda environment's toolkit, and an rpm-owned one (an `rpm` on PATH
    // that says a package owns bin/nvlink): refused, naming the overlay.
    let conda = work.path().join("conda-env");
    std::fs::create_dir_all(conda.join("conda-meta")).unwrap();
    let fake = work.path().join("fakebin");
    std::fs::create_dir_all(&fake).unwrap();
    std::fs::write(fake.join("rpm"), "#!/bin/sh\necho cuda-nvlink-13-5-13.5.37-1.x86_64\n").unwrap();
    std::fs::set_permissions(fake.join("rpm"), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let path = format!("{}:{}", fake.display(), std::env::var("PATH").unwrap_or_default());
    for (root, said) in
        [(private_toolkit(&conda), "managed by conda"), (private_toolkit(&work.path().join("rpm")), "rpm package")]
    {
        let st = Command::new(nvlinkd())
            .args(["install", "--in-place", "--cuda-home"])
            .arg(&root)
            .env("PATH", &path)
            .output()
            .expect("run nvlinkd");
        let msg = String::from_utf8_lossy(&st.stderr);
        assert!(!st.status.success() && msg.contains(said), "{said}: accepted: {msg}");
        assert!(msg.contains("overlay") && msg.contains("--prefix"), "the refusal does not name the overlay: {msg}");
        assert!(!root.join("bin/.nvlinkd").exists());
    }

    // Read-only: a read-only bind mount of bin/ (root ignores permission bits).
    let root = private_toolkit(&work.path().join("ro"));
    let bin = root.join("bin");
    let mounted = Command::new("mount").arg("--bind").arg(&bin).arg(&bin).status().is_ok_and(|s| s.success());
    if !mounted {
        println!("skipped the read-only case: cannot bind-mount here");
        return;
    }
    let ro = Command::new("mount").args(["-o", "remount,bind,ro"]).arg(&bin).status().is_ok_and(|s| s.success());
    let st = ro.then(|| nvlinkd_cmd(&["install", "--in-place"], &root));
    let _ = Command::new("umount").arg(&bin).status();
    let Some(st) = st else {
        println!("skipped the read-only case: cannot remount read-only here");
        return;
    };
    let msg = String::from_utf8_lossy(&st.stderr);
    assert!(!st.status.success() && msg.contains("read-only"), "read-only toolkit accepted: {msg}");
    assert!(!root.join("bin/.nvlinkd").exists());
}

/// `install --in-place` into a toolkit whose `bin/` other users can write:
/// it goes on (the toolkit is the operator's to share), but says on stderr
/// that they could replace the shim, naming the directory and who; a `bin/`
/// of this user's alone gets no warning.
#[test]
fn in_place_install_into_a_bin_others_can_write_warns() {
    use std::os::unix::fs::PermissionsExt;
    let work = TempDir::new("inpl-open");
    let root = private_toolkit(work.path());
    let bin = root.join("bin");
    let shown = bin.canonicalize().unwrap().display().to_string();
    for (mode, who) in [(0o755, None), (0o775, Some("the members of group")), (0o777, Some("every user"))] {
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(mode)).unwrap();
        let st = nvlinkd_cmd(&["install", "--in-place"], &root);
        let msg = String::from_utf8_lossy(&st.stderr);
        assert!(st.status.success(), "{mode:o}: {msg}");
        match who {
            None => assert!(!msg.contains("warning"), "{mode:o}: {msg}"),
            Some(who) => {
                let said = format!("nvlinkd: warning: {shown} (mode {mode:03o}) can be written by {who}");
                assert!(msg.contains(&said) && msg.contains(&format!("{shown}/nvlink")), "{mode:o}: {msg}");
            }
        }
    }
    let st = nvlinkd_cmd(&["uninstall"], &root);
    assert!(st.status.success(), "{}", String::from_utf8_lossy(&st.stderr));
}

/// `nvlinkd exec` run from an overlay links for the overlay's toolkit (its
/// record), with no `CUDA_HOME` in its environment: nvlink's result.
#[test]
fn exec_in_an_overlay_uses_the_overlays_toolkit() {
    let prefix = TempDir::new("ovl-exec");
    install_overlay(prefix.path());
    let out = TempDir::new("ovl-exec-out");
    let link = ["--arch=sm_90", "accumulate.o", "scale.o", "-o"].map(String::from);
    let inv = |pre: &[&str]| Invocation {
        args: pre
            .iter()
            .map(|s| s.to_string())
            .chain(link.iter().cloned())
            .chain([out.path().join("out.cubin").display().to_string()])
            .collect(),
        cwd: corpus::dir().clone(),
        env: vec![],
        out_dir: out.path().to_path_buf(),
    };
    let expected = run(&real_nvlink(), &inv(&[]), &[]);
    assert_eq!(expected.code, 0, "{}", String::from_utf8_lossy(&expected.stderr));
    let actual = run(&prefix.path().join("bin/nvlinkd"), &inv(&["exec", "--"]), &[]);
    let cmp = compare::runs(&expected, &actual);
    assert!(cmp.problems.is_empty(), "{:?}", cmp.problems);
}

/// A daemon never runs without a usable toolkit: one started from an overlay
/// without `CUDA_HOME` serves the overlay's toolkit (links in process); with
/// no toolkit at all, or a `--cuda-home` that is none, `start` and `serve`
/// refuse with a message instead of leaving a daemon that declines every link.
#[test]
fn a_daemon_never_runs_without_a_usable_toolkit() {
    let prefix = TempDir::new("ovl-start");
    install_overlay(prefix.path());
    let dir = TempDir::new("ovl-start-d");
    let sock = dir.path().join("sock");
    // `nvlinkd start` on the test's socket and cache, without CUDA_HOME.
    let start = |exe: &Path, extra: &[&str]| {
        let mut cmd = Command::new(exe);
        cmd.arg("start")
            .arg("--socket")
            .arg(&sock)
            .arg("--cache-dir")
            .arg(dir.path().join("cache"))
            .args(extra)
            .env_remove("CUDA_HOME");
        cmd
    };
    let overlay_nvlinkd = prefix.path().join("bin/nvlinkd");
    let started = start(&overlay_nvlinkd, &[]).output().expect("nvlinkd start");
    assert!(started.status.success(), "{}", String::from_utf8_lossy(&started.stderr));
    let out = TempDir::new("ovl-start-out");
    let link = Invocation::templated("--arch=sm_90 accumulate.o scale.o -o {OUT}/out.cubin", corpus::dir(), &out);
    let expected = run(&real_nvlink(), &link, &[]);
    let mut cmd = Command::new(prefix.path().join("bin/nvlink"));
    cmd.args(&link.args)
        .current_dir(&link.cwd)
        .env_remove("CUDA_HOME")
        .env("NVLINKD_SOCKET", &sock)
        .env("NVLINKD_FALLBACK", "never");
    let actual = cmd.output().expect("the overlay's shim");
    assert!(actual.status.success(), "{}", String::from_utf8_lossy(&actual.stderr));
    assert_eq!(std::fs::read(out.path().join("out.cubin")).unwrap(), expected.files["out.cubin"]);
    let stats = Command::new(&overlay_nvlinkd).args(["stats", "--json", "--socket"]).arg(&sock).output().unwrap();
    let stats: serde_json::Value = serde_json::from_slice(&stats.stdout).expect("stats");
    assert_eq!(stats["in_process"], 1, "{stats}");
    let _ = Command::new(&overlay_nvlinkd).args(["stop", "--socket"]).arg(&sock).output();

    // No toolkit anywhere (nvlinkd outside an overlay, no CUDA_HOME, no
    // toolkit's nvlink on PATH), or not a toolkit: refused, saying how to name one.
    let mut cases: Vec<&[&str]> = vec![&["--cuda-home", "/not/a/toolkit"]];
    if Path::new("/usr/local/cuda/bin/nvlink").is_file() {
        eprintln!("SKIP (no toolkit anywhere): /usr/local/cuda is a toolkit here, every nvlinkd finds one");
    } else {
        cases.push(&[]);
    }
    for extra in cases {
        let refused = start(&nvlinkd(), extra).env("PATH", "/usr/bin:/bin").output().expect("nvlinkd start");
        let said = String::from_utf8_lossy(&refused.stderr).into_owned();
        assert!(!refused.status.success(), "nvlinkd start {extra:?} started a daemon without a toolkit");
        assert!(said.contains("toolkit") && said.contains("--cuda-home"), "no word on naming a toolkit: {said}");
    }
    assert!(!sock.exists(), "a daemon was left behind");
}

/// Without `--cuda-home` and `CUDA_HOME`, a daemon takes the toolkit of the
/// nvlink on `PATH`: a toolkit's own, or, where that nvlink is an overlay's
/// shim, the toolkit the overlay records (never the overlay itself, whose
/// nvlink is the shim). `start` hands the daemon the toolkit it found.
#[test]
fn without_cuda_home_a_daemon_takes_the_toolkit_of_the_nvlink_on_path() {
    let prefix = TempDir::new("ovl-path");
    install_overlay(prefix.path());
    let toolkit = cuda_home().canonicalize().unwrap();
    for first in [prefix.path().join("bin"), cuda_home().join("bin")] {
        let dir = TempDir::new("ovl-path-d");
        let sock = dir.path().join("sock");
        let path = format!("{}:/usr/bin:/bin", first.display());
        let started = Command::new(nvlinkd())
            .arg("start")
            .arg("--socket")
            .arg(&sock)
            .arg("--cache-dir")
            .arg(dir.path().join("cache"))
            .env_remove("CUDA_HOME")
            .env("PATH", &path)
            .output()
            .expect("nvlinkd start");
        assert!(started.status.success(), "PATH={path}: {}", String::from_utf8_lossy(&started.stderr));
        let status = Command::new(nvlinkd()).args(["status", "--socket"]).arg(&sock).output().unwrap();
        let _ = Command::new(nvlinkd()).args(["stop", "--socket"]).arg(&sock).output();
        let status = String::from_utf8_lossy(&status.stdout).into_owned();
        let served = status.lines().find_map(|l| l.trim().strip_prefix("toolkits: ")).unwrap_or_default();
        assert_eq!(Path::new(served.trim()).canonicalize().ok(), Some(toolkit.clone()), "PATH={path}: {status}");
    }
}

/// nvcc's builds of one program, per variant (run from the corpus directory):
/// the device link of a multi-arch (two `-gencode`) build with a static
/// library and a host-only object, the same with `-dlto`, with `-G`, and a
/// full two-arch build (device link and host link: an executable). Compared
/// whole, byte for byte, except `-G`'s (see [`debug_cubins`]).
const VARIANTS: [&[&str]; 4] = [
    &[
        "-gencode",
        "arch=compute_80,code=sm_80",
        "-gencode",
        "arch=compute_90,code=sm_90",
        "-dlink",
        "xcall_main_3arch.o",
        "lib/libxcall.a",
        "livedead_3arch.o",
        "host_main.cpp.o",
    ],
    &[
        "-dlto",
        "-gencode",
        "arch=compute_80,code=sm_80",
        "-gencode",
        "arch=compute_90,code=sm_90",
        "-dlink",
        "xcall_main_lto3.o",
        "lib/libxcall_lto.a",
    ],
    &["-arch=sm_90", "-G", "-dlink", "accumulate_G.o", "scale_G.o", "cdp_G.o"],
    &[
        "-gencode",
        "arch=compute_80,code=sm_80",
        "-gencode",
        "arch=compute_90,code=sm_90",
        "-rdc=true",
        "recursion_2arch.o",
    ],
];

/// The `-G` variant's device code: its cubins (`cuobjdump -xelf all`, out of
/// the compressed fatbin), names and bytes. With `-g` nvlink records the names
/// of its output and registration files, which nvcc makes
/// `tmpxft_<pid>_<n>-…` in its temporary directory, so two plain `-G` builds
/// differ there (and in the compressed fatbin holding them) and nowhere else:
/// those 17 characters are blanked.
fn debug_cubins(object: &Path) -> Vec<u8> {
    let dir = object.with_extension("cubins");
    std::fs::create_dir_all(&dir).unwrap();
    let st = Command::new(cuda_home().join("bin/cuobjdump"))
        .args(["-xelf", "all"])
        .arg(object)
        .current_dir(&dir)
        .output()
        .expect("run cuobjdump");
    assert!(st.status.success(), "cuobjdump: {}", String::from_utf8_lossy(&st.stderr));
    let mut names: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().map(|e| e.path()).collect();
    names.sort();
    assert!(!names.is_empty(), "no cubin in {}", object.display());
    let mut all = Vec::new();
    for p in names {
        all.extend_from_slice(p.file_name().unwrap().as_encoded_bytes());
        let mut bytes = std::fs::read(&p).unwrap();
        const TMP: &[u8] = b"tmpxft_";
        let mut i = 0;
        while let Some(at) = bytes[i..].windows(TMP.len()).position(|w| w == TMP) {
            let from = i + at + TMP.len();
            let to = (from + 17).min(bytes.len());
            bytes[from..to].fill(b'x');
            i = to;
        }
        all.extend_from_slice(&bytes);
    }
    all
}

/// An overlay build is the plain build, byte for byte: nvcc run from the
/// overlay passes nvlink paths under the overlay (`-L<overlay>/bin/../lib`,
/// `-nvvmpath=<overlay>/bin/../nvvm`), which nvlink records in every cubin;
/// the overlay's shim writes them as the toolkit's own, so each variant's
/// device-link object (and executable) equals the one the toolkit's nvcc
/// makes, whether the daemon links or the shim falls back to the real nvlink,
/// and whether nvcc is named by an absolute or a relative path.
#[test]
fn an_overlay_build_is_byte_identical_to_the_plain_build() {
    let d = Daemon::start();
    let prefix = TempDir::new("ovl-same");
    install_overlay(prefix.path());
    let corpus = corpus::dir();
    let work = TempDir::new("ovl-same-out");
    // Each build's outputs under the same names in a directory of its own:
    // nvcc names its temporary files after the output.
    let build = |nvcc: &Path, tag: &str, env: &[(String, String)]| -> Vec<Vec<u8>> {
        let dir = work.path().join(tag);
        std::fs::create_dir_all(&dir).unwrap();
        VARIANTS
            .iter()
            .enumerate()
            .map(|(i, args)| {
                let out = dir.join(format!("v{i}_dlink.o"));
                let out_s = out.display().to_string();
                let st = Command::new(nvcc)
                    .args(args.iter().copied().chain(["-o", &out_s]))
                    .current_dir(corpus)
                    .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
                    .output()
                    .expect("run nvcc");
                assert!(st.status.success(), "{tag} {args:?}: {}", String::from_utf8_lossy(&st.stderr));
                if args.contains(&"-G") {
                    debug_cubins(&out)
                } else {
                    std::fs::read(&out).unwrap()
                }
            })
            .collect()
    };
    let plain = build(&cuda_home().join("bin/nvcc"), "plain", &[]);

    let mut env = d.shim_env();
    env.retain(|(k, _)| k != "CUDA_HOME");
    let before = d.stat("requests");
    let daemon = build(&prefix.path().join("bin/nvcc"), "daemon", &env);
    assert_eq!(d.stat("requests") - before, 7, "the device links did not go through nvlinkd");
    // nvcc named relatively (its paths are then relative to the build's directory).
    let rel = pathdiff(prefix.path(), corpus).join("bin/nvcc");
    let relative = build(&rel, "relative", &env);
    // No daemon: the shim runs the real nvlink the overlay records.
    let no_daemon = [
        ("NVLINKD_SOCKET".to_string(), work.path().join("none/sock").display().to_string()),
        ("NVLINKD_BIN".to_string(), "/nonexistent/nvlinkd".to_string()),
    ];
    let fallback = build(&prefix.path().join("bin/nvcc"), "fallback", &no_daemon);
    for (how, got) in
        [("through the daemon", &daemon), ("nvcc named relatively", &relative), ("by the real nvlink", &fallback)]
    {
        for (i, (p, o)) in plain.iter().zip(got).enumerate() {
            assert!(
                p == o,
                "variant {i} ({:?}) {how}: the overlay's output differs from the plain build's",
                VARIANTS[i]
            );
        }
    }
}

/// `to` relative to the directory `from` (both absolute): `../../x`.
fn pathdiff(to: &Path, from: &Path) -> std::path::PathBuf {
    let (to, from) = (to.canonicalize().unwrap(), from.canonicalize().unwrap());
    let common = to.components().zip(from.components()).take_while(|(a, b)| a == b).count();
    let mut rel = std::path::PathBuf::new();
    for _ in from.components().skip(common) {
        rel.push("..");
    }
    rel.extend(to.components().skip(common));
    rel
}

/// `install --prefix` into a directory another user could change is refused
/// before anything is written (they could swap the overlay's `nvcc` or plant
/// symlinks that redirect the install's writes), and what the install writes
/// goes through fresh files: a symlink left at a temporary file's name is
/// replaced, never written through. Under `umask 002` the directories it
/// makes are still for this user alone.
#[test]
fn install_refuses_a_prefix_others_can_change_and_never_writes_through_symlinks() {
    use std::os::unix::fs::{symlink, PermissionsExt};
    let work = TempDir::new("ovl-own");
    let install = |prefix: &Path, umask: &str| {
        Command::new("sh")
            .arg("-c")
            .arg(format!("umask {umask}; exec \"$0\" install --cuda-home \"$1\" --prefix \"$2\""))
            .arg(nvlinkd())
            .arg(cuda_home())
            .arg(prefix)
            .output()
            .unwrap()
    };
    let refused = |prefix: &Path, says: &str| {
        let st = install(prefix, "022");
        let msg = String::from_utf8_lossy(&st.stderr);
        assert!(!st.status.success() && msg.contains(says), "{}: {msg}", prefix.display());
        assert!(!prefix.join("bin").exists(), "{}: written before the refusal", prefix.display());
    };
    let open = work.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    refused(&open, "chmod go-w");
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        let theirs = work.path().join("theirs");
        std::fs::create_dir(&theirs).unwrap();
        std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
        refused(&theirs, "belongs to uid 65534");
    }

    // Our own prefix, with symlinks at the install's temporary names.
    let victim = work.path().join("victim");
    std::fs::write(&victim, b"notes").unwrap();
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).unwrap();
    let prefix = work.path().join("mine");
    std::fs::create_dir_all(prefix.join("bin")).unwrap();
    symlink(&victim, prefix.join("bin/nvlink.nvlinkd-tmp")).unwrap();
    symlink(&victim, prefix.join("nvlinkd-overlay.nvlinkd-tmp")).unwrap();
    let st = install(&prefix, "022");
    assert!(st.status.success(), "{}", String::from_utf8_lossy(&st.stderr));
    assert_eq!(std::fs::read(&victim).unwrap(), b"notes", "written through a symlink");
    assert_eq!(std::fs::metadata(&victim).unwrap().permissions().mode() & 0o777, 0o600);
    assert!(std::fs::symlink_metadata(prefix.join("bin/nvlink")).unwrap().is_file());
    assert_eq!(std::fs::read(prefix.join("bin/nvlink")).unwrap(), std::fs::read(shim()).unwrap());

    // Under a directory others can write (group-writable, not sticky, as a
    // shared tools directory of a team): another member could move the
    // overlay away and put theirs in its place. Refused.
    let team = work.path().join("team");
    std::fs::create_dir(&team).unwrap();
    std::fs::set_permissions(&team, std::fs::Permissions::from_mode(0o775)).unwrap();
    refused(&team.join("ovl"), "which other users can write");

    // A relative prefix: the record names the overlay's files absolutely
    // (the shim runs them from whatever directory a build is in).
    let st = Command::new(nvlinkd())
        .args(["install", "--cuda-home"])
        .arg(cuda_home())
        .args(["--prefix", "rel"])
        .current_dir(work.path())
        .output()
        .unwrap();
    assert!(st.status.success(), "{}", String::from_utf8_lossy(&st.stderr));
    let record = std::fs::read_to_string(work.path().join("rel/nvlinkd-overlay.env")).unwrap();
    for line in record.lines() {
        let (key, path) = line.split_once('=').unwrap();
        assert!(Path::new(path).is_absolute(), "{key} is relative in the record: {record}");
    }

    // umask 002: a fresh prefix and its bin/ are not group-writable.
    let fresh = work.path().join("fresh/overlay");
    let st = install(&fresh, "002");
    assert!(st.status.success(), "{}", String::from_utf8_lossy(&st.stderr));
    for d in [fresh.parent().unwrap(), &fresh, &fresh.join("bin")] {
        let mode = std::fs::metadata(d).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode & 0o022, 0, "{} is {mode:03o}", d.display());
    }
}
