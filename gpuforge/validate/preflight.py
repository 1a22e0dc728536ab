"""Checks made before pytest starts, so a run that cannot mean anything is one line, not hundreds.

- the image is a gpuforge image of the target being validated (its io.gpuforge.target label);
- `smoke local://` runs on a machine with an NVIDIA GPU and a working driver;
- a container of the image can be started with a GPU the way the run asks for it (NVIDIA runtime or CDI).

Each failure is one FatalError: its message says what is missing and what to do.
"""

from __future__ import annotations

import glob
import shlex
import shutil
import subprocess

import docker.errors

from gpuforge.engine import client as engine
from gpuforge.engine import containers as run
from gpuforge.errors import ConfigError, EngineError
from gpuforge.render.labels import NS

TARGET_LABEL = f"{NS}.target"  # written by every rendered Dockerfile (gpuforge.render.labels.expected_labels)
# set from the build record and the target: --pytest-args may not point the validators at something else
OWNED_OPTIONS = ("--gpuforge-image", "--gpuforge-host", "--gpuforge-target", "--gpuforge-report")


def image_labels(image_id: str) -> dict[str, str]:
    try:
        img = engine.client().images.get(image_id)
    except docker.errors.ImageNotFound:
        msg = (f"image {image_id[:19]} (the build record's) is not in the engine; run `gpuforge build` first, or "
               "`docker load` the saved image (docker save and load keep its id)")
        raise EngineError(msg) from None
    return img.attrs.get("Config", {}).get("Labels") or {}


def require_gpuforge_image(target_id: str, image_id: str) -> None:
    """Refuse, in one line, an image gpuforge did not build for this target (a hand-written record, a base)."""
    labels = image_labels(image_id)
    built_for = labels.get(TARGET_LABEL)
    if built_for is None:
        msg = (f"{target_id}: image {image_id[:19]} is not a gpuforge image (no {TARGET_LABEL} label); "
               f"validate only what `gpuforge build {target_id}` built")
        raise ConfigError(msg)
    if built_for != target_id:
        msg = (f"{target_id}: image {image_id[:19]} is a gpuforge image of {built_for}, not of {target_id}; "
               f"run `gpuforge build {target_id}`")
        raise ConfigError(msg)


def require_own_options(pytest_args: str) -> None:
    try:
        words = shlex.split(pytest_args)
    except ValueError as e:
        msg = f"--pytest-args {pytest_args!r}: {e}"
        raise ConfigError(msg) from None
    for w in words:
        opt = w.split("=", 1)[0]
        if opt in OWNED_OPTIONS:
            msg = f"--pytest-args may not set {opt}: gpuforge sets it from the build record and the target"
            raise ConfigError(msg)


def require_local_gpu() -> None:
    """`smoke local://`: this machine must have an NVIDIA GPU whose driver answers."""
    devices = sorted(glob.glob("/dev/nvidia[0-9]*"))
    smi = shutil.which("nvidia-smi")
    if not devices and not smi:
        msg = ("smoke local://: this machine has no NVIDIA GPU (no /dev/nvidia0, no nvidia-smi); run it on a GPU "
               "runner, or point it at one: smoke ssh://USER@GPU-HOST")
        raise EngineError(msg)
    if not smi:
        msg = (f"smoke local://: {devices[0]} exists but nvidia-smi is not on PATH; install the NVIDIA driver's "
               "utilities (nvidia-utils) on this host")
        raise EngineError(msg)
    try:
        r = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        msg = "smoke local://: `nvidia-smi -L` did not answer within 60 s; the driver is hung (check dmesg)"
        raise EngineError(msg) from None
    first = ((r.stdout or "") + (r.stderr or "")).strip().splitlines()
    if r.returncode != 0 or not any(line.startswith("GPU ") for line in first):
        why = first[0] if first else f"exit {r.returncode}"
        msg = f"smoke local://: nvidia-smi sees no usable GPU ({why}); check the driver (nvidia-smi, dmesg)"
        raise EngineError(msg)


def require_engine_gpu(image: str, gpu_request: str) -> None:
    """A container of `image` starts with every GPU, asked for as `gpu_request` says: the engine's own answer,
    turned into one line (no NVIDIA runtime, no CDI, no spec) by gpuforge.engine.containers."""
    with run.container(image, ["true"], gpus=True, gpu_request=gpu_request):
        pass
