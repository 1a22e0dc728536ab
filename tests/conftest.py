"""Shared fixtures. Tests that need the engine use `docker_engine`: skipped (with the reason) when no
engine answers, FAILED instead when GPUFORGE_REQUIRE_DOCKER=1 (CI sets it)."""

from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
REQUIRE = os.environ.get("GPUFORGE_REQUIRE_DOCKER") == "1"

BASE_MATRIX = """\
registry: 127.0.0.1:5000
repository: gpuforge/pytorch
bases:
  debian12:
    bootstrap: {suite: bookworm}
matrix:
  torch: ["2.7.1"]
  cuda: ["12.6", "12.8"]
  python: ["3.12"]
  os: [ubuntu24.04]
  flavor: [runtime, devel]
  source: [cuda-base]
default: ["cuda=12.6 flavor=runtime"]
"""


@pytest.fixture
def write_matrix(tmp_path):
    """Write a matrix file (dedented) and return its path."""
    def _write(text: str, name: str = "matrix.yaml") -> Path:
        p = tmp_path / name
        p.write_text(textwrap.dedent(text))
        return p
    return _write


def need_engine(what: str = "a Docker engine"):
    msg = f"needs {what}: none answers (start one with `bash scripts/start-engine.sh`)"
    if REQUIRE:
        pytest.fail(f"GPUFORGE_REQUIRE_DOCKER=1 but {msg}")
    pytest.skip(msg)


@pytest.fixture(scope="session")
def docker_engine():
    from gpuforge import engine
    from gpuforge.errors import EngineError

    try:
        return engine.client()
    except EngineError:
        need_engine()


def gpuforge(*args: str, env: dict | None = None, cwd: Path = ROOT, timeout: int = 3600) -> subprocess.CompletedProcess:
    """Run the real CLI in a subprocess."""
    return subprocess.run(["python", "-m", "gpuforge", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})
