#!/usr/bin/env bash
# The GPU machines' run, prepared to fit one call (they have no Rust and lend
# 15 minutes a session): the GPU check, the fresh-daemon bursts with medians of
# 5, two traced fresh bursts (the daemon's phase events and the shims'
# timings; the default pool and --jobs 4), the whole benchmark once, and the
# three-arch nvcc build. Each step has its own time limit and writes its own
# file under OUT as it goes, so a run cut short keeps what it measured.
#
#   BIN_DIR=DIR OUT=DIR scripts/device-check.sh
#
# BIN_DIR holds stripped release builds of nvlinkd, nvlinkd-nvvm, the nvlink
# shim and nvlinkd-bench (and, to skip nvcc there, nvlinkd-corpus/ as the
# bench leaves it after a run with the same CUDA_HOME path). CUDA_HOME defaults
# to /usr/local/cuda.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
bin=$(cd "${BIN_DIR:?BIN_DIR: the prebuilt binaries}" && pwd)
out=${OUT:?OUT: where the results go}
export BIN_DIR=$bin CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} NVLINKD_REPO_ROOT=$PWD

step() { # step NAME SECONDS COMMAND...
  local name=$1 secs=$2
  shift 2
  echo "== $name ($(date +%T))"
  timeout "$secs" "$@" >"$out/$name.log" 2>&1
  echo "rc=$?" >>"$out/$name.log"
  tail -3 "$out/$name.log"
}

{
  echo "cores: $(nproc)"
  nvidia-smi -L
  "$CUDA_HOME/bin/nvcc" --version | tail -2
  grep -m1 'model name' /proc/cpuinfo
  free -g | head -2
} >"$out/machine.txt" 2>&1
cat "$out/machine.txt"

# One fresh daemon (serve's extra arguments: "$@"), 16 distinct non-LTO
# links at once, traced; files named traced$TAG-*.
traced_burst() {
  local work d links=() shims=() a b c i t=traced${TAG:-}
  work=$(dirname "$(find "$bin/nvlinkd-corpus" -name workload.done | head -1)")
  d=$(mktemp -d /tmp/nvlinkd-traced.XXXXXX)
  for a in 1 2 3 4 5; do for b in $(seq $((a + 1)) 5); do
    links+=("tu$a.o tu$b.o")
    for c in $(seq $((b + 1)) 5); do links+=("tu$a.o tu$b.o tu$c.o"); done
  done; done
  NVLINKD_LOG=debug "$bin/nvlinkd" serve --socket "$d/s" --cache-dir "$d/c" --cuda-home "$CUDA_HOME" "$@" 2>"$out/$t-daemon.log" &
  local t0 pid=$!
  t0=$(date +%s.%N)
  while [[ ! -S $d/s ]]; do sleep 0.005; done
  echo "socket after $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { print b - a }') s"
  "$bin/nvlinkd" events --json --socket "$d/s" >"$out/$t-events.jsonl" 2>&1 &
  sleep 0.05
  t0=$(date +%s.%N)
  for i in $(seq 0 15); do
    # shellcheck disable=SC2086 # the link's objects, one word each
    (cd "$work" && NVLINKD_SOCKET=$d/s NVLINKD_FALLBACK=never NVLINKD_TIMING=1 \
      "$bin/nvlink" --arch=sm_90 -L"$CUDA_HOME/lib64" ${links[$i]} transforms.o -lcudadevrt -o "$d/b$i.cubin" 2>"$out/$t-shim-$i.log") &
    shims+=($!)
  done
  wait "${shims[@]}"
  echo "burst of 16 after start: $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { print b - a }') s"
  "$bin/nvlinkd" stats --json --socket "$d/s" >"$out/$t-stats.json" 2>&1
  "$bin/nvlinkd" stop --socket "$d/s" >/dev/null 2>&1
  kill $pid 2>/dev/null
  wait
  rm -rf "$d"
}

step gpu-check 100 scripts/gpu-check.sh "$bin" "$CUDA_HOME"
step fresh 80 env NVLINKD_BENCH_ONLY=fresh scripts/bench.sh 5
export bin out
export -f traced_burst
step traced 20 bash -c traced_burst
step traced-jobs4 20 env TAG=-jobs4 bash -c 'traced_burst --jobs 4'
step bench 260 env NVLINKD_BENCH_DROP_CACHES=1 scripts/bench.sh 1
step multiarch 110 scripts/bench-multiarch.sh "80 90 100" 1
echo "== done ($(date +%T))"
