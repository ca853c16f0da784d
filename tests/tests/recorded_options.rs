//! The options nvcc records in a fatbin member are part of what nvlink
//! compiles: PTX linked for a target without SASS (JIT) is compiled with the
//! member's `-Xptxas`, `-maxrregcount`, `-G` or `-lineinfo`, and LTO IR with
//! its `-maxrregcount` or fast-math options. Sources compiled here by the real
//! nvcc with such options, linked by nvlink and through a daemon
//! (`--verify=off`: its own answer): the same bytes (an adversarial run found
//! the daemon's cubins differed).

use std::process::Command;

use nvlinkd_tests::compare;
use nvlinkd_tests::daemon::Daemon;
use nvlinkd_tests::env::{cuda_home, real_nvlink, shim, TempDir};
use nvlinkd_tests::run::{run, Invocation};

const KERNEL: &str = "__device__ float twice(float x);\n\
    __global__ void k(float *p, int n) {\n\
        int i = blockIdx.x * blockDim.x + threadIdx.x;\n\
        if (i < n) p[i] = twice(p[i]) * p[(i + 1) % n];\n\
    }\n";
const HELPER: &str = "__device__ float twice(float x) { return 2.0f * x + 1.0f; }\n";

#[test]
fn options_nvcc_recorded_in_a_member_are_nvlinks() {
    let dir = TempDir::new("recorded");
    std::fs::write(dir.path().join("k.cu"), KERNEL).unwrap();
    std::fs::write(dir.path().join("h.cu"), HELPER).unwrap();
    let nvcc = cuda_home().join("bin/nvcc");
    // (object suffix, nvcc options, link options)
    let builds: &[(&str, &[&str], &str)] = &[
        ("ptx", &["-gencode", "arch=compute_90,code=compute_90"], "--arch=sm_90"),
        ("ptx_o2", &["-gencode", "arch=compute_90,code=compute_90", "-Xptxas", "-O2"], "--arch=sm_90"),
        ("ptx_regs", &["-gencode", "arch=compute_90,code=compute_90", "-maxrregcount=24"], "--arch=sm_90"),
        ("ptx_li", &["-gencode", "arch=compute_90,code=compute_90", "-lineinfo"], "--arch=sm_90"),
        // SASS for sm_90 and PTX, linked for a newer arch: the PTX is compiled
        // (its member names the source file first with -lineinfo and -G).
        ("li_newer", &["-gencode", "arch=compute_90,code=[compute_90,sm_90]", "-lineinfo"], "--arch=sm_100"),
        ("g_newer", &["-gencode", "arch=compute_90,code=[compute_90,sm_90]", "-G"], "--arch=sm_100"),
        (
            "lto_regs",
            &["-gencode", "arch=compute_90,code=lto_90", "-maxrregcount=24"],
            "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} -lcudadevrt",
        ),
        (
            "lto_fast",
            &["-gencode", "arch=compute_90,code=lto_90", "-use_fast_math"],
            "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} -lcudadevrt",
        ),
    ];
    let d = Daemon::start_with(&["--verify=off"]);
    let mut env = d.shim_env();
    env.push(("NVLINKD_FALLBACK".into(), "never".into()));
    for (suffix, flags, link) in builds {
        for src in ["k", "h"] {
            let ok = Command::new(&nvcc)
                .args(["-rdc=true", "-c"])
                .args(*flags)
                .arg(format!("{src}.cu"))
                .arg("-o")
                .arg(format!("{src}_{suffix}.o"))
                .current_dir(dir.path())
                .status()
                .unwrap();
            assert!(ok.success(), "nvcc {flags:?} {src}.cu");
        }
        let out = TempDir::new("recorded-out");
        let args = format!("{link} k_{suffix}.o h_{suffix}.o -o {{OUT}}/out.cubin");
        let inv = Invocation::templated(&args, dir.path(), &out);
        let expected = run(&real_nvlink(), &inv, &[]);
        assert_eq!(expected.code, 0, "{suffix}: {}", String::from_utf8_lossy(&expected.stderr));
        let actual = run(&shim(), &inv, &env);
        let cmp = compare::runs(&expected, &actual);
        assert!(cmp.problems.is_empty() && cmp.identical, "{suffix} ({flags:?}): {:?}", cmp.problems);
    }
}
