"""The Docker engine and clients: connect, and choose how to run BuildKit builds.

buildx (`docker buildx build --load`) when a client has the plugin; otherwise classic BuildKit
(`DOCKER_BUILDKIT=1 docker build`) through a client old enough to still have it (< 23, e.g.
Debian's docker.io 20.10). Newer clients without buildx refuse classic BuildKit builds.
"""

from __future__ import annotations

import functools
import os
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import docker.errors
from packaging.version import InvalidVersion, Version

from gpuforge.engine.drivers import DRIVERS as DRIVERS
from gpuforge.engine.drivers import Buildx as Buildx
from gpuforge.engine.drivers import Classic as Classic
from gpuforge.engine.drivers import Driver as Driver
from gpuforge.errors import EngineError

LABEL_OWNER = "io.gpuforge.owner"  # on every container gpuforge starts, so `clean` can find leftovers


def echo_cmd(argv: list[str]) -> None:
    """Print a command before it runs, so any log line can be pasted and re-run."""
    print("+ " + shlex.join(argv), flush=True)


def _host() -> str:
    return os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")


@functools.cache
def client() -> docker.DockerClient:
    try:
        c = docker.from_env(timeout=600)
        c.ping()
    except docker.errors.DockerException as e:
        msg = (f"cannot reach the Docker engine at {_host()} ({type(e).__name__}); start it "
               "(`sudo bash tools/start-engine.sh` on a bare Debian box) or set DOCKER_HOST")
        raise EngineError(msg) from None
    return c


def alive() -> bool:
    """Does the engine still answer? Asked after a failure, so an engine that died (SIGKILL, OOM, restart)
    is reported as the engine's fault (exit 3), not as the build's or the image's."""
    try:
        docker.from_env(timeout=10).ping()
    except Exception:  # a dead socket raises requests' and urllib3's errors, not only docker's
        return False
    return True


def lost(during: str) -> EngineError:
    return EngineError(f"the Docker engine at {_host()} stopped answering during {during}; "
                       "restart it (`sudo bash tools/start-engine.sh`) and run the command again")


def _clients() -> list[str]:
    seen: list[str] = []
    for d in [*os.environ.get("PATH", "").split(os.pathsep), "/usr/bin", "/usr/local/bin"]:
        p = Path(d) / "docker"
        if p.is_file() and os.access(p, os.X_OK):
            real = str(p.resolve())
            if real not in {str(Path(s).resolve()) for s in seen}:
                seen.append(str(p))
    return seen


def _version(exe: str) -> str | None:
    try:
        out = subprocess.run([exe, "version", "--format", "{{.Client.Version}}"], capture_output=True, text=True,
                             timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def _has_buildx(exe: str) -> bool:
    try:
        return subprocess.run([exe, "buildx", "version"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def choose_driver(preferred_client: str | None = None, want: str = "auto") -> Driver:
    """buildx on the first client that has it, else classic BuildKit on the first client < 23.
    `want` = buildx or classic forces that driver (classic keeps the fallback path tested)."""
    if preferred_client:
        exe = shutil.which(preferred_client) or preferred_client
        if not Path(exe).exists():
            msg = f"docker client {preferred_client!r} not found (--docker / GPUFORGE_DOCKER)"
            raise EngineError(msg)
        candidates = [exe]
    else:
        candidates = _clients()
    if not candidates:
        msg = "no docker client on PATH; install one (Debian: apt-get install docker.io)"
        raise EngineError(msg)
    versions = {c: _version(c) for c in candidates}
    if want in ("auto", "buildx"):
        for c in candidates:
            if (v := versions[c]) and _has_buildx(c):
                return Buildx(client=c, client_version=v)
    if want in ("auto", "classic"):
        for c in candidates:
            try:
                if (v := versions[c]) and Version(v.split("+")[0].split("-")[0]) < Version("23"):
                    return Classic(client=c, client_version=v)
            except InvalidVersion:
                continue
    found = ", ".join(f"{c} {versions[c] or '(broken)'}" for c in candidates)
    if want == "buildx":
        msg = (f"--driver buildx: no docker client has the buildx plugin (found: {found}); install it "
               "(`bash tools/start-engine.sh` does; Debian: docker-buildx, docker-ce: docker-buildx-plugin)")
    elif want == "classic":
        msg = f"--driver classic needs a docker client older than 23 (found: {found}); Debian's docker.io 20.10 has one"
    else:
        msg = (f"no docker client can run BuildKit builds (found: {found}): install the buildx plugin "
               "(docker-buildx-plugin) or a docker.io 20.10 client")
    raise EngineError(msg)


@dataclass(frozen=True, kw_only=True)
class EngineInfo:
    version: str
    store: str  # the image store: a graphdriver name (overlay2) or "containerd/<snapshotter>"
    arch: str = ""  # the engine's machine (`docker info` Architecture: x86_64, aarch64); "" when it did not say

    @property
    def containerd_store(self) -> bool:
        """Images live in containerd (Docker 24+ with the containerd-snapshotter feature, the default on new
        installs of 29): an image id is its manifest or index digest, and `--load` keeps BuildKit's index
        with its attestation manifests. On a graphdriver store the id is the image config's digest."""
        return self.store.startswith("containerd/")

    def describe(self) -> str:
        return f"engine {self.version}, image store {self.store}"


def engine_info() -> EngineInfo:
    info = client().info()
    status = dict(tuple(p) for p in info.get("DriverStatus") or [] if len(p) == 2)
    driver = str(info.get("Driver", "unknown"))
    store = f"containerd/{driver}" if status.get("driver-type") == "io.containerd.snapshotter.v1" else driver
    return EngineInfo(version=str(info.get("ServerVersion", "unknown")), store=store, arch=str(info.get("Architecture") or ""))


def built_image_id(iid: str, metadata: dict[str, Any] | None) -> str:
    """The engine's id of what a build loaded. BuildKit's iidfile holds the image config digest when it
    exports a single manifest, and a containerd store knows that image by its manifest digest, so the
    build's metadata (`containerimage.digest`: the descriptor the exporter stored) comes first."""
    return str((metadata or {}).get("containerimage.digest") or iid).strip()
