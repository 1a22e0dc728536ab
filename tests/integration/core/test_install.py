"""A normal (non-editable) install works from the repository root: paths come from package data and the
checkout is found once (gpuforge.paths), not by `Path(__file__).parent.parent` arithmetic."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import ROOT

pytestmark = pytest.mark.docker
# The installed copy only: nothing on PYTHONPATH may stand in for it.
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    r = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", f"{ROOT}[validate]"], capture_output=True, text=True,
                       timeout=900, env=ENV)
    assert r.returncode == 0, r.stderr[-3000:]
    exe = venv / "bin" / "gpuforge"
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import gpuforge; print(gpuforge.__file__)"],
                           capture_output=True, text=True, check=True, cwd=venv, env=ENV).stdout
    assert str(venv) in where, f"not the installed copy: {where}"
    return exe


def _run(exe, *args, cwd=ROOT, timeout=600):
    return subprocess.run([str(exe), *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=ENV)


def test_plan_and_generate_check_from_the_repo_root(installed):
    r = _run(installed, "plan", "--json")
    assert r.returncode == 0, r.stderr
    assert '"default": true' in r.stdout
    r = _run(installed, "generate", "--check")
    assert r.returncode == 0, r.stderr
    assert "up to date" in r.stdout


def test_outside_a_checkout_is_one_clear_error(installed, tmp_path):
    r = _run(installed, "plan", cwd=tmp_path)
    assert r.returncode == 2 and "matrix.yaml" in r.stderr and "Traceback" not in r.stderr
    (tmp_path / "matrix.yaml").write_text((ROOT / "matrix.yaml").read_text())
    r = _run(installed, "generate", "--check", cwd=tmp_path)
    assert r.returncode == 2 and "no gpuforge checkout" in r.stderr and "Traceback" not in r.stderr


def test_validate_from_the_repo_root(installed, default_build, tmp_path):
    r = _run(installed, "validate", "--reports", str(tmp_path), timeout=1200)
    assert r.returncode == 0, f"{r.stdout[-3000:]}\n{r.stderr[-2000:]}"
    t, _ = default_build
    assert (tmp_path / t.id / "report.json").is_file()
