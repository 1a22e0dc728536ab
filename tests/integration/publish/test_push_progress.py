"""Push progress from a real push stream: a one-layer image made here (docker import of a 3 MB file) pushed
by the docker SDK to a loopback docker-registry through PushProgress, in plain mode (a CI log): a line per
finished layer with layers done of total and bytes, every event passed through, the digest at the end."""

from __future__ import annotations

import io
import os
import subprocess
import tarfile

import pytest
from registries import LocalRegistry

from gpuforge.engine import progress

pytestmark = pytest.mark.docker


def _tar(name: str, size: int) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.size = size
        tar.addfile(info, io.BytesIO(os.urandom(size)))
    return buf.getvalue()


def test_plain_push_progress_of_a_real_push(docker_engine, tmp_path, capsys):
    reg = LocalRegistry(tmp_path / "reg", None)
    repo = f"{reg.host}/gpuforge-test/progress"
    try:
        iid = subprocess.run(["docker", "import", "-", f"{repo}:1"], input=_tar("blob", 3_000_000), capture_output=True,
                             check=True).stdout.decode().strip()
        events = list(progress.PushProgress(f"{repo}:1", "plain").feed(
            docker_engine.images.push(repo, "1", stream=True, decode=True)))
        assert any((ev.get("aux") or {}).get("Digest", "").startswith("sha256:") for ev in events)
        lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith(f"gpuforge: push {repo}:1: ")]
        assert lines and lines[-1].endswith("1/1 layers done, 3.0 MB of 3.0 MB sent"), lines
        assert "pushed" in lines[-1]
        # pushed again: the layer is already there, and the line says so
        list(progress.PushProgress(f"{repo}:1", "plain").feed(docker_engine.images.push(repo, "1", stream=True, decode=True)))
        again = capsys.readouterr().out
        assert "already in the registry; 1/1 layers done" in again, again
        docker_engine.images.remove(iid, force=True)
    finally:
        reg.stop()
