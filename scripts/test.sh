#!/usr/bin/env bash
# Run the whole test suite on a fresh machine: installs the pinned toolkit
# (once), checks formatting and lints, builds the workspace, runs unit and
# integration tests against the real nvcc/nvlink, and ends with one summary:
# the parity table and `N passed, N failed`.
#
#   scripts/test.sh [cargo test filter args...]
#
# NVLINKD_SKIP_LINT=1 skips `cargo fmt --check`, clippy, rustdoc and shellcheck (local iteration).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
CUDA_HOME=$(scripts/setup-toolkit.sh)
export CUDA_HOME
# The validators of deploy/ (tests/tests/deploy.rs): where they cannot be
# installed (offline), those tests say so and skip.
scripts/setup-validators.sh >/dev/null || echo "test.sh: deploy/ validators not installed; their checks will skip" >&2
# BuildGrid, the REAPI server of the shared-cache tests (tests/tests/reapi.rs);
# nothing printed (offline, no Python 3.13): those tests skip with a message.
bgd=$(scripts/setup-buildgrid.sh)
if [[ -n $bgd ]]; then
  export NVLINKD_BUILDGRID=$bgd
fi

step() { printf '\n== %s\n' "$*" >&2; }

if [[ ${NVLINKD_SKIP_LINT:-0} != 1 ]]; then
  step "cargo fmt --check"
  cargo fmt --all --check
  step "cargo clippy --workspace --all-targets -- -D warnings"
  cargo clippy --workspace --all-targets --locked --quiet -- -D warnings
  step "cargo doc (maintainers' docs, warnings denied)"
  RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --workspace --document-private-items --locked --quiet
  if command -v shellcheck >/dev/null; then
    step "shellcheck (warnings and errors)"
    shellcheck -S warning scripts/*.sh .ci/run tests/corpus/build.sh
  fi
  step "docs for their readers: README.md within 300 lines, ARCHITECTURE.md within 400"
  for limit in README.md:300 ARCHITECTURE.md:400; do
    file=${limit%:*} max=${limit#*:} lines=$(wc -l <"${limit%:*}")
    if ((lines > max)); then
      echo "$file has $lines lines (at most $max: depth belongs in docs/)" >&2
      exit 1
    fi
  done
fi

step "cargo build --workspace"
cargo build --workspace --locked

step "cargo test --workspace (unit tests, then integration tests against the real toolkit)"
mkdir -p target
log=target/test.log
set +e
# --no-fail-fast: one failing test binary does not hide the others' results.
cargo test --workspace --locked --no-fail-fast -- --nocapture "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
set -e

# One summary at the end: the parity table (printed by tests/tests/parity.rs),
# the generated programs' line (tests/tests/generated.rs)
# and the totals over every test binary.
echo
echo "================================ summary ================================"
sed -n '/^parity with nvlink/,/^daemon: .* served from the cache/p' "$log"
grep '^generated:' "$log" || true
awk '/^test result:/ {
       for (i = 1; i <= NF; i++) {
         if ($(i) ~ /^passed;?$/) p += $(i-1)
         if ($(i) ~ /^failed;?$/) f += $(i-1)
         if ($(i) ~ /^ignored;?$/) s += $(i-1)
       }
     }
     END { printf "tests: %d passed, %d failed, %d skipped\n", p, f, s }' "$log"
if [[ $rc -ne 0 ]]; then
  echo "FAILED (cargo test exit status $rc); failing tests:"
  grep -E '^test .* FAILED$|^    [a-z_:]+$' "$log" | sort -u || true
fi
exit "$rc"
