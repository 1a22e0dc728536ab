"""gpuforge installed as a user installs it (`pip install .[validate]`, not editable), and a run of that copy's
`validate` with its `clean` run again and again beside it.

The run's one signed validation (`validated` in conftest.py) is made this way, so one full validation carries three
claims: the default image is green and signed (test_registry.py and the modules that promote it), the installed copy
validates from the repository root (test_install.py), and a `clean` during a validate keeps the live run's containers
(test_install.py reads what each `clean` said and saw). The observations are kept here; the tests assert them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from conftest import ROOT
from gpuforge.engine import containers as run


def _env() -> dict[str, str]:
    """This process's environment as it is now, less PYTHONPATH: nothing on it may stand in for the installed copy."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def install(venv: Path) -> Path:
    """A venv at `venv` with the checkout installed (non-editable); its `gpuforge` executable."""
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    r = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", f"{ROOT}[validate]"], capture_output=True, text=True,
                       timeout=900, env=_env())
    assert r.returncode == 0, r.stderr[-3000:]
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import gpuforge; print(gpuforge.__file__)"],
                           capture_output=True, text=True, check=True, cwd=venv, env=_env()).stdout
    assert str(venv) in where, f"not the installed copy: {where}"
    return venv / "bin" / "gpuforge"


def run_installed(exe: Path, *args: str, cwd: Path | None = None, env: dict | None = None,
                  timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([str(exe), *args], cwd=cwd or ROOT, capture_output=True, text=True, timeout=timeout,
                          env={**_env(), **(env or {})})


def validate_with_clean_beside(exe: Path, args: list[str], env: dict, run_id: str, target_id: str,
                               seconds: float = 3600) -> dict:
    """`exe validate ARGS` from the repository root as run `run_id`, with `exe clean` every 3 s beside it until it
    ends (stopped with Ctrl-C after `seconds`, then killed: it holds the run's `validated` lock). Returns its exit
    status and output, and each clean's exit status, stderr, stdout and whether one of the validate's containers was
    there before and after that clean (so was live during it)."""
    env = {**_env(), **env, "GPUFORGE_RUN_ID": run_id}
    # its output to a file, read at the end: a pipe nobody reads while the loop runs would fill (64 KB) and stall it
    log = tempfile.TemporaryFile(mode="w+")
    v = subprocess.Popen([str(exe), "validate", *args], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
    cleans: list[dict] = []
    deadline = time.monotonic() + seconds
    try:
        while v.poll() is None and time.monotonic() < deadline:
            before = {c.id for c in run.leftovers(f"{run_id}-{target_id}"[:60])}
            r = run_installed(exe, "clean", timeout=300)
            # one of validate's containers there before and after this clean was there during it (one may also end
            # on its own meanwhile: the validators start and stop many)
            live = bool(before & {c.id for c in run.leftovers()})
            cleans.append({"rc": r.returncode, "stderr": r.stderr, "stdout": r.stdout, "live": live})
            time.sleep(3)
    finally:
        if v.poll() is None:
            v.send_signal(signal.SIGINT)
            try:
                v.wait(timeout=120)
            except subprocess.TimeoutExpired:
                v.kill()
                v.wait()
        log.seek(0)
        out = log.read()
        log.close()
    return {"rc": v.returncode, "out": out, "cleans": cleans}
