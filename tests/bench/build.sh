#!/usr/bin/env bash
# Build the benchmark workload with the real nvcc: build.sh OUTDIR (CUDA_HOME set).
set -euo pipefail
out=$1
src=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
nvcc="$CUDA_HOME/bin/nvcc"
mkdir -p "$out"
cd "$out"
cp "$src"/*.cu .
# The one-unit change: a different device-side constant in tu3.
sed 's/+ 3.0f/+ 3.5f/' tu3.cu > tu3_changed.cu
jobs=$(nproc)
run() { while [[ $(jobs -rp | wc -l) -ge $jobs ]]; do wait -n; done; "$@" & }
for f in tu1 tu2 tu3 tu4 tu5 transforms tu3_changed; do
  run "$nvcc" -arch=sm_90 -dc -dlto "$f.cu" -o "${f}_lto.o"
  run "$nvcc" -arch=sm_90 -dc "$f.cu" -o "$f.o"
done
wait
# A two-arch LTO build (nvcc -dlto -dlink with two -gencode: one nvlink call per arch).
for f in tu1 tu2 tu3 tu4 tu5 transforms; do
  run "$nvcc" -gencode arch=compute_80,code=lto_80 -gencode arch=compute_90,code=lto_90 -dc "$f.cu" -o "${f}_lto2.o"
done
# The same sources compiled again in the same place (an incremental build that
# recompiles unchanged units): only nvcc's temporary file name differs.
mkdir -p recompiled
# (The CUB units tu1..tu5 are not: their internal-linkage device names and
# module ids change with every compilation.)
run "$nvcc" -arch=sm_90 -dc -dlto transforms.cu -o recompiled/transforms_lto.o
run "$nvcc" -arch=sm_90 -dc transforms.cu -o recompiled/transforms.o
wait
touch workload.done
