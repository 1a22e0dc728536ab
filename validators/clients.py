"""Real clients for the user-journey validators: OpenSSH (with a pty, tunnels), HTTP waits, tiny wheels.

OpenSSH is the client people use (`ssh -tt`, `ssh -L`, `ssh -W`), so the journeys go through it, not paramiko.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import re
import shutil
import socket
import subprocess
import tempfile
import time
import zipfile
from pathlib import Path

import pytest
import requests

VENV = "/opt/venv"  # where gpuforge's template installs the image's Python (gpuforge/render/templates/Dockerfile.j2)
SSH_OPTS = ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "IdentitiesOnly=yes",
            "-o", "BatchMode=yes", "-o", "LogLevel=ERROR", "-o", "ConnectTimeout=20"]


def openssh() -> str:
    exe = shutil.which("ssh")
    if not exe:
        pytest.fail("no OpenSSH client (ssh) on this machine: install openssh-client (tools/start-engine.sh does)")
    return exe


def key_file(ssh_server, tmp_dir: Path) -> Path:
    """The fixture's key written for OpenSSH (0600)."""
    path = tmp_dir / "id_rsa"
    if not path.exists():
        ssh_server.key.write_private_key_file(str(path))
        path.chmod(0o600)
    return path


def ssh_argv(ssh_server, key: Path, *args: str) -> list[str]:
    return [openssh(), *SSH_OPTS, "-i", str(key), "-p", str(ssh_server.port), *args, f"{ssh_server.user}@127.0.0.1"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, *, timeout: float = 90, ok=(200,), headers: dict | None = None, running=None,
              refused=None) -> requests.Response:
    """GET url until it answers with a status in `ok`; fail with what was seen (and the container's logs). `refused`,
    when given, says why no answer can come (or None): it fails at once instead of at the timeout."""
    deadline = time.monotonic() + timeout
    last = "no answer"
    while True:
        try:
            r = requests.get(url, headers=headers or {}, timeout=5, allow_redirects=False)
            if r.status_code in ok:
                return r
            last = f"HTTP {r.status_code}"
        except requests.RequestException as e:
            last = type(e).__name__
        why = refused() if refused is not None else None
        if why:
            pytest.fail(f"{url} cannot answer ({last}): {why}")
        if running is not None and running.status() == "exited":
            pytest.fail(f"the container exited before {url} answered ({last}); logs:\n{running.logs()[-2500:]}")
        if time.monotonic() > deadline:
            logs = f"; logs:\n{running.logs()[-2500:]}" if running is not None else ""
            pytest.fail(f"{url} did not answer {ok} within {timeout:.0f} s (last: {last}){logs}")
        time.sleep(0.2)  # a Jupyter start is ~2 s: a coarser poll adds its half to every start waited on


def answered(url: str, seconds: float, *, headers: dict | None = None, alive=None) -> int | None:
    """The HTTP status `url` first answered within `seconds`, or None (no answer, or `alive()` turned false: the
    server's process ended). For a check that says itself what no answer means; wait_http fails instead."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and (alive is None or alive()):
        with contextlib.suppress(requests.RequestException):
            return requests.get(url, headers=headers, timeout=3).status_code
        time.sleep(0.2)
    return None


class Tunnel:
    """A running `ssh -N -L` and what it has said on stderr so far."""

    def __init__(self, proc: subprocess.Popen, err):
        self.proc, self._err = proc, err

    def said(self) -> str:
        self._err.seek(0)
        return self._err.read()

    def refused(self) -> str | None:
        """sshd's refusal of the forward (AllowTcpForwarding, PermitOpen), which no retry changes; else None."""
        return next((x for x in self.said().splitlines() if "administratively prohibited" in x), None)


@contextlib.contextmanager
def tunnel(argv: list[str], local_port: int, timeout: float = 30):
    """An `ssh -N -L` process, up when its local port accepts; always ended."""
    err = tempfile.TemporaryFile(mode="w+")  # a file, not a pipe: read while ssh runs, and it never fills up
    # ssh logs a refused channel ("open failed: administratively prohibited") at INFO; the first -o LogLevel wins
    argv = [argv[0], "-o", "LogLevel=INFO", *argv[1:]]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, text=True)
    try:
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", local_port), timeout=1):
                break
            if proc.poll() is not None:
                pytest.fail(f"ssh -L exited {proc.returncode}: {Tunnel(proc, err).said()[-1500:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"ssh -L did not listen on 127.0.0.1:{local_port} within {timeout:.0f} s")
            time.sleep(0.2)
        yield Tunnel(proc, err)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        err.close()


def simple_index(out_dir: Path, wheels: list[Path]) -> None:
    """A PEP 503 simple index of `wheels` under out_dir/simple/ (links carry the sha256, as PyPI's do)."""
    by_name: dict[str, list[Path]] = {}
    for w in wheels:
        by_name.setdefault(re.sub(r"[-_.]+", "-", w.name.split("-", 1)[0]).lower(), []).append(w)
    root = out_dir / "simple"
    root.mkdir(mode=0o755, exist_ok=True)
    (root / "index.html").write_text("".join(f'<a href="{n}/">{n}</a>\n' for n in sorted(by_name)))
    for n, ws in by_name.items():
        (root / n).mkdir(mode=0o755, exist_ok=True)
        links = "".join(f'<a href="../../{w.name}#sha256={hashlib.sha256(w.read_bytes()).hexdigest()}">{w.name}</a>\n'
                        for w in ws)
        (root / n / "index.html").write_text(f"<!DOCTYPE html><html><body>\n{links}</body></html>\n")
    for f in root.rglob("*"):
        f.chmod(0o755 if f.is_dir() else 0o644)


def wheel(out_dir: Path, name: str, version: str, requires: tuple[str, ...] = (), body: str = "") -> Path:
    """A pure-Python wheel made here (no index, no build backend): METADATA, WHEEL, RECORD and one module."""
    dist = f"{name}-{version}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(f"Requires-Dist: {r}\n" for r in requires)
    files = {f"{name}/__init__.py": (body or f"VERSION = {version!r}\n").encode(), f"{dist}/METADATA": meta.encode(),
             f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: gpuforge-validators\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    path = out_dir / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        record = []
        for arc, data in files.items():
            z.writestr(arc, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{arc},sha256={digest},{len(data)}")
        z.writestr(f"{dist}/RECORD", "\n".join([*record, f"{dist}/RECORD,,"]) + "\n")
    path.chmod(0o644)
    return path
