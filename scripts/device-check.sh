#!/usr/bin/env bash
# The GPU machines' run, prepared to fit one call (they have no Rust and lend
# 15 minutes a session). Each step has its own time limit and writes its own
# file under OUT as it goes, so a run cut short keeps what it measured:
#   gpu-check      the demo built through an overlay and run on the GPU (CUDA_HOME);
#   fresh, burst   the bench's (g) and (h) rows, medians of 5, and (e) (BURST_CUDA_HOME);
#   traced*        one fresh daemon's burst of 16 links with its phase events and
#                  the shims' timings, with the default pool, with --jobs 4, and
#                  on a warm daemon (new links of objects it has linked before);
#   multiarch      the three-arch nvcc -dlto build (CUDA_HOME; MULTIARCH=0 skips it);
#   bench          the whole bench once, when FULL=1 (CUDA_HOME).
#
#   BIN_DIR=DIR OUT=DIR [CUDA_HOME=DIR] [BURST_CUDA_HOME=DIR] scripts/device-check.sh
#
# BIN_DIR holds stripped release builds of nvlinkd, nvlinkd-nvvm, the nvlink
# shim and nvlinkd-bench; the bench's compiled workload is taken from
# BIN_DIR/nvlinkd-corpus where a run with the same toolkit path left it, and
# built with that toolkit's nvcc otherwise. CUDA_HOME defaults to
# /usr/local/cuda (the machines' own 13.0, whose links nvlinkd leaves to its
# nvlink); BURST_CUDA_HOME, a release the in-process engine links, to CUDA_HOME.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
bin=$(cd "${BIN_DIR:?BIN_DIR: the prebuilt binaries}" && pwd)
out=${OUT:?OUT: where the results go}
cuda=${CUDA_HOME:-/usr/local/cuda}
burst=${BURST_CUDA_HOME:-$cuda}
export BIN_DIR=$bin NVLINKD_REPO_ROOT=$PWD

step() { # step NAME SECONDS COMMAND...
  local name=$1 secs=$2
  shift 2
  echo "== $name ($(date +%T))"
  timeout "$secs" "$@" >"$out/$name.log" 2>&1
  echo "rc=$?" >>"$out/$name.log"
  tail -4 "$out/$name.log"
}

{
  echo "cores: $(nproc)"
  nvidia-smi -L
  "$cuda/bin/nvcc" --version | tail -2
  "$burst/bin/nvlink" --version | tail -2
  grep -m1 'model name' /proc/cpuinfo
  free -g | head -2
} >"$out/machine.txt" 2>&1
cat "$out/machine.txt"

# One fresh daemon (serve's extra arguments: "$@"), 16 distinct non-LTO
# links at once, traced; files named traced$TAG-*. With WARM=1 the daemon
# first links four other sets of the same objects one after another, and
# the burst starts once they have settled (a warm daemon's new links).
traced_burst() {
  local work d lib links=() shims=() a b c i t=traced${TAG:-}
  work=$(dirname "$(find "$bin/nvlinkd-corpus" -name workload.done | head -1)")
  lib=$CUDA_HOME/lib64
  [[ -f $lib/libcudadevrt.a ]] || lib=$CUDA_HOME/lib
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
  if [[ ${WARM:-0} == 1 ]]; then
    for i in 16 17 18 19; do
      # shellcheck disable=SC2086 # the link's objects, one word each
      (cd "$work" && NVLINKD_SOCKET=$d/s NVLINKD_FALLBACK=never \
        "$bin/nvlink" --arch=sm_90 -L"$lib" ${links[$i]} transforms.o -lcudadevrt -o "$d/w$i.cubin")
    done
    sleep 2.5
  fi
  "$bin/nvlinkd" events --json --socket "$d/s" >"$out/$t-events.jsonl" 2>&1 &
  sleep 0.05
  t0=$(date +%s.%N)
  for i in $(seq 0 15); do
    # shellcheck disable=SC2086 # the link's objects, one word each
    (cd "$work" && NVLINKD_SOCKET=$d/s NVLINKD_FALLBACK=never NVLINKD_TIMING=1 \
      "$bin/nvlink" --arch=sm_90 -L"$lib" ${links[$i]} transforms.o -lcudadevrt -o "$d/b$i.cubin" 2>"$out/$t-shim-$i.log") &
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
export bin out
export -f traced_burst

step gpu-check 100 scripts/gpu-check.sh "$bin" "$cuda"
step fresh 70 env CUDA_HOME="$burst" NVLINKD_BENCH_ONLY=fresh scripts/bench.sh 5
step burst 30 env CUDA_HOME="$burst" NVLINKD_BENCH_ONLY=burst scripts/bench.sh 5
step traced 15 env CUDA_HOME="$burst" bash -c traced_burst
step traced-jobs4 15 env CUDA_HOME="$burst" TAG=-jobs4 bash -c 'traced_burst --jobs 4'
step traced-warm 20 env CUDA_HOME="$burst" TAG=-warm WARM=1 bash -c traced_burst
if [[ ${MULTIARCH:-1} == 1 ]]; then
  step multiarch 150 env CUDA_HOME="$cuda" scripts/bench-multiarch.sh "80 90 100" 1
fi
if [[ ${FULL:-0} == 1 ]]; then
  step bench 300 env CUDA_HOME="$cuda" NVLINKD_BENCH_DROP_CACHES=1 scripts/bench.sh 1
fi
echo "== done ($(date +%T))"
