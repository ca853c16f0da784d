//! `nvlinkd install`: nvcc from the overlay device-links through the daemon, and
//! the result equals what the same nvcc produces with the real nvlink.

use std::path::Path;
use std::process::Command;

use nvlinkd_tests::daemon::Daemon;
use nvlinkd_tests::env::{cuda_home, nvlinkd, real_nvlink, repo_root, TempDir};

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
    let st = Command::new(nvlinkd())
        .args(["install", "--cuda-home"])
        .arg(cuda_home())
        .arg("--prefix")
        .arg(prefix.path())
        .output()
        .unwrap();
    assert!(st.status.success(), "{}", String::from_utf8_lossy(&st.stderr));

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

    // The same nvcc, same paths, with the real nvlink in the overlay.
    let link = prefix.path().join("bin/nvlink");
    std::fs::remove_file(&link).unwrap();
    std::os::unix::fs::symlink(real_nvlink(), &link).unwrap();
    nvcc(prefix.path(), &[&dlink[..], &["real.o"]].concat(), work.path(), &[]);
    let shim_out = std::fs::read(work.path().join("shim.o")).unwrap();
    let real_out = std::fs::read(work.path().join("real.o")).unwrap();
    assert!(shim_out == real_out, "device-link objects differ between the shim and the real nvlink");
}
