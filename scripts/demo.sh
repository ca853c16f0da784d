#!/usr/bin/env bash
# The main job, on a fresh machine: build nvlinkd, install the pinned toolkit,
# put an nvlinkd overlay over it, build the demo CUDA program (three units,
# device globals, dynamic parallelism; plus an LTO build) with the overlay's
# nvcc, and show that its device links went through the daemon and produced
# exactly what the real nvlink produces. Runs the program when a GPU is present.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$PWD
CUDA_HOME=$(scripts/setup-toolkit.sh)
export CUDA_HOME
cargo build --release --workspace --locked
bin=$root/target/release

work=$root/target/demo
rm -rf "$work"
mkdir -p "$work/build"
export NVLINKD_SOCKET=$work/nvlinkd.sock NVLINKD_CACHE_DIR=$work/cache NVLINKD_FALLBACK=never
trap '"$bin/nvlinkd" stop >/dev/null 2>&1 || true' EXIT

echo "== nvlinkd overlay over $CUDA_HOME"
"$bin/nvlinkd" install --cuda-home "$CUDA_HOME" --prefix "$work/overlay"
"$bin/nvlinkd" start --cuda-home "$CUDA_HOME"

echo "== building demo/ with $work/overlay/bin/nvcc (device link through nvlinkd)"
cd "$work/build"
"$work/overlay/bin/nvcc" -arch=sm_90 -rdc=true "$root"/demo/{main,poly,reduce}.cu -o demo
"$work/overlay/bin/nvcc" -arch=sm_90 -rdc=true -dlto "$root"/demo/{main,poly,reduce}.cu -o demo_lto

echo "== the same device link, through nvlinkd and through the real nvlink"
"$CUDA_HOME/bin/nvcc" -arch=sm_90 -dc "$root"/demo/{main,poly,reduce}.cu
"$work/overlay/bin/nvlink" --arch=sm_90 -L"$CUDA_HOME/lib" main.o poly.o reduce.o -lcudadevrt -o via_nvlinkd.cubin
"$CUDA_HOME/bin/nvlink" --arch=sm_90 -L"$CUDA_HOME/lib" main.o poly.o reduce.o -lcudadevrt -o via_nvlink.cubin
if cmp -s via_nvlinkd.cubin via_nvlink.cubin; then
  echo "device-link output: byte-identical to nvlink ($(stat -c %s via_nvlink.cubin) bytes)"
else
  echo "device-link output DIFFERS from nvlink"; exit 1
fi

echo "== nvlinkd stats"
"$bin/nvlinkd" stats --json
echo

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then
  echo "== running on the GPU"
  ./demo
  ./demo_lto
else
  echo "== no GPU here: built $work/build/demo and demo_lto, not running them"
fi
