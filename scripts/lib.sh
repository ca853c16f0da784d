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

# nvl_counter KEY JSON: one counter of `nvlinkd stats --json` (0 when absent).
nvl_counter() {
  local v
  v=$(sed -n "s/.*\"$1\": *\([0-9]*\).*/\1/p" <<<"$2")
  echo "${v:-0}"
}

# nvl_settle: wait (up to two minutes) until the daemon has no verification
# pending: background verification runs the real nvlink after a link computed
# in process, and would share the CPU with what is timed next.
nvl_settle() {
  local i
  for ((i = 0; i < 1200; i++)); do
    [[ $(nvl_counter verify_pending "$(nvl_stats)") == 0 ]] && return 0
    sleep 0.1
  done
}

# nvl_secs MICROSECONDS: "3.2 ms", "46 ms", "1.23 s".
nvl_secs() {
  local us=$1 cs
  if ((us < 10000)); then
    printf '%d.%d ms' $((us / 1000)) $((us % 1000 / 100))
  elif ((us < 1000000)); then
    printf '%d ms' $(((us + 500) / 1000))
  else
    cs=$(((us + 5000) / 10000))
    printf '%d.%02d s' $((cs / 100)) $((cs % 100))
  fi
}

# nvl_timed OUT COMMAND...: run COMMAND; its wall time in microseconds goes to
# the variable named OUT (no subshell around the command).
nvl_timed() {
  local -n nvl_out=$1
  shift
  local t0=${EPOCHREALTIME//[!0-9]/}
  "$@"
  # shellcheck disable=SC2034 # a nameref: this sets the caller's variable
  nvl_out=$((${EPOCHREALTIME//[!0-9]/} - t0))
}

nvl_rows=()

# nvl_time_link LABEL NVLINK_ARGS...: one device link (its -o added here), timed
# as a build sees it (the process included): the real nvlink twice, then the
# overlay's nvlink (the shim) twice — computed by the daemon, then from its
# cache. Every output must equal the real nvlink's byte for byte. One row of
# the table nvl_table prints.
nvl_time_link() {
  local label=$1 real1 real2 cold cached before after lines engine hit
  shift
  nvl_settle
  nvl_timed real1 "$nvl_cuda/bin/nvlink" "$@" -o via_nvlink.cubin
  nvl_timed real2 "$nvl_cuda/bin/nvlink" "$@" -o via_nvlink_again.cubin
  before=$(nvl_stats)
  lines=$(wc -l <"$nvl_log" 2>/dev/null || echo 0)
  nvl_timed cold "$nvl_work/overlay/bin/nvlink" "$@" -o via_nvlinkd.cubin
  after=$(nvl_stats)
  echo "$label: $(nvl_words "$after" "$before" "$lines")"
  if (($(nvl_counter in_process "$after") > $(nvl_counter in_process "$before"))); then
    engine="in process"
  elif (($(nvl_counter nvlink_process "$after") > $(nvl_counter nvlink_process "$before"))); then
    engine="the real nvlink, as the daemon's engine"
  else
    engine="(already cached)"
  fi
  nvl_settle
  before=$(nvl_stats)
  nvl_timed cached "$nvl_work/overlay/bin/nvlink" "$@" -o via_nvlinkd_again.cubin
  hit=$(($(nvl_counter cache_hits "$(nvl_stats)") - $(nvl_counter cache_hits "$before")))
  local f
  for f in via_nvlink_again via_nvlinkd via_nvlinkd_again; do
    if ! cmp -s "$f.cubin" via_nvlink.cubin; then
      echo "$label: $f.cubin DIFFERS from the real nvlink's output"
      return 1
    fi
  done
  echo "  every output is byte-identical to the real nvlink's ($(stat -c %s via_nvlink.cubin) bytes)"
  [[ $hit -ge 1 ]] || engine="$engine; the second link was not a cache hit"
  nvl_rows+=("$(printf '%-30s %10s %10s %14s %14s   %s' "$label" "$(nvl_secs "$real1")" "$(nvl_secs "$real2")" \
    "$(nvl_secs "$cold")" "$(nvl_secs "$cached")" "$engine")")
}

# nvl_table: the rows of nvl_time_link so far.
nvl_table() {
  printf '%-30s %10s %10s %14s %14s   %s\n' "device link" "nvlink" "nvlink" "nvlinkd" "nvlinkd" "nvlinkd's cold link"
  printf '%-30s %10s %10s %14s %14s   %s\n' "" "1st run" "again" "cold" "cached" "ran"
  printf '%s\n' "${nvl_rows[@]}"
  echo "(wall clock of each nvlink process, the shim included; cold: the daemon's first sight of the link, nothing"
  echo " of it in its cache; cached: the same link again)"
}

# nvl_compare ARCH: the demo's two device links — plain (-rdc) and LTO (-dlto),
# objects compiled here with the toolkit's nvcc — each timed through the real
# nvlink and through nvlinkd, cold and cached (nvl_time_link; nvl_table prints
# the times). Run it on a fresh daemon, before other links of the demo's code,
# or "cold" reuses what they left in the cache (an LTO link's NVVM step).
# Fails when an output differs.
nvl_compare() {
  local arch=$1 lib src=("$nvl_root"/demo/{main,poly,reduce}.cu)
  lib=$(nvl_libdir)
  mkdir -p lto
  "$nvl_cuda/bin/nvcc" -arch="$arch" -dc "${src[@]}"
  "$nvl_cuda/bin/nvcc" -arch="$arch" -dc -dlto -odir lto "${src[@]}"
  nvl_time_link "-rdc, $arch" --arch="$arch" -L"$lib" main.o poly.o reduce.o -lcudadevrt
  nvl_time_link "-dlto, $arch" -dlto --arch="$arch" -L"$lib" -nvvmpath="$nvl_cuda/nvvm" \
    lto/main.o lto/poly.o lto/reduce.o -lcudadevrt
}

# nvl_summary: everything the daemon did since it started, in words.
nvl_summary() {
  echo "in all, $(nvl_words "$(nvl_stats)")"
}
