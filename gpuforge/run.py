"""Container lifecycle: every container gpuforge starts goes through `container()` and is removed
on success, failure and Ctrl-C. Each is labelled as gpuforge's (and with its run id), so `clean()`
can remove what a crashed run left behind. Ports are published on 127.0.0.1 only.
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

import docker
import docker.errors
import docker.types

from gpuforge import engine
from gpuforge.errors import EngineError

RUN_LABEL = "io.gpuforge.run"
RUN_ID = os.environ.get("GPUFORGE_RUN_ID") or uuid.uuid4().hex[:12]


@dataclass
class Running:
    """A started container: its id, published ports and logs."""

    container: docker.models.containers.Container

    @property
    def id(self) -> str:
        return self.container.id

    def port(self, inside: int) -> int:
        self.container.reload()
        bound = (self.container.attrs["NetworkSettings"]["Ports"] or {}).get(f"{inside}/tcp")
        if not bound:
            msg = f"container {self.id[:12]} publishes no port {inside}"
            raise EngineError(msg)
        return int(bound[0]["HostPort"])

    def logs(self) -> str:
        return self.container.logs().decode(errors="replace")

    def status(self) -> str:
        self.container.reload()
        return self.container.status

    def wait_for_log(self, pattern: str, timeout: float = 60) -> re.Match:
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
              gpus: bool = False, shm_size: str | None = None, volumes: dict | None = None,
              sysctls: dict | None = None) -> Iterator[Running]:
    """Start `image` detached; always remove it afterwards.

    `ports` maps container port -> host port on 127.0.0.1 (None: any free port).
    `gpus=True` is `--gpus all` (the docker SDK's GPU device request).
    """
    c = engine.client()
    kwargs: dict = {
        "detach": True,
        "labels": {engine.LABEL_OWNER: "gpuforge", RUN_LABEL: RUN_ID, OWNER_LABEL: _owner()},
        "environment": env or {},
        "ports": {f"{p}/tcp": ("127.0.0.1", h) for p, h in (ports or {}).items()},
    }
    if user is not None:
        kwargs["user"] = user
    if gpus:
        kwargs["device_requests"] = [docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])]
    if shm_size:
        kwargs["shm_size"] = shm_size
    if volumes:
        kwargs["volumes"] = volumes
    if sysctls:
        kwargs["sysctls"] = sysctls
    try:
        cont = c.containers.create(image, command, **kwargs)
    except docker.errors.ImageNotFound:
        msg = f"image {image} is not in the engine; run `gpuforge build` first"
        raise EngineError(msg) from None
    except docker.errors.APIError as e:
        msg = f"cannot create a container of {image}: {e.explanation or e}"
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
            if gpus and ("could not select device driver" in text or "nvidia" in text.lower()):
                msg = f"cannot start {image} with --gpus all: {text} (install nvidia-container-toolkit on this runner)"
                raise EngineError(msg) from None
            msg = f"cannot start a container of {image}: {text}"
            raise EngineError(msg) from None
        yield Running(cont)
    finally:
        with contextlib.suppress(docker.errors.NotFound):
            cont.remove(force=True, v=True)


# "<host>:<pid>:<start time>" of the process that started a container: a later run reaps it once that
# process is gone (SIGKILL, OOM, a crashed runner), without touching containers of runs still alive.
OWNER_LABEL = "io.gpuforge.process"


def _started(pid: int) -> str:
    """The process's start time in clock ticks since boot ('' when there is no such process): with the pid
    it names one process, even after the pid is reused."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def _owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{_started(os.getpid())}"


def owner_alive(owner: str) -> bool:
    host, _, rest = owner.partition(":")
    pid, _, started = rest.partition(":")
    if host != socket.gethostname() or not pid.isdigit() or not started:
        return True  # another machine's (or an unlabelled) run: not ours to judge
    return _started(int(pid)) == started


def reap() -> int:
    """Remove gpuforge containers whose owning process is gone; returns how many."""
    n = 0
    for cont in leftovers():
        owner = (cont.labels or {}).get(OWNER_LABEL)
        if owner and not owner_alive(owner):
            with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
                cont.remove(force=True, v=True)
                n += 1
    return n


def leftovers(run_id: str | None = None) -> list:
    label = f"{RUN_LABEL}={run_id}" if run_id else f"{engine.LABEL_OWNER}=gpuforge"
    return engine.client().containers.list(all=True, filters={"label": label})


def clean(run_id: str | None = None) -> int:
    """Remove gpuforge's containers (of one run, or all); returns how many."""
    n = 0
    for cont in leftovers(run_id):
        with contextlib.suppress(docker.errors.NotFound):
            cont.remove(force=True, v=True)
            n += 1
    return n
