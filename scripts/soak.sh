#!/usr/bin/env bash
# Soak the generated corpus (tests/tests/generated.rs, tests/src/gen.rs): N
# programs from seed NVLINKD_GEN_SEED_BASE on (default 1000, past the CI
# seeds), each compiled with the real nvcc and linked through the real nvlink
# and through the shim + a test daemon; prints the one-line summary and a
# repro line per differing link, and keeps the sources of those programs in
# NVLINKD_GEN_KEEP (default target/soak-mismatches/<seed>/).
#   scripts/soak.sh N [release|debug]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
n=${1:?usage: scripts/soak.sh N [release|debug]}
profile=${2:-release}
case $profile in
  release) flags=(--release) ;;
  debug) flags=() ;;
  *) echo "soak: profile is release or debug, not $profile" >&2; exit 2 ;;
esac
target=${CARGO_TARGET_DIR:-$PWD/target}
export NVLINKD_GEN_PROGRAMS=$n
export NVLINKD_GEN_KEEP=${NVLINKD_GEN_KEEP:-$target/soak-mismatches}
cargo build "${flags[@]}" -p nvlinkd-server -p nvlinkd-client
log=$target/soak.log
status=0
cargo test "${flags[@]}" -p nvlinkd-tests --test generated -- --nocapture >"$log" 2>&1 || status=$?
grep -E '^(== seed|NVLINKD_GEN_SEEDS=)' "$log" || true
if ! grep '^generated:' "$log"; then
  tail -20 "$log"
  echo "soak: no summary (see $log)" >&2
fi
exit "$status"
