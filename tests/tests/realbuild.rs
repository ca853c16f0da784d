//! Real-build check: the CMake project in `tests/realbuild/` (separable
//! compilation, a static device library, dynamic parallelism, libcu++ and CUB
//! units, host-only C++ units, two programs, CMAKE_CUDA_ARCHITECTURES "80;90"), built with
//! CMake and Ninja from PyPI (`scripts/setup-cmake.sh`) through an nvlinkd
//! overlay, with LTO off and on. Every nvlink call the build makes goes through
//! a recording wrapper that first runs the real nvlink on the arguments the
//! same build through the toolkit would pass (the overlay's root written as
//! the toolkit's, as nvcc run from the toolkit derives them; outputs
//! redirected), then the shim on the build's own: exit status, messages, the
//! cubin and the registration file must be equal byte for byte, so the overlay
//! build's device links are the plain build's.
//! Needs no GPU; skipped with a message where CMake cannot be installed.

use std::path::{Path, PathBuf};
use std::process::Command;

use nvlinkd_tests::daemon::Daemon;
use nvlinkd_tests::env::{cuda_home, install_overlay, real_nvlink, repo_root, TempDir};

/// The wrapper installed as the overlay's `bin/nvlink` (the shim moves to
/// `bin/nvlink.shim`, where it still finds the overlay's record).
const WRAPPER: &str = r#"#!/bin/bash
rec=$(mktemp -d "$NVLINKD_RECORD_DIR/link.XXXXXX")
printf '%s\n' "$@" > "$rec/args"
real=() out="" reg="" prev=""
for a in "$@"; do
  a=${a//"$NVLINKD_OVERLAY"/"$NVLINKD_TOOLKIT"}
  if [[ $prev == -o ]]; then out=$a; real+=("$rec/real.out"); prev=""; continue; fi
  case $a in
    --register-link-binaries=*) reg=${a#*=}; real+=("--register-link-binaries=$rec/real.reg") ;;
    *) real+=("$a") ;;
  esac
  prev=$a
done
# nvcc runs one nvlink per arch with the same registration file: start the
# real nvlink from the file as the shim finds it.
[[ -n $reg && -f $reg ]] && cp "$reg" "$rec/real.reg"
"$NVLINKD_REAL" "${real[@]}" > "$rec/real.stdout" 2> "$rec/real.stderr"
echo $? > "$rec/real.rc"
"$(dirname "$0")/nvlink.shim" "$@" > "$rec/shim.stdout" 2> "$rec/shim.stderr"
rc=$?
echo $rc > "$rec/shim.rc"
[[ -n $out && -f $out ]] && cp "$out" "$rec/shim.out"
[[ -n $reg && -f $reg ]] && cp "$reg" "$rec/shim.reg"
cat "$rec/shim.stdout"
cat "$rec/shim.stderr" >&2
exit $rc
"#;

/// CMake and Ninja, installed once per test process (the tests here run in
/// parallel; the script also takes a lock, for other processes).
fn cmake_bin() -> Option<PathBuf> {
    static BIN: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        let out = Command::new(repo_root().join("scripts/setup-cmake.sh")).output().ok()?;
        if !out.status.success() {
            println!("skipped: cannot install CMake and Ninja: {}", String::from_utf8_lossy(&out.stderr));
            return None;
        }
        Some(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
    })
    .clone()
}

fn run_ok(cmd: &mut Command) {
    let out = cmd.output().expect("run");
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn read(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap_or_default()
}

#[test]
fn cmake_build_device_links_equal_the_real_nvlink() {
    let Some(tools) = cmake_bin() else { return };
    let d = Daemon::start();
    let work = TempDir::new("realbuild");
    let prefix = work.path().join("overlay");
    install_overlay(&prefix);
    let bin = prefix.join("bin");
    std::fs::rename(bin.join("nvlink"), bin.join("nvlink.shim")).unwrap();
    std::fs::write(bin.join("nvlink"), WRAPPER).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(bin.join("nvlink"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let records = work.path().join("records");
    std::fs::create_dir_all(&records).unwrap();

    let mut env = d.shim_env();
    env.push(("NVLINKD_RECORD_DIR".into(), records.display().to_string()));
    env.push(("NVLINKD_REAL".into(), real_nvlink().display().to_string()));
    env.push(("NVLINKD_OVERLAY".into(), prefix.display().to_string()));
    env.push(("NVLINKD_TOOLKIT".into(), cuda_home().display().to_string()));
    let before = d.stat("requests");
    for (tag, extra) in [("separable", "OFF"), ("lto", "ON")] {
        let build = work.path().join(tag);
        run_ok(
            Command::new(tools.join("cmake"))
                .args(["-G", "Ninja", "-S"])
                .arg(repo_root().join("tests/realbuild"))
                .arg("-B")
                .arg(&build)
                .arg(format!("-DCMAKE_MAKE_PROGRAM={}", tools.join("ninja").display()))
                .arg(format!("-DCMAKE_CUDA_COMPILER={}", bin.join("nvcc").display()))
                .arg(format!("-DCMAKE_INTERPROCEDURAL_OPTIMIZATION={extra}"))
                .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str()))),
        );
        run_ok(
            Command::new(tools.join("cmake"))
                .arg("--build")
                .arg(&build)
                .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str()))),
        );
        assert!(build.join("app").is_file() && build.join("tool").is_file(), "{tag}: no executables");
    }

    let mut links = 0;
    let mut lto = 0;
    let mut problems = Vec::new();
    for rec in std::fs::read_dir(&records).unwrap().flatten().map(|e| e.path()) {
        links += 1;
        let args = String::from_utf8_lossy(&read(&rec.join("args"))).replace('\n', " ");
        lto += usize::from(args.contains("-dlto"));
        for (what, real, shim) in [
            ("exit status", "real.rc", "shim.rc"),
            ("stdout", "real.stdout", "shim.stdout"),
            ("stderr", "real.stderr", "shim.stderr"),
            ("output", "real.out", "shim.out"),
            ("registration file", "real.reg", "shim.reg"),
        ] {
            if read(&rec.join(real)) != read(&rec.join(shim)) {
                problems.push(format!("{what} differs for nvlink {args}"));
            }
        }
        if read(&rec.join("shim.out")).is_empty() {
            problems.push(format!("no output for nvlink {args}"));
        }
    }
    println!("real-build check: {links} device links ({lto} LTO), {} through the daemon", d.stat("requests") - before);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    // Two configurations, two programs, one nvlink call per architecture each.
    assert!(links >= 8 && lto >= 4, "expected the device links of both builds, got {links} ({lto} LTO)");
    assert!(d.stat("requests") - before >= links as u64, "the device links did not go through nvlinkd");
}

/// The device-link objects CMake made in `build` (`cmake_device_link.o`,
/// one per program: every architecture's cubin and the registration code),
/// by path below `build`, in order.
fn device_link_objects(build: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut found = Vec::new();
    let mut dirs = vec![build.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for e in std::fs::read_dir(&dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.file_name().is_some_and(|n| n == "cmake_device_link.o") {
                found.push((p.strip_prefix(build).unwrap().to_path_buf(), read(&p)));
            }
        }
    }
    found.sort();
    found
}

/// A CMake project configured with `CMAKE_CUDA_COMPILER=<overlay>/bin/nvcc`,
/// the overlay as `nvlinkd install` made it, builds the device code that the
/// same project configured with the toolkit's nvcc builds: with LTO on (app's
/// device link partial LTO, tool's whole-program LTO, both for two
/// architectures, `-nvvmpath` and `-L` under the overlay), each program's
/// `cmake_device_link.o` equals the plain build's byte for byte, and the
/// overlay build's links went through the daemon.
#[test]
fn a_cmake_build_with_the_overlays_nvcc_is_byte_identical_to_the_plain_build() {
    let Some(tools) = cmake_bin() else { return };
    let d = Daemon::start();
    let work = TempDir::new("cmake-same");
    let prefix = work.path().join("overlay");
    install_overlay(&prefix);
    let mut env = d.shim_env();
    env.retain(|(k, _)| k != "CUDA_HOME");
    let build = |tag: &str, nvcc: &Path, env: &[(String, String)]| {
        let build = work.path().join(tag);
        let cmake = || {
            let mut c = Command::new(tools.join("cmake"));
            c.env_remove("CUDA_HOME").envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
            c
        };
        run_ok(
            cmake()
                .args(["-G", "Ninja", "-S"])
                .arg(repo_root().join("tests/realbuild"))
                .arg("-B")
                .arg(&build)
                .arg(format!("-DCMAKE_MAKE_PROGRAM={}", tools.join("ninja").display()))
                .arg(format!("-DCMAKE_CUDA_COMPILER={}", nvcc.display()))
                .arg("-DCMAKE_INTERPROCEDURAL_OPTIMIZATION=ON"),
        );
        run_ok(cmake().arg("--build").arg(&build));
        device_link_objects(&build)
    };
    let plain = build("plain", &cuda_home().join("bin/nvcc"), &[]);
    let before = d.stat("requests");
    let overlay = build("overlay", &prefix.join("bin/nvcc"), &env);
    let names = |objects: &[(PathBuf, Vec<u8>)]| objects.iter().map(|(p, _)| p.clone()).collect::<Vec<_>>();
    assert_eq!(names(&plain).len(), 2, "expected app's and tool's device links: {:?}", names(&plain));
    assert_eq!(names(&plain), names(&overlay));
    for ((name, p), (_, o)) in plain.iter().zip(&overlay) {
        assert!(p == o, "{}: the overlay build's device code differs from the plain build's", name.display());
    }
    // One nvlink per program and architecture.
    assert!(d.stat("requests") - before >= 4, "the overlay build's device links did not go through nvlinkd");
}
