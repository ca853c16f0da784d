# shellcheck shell=bash
# shellcheck disable=SC2154 # nvl_bin, nvl_cuda, nvl_work, nvl_root: set by the caller (below)
# Shared by scripts/demo.sh and scripts/gpu-check.sh (sourced, not run): a
# private nvlinkd over a toolkit, an overlay whose nvcc links through it, the
# demo program built with that nvcc, its device link compared with the real
# nvlink's, and what the daemon did, in words.
#
# The caller sets: nvl_bin (holding nvlinkd and the nvlink shim), nvl_cuda (the
# toolkit root), nvl_work (a scratch directory; the overlay, socket, cache and
# build go there) and nvl_root (the repository).

# The device libraries' directory (lib64 in a regular toolkit; .toolkit has both).
nvl_libdir() {
  if [[ -d $nvl_cuda/lib64 ]]; then echo "$nvl_cuda/lib64"; else echo "$nvl_cuda/lib"; fi
}

# A private daemon on its own socket and cache, never falling back silently to
# the real nvlink (a link nvlinkd cannot serve then fails the run), and an
# overlay over the toolkit at $nvl_work/overlay. Stopped by nvl_stop.
nvl_up() {
  export NVLINKD_SOCKET=$nvl_work/nvlinkd.sock NVLINKD_CACHE_DIR=$nvl_work/cache NVLINKD_FALLBACK=never
  nvl_log=$NVLINKD_CACHE_DIR/nvlinkd.log
  "$nvl_bin/nvlinkd" install --cuda-home "$nvl_cuda" --prefix "$nvl_work/overlay"
  "$nvl_bin/nvlinkd" start --cuda-home "$nvl_cuda"
}

nvl_stop() {
  "$nvl_bin/nvlinkd" stop >/dev/null 2>&1 || true
}

nvl_stats() {
  "$nvl_bin/nvlinkd" stats --json
}

# nvl_words AFTER [BEFORE [LOG_LINE]]: the links between two stats snapshots, in
# words (the raw counters where there is no python3).
nvl_words() {
  if command -v python3 >/dev/null 2>&1; then
    python3 "$nvl_root/scripts/stats-words.py" "$1" "${2:-}" --log "$nvl_log" --from "${3:-0}"
  else
    echo "nvlinkd counters: $1"
  fi
}

# nvl_step LABEL COMMAND...: run COMMAND and say what went through nvlinkd.
nvl_step() {
  local label=$1 before lines
  shift
  before=$(nvl_stats)
  lines=$(wc -l <"$nvl_log" 2>/dev/null || echo 0)
  "$@"
  echo "$label: $(nvl_words "$(nvl_stats)" "$before" "$lines")"
}

# nvl_build_demo ARCH: the demo program, plain (demo) and LTO (demo_lto), built
# in the current directory with the overlay's nvcc.
nvl_build_demo() {
  local arch=$1 src=("$nvl_root"/demo/{main,poly,reduce}.cu)
  nvl_step "nvcc -rdc=true (demo)" \
    "$nvl_work/overlay/bin/nvcc" -arch="$arch" -rdc=true "${src[@]}" -o demo
  nvl_step "nvcc -rdc=true -dlto (demo_lto)" \
    "$nvl_work/overlay/bin/nvcc" -arch="$arch" -rdc=true -dlto "${src[@]}" -o demo_lto
}

# nvl_compare ARCH: one device link of the demo's objects through nvlinkd and
# through the real nvlink (same command line), byte for byte; then again through
# nvlinkd, from its cache. Fails when an output differs.
nvl_compare() {
  local arch=$1 lib
  lib=$(nvl_libdir)
  "$nvl_cuda/bin/nvcc" -arch="$arch" -dc "$nvl_root"/demo/{main,poly,reduce}.cu
  local link=(--arch="$arch" -L"$lib" main.o poly.o reduce.o -lcudadevrt)
  "$nvl_cuda/bin/nvlink" "${link[@]}" -o via_nvlink.cubin
  nvl_step "nvlink --arch=$arch main.o poly.o reduce.o -lcudadevrt" \
    "$nvl_work/overlay/bin/nvlink" "${link[@]}" -o via_nvlinkd.cubin
  if ! cmp -s via_nvlinkd.cubin via_nvlink.cubin; then
    echo "the device link through nvlinkd DIFFERS from the real nvlink's"
    return 1
  fi
  echo "  its output is byte-identical to the real nvlink's ($(stat -c %s via_nvlink.cubin) bytes)"
  nvl_step "the same link again" "$nvl_work/overlay/bin/nvlink" "${link[@]}" -o again.cubin
  if ! cmp -s again.cubin via_nvlink.cubin; then
    echo "the second link through nvlinkd DIFFERS from the real nvlink's"
    return 1
  fi
  echo "  its output is byte-identical to the real nvlink's too"
}

# nvl_summary: everything the daemon did since it started, in words.
nvl_summary() {
  echo "in all, $(nvl_words "$(nvl_stats)")"
}
