"""The README's set-up step gives a `gpuforge` command: tools/start-engine.sh run for real (as CI runs it),
with its gpuforge venv and link folder pointed at temp folders; a second run changes nothing."""

from __future__ import annotations

import os
import subprocess

import pytest

from conftest import ROOT, need

pytestmark = pytest.mark.docker


def _setup(venv, bin_dir) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(ROOT / "tools" / "start-engine.sh")], capture_output=True, text=True, timeout=1200,
                          env={**os.environ, "GPUFORGE_SETUP_VENV": str(venv), "GPUFORGE_SETUP_BIN": str(bin_dir)})


def test_set_up_puts_gpuforge_on_path_idempotently(tmp_path, docker_engine):
    if os.geteuid() != 0:
        need("needs root: tools/start-engine.sh installs packages (CI runs it as root)")
    venv, bin_dir = tmp_path / "gpuforge", tmp_path / "bin"
    bin_dir.mkdir()
    r = _setup(venv, bin_dir)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert f"installing gpuforge's dependencies into {venv}" in r.stdout
    exe = bin_dir / "gpuforge"
    assert exe.is_symlink() and os.readlink(exe) == str(venv / "bin" / "gpuforge")
    # from another folder, with nothing of the checkout on PYTHONPATH: the command on PATH answers
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    v = subprocess.run(["gpuforge", "--version"], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert v.returncode == 0 and v.stdout.startswith("gpuforge "), v.stderr
    p = subprocess.run(["gpuforge", "--matrix", str(ROOT / "matrix.yaml"), "plan"], capture_output=True, text=True,
                       cwd=tmp_path, env=env)
    assert p.returncode == 0 and "target(s) from" in p.stdout, p.stderr
    again = _setup(venv, bin_dir)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "installing" not in again.stdout, again.stdout  # idempotent: nothing re-installed
