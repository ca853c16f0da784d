#!/usr/bin/env bash
# Install CMake and Ninja from PyPI into a project-local prefix, for the
# real-build check (tests/tests/realbuild.rs).
#
#   scripts/setup-cmake.sh [PREFIX]      (default: .tools/cmake-ninja)
#
# Idempotent: a complete install is recognised by its stamp file and nothing is
# downloaded again (offline-safe). Prints the directory holding `cmake` and
# `ninja` on stdout and nothing else there: pip's progress goes to stderr.
set -euo pipefail

CMAKE_VERSION=4.4.4
NINJA_VERSION=1.13.2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
prefix=${1:-$here/.tools/cmake-ninja}
stamp=$prefix/.nvlinkd-cmake-$CMAKE_VERSION-ninja-$NINJA_VERSION

if [[ -f $stamp ]]; then
  echo "$prefix/bin"
  exit 0
fi
log() { echo "setup-cmake: $*" >&2; }
# One install at a time (tests run in parallel ask at once): the others wait
# here, then find the stamp.
mkdir -p "$(dirname "$prefix")"
exec 9>"$prefix.lock"
flock 9
if [[ -f $stamp ]]; then
  echo "$prefix/bin"
  exit 0
fi
python=${PYTHON:-python3}
staging=$prefix.staging
rm -rf "$staging"
mkdir -p "$staging"
log "installing cmake==$CMAKE_VERSION and ninja==$NINJA_VERSION from PyPI into $prefix"
# pip reports what it fetches (a progress bar on a terminal) on our stderr; no
# root-user or new-version warnings (see setup-toolkit.sh).
PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 \
  "$python" -m pip install --no-deps --progress-bar on --target "$staging/site" \
  "cmake==$CMAKE_VERSION" "ninja==$NINJA_VERSION" >&2
# cmake's console script needs the site directory on PYTHONPATH; link the real
# binary instead.
cm=$(find "$staging/site/cmake" -path '*/bin/cmake' -type f | head -1)
nj=$staging/site/bin/ninja   # the ninja wheel ships the binary itself here
[[ -x $cm && -x $nj ]] || { log "wheel layout unexpected (cmake: $cm, ninja: $nj)"; exit 1; }
mkdir -p "$staging/bin"
ln -s "${cm/#$staging/$prefix}" "$staging/bin/cmake"
ln -s "${nj/#$staging/$prefix}" "$staging/bin/ninja"
rm -rf "$prefix"
mv "$staging" "$prefix"
touch "$stamp"
log "cmake and ninja ready in $prefix/bin"
echo "$prefix/bin"
