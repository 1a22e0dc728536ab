#!/usr/bin/env bash
# Install and start a local Docker engine (Debian's docker.io 20.10, built-in BuildKit) plus what
# gpuforge's bootstrapped bases and registry tests use. For bare Debian boxes with no systemd (CI).
# Idempotent; starts dockerd only when no engine answers, and stops nothing.
set -euo pipefail

need=()
for cmd in dockerd:docker.io debootstrap:debootstrap docker-registry:docker-registry skopeo:skopeo htpasswd:apache2-utils \
           openssl:openssl ssh:openssh-client; do
    command -v "${cmd%%:*}" >/dev/null 2>&1 || need+=("${cmd##*:}")
done
if [ "${#need[@]}" -gt 0 ]; then
    echo "start-engine: installing ${need[*]}"
    apt-get update -q
    # the same install as ENVIRONMENT.md measured (recommends included)
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}" >/dev/null
fi

if /usr/bin/docker info >/dev/null 2>&1; then
    echo "start-engine: an engine is already running"
    exit 0
fi
echo "start-engine: starting dockerd (log: /var/log/dockerd.log)"
nohup dockerd >/var/log/dockerd.log 2>&1 &
for _ in $(seq 1 60); do
    if /usr/bin/docker info >/dev/null 2>&1; then
        /usr/bin/docker version --format 'start-engine: engine {{.Server.Version}} (API {{.Server.APIVersion}})'
        exit 0
    fi
    sleep 1
done
echo "start-engine: dockerd did not answer within 60 s; see /var/log/dockerd.log" >&2
tail -20 /var/log/dockerd.log >&2
exit 1
