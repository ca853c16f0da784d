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
nvl_root=$PWD
source scripts/lib.sh
nvl_bin=$(cd "${1:-target/release}" && pwd)
nvl_cuda=${2:-${CUDA_HOME:-/usr/local/cuda}}
[[ -x $nvl_bin/nvlinkd && -x $nvl_bin/nvlink ]] || { echo "no nvlinkd/nvlink in $nvl_bin"; exit 2; }
[[ -x $nvl_cuda/bin/nvcc ]] || { echo "no nvcc in $nvl_cuda"; exit 2; }
cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d '.[:space:]')
arch=sm_$cap
echo "GPU: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1), arch $arch"
echo "toolkit: $("$nvl_cuda/bin/nvcc" --version | tail -2 | head -1)"

nvl_work=$(mktemp -d /tmp/nvlinkd-gpu.XXXXXX)
trap 'nvl_stop; tail -5 "${nvl_log:-/dev/null}" 2>/dev/null' EXIT
nvl_up

cd "$nvl_work"
echo "== the demo's device links, through the real nvlink and through nvlinkd (cold: nothing cached yet; then cached)"
nvl_compare "$arch"
echo "== building demo/ with $nvl_work/overlay/bin/nvcc (its device links go through nvlinkd)"
nvl_build_demo "$arch"
nvl_summary
nvl_table

status=0
for p in demo demo_lto; do
  echo "== $p"
  ./$p || status=1
done
exit $status
