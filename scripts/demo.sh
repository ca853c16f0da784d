#!/usr/bin/env bash
# The main job, on a fresh machine: build nvlinkd, install the pinned toolkit,
# put an nvlinkd overlay over it, build the demo CUDA program (three units,
# device globals, dynamic parallelism; plus an LTO build) with the overlay's
# nvcc, and say what went through the daemon (which engine linked, what came
# from the cache) and that it is exactly what the real nvlink produces. First,
# on the fresh daemon, each of the demo's device links (plain and LTO) is timed
# through the real nvlink and through nvlinkd, cold and cached: a table at the
# end. Runs the program when a GPU is present.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
nvl_root=$PWD
source scripts/lib.sh
nvl_cuda=$(scripts/setup-toolkit.sh)
export CUDA_HOME=$nvl_cuda
cargo build --release --workspace --locked
nvl_bin=$nvl_root/target/release

nvl_work=$nvl_root/target/demo
rm -rf "$nvl_work"
mkdir -p "$nvl_work/build"
trap nvl_stop EXIT

echo "== an nvlinkd overlay over the toolkit in $nvl_cuda"
nvl_up

cd "$nvl_work/build"
echo "== the demo's device links, through the real nvlink and through nvlinkd (cold: nothing cached yet; then cached)"
nvl_compare sm_90

echo "== building demo/ with $nvl_work/overlay/bin/nvcc (its device links go through nvlinkd)"
nvl_build_demo sm_90

echo "== summary"
nvl_summary
echo "(the daemon's log: $nvl_log)"
echo "== device-link times"
nvl_table

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then
  echo "== running on the GPU"
  ./demo
  ./demo_lto
else
  echo "== no GPU here: built $nvl_work/build/demo and demo_lto, not running them"
fi
