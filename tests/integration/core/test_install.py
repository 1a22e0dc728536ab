"""A normal (non-editable) install works from the repository root: paths come from package data and the
checkout is found once (gpuforge.paths), not by `Path(__file__).parent.parent` arithmetic. The installed copy's full
validate also carries test_clean.py's claim that a validate stays green with `clean` run beside it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import ROOT
from gpuforge.engine import containers as run

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


def test_validate_from_the_repo_root_stays_green_with_clean_run_beside_it(installed, default_build, tmp_path):
    """The installed copy's full `validate` from the repo root, with the installed copy's `clean` run again and again
    beside it (#18: a clean during a validate once removed its containers, 20 false failures): a live run's
    containers are kept, and the validation ends green. One full validation proves both (test_clean.py's subject)."""
    t, _ = default_build
    env = {**ENV, "GPUFORGE_RUN_ID": f"clean18-{os.getpid()}"}
    v = subprocess.Popen([str(installed), "validate", "--reports", str(tmp_path), "--progress", "plain"], cwd=ROOT,
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    cleans, kept_live = 0, 0
    try:
        while v.poll() is None:
            before = {c.id for c in run.leftovers(f"{env['GPUFORGE_RUN_ID']}-{t.id}"[:60])}
            r = _run(installed, "clean", timeout=300)
            assert r.returncode == 0 and r.stderr == "", r.stderr
            [line] = r.stdout.splitlines()
            assert line.startswith("removed "), line
            cleans += 1
            # one of validate's containers there before and after this clean was there during it: kept as live
            # (one may also end on its own meanwhile: the validators start and stop many)
            if before & {c.id for c in run.leftovers()}:
                assert "of live runs" in line, line
                kept_live += 1
            time.sleep(3)
        out = v.stdout.read()
    finally:
        if v.poll() is None:
            v.send_signal(signal.SIGINT)
            v.wait(timeout=120)
    assert v.returncode == 0, out[-5000:]
    assert kept_live >= 3, f"clean ran {cleans} times but only {kept_live} while validate had containers"
    rep = json.loads((tmp_path / t.id / "report.json").read_text())
    assert rep["green"], rep.get("problems")
    assert "[" in out and "/" in out and "check(s) collected" in out  # plain progress: checks done of total
