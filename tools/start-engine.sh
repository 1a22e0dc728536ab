#!/usr/bin/env bash
# The one set-up step on a bare Debian 12 box (no systemd, like CI): installs and starts a Docker
# engine (Debian's docker.io 20.10) with the buildx plugin from trixie, the tools gpuforge's bases and
# registry tests use, nox (from the hashed requirements/nox.lock) as /usr/local/bin/nox, and gpuforge itself
# (the hashed requirements/dev.lock + this checkout, editable) as /usr/local/bin/gpuforge.
# Run as root, or as a user with sudo (it re-runs itself through sudo). Idempotent; starts dockerd
# only when no engine answers, and stops nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        exec sudo --preserve-env=PIP_CERT,SSL_CERT_FILE,REQUESTS_CA_BUNDLE,UV_INDEX_URL,UV_DEFAULT_INDEX,UV_NATIVE_TLS,http_proxy,https_proxy,no_proxy \
            SUDO_INVOKER="$(id -un)" bash "$0" "$@"
    fi
    echo "start-engine: needs root (apt-get, dockerd) and there is no sudo; run it as root" >&2
    exit 1
fi

# Newer Docker parts from trixie, pinned; they install on bookworm (they need only libc6 >= 2.34).
# One word per package (name=version). cosign signs and verifies the validation attestations; the soci CLI
# makes the SOCI index of `push --compression soci`, with containerd (docker.io's dependency) and ctr.
TRIXIE=(docker-buildx=0.13.1+ds1-3 cosign=2.5.0-2+b5 soci-snapshotter=0.4.1-5+b3)

need=()
# The user-journey tests' real clients: headless Chromium + its WebDriver (Selenium drives them) and
# Prometheus 2.42 with promtool, nginx as Jupyter's reverse proxy at a sub-path; Debian bookworm's own packages.
# pigz: dockerd and containerd decompress gzip layers (pull, unpack, a zstd conversion) with unpigz when it is on the
# PATH, and with Go's slower gzip otherwise.
for cmd in dockerd:docker.io debootstrap:debootstrap docker-registry:docker-registry skopeo:skopeo htpasswd:apache2-utils \
           openssl:openssl ssh:openssh-client ssh-keygen:openssh-client jq:jq chromium:chromium chromedriver:chromium-driver \
           prometheus:prometheus promtool:prometheus nginx:nginx-light unpigz:pigz gh:gh; do
    command -v "${cmd%%:*}" >/dev/null 2>&1 || need+=("${cmd##*:}")
done
# Debian's python3 has no venv/pip without it (the runner set-up, tools/runner-setup.sh, makes one with it)
for py in python3 /usr/bin/python3; do
    [ ! -x "$(command -v "$py")" ] || "$py" -c 'import ensurepip' 2>/dev/null || need+=(python3-venv)
done
trixie_need=()
for pkg in "${TRIXIE[@]}"; do
    [ "$(dpkg-query -W -f='${Version}' "${pkg%%=*}" 2>/dev/null || true)" = "${pkg#*=}" ] || trixie_need+=("$pkg")
done

if [ "${#trixie_need[@]}" -gt 0 ]; then
    # trixie as a source at priority 100: nothing is upgraded from it unless named with -t trixie
    if ! grep -rqsE '^(Suites:.*\btrixie\b|deb .* trixie )' /etc/apt/sources.list /etc/apt/sources.list.d/; then
        printf 'Types: deb\nURIs: http://deb.debian.org/debian\nSuites: trixie\nComponents: main\nSigned-By: %s\n' \
            /usr/share/keyrings/debian-archive-keyring.gpg >/etc/apt/sources.list.d/gpuforge-trixie.sources
    fi
    printf 'Package: *\nPin: release n=trixie\nPin-Priority: 100\n' >/etc/apt/preferences.d/gpuforge-trixie
fi
if [ "${#need[@]}" -gt 0 ] || [ "${#trixie_need[@]}" -gt 0 ]; then
    echo "start-engine: installing ${need[*]} ${trixie_need[*]}"
    apt-get update -q
    # the same install as ENVIRONMENT.md measured (recommends included)
    # shellcheck disable=SC2046  # one word per package; the same package may be needed by two commands
    [ "${#need[@]}" -eq 0 ] || DEBIAN_FRONTEND=noninteractive apt-get install -y -q $(printf '%s\n' "${need[@]}" | sort -u) >/dev/null
    [ "${#trixie_need[@]}" -eq 0 ] ||
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q -t trixie --no-install-recommends "${trixie_need[@]}" >/dev/null
    # nginx is a client of the tests (they run their own, on a free port): the service the package just started on
    # port 80 of a systemd machine is stopped and disabled; an nginx that was already there is left alone
    if printf '%s\n' "${need[@]}" | grep -qx nginx-light && [ -d /run/systemd/system ]; then
        systemctl disable --now nginx >/dev/null 2>&1 || true
    fi
fi

# nox, pinned with hashes, in its own venv (Debian's python3 is externally managed)
NOX_VENV=/opt/gpuforge-nox
if ! cmp -s requirements/nox.lock "$NOX_VENV/nox.lock" 2>/dev/null; then
    echo "start-engine: installing nox into $NOX_VENV (requirements/nox.lock)"
    python3 -m venv --clear "$NOX_VENV"
    "$NOX_VENV/bin/python" -m pip install -q --require-hashes --no-deps -r requirements/nox.lock
    cp requirements/nox.lock "$NOX_VENV/nox.lock"
fi
ln -sf "$NOX_VENV/bin/nox" /usr/local/bin/nox

# gpuforge on PATH: a venv of its own with the hashed dev lock, this checkout installed editable (--no-deps:
# every dependency came from the lock), linked as /usr/local/bin/gpuforge. The lock is re-installed only when
# it changed, the checkout only when the venv's gpuforge is another checkout's (asked from /, not from here,
# where `import gpuforge` would find this folder whatever is installed).
GF_VENV=${GPUFORGE_SETUP_VENV:-/opt/gpuforge}  # the overrides exist for tests/integration/core/test_setup_cli.py
GF_BIN=${GPUFORGE_SETUP_BIN:-/usr/local/bin}
# uv (pinned in nox.lock, installed above) installs into it: the dev lock in about 1 s, against pip's 15 s; pip where
# uv is absent. uv reads no pip.conf: behind a private index set UV_INDEX_URL (docs/ci.md).
gf_pip() {
    if [ -x "$NOX_VENV/bin/uv" ]; then "$NOX_VENV/bin/uv" pip install -q --python "$GF_VENV/bin/python" "$@"
    else "$GF_VENV/bin/python" -m pip install -q "$@"; fi
}
# The lock's last part, after its "installed apart, as for Python X" line, holds wheels whose Requires-Python is newer
# than this Python though they run on it (pyproject's [tool.gpuforge.apart]): installed after the rest with no
# dependency resolved, by uv as for Python X, by pip ignoring Requires-Python.
APART='^# --- installed apart, as for Python \([0-9.]*\):.*'
if ! cmp -s requirements/dev.lock "$GF_VENV/dev.lock" 2>/dev/null; then
    echo "start-engine: installing gpuforge's dependencies into $GF_VENV (requirements/dev.lock)"
    python3 -m venv --clear "$GF_VENV"
    parts=$(mktemp -d)
    sed "/$APART/,\$d" requirements/dev.lock >"$parts/resolved.lock"
    sed -n "/$APART/,\$p" requirements/dev.lock >"$parts/apart.lock"
    gf_pip --require-hashes -r "$parts/resolved.lock"
    apart_python=$(sed -n "s/$APART/\1/p" requirements/dev.lock)
    if [ -n "$apart_python" ] && [ -x "$NOX_VENV/bin/uv" ]; then
        gf_pip --python-version "$apart_python" --no-deps --require-hashes -r "$parts/apart.lock"
    elif [ -n "$apart_python" ]; then
        gf_pip --ignore-requires-python --no-deps --require-hashes -r "$parts/apart.lock"
    fi
    rm -rf "$parts"
    cp requirements/dev.lock "$GF_VENV/dev.lock"
fi
if [ "$(cd / && "$GF_VENV/bin/python" -c 'import gpuforge, pathlib; print(pathlib.Path(gpuforge.__file__).parent.parent)' \
        2>/dev/null)" != "$PWD" ]; then
    echo "start-engine: installing gpuforge from $PWD (editable) into $GF_VENV"
    gf_pip --no-deps -e "$PWD"
fi
ln -sf "$GF_VENV/bin/gpuforge" "$GF_BIN/gpuforge"
if [ -n "${SUDO_INVOKER:-}" ] && getent group docker >/dev/null && ! id -nG "$SUDO_INVOKER" | grep -qw docker; then
    usermod -aG docker "$SUDO_INVOKER"
    echo "start-engine: added $SUDO_INVOKER to the docker group; log in again (or \`newgrp docker\`) to use the engine"
fi

if /usr/bin/docker info >/dev/null 2>&1; then
    echo "start-engine: an engine is already running; $(/usr/bin/docker buildx version 2>/dev/null || echo 'no buildx')"
    exit 0
fi
echo "start-engine: starting dockerd (log: /var/log/dockerd.log)"
nohup dockerd >/var/log/dockerd.log 2>&1 &
for _ in $(seq 1 60); do
    if /usr/bin/docker info >/dev/null 2>&1; then
        /usr/bin/docker version --format 'start-engine: engine {{.Server.Version}} (API {{.Server.APIVersion}})'
        echo "start-engine: $(/usr/bin/docker buildx version 2>/dev/null || echo 'no buildx')"
        exit 0
    fi
    sleep 1
done
echo "start-engine: dockerd did not answer within 60 s; see /var/log/dockerd.log" >&2
tail -20 /var/log/dockerd.log >&2
exit 1
