//! `nvlinkd install --in-place` on a toolkit a Debian package owns: the real
//! nvlink is diverted with `dpkg-divert`, a package upgrade writes the new
//! nvlink to the diverted name and leaves the shim, and `uninstall` gives dpkg
//! back the package as it was.
//!
//! With a real package: a small `.deb` holding a copy of the test toolkit's
//! nvlink under `/opt/nvlinkd-test-cuda`, installed with `dpkg -i` (needs root
//! and dpkg; skipped with a message otherwise). The package, its diversion and
//! its directory are removed however the test ends. The first install is the
//! `RUN` line of `deploy/docker/Dockerfile.cuda-nvlinkd`, through a symlink to
//! the toolkit as NVIDIA's images have `/usr/local/cuda`: what that image
//! fragment does to their Debian-packaged toolkits.

use std::path::{Path, PathBuf};
use std::process::Command;

use nvlinkd_tests::corpus;
use nvlinkd_tests::daemon::Daemon;
use nvlinkd_tests::env::{nvlinkd, real_nvlink, repo_root, shim, TempDir};
use nvlinkd_tests::run::{run, Invocation};

const PACKAGE: &str = "nvlinkd-test-cuda-nvlink";
const ROOT: &str = "/opt/nvlinkd-test-cuda";

fn sh(cmd: &mut Command) -> std::process::Output {
    cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"))
}

fn ok(cmd: &mut Command) -> String {
    let out = sh(cmd);
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Leaves the machine as the test found it: no diversion of the package's
/// nvlink, no package, no directory.
struct Cleanup;

impl Cleanup {
    fn run() {
        let nvlink = format!("{ROOT}/bin/nvlink");
        let listed = sh(Command::new("dpkg-divert").args(["--listpackage", &nvlink]));
        if !String::from_utf8_lossy(&listed.stdout).trim().is_empty() {
            let _ = sh(Command::new("dpkg-divert").args(["--remove", "--no-rename", &nvlink]));
        }
        let _ = sh(Command::new("dpkg").args(["-P", PACKAGE]));
        let _ = std::fs::remove_dir_all(ROOT);
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        Cleanup::run();
    }
}

fn have(tool: &str) -> bool {
    Command::new(tool).arg("--version").output().is_ok_and(|o| o.status.success())
}

/// A `.deb` of version `version` holding `nvlink` as `ROOT/bin/nvlink`.
fn deb(dir: &Path, version: &str, nvlink: &[u8]) -> PathBuf {
    let tree = dir.join(format!("tree{version}"));
    let bin = tree.join(&ROOT[1..]).join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::create_dir_all(tree.join("DEBIAN")).unwrap();
    std::fs::write(bin.join("nvlink"), nvlink).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(bin.join("nvlink"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let arch = ok(Command::new("dpkg").arg("--print-architecture"));
    std::fs::write(
        tree.join("DEBIAN/control"),
        format!(
            "Package: {PACKAGE}\nVersion: {version}\nArchitecture: {}\nMaintainer: nvlinkd tests <root@localhost>\n\
             Description: nvlinkd test: a CUDA nvlink owned by a package\n",
            arch.trim()
        ),
    )
    .unwrap();
    let sum = ok(Command::new("md5sum").arg(format!("{}/bin/nvlink", &ROOT[1..])).current_dir(&tree));
    std::fs::write(tree.join("DEBIAN/md5sums"), sum).unwrap();
    let out = dir.join(format!("{PACKAGE}_{version}.deb"));
    ok(Command::new("dpkg-deb").args(["--root-owner-group", "-Znone", "--build"]).arg(&tree).arg(&out));
    out
}

/// A link of the shim at `ROOT/bin/nvlink` with `env`: its cubin.
fn link(out: &TempDir, name: &str, env: &[(String, String)]) -> Vec<u8> {
    let inv =
        Invocation::templated(&format!("--arch=sm_90 accumulate.o scale.o -o {{OUT}}/{name}"), corpus::dir(), out);
    let got = run(Path::new(&format!("{ROOT}/bin/nvlink")), &inv, env);
    assert_eq!(got.code, 0, "{}", String::from_utf8_lossy(&got.stderr));
    got.files[name].clone()
}

fn nvlinkd_cmd(args: &[&str]) -> std::process::Output {
    sh(Command::new(nvlinkd()).args(args).args(["--cuda-home", ROOT]))
}

/// The `RUN` line of the CUDA image fragment that installs nvlinkd in place,
/// for `sh -c`: this build's nvlinkd for the image's, and `cuda` for
/// `/usr/local/cuda`.
fn image_install_command(cuda: &Path) -> String {
    let fragment = repo_root().join("deploy/docker/Dockerfile.cuda-nvlinkd");
    let text = std::fs::read_to_string(&fragment).unwrap();
    let run = text.lines().filter_map(|l| l.strip_prefix("RUN ")).find(|l| l.contains(" install --in-place "));
    let run = run.unwrap_or_else(|| panic!("{} installs nothing in place", fragment.display()));
    let (binary, args) = run.split_once(' ').unwrap();
    assert!(binary.ends_with("/nvlinkd") && args.contains("--cuda-home /usr/local/cuda"), "{run}");
    format!("{} {}", nvlinkd().display(), args.replace("/usr/local/cuda", &cuda.display().to_string()))
}

#[test]
fn in_place_on_a_dpkg_owned_toolkit_diverts_nvlink_and_survives_a_package_upgrade() {
    if !(have("dpkg") && have("dpkg-deb") && have("dpkg-divert")) {
        println!("SKIP: no dpkg here (dpkg, dpkg-deb, dpkg-divert): the Debian in-place install is not tested");
        return;
    }
    if nvlinkd_proto::paths::uid() != 0 {
        println!("SKIP: not root: dpkg -i of the test package needs root");
        return;
    }
    Cleanup::run();
    let _cleanup = Cleanup;
    let d = Daemon::start();
    let work = TempDir::new("deb");
    let out = TempDir::new("deb-out");
    let nvlink = format!("{ROOT}/bin/nvlink");
    let kept = format!("{ROOT}/bin/.nvlinkd/nvlink");

    // The plain nvlink's answer.
    let inv = Invocation::templated("--arch=sm_90 accumulate.o scale.o -o {OUT}/plain.cubin", corpus::dir(), &out);
    let plain = run(&real_nvlink(), &inv, &[]).files["plain.cubin"].clone();

    let v1 = std::fs::read(real_nvlink()).unwrap();
    ok(Command::new("dpkg").arg("-i").arg(deb(work.path(), "1", &v1)));

    // As the CUDA image fragment installs it, through a symlinked root.
    let cuda = work.path().join("cuda");
    std::os::unix::fs::symlink(ROOT, &cuda).unwrap();
    ok(Command::new("sh").arg("-c").arg(image_install_command(&cuda)));
    assert!(std::fs::read(&nvlink).unwrap() == std::fs::read(shim()).unwrap(), "bin/nvlink is not the shim");
    assert!(std::fs::read(&kept).unwrap() == v1, "the real nvlink was not kept");
    assert_eq!(ok(Command::new("dpkg-divert").args(["--listpackage", &nvlink])).trim(), "nvlinkd");
    assert_eq!(ok(Command::new("dpkg-divert").args(["--truename", &nvlink])).trim(), kept);
    // Again: idempotent.
    let st = nvlinkd_cmd(&["install", "--in-place"]);
    assert!(st.status.success(), "{}", String::from_utf8_lossy(&st.stderr));
    assert!(std::fs::read(&kept).unwrap() == v1);

    let mut env = d.shim_env();
    env.retain(|(k, _)| k != "CUDA_HOME");
    // No daemon: the shim runs the real nvlink at the diverted name.
    let no_daemon = [
        ("NVLINKD_SOCKET".to_string(), work.path().join("none/sock").display().to_string()),
        ("NVLINKD_BIN".to_string(), "/nonexistent/nvlinkd".to_string()),
    ];
    let before = d.stat("requests");
    assert!(link(&out, "v1.cubin", &env) == plain, "version 1, through the daemon: differs from nvlink's");
    assert_eq!(d.stat("requests") - before, 1, "the link did not go through nvlinkd");
    assert!(link(&out, "v1f.cubin", &no_daemon) == plain, "version 1, the real nvlink: differs from nvlink's");

    // The upgrade: a new nvlink (the same program, marked) goes to the diverted name.
    let mut v2 = v1.clone();
    v2.extend_from_slice(b"\nnvlinkd-test: version 2\n");
    ok(Command::new("dpkg").arg("-i").arg(deb(work.path(), "2", &v2)));
    assert!(std::fs::read(&nvlink).unwrap() == std::fs::read(shim()).unwrap(), "the upgrade replaced the shim");
    assert!(std::fs::read(&kept).unwrap() == v2, "the upgrade's nvlink is not at the diverted name");
    assert!(link(&out, "v2.cubin", &env) == plain, "version 2, through the daemon: differs from nvlink's");
    assert!(link(&out, "v2f.cubin", &no_daemon) == plain, "version 2, the real nvlink: differs from nvlink's");

    let st = nvlinkd_cmd(&["uninstall"]);
    assert!(st.status.success(), "{}", String::from_utf8_lossy(&st.stderr));
    assert!(std::fs::read(&nvlink).unwrap() == v2, "uninstall did not restore the package's nvlink");
    assert!(!Path::new(&format!("{ROOT}/bin/.nvlinkd")).exists(), "uninstall left bin/.nvlinkd");
    let listed = ok(Command::new("dpkg-divert").args(["--listpackage", &nvlink]));
    assert!(listed.trim().is_empty(), "a diversion remains: {listed}");
    let verify = sh(Command::new("dpkg").args(["-V", PACKAGE]));
    assert!(
        verify.status.success() && verify.stdout.is_empty(),
        "dpkg -V {PACKAGE}: {}{}",
        String::from_utf8_lossy(&verify.stdout),
        String::from_utf8_lossy(&verify.stderr)
    );
    ok(Command::new("dpkg").args(["-P", PACKAGE]));
    assert!(!Path::new(&nvlink).exists(), "dpkg -P left the package's nvlink");
}
