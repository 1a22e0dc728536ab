#!/usr/bin/env bash
# gpuforge image entrypoint, run under tini (PID 1). Checks the host driver first, then runs one mode:
#   shell (default) | jupyter | ssh | selftest | any command
set -euo pipefail

GPUFORGE_HOME=/opt/gpuforge
USER_NAME="${GPUFORGE_USER:-gpuforge}"

die() {
    echo "gpuforge: error: $*" >&2
    exit 64
}

# Like NVIDIA's images: no GPU -> one warning line; a driver too old for this image's CUDA -> error,
# unless GPUFORGE_SKIP_DRIVER_CHECK=1.
preflight() {
    PYTHONPATH="$GPUFORGE_HOME/lib" /opt/venv/bin/python -m gpuforge.image.preflight --target "$GPUFORGE_HOME/target.json"
}

start_ssh() {
    [ "$(id -u)" = 0 ] || die "ssh mode starts sshd, which must start as root: docker run --user root IMAGE ssh (logins are for ${USER_NAME} only; root login is refused)"
    local keys_file="${SSH_AUTHORIZED_KEYS_FILE:-/etc/gpuforge/authorized_keys}"
    local home
    home="$(getent passwd "$USER_NAME" | cut -d: -f6)"
    install -d -m 0700 -o "$USER_NAME" -g "$USER_NAME" "$home/.ssh"
    {
        if [ -n "${SSH_AUTHORIZED_KEYS:-}" ]; then printf '%s\n' "$SSH_AUTHORIZED_KEYS"; fi
        if [ -s "$keys_file" ]; then cat "$keys_file"; fi
    } > "$home/.ssh/authorized_keys"
    [ -s "$home/.ssh/authorized_keys" ] || die "ssh mode needs a public key: set SSH_AUTHORIZED_KEYS or mount one at $keys_file"
    chown "$USER_NAME:$USER_NAME" "$home/.ssh/authorized_keys"
    chmod 0600 "$home/.ssh/authorized_keys"
    # Host keys are made here, per container, never baked into the image.
    ssh-keygen -A >/dev/null
    install -d -m 0755 /run/sshd
    echo "gpuforge: sshd listening on port 22 for ${USER_NAME}"
    exec /usr/sbin/sshd -D -e "$@"
}

start_jupyter() {
    [ "$(id -u)" != 0 ] || die "jupyter mode runs as the non-root user; start the container without --user root"
    if [ -z "${JUPYTER_TOKEN:-}" ]; then
        JUPYTER_TOKEN="$(/opt/venv/bin/python -c 'import secrets; print(secrets.token_hex(24))')"
        export JUPYTER_TOKEN
        echo "gpuforge: generated Jupyter token (printed once): ${JUPYTER_TOKEN}"
    fi
    exec /opt/venv/bin/jupyter lab --config=/etc/jupyter/jupyter_server_config.py "$@"
}

# Warm starts (opt-in, images/programs/warm_start.py): Inductor's and Triton's caches on a volume
# (GPUFORGE_COMPILE_CACHE=DIR), compile-cache artifacts loaded/saved (GPUFORGE_CACHE_ARTIFACTS=FILE), and a
# user warm-up (GPUFORGE_WARMUP=module:function) run before the mode starts, an AOTInductor package loaded or built
# (GPUFORGE_AOT_PACKAGE=FILE of GPUFORGE_AOT_MODEL=module:function). A failed warm-up stops the container.
warm_start() {
    if [ -n "${GPUFORGE_COMPILE_CACHE:-}" ]; then
        export TORCHINDUCTOR_CACHE_DIR="$GPUFORGE_COMPILE_CACHE/inductor" TRITON_CACHE_DIR="$GPUFORGE_COMPILE_CACHE/triton"
    fi
    if [ -n "${GPUFORGE_WARMUP:-}${GPUFORGE_CACHE_ARTIFACTS:-}${GPUFORGE_AOT_PACKAGE:-}" ]; then
        /opt/venv/bin/python "$GPUFORGE_HOME/programs/warm_start.py" >&2
    fi
}

mode="${1:-shell}"
if [ $# -gt 0 ]; then shift; fi

preflight
warm_start
case "$mode" in
    shell) exec /bin/bash "$@" ;;
    jupyter) start_jupyter "$@" ;;
    ssh) start_ssh "$@" ;;
    selftest) exec /opt/venv/bin/python "$GPUFORGE_HOME/programs/gpu_smoke.py" "$@" ;;
    *) exec "$mode" "$@" ;;
esac
