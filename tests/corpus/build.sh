#!/usr/bin/env bash
# Build the test corpus with the real nvcc: build.sh OUTDIR (CUDA_HOME must be set).
# Every object the parity cases link is made here, once per test run.
set -euo pipefail
out=$1
src=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
nvcc="$CUDA_HOME/bin/nvcc"
mkdir -p "$out"
cd "$out"
cp "$src"/*.cu "$src"/*.cpp .

dc() { "$nvcc" -arch=sm_90 -dc "$@"; }

# Relocatable objects for sm_90 (the default target of the cases).
for f in accumulate scale vars_def vars_use cdp tmpl_a tmpl_b mathlib_main saxpy missing shared_mix; do
  dc "$f.cu" -o "$f.o" &
done
dc mathlib_1.cu -o mathlib_1.o &
dc mathlib_2.cu -o mathlib_2.o &
mkdir -p dup && dc scale_dup.cu -o dup/scale.o &
wait

# A static library of relocatable objects.
mkdir -p lib && ar rcs lib/libdevmath.a mathlib_1.o mathlib_2.o

# PTX only (compiled by nvlink at link time), two real archs, LTO IR.
"$nvcc" -gencode arch=compute_90,code=compute_90 -dc saxpy.cu -o saxpy_ptx.o &
"$nvcc" -gencode arch=compute_80,code=compute_80 -dc saxpy.cu -o saxpy_ptx80.o &
"$nvcc" -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 -dc saxpy.cu -o saxpy_2arch.o &
"$nvcc" -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 -dc scale.cu -o scale_2arch.o &
"$nvcc" -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 -dc accumulate.cu -o accumulate_2arch.o &
for f in accumulate scale cdp saxpy cdp_dead cdp_multi; do
  "$nvcc" -arch=sm_90 -dc -dlto "$f.cu" -o "${f}_lto.o" &
done
wait

# What real builds pass (CMake, nvcc multi-arch): cross-unit calls of looping
# device functions, a live kernel + a dead kernel + device variables, libcu++
# CUB and Thrust units; LTO IR for sm_80, sm_90 and sm_100 in one object (nvcc
# `-gencode arch=compute_XY,code=lto_XY`), SASS for the same three archs; a
# host-only C++ object (g++ -c, as CMake compiles .cpp files); a static device
# library of multi-arch objects.
lto3="-gencode arch=compute_80,code=lto_80 -gencode arch=compute_90,code=lto_90 -gencode arch=compute_100,code=lto_100"
sass3="-gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 -gencode arch=compute_100,code=sm_100"
for f in xcall_main xcall_loop livedead libcxx; do
  "$nvcc" -arch=sm_90 -dc -dlto "$f.cu" -o "${f}_lto.o" &
  "$nvcc" $lto3 -dc "$f.cu" -o "${f}_lto3.o" &
  "$nvcc" $sass3 -dc "$f.cu" -o "${f}_3arch.o" &
  wait
done
"$nvcc" -arch=sm_90 -dc -dlto warp_cub.cu -o warp_cub_lto.o &
# CUB's flagged selection beside a cross-unit device function: NVVM's code for
# it shows state an earlier compile left in the process (workers.rs).
"$nvcc" -arch=sm_90 -dc -dlto select_flagged.cu -o select_flagged_lto.o &
"$nvcc" -arch=sm_90 -dc -dlto select_xform.cu -o select_xform_lto.o &
"$nvcc" -gencode arch=compute_90,code=lto_90 -dc cdp_dead.cu -o cdp_dead_lto90.o &
"$nvcc" -gencode arch=compute_90,code=lto_90 -dc cdp_multi.cu -o cdp_multi_lto90.o &
# LTO IR alone in other styles (host-referenced variables, internal kernels, printf, malloc).
"$nvcc" -gencode arch=compute_90,code=lto_90 -dc lto_styles.cu -o lto_styles_lto90.o &
# LTO units without a kernel (NVVM leaves such a program relocatable) and with
# kernels the host does not launch.
"$nvcc" -gencode arch=compute_90,code=lto_90 -dc vars_def.cu -o vars_def_lto90.o &
"$nvcc" -gencode arch=compute_90,code=lto_90 -dc unlaunched.cu -o unlaunched_lto90.o &
"$nvcc" -gencode arch=compute_90,code=lto_90 -dc static_launch.cu -o static_launch_lto90.o &
"$nvcc" -gencode arch=compute_90,code=lto_90 -dc host_var.cu -o host_var_lto90.o &
"$nvcc" -gencode arch=compute_90,code=lto_90 -dc cdp_hostvar.cu -o cdp_hostvar_lto90.o &
# More partial LTO for libcudadevrt alone: a kernel kept only by a device-side
# launch, one launched by both, host references to variables alone, none at
# all, variables defined in another unit.
for f in cdp_launched cdp_hostvar_both cdp_hostvar_nolaunch cdp_nohost cdp_vars_def cdp_vars_use; do
  "$nvcc" -gencode arch=compute_90,code=lto_90 -dc $f.cu -o ${f}_lto90.o &
done
"$nvcc" -arch=sm_90 -dc -dlto cdp_hostvar_both.cu -o cdp_hostvar_both_lto.o &
"$nvcc" -gencode arch=compute_90,code=lto_90 -dc lto_styles2.cu -o lto_styles2_lto90.o &
"$nvcc" -arch=sm_90 -dc -dlto lto_styles.cu -o lto_styles_lto.o &
"$nvcc" -arch=sm_90 -dc -dlto lto_styles2.cu -o lto_styles2_lto.o &
"$nvcc" -arch=sm_90 -dc -dlto thrust_seq.cu -o thrust_seq_lto.o &
"$nvcc" -arch=sm_90 -dc thrust_seq.cu -o thrust_seq.o &
"$nvcc" -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 -dc warp_cub.cu -o warp_cub_2arch.o &
g++ -c host_main.cpp -o host_main.cpp.o &
wait
mkdir -p lib && ar rcs lib/libxcall.a xcall_loop_3arch.o && ar rcs lib/libxcall_lto.a xcall_loop_lto3.o

# Blackwell and suffixed targets (Mercury cubins, `a` and `f` SASS members):
# sm_100 + sm_100a + sm_90a SASS; family SASS sm_100f + sm_120f with compute_100
# PTX; LTO IR for sm_100.
bw="-gencode arch=compute_100,code=sm_100 -gencode arch=compute_100a,code=sm_100a -gencode arch=compute_90a,code=sm_90a"
fam="-gencode arch=compute_100f,code=sm_100f -gencode arch=compute_120f,code=sm_120f -gencode arch=compute_100,code=compute_100"
for f in accumulate scale; do
  "$nvcc" $bw -dc "$f.cu" -o "${f}_bw.o" &
  "$nvcc" $fam -dc "$f.cu" -o "${f}_fam.o" &
  "$nvcc" -arch=sm_100 -dc -dlto "$f.cu" -o "${f}_lto100.o" &
done
wait

# Device debug information (nvcc -G): debug links pass -g to nvlink.
for f in accumulate scale cdp; do
  "$nvcc" -arch=sm_90 -G -dc "$f.cu" -o "${f}_G.o" &
done
wait

# Dynamic shared memory (`extern __shared__`) in the samples' styles, beside
# libcudadevrt: plain, line info, two archs, PTX only (nvcc -arch=compute_90),
# an archive; dynamic parallelism whose child sizes its shared memory at launch.
# Kernels no host code launches in objects with line or debug information.
dc dynsmem.cu -o dynsmem.o &
dc -lineinfo dynsmem.cu -o dynsmem_li.o &
"$nvcc" -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 -dc dynsmem.cu -o dynsmem_2arch.o &
"$nvcc" -arch=compute_90 -dc dynsmem.cu -o dynsmem_ptx.o &
dc cdp_dynsmem.cu -o cdp_dynsmem.o &
dc -G cdp_dynsmem.cu -o cdp_dynsmem_G.o &
dc -lineinfo lineinfo_dead.cu -o lineinfo_dead_li.o &
dc -G lineinfo_dead.cu -o lineinfo_dead_G.o &
"$nvcc" -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 -lineinfo -dc lineinfo_dead.cu -o lineinfo_dead_li2arch.o &
# A weak device function in several units beside an unlaunched kernel; LTO
# with a cross-unit call of an inline (__forceinline__) function.
for f in weak_dead_a weak_dead_b weak_dead_c; do dc $f.cu -o $f.o & done
# PTX only (nvcc -arch=compute_XY): dynamic parallelism and an undefined call,
# whose device-runtime needs show only once the PTX is compiled at link time.
"$nvcc" -arch=compute_90 -dc cdp.cu -o cdp_ptx.o &
"$nvcc" -arch=compute_90 -dc missing.cu -o missing_ptx.o &
"$nvcc" -gencode arch=compute_80,code=compute_80 -dc jit_lookup.cu -o jit_lookup_ptx80.o &
dc jit_lookup_use.cu -o jit_lookup_use.o &
for f in lto_inline_a lto_inline_b lto_inline_c; do dc -dlto $f.cu -o $f.o & done
wait
# A unit whose kernels no host code launches beside a counter, dynamic shared
# memory and a weak template kernel: plain, line information, device debug
# information, and in archives.
for f in diag_app diag_kernels; do
  dc $f.cu -o $f.o &
  dc -lineinfo $f.cu -o ${f}_li.o &
  dc -G $f.cu -o ${f}_G.o &
done
wait
mkdir -p lib && ar rcs lib/libdynsmem.a dynsmem.o && ar rcs lib/liblinedead.a lineinfo_dead_li.o
ar rcs lib/libdiag.a diag_kernels.o && ar rcs lib/libdiag_li.a diag_kernels_li.o

# nvlink -r outputs as inputs (relocatable cubins, made with the real nvlink):
# they hold the linker's references (__UFT*, .nv.reservedSmem.*) as global
# symbols where nvcc's cubins hold them weak. A device function alone, named
# .cubin and .o; two units; a kernel calling into another -r output; dynamic
# parallelism; dynamic shared memory; variables defined elsewhere. A variable
# libcudadevrt defines, read by a kernel; an archive after libcudadevrt.
rel() { "$CUDA_HOME/bin/nvlink" -m64 --arch=sm_90 -cpu-arch=X86_64 -r "$@"; }
dc jit_lookup.cu -o jit_lookup.o &
dc runtime_var.cu -o runtime_var.o &
wait
rel jit_lookup.o -o relin_lookup.cubin &
rel jit_lookup.o -o relin_lookup.o &
rel accumulate.o scale.o -o relin_accscale.cubin &
rel jit_lookup_use.o -o relin_use.cubin &
rel cdp.o -o relin_cdp.cubin &
rel dynsmem.o -o relin_dynsmem.cubin &
rel cdp_dynsmem.o -o relin_cdp_dynsmem.cubin &
rel vars_use.o -o relin_vars_use.cubin &
wait
ar rcs lib/libvarsdef.a vars_def.o

# Recursion (nvlink's "Stack size for entry function ... cannot be statically
# determined"): in one unit, mutual, across two units, reached only from a
# kernel no host code launches; sm_80+sm_90 SASS, PTX only (compiled by
# nvlink's embedded ptxas), LTO IR; the recursive units in an archive.
for f in recursion recursion_eval recursion_xa recursion_xb recursion_dead; do dc $f.cu -o $f.o & done
"$nvcc" -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 -dc recursion.cu -o recursion_2arch.o &
"$nvcc" -arch=compute_90 -dc recursion.cu -o recursion_ptx.o &
dc -dlto recursion.cu -o recursion_lto.o &
dc -dlto recursion_xa.cu -o recursion_xa_lto.o &
dc -G recursion.cu -o recursion_G.o &
wait
mkdir -p lib && ar rcs lib/librecursion.a recursion_eval.o recursion_xb.o

# Device-only inputs: cubins (sm_90, sm_100, arch-specific sm_90a) and a PTX file.
"$nvcc" -arch=sm_90 -dc -cubin scale.cu -o scale.cubin &
"$nvcc" -arch=sm_100 -dc -cubin scale.cu -o scale_sm100.cubin &
"$nvcc" -arch=sm_90a -dc -cubin scale.cu -o scale_sm90a.cubin &
"$nvcc" -arch=sm_90 -dc -ptx saxpy.cu -o saxpy.ptx &
wait

# Not an object at all.
echo "this is not an object file, just some text for nvlink to choke on" > notes.txt
cp notes.txt notes.o
printf 'hello\n' > tiny.o
: > empty.o
mkdir -p adir.o

# Damaged objects: truncated, and a host object whose fatbin payload is corrupted.
head -c 3000 accumulate.o > truncated.o
# Damaged archives nvlink refuses (`object` reads them): the symbol table cut
# short, its size past the end, BSD-style member names without GNU's '/'. In
# their own directory: lib/ has a recompiled twin.
mkdir -p badar && head -c 100 lib/libdevmath.a > badar/libdevmath_cut.a
python3 - <<'PY'
import re
data = open("lib/libdevmath.a", "rb").read()
sized = bytearray(data)
sized[56:66] = b"99999999  "
open("badar/libdevmath_symsize.a", "wb").write(sized)
open("badar/libdevmath_bsd.a", "wb").write(re.sub(rb"(mathlib_\d\.o)/", rb"\1 ", data))
PY
python3 - <<'PY'
data = bytearray(open("accumulate.o", "rb").read())
# Flip bytes in the middle of the compressed device code (after the fatbin headers).
at = data.find(b"\x28\xb5\x2f\xfd")
for i in range(at + 64, at + 96):
    data[i] ^= 0x5a
open("corrupt_fatbin.o", "wb").write(data)
open("random.o", "wb").write(bytes((i * 7919 + 13) % 251 for i in range(4096)))
PY

# Odd but valid inputs: a cubin named .o, an object without extension or named
# .so, a fatbin file, a non-rdc object, a host-only object, two objects merged
# by ld -r, an uncompressed fatbin, a too-small library.
cp scale.cubin scale_cubin.o
cp accumulate.o accumulate_noext
cp accumulate.o accumulate.so
"$nvcc" -arch=sm_90 -dc -fatbin saxpy.cu -o saxpy.fatbin
"$nvcc" -arch=sm_90 -c saxpy.cu -o saxpy_nonrdc.o
printf 'int host_only(int x) { return x + 1; }\n' > host_only.c && gcc -c host_only.c -o host_only.o
ld -r accumulate.o vars_use.o -o merged_r.o
"$nvcc" -arch=sm_90 -dc -Xfatbin -compress-all scale.cu -o scale_compress_all.o
"$nvcc" -arch=sm_90 -dc -Xfatbin -compress-mode=none vars_def.cu -o vars_def_nocompress.o
mkdir -p tinylib && printf 'hi\n' > tinylib/libtiny.a

# A second compilation of the same sources, in the same place (as an incremental
# build recompiles an unchanged unit): the objects differ only in the name of
# nvcc's temporary file. tests/tests/parity.rs proves the cache keys on these.
# The objects the parity cases use most and the static libraries, not the slow
# CUB/Thrust units; cubins and PTX files are not recompiled (they stay shared).
mkdir -p twin/lib
for f in accumulate scale vars_def vars_use cdp tmpl_a tmpl_b mathlib_main saxpy missing shared_mix mathlib_1 mathlib_2; do
  dc "$f.cu" -o "twin/$f.o" &
done
"$nvcc" -gencode arch=compute_90,code=compute_90 -dc saxpy.cu -o twin/saxpy_ptx.o &
"$nvcc" -gencode arch=compute_80,code=compute_80 -dc saxpy.cu -o twin/saxpy_ptx80.o &
wait
for f in saxpy scale accumulate; do
  "$nvcc" -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 -dc $f.cu -o "twin/${f}_2arch.o" &
done
for f in accumulate scale cdp saxpy xcall_main xcall_loop livedead libcxx; do
  "$nvcc" -arch=sm_90 -dc -dlto "$f.cu" -o "twin/${f}_lto.o" &
done
wait
for f in xcall_main livedead libcxx; do
  "$nvcc" $sass3 -dc "$f.cu" -o "twin/${f}_3arch.o" &
done
for f in xcall_main xcall_loop; do
  "$nvcc" $lto3 -dc $f.cu -o twin/${f}_lto3.o &
done
"$nvcc" $sass3 -dc xcall_loop.cu -o twin/xcall_loop_3arch.o &
for f in accumulate scale cdp; do
  "$nvcc" -arch=sm_90 -G -dc "$f.cu" -o "twin/${f}_G.o" &
done
wait
cp twin/accumulate.o twin/accumulate_noext
cp twin/accumulate.o twin/accumulate.so
ld -r twin/accumulate.o twin/vars_use.o -o twin/merged_r.o
(cd twin && ar rcs lib/libdevmath.a mathlib_1.o mathlib_2.o && ar rcs lib/libxcall.a xcall_loop_3arch.o &&
  ar rcs lib/libxcall_lto.a xcall_loop_lto3.o)

# Options files.
printf -- '--arch=sm_90\naccumulate.o "scale.o"\n' > link.opts
printf -- '-L lib\n-ldevmath\n' > lib.opts
# Options files nested 15 deep (nvlink's limit) and 16 deep, and one that includes itself.
for i in $(seq 1 16); do printf -- '-optf nest%d.opts\n' $((i + 1)) > nest$i.opts; done
printf -- '--arch=sm_90\n' > nest16.opts
for i in $(seq 1 14); do printf -- '-optf nest15_%d.opts\n' $((i + 1)) > nest15_$i.opts; done
printf -- '--arch=sm_90\n' > nest15_15.opts
printf -- '-optf self.opts\n' > self.opts

touch corpus.done
