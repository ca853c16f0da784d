#!/usr/bin/env bash
# Benchmark nvlinkd against nvlink, side by side in one run on this machine.
#   scripts/bench.sh [REPETITIONS]
#   BIN_DIR=DIR scripts/bench.sh [REPETITIONS]
# With BIN_DIR (prebuilt nvlinkd, nvlink shim and nvlinkd-bench, for machines
# without Rust, such as the GPU machines) nothing is built and CUDA_HOME
# defaults to /usr/local/cuda; otherwise the release build runs first and the
# pinned toolkit is used.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [[ -n ${BIN_DIR:-} ]]; then
  export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} NVLINKD_REPO_ROOT=$PWD
  bench=$BIN_DIR/nvlinkd-bench
else
  CUDA_HOME=$(scripts/setup-toolkit.sh)
  export CUDA_HOME
  # BuildGrid for the shared-cache rows (r); they are skipped without it.
  bgd=$(scripts/setup-buildgrid.sh)
  if [[ -n $bgd ]]; then
    export NVLINKD_BUILDGRID=$bgd
  fi
  cargo build --release --workspace --locked
  bench=target/release/nvlinkd-bench
fi
exec "$bench" "$@"
