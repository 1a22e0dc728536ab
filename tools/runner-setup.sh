#!/usr/bin/env bash
# The set-up step of every self-hosted job in .github/workflows/: checks that the runner has what the job needs
# (docs/ci.md "What a self-hosted runner needs") and puts nox, installed from the hashed requirements/nox.lock, first
# on the job's PATH from a venv under the job's temporary folder. The runner's own python3 is never installed into
# (Debian's refuses it as an externally managed environment; elsewhere it would change every other job's Python).
# Usage: bash tools/runner-setup.sh TOOL...   (the commands the job needs besides python3 and its venv module)
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
for cmd in python3 "$@"; do
    command -v "$cmd" >/dev/null 2>&1 || missing+=("$cmd")
done
python3 -c 'import ensurepip, venv' 2>/dev/null || missing+=("python3's venv module (Debian: python3-venv)")
if printf '%s\n' "$@" | grep -qx docker && ! docker buildx version >/dev/null 2>&1; then
    missing+=("docker buildx")
fi
if [ "${#missing[@]}" -gt 0 ]; then
    echo "::error::this runner lacks: ${missing[*]} (docs/ci.md: what a self-hosted runner needs)"
    exit 1
fi

: "${RUNNER_TEMP:?runner-setup.sh runs inside a GitHub Actions job (RUNNER_TEMP, GITHUB_PATH)}"
venv="$RUNNER_TEMP/gpuforge-nox"
python3 -m venv --clear "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --require-hashes --no-deps -r requirements/nox.lock
echo "$venv/bin" >> "$GITHUB_PATH"
echo "runner-setup: $("$venv/bin/nox" --version 2>&1) in $venv; runner has: python3 $*"
