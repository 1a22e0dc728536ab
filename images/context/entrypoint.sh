#!/usr/bin/env bash
# gpuforge image entrypoint, run under tini (PID 1). Checks the host driver first, then runs one mode:
#   shell (default) | jupyter [lab|notebook|server] | ssh | metrics | selftest | any command
# `jupyter lab|notebook|server ARGS` as people type it runs the jupyter mode; NB_PREFIX (Kubeflow) with no
# command starts it too. GPUFORGE_METRICS_PORT=PORT serves GPU metrics beside any mode.
set -euo pipefail

GPUFORGE_HOME=/opt/gpuforge
USER_NAME="${GPUFORGE_USER:-gpuforge}"

die() {
    echo "gpuforge: error: $*" >&2
    exit 64
}

# What the HEALTHCHECK (images/programs/health.py) asks about this start: the mode, then where its servers listen
# once they are started. The check runs as the container's user with the container's environment, so the state
# lives in a folder of this uid's own under TMPDIR (one of another owner is replaced), written whole each time
# (mv), so a check never reads half of it.
HEALTH_DIR="${TMPDIR:-/tmp}/gpuforge-health-$(id -u)"
health=()
health_said=""
health_state() {
    health+=("$@")
    local tmp=""
    if ! { [ -d "$HEALTH_DIR" ] && [ ! -L "$HEALTH_DIR" ] && [ -O "$HEALTH_DIR" ]; }; then
        rm -rf -- "$HEALTH_DIR" 2>/dev/null || true
        mkdir -m 0700 -- "$HEALTH_DIR" 2>/dev/null || true
    fi
    if [ -d "$HEALTH_DIR" ] && [ ! -L "$HEALTH_DIR" ] && [ -O "$HEALTH_DIR" ] \
        && tmp="$(mktemp "$HEALTH_DIR/.state.XXXXXX" 2>/dev/null)" \
        && printf '%s\n' "${health[@]}" > "$tmp" && mv -f -- "$tmp" "$HEALTH_DIR/state"; then
        return 0
    fi
    if [ -n "$tmp" ]; then rm -f -- "$tmp"; fi
    if [ -z "$health_said" ]; then
        health_said=1
        echo "gpuforge: warning: cannot write the health check's state in $HEALTH_DIR (TMPDIR not writable?): docker's health status will not see this mode's server" >&2
    fi
}

# Like NVIDIA's images: no GPU -> one warning line; a driver too old for this image's CUDA -> error,
# unless GPUFORGE_SKIP_DRIVER_CHECK=1.
preflight() {
    PYTHONPATH="$GPUFORGE_HOME/lib" /opt/venv/bin/python -m gpuforge.image.preflight --target "$GPUFORGE_HOME/target.json"
}

# The container's own CUDA/NVIDIA/Python variables for ssh sessions (sshd resets the environment): one SetEnv
# on sshd's command line, which wins over the config file's. Values with blanks or quotes are left out.
ssh_setenv() {
    local out="PATH=/opt/venv/bin:/usr/local/bin:/usr/bin:/bin" name value
    while IFS='=' read -r name value; do
        case "$name" in
            LD_LIBRARY_PATH | NVIDIA_* | CUDA_* | NCCL_* | TORCH* | TRITON_* | PIP_CONSTRAINT | GPUFORGE_TARGET | HF_*) ;;
            *) continue ;;
        esac
        case "$value" in *[[:space:]\'\"\\]* | "") continue ;; esac
        out="$out $name=$value"
    done < <(env)
    printf '%s' "$out"
}

start_ssh() {
    [ "$(id -u)" = 0 ] || die "ssh mode starts sshd, which must start as root: docker run --user root IMAGE ssh (logins are for ${USER_NAME} only; root login is refused)"
    local keys_file="${SSH_AUTHORIZED_KEYS_FILE:-/etc/gpuforge/authorized_keys}"
    local home forwarding="${GPUFORGE_SSH_FORWARDING:-local}"
    local -a opts=(-o "SetEnv=$(ssh_setenv)")
    case "$forwarding" in
        local) ;;  # sshd_config: local forwarding to the container's own loopback only (PermitOpen)
        none) opts+=(-o AllowTcpForwarding=no) ;;
        *) die "GPUFORGE_SSH_FORWARDING=$forwarding: allowed local (ssh -L to the container's loopback, the default) or none" ;;
    esac
    home="$(getent passwd "$USER_NAME" | cut -d: -f6)"
    local keys
    keys="$(
        if [ -n "${SSH_AUTHORIZED_KEYS:-}" ]; then printf '%s\n' "$SSH_AUTHORIZED_KEYS"; fi
        if [ -s "$keys_file" ]; then cat "$keys_file"; fi
    )"
    [ -n "$keys" ] || die "ssh mode needs a public key: set SSH_AUTHORIZED_KEYS or mount one at $keys_file"
    if [ -w "$home" ]; then
        # StrictModes refuses keys under a group-writable home (the image makes it g+w for OpenShift's gid 0)
        chmod g-w,o-w "$home"
        install -d -m 0700 -o "$USER_NAME" -g "$USER_NAME" "$home/.ssh"
        printf '%s\n' "$keys" > "$home/.ssh/authorized_keys"
        chown "$USER_NAME:$USER_NAME" "$home/.ssh/authorized_keys"
        chmod 0600 "$home/.ssh/authorized_keys"
    else
        # a read-only root: the keys live under /tmp (root's, read-only to others), handed to sshd by a command
        install -d -m 0755 /tmp/gpuforge-sshd
        printf '%s\n' "$keys" > /tmp/gpuforge-sshd/authorized_keys
        chmod 0644 /tmp/gpuforge-sshd/authorized_keys
        opts+=(-o "AuthorizedKeysCommand=/bin/cat /tmp/gpuforge-sshd/authorized_keys" -o AuthorizedKeysCommandUser=nobody
               -o PidFile=none)
    fi
    # Host keys are made here, per container, never baked into the image (under /tmp on a read-only root).
    if [ -w /etc/ssh ]; then ssh-keygen -A >/dev/null; else
        install -d -m 0755 /tmp/gpuforge-sshd  # the keys beside it are read by nobody; the host key file is 0600
        ssh-keygen -q -t ed25519 -N '' -f /tmp/gpuforge-sshd/ssh_host_ed25519_key <<<y >/dev/null
        opts+=(-o HostKey=/tmp/gpuforge-sshd/ssh_host_ed25519_key)
    fi
    [ -d /run/sshd ] || install -d -m 0755 /run/sshd
    # where sshd will listen, as it reads its configuration and these options (-p, -o Port=, ListenAddress)
    health_state "pid=$$" "ssh_listen=$(/usr/sbin/sshd -T "${opts[@]}" "$@" 2>/dev/null | awk '$1 == "listenaddress" {printf "%s ", $2}')"
    echo "gpuforge: sshd listening on port 22 for ${USER_NAME} (tcp forwarding: ${forwarding})"
    run_mode /usr/sbin/sshd -D -e "${opts[@]}" "$@"
}

# HOME for whoever runs: an arbitrary uid (OpenShift: --user 12345:0) has no passwd entry and gets HOME=/;
# it then uses the image's home, which is group-writable for gid 0. A home nobody may write (a read-only
# root, a volume owned by someone else) is replaced by one under /tmp, said in ONE line.
ensure_home() {
    local image_home="/home/${USER_NAME}"
    if [ -z "${HOME:-}" ] || [ "$HOME" = / ]; then HOME="$image_home"; fi
    if ! { [ -d "$HOME" ] && [ -w "$HOME" ] && [ -x "$HOME" ]; }; then
        local fallback
        fallback="/tmp/gpuforge-home-$(id -u)"
        mkdir -p "$fallback" 2>/dev/null || die "HOME $HOME is not writable by uid $(id -u) and /tmp is not writable either: mount a writable volume at $HOME (or --tmpfs /tmp)"
        echo "gpuforge: warning: HOME $HOME is not writable by uid $(id -u) (owner $(stat -c %u:%g "$HOME" 2>/dev/null || echo none)); using $fallback, lost with the container: mount a volume the uid may write at $HOME" >&2
        HOME="$fallback"
    fi
    export HOME
    # pip installs as the user go to ~/.local (the venv sees it); made now so a running kernel sees new packages
    mkdir -p "$HOME/.local/lib/python$(/opt/venv/bin/python -c 'import sys; print("%d.%d" % sys.version_info[:2])')/site-packages" 2>/dev/null || true
}

# The metrics exporter never runs as root: started by root (ssh mode), it runs as the image's user.
unprivileged=()
if [ "$(id -u)" = 0 ]; then
    unprivileged=(setpriv --reuid="$(id -u "$USER_NAME")" --regid="$(id -g "$USER_NAME")" --init-groups --inh-caps=-all)
fi

metrics_beside() {
    [ -n "${GPUFORGE_METRICS_PORT:-}" ] || return 0
    case "$GPUFORGE_METRICS_PORT" in
        *[!0-9]* | "") die "GPUFORGE_METRICS_PORT=$GPUFORGE_METRICS_PORT: give a TCP port number (9400 is dcgm-exporter's)" ;;
    esac
    [ "$mode" != metrics ] || return 0
    health_state "metrics_addr=${GPUFORGE_METRICS_ADDR:-0.0.0.0}" "metrics_port=$GPUFORGE_METRICS_PORT"
    "${unprivileged[@]}" /opt/venv/bin/python "$GPUFORGE_HOME/programs/metrics.py" --port "$GPUFORGE_METRICS_PORT" &
}

# Where metrics.py will listen: its --addr and --port as its argparse reads them (the last one given wins), else
# GPUFORGE_METRICS_ADDR / GPUFORGE_METRICS_PORT, else its defaults (every address, 9400).
metrics_health() {
    local addr="${GPUFORGE_METRICS_ADDR:-0.0.0.0}" port="${GPUFORGE_METRICS_PORT:-9400}"
    while [ $# -gt 0 ]; do
        case "$1" in
            --addr) addr="${2:-}"; shift ;;
            --addr=*) addr="${1#--addr=}" ;;
            --port) port="${2:-}"; shift ;;
            --port=*) port="${1#--port=}" ;;
        esac
        shift
    done
    health_state "pid=$$" "metrics_addr=$addr" "metrics_port=$port"
}

# jupyter [lab|notebook|server] ARGS: the server with the image's config (token, not root, HOME as root dir,
# no outbound calls). --ip/--port pass through; started as root it drops to the image's user, in one line.
start_jupyter() {
    local app=lab arg explicit_token=""
    case "${1:-}" in
        lab | server) app="$1"; shift ;;
        notebook) shift; echo "gpuforge: \`jupyter notebook\` is served by JupyterLab here (the notebook package is not installed): /lab" ;;
    esac
    local -a args=()
    for arg in "$@"; do
        case "$arg" in
            --allow-root) ;;  # never needed: the server does not run as root
            --*token=* | --*Token=*) explicit_token=1; args+=("$arg") ;;
            *) args+=("$arg") ;;
        esac
    done
    if [ -n "${NB_PREFIX:-}" ]; then
        case "$NB_PREFIX" in
            /*) ;;
            *) die "NB_PREFIX=$NB_PREFIX: must be a URL path starting with / (Kubeflow sets /notebook/NAMESPACE/NAME)" ;;
        esac
        case "$NB_PREFIX" in *[!A-Za-z0-9/_.~-]*) die "NB_PREFIX=$NB_PREFIX: only letters, digits and / _ . ~ - are allowed" ;; esac
    fi
    if [ "${GPUFORGE_JUPYTER_NO_TOKEN:-}" = 1 ] || { [ -n "${JUPYTER_TOKEN+set}" ] && [ -z "$JUPYTER_TOKEN" ]; }; then
        export GPUFORGE_JUPYTER_NO_TOKEN=1
        unset JUPYTER_TOKEN
        echo "gpuforge: warning: Jupyter runs WITHOUT a token, as asked: put an authenticating proxy in front (Kubeflow does)" >&2
    elif [ -n "$explicit_token" ]; then
        echo "gpuforge: the Jupyter token is the one given on the command line (visible to ps; JUPYTER_TOKEN is not)" >&2
    elif [ -z "${JUPYTER_TOKEN:-}" ]; then
        JUPYTER_TOKEN="$(/opt/venv/bin/python -c 'import secrets; print(secrets.token_hex(24))')"
        export JUPYTER_TOKEN
        echo "gpuforge: generated Jupyter token (printed once): ${JUPYTER_TOKEN}"
    fi
    local -a cmd=(/opt/venv/bin/jupyter "$app" --config=/etc/jupyter/jupyter_server_config.py "${args[@]}")
    if [ "$(id -u)" = 0 ]; then
        local uid
        uid="$(id -u "$USER_NAME")"
        echo "gpuforge: started as root: Jupyter runs as ${USER_NAME} (uid ${uid}) instead; --allow-root is not needed" >&2
        HOME="$(getent passwd "$USER_NAME" | cut -d: -f6)"
        cd "$HOME"
        jupyter_health
        run_mode setpriv --reuid="$uid" --regid="$(id -g "$USER_NAME")" --init-groups --inh-caps=-all --bounding-set=-all \
            /usr/bin/env HOME="$HOME" USER="$USER_NAME" "${cmd[@]}"
    fi
    cd "$HOME"
    jupyter_health
    run_mode "${cmd[@]}"
}

# The runtime dir the server will write its jpserver-<pid>.json to (its port, base_url and token), as jupyter_core
# finds it with the server's HOME and environment (JUPYTER_RUNTIME_DIR, JUPYTER_DATA_DIR, XDG_DATA_HOME ...).
jupyter_health() {
    health_state "pid=$$" "jupyter_runtime_dir=$(/opt/venv/bin/python -c 'from jupyter_core.paths import jupyter_runtime_dir; print(jupyter_runtime_dir())' 2>/dev/null)"
}

# Warm starts (opt-in, images/programs/warm_start.py): Inductor's and Triton's caches on a volume
# (GPUFORGE_COMPILE_CACHE=DIR), compile-cache artifacts loaded/saved (GPUFORGE_CACHE_ARTIFACTS=FILE), and a
# user warm-up (GPUFORGE_WARMUP=module:function) run before the mode starts, an AOTInductor package loaded or built
# (GPUFORGE_AOT_PACKAGE=FILE of GPUFORGE_AOT_MODEL=module:function). A failed warm-up stops the container.
# A package that must be built is built after the start is ready: warm_start.py leaves a job file, and the
# builder runs in the background while the mode runs (AOT_BUILDER; run_mode waits for it before the container ends).
AOT_BUILDER=""
# GPUFORGE_COMPILE_MODE=max-autotune-no-cudagraphs (docs/images.md): the warm starts compile in that mode, and what
# max-autotune tunes is limited for the whole container, warm start and mode alike, so that a compile in the mode
# finds the warm start's cache entries (their keys hold these settings). A value given by the user wins.
compile_mode() {
    case "${GPUFORGE_COMPILE_MODE:-default}" in
        default) ;;
        max-autotune-no-cudagraphs)
            # cuDNN's convolutions, not Triton's templates: tens of seconds of tuning per shape, rarely faster
            export TORCHINDUCTOR_MAX_AUTOTUNE_CONV_BACKENDS="${TORCHINDUCTOR_MAX_AUTOTUNE_CONV_BACKENDS:-ATEN}"
            export TORCHINDUCTOR_MAX_AUTOTUNE_GEMM_BACKENDS="${TORCHINDUCTOR_MAX_AUTOTUNE_GEMM_BACKENDS:-ATEN,TRITON}" ;;
        *) die "GPUFORGE_COMPILE_MODE=$GPUFORGE_COMPILE_MODE: use default or max-autotune-no-cudagraphs" ;;
    esac
}

warm_start() {
    if [ -n "${GPUFORGE_COMPILE_CACHE:-}" ]; then
        export TORCHINDUCTOR_CACHE_DIR="$GPUFORGE_COMPILE_CACHE/inductor" TRITON_CACHE_DIR="$GPUFORGE_COMPILE_CACHE/triton"
    fi
    if [ -n "${GPUFORGE_WARMUP:-}${GPUFORGE_CACHE_ARTIFACTS:-}${GPUFORGE_AOT_PACKAGE:-}" ]; then
        local job
        job="$(mktemp "${TMPDIR:-/tmp}/gpuforge-aot-job.XXXXXX")"
        GPUFORGE_AOT_BUILD_JOB="$job" /opt/venv/bin/python "$GPUFORGE_HOME/programs/warm_start.py" >&2
        if [ -s "$job" ]; then
            # at the lowest CPU priority: the mode starting beside it comes first
            nice -n 19 /opt/venv/bin/python "$GPUFORGE_HOME/programs/warm_start.py" --build-only >&2 &
            AOT_BUILDER=$!
        fi
        rm -f "$job"
    fi
}

# The mode in place of this shell, as every mode starts; with a package being built in the background, as a child
# instead, so that the container ends only once the build is done and the package is kept for the next start
# (tini -g still signals the whole group: docker stop ends the mode and the build).
run_mode() {
    if [ -z "$AOT_BUILDER" ]; then exec "$@"; fi
    local rc=0
    "$@" || rc=$?
    if kill -0 "$AOT_BUILDER" 2>/dev/null; then
        echo "gpuforge: the mode ended; waiting for the AOTInductor package build (pid ${AOT_BUILDER}) before the container ends" >&2
    fi
    wait "$AOT_BUILDER" || echo "gpuforge: warning: the AOTInductor package build failed (see above); the next start builds it again" >&2
    exit "$rc"
}

mode="${1:-shell}"
if [ $# -gt 0 ]; then shift; fi
# Kubeflow starts the image's default command (CMD shell) with NB_PREFIX set and no terminal: the notebook server
if [ "$mode" = shell ] && [ $# -eq 0 ] && [ -n "${NB_PREFIX:-}" ]; then
    echo "gpuforge: NB_PREFIX is set (Kubeflow): starting the jupyter mode under ${NB_PREFIX}"
    mode=jupyter
fi
# `jupyter lab ...`, `jupyter-lab ...`: the jupyter mode; other jupyter subcommands (nbconvert, kernelspec) run as typed
case "$mode" in
    jupyter-lab | jupyter-notebook | jupyter-server) set -- "${mode#jupyter-}" "$@"; mode=jupyter ;;
    jupyter | */jupyter)
        case "${1:-}" in
            "" | lab | notebook | server | -*) mode=jupyter ;;
            *) mode=jupyter-command ;;
        esac ;;
esac

case "$mode" in
    shell | jupyter | ssh | metrics | selftest) health_state "mode=$mode" ;;
    *) health_state "mode=command" ;;  # `jupyter nbconvert ...`, any other command: run once, nothing to ask
esac
if [ "$mode" != ssh ] || [ "$(id -u)" != 0 ]; then ensure_home; fi
preflight
compile_mode
warm_start
metrics_beside
case "$mode" in
    shell) run_mode /bin/bash "$@" ;;
    jupyter) start_jupyter "$@" ;;
    jupyter-command) run_mode /opt/venv/bin/jupyter "$@" ;;
    ssh) start_ssh "$@" ;;
    metrics) metrics_health "$@"; run_mode "${unprivileged[@]}" /opt/venv/bin/python "$GPUFORGE_HOME/programs/metrics.py" "$@" ;;
    selftest) run_mode /opt/venv/bin/python "$GPUFORGE_HOME/programs/gpu_smoke.py" "$@" ;;
    *) run_mode "$mode" "$@" ;;
esac
