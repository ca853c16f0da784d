#!/usr/bin/env bash
# Fuzz the parsers that read untrusted bytes (command line, ELF, fatbin,
# archive, input decision tree) with cargo fuzz (libFuzzer).
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]
# Seeds come from the test corpus (built by the tests). cargo fuzz needs
# nightly features; RUSTC_BOOTSTRAP=1 lets the stable toolchain provide them.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
secs=${1:-60}
shift || true
targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=(cli elf fatbin archive inputs)
export RUSTC_BOOTSTRAP=1
corpus_src=$(ls -td target/*/nvlinkd-corpus/*/ 2>/dev/null | head -1 || true)
for t in "${targets[@]}"; do
  seeds=core/fuzz/corpus/$t
  mkdir -p "$seeds"
  if [[ -n $corpus_src ]]; then
    case $t in
      cli) printf -- '--arch=sm_90\0-dlto\0a.o\0-o\0x' > "$seeds/seed1"
           printf -- '-L\0lib\0-ldevmath\0--options-file\0f\0-ghls\0-Xptxas\0-O1,-v' > "$seeds/seed2" ;;
      elf|inputs) cp "$corpus_src"/{accumulate.o,scale.cubin,cdp.o,saxpy_lto.o,merged_r.o} "$seeds/" 2>/dev/null || true
                  # The input that crashes libnvJitLink and nvlink (tests/tests/workers.rs):
                  # scale.cubin with byte 2 of .nv.callgraph XOR 0x10.
                  python3 scripts/crash-cubin.py "$corpus_src/scale.cubin" "$seeds/crash-callgraph.cubin" 2>/dev/null || true ;;
      fatbin) cp "$corpus_src"/saxpy.fatbin "$seeds/" 2>/dev/null || true
              objcopy -O binary --only-section=__nv_relfatbin "$corpus_src/accumulate.o" "$seeds/accumulate.fatbin" 2>/dev/null || true ;;
      archive) cp "$corpus_src"/lib/libdevmath.a "$seeds/" 2>/dev/null || true ;;
    esac
  fi
  echo "== fuzzing $t for ${secs}s"
  (cd core/fuzz && cargo fuzz run -O "$t" -- -max_total_time="$secs" -max_len=262144 -rss_limit_mb=4096) 2>&1 | grep -E "^(#[0-9]+.*(DONE|pulse)|==[0-9]+==|Done|SUMMARY|artifact)" | tail -3
done
