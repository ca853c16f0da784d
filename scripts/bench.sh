#!/usr/bin/env bash
# Benchmark nvlinkd against nvlink, side by side in one run on this machine.
#   scripts/bench.sh [REPETITIONS]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
CUDA_HOME=$(scripts/setup-toolkit.sh)
export CUDA_HOME
cargo build --release --workspace --locked
exec target/release/nvlinkd-bench "$@"
