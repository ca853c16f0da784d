#!/usr/bin/env bash
# Install the pinned CUDA 13.5.37 toolkit pieces from PyPI into a project-local
# prefix and lay them out like a regular CUDA installation.
#
#   scripts/setup-toolkit.sh [PREFIX]      (default: .toolkit/cuda-13.5.37)
#   NVLINKD_CUDA_VERSION=13.0.88 scripts/setup-toolkit.sh
#                                          (the release NVIDIA's driver images
#                                          carry; default .toolkit/cuda-13.0.88)
#
# Idempotent: a complete install is recognised by its stamp file and nothing is
# downloaded again (offline-safe). Prints the toolkit root (CUDA_HOME) on stdout
# and nothing else there: what is fetched, and how far it is, goes to stderr
# (pip's own lines and download bars).
set -euo pipefail

VERSION=${NVLINKD_CUDA_VERSION:-13.5.37}
# thrust/cub headers version on their own scheme: the release's own.
# 13.0 has no cuobjdump or nvdisasm wheel (nothing the tests need), and its
# nvfatbin is 13.0.85.
case $VERSION in
  13.5.37) CCCL=13.3.5.0.6 FATBIN=$VERSION EXTRA=("nvidia-cuda-cuobjdump==$VERSION" "nvidia-cuda-nvdisasm==$VERSION") ;;
  13.0.88) CCCL=13.0.85 FATBIN=13.0.85 EXTRA=() ;;
  *) echo "setup-toolkit: no pinned set for CUDA $VERSION (13.5.37, 13.0.88)" >&2; exit 2 ;;
esac
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
prefix=${1:-$here/.toolkit/cuda-$VERSION}
stamp=$prefix/.nvlinkd-toolkit-$VERSION

# The wheels, pinned. nvidia-cuda-cccl (thrust/cub headers) versions on its own
# scheme; nvidia-nvptxcompiler is pinned to the same toolkit release.
WHEELS=(
  "nvidia-cuda-nvcc==$VERSION"
  "nvidia-nvvm==$VERSION"
  "nvidia-nvjitlink==$VERSION"
  "nvidia-nvptxcompiler==$VERSION"
  "nvidia-cuda-crt==$VERSION"
  "nvidia-cuda-runtime==$VERSION"
  "nvidia-nvfatbin==$FATBIN"
  "nvidia-cuda-cccl==$CCCL"
  "${EXTRA[@]}"
)

if [[ -f $stamp ]]; then
  echo "$prefix"
  exit 0
fi

log() { echo "setup-toolkit: $*" >&2; }
python=${PYTHON:-python3}
staging=$prefix.staging
rm -rf "$staging"
mkdir -p "$staging"
log "installing CUDA $VERSION from PyPI into $prefix: ${#WHEELS[@]} wheels, about 200 MB to download, 540 MB installed"
# pip keeps the wheels' executable bits; --no-deps: the set above is complete.
# pip reports each wheel it fetches, with a progress bar on a terminal; its
# stdout goes to our stderr. Its root-user and new-version warnings are noise
# here (a private --target directory): off, through the environment, which a
# pip too old to know them ignores.
PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 \
  "$python" -m pip install --no-deps --progress-bar on --target "$staging/site" "${WHEELS[@]}" >&2
log "wheels installed; laying out the toolkit"

root=$staging/site/nvidia/cu13
[[ -x $root/bin/nvcc && -x $root/bin/nvlink ]] || { log "wheel layout unexpected: no $root/bin/nvcc"; exit 1; }

# Lay out what tools expect from a regular toolkit:
#  - nvlink -dlto loads <nvvmpath>/lib64/libnvvm.so
#  - lib64 beside lib, unversioned .so names for linking
ln -sfn lib "$root/lib64"
mkdir -p "$root/nvvm/lib64"
ln -sfn ../../lib/libnvvm.so.4 "$root/nvvm/lib64/libnvvm.so"
for l in "$root"/lib/lib*.so.*; do
  base=${l##*/}
  ln -sfn "$base" "$root/lib/${base%%.so.*}.so"
done
mkdir -p "$root/lib/stubs"

rm -rf "$prefix"
mv "$root" "$prefix"
rm -rf "$staging"
touch "$stamp"
log "toolkit ready: CUDA_HOME=$prefix"
echo "$prefix"
