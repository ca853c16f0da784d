#!/usr/bin/env bash
# Run the whole test suite on a fresh machine: installs the pinned toolkit
# (once), builds the workspace, runs unit and integration tests against the
# real nvcc/nvlink. The parity test prints its table (--nocapture).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
CUDA_HOME=$(scripts/setup-toolkit.sh)
export CUDA_HOME
cargo build --workspace --locked
cargo test --workspace --locked -- --nocapture
