"""Container lifecycle: every container gpuforge starts goes through `container()` and is removed
on success, failure and Ctrl-C. Each is labelled as gpuforge's, with its run id and its owning
process, so `sweep()` can remove what a crashed run left behind and nothing of a live one. Ports are published on 127.0.0.1 only.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import docker
import docker.errors
import docker.types
import requests.exceptions

from gpuforge.engine import client as engine
from gpuforge.errors import EngineError
from gpuforge.grammar import GPU_REQUESTS

RUN_LABEL = "io.gpuforge.run"
_run_id = [uuid.uuid4().hex[:12]]  # one per process, unless the entry point names the run (use_run_id)


def use_run_id(value: str | None) -> None:
    """Label this process's containers with `value`, named once by the entry point: the CLI's run_id setting
    (GPUFORGE_RUN_ID), which gpuforge sets for its pytest child and the validator plugin passes on here."""
    if value:
        _run_id[0] = value


def run_id() -> str:
    return _run_id[0]


@dataclass
class Running:
    """A started container: its id, published ports and logs."""

    container: docker.models.containers.Container

    @property
    def id(self) -> str:
        cid: str = self.container.id  # docker-py is untyped: its values are Any
        return cid

    def _gone(self) -> EngineError:
        return EngineError(f"container {self.id[:12]} was removed while in use (`gpuforge clean --all`, `docker rm` "
                           "or an engine restart by someone else?); run again")

    def port(self, inside: int) -> int:
        self.reload()
        bound = (self.container.attrs["NetworkSettings"]["Ports"] or {}).get(f"{inside}/tcp")
        if not bound:
            msg = f"container {self.id[:12]} publishes no port {inside}"
            raise EngineError(msg)
        return int(bound[0]["HostPort"])

    def reload(self) -> None:
        try:
            self.container.reload()
        except docker.errors.NotFound:
            raise self._gone() from None

    def logs(self) -> str:
        try:
            text: str = self.container.logs().decode(errors="replace")
            return text
        except docker.errors.NotFound:
            raise self._gone() from None
        except docker.errors.APIError as e:
            if e.status_code == 409:  # "dead or marked for removal": someone else is removing it
                raise self._gone() from None
            raise

    def status(self) -> str:
        self.reload()
        status: str = self.container.status
        return status

    def wait_for_log(self, pattern: str, timeout: float = 60) -> re.Match[str]:
        """Wait until the logs match `pattern`; fail with the logs if the container exits or time runs out."""
        deadline = time.monotonic() + timeout
        rx = re.compile(pattern)
        while True:
            logs = self.logs()
            m = rx.search(logs)
            if m:
                return m
            if self.status() == "exited" or time.monotonic() > deadline:
                state = "exited" if self.status() == "exited" else f"no match after {timeout:.0f}s"
                msg = f"container {self.id[:12]} {state} waiting for /{pattern}/; logs:\n{logs[-3000:]}"
                raise EngineError(msg)
            time.sleep(0.3)


@contextlib.contextmanager
def container(image: str, command: list[str] | None = None, *, user: str | None = None,
              env: dict[str, str] | None = None, ports: dict[int, int | None] | None = None,
              gpus: bool = False, shm_size: str | None = None, volumes: dict[str, Any] | None = None,
              sysctls: dict[str, Any] | None = None, gpu_request: str = "nvidia", read_only: bool = False,
              tmpfs: dict[str, str] | None = None, network: str | None = None,
              memlock: int | None = None, health_interval: float | None = None) -> Iterator[Running]:
    """Start `image` detached; always remove it afterwards.

    `ports` maps container port -> host port on 127.0.0.1 (None: any free port).
    `gpus=True` gives the container every GPU, asked for as `gpu_request` says (see gpu_device_request).
    `read_only`, `tmpfs` ({path: options}) and `network` ("none") are `docker run`'s --read-only, --tmpfs, --network;
    `memlock` is --ulimit memlock (-1: unlimited, as NVIDIA's container docs ask for pinned memory and NCCL).
    `health_interval` is --health-interval in seconds: the image's HEALTHCHECK, probed that often (its command,
    timeout, retries and start period stay the image's).
    """
    c = engine.client()
    kwargs: dict[str, Any] = {
        "detach": True,
        "labels": _labels(),
        "environment": env or {},
        "ports": {f"{p}/tcp": ("127.0.0.1", h) for p, h in (ports or {}).items()},
    }
    # docker run's --gpus/--device, --shm-size, -v, --sysctl, --read-only, --tmpfs, --network: only those asked for
    asked = {"device_requests": [gpu_device_request(gpu_request)] if gpus else None, "shm_size": shm_size,
             "volumes": volumes, "sysctls": sysctls, "read_only": read_only, "tmpfs": tmpfs, "network_mode": network,
             "ulimits": [docker.types.Ulimit(name="memlock", soft=memlock, hard=memlock)] if memlock else None,
             "healthcheck": {"interval": int(health_interval * 1e9)} if health_interval else None}
    kwargs.update({k: v for k, v in asked.items() if v})
    if user is not None:  # "" is a user too (the image's default)
        kwargs["user"] = user
    try:
        cont = c.containers.create(image, command, **kwargs)
    except docker.errors.ImageNotFound:
        msg = f"image {image} is not in the engine; run `gpuforge build` first"
        raise EngineError(msg) from None
    except docker.errors.APIError as e:
        text = str(e.explanation or e)
        if gpus and gpu_request_failed(text):
            raise EngineError(gpu_request_error(image, gpu_request, text)) from None
        msg = f"cannot create a container of {image}: {text}"
        raise EngineError(msg) from None
    try:
        try:
            cont.start()
        except docker.errors.APIError as e:
            text = str(e.explanation or e)
            if "port is already allocated" in text or "address already in use" in text:
                taken = ", ".join(f"127.0.0.1:{h}" for h in (ports or {}).values() if h)
                msg = f"port already taken ({taken}); free it or let gpuforge pick a free port"
                raise EngineError(msg) from None
            if gpus and gpu_request_failed(text):
                raise EngineError(gpu_request_error(image, gpu_request, text)) from None
            msg = f"cannot start a container of {image}: {text}"
            raise EngineError(msg) from None
        yield Running(cont)
    finally:
        _remove(cont)


def gpu_device_request(mode: str) -> docker.types.DeviceRequest:
    """Every GPU, asked for the way the runner's engine can give it.

    nvidia: `docker run --gpus all`, served by the NVIDIA container runtime (nvidia-container-toolkit).
    cdi: `docker run --device nvidia.com/gpu=all` (Docker >= 25 with CDI on, podman): the engine applies the
    host's CDI spec (device nodes, driver libraries), no NVIDIA runtime needed.
    """
    if mode == "nvidia":
        return docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])
    if mode == "cdi":
        return docker.types.DeviceRequest(driver="cdi", device_ids=["nvidia.com/gpu=all"])
    msg = f"unknown GPU request mode {mode!r} (allowed: {', '.join(GPU_REQUESTS)})"
    raise EngineError(msg)


def gpu_request_failed(text: str) -> bool:
    t = text.lower()
    return "could not select device driver" in t or "cdi" in t or "nvidia" in t


def gpu_request_error(image: str, mode: str, text: str) -> str:
    """The engine's refusal of a GPU request, turned into what to do about it."""
    t = text.lower()
    if mode == "nvidia" and "could not select device driver" in t:
        return (f"cannot start {image} with a GPU: the engine has no NVIDIA container runtime ({text}); "
                f"install nvidia-container-toolkit on this runner (nvidia-ctk runtime configure --runtime=docker, "
                f"restart dockerd), or ask for GPUs through CDI: --gpu-request cdi (GPUFORGE_GPU_REQUEST=cdi)")
    if mode == "cdi" and "could not select device driver" in t:
        return (f"cannot start {image} with a CDI GPU request: this engine has no CDI support ({text}); "
                f'use Docker >= 25 with {{"features": {{"cdi": true}}}} in /etc/docker/daemon.json, '
                f"or --gpu-request nvidia with nvidia-container-toolkit")
    if mode == "cdi" and ("unresolvable" in t or "cdi" in t):
        return (f"cannot start {image} with a CDI GPU request ({text}); write the GPU's CDI spec: "
                f"nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml (nvidia-ctk cdi list shows nvidia.com/gpu=all)")
    return f"cannot start {image} with a GPU ({mode} request): {text}"


# "<host>:<pid>:<start time>" of the process that started a container, and the machine's boot id beside it:
# `clean` (and the reap at the start of build/validate) removes it once that process is gone (SIGKILL, OOM, a
# crashed runner), and never touches a container of a run still alive. The start time (from /proc/<pid>/stat)
# makes the pid name one process even after the pid is reused; the boot id tells a pid of before a reboot.
# The boot id is a label of its own: gpuforge versions that read only the first label (and would take a
# longer value for a dead owner) share runners with this one.
OWNER_LABEL = "io.gpuforge.process"
BOOT_LABEL = "io.gpuforge.boot"


def _started(pid: int) -> str:
    """The process's start time in clock ticks since boot ('' when there is no such process): with the pid
    it names one process, even after the pid is reused."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return ""
    # a zombie (Z) or dead (X) process is gone, even while no parent has collected it yet
    return "" if len(fields) < 20 or fields[0] in ("Z", "X") else fields[19]


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def _owner(pid: int | None = None) -> str:
    pid = os.getpid() if pid is None else pid
    return f"{socket.gethostname()}:{pid}:{_started(pid)}"


def _labels() -> dict[str, str]:
    """What marks a container or network as this run's: gpuforge's, the run id, the owning process and boot."""
    return {engine.LABEL_OWNER: "gpuforge", RUN_LABEL: run_id(), OWNER_LABEL: _owner(), BOOT_LABEL: _boot_id()}


@contextlib.contextmanager
def network(**kw: Any) -> Iterator[Any]:
    """A bridge network of this run's own (docker network create; `kw`: enable_ipv6, ipam, internal), labelled like
    its containers, removed on the way out; `sweep` removes one whose run died."""
    net = engine.client().networks.create(f"gf-{uuid.uuid4().hex[:12]}", driver="bridge", labels=_labels(), **kw)
    try:
        yield net
    finally:
        with contextlib.suppress(docker.errors.NotFound):
            net.remove()


def owner_alive(owner: str, boot: str = "") -> bool | None:
    """True: the owning process still runs; False: it is gone; None: not ours to judge (another machine or
    pid namespace, or a label this version cannot read)."""
    parts = owner.split(":")
    if len(parts) != 3 or parts[0] != socket.gethostname() or not parts[1].isdigit() or not parts[2]:
        return None
    if boot and _boot_id() and boot != _boot_id():
        return False  # started before this machine's last boot: that process is gone
    return _started(int(parts[1])) == parts[2]


def leftovers(run_id: str | None = None) -> list[Any]:
    label = f"{RUN_LABEL}={run_id}" if run_id else f"{engine.LABEL_OWNER}=gpuforge"
    # ignore_removed: the SDK inspects each listed container; one that ends meanwhile (validators start and
    # stop many) is not an error
    found: list[Any] = engine.client().containers.list(all=True, filters={"label": label}, ignore_removed=True)
    return found


def _remove(cont: Any) -> bool:  # a docker-py Container (untyped)
    """Remove a container; False when it was already gone or another remover (a concurrent clean) is at it."""
    try:
        cont.remove(force=True, v=True)
    except docker.errors.NotFound:
        return False
    except requests.exceptions.ConnectionError:
        return False  # the engine itself is gone (and its containers with it): the caller's error says so
    except docker.errors.APIError as e:
        if e.status_code == 409 and "already in progress" in str(e.explanation or e):
            return False
        msg = f"cannot remove container {cont.id[:12]}: {e.explanation or e}"
        raise EngineError(msg) from None
    return True


@dataclass(frozen=True)
class Swept:
    removed: int  # containers of gpuforge runs that are gone (or every one, with everything=True)
    alive: int  # kept: their run still runs
    unknown: int  # kept: owned by another host or pid namespace, or unlabelled
    networks: int = 0  # networks of gpuforge runs that are gone, removed after their containers

    def line(self) -> str:
        kept = []
        if self.alive:
            kept.append(f"{self.alive} of live runs")
        if self.unknown:
            kept.append(f"{self.unknown} of unknown owner (another host or namespace; --all removes them)")
        nets = f" and {self.networks} network(s)" if self.networks else ""
        return f"removed {self.removed} gpuforge container(s){nets}" + (f"; kept {', '.join(kept)}" if kept else "")


def sweep(*, everything: bool = False) -> Swept:
    """Remove gpuforge containers whose owning process is gone (every gpuforge container with `everything`)."""
    removed = alive = unknown = 0
    for cont in leftovers():
        state = _alive(cont.labels or {}, everything)
        if state is False:
            removed += _remove(cont)
        elif state:
            alive += 1
        else:
            unknown += 1
    return Swept(removed, alive, unknown, _sweep_networks(everything))


def _alive(labels: dict[str, Any], everything: bool) -> bool | None:
    """Whether the run that labelled a container or network still runs (False with `everything`; None: unknown)."""
    owner = labels.get(OWNER_LABEL, "")
    return False if everything else (owner_alive(owner, labels.get(BOOT_LABEL, "")) if owner else None)


def _sweep_networks(everything: bool) -> int:
    """Remove gpuforge networks whose owning process is gone (a validator's, killed before its `finally`)."""
    removed = 0
    for net in engine.client().networks.list(filters={"label": f"{engine.LABEL_OWNER}=gpuforge"}):
        if _alive(net.attrs.get("Labels") or {}, everything) is False:
            with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):  # in use: a later sweep
                net.remove()
                removed += 1
    return removed


def reap() -> int:
    """Remove gpuforge containers whose owning process is gone; returns how many."""
    return sweep().removed


def clean(run_id: str) -> int:
    """Remove the containers of one run (the caller's own, when its validators end); returns how many."""
    return sum(_remove(c) for c in leftovers(run_id))
