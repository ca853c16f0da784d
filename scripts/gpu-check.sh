#!/usr/bin/env bash
# GPU check: build the demo program (three units, device globals, dynamic
# parallelism; plain and LTO device links) with nvcc through an nvlinkd overlay,
# run it on the GPU, and check its results against the host's (the program
# compares every value and prints RESULT: OK).
#
#   scripts/gpu-check.sh [BIN_DIR] [CUDA_HOME]
#
# BIN_DIR holds prebuilt nvlink (shim) and nvlinkd (default: target/release);
# CUDA_HOME defaults to /usr/local/cuda (the GPU machines' own toolkit). No
# Rust toolchain is needed here. The arch is taken from the GPU.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$PWD
bin=$(cd "${1:-target/release}" && pwd)
cuda=${2:-${CUDA_HOME:-/usr/local/cuda}}
[[ -x $bin/nvlinkd && -x $bin/nvlink ]] || { echo "no nvlinkd/nvlink in $bin"; exit 2; }
[[ -x $cuda/bin/nvcc ]] || { echo "no nvcc in $cuda"; exit 2; }
cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d '.[:space:]')
arch=sm_$cap
echo "GPU: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1), arch $arch"
echo "toolkit: $("$cuda/bin/nvcc" --version | tail -2 | head -1)"

work=$(mktemp -d /tmp/nvlinkd-gpu.XXXXXX)
export NVLINKD_SOCKET=$work/nvlinkd.sock NVLINKD_CACHE_DIR=$work/cache NVLINKD_FALLBACK=never
trap '"$bin/nvlinkd" stop >/dev/null 2>&1 || true; cat "$work/cache/nvlinkd.log" 2>/dev/null | tail -5' EXIT
"$bin/nvlinkd" install --cuda-home "$cuda" --prefix "$work/overlay"
"$bin/nvlinkd" start --cuda-home "$cuda"

cd "$work"
src=("$root"/demo/{main,poly,reduce}.cu)
"$work/overlay/bin/nvcc" -arch=$arch -rdc=true "${src[@]}" -o demo
"$work/overlay/bin/nvcc" -arch=$arch -rdc=true -dlto "${src[@]}" -o demo_lto
echo "daemon: $("$bin/nvlinkd" stats --json)"

# The device link through nvlinkd equals the real nvlink's.
"$cuda/bin/nvcc" -arch=$arch -dc "${src[@]}"
"$work/overlay/bin/nvlink" --arch=$arch -L"$cuda/lib64" main.o poly.o reduce.o -lcudadevrt -o via_nvlinkd.cubin
"$cuda/bin/nvlink" --arch=$arch -L"$cuda/lib64" main.o poly.o reduce.o -lcudadevrt -o via_nvlink.cubin
cmp via_nvlinkd.cubin via_nvlink.cubin && echo "device link: byte-identical to nvlink"

status=0
for p in demo demo_lto; do
  echo "== $p"
  ./$p || status=1
done
exit $status
