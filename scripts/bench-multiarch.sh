#!/usr/bin/env bash
# Multi-arch device link benchmark, issue 12 item 1: nvcc -dlto -dlink with one
# -gencode per arch over the CUB workload (tests/bench/), through an overlay
# whose bin/nvlink is the real nvlink (plain) or the shim (a fresh nvlinkd,
# which links the other archs speculatively while nvcc's first call runs).
# Both runs use the same overlay paths, so their outputs must be byte-identical.
#
#   scripts/bench-multiarch.sh [ARCHS] [REPS]     e.g. "80 90 100" 1
#   OBJECTS=twin scripts/bench-multiarch.sh 90    one arch, linked in process: cold LTO
#
# BIN_DIR (default target/release) holds nvlinkd (and nvlinkd-nvvm) and the nvlink shim; CUDA_HOME
# defaults to the project's toolkit, else /usr/local/cuda. No Rust toolchain is
# needed, so it runs on a machine with more cores than CI's (the GPU machines).
# Prints one row per repetition and the median ratio (plain / nvlinkd).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
archs=${1:-"80 90"}
reps=${2:-1}
bin=$(cd "${BIN_DIR:-$here/target/release}" && pwd)
if [[ -z ${CUDA_HOME:-} ]]; then
  if [[ -x $here/.toolkit/cuda-13.5.37/bin/nvcc ]]; then CUDA_HOME=$here/.toolkit/cuda-13.5.37; else CUDA_HOME=/usr/local/cuda; fi
fi
[[ -x $bin/nvlinkd && -x $bin/nvlink ]] || { echo "bench-multiarch: no nvlinkd/nvlink in $bin" >&2; exit 2; }
[[ -x $CUDA_HOME/bin/nvcc ]] || { echo "bench-multiarch: no nvcc in $CUDA_HOME" >&2; exit 2; }

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.3f", b - a }'; }

work=$(mktemp -d /tmp/nvlinkd-multiarch.XXXXXX)
# shellcheck disable=SC2154 # $s is the trap's own loop variable
trap 'for s in "$work"/daemon*/nvlinkd.sock; do "$bin/nvlinkd" stop --socket "$s" >/dev/null 2>&1 || true; done; rm -rf "$work"' EXIT
cd "$work"
cp "$here"/tests/bench/*.cu .

# OBJECTS=lto (default): objects with LTO IR alone (code=lto_XY, what
# `nvcc -dlto` builds make); OBJECTS=twin: each arch's LTO IR with its PTX
# (code=[compute_XY,lto_XY], what `-arch=sm_XY -dlto` makes), which nvlinkd
# links in process.
gencode=()
for a in $archs; do
  case ${OBJECTS:-lto} in
    twin) gencode+=(-gencode "arch=compute_$a,code=[compute_$a,lto_$a]") ;;
    *) gencode+=(-gencode "arch=compute_$a,code=lto_$a") ;;
  esac
done
dlink_gencode=()
for a in $archs; do dlink_gencode+=(-gencode "arch=compute_$a,code=sm_$a"); done
units=(tu1 tu2 tu3 tu4 tu5 transforms)

echo "toolkit: $("$CUDA_HOME/bin/nvcc" --version | tail -2 | head -1); archs: $archs; objects: ${OBJECTS:-lto}; cores: $(nproc)"
echo "compiling ${#units[@]} units for ${archs// /,} (LTO IR) ..."
t0=$(now)
for u in "${units[@]}"; do
  while [[ $(jobs -rp | wc -l) -ge $(nproc) ]]; do wait -n; done
  "$CUDA_HOME/bin/nvcc" "${gencode[@]}" -dc "$u.cu" -o "$u.o" &
done
wait
echo "compiled in $(elapsed "$t0") s"

"$bin/nvlinkd" install --cuda-home "$CUDA_HOME" --prefix "$work/overlay" >/dev/null
shim=$work/overlay/bin/nvlink.shim
mv "$work/overlay/bin/nvlink" "$shim"
use_nvlink() { rm -f "$work/overlay/bin/nvlink"; ln -s "$1" "$work/overlay/bin/nvlink"; }
objs=()
for u in "${units[@]}"; do objs+=("$u.o"); done

# A daemon as a build finds it: started, its libraries loaded by one tiny link.
first_arch=${archs%% *}
"$CUDA_HOME/bin/nvcc" -arch="sm_$first_arch" -dc "$here/tests/corpus/saxpy.cu" -o tiny.o

ratios=()
status=0
for ((r = 1; r <= reps; r++)); do
  use_nvlink "$CUDA_HOME/bin/nvlink"
  t=$(now)
  TIMEFORMAT='  nvlink side (nvcc and its children): %U s user, %S s sys'
  { time "$work/overlay/bin/nvcc" -dlto -dlink "${dlink_gencode[@]}" "${objs[@]}" -o plain.o; } 2>time.txt || { cat time.txt; exit 1; }
  plain=$(elapsed "$t")

  use_nvlink "$shim"
  d=$work/daemon$r
  export NVLINKD_SOCKET=$d/nvlinkd.sock NVLINKD_CACHE_DIR=$d/cache NVLINKD_FALLBACK=never
  "$bin/nvlinkd" start --socket "$NVLINKD_SOCKET" --cache-dir "$NVLINKD_CACHE_DIR" --cuda-home "$CUDA_HOME" >/dev/null
  "$work/overlay/bin/nvlink" --arch="sm_$first_arch" tiny.o -o tiny.cubin
  "$bin/nvlinkd" events --json --socket "$NVLINKD_SOCKET" >"$d/events.jsonl" 2>/dev/null &
  events=$!
  sleep 0.2
  t=$(now)
  "$work/overlay/bin/nvcc" -dlto -dlink "${dlink_gencode[@]}" "${objs[@]}" -o daemon.o
  daemon=$(elapsed "$t")
  hits=$("$bin/nvlinkd" stats --socket "$NVLINKD_SOCKET" --json | python3 -c 'import json,sys; print(json.load(sys.stdin).get("speculative_hits", 0))' 2>/dev/null || echo "?")
  kill "$events" 2>/dev/null || true
  "$bin/nvlinkd" stop --socket "$NVLINKD_SOCKET" >/dev/null 2>&1 || true
  unset NVLINKD_SOCKET NVLINKD_CACHE_DIR NVLINKD_FALLBACK

  same=identical
  cmp -s plain.o daemon.o || { same=DIFFERS; status=1; }
  ratio=$(awk -v a="$plain" -v b="$daemon" 'BEGIN { printf "%.2f", a / b }')
  ratios+=("$ratio")
  printf 'rep %d: nvcc -dlto -dlink, %d archs: nvlink %.2f s, nvlinkd %.2f s, %sx, speculative hits %s, %s\n' \
    "$r" "$(wc -w <<<"$archs")" "$plain" "$daemon" "$ratio" "$hits" "$same"
  cat time.txt
  # Where the daemon's time went: each link's phases (from `nvlinkd events`).
  python3 - "$d/events.jsonl" <<'PY' 2>/dev/null || true
import json, sys
links = {}
for line in open(sys.argv[1]):
    e = json.loads(line)
    l = links.setdefault(e.get("link"), {"phases": []})
    if e["event"] == "link_started":
        l["what"] = ("speculative " if e.get("speculative") else "") + next((a for a in e["args"] if a.startswith("--arch")), "?")
    elif e["event"] == "phase_finished":
        l["phases"].append(f'{e["phase"]}{" (cached)" if e.get("cached") else ""} {e["ms"] / 1e3:.2f} s')
    elif e["event"] == "link_finished":
        l["end"] = f'{e["engine"]}, {e["ms"] / 1e3:.2f} s'
for l in links.values():
    if "what" in l:
        print(f'  {l["what"]}: {l.get("end", "?")}: {", ".join(l["phases"])}')
PY
done
median=$(printf '%s\n' "${ratios[@]}" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
echo "median ratio (nvlink / nvlinkd): ${median}x"
exit $status
