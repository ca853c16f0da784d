//! Parity: every corpus case through the real nvlink and through shim + daemon
//! (`NVLINKD_FALLBACK=never`): same exit status, same stdout and stderr, output
//! files equal (cubins up to `.note.nv.tkinfo` at least). Prints a parity table.
//! And the whole-link key on recompiled objects: equal keys exactly when
//! nvlink's outputs are equal, and a hit through the daemon.

use std::sync::Mutex;

use nvlinkd_tests::compare::{self, Comparison};
use nvlinkd_tests::corpus;
use nvlinkd_tests::daemon::{engine_between, Daemon};
use nvlinkd_tests::env::{cuda_home, real_nvlink, shim, TempDir};
use nvlinkd_tests::run::{run, Invocation};

/// (name, arguments, extra environment). `{L}`: the toolkit's lib directory,
/// `{NVVM}`: its nvvm directory, `{OUT}`: the case's output directory.
const CASES: &[(&str, &str, &str)] = &[
    // Device functions across units, nvcc's own command line shape.
    ("nvcc-dlink", "-m64 --arch=sm_90 --register-link-binaries={OUT}/reg.c -L{L}/stubs -L{L} -cpu-arch=X86_64 accumulate.o scale.o -lcudadevrt -o {OUT}/out.cubin --host-ccbin gcc", ""),
    ("device-vars", "--arch=sm_90 vars_def.o vars_use.o -o {OUT}/out.cubin", ""),
    ("cdp", "--arch=sm_90 --register-link-binaries={OUT}/reg.c -L{L} cdp.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("templates", "--arch=sm_90 tmpl_a.o tmpl_b.o -o {OUT}/out.cubin", ""),
    // Data segment whose file size runs to the last NOBITS section's aligned offset.
    ("data-segment-layout", "--arch=sm_90 shared_mix.o accumulate.o scale.o -o {OUT}/out.cubin", ""),
    ("static-lib", "--arch=sm_90 -Llib mathlib_main.o -ldevmath -o {OUT}/out.cubin", ""),
    ("static-lib-LIBRARY_PATH", "--arch=sm_90 mathlib_main.o -ldevmath -o {OUT}/out.cubin", "LIBRARY_PATH=lib"),
    // The same routed (its files mirrored into a sandbox on the remote path).
    ("static-lib-LIBRARY_PATH-routed", "--arch=sm_90 --preserve-relocs mathlib_main.o -ldevmath -o {OUT}/out.cubin", "LIBRARY_PATH=lib"),
    ("ptx-only", "--arch=sm_90 saxpy_ptx.o -o {OUT}/out.cubin", ""),
    ("ptx-older-arch", "--arch=sm_90 --register-link-binaries={OUT}/reg.c saxpy_ptx80.o accumulate.o scale.o -o {OUT}/out.cubin", ""),
    ("ptx-newer-arch", "--arch=sm_80 saxpy_ptx.o -o {OUT}/out.cubin", ""),
    ("two-arch-sm90", "--arch=sm_90 saxpy_2arch.o accumulate_2arch.o scale_2arch.o -o {OUT}/out.cubin", ""),
    // Arch-specific, family and Blackwell targets (Mercury cubins).
    ("arch-suffixed-sm90a", "--arch=sm_90a accumulate.o scale.o -o {OUT}/out.cubin", ""),
    ("ptx-jit-sm100", "--arch=sm_100 --register-link-binaries={OUT}/reg.c accumulate.o scale.o -o {OUT}/out.cubin", ""),
    ("ptx-jit-family-sm120f", "--arch=sm_120f accumulate.o scale.o -o {OUT}/out.cubin", ""),
    ("sass-sm100", "--arch=sm_100 accumulate_bw.o scale_bw.o -o {OUT}/out.cubin", ""),
    ("sass-arch-specific-sm100a", "--arch=sm_100a accumulate_bw.o scale_bw.o -o {OUT}/out.cubin", ""),
    ("sass-arch-specific-sm90a", "--arch=sm_90a accumulate_bw.o scale_bw.o -o {OUT}/out.cubin", ""),
    ("sass-not-found-sm120", "--arch=sm_120 accumulate_bw.o scale_bw.o -o {OUT}/out.cubin", ""),
    ("sass-family-sm103", "--arch=sm_103 accumulate_fam.o scale_fam.o -o {OUT}/out.cubin", ""),
    ("sass-family-sm121", "--arch=sm_121 accumulate_fam.o scale_fam.o -o {OUT}/out.cubin", ""),
    ("ptx-jit-family-sm110", "--arch=sm_110 accumulate_fam.o scale_fam.o -o {OUT}/out.cubin", ""),
    ("relocatable-sm100", "--arch=sm_100 -r accumulate_bw.o scale_bw.o -o {OUT}/out.o", ""),
    ("lto-sm100", "--arch=sm_100 -dlto -nvvmpath={NVVM} -L{L} accumulate_lto100.o scale_lto100.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("two-arch-sm80", "--arch=sm_80 saxpy_2arch.o accumulate_2arch.o scale_2arch.o -o {OUT}/out.cubin", ""),
    ("relocatable", "--arch=sm_90 -r accumulate.o scale.o -o {OUT}/out.o", ""),
    ("relocatable-cdp", "--arch=sm_90 -r cdp.o -o {OUT}/out.o", ""),
    ("lto", "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} accumulate_lto.o scale_lto.o -lcudadevrt -o {OUT}/out.cubin", ""),
    // An -nvvmpath without a libNVVM: nvlink cannot load one and fails.
    ("lto-nvvmpath-without-nvvm", "--arch=sm_90 -dlto -nvvmpath=/nonexistent/nvvm -L{L} accumulate_lto.o scale_lto.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("lto-nvvmpath-without-nvvm-non-lto-inputs", "--arch=sm_90 -dlto -report-arch -nvvmpath={OUT} missing.o saxpy.o -o {OUT}/out.cubin", ""),
    ("lto-cdp", "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} cdp_lto.o -lcudadevrt -o {OUT}/out.cubin", ""),
    // Partial LTO for libcudadevrt alone without host information: NVVM gets --device-c alone.
    // Partial LTO for libcudadevrt alone in other styles: templated children,
    // an internal host reference, an unlaunched launcher; a launcher only in
    // an unlaunched kernel; two such modules.
    ("lto-cdp-multi", "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} --register-link-binaries={OUT}/reg.c cdp_multi_lto.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("lto-cdp-unlaunched", "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} cdp_dead_lto.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("lto-cdp-two-modules", "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} -report-arch cdp_lto.o cdp_multi_lto.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("lto-cdp-multi-emit-ptx", "--arch=sm_90 -dlto --emit-ptx -nvvmpath={NVVM} -L{L} cdp_multi_lto.o -lcudadevrt -o {OUT}/out.ptx", ""),
    ("lto-cdp-ignore-host-info", "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} --ignore-host-info --register-link-binaries={OUT}/reg.c cdp_lto.o -lcudadevrt -o {OUT}/out.cubin", ""),
    // -dlto -r beside non-LTO code, and of LTO IR without a PTX copy.
    ("lto-relocatable-mixed", "--arch=sm_90 -dlto -r -nvvmpath={NVVM} accumulate_lto.o scale.o -o {OUT}/out.o", ""),
    ("lto-relocatable-registered", "--arch=sm_90 -dlto -r -nvvmpath={NVVM} --register-link-binaries={OUT}/reg.c accumulate_lto.o scale.o saxpy_lto.o -o {OUT}/out.o", ""),
    ("lto-relocatable-ir-only", "--arch=sm_90 -dlto -r -nvvmpath={NVVM} xcall_main_lto3.o xcall_loop_lto3.o -o {OUT}/out.o", ""),
    ("lto-relocatable-no-lto", "--arch=sm_90 -dlto -r -nvvmpath={NVVM} accumulate.o scale.o -o {OUT}/out.o", ""),
    // --emit-ptx of a partial link: nothing internalized, nothing dropped (an adversary's case).
    ("lto-emit-ptx-relocatable", "--arch=sm_90 -dlto --emit-ptx -r -nvvmpath={NVVM} accumulate_lto.o scale_lto.o -o {OUT}/out.ptx", ""),
    // nvlink's warning there: --disable-infos silences it, -w does not.
    ("lto-relocatable-no-lto-w", "--arch=sm_90 -dlto -r -w -nvvmpath={NVVM} accumulate.o scale.o -o {OUT}/out.o", ""),
    ("lto-relocatable-no-lto-disable-infos", "--arch=sm_90 -dlto -r --disable-infos -nvvmpath={NVVM} accumulate.o scale.o -o {OUT}/out.o", ""),
    ("lto-partial", "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} accumulate_lto.o scale.o -lcudadevrt -o {OUT}/out.cubin", ""),
    // Partial LTO: one LTO module beside non-LTO code (an archive, dynamic
    // parallelism in a non-LTO unit, nvcc's command line, an undefined
    // reference from the LTO module), and two LTO modules (routed).
    ("lto-partial-archive", "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} -Llib xcall_main_lto.o -lxcall -lcudadevrt -o {OUT}/out.cubin", ""),
    ("lto-partial-cdp-object", "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} accumulate_lto.o cdp.o scale.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("lto-partial-nvcc", "-m64 --arch=sm_90 --register-link-binaries={OUT}/reg.c -L{L}/stubs -L{L} -cpu-arch=X86_64 -report-arch -dlto -nvvmpath={NVVM} saxpy.o accumulate_lto.o scale.o -lcudadevrt -o {OUT}/out.cubin --host-ccbin gcc", ""),
    ("lto-partial-undefined", "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} cdp.o accumulate_lto.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("lto-partial-two-modules", "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} accumulate_lto.o scale_lto.o saxpy.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("lto-relocatable", "--arch=sm_90 -dlto -r -nvvmpath={NVVM} accumulate_lto.o scale_lto.o -o {OUT}/out.o", ""),
    ("emit-ptx", "--arch=sm_90 -dlto --emit-ptx -nvvmpath={NVVM} -L{L} accumulate_lto.o scale_lto.o -lcudadevrt -o {OUT}/out.ptx", ""),
    ("lto-registered", "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} --register-link-binaries={OUT}/reg.c saxpy_lto.o accumulate_lto.o scale_lto.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("lto-no-devrt", "--arch=sm_90 -dlto -nvvmpath={NVVM} accumulate_lto.o scale_lto.o -o {OUT}/out.cubin", ""),
    // Without libcudadevrt nvlink writes the output, then fails, and writes no registration file.
    ("lto-no-devrt-registered", "--arch=sm_90 -dlto -nvvmpath={NVVM} --register-link-binaries={OUT}/reg.c -report-arch accumulate_lto.o scale_lto.o -o {OUT}/out.cubin", ""),
    ("lto-ignore-host-info", "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} --ignore-host-info accumulate_lto.o scale_lto.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("emit-ptx-single", "--arch=sm_90 -dlto --emit-ptx -nvvmpath={NVVM} saxpy_lto.o -o {OUT}/out.ptx", ""),
    ("cubin-input", "--arch=sm_90 --register-link-binaries={OUT}/reg.c accumulate.o scale.cubin -o {OUT}/out.cubin", ""),
    ("ptx-input", "--arch=sm_90 saxpy.ptx -o {OUT}/out.cubin", ""),
    ("ptx-input-registered", "--arch=sm_90 --register-link-binaries={OUT}/reg.c accumulate.o saxpy.ptx scale.o -o {OUT}/out.cubin", ""),
    // What real builds pass. Cross-unit calls of looping device functions
    // under LTO (NVVM -split-compile gives this program other machine code).
    ("lto-cross-unit", "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} xcall_main_lto.o xcall_loop_lto.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("lto-cross-unit-archive", "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} -Llib xcall_main_lto3.o -lxcall_lto -lcudadevrt -o {OUT}/out.cubin", ""),
    // LTO IR alone whose only device-runtime call is in a kernel the host never
    // launches: nvlink's partial LTO (seen by probing the module).
    // LTO IR alone in other styles: host-written device and constant variables,
    // static and anonymous-namespace kernels, printf, device malloc, recursion.
    ("lto-ir-only-styles", "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} lto_styles_lto90.o lto_styles2_lto90.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("lto-ir-only-styles-emit-ptx", "--arch=sm_90 -dlto --emit-ptx -nvvmpath={NVVM} -L{L} lto_styles2_lto90.o lto_styles_lto90.o -lcudadevrt -o {OUT}/out.ptx", ""),
    ("lto-ir-only-styles-registered", "-m64 --arch=sm_90 --register-link-binaries={OUT}/reg.c -L{L}/stubs -L{L} -cpu-arch=X86_64 -report-arch -dlto -nvvmpath={NVVM} lto_styles_lto90.o lto_styles2_lto90.o -lcudadevrt -o {OUT}/out.compute_90.cubin --host-ccbin gcc", ""),
    // LTO programs without a kernel: NVVM leaves them relocatable, and nvlink
    // goes on with its partial LTO (the bench's transforms.cu alone differed).
    ("lto-functions-only", "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} xcall_loop_lto3.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("lto-variables-only", "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} vars_def_lto90.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("lto-functions-only-registered", "-m64 --arch=sm_90 --register-link-binaries={OUT}/reg.c -L{L}/stubs -L{L} -cpu-arch=X86_64 -report-arch -dlto -nvvmpath={NVVM} xcall_loop_lto3.o -lcudadevrt -o {OUT}/out.compute_90.cubin --host-ccbin gcc", ""),
    // Kernels no host code launches (no host references at all): a whole program.
    ("lto-unlaunched-kernels", "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} unlaunched_lto90.o -lcudadevrt -o {OUT}/out.cubin", ""),
    // Host references to variables only (nvlink then passes NVVM no list), and
    // to an internal kernel only.
    ("lto-host-variable-only", "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} host_var_lto90.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("lto-static-kernel-only", "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} static_launch_lto90.o -lcudadevrt -o {OUT}/out.cubin", ""),
    // Dynamic parallelism beside host-written device variables (the demo's LTO
    // program): partial LTO for libcudadevrt with host-referenced variables.
    ("lto-cdp-host-variables", "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} cdp_hostvar_lto90.o -lcudadevrt -o {OUT}/out.cubin", ""),
    // The same in other styles: a kernel kept only by a device-side launch
    // (no variables, no dead kernel), one the host and the device both launch,
    // host references to variables alone or none at all (nvlink then prunes
    // nothing), variables defined in another unit.
    ("lto-cdp-device-launched", "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} cdp_launched_lto90.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("lto-cdp-host-and-device-launch", "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} --register-link-binaries={OUT}/reg.c cdp_hostvar_both_lto90.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("lto-cdp-host-variables-emit-ptx", "--arch=sm_90 -dlto --emit-ptx -nvvmpath={NVVM} -L{L} cdp_hostvar_both_lto.o -lcudadevrt -o {OUT}/out.ptx", ""),
    ("lto-cdp-host-variables-no-launch", "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} cdp_hostvar_nolaunch_lto90.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("lto-cdp-no-host-code", "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} cdp_nohost_lto90.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("lto-cdp-host-variables-two-modules", "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} -report-arch cdp_vars_use_lto90.o cdp_vars_def_lto90.o -lcudadevrt -o {OUT}/out.cubin", ""),
    // The same with PTX twins (nvcc -arch=sm_90 -dlto).
    ("lto-styles", "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} lto_styles_lto.o lto_styles2_lto.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("lto-ir-only-cdp-unlaunched", "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} cdp_dead_lto90.o -lcudadevrt -o {OUT}/out.cubin", ""),
    // The same without PTX twins in other styles: NVVM leaves them relocatable, then partial LTO.
    ("lto-ir-only-cdp-multi", "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} --register-link-binaries={OUT}/reg.c cdp_multi_lto90.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("lto-ir-only-cdp-two-modules", "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} -g cdp_dead_lto90.o cdp_multi_lto90.o -lcudadevrt -o {OUT}/out.cubin", ""),
    // nvcc's multi-arch device links (copied from nvcc -dryrun): one call per arch, -report-arch.
    ("nvcc-dlto-sm80", "-m64 --arch=sm_80 --register-link-binaries={OUT}/reg.c -L{L}/stubs -L{L} -cpu-arch=X86_64 -report-arch -dlto -nvvmpath={NVVM} xcall_main_lto3.o xcall_loop_lto3.o -lcudadevrt -o {OUT}/out.compute_80.cubin --host-ccbin gcc", ""),
    ("nvcc-dlto-sm90", "-m64 --arch=sm_90 --register-link-binaries={OUT}/reg.c -L{L}/stubs -L{L} -cpu-arch=X86_64 -report-arch -dlto -nvvmpath={NVVM} xcall_main_lto3.o xcall_loop_lto3.o -lcudadevrt -o {OUT}/out.compute_90.cubin --host-ccbin gcc", ""),
    ("nvcc-dlto-sm100", "-m64 --arch=sm_100 --register-link-binaries={OUT}/reg.c -L{L}/stubs -L{L} -cpu-arch=X86_64 -report-arch -dlto -nvvmpath={NVVM} xcall_main_lto3.o xcall_loop_lto3.o -lcudadevrt -o {OUT}/out.compute_100.cubin --host-ccbin gcc", ""),
    ("nvcc-dlink-sm80", "-m64 --arch=sm_80 --register-link-binaries={OUT}/reg.c -L{L}/stubs -L{L} -cpu-arch=X86_64 -report-arch xcall_main_3arch.o xcall_loop_3arch.o livedead_3arch.o libcxx_3arch.o -lcudadevrt -o {OUT}/out.compute_80.cubin --host-ccbin gcc", ""),
    ("nvcc-dlink-sm90", "-m64 --arch=sm_90 --register-link-binaries={OUT}/reg.c -L{L}/stubs -L{L} -cpu-arch=X86_64 -report-arch xcall_main_3arch.o xcall_loop_3arch.o livedead_3arch.o libcxx_3arch.o -lcudadevrt -o {OUT}/out.compute_90.cubin --host-ccbin gcc", ""),
    ("nvcc-dlink-sm100", "-m64 --arch=sm_100 --register-link-binaries={OUT}/reg.c -L{L}/stubs -L{L} -cpu-arch=X86_64 -report-arch xcall_main_3arch.o xcall_loop_3arch.o livedead_3arch.o libcxx_3arch.o -lcudadevrt -o {OUT}/out.compute_100.cubin --host-ccbin gcc", ""),
    // CMake's device link (CUDA_ARCHITECTURES "80;90", nvcc -dryrun of its line):
    // --shared, -lcudadevrt -lcudart_static -lrt -lpthread -ldl, a host-only .cpp.o, a static device library.
    ("cmake-dlink-sm80", "-m64 --shared --arch=sm_80 --register-link-binaries={OUT}/reg.c -L{L} -lcudadevrt -lcudart_static -lrt -lpthread -ldl -L{L}/stubs -L{L} -cpu-arch=X86_64 -report-arch xcall_main_3arch.o livedead_3arch.o host_main.cpp.o lib/libxcall.a -lcudadevrt -o {OUT}/out.cubin --host-ccbin gcc", ""),
    ("cmake-dlink-sm90", "-m64 --shared --arch=sm_90 --register-link-binaries={OUT}/reg.c -L{L} -lcudadevrt -lcudart_static -lrt -lpthread -ldl -L{L}/stubs -L{L} -cpu-arch=X86_64 -report-arch xcall_main_3arch.o livedead_3arch.o host_main.cpp.o lib/libxcall.a -lcudadevrt -o {OUT}/out.cubin --host-ccbin gcc", ""),
    ("cmake-dlto-sm90", "-m64 --shared --arch=sm_90 --register-link-binaries={OUT}/reg.c -L{L} -lcudadevrt -lcudart_static -lrt -lpthread -ldl -L{L}/stubs -L{L} -cpu-arch=X86_64 -report-arch -dlto -nvvmpath={NVVM} xcall_main_lto3.o libcxx_lto3.o host_main.cpp.o lib/libxcall_lto.a -lcudadevrt -o {OUT}/out.cubin --host-ccbin gcc", ""),
    // Objects without device code in the link: nvlink prunes nothing, LTO included.
    ("lto-host-object", "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} livedead_lto.o host_main.cpp.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("lto-host-object-emit-ptx", "--arch=sm_90 -dlto --emit-ptx -nvvmpath={NVVM} livedead_lto.o host_only.o -o {OUT}/out.ptx", ""),
    ("lto-cudart-static", "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} livedead_lto.o -lcudadevrt -lcudart_static -o {OUT}/out.cubin", ""),
    ("lto-xcall-cudart-static", "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} xcall_main_lto.o xcall_loop_lto.o -lcudadevrt -lcudart_static -o {OUT}/out.cubin", ""),
    ("lto-libcxx", "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} libcxx_lto.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("lto-libcxx-host-object", "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} libcxx_lto.o host_main.cpp.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("lto-libcxx-cudart-static-emit-ptx", "--arch=sm_90 -dlto --emit-ptx -nvvmpath={NVVM} -L{L} libcxx_lto.o -lcudart_static -o {OUT}/out.ptx", ""),
    ("lto-cub", "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} warp_cub_lto.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("lto-cub-host-object", "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} warp_cub_lto.o host_main.cpp.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("lto-thrust-host-object", "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} thrust_seq_lto.o host_main.cpp.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("thrust-cudart-static", "--arch=sm_90 -L{L} thrust_seq.o -lcudadevrt -lcudart_static -o {OUT}/out.cubin", ""),
    ("cub-2arch-sm80", "--arch=sm_80 -L{L} warp_cub_2arch.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("cudart-static", "--arch=sm_90 -L{L} livedead_3arch.o libcxx_3arch.o -lcudadevrt -lcudart_static -o {OUT}/out.cubin", ""),
    ("host-cpp-object", "--arch=sm_90 livedead_3arch.o host_main.cpp.o -o {OUT}/out.cubin", ""),
    // -report-arch: every message after option parsing names the target.
    // libcudadevrt searched while a symbol is undefined that a later library
    // defines: nvlink takes its member too (registered, linked).
    ("cudadevrt-before-library", "-m64 --arch=sm_90 --register-link-binaries={OUT}/reg.c -L{L} -lcudadevrt xcall_main_3arch.o -Llib -lxcall -o {OUT}/out.cubin", ""),
    ("cudadevrt-file-before-archive-g", "-g -m64 --arch=sm_90 --register-link-binaries={OUT}/reg.c xcall_main_3arch.o livedead_3arch.o {L}/libcudadevrt.a lib/libxcall.a -o {OUT}/out.cubin", ""),
    ("report-arch-archive-only", "-m64 --arch=sm_80 --register-link-binaries={OUT}/reg.c -Llib -lxcall -L{L}/stubs -L{L} -cpu-arch=X86_64 -report-arch -lcudadevrt -o {OUT}/out.cubin --host-ccbin gcc", ""),
    ("report-arch-archive-only-sm90", "--arch=sm_90 -report-arch -Llib -ldevmath -o {OUT}/out.cubin", ""),
    ("report-arch-no-inputs", "--arch=sm_90 -report-arch -o {OUT}/out.cubin", ""),
    ("report-arch-warning", "--arch=sm_80 -report-arch vars_def.o vars_use.o -o {OUT}/out.cubin", ""),
    ("report-arch-info", "--arch=sm_90 -report-arch --register-link-binaries={OUT}/reg.c accumulate.o scale.cubin -o {OUT}/out.cubin", ""),
    ("report-arch-fatal", "--arch=sm_90a -report-arch accumulate.o no_such_file.o -o {OUT}/out.cubin", ""),
    ("report-arch-mode-error", "--arch=sm_90 -report-arch --emit-ptx accumulate.o -o {OUT}/out.ptx", ""),
    ("report-arch-skipping-incompatible", "--arch=sm_90 -report-arch -Ltinylib -Llib accumulate.o scale.o -ltiny -o {OUT}/out.cubin", ""),
    ("report-arch-version", "-report-arch --version", ""),
    ("host-linker-script-aug", "-ghls=lcs-aug -o {OUT}/script.ld", ""),
    ("host-linker-script-aug-stdout", "--gen-host-linker-script=lcs-aug", ""),
    ("host-linker-script-abs", "-ghls=lcs-abs -o {OUT}/script.ld -v", ""),
    ("host-linker-script-abs-shared", "-ghls lcs-abs -shared -o {OUT}/script.ld", ""),
    ("host-linker-script-default", "-v -o {OUT}/script.ld -ghls", ""),
    ("host-linker-script-stdout", "-ghls", ""),
    ("host-linker-script-inputs", "-ghls=lcs-aug accumulate.o", ""),
    ("version", "--version", ""),
    ("help", "--help", ""),
    // Input handling.
    ("arch-not-found", "--arch=sm_80 vars_def.o vars_use.o -o {OUT}/out.cubin", ""),
    ("arch-not-found-suppressed", "--arch=sm_80 --suppress-arch-warning vars_def.o vars_use.o -o {OUT}/out.cubin", ""),
    ("arch-not-found-registered", "--arch=sm_80 -w --register-link-binaries={OUT}/reg.c vars_def.o -o {OUT}/out.cubin", ""),
    ("cubin-named-o", "--arch=sm_90 --register-link-binaries={OUT}/reg.c accumulate.o scale_cubin.o -o {OUT}/out.cubin", ""),
    ("no-extension-skipped", "--arch=sm_90 accumulate_noext accumulate.o scale.o -o {OUT}/out.cubin", ""),
    ("so-skipped", "--arch=sm_90 accumulate.so accumulate.o scale.o -o {OUT}/out.cubin", ""),
    ("fatbin-input", "--arch=sm_90 --register-link-binaries={OUT}/reg.c saxpy.fatbin -o {OUT}/out.cubin", ""),
    ("non-rdc-ignored", "--arch=sm_90 --register-link-binaries={OUT}/reg.c saxpy_nonrdc.o accumulate.o scale.o -o {OUT}/out.cubin", ""),
    ("host-only-object", "--arch=sm_90 --register-link-binaries={OUT}/reg.c host_only.o accumulate.o scale.o -o {OUT}/out.cubin", ""),
    ("ld-r-merged-object", "--arch=sm_90 --register-link-binaries={OUT}/reg.c merged_r.o scale.o vars_def.o -o {OUT}/out.cubin", ""),
    ("compressed-variants", "--arch=sm_90 accumulate.o scale_compress_all.o vars_def_nocompress.o vars_use.o -o {OUT}/out.cubin", ""),
    ("archive-positional", "--arch=sm_90 --register-link-binaries={OUT}/reg.c mathlib_main.o lib/libdevmath.a -o {OUT}/out.cubin", ""),
    ("archive-twice", "--arch=sm_90 mathlib_main.o lib/libdevmath.a -Llib -ldevmath -ldevmath -o {OUT}/out.cubin", ""),
    ("library-not-found", "--arch=sm_90 accumulate.o scale.o -lnosuchlib -o {OUT}/out.cubin", ""),
    ("library-too-small", "--arch=sm_90 -Ltinylib -Llib accumulate.o scale.o -ltiny -o {OUT}/out.cubin", ""),
    ("library-only", "--arch=sm_90 -Llib -ldevmath -o {OUT}/out.cubin", ""),
    ("keep-system-libraries", "--arch=sm_90 -L{L} --keep-system-libraries accumulate.o scale.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("ignore-host-info", "--arch=sm_90 --ignore-host-info accumulate.o scale.o -o {OUT}/out.cubin", ""),
    // Every option of `nvlink --help` (and the hidden ones nvcc uses) at least once.
    ("opt-verbose", "--arch=sm_90 -v accumulate.o scale.o -o {OUT}/out.cubin", ""),
    ("opt-verbose2", "--arch=sm_90 -v2 accumulate.o scale.o -o {OUT}/out.cubin", ""),
    ("opt-verbose2-cdp", "--arch=sm_90 -v2 -L{L} cdp.o mathlib_1.o mathlib_2.o mathlib_main.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("opt-dump-callgraph", "--arch=sm_90 --dump-callgraph accumulate.o scale.o -o {OUT}/out.cubin", ""),
    ("opt-dump-callgraph-no-demangle", "--arch=sm_90 -dump-callgraph-no-demangle cdp.o -L{L} -lcudadevrt -o {OUT}/out.cubin", ""),
    ("opt-debug", "--arch=sm_90 -g accumulate.o scale.o -o {OUT}/out.cubin", ""),
    // Debug links of -G objects, nvcc -G -dlink's command line; mixed with non-debug code; -r.
    ("debug-nvcc-dlink", "-m64 --arch=sm_90 --register-link-binaries={OUT}/reg.c -g -L{L}/stubs -L{L} -cpu-arch=X86_64 cdp_G.o accumulate_G.o scale_G.o -lcudadevrt -o {OUT}/out.cubin --host-ccbin gcc", ""),
    ("debug-mixed", "--arch=sm_90 -g -L{L} cdp_G.o accumulate.o scale_G.o vars_def.o vars_use.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("debug-relocatable", "--arch=sm_90 -g -r accumulate_G.o scale_G.o -o {OUT}/out.o", ""),
    ("opt-suppress-debug-info", "--arch=sm_90 -g -suppress-debug-info accumulate.o scale.o -o {OUT}/out.cubin", ""),
    // -g -suppress-debug-info in other shapes: a removed kernel in an archive
    // member, beside variables, none removed; with libcudadevrt (routed: nvlink
    // drops symbols of its code too).
    ("opt-suppress-debug-info-archive", "--arch=sm_90 -g -suppress-debug-info -report-arch -Llib mathlib_main.o -ldevmath -o {OUT}/out.cubin", ""),
    ("opt-suppress-debug-info-variables", "--arch=sm_90 -g -suppress-debug-info --register-link-binaries={OUT}/reg.c livedead_3arch.o vars_def.o vars_use.o -o {OUT}/out.cubin", ""),
    ("opt-suppress-debug-info-none-removed", "--arch=sm_90 -g -suppress-debug-info xcall_main_3arch.o xcall_loop_3arch.o tmpl_a.o tmpl_b.o -o {OUT}/out.cubin", ""),
    ("opt-suppress-debug-info-cdp", "--arch=sm_90 -g -suppress-debug-info -L{L} cdp.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("opt-extra-warnings", "--arch=sm_90 --extra-warnings accumulate.o scale.o -o {OUT}/out.cubin", ""),
    ("opt-report-arch", "--arch=sm_90 --report-arch missing.o -o {OUT}/out.cubin", ""),
    ("opt-preserve-relocs", "--arch=sm_90 --preserve-relocs accumulate.o scale.o -o {OUT}/out.cubin", ""),
    ("opt-kernels-used", "--arch=sm_90 --kernels-used=never,accum accumulate.o scale.o -o {OUT}/out.cubin", ""),
    ("opt-variables-used", "--arch=sm_90 --variables-used=hits vars_def.o vars_use.o accumulate.o scale.o -o {OUT}/out.cubin", ""),
    ("opt-kernels-used-cdp", "--arch=sm_90 --kernels-used=_Z -L{L} accumulate.o scale.o cdp.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("opt-kernels-used-none", "--arch=sm_90 --kernels-used=nothing_at_all accumulate.o scale.o -o {OUT}/out.cubin", ""),
    ("opt-use-host-info", "--arch=sm_90 --use-host-info accumulate.o scale.o -o {OUT}/out.cubin", ""),
    ("opt-use-host-info-lto", "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} --use-host-info accumulate_lto.o scale_lto.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("keep-system-libraries-cdp", "--arch=sm_90 -L{L} --keep-system-libraries cdp.o accumulate.o scale.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("keep-system-libraries-lto", "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} --keep-system-libraries accumulate_lto.o scale_lto.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("opt-device-stack-protector-cdp", "--arch=sm_90 --device-stack-protector=true -L{L} cdp.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("opt-device-stack-protector-ptx", "--arch=sm_90 --device-stack-protector=true saxpy_ptx.o -o {OUT}/out.cubin", ""),
    ("opt-device-stack-protector-lto", "--arch=sm_90 --device-stack-protector=true -dlto -nvvmpath={NVVM} -L{L} accumulate_lto.o scale_lto.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("opt-device-stack-protector-partial-lto", "--arch=sm_90 --device-stack-protector=true -dlto -nvvmpath={NVVM} -L{L} accumulate_lto.o scale.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("opt-link-as-tools-patch", "--arch=sm_90 --link-as-tools-patch accumulate.o scale.o -o {OUT}/out.cubin", ""),
    // The first function without the tools-patch attribute, in input and
    // symbol-table order (PTX compiled first, -r too, after a multiple definition).
    ("tools-patch-cdp", "--arch=sm_90 --link-as-tools-patch -L{L} cdp.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("tools-patch-ptx-first", "--arch=sm_90 --link-as-tools-patch vars_def.o saxpy.ptx accumulate.o -o {OUT}/out.cubin", ""),
    ("tools-patch-relocatable", "--arch=sm_90 --link-as-tools-patch -r scale.o accumulate.o -o {OUT}/out.o", ""),
    ("tools-patch-undefined", "--arch=sm_90 --link-as-tools-patch -report-arch missing.o -o {OUT}/out.cubin", ""),
    ("tools-patch-multiple-definition", "--arch=sm_90 --link-as-tools-patch accumulate.o scale.o dup/scale.o -o {OUT}/out.cubin", ""),
    ("opt-disable-warnings", "--arch=sm_80 -w vars_def.o vars_use.o -o {OUT}/out.cubin", ""),
    ("opt-warning-as-error", "--arch=sm_80 -Werror vars_def.o vars_use.o -o {OUT}/out.cubin", ""),
    ("opt-warning-as-error-library", "--arch=sm_90 -Werror -report-arch -Ltinylib -Llib accumulate.o scale.o -ltiny -o {OUT}/out.cubin", ""),
    ("opt-warning-as-error-w", "--arch=sm_80 -Werror -w vars_def.o vars_use.o -o {OUT}/out.cubin", ""),
    ("opt-disable-infos", "--arch=sm_90 --disable-infos -dlto -nvvmpath={NVVM} -L{L} accumulate_lto.o scale.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("opt-suppress-stack-size-warning", "--arch=sm_90 --suppress-stack-size-warning accumulate.o scale.o -o {OUT}/out.cubin", ""),
    ("opt-cpu-arch", "--arch=sm_90 --cpu-arch=AARCH64 -L{L} cdp.o -lcudadevrt -o {OUT}/out.cubin", ""),
    // -l takes an archive only if one of its leading ELF members is built for
    // --cpu-arch (unknown: x86-64); named archives are not checked.
    ("cpu-arch-library-skipped", "--arch=sm_90 --cpu-arch=PPC64LE -Llib mathlib_main.o -ldevmath -o {OUT}/out.cubin", ""),
    ("cpu-arch-named-archive", "--arch=sm_90 --cpu-arch=AARCH64 mathlib_main.o lib/libdevmath.a -o {OUT}/out.cubin", ""),
    ("cpu-arch-unknown-library", "--arch=sm_90 --cpu-arch=unknown -Llib mathlib_main.o -ldevmath -o {OUT}/out.cubin", ""),
    ("cpu-arch-linked", "--arch=sm_90 --cpu-arch=RISCV64 accumulate.o scale.o -o {OUT}/out.cubin", ""),
    ("opt-machine", "--arch=sm_90 --machine 64 accumulate.o scale.o -o {OUT}/out.cubin", ""),
    ("opt-device-stack-protector", "--arch=sm_90 --device-stack-protector=true accumulate.o scale.o -o {OUT}/out.cubin", ""),
    ("opt-link-time-opt", "--arch=sm_90 --link-time-opt -nvvmpath={NVVM} -L{L} accumulate_lto.o scale_lto.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("opt-lto-maxrregcount", "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} --maxrregcount=32 accumulate_lto.o scale_lto.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("opt-lto-xptxas", "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} -Xptxas -O2 accumulate_lto.o scale_lto.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("opt-lto-xnvvm", "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} -Xnvvm -opt=2 accumulate_lto.o scale_lto.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("opt-lto-ofast-compile", "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} -Ofc max accumulate_lto.o scale_lto.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("opt-lto-split-compile", "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} --split-compile=2 accumulate_lto.o scale_lto.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("opt-lto-split-compile-extended", "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} --split-compile-extended=2 accumulate_lto.o scale_lto.o -lcudadevrt -o {OUT}/out.cubin", ""),
    // Forwarded options that change this program's code (the two above do not).
    ("opt-lto-xnvvm-opt0", "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} -Xnvvm -opt=0 accumulate_lto.o scale_lto.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("opt-lto-split-compile-xcall", "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} --split-compile=2 xcall_main_lto.o xcall_loop_lto.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("opt-lto-split-compile-extended-xcall", "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} --split-compile-extended=2 xcall_main_lto.o xcall_loop_lto.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("opt-lto-nvvm-latest", "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} --nvvm-latest accumulate_lto.o scale_lto.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("opt-lto-nvvm-latest-xcall-emit-ptx", "--arch=sm_90 -dlto --emit-ptx -nvvmpath={NVVM} -L{L} --nvvm-latest xcall_main_lto.o xcall_loop_lto.o -lcudadevrt -o {OUT}/out.ptx", ""),
    ("opt-lto-nvvm-latest-partial", "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} --nvvm-latest accumulate_lto.o scale_lto.o saxpy.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("opt-lto-nvvm-latest-cdp", "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} --nvvm-latest cdp_multi_lto.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("opt-lto-nvvm-latest-cub", "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} --nvvm-latest warp_cub_lto.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("opt-lto-force-partial", "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} --force-partial-lto accumulate_lto.o scale_lto.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("opt-lto-force-whole", "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} --force-whole-lto accumulate_lto.o scale_lto.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("opt-lto-debug", "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} -g accumulate_lto.o scale_lto.o -lcudadevrt -o {OUT}/out.cubin", ""),
    // ptxas's warnings under -dlto -g: after the link's messages, tagged by -report-arch, whatever -w says.
    ("opt-lto-debug-report-arch", "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} -g -w -report-arch --register-link-binaries={OUT}/reg.c xcall_main_lto.o xcall_loop_lto.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("opt-lto-debug-partial", "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} -g accumulate_lto.o scale_lto.o saxpy.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("opt-lto-debug-relocatable", "--arch=sm_90 -dlto -r -nvvmpath={NVVM} -g --register-link-binaries={OUT}/reg.c accumulate_lto.o scale.o -o {OUT}/out.o", ""),
    ("opt-lto-debug-cdp", "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} -g cdp_multi_lto.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("opt-lto-debug-emit-ptx", "--arch=sm_90 -dlto --emit-ptx -nvvmpath={NVVM} -g livedead_lto.o -o {OUT}/out.ptx", ""),
    ("opt-uidx-file", "--arch=sm_90 --uidx-file=link.opts accumulate.o scale.o -o {OUT}/out.cubin", ""),
    // nvlink reads the uidx file first: missing, empty, not uidx (before a missing input, under -dlto).
    ("uidx-file-missing", "--arch=sm_90 -report-arch --uidx-file=no_such.uidx accumulate.o scale.o -o {OUT}/out.cubin", ""),
    ("uidx-file-empty", "--arch=sm_90 --uidx-file=empty.o accumulate.o -o {OUT}/out.cubin", ""),
    ("uidx-file-before-inputs", "--arch=sm_90 -dlto -nvvmpath={NVVM} --uidx-file=scale.cubin accumulate_lto.o no_such_file.o -o {OUT}/out.cubin", ""),
    ("opt-host-ccbin", "-ghls=lcs-abs --host-ccbin g++ -o {OUT}/script.ld", ""),
    ("opt-time-file", "--arch=sm_90 -time {OUT}/time.csv accumulate.o scale.o -o {OUT}/out.cubin", ""),
    ("opt-time-stdout-lto", "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} -time - accumulate_lto.o scale_lto.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("opt-time-ptx", "--arch=sm_90 -time {OUT}/time.csv saxpy_ptx.o -o {OUT}/out.cubin", ""),
    // -time rows: PTX in objects and .ptx files (input order, the target as
    // given), NVVM and ptxas of partial LTO after the PTX rows, --emit-ptx,
    // rows before link errors.
    ("opt-time-ptx-file-stdout", "--arch=sm_90 -time - saxpy.ptx accumulate.o scale.o -o {OUT}/out.cubin", ""),
    ("opt-time-sm120f", "--arch=sm_120f -time {OUT}/time.csv accumulate.o scale.o -o {OUT}/out.cubin", ""),
    ("opt-time-partial-lto", "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} -time - saxpy_ptx.o accumulate_lto.o scale.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("opt-time-emit-ptx", "--arch=sm_90 -dlto --emit-ptx -nvvmpath={NVVM} -time {OUT}/time.csv accumulate_lto.o scale_lto.o -o {OUT}/out.ptx", ""),
    ("opt-time-undefined", "--arch=sm_90 -time {OUT}/time.csv saxpy_ptx.o missing.o -o {OUT}/out.cubin", ""),
    ("opt-time-relocatable", "--arch=sm_90 -r -time - accumulate.o saxpy_ptx.o -o {OUT}/out.o", ""),
    // Spellings and repeats.
    ("spellings", "--arch sm_90 --output-file={OUT}/out.cubin -L {L} --library=cudadevrt cdp.o", ""),
    ("redefined-options", "-arch=sm_80 -arch=sm_86 -arch=sm_90 -o {OUT}/x.cubin accumulate.o scale.o -o {OUT}/out.cubin", ""),
    ("same-option-twice", "-arch=sm_90 -arch=sm_90 -r -r accumulate.o scale.o -o {OUT}/out.o", ""),
    // Errors.
    ("undefined-symbol", "--arch=sm_90 missing.o -o {OUT}/out.cubin", ""),
    ("multiple-definition", "--arch=sm_90 accumulate.o scale.o dup/scale.o -o {OUT}/out.cubin", ""),
    ("missing-file", "--arch=sm_90 accumulate.o no_such_file.o -o {OUT}/out.cubin", ""),
    // Under -g nvlink compiles the PTX object first: its ptxas warns, then the fatal.
    ("missing-file-after-ptx-debug", "--arch=sm_90 -g saxpy_ptx.o no_such_file.o -o {OUT}/out.cubin", ""),
    ("unknown-option", "--arch=sm_90 -no-such-option accumulate.o -o {OUT}/out.cubin", ""),
    ("non-object-o", "--arch=sm_90 accumulate.o scale.o notes.o -o {OUT}/out.cubin", ""),
    ("non-object-txt", "--arch=sm_90 accumulate.o scale.o notes.txt -o {OUT}/out.cubin", ""),
    ("no-output", "--arch=sm_90 accumulate.o scale.o", ""),
    ("no-arch", "accumulate.o scale.o -o {OUT}/out.cubin", ""),
    ("no-arch-no-output", "accumulate.o scale.o", ""),
    ("unknown-option-value", "--arch=sm_90 --archh=sm_90 accumulate.o -o {OUT}/out.cubin", ""),
    ("unknown-option-value-short", "--arch=sm_90 -archh=sm_90 accumulate.o -o {OUT}/out.cubin", ""),
    // Outputs that cannot be written (relative names are relative to the corpus).
    ("output-dir-missing", "--arch=sm_90 accumulate.o scale.o -o no_such_dir/out.cubin", ""),
    ("output-dir-missing-abs", "--arch=sm_90 accumulate.o scale.o -o {OUT}/no_such_dir/out.cubin", ""),
    ("output-is-directory", "--arch=sm_90 accumulate.o scale.o -o adir.o", ""),
    ("register-link-binaries-dir-missing", "--arch=sm_90 --register-link-binaries=no_such_dir/reg.c accumulate.o scale.o -o {OUT}/out.cubin", ""),
    ("bad-arch", "--arch=sm_91 accumulate.o -o {OUT}/out.cubin", ""),
    ("missing-value", "--arch=sm_90 accumulate.o -o", ""),
    ("conflict-emit-ptx", "--arch=sm_90 --emit-ptx accumulate.o -o {OUT}/out.ptx", ""),
    ("conflict-lto-kinds", "--arch=sm_90 -dlto -nvvmpath={NVVM} --force-partial-lto --force-whole-lto accumulate_lto.o -o {OUT}/out.cubin", ""),
    ("conflict-partial-no-dlto", "--arch=sm_90 --force-partial-lto accumulate.o -o {OUT}/out.cubin", ""),
    ("conflict-nvvm-latest", "--arch=sm_90 -nvvm-latest accumulate.o scale.o -o {OUT}/out.cubin", ""),
    ("conflict-ofc", "--arch=sm_90 -Ofc max accumulate.o scale.o -o {OUT}/out.cubin", ""),
    ("conflict-suppress-debug-info", "--arch=sm_90 -suppress-debug-info accumulate.o scale.o -o {OUT}/out.cubin", ""),
    ("conflict-callgraph", "--arch=sm_90 -dump-callgraph -dump-callgraph-no-demangle accumulate.o -o {OUT}/out.cubin", ""),
    ("conflict-host-info", "--arch=sm_90 -use-host-info -ignore-host-info accumulate.o -o {OUT}/out.cubin", ""),
    ("dlto-without-nvvmpath-no-inputs", "--arch=sm_90 -dlto -report-arch -o {OUT}/out.cubin", ""),
    ("dlto-without-nvvmpath", "--arch=sm_90 -dlto accumulate_lto.o scale_lto.o -o {OUT}/out.cubin", ""),
    ("lto-ir-without-dlto", "--arch=sm_90 accumulate_lto.o scale_lto.o -o {OUT}/out.cubin", ""),
    // LTO IR only for a newer arch than the target: nvlink warns and links
    // the rest, with -dlto or without (not the "use -dlto" fatal).
    ("lto-ir-newer-than-target", "--arch=sm_80 -dlto -nvvmpath={NVVM} accumulate_lto.o scale.o -o {OUT}/out.cubin", ""),
    ("lto-ir-newer-without-dlto", "--arch=sm_80 accumulate_lto.o scale.o -o {OUT}/out.cubin", ""),
    ("cubin-arch-mismatch", "--arch=sm_80 accumulate_2arch.o scale.cubin -o {OUT}/out.cubin", ""),
    ("cubin-arch-mismatch-sm100", "--arch=sm_100 scale.cubin -o {OUT}/out.cubin", ""),
    ("cubin-arch-mismatch-sm90a", "--arch=sm_90a scale_sm100.cubin -o {OUT}/out.cubin", ""),
    ("cubin-accelerated-sm80", "--arch=sm_80 scale_sm90a.cubin -o {OUT}/out.cubin", ""),
    ("cubin-accelerated-sm90", "--arch=sm_90 accumulate.o scale_sm90a.cubin -o {OUT}/out.cubin", ""),
    ("cubin-accelerated-sm100", "--arch=sm_100 -report-arch scale_sm90a.cubin -o {OUT}/out.cubin", ""),
    ("cubin-sm100", "--arch=sm_100 accumulate_bw.o scale_sm100.cubin -o {OUT}/out.cubin", ""),
    ("truncated-object", "--arch=sm_90 accumulate.o scale.o truncated.o -o {OUT}/out.cubin", ""),
    // Empty names: nvlink cannot open them (the daemon must not take them
    // for the working directory); empty options-file names are skipped.
    ("empty-output-name", "--arch=sm_90 accumulate.o scale.o -o {EMPTY}", ""),
    ("empty-input-name", "--arch=sm_90 accumulate.o {EMPTY} scale.o -o {OUT}/out.cubin", ""),
    ("empty-time-name", "--arch=sm_90 accumulate.o scale.o -time {EMPTY} -o {OUT}/out.cubin", ""),
    ("conflict-force-partial-lto-emit-ptx", "--arch=sm_90 -emit-ptx -force-partial-lto accumulate.o -o {OUT}/out.ptx", ""),
    ("conflict-nvvm-latest-emit-ptx", "--arch=sm_90 -emit-ptx -nvvm-latest accumulate.o -o {OUT}/out.ptx", ""),
    ("lto-emit-ptx-split-compile-extended", "--arch=sm_90 -dlto --emit-ptx -split-compile-extended=2 -nvvmpath={NVVM} saxpy_lto.o -o {OUT}/out.ptx", ""),
    ("time-names-a-directory", "--arch=sm_90 accumulate.o scale.o -time lib -o {OUT}/out.cubin", ""),
    ("empty-options-file-names", "-optf ,link.opts, -optf {EMPTY} -o {OUT}/out.cubin", ""),
    ("archive-symtab-cut-short", "--arch=sm_90 dynsmem.o badar/libdevmath_cut.a -o {OUT}/out.cubin", ""),
    ("archive-symtab-past-end", "--arch=sm_90 -Lbadar dynsmem.o -ldevmath_symsize -o {OUT}/out.cubin", ""),
    ("archive-bsd-names", "--arch=sm_90 -Lbadar dynsmem.o -ldevmath_bsd -o {OUT}/out.cubin", ""),
    ("corrupted-fatbin", "--arch=sm_90 corrupt_fatbin.o scale.o -o {OUT}/out.cubin", ""),
    // A SASS member that does not decompress: nvlink's error, then as if the
    // object had no code for the target (its PTX unused); -w keeps both.
    ("corrupted-fatbin-report-arch", "--arch=sm_90 -report-arch -w scale.o corrupt_fatbin.o tmpl_a.o -o {OUT}/out.cubin", ""),
    ("corrupted-fatbin-suppressed", "--arch=sm_90 --suppress-arch-warning vars_use.o corrupt_fatbin.o vars_def.o -o {OUT}/out.cubin", ""),
    // Host references and no kernel at all: everything is removed.
    ("no-kernel-functions-only", "--arch=sm_90 scale.o -o {OUT}/out.cubin", ""),
    ("no-kernel-variables", "--arch=sm_90 vars_def.o scale.o -o {OUT}/out.cubin", ""),
    ("empty-input", "--arch=sm_90 accumulate.o scale.o empty.o -o {OUT}/out.cubin", ""),
    ("random-bytes-input", "--arch=sm_90 accumulate.o scale.o random.o -o {OUT}/out.cubin", ""),
    ("tiny-text-input", "--arch=sm_90 accumulate.o scale.o tiny.o -o {OUT}/out.cubin", ""),
    ("directory-input", "--arch=sm_90 accumulate.o scale.o adir.o -o {OUT}/out.cubin", ""),
    // Code written in other styles than this project's (issue 25).
    // Dynamic shared memory (`extern __shared__`) beside -lcudadevrt: nvlink
    // takes nothing from libcudadevrt for it (plain, beside other units, line
    // info, an archive, sm_80, -Werror, a debug link, dynamic parallelism
    // whose child sizes its shared memory at launch).
    ("dynsmem-nvcc-dlink", "-m64 --arch=sm_90 --register-link-binaries={OUT}/reg.c -L{L}/stubs -L{L} -cpu-arch=X86_64 dynsmem.o -lcudadevrt -o {OUT}/out.cubin --host-ccbin gcc", ""),
    ("dynsmem-beside-units", "--arch=sm_90 --register-link-binaries={OUT}/reg.c -L{L} accumulate.o dynsmem.o scale.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("dynsmem-lineinfo", "-m64 --arch=sm_90 --register-link-binaries={OUT}/reg.c -L{L} -cpu-arch=X86_64 dynsmem_li.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("dynsmem-archive", "--arch=sm_90 --register-link-binaries={OUT}/reg.c -L{L} -Llib accumulate.o scale.o -ldynsmem -lcudadevrt -o {OUT}/out.cubin", ""),
    ("dynsmem-sm80", "-m64 --arch=sm_80 --register-link-binaries={OUT}/reg.c -L{L}/stubs -L{L} -cpu-arch=X86_64 -report-arch dynsmem_2arch.o -lcudadevrt -o {OUT}/out.compute_80.cubin --host-ccbin gcc", ""),
    ("dynsmem-werror", "--arch=sm_90 -Werror -L{L} dynsmem.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("dynsmem-debug", "-m64 --arch=sm_90 --register-link-binaries={OUT}/reg.c -g -L{L} -cpu-arch=X86_64 cdp_dynsmem_G.o dynsmem.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("cdp-dynsmem", "--arch=sm_90 --register-link-binaries={OUT}/reg.c -L{L} cdp_dynsmem.o dynsmem.o -lcudadevrt -o {OUT}/out.cubin", ""),
    // Kernels no host code launches in -lineinfo and -G objects (linked without -g): removed.
    ("lineinfo-dead-kernels", "-m64 --arch=sm_90 --register-link-binaries={OUT}/reg.c -L{L} -cpu-arch=X86_64 lineinfo_dead_li.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("lineinfo-dead-kernels-archive", "--arch=sm_90 -Llib -L{L} accumulate.o scale.o -llinedead -lcudadevrt -o {OUT}/out.cubin", ""),
    ("lineinfo-dead-kernels-sm80", "--arch=sm_80 lineinfo_dead_li2arch.o -o {OUT}/out.cubin", ""),
    ("G-objects-dead-kernels", "--arch=sm_90 --register-link-binaries={OUT}/reg.c lineinfo_dead_G.o accumulate.o scale.o -o {OUT}/out.cubin", ""),
    // PTX-only objects beside libcudadevrt (nvcc -arch=compute_90 -dc): its
    // members are chosen from the code compiled at link time.
    ("ptx-only-cdp", "-m64 --arch=sm_90 -L{L} -cpu-arch=X86_64 cdp_ptx.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("ptx-only-cdp-relocatable", "--arch=sm_90 -r -L{L} cdp_ptx.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("ptx-only-cdp-undefined", "-m64 --arch=sm_90 -L{L} -cpu-arch=X86_64 missing_ptx.o cdp_ptx.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("ptx-only-callee", "-m64 --arch=sm_90 --register-link-binaries={OUT}/reg.c -L{L} -cpu-arch=X86_64 jit_lookup_ptx80.o jit_lookup_use.o -lcudadevrt -o {OUT}/out.cubin", ""),
    // nvlink -r outputs beside libcudadevrt: their references to the linker's
    // symbols (__UFT*, .nv.reservedSmem.*) are global, and take nothing; an
    // undefined function takes the runtime (a -r output of dynamic
    // parallelism), an undefined variable never does.
    ("relocatable-input-cudadevrt", "-m64 --arch=sm_90 --register-link-binaries={OUT}/reg.c -L{L} -cpu-arch=X86_64 jit_lookup_use.o relin_lookup.cubin -lcudadevrt -o {OUT}/out.cubin", ""),
    ("relocatable-input-named-o", "-m64 --arch=sm_90 -L{L} -cpu-arch=X86_64 jit_lookup_use.o relin_lookup.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("relocatable-input-several", "-m64 --arch=sm_90 --register-link-binaries={OUT}/reg.c -L{L} -cpu-arch=X86_64 jit_lookup_use.o relin_lookup.cubin relin_accscale.cubin -lcudadevrt -o {OUT}/out.cubin", ""),
    ("relocatable-input-only", "-m64 --arch=sm_90 --register-link-binaries={OUT}/reg.c -L{L} -cpu-arch=X86_64 relin_use.cubin relin_lookup.cubin -lcudadevrt -o {OUT}/out.cubin", ""),
    ("relocatable-input-cdp", "-m64 --arch=sm_90 --register-link-binaries={OUT}/reg.c -L{L} -cpu-arch=X86_64 relin_cdp.cubin -lcudadevrt -o {OUT}/out.cubin", ""),
    ("relocatable-input-dynsmem", "-m64 --arch=sm_90 --register-link-binaries={OUT}/reg.c -L{L} -cpu-arch=X86_64 relin_dynsmem.cubin -lcudadevrt -o {OUT}/out.cubin", ""),
    ("relocatable-input-cdp-dynsmem", "-m64 --arch=sm_90 -L{L} -cpu-arch=X86_64 relin_cdp_dynsmem.cubin -lcudadevrt -o {OUT}/out.cubin", ""),
    ("relocatable-input-variables", "-m64 --arch=sm_90 --register-link-binaries={OUT}/reg.c -L{L} -cpu-arch=X86_64 relin_vars_use.cubin vars_def.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("relocatable-input-relocatable", "--arch=sm_90 -r -L{L} jit_lookup_use.o relin_lookup.cubin -lcudadevrt -o {OUT}/out.cubin", ""),
    ("undefined-runtime-variable", "-m64 --arch=sm_90 -L{L} -cpu-arch=X86_64 runtime_var.o -lcudadevrt -o {OUT}/out.cubin", ""),
    // An archive of device code after a libcudadevrt nothing needs: nvlink's fatal.
    ("archive-after-cudadevrt", "-m64 --arch=sm_90 -L{L} -Llib -cpu-arch=X86_64 accumulate.o scale.o -lcudadevrt -lvarsdef -o {OUT}/out.cubin", ""),
    // A weak device function in several objects beside a kernel no host code
    // launches: where the dead kernel's leftover name goes in the string tables.
    ("weak-dead-kernel", "-m64 --arch=sm_90 -cpu-arch=X86_64 weak_dead_a.o weak_dead_b.o -o {OUT}/out.cubin", ""),
    ("weak-dead-kernel-three", "--arch=sm_90 weak_dead_a.o weak_dead_b.o weak_dead_c.o -o {OUT}/out.cubin", ""),
    ("weak-dead-kernel-last", "--arch=sm_90 -L{L} weak_dead_a.o weak_dead_c.o weak_dead_b.o -lcudadevrt -o {OUT}/out.cubin", ""),
    // A unit whose functions are all dead or defined first by another unit,
    // with names of its own (a counter, printf, `extern __shared__` memory,
    // line information): the dead kernels' leftover names open its block.
    ("dead-unit-nvcc-dlink", "-m64 --arch=sm_90 --register-link-binaries={OUT}/reg.c -L{L}/stubs -L{L} -cpu-arch=X86_64 diag_app.o diag_kernels.o -lcudadevrt -o {OUT}/out.cubin --host-ccbin gcc", ""),
    ("dead-unit-lineinfo", "-m64 --arch=sm_90 --register-link-binaries={OUT}/reg.c -L{L}/stubs -L{L} -cpu-arch=X86_64 diag_app_li.o diag_kernels_li.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("dead-unit-first", "--arch=sm_90 -L{L} diag_kernels_li.o diag_app_li.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("dead-unit-G-objects", "--arch=sm_90 --register-link-binaries={OUT}/reg.c -L{L} diag_app_G.o diag_kernels_G.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("dead-unit-archive", "--arch=sm_90 -Llib -L{L} diag_app.o -ldiag -lcudadevrt -o {OUT}/out.cubin", ""),
    ("dead-unit-archive-lineinfo", "--arch=sm_90 -Llib -L{L} diag_app_li.o -ldiag_li -lcudadevrt -o {OUT}/out.cubin", ""),
    ("dead-unit-beside-weak", "--arch=sm_90 -L{L} diag_app.o weak_dead_a.o diag_kernels.o weak_dead_b.o -lcudadevrt -o {OUT}/out.cubin", ""),
    // Recursion (nvlink's link-stage "Stack size for entry function 'K' cannot
    // be statically determined", per entry, in call-graph order): -w does not
    // hide it; -Werror makes it an error (exit 255, no cubin, the registration
    // file written); --disable-infos and --suppress-stack-size-warning drop it;
    // after nvlink's embedded ptxas ran (PTX input, partial LTO) -Werror and
    // --disable-infos no longer apply; a kernel no host code launches is not
    // checked (unless -g keeps it); -r checks nothing; whole-program LTO gets
    // ptxas's own warning (routed).
    ("recursion", "-m64 --arch=sm_90 --register-link-binaries={OUT}/reg.c -L{L}/stubs -L{L} -cpu-arch=X86_64 recursion.o -lcudadevrt -o {OUT}/out.cubin --host-ccbin gcc", ""),
    ("recursion-werror", "--arch=sm_90 -Werror --register-link-binaries={OUT}/reg.c -L{L} recursion.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("recursion-werror-w", "--arch=sm_90 -Werror -w recursion.o recursion_eval.o -o {OUT}/out.cubin", ""),
    ("recursion-w", "--arch=sm_90 -w recursion.o -o {OUT}/out.cubin", ""),
    ("recursion-disable-infos-werror", "--arch=sm_90 --disable-infos -Werror recursion.o -o {OUT}/out.cubin", ""),
    ("recursion-suppressed-werror", "--arch=sm_90 --suppress-stack-size-warning -Werror recursion.o -o {OUT}/out.cubin", ""),
    ("recursion-report-arch-werror", "--arch=sm_90 -report-arch -Werror recursion_eval.o -o {OUT}/out.cubin", ""),
    ("recursion-sm80", "-m64 --arch=sm_80 --register-link-binaries={OUT}/reg.c -L{L} -cpu-arch=X86_64 -report-arch recursion_2arch.o -lcudadevrt -o {OUT}/out.compute_80.cubin", ""),
    ("recursion-mutual", "--arch=sm_90 recursion_eval.o accumulate.o scale.o -o {OUT}/out.cubin", ""),
    ("recursion-cross-unit", "--arch=sm_90 recursion_xb.o recursion_xa.o -o {OUT}/out.cubin", ""),
    ("recursion-dead-werror", "--arch=sm_90 -Werror recursion_dead.o -o {OUT}/out.cubin", ""),
    ("recursion-archive", "--arch=sm_90 -Llib recursion.o recursion_xa.o -lrecursion -o {OUT}/out.cubin", ""),
    ("recursion-relocatable", "--arch=sm_90 -r -Werror recursion.o recursion_eval.o -o {OUT}/out.o", ""),
    ("recursion-ptx-werror", "--arch=sm_90 -Werror recursion_ptx.o -o {OUT}/out.cubin", ""),
    ("recursion-ptx-beside-werror", "--arch=sm_90 -Werror --disable-infos saxpy_ptx.o recursion.o -o {OUT}/out.cubin", ""),
    ("recursion-lto-partial-werror", "--arch=sm_90 -dlto -Werror -nvvmpath={NVVM} -L{L} recursion_xa_lto.o recursion_xb.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("recursion-lto", "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} recursion_lto.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("recursion-lto-report-arch-werror", "--arch=sm_90 -dlto -report-arch -Werror -nvvmpath={NVVM} -L{L} recursion_lto.o -lcudadevrt -o {OUT}/out.cubin", ""),
    ("recursion-undefined-werror", "--arch=sm_90 -Werror recursion.o recursion_xa.o missing.o -o {OUT}/out.cubin", ""),
    ("recursion-kernels-used", "--arch=sm_90 --kernels-used=fibTable recursion.o -o {OUT}/out.cubin", ""),
    ("recursion-debug", "--arch=sm_90 -g recursion_G.o recursion_dead.o -o {OUT}/out.cubin", ""),
    // LTO: a cross-unit call of an inline function (absent from its unit's PTX): a whole program.
    ("lto-forceinline-cross-unit", "-m64 --arch=sm_90 --register-link-binaries={OUT}/reg.c -L{L}/stubs -L{L} -cpu-arch=X86_64 -dlto -nvvmpath={NVVM} lto_inline_a.o lto_inline_b.o -lcudadevrt -o {OUT}/out.cubin --host-ccbin gcc", ""),
    ("lto-inline-cross-unit", "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} --register-link-binaries={OUT}/reg.c lto_inline_a.o lto_inline_c.o -lcudadevrt -o {OUT}/out.cubin", ""),
    // What nvcc runs for PTX-only (`-arch=compute_90 -rdc=true`) and `code=lto_80`
    // builds: no -o; nvlink writes the registration file alone, or refuses lto_80.
    ("ptx-only-nvcc-dlink", "-m64 --arch=compute_90 --register-link-binaries={OUT}/reg.c -L{L}/stubs -L{L} -cpu-arch=X86_64 dynsmem_ptx.o saxpy_ptx.o -lcudadevrt", ""),
    ("ptx-only-with-output", "--arch=compute_90 saxpy_ptx.o -o {OUT}/out.cubin", ""),
    ("lto-virtual-target", "-m64 --arch=lto_80 --register-link-binaries={OUT}/reg.c -L{L}/stubs -L{L} -cpu-arch=X86_64 xcall_main_lto3.o -lcudadevrt", ""),
    // Option values nvlink checks in its own words.
    ("opt-device-stack-protector-value", "--arch=sm_90 -device-stack-protector=x accumulate.o scale.o -o {OUT}/out.cubin", ""),
    ("opt-ofc-value-without-dlto", "--arch=sm_90 -Ofc=bogus accumulate.o scale.o -o {OUT}/out.cubin", ""),
    ("opt-ofc-value", "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} -Ofc=bogus accumulate_lto.o scale_lto.o -lcudadevrt -o {OUT}/out.cubin", ""),
    // An empty list: as if the option were absent (pruned by the host references).
    ("opt-kernels-used-empty", "--arch=sm_90 -kernels-used= accumulate.o scale.o -o {OUT}/out.cubin", ""),
    ("opt-variables-used-empty", "--arch=sm_90 --variables-used= vars_def.o vars_use.o accumulate.o scale.o -o {OUT}/out.cubin", ""),
    ("options-file", "--options-file link.opts -o {OUT}/out.cubin", ""),
    ("options-file-short", "-arch=sm_90 mathlib_main.o -optf lib.opts -o {OUT}/out.cubin", ""),
    ("options-file-missing", "--options-file no_such.opts -o {OUT}/out.cubin", ""),
    ("options-file-nested-15", "-optf nest15_1.opts accumulate.o scale.o -o {OUT}/out.cubin", ""),
    ("options-file-nested-16", "-optf nest1.opts accumulate.o scale.o -o {OUT}/out.cubin", ""),
    ("options-file-self", "--arch=sm_90 -optf self.opts accumulate.o -o {OUT}/out.cubin", ""),
];

/// Cases the in-process engine must serve itself (a routing regression fails
/// the test even when the real nvlink engine keeps the bytes right).
const IN_PROCESS: &[&str] = &[
    // `-time` naming a directory: nvlink's fatal, from the shim's write.
    "empty-time-name",
    "time-names-a-directory",
    // Code in other styles: dynamic shared memory, line and debug information.
    "dynsmem-nvcc-dlink",
    "dynsmem-beside-units",
    "dynsmem-lineinfo",
    "dynsmem-archive",
    "dynsmem-sm80",
    "cdp-dynsmem",
    "lineinfo-dead-kernels",
    "lineinfo-dead-kernels-archive",
    "lineinfo-dead-kernels-sm80",
    "G-objects-dead-kernels",
    "opt-kernels-used-empty",
    "opt-variables-used-empty",
    "weak-dead-kernel",
    "weak-dead-kernel-three",
    "weak-dead-kernel-last",
    "dead-unit-nvcc-dlink",
    "dead-unit-lineinfo",
    "dead-unit-first",
    "dead-unit-G-objects",
    "dead-unit-archive",
    "dead-unit-archive-lineinfo",
    "dead-unit-beside-weak",
    "lto-forceinline-cross-unit",
    "lto-inline-cross-unit",
    // nvcc's -dlto links of code=lto_XY objects (no PTX twin), in other styles too.
    "nvcc-dlto-sm80",
    "nvcc-dlto-sm90",
    "nvcc-dlto-sm100",
    "cmake-dlto-sm90",
    "lto-cross-unit-archive",
    "lto-ir-only-styles",
    "lto-ir-only-styles-emit-ptx",
    "lto-ir-only-styles-registered",
    "lto-styles",
    "lto-unlaunched-kernels",
    "lto-host-variable-only",
    "lto-static-kernel-only",
    "nvcc-dlink",
    "device-vars",
    "cdp",
    "data-segment-layout",
    "static-lib",
    "ptx-only",
    "two-arch-sm80",
    "relocatable",
    "lto",
    "emit-ptx",
    "compressed-variants",
    "arch-suffixed-sm90a",
    "ptx-jit-sm100",
    "ptx-jit-family-sm120f",
    "sass-sm100",
    "sass-arch-specific-sm100a",
    "sass-arch-specific-sm90a",
    "sass-not-found-sm120",
    "sass-family-sm103",
    "sass-family-sm121",
    "ptx-jit-family-sm110",
    "relocatable-sm100",
    "lto-sm100",
    "cubin-sm100",
    "opt-debug",
    "debug-nvcc-dlink",
    "debug-mixed",
    "debug-relocatable",
    "opt-use-host-info",
    "keep-system-libraries",
    "keep-system-libraries-cdp",
    "opt-device-stack-protector",
    "opt-device-stack-protector-cdp",
    "lto-cross-unit",
    "nvcc-dlink-sm80",
    "nvcc-dlink-sm90",
    "nvcc-dlink-sm100",
    "cmake-dlink-sm80",
    "lto-host-object",
    "lto-host-object-emit-ptx",
    "lto-cudart-static",
    "lto-xcall-cudart-static",
    "lto-libcxx",
    "lto-libcxx-host-object",
    "lto-libcxx-cudart-static-emit-ptx",
    "lto-cub-host-object",
    "cudart-static",
    "host-cpp-object",
    "lto-thrust-host-object",
    "thrust-cudart-static",
    "cmake-dlink-sm90",
    "report-arch-warning",
    "report-arch-info",
    "report-arch-skipping-incompatible",
    // LTO modules without a PTX twin (nvcc -dlto, code=lto_XY).
    // A callee only .nv.callgraph records.
    "cub-2arch-sm80",
    // Options forwarded to NVVM and ptxas under -dlto.
    "opt-lto-maxrregcount",
    "opt-lto-xptxas",
    "opt-lto-xnvvm",
    "opt-lto-xnvvm-opt0",
    "opt-lto-ofast-compile",
    "opt-lto-force-whole",
    "opt-lto-split-compile",
    "opt-lto-split-compile-xcall",
    // nvlink's link errors.
    "undefined-symbol",
    "opt-report-arch",
    "multiple-definition",
    // The user's --kernels-used/--variables-used (instead of host references).
    "opt-kernels-used",
    "opt-kernels-used-cdp",
    "opt-kernels-used-none",
    "opt-variables-used",
    // Partial LTO of one LTO module.
    "lto-partial",
    "opt-disable-infos",
    "lto-partial-archive",
    "lto-partial-cdp-object",
    "lto-partial-nvcc",
    "lto-partial-undefined",
    // --device-stack-protector for ptxas at link time.
    "opt-device-stack-protector-ptx",
    "opt-device-stack-protector-lto",
    "opt-device-stack-protector-partial-lto",
    "opt-verbose2",
    "opt-verbose2-cdp",
    // -time tables; libraries skipped for --cpu-arch.
    "opt-time-file",
    "opt-time-stdout-lto",
    "opt-time-ptx",
    "opt-time-ptx-file-stdout",
    "opt-time-sm120f",
    "opt-time-partial-lto",
    "opt-time-emit-ptx",
    "opt-time-undefined",
    "opt-time-relocatable",
    "opt-cpu-arch",
    "cpu-arch-library-skipped",
    "cpu-arch-named-archive",
    "cpu-arch-unknown-library",
    "cpu-arch-linked",
    // --link-as-tools-patch's check.
    "opt-link-as-tools-patch",
    "tools-patch-cdp",
    "tools-patch-ptx-first",
    "tools-patch-relocatable",
    "tools-patch-multiple-definition",
    "tools-patch-undefined",
    // A member that does not decompress.
    "corrupted-fatbin-report-arch",
    "corrupted-fatbin-suppressed",
    "ld-r-merged-object",
    "corrupted-fatbin",
    "no-kernel-functions-only",
    "no-kernel-variables",
    // Recursion: nvlink's stack-size warnings (from nvJitLink's info log).
    "recursion",
    "recursion-werror",
    "recursion-werror-w",
    "recursion-w",
    "recursion-disable-infos-werror",
    "recursion-suppressed-werror",
    "recursion-report-arch-werror",
    "recursion-sm80",
    "recursion-mutual",
    "recursion-cross-unit",
    "recursion-dead-werror",
    "recursion-archive",
    "recursion-relocatable",
    "recursion-ptx-werror",
    "recursion-ptx-beside-werror",
    "recursion-lto-partial-werror",
    "recursion-lto",
    "recursion-lto-report-arch-werror",
    "recursion-undefined-werror",
    "recursion-kernels-used",
    "recursion-debug",
];

/// Cases whose output must be nvlink's to the byte, tool note included (the
/// comparison otherwise lets `.note.nv.tkinfo` differ): the in-process engine
/// rewrites its ptxas's entry there as nvlink's embedded ptxas records it.
const BYTE_IDENTICAL: &[&str] = &[
    "opt-lto-debug",
    "opt-lto-debug-report-arch",
    "opt-lto-debug-partial",
    "opt-lto-debug-relocatable",
    "opt-lto-debug-cdp",
];

/// Cases the real nvlink still serves (routed), with the `Reason` the daemon
/// counts for them (`stats --json` `routed`); docs/routed.md lists the
/// same. Any other case routed fails the test, and so does a
/// case listed here that is served otherwise (then the list is out of date).
const ROUTED: &[(&str, &str)] = &[
    ("opt-verbose", "options"),
    ("opt-dump-callgraph", "options"),
    ("opt-dump-callgraph-no-demangle", "options"),
    ("opt-suppress-debug-info-cdp", "options"),
    ("opt-preserve-relocs", "options"),
    ("opt-extra-warnings", "options"),
    ("static-lib-LIBRARY_PATH-routed", "options"),
    // Device code after a libcudadevrt of which nothing is linked.
    ("archive-after-cudadevrt", "diagnostics"),
    // -g with an input fatal: nvlink's JIT warnings come first.
    ("missing-file-after-ptx-debug", "diagnostics"),
    // A virtual target: nvlink links no device code, it registers the objects.
    ("ptx-only-nvcc-dlink", "arch"),
    ("ptx-only-with-output", "arch"),
    // Archives nvlink's reader refuses ('archive member size exceeds library
    // bounds', 'unexpected archive format'), declined in process.
    ("archive-symtab-cut-short", "input"),
    ("archive-symtab-past-end", "input"),
    ("archive-bsd-names", "input"),
    // LTO IR only for newer archs: nvlink's warnings and the rest linked.
    ("lto-ir-newer-than-target", "arch"),
    ("lto-ir-newer-without-dlto", "arch"),
    // --emit-ptx with -r: nvlink's PTX of a partial link.
    ("lto-emit-ptx-relocatable", "lto_options"),
    // -split-compile-extended under -dlto: nvlink links the parts NVVM splits.
    ("opt-lto-split-compile-extended", "lto_options"),
    ("opt-lto-split-compile-extended-xcall", "lto_options"),
    ("lto-emit-ptx-split-compile-extended", "lto_options"),
];

/// The routing reason counted (`stats --json` `routed`, reason → count) for
/// the one link run between two reads of a daemon's stats.
fn reason_between(before: &serde_json::Value, after: &serde_json::Value) -> Option<String> {
    let routed = after["routed"].as_object()?;
    routed
        .iter()
        .find(|(reason, n)| n.as_u64() > before["routed"][reason.as_str()].as_u64().or(Some(0)))
        .map(|(reason, _)| reason.clone())
}

/// A case's command line as words; `{EMPTY}` is an empty argument (`-o ''`).
fn words(s: &str) -> Vec<String> {
    s.split_whitespace().map(|w| if w == "{EMPTY}" { String::new() } else { w.to_owned() }).collect()
}

fn expand(s: &str, out: &str) -> String {
    let lib = cuda_home().join("lib");
    let nvvm = cuda_home().join("nvvm");
    s.replace("{L}", &lib.display().to_string()).replace("{NVVM}", &nvvm.display().to_string()).replace("{OUT}", out)
}

struct Row {
    name: &'static str,
    /// Which engine served the cold link (see [`engine_between`]).
    engine: String,
    /// The routing reason counted for it, if it was routed.
    reason: Option<String>,
    cmp: Comparison,
}

/// `-time` tables: the measured times naturally differ; every other cell must not.
fn mask_times(r: &mut nvlinkd_tests::run::Run) {
    fn mask(text: &[u8]) -> Vec<u8> {
        let text = String::from_utf8_lossy(text);
        text.lines()
            .map(|l| match l.rsplit_once(" , ms") {
                Some((head, tail)) => match head.rsplit_once(" , ") {
                    Some((cells, t)) if t.trim().parse::<f64>().is_ok() => format!("{cells} , <time> , ms{tail}"),
                    _ => l.to_owned(),
                },
                None => l.to_owned(),
            })
            .collect::<Vec<_>>()
            .join("\n")
            .into_bytes()
    }
    r.stdout = mask(&r.stdout);
    for (name, data) in r.files.iter_mut() {
        if name.ends_with(".csv") {
            *data = mask(data);
        }
    }
}

/// The finalizer's layout model must reproduce every cubin nvlink wrote:
/// parse and serialize again, byte for byte (on the releases it is made for:
/// another release's links never reach the finalizer).
fn layout_roundtrip_problems(files: &std::collections::BTreeMap<String, Vec<u8>>) -> Vec<String> {
    use nvlinkd_core::finalize::image::CubinImage;
    if !proven_release() {
        return Vec::new();
    }
    files
        .iter()
        .filter(|(_, b)| nvlinkd_core::elf::Elf::parse(b).map(|e| e.is_cubin()).unwrap_or(false))
        .filter_map(|(n, b)| match CubinImage::parse(b) {
            Ok(img) if img.serialize() == *b => None,
            Ok(_) => Some(format!("{n}: nvlink's cubin does not survive parse+serialize")),
            Err(e) => Some(format!("{n}: {e}")),
        })
        .collect()
}

/// The cases to run: every case, or those named in `NVLINKD_PARITY_CASES`
/// (comma-separated), e.g. `NVLINKD_PARITY_CASES=cdp cargo test -p
/// nvlinkd-tests --test parity -- --nocapture`.
fn cases() -> Vec<(&'static str, &'static str, &'static str)> {
    let only = std::env::var("NVLINKD_PARITY_CASES").unwrap_or_default();
    let names: Vec<&str> = only.split(',').map(str::trim).filter(|s| !s.is_empty()).collect();
    if let Some(unknown) = names.iter().find(|n| !CASES.iter().any(|c| c.0 == **n)) {
        panic!("NVLINKD_PARITY_CASES names no parity case {unknown:?}");
    }
    CASES.iter().copied().filter(|c| names.is_empty() || names.contains(&c.0)).collect()
}

#[test]
fn parity_with_nvlink() {
    let cases = cases();
    let corpus = corpus::dir();
    // One daemon per thread, each running one link at a time, so that the
    // change of its counters over a link tells which engine served that link;
    // no speculative link of one arch's case may serve another arch's
    // (tests/tests/speculate.rs covers those).
    // Each daemon also checks itself against nvlink before answering
    // (`--verify=sync`): it must never find its in-process answer wrong.
    let daemons: Vec<Daemon> = (0..4).map(|_| Daemon::start_with(&["--no-speculate", "--verify=sync"])).collect();
    let work = TempDir::new("parity");
    let rows = Mutex::new(Vec::new());
    let next = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        for daemon in &daemons {
            let (next, rows, cases, corpus, work) = (&next, &rows, &cases, &corpus, &work);
            s.spawn(move || loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(&(name, args, env)) = cases.get(i) else { break };
                let out = work.path().join(name);
                let out_s = out.display().to_string();
                let inv = Invocation {
                    args: words(&expand(args, &out_s)),
                    cwd: corpus.to_path_buf(),
                    env: env
                        .split_whitespace()
                        .filter_map(|kv| kv.split_once('='))
                        .map(|(k, v)| (k.into(), v.into()))
                        .collect(),
                    out_dir: out,
                };
                let mut expected = run(&real_nvlink(), &inv, &[]);
                let before = daemon.stats();
                let mut actual = run(&shim(), &inv, &daemon.shim_env());
                let after = daemon.stats();
                let engine = engine_between(&before, &after);
                let reason = reason_between(&before, &after);
                if name.starts_with("opt-time") {
                    mask_times(&mut expected);
                    mask_times(&mut actual);
                }
                let mut cmp = compare::runs(&expected, &actual);
                cmp.problems.extend(layout_roundtrip_problems(&expected.files));
                // Again, warm: whatever the cache returns must be nvlink's result too.
                let mut again = run(&shim(), &inv, &daemon.shim_env());
                if name.starts_with("opt-time") {
                    mask_times(&mut again);
                }
                let warm = compare::runs(&expected, &again);
                cmp.problems.extend(warm.problems.into_iter().map(|p| format!("warm: {p}")));
                cmp.identical &= warm.identical;
                if BYTE_IDENTICAL.contains(&name) && !cmp.identical && cmp.problems.is_empty() {
                    cmp.problems.push("not byte-identical (.note.nv.tkinfo)".into());
                }
                rows.lock().unwrap().push(Row { name, engine, reason, cmp });
            });
        }
    });
    let mut rows = rows.into_inner().unwrap();
    let requests: u64 = daemons.iter().map(|d| d.stat("requests")).sum();
    let hits: u64 = daemons.iter().map(|d| d.stat("cache_hits")).sum();
    rows.sort_by_key(|r| CASES.iter().position(|c| c.0 == r.name));
    let identical = rows.iter().filter(|r| r.cmp.identical && r.cmp.problems.is_empty()).count();
    let equivalent = rows.iter().filter(|r| !r.cmp.identical && r.cmp.problems.is_empty()).count();
    let differing: Vec<&Row> = rows.iter().filter(|r| !r.cmp.problems.is_empty()).collect();
    println!("\nparity with nvlink ({} cases):", rows.len());
    for r in &rows {
        let verdict = if !r.cmp.problems.is_empty() {
            "DIFFERS"
        } else if r.cmp.identical {
            "byte-identical"
        } else {
            "equal except tkinfo"
        };
        println!("  {:<32} {:<22} {}", r.name, verdict, r.engine);
    }
    println!(
        "cases: {}  byte-identical: {identical}  equivalent: {equivalent}  differing: {}",
        rows.len(),
        differing.len()
    );
    for r in &differing {
        println!("\n== {} ==\n{}", r.name, r.cmp.problems.join("\n"));
    }
    // A release the in-process engine is not proven on: every link is its
    // own nvlink's (reason `release`), and must be byte-identical still.
    let proven = proven_release();
    if !proven {
        let inside: Vec<&str> = rows.iter().filter(|r| r.engine == "in-process").map(|r| r.name).collect();
        assert!(inside.is_empty(), "linked in process on a release not proven: {inside:?}");
    }
    let routed: Vec<&str> = IN_PROCESS
        .iter()
        .copied()
        .filter(|_| proven)
        .filter(|name| cases.iter().any(|c| c.0 == *name))
        .filter(|name| rows.iter().find(|r| r.name == *name).map(|r| r.engine.as_str()) != Some("in-process"))
        .collect();
    assert!(routed.is_empty(), "cases no longer linked in process: {routed:?}");
    let mut misrouted = Vec::new();
    for r in rows.iter().filter(|_| proven) {
        let listed = ROUTED.iter().find(|(n, _)| *n == r.name).map(|(_, why)| *why);
        let engine = r.engine.as_str();
        match (listed, engine == "nvlink engine") {
            (None, true) => misrouted.push(format!("{} routed ({:?}), not listed", r.name, r.reason)),
            (Some(_), false) => misrouted.push(format!("{} listed as routed, served by {engine}", r.name)),
            (Some(why), true) if r.reason.as_deref() != Some(why) => {
                misrouted.push(format!("{} routed for {:?}, listed for {why}", r.name, r.reason))
            }
            _ => {}
        }
    }
    let total_routed = rows.iter().filter(|r| r.engine == "nvlink engine").count();
    println!("routed to the real nvlink: {total_routed} of {} cases", rows.len());
    assert!(misrouted.is_empty(), "routing differs from ROUTED: {misrouted:#?}");
    // Host linker scripts never reach a daemon: the shim's nvlink makes them.
    let ghls = cases.iter().filter(|(_, args, _)| args.contains("-ghls") || args.contains("--gen-host")).count();
    assert!(requests >= 2 * (cases.len() - ghls) as u64, "links did not go through the daemon");
    println!("daemon: {requests} requests, {hits} served from the cache");
    assert!(hits > 0 || !proven, "the second pass never hit the cache");
    let verified: u64 = daemons.iter().map(|d| d.stat("verified")).sum();
    let mismatches: u64 = daemons.iter().map(|d| d.stat("verify_mismatches")).sum();
    let skipped: u64 = daemons.iter().map(|d| d.stat("verify_skipped")).sum();
    println!(
        "verified against nvlink (--verify=sync): {verified} links, {mismatches} mismatches, {skipped} not verifiable"
    );
    assert!(verified > 0 || !proven, "no link was verified");
    assert_eq!(mismatches, 0, "verification found in-process answers wrong (see the daemons' verify/ bundles)");
    assert!(differing.is_empty(), "{} cases differ from nvlink", differing.len());
}

/// Whether the toolkit under test is of a release the in-process engine is
/// proven on (`nvlinkd_core::toolkit::IN_PROCESS_PROVEN`), from its nvlink's
/// banner (`release 13.5,`).
fn proven_release() -> bool {
    static PROVEN: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *PROVEN.get_or_init(|| {
        let out = std::process::Command::new(real_nvlink()).arg("--version").output().unwrap();
        let banner = String::from_utf8_lossy(&out.stdout).into_owned();
        let release = banner.split("release ").nth(1).and_then(|r| r.split(',').next()).unwrap_or_default();
        let (major, minor) = release.split_once('.').unwrap_or_default();
        let release = (major.parse().unwrap_or(0), minor.parse().unwrap_or(0));
        nvlinkd_core::toolkit::IN_PROCESS_PROVEN.contains(&release)
    })
}

/// The corpus through the remote path: TLS and a token over 127.0.0.1, the
/// daemon running as `nobody` on a private (0700) copy of the corpus it cannot
/// read, so every input comes through the shim and its policy. Every answer
/// must be nvlink's; the routed cases run on the daemon's nvlink in a sandbox
/// (byte-identical, none falling back), and `-ghls` never reaches the daemon.
#[test]
fn parity_through_the_remote_path_as_another_user() {
    let cases = cases();
    let pki = nvlinkd_tests::remote::Pki::new();
    let Some(daemon) = nvlinkd_tests::remote::NobodyDaemon::start(&pki) else { return };
    let corpus = nvlinkd_tests::remote::private_copy(corpus::dir(), "parity-remote-in");
    let env = pki.shim_env(&daemon.addr(), "auto");
    let work = TempDir::new("parity-remote");
    let differing = Mutex::new(Vec::new());
    let next = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(&(name, args, case_env)) = cases.get(i) else { break };
                let out = work.path().join(name);
                let out_s = out.display().to_string();
                let inv = Invocation {
                    args: words(&expand(args, &out_s)),
                    cwd: corpus.path().to_path_buf(),
                    env: case_env
                        .split_whitespace()
                        .filter_map(|kv| kv.split_once('='))
                        .map(|(k, v)| (k.into(), v.into()))
                        .collect(),
                    out_dir: out,
                };
                let mut expected = run(&real_nvlink(), &inv, &[]);
                let mut actual = run(&shim(), &inv, &env);
                if name.starts_with("opt-time") {
                    mask_times(&mut expected);
                    mask_times(&mut actual);
                }
                let mut cmp = compare::runs(&expected, &actual);
                // What the daemon's nvlink made in its sandbox is nvlink's to the byte.
                if !cmp.identical && cmp.problems.is_empty() && ROUTED.iter().any(|(n, _)| *n == name) {
                    cmp.problems.push("a routed case not byte-identical (.note.nv.tkinfo)".into());
                }
                if !cmp.problems.is_empty() {
                    differing.lock().unwrap().push(format!("== {name} ==\n{}", cmp.problems.join("\n")));
                }
            });
        }
    });
    let differing = differing.into_inner().unwrap();
    let stats = daemon.stats();
    let count = |k: &str| stats[k].as_u64().unwrap_or(0);
    println!(
        "remote parity: {} cases, {} differing; daemon: {} requests, {} in process, {} by its nvlink, {} fallbacks {}",
        cases.len(),
        differing.len(),
        count("requests"),
        count("in_process"),
        count("nvlink_process"),
        count("fallbacks"),
        stats["fallback_reasons"]
    );
    assert!(differing.is_empty(), "{}", differing.join("\n"));
    assert!(count("in_process") > 0, "no link was served remotely: {stats}");
    // Routed links run on the daemon's nvlink in a sandbox; none falls back.
    // (A link naming another libNVVM never reaches a remote daemon: the
    // shim's nvlink answers it.)
    let foreign_nvvm = |args: &str| args.contains("-nvvmpath=") && !args.contains("{NVVM}");
    let routed = cases.iter().filter(|c| ROUTED.iter().any(|(n, _)| *n == c.0) && !foreign_nvvm(c.1)).count() as u64;
    assert!(count("nvlink_process") >= routed, "{routed} routed cases, fewer served by the daemon's nvlink: {stats}");
    assert_eq!(count("fallbacks"), 0, "links fell back to the caller's nvlink: {stats}");
}

/// Host linker scripts (`-ghls`) with a remote daemon: the host's `gcc` and
/// `ld` make them, so the shim has the real nvlink make them on the caller's
/// machine, even under `NVLINKD_FALLBACK=never` and with no daemon answering
/// at that address; every answer is nvlink's.
#[test]
fn host_linker_scripts_are_made_on_the_callers_side() {
    let cases: Vec<_> =
        cases().into_iter().filter(|(_, args, _)| args.contains("-ghls") || args.contains("--gen-host")).collect();
    let work = TempDir::new("ghls-remote");
    let addr = format!("https://127.0.0.1:{}", nvlinkd_tests::remote::free_port());
    let env = vec![
        (nvlinkd_proto::paths::ENV_ADDR.to_string(), addr),
        (nvlinkd_proto::paths::ENV_FALLBACK.to_string(), "never".to_string()),
        (nvlinkd_proto::paths::ENV_REAL_NVLINK.to_string(), real_nvlink().display().to_string()),
    ];
    let mut differing = Vec::new();
    for (name, args, _) in &cases {
        let out = work.path().join(name);
        let inv = Invocation {
            args: words(&expand(args, &out.display().to_string())),
            cwd: corpus::dir().to_path_buf(),
            env: Vec::new(),
            out_dir: out,
        };
        let expected = run(&real_nvlink(), &inv, &[]);
        let actual = run(&shim(), &inv, &env);
        let cmp = compare::runs(&expected, &actual);
        if !cmp.problems.is_empty() {
            differing.push(format!("== {name} ==\n{}", cmp.problems.join("\n")));
        }
    }
    println!("host linker scripts with a remote daemon: {} cases, {} differing", cases.len(), differing.len());
    assert!(cases.len() >= 7, "the corpus lost its -ghls cases");
    assert!(differing.is_empty(), "{}", differing.join("\n"));
}

/// A remote link whose `-nvvmpath` names another libNVVM than the toolkit's
/// (an empty one here: nvlink's "elfLink linker library load error") runs the
/// real nvlink on the caller's side, even under `NVLINKD_FALLBACK=never` and
/// with no daemon answering: a remote daemon holds its own toolkit's.
#[test]
fn a_remote_link_with_another_libnvvm_runs_the_callers_nvlink() {
    let work = TempDir::new("nvvm-remote");
    std::fs::create_dir_all(work.path().join("fake/lib64")).unwrap();
    std::fs::write(work.path().join("fake/lib64/libnvvm.so"), b"").unwrap();
    for f in ["accumulate_lto.o", "scale_lto.o"] {
        std::fs::copy(corpus::dir().join(f), work.path().join(f)).unwrap();
    }
    let addr = format!("https://127.0.0.1:{}", nvlinkd_tests::remote::free_port());
    let env = vec![
        (nvlinkd_proto::paths::ENV_ADDR.to_string(), addr),
        (nvlinkd_proto::paths::ENV_FALLBACK.to_string(), "never".to_string()),
        (nvlinkd_proto::paths::ENV_REAL_NVLINK.to_string(), real_nvlink().display().to_string()),
    ];
    let out = work.path().join("out");
    let inv = Invocation {
        args: words(&expand(
            "--arch=sm_90 -dlto -nvvmpath=fake -L{L} accumulate_lto.o scale_lto.o -lcudadevrt -o {OUT}/out.cubin",
            &out.display().to_string(),
        )),
        cwd: work.path().to_path_buf(),
        env: Vec::new(),
        out_dir: out,
    };
    let expected = run(&real_nvlink(), &inv, &[]);
    assert_ne!(expected.code, 0, "nvlink loaded an empty libNVVM");
    let cmp = compare::runs(&expected, &run(&shim(), &inv, &env));
    assert!(cmp.problems.is_empty(), "{:?}", cmp.problems);
}

/// The cache key of an invocation, as the daemon computes it (any toolkit identity).
fn link_keys(inv: &Invocation) -> Option<nvlinkd_core::linkcache::LinkKeys> {
    let req = nvlinkd_core::request::Request {
        args: inv.args.clone(),
        cwd: inv.cwd.clone(),
        env: inv.env.iter().cloned().collect(),
        ..Default::default()
    };
    nvlinkd_core::linkcache::keys_of(&req)
}

/// Cases where the key sees a difference nvlink's output does not show, and
/// why the key keeps it.
const KNOWN_MISSES: &[(&str, &str)] = &[(
    "debug-relocatable",
    "-G device debug information names nvcc's temporary file inside the compressed fatbin; \
     `-g -r` output does not show it, `-g` executables do (debug-nvcc-dlink)",
)];

/// Keys on what nvlink reads: every case that reads an object compiled twice
/// (the corpus's `twin/`: the same sources compiled again in the same place,
/// nvcc's temporary file name aside) is linked by the real nvlink on both
/// compilations; the whole-link cache keys of the two must be equal exactly
/// when everything nvlink produced (output files, stdout, stderr, exit status)
/// is equal. A key that misses a difference nvlink makes is a wrong hit; a key
/// that sees one nvlink ignores is a recompile that never hits.
#[test]
fn recompiled_keys_match_nvlink() {
    let twins = corpus::Recompiled::twins();
    let cases: Vec<_> = cases()
        .into_iter()
        .filter(|(_, args, _)| args.contains(".opts") || twins.iter().any(|t| args.contains(t.as_str())))
        .collect();
    let rows = Mutex::new(Vec::new());
    let next = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(&(name, args, env)) = cases.get(i) else { break };
                let view = corpus::Recompiled::new("keys");
                let out = TempDir::new("keys-out");
                let inv = Invocation {
                    args: expand(args, &out.path().display().to_string())
                        .split_whitespace()
                        .map(String::from)
                        .collect(),
                    cwd: view.dir.path().to_owned(),
                    env: env
                        .split_whitespace()
                        .filter_map(|kv| kv.split_once('='))
                        .map(|(k, v)| (k.into(), v.into()))
                        .collect(),
                    out_dir: out.path().to_owned(),
                };
                let (k1, r1) = (link_keys(&inv), run(&real_nvlink(), &inv, &[]));
                view.swap();
                // As before the first run: no output files yet (an existing
                // registration file is part of an LTO link's key).
                let _ = std::fs::remove_dir_all(out.path());
                std::fs::create_dir_all(out.path()).expect("output dir");
                let (k2, r2) = (link_keys(&inv), run(&real_nvlink(), &inv, &[]));
                rows.lock().unwrap().push((name, k1, k2, r1 == r2));
            });
        }
    });
    let mut rows = rows.into_inner().unwrap();
    rows.sort_by_key(|r| CASES.iter().position(|c| c.0 == r.0));
    let mut problems = Vec::new();
    let (mut hits, mut misses, mut uncached) = (0, 0, 0);
    for (name, k1, k2, same) in &rows {
        match (k1, k2) {
            (Some(a), Some(b)) => {
                let keys_equal = a.content == b.content && a.named == b.named;
                let verdict = match (keys_equal, same) {
                    (true, true) => "equal keys, equal outputs (a hit)",
                    (false, false) => "keys differ, outputs differ",
                    (true, false) => "WRONG HIT: equal keys, outputs differ",
                    (false, true) => "MISS: keys differ, outputs equal",
                };
                println!("  {name:<40} {verdict}");
                let known = KNOWN_MISSES.iter().any(|(n, _)| n == name);
                if known && (keys_equal || !same) {
                    problems.push(format!("{name}: listed as a known miss, but {verdict}"));
                }
                if keys_equal != *same && (!known || keys_equal) {
                    problems.push(format!("{name}: {verdict}"));
                }
                if keys_equal {
                    hits += 1;
                } else {
                    misses += 1;
                }
            }
            (None, None) => uncached += 1,
            _ => problems.push(format!("{name}: cacheable for one compilation only")),
        }
    }
    println!("recompiled: {} cases, {hits} equal keys, {misses} different, {uncached} not cached", rows.len());
    assert!(problems.is_empty(), "keys disagree with nvlink:\n{}", problems.join("\n"));
    assert!(hits > 0, "no case of a recompiled object was a hit");
}

/// Through the daemon: a link of the first compilation, then the same link of
/// the recompiled objects is a cache hit answering exactly what the real
/// nvlink writes and prints for the recompiled objects (non-LTO, LTO, with a
/// registration file).
#[test]
fn recompiled_objects_hit_the_daemon_cache() {
    let daemon = Daemon::start();
    for name in ["nvcc-dlink", "lto-registered", "lto-cross-unit"] {
        let (_, args, _) = *CASES.iter().find(|c| c.0 == name).expect("case");
        let view = corpus::Recompiled::new("hit");
        let out = TempDir::new("hit-out");
        let inv = Invocation {
            args: words(&expand(args, &out.path().display().to_string())),
            cwd: view.dir.path().to_owned(),
            env: Vec::new(),
            out_dir: out.path().to_owned(),
        };
        let first = run(&shim(), &inv, &daemon.shim_env());
        assert_eq!(first.code, 0, "{name}: {}", String::from_utf8_lossy(&first.stderr));
        let hits = daemon.stat("cache_hits");
        view.swap();
        let expected = run(&real_nvlink(), &inv, &[]);
        let actual = run(&shim(), &inv, &daemon.shim_env());
        assert_eq!(daemon.stat("cache_hits"), hits + 1, "{name}: the recompiled link was not a cache hit");
        assert!(actual == expected, "{name}: the hit differs from nvlink's output for the recompiled objects");
    }
}

/// Archives as nvlink reads them, made here with `ar` from corpus objects:
/// `-l` takes an archive only when one of its members up to the first non-ELF
/// one has the `--cpu-arch`'s `e_machine` (else "Skipping incompatible"), and
/// nvlink reads no member after a non-ELF one (a text file, an empty member),
/// named or `-l`. Each link through the daemon must be nvlink's, in process.
#[test]
fn archive_members_and_cpu_arch_match_nvlink() {
    let corpus = corpus::dir();
    let dir = TempDir::new("archives");
    let copy = |from: &str, to: &str, machine: Option<u16>| {
        let mut b = std::fs::read(corpus.join(from)).expect("corpus object");
        if let Some(m) = machine {
            b[18..20].copy_from_slice(&m.to_le_bytes());
        }
        std::fs::write(dir.path().join(to), b).expect("member");
    };
    copy("mathlib_1.o", "m1.o", None);
    copy("mathlib_2.o", "m2.o", None);
    copy("mathlib_1.o", "arm1.o", Some(183));
    copy("mathlib_2.o", "arm2.o", Some(183));
    copy("scale.cubin", "k.cubin", None);
    std::fs::write(dir.path().join("text.txt"), "not an object\n").unwrap();
    std::fs::write(dir.path().join("empty.o"), "").unwrap();
    // (directory, members in order)
    let archives: &[(&str, &[&str])] = &[
        ("arm", &["arm1.o", "arm2.o"]),
        ("mixed", &["arm1.o", "m2.o"]),
        ("text-first", &["text.txt", "m1.o", "m2.o"]),
        ("text-middle", &["m1.o", "text.txt", "m2.o"]),
        ("text-middle-arm", &["arm1.o", "text.txt", "m2.o"]),
        ("empty-first", &["empty.o", "m1.o", "m2.o"]),
        ("cubin-first", &["k.cubin", "m1.o", "m2.o"]),
    ];
    for (name, members) in archives {
        std::fs::create_dir_all(dir.path().join(name)).unwrap();
        let status = std::process::Command::new("ar")
            .arg("rc")
            .arg(format!("{name}/libm.a"))
            .args(members.iter())
            .current_dir(dir.path())
            .status()
            .expect("ar");
        assert!(status.success(), "ar {name}");
    }
    std::fs::copy(corpus.join("mathlib_main.o"), dir.path().join("main.o")).unwrap();
    let daemon = Daemon::start_with(&["--no-speculate"]);
    let out = TempDir::new("archives-out");
    let mut differing = Vec::new();
    for (name, _) in archives {
        for cpu in ["", "--cpu-arch=AARCH64", "--cpu-arch=X86_64", "--cpu-arch=X86"] {
            for how in [format!("-L{name} main.o -lm"), format!("main.o {name}/libm.a")] {
                let args = format!("--arch=sm_90 {cpu} {how} -o {{OUT}}/out.cubin");
                let inv = Invocation::templated(&args, dir.path(), &out);
                let expected = run(&real_nvlink(), &inv, &[]);
                let actual = run(&shim(), &inv, &daemon.shim_env());
                let cmp = compare::runs(&expected, &actual);
                if !cmp.problems.is_empty() {
                    differing.push(format!("== {args} ==\n{}", cmp.problems.join("\n")));
                }
            }
        }
    }
    assert!(differing.is_empty(), "{}", differing.join("\n"));
    // Only the 6 links that read the cubin member go to nvlink: named (4), and
    // taken by -l for x86-64 (2; skipped for AARCH64 and X86).
    assert_eq!(daemon.stat("nvlink_process"), 6, "links routed to nvlink");
    assert!(daemon.stat("in_process") > 0, "no link was made in process");
}

/// `-time` into a file that is already there: nvlink appends its rows and no
/// header; the shim's file must end up the same (times masked).
#[test]
fn time_rows_are_appended_to_an_existing_file() {
    let daemon = Daemon::start_with(&["--no-speculate"]);
    let out = TempDir::new("time-existing");
    let mut results = Vec::new();
    for (program, env) in [(real_nvlink(), Vec::new()), (shim(), daemon.shim_env())] {
        let time = TempDir::new("time-file");
        let csv = time.path().join("t.csv");
        std::fs::write(&csv, "earlier rows").unwrap();
        let args =
            format!("--arch=sm_90 -time {} saxpy_ptx.o accumulate.o scale.o -o {{OUT}}/out.cubin", csv.display());
        let inv = Invocation::templated(&args, corpus::dir(), &out);
        let mut r = run(&program, &inv, &env);
        r.files.insert("t.csv".into(), std::fs::read(&csv).unwrap());
        mask_times(&mut r);
        results.push(r);
    }
    let cmp = compare::runs(&results[0], &results[1]);
    assert!(cmp.problems.is_empty(), "{}", cmp.problems.join("\n"));
    assert!(String::from_utf8_lossy(&results[0].files["t.csv"]).starts_with("earlier rowsptx , ptxas"));
    assert_eq!(daemon.stat("nvlink_process"), 0, "the link was routed to nvlink");
}

/// Objects merged by `ld -r` (made here from corpus objects): nvlink links the
/// first fatbin of each and registers every module id, each object's first in
/// load order, then the others, the last one first. Each link through the
/// daemon must be nvlink's, in process.
#[test]
fn ld_r_merged_objects_match_nvlink() {
    let corpus = corpus::dir();
    let dir = TempDir::new("merged");
    let merge = |out: &str, inputs: &[&str]| {
        let status = std::process::Command::new("ld")
            .arg("-r")
            .args(inputs.iter().map(|i| corpus.join(i)))
            .arg("-o")
            .arg(dir.path().join(out))
            .status()
            .expect("ld");
        assert!(status.success(), "ld -r {out}");
    };
    merge("acc_use.o", &["accumulate.o", "vars_use.o"]);
    merge("scale_def.o", &["scale.o", "vars_def.o"]);
    merge("tmpl_saxpy.o", &["tmpl_a.o", "tmpl_b.o", "saxpy.o"]);
    for f in ["accumulate.o", "scale.o", "vars_def.o"] {
        std::fs::copy(corpus.join(f), dir.path().join(f)).unwrap();
    }
    let daemon = Daemon::start_with(&["--no-speculate"]);
    let out = TempDir::new("merged-out");
    let mut differing = Vec::new();
    for inputs in [
        "acc_use.o scale_def.o",
        "tmpl_saxpy.o acc_use.o scale.o vars_def.o",
        "scale_def.o accumulate.o",
        "tmpl_saxpy.o",
    ] {
        let args = format!("--arch=sm_90 --register-link-binaries={{OUT}}/reg.c {inputs} -o {{OUT}}/out.cubin");
        let inv = Invocation::templated(&args, dir.path(), &out);
        let expected = run(&real_nvlink(), &inv, &[]);
        let actual = run(&shim(), &inv, &daemon.shim_env());
        assert_eq!(expected.code, 0, "{inputs}: {}", String::from_utf8_lossy(&expected.stderr));
        let cmp = compare::runs(&expected, &actual);
        if !cmp.problems.is_empty() {
            differing.push(format!("== {args} ==\n{}", cmp.problems.join("\n")));
        }
    }
    assert!(differing.is_empty(), "{}", differing.join("\n"));
    assert_eq!(daemon.stat("nvlink_process"), 0, "links were routed to nvlink");
}

/// `nvcc ARGS` in `dir`, which must succeed (the sources of the tests below).
fn nvcc(dir: &std::path::Path, args: &[&str]) {
    let out = std::process::Command::new(cuda_home().join("bin/nvcc"))
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run nvcc");
    assert!(out.status.success(), "nvcc: {}", String::from_utf8_lossy(&out.stderr));
}

/// The real nvlink's answer to `args` in `dir`, after the shim through `d`
/// gave the same answer `times` times in a row (the first computed, the
/// others from the cache): exit status, messages and every file, byte for byte.
fn nvlink_and_shim_agree(d: &Daemon, args: &str, dir: &std::path::Path, times: usize) -> nvlinkd_tests::run::Run {
    let out = TempDir::new("agree-nvlink");
    let expected = run(&real_nvlink(), &Invocation::templated(args, dir, &out), &[]);
    for _ in 0..times {
        let out = TempDir::new("agree-shim");
        let actual = run(&shim(), &Invocation::templated(args, dir, &out), &d.shim_env());
        let cmp = compare::runs(&expected, &actual);
        assert!(cmp.problems.is_empty() && cmp.identical, "{args}: {:?}", cmp.problems);
    }
    expected
}

/// `.ptx` files nvlink reads its own way: below sm_90 it compiles one and
/// links none of its code (an empty cubin, also with `-r`), and for a
/// family target (`sm_100f`) its tool note names the plain arch. Compiled
/// here with nvcc, linked through the real nvlink and the daemon, twice (the
/// second from the cache): the same answers.
#[test]
fn ptx_files_nvlink_links_its_own_way_get_nvlinks_answer() {
    let dir = TempDir::new("ptx-files");
    std::fs::write(dir.path().join("k.cu"), "__global__ void k(float *x) { x[threadIdx.x] *= 2.0f; }\n").unwrap();
    for arch in ["sm_80", "sm_86", "sm_100f"] {
        nvcc(dir.path(), &["--ptx", "-rdc=true", &format!("-arch={arch}"), "k.cu", "-o", &format!("k_{arch}.ptx")]);
    }
    let d = Daemon::start();
    for args in [
        "--arch=sm_80 k_sm_80.ptx -o {OUT}/out.cubin",
        "--arch=sm_86 k_sm_80.ptx -o {OUT}/out.cubin",
        "--arch=sm_80 -r k_sm_80.ptx -o {OUT}/out.o",
        "--arch=sm_86 k_sm_86.ptx k_sm_86.ptx -o {OUT}/out.cubin",
        "--arch=sm_100f k_sm_100f.ptx -o {OUT}/out.cubin",
    ] {
        nvlink_and_shim_agree(&d, args, dir.path(), 2);
    }
}

/// `-Werror` with an input warning (`SM Arch ('sm_100') not found in ...`):
/// nvlink's answer depends on what came before and after the warned input
/// (an error and `elfLink internal error`; the error alone, exit 255, after
/// the last input; a warning and a linked output once PTX was compiled;
/// `elfLink fatbinary error` before a .ptx file). Objects compiled here.
#[test]
fn werror_on_an_input_warning_gets_nvlinks_answer() {
    let dir = TempDir::new("werror-inputs");
    let src = "extern __device__ float scale(float); __global__ void k(float *x) { x[threadIdx.x] = scale(x[threadIdx.x]); }\n";
    std::fs::write(dir.path().join("k.cu"), src).unwrap();
    std::fs::write(dir.path().join("s.cu"), "__device__ float scale(float v) { return 2.0f * v; }\n").unwrap();
    std::fs::write(dir.path().join("h.cu"), "__global__ void h(int *p) { *p = 1; }\n").unwrap();
    for (args, out) in [
        (
            &[
                "-gencode",
                "arch=compute_75,code=sm_75",
                "-gencode",
                "arch=compute_120,code=[sm_120,compute_120]",
                "k.cu",
            ][..],
            "warned.o",
        ),
        (&["-gencode", "arch=compute_90,code=compute_90", "s.cu"][..], "ptx.o"),
        (&["-arch=sm_100", "h.cu"][..], "host.o"),
        (&["-arch=sm_100", "--ptx", "h.cu"][..], "h.ptx"),
    ] {
        let mode = if args.contains(&"--ptx") { "-rdc=true" } else { "-dc" };
        nvcc(dir.path(), &[&[mode][..], args, &["-o", out]].concat());
    }
    let d = Daemon::start();
    for args in [
        "--arch=sm_100 -Werror warned.o host.o -o {OUT}/out.cubin",
        "--arch=sm_100 -Werror warned.o -o {OUT}/out.cubin",
        "--arch=sm_100 -Werror -r warned.o -o {OUT}/out.o",
        "--arch=sm_100 -Werror ptx.o warned.o host.o -o {OUT}/out.cubin",
        "--arch=sm_100 -Werror warned.o h.ptx -o {OUT}/out.cubin",
    ] {
        let expected = nvlink_and_shim_agree(&d, args, dir.path(), 1);
        assert!(String::from_utf8_lossy(&expected.stderr).contains("not found in 'warned.o'"), "{args}: no warning");
    }
}

/// A device-only input (`.cubin`) registered from a directory whose name is
/// not ASCII: nvlink's module id replaces every byte of the path outside
/// `[A-Za-z0-9]` (`é` is two), cold and from the cache.
#[test]
fn a_device_only_input_under_a_non_ascii_path_is_registered_as_nvlink_names_it() {
    let work = TempDir::new("non-ascii");
    let dir = work.path().join("bâti-é");
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["accumulate.o", "scale.cubin"] {
        std::fs::copy(corpus::dir().join(f), dir.join(f)).unwrap();
    }
    let d = Daemon::start();
    let args = "--arch=sm_90 --register-link-binaries={OUT}/reg.c accumulate.o scale.cubin -o {OUT}/out.cubin";
    let expected = nvlink_and_shim_agree(&d, args, &dir, 2);
    assert_eq!(expected.code, 0, "{}", String::from_utf8_lossy(&expected.stderr));
}
