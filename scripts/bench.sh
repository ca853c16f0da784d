#!/usr/bin/env bash
# Benchmark nvlinkd against nvlink, side by side in one run on this machine.
#   scripts/bench.sh [REPETITIONS]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
CUDA_HOME=$(scripts/setup-toolkit.sh)
export CUDA_HOME
# BuildGrid for the shared-cache rows (r); they are skipped without it.
bgd=$(scripts/setup-buildgrid.sh)
if [[ -n $bgd ]]; then
  export NVLINKD_BUILDGRID=$bgd
fi
cargo build --release --workspace --locked
exec target/release/nvlinkd-bench "$@"
