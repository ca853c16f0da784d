#!/usr/bin/env bash
# Install BuildGrid (a Remote Execution API v2 server, from PyPI) into a
# project-local virtual environment, for the shared-cache tests
# (tests/tests/reapi.rs). BuildGrid needs Python >= 3.13: taken from pyenv
# (installed with `pyenv install -s` where missing), or $PYTHON313.
#
#   scripts/setup-buildgrid.sh [PREFIX]      (default: .tools/buildgrid)
#
# Idempotent: a complete install is recognised by its stamp file and nothing is
# downloaded again. Prints the path of the `bgd` executable on stdout and
# nothing else there (progress goes to stderr). Offline, or without a usable
# Python, it prints nothing, says why on stderr and exits 0: the tests that need
# BuildGrid then skip with a message.
set -euo pipefail

BUILDGRID_VERSION=0.9.1
PY_VERSION=3.13
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
prefix=${1:-$here/.tools/buildgrid}
stamp=$prefix/.nvlinkd-buildgrid-$BUILDGRID_VERSION

if [[ -f $stamp ]]; then
  echo "$prefix/bin/bgd"
  exit 0
fi
log() { echo "setup-buildgrid: $*" >&2; }
skip() { log "$* — skipping BuildGrid (the REAPI tests will skip)"; exit 0; }

python=${PYTHON313:-}
if [[ -z $python ]]; then
  if command -v pyenv >/dev/null 2>&1 || [[ -x ${PYENV_ROOT:-$HOME/.pyenv}/bin/pyenv ]]; then
    pyenv=$(command -v pyenv || echo "${PYENV_ROOT:-$HOME/.pyenv}/bin/pyenv")
    if ! "$pyenv" prefix "$PY_VERSION" >/dev/null 2>&1; then
      log "installing Python $PY_VERSION with pyenv (once)"
      "$pyenv" install -s "$PY_VERSION" >&2 || skip "pyenv could not install Python $PY_VERSION"
    fi
    root=$("$pyenv" prefix "$PY_VERSION" 2>/dev/null | head -1 || true)
    [[ -n $root && -x $root/bin/python3 ]] && python=$root/bin/python3
  fi
fi
[[ -n $python ]] || python=$(command -v python3.13 || true)
[[ -n $python ]] || skip "no Python $PY_VERSION (install pyenv, or set PYTHON313)"

# A virtual environment records its own path in its scripts: it is made where
# it lives; the stamp, written last, marks it complete.
rm -rf "$prefix"
log "creating a virtual environment with $python"
"$python" -m venv "$prefix" >&2
log "installing buildgrid==$BUILDGRID_VERSION from PyPI into $prefix"
if ! PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 \
  "$prefix/bin/python" -m pip install --progress-bar on "buildgrid==$BUILDGRID_VERSION" >&2; then
  rm -rf "$prefix"
  skip "pip could not install buildgrid (offline?)"
fi
"$prefix/bin/bgd" --help >/dev/null || { log "bgd does not run"; exit 1; }
touch "$stamp"
log "BuildGrid ready: $prefix/bin/bgd"
echo "$prefix/bin/bgd"
