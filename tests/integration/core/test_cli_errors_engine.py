"""The CLI error paths that need the real engine, each ONE line on stderr with its documented exit code
(the engine-free rows are tests/unit/core/test_cli_errors.py):

- smoke --image on an engine without the NVIDIA runtime (this machine's): exit 3, before pytest starts;
- validate of an image that is not a gpuforge image (the bootstrapped base, as a hand-written record): exit 2;
- the engine SIGKILLed in the middle of a build (a private second dockerd): exit 3, not 4 with an rpc line;
- `build --compression-level` on a graphdriver engine (this machine's 20.10), which keeps no compressed layers: exit 2,
  before any step runs (the engine matrix builds with it on the containerd store).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from second_engine import SecondEngine, StartError

from conftest import ROOT, dead_runs_window, gpuforge, need
from gpuforge.builder import bases
from gpuforge.plan.matrix import load_matrix

pytestmark = pytest.mark.docker


def _one_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}:\n{stderr[-3000:]}"
    assert lines[0].startswith("gpuforge: error: ") and "Traceback" not in stderr
    return lines[0]


@pytest.fixture(scope="module")
def base_image(docker_engine):
    """The default target's base (bootstrapped once, ~30 s): an image that is not a gpuforge image."""
    t = load_matrix().select(None)[0]
    bases.ensure_base(t, log=lambda *_: None)
    return t, docker_engine.images.get(t.base_image)


def test_smoke_image_without_the_nvidia_runtime_is_one_line_exit_3(docker_engine, base_image, tmp_path):
    if "nvidia" in (docker_engine.info().get("Runtimes") or {}):
        pytest.skip("this engine has the NVIDIA runtime: smoke --image runs for real here")
    _, img = base_image
    r = gpuforge("smoke", "--image", img.id, "--reports", str(tmp_path), timeout=300)
    line = _one_line(r.stderr)
    assert r.returncode == 3, line
    assert "no NVIDIA container runtime" in line and "nvidia-container-toolkit" in line
    assert not (tmp_path / "smoke").exists(), "pytest must not have started"
    r = gpuforge("smoke", "--image", img.id, "--gpu-request", "cdi", "--reports", str(tmp_path), timeout=300)
    line = _one_line(r.stderr)
    assert r.returncode == 3 and "CDI" in line, line


def test_validate_of_an_image_that_is_not_a_gpuforge_image_is_one_refusal(base_image, tmp_path):
    t, img = base_image
    state = tmp_path / "state"
    state.mkdir()
    (state / "builds.json").write_text(json.dumps({t.id: {"image_id": img.id, "tags": list(t.tags)}}))
    t0 = time.monotonic()
    with dead_runs_window(leaves_them=False):  # validate reaps first: never another test's killed run
        r = gpuforge("validate", "--reports", str(tmp_path / "reports"), env={"GPUFORGE_STATE_DIR": str(state)},
                     timeout=300)
    line = _one_line(r.stderr)
    assert r.returncode == 2, line
    assert f"{t.id}: image {img.id[:19]} is not a gpuforge image (no io.gpuforge.target label)" in line
    assert not (tmp_path / "reports" / t.id / "report.json").exists()
    assert "passed" not in r.stdout and time.monotonic() - t0 < 60  # refused before any check ran


def _containerd_pids(root: Path) -> list[int]:
    """Processes (dockerd's own containerd, shims) whose command line names the private engine's folder."""
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if str(root).encode() in (d / "cmdline").read_bytes():
                    pids.append(int(d.name))
            except OSError:
                continue
    return pids


def test_a_gzip_level_on_a_graphdriver_engine_is_refused_before_the_build(docker_engine, tmp_path):
    r = gpuforge("build", "--compression-level", "1", env={"GPUFORGE_STATE_DIR": str(tmp_path / "state"),
                                                            "GPUFORGE_LOG_DIR": str(tmp_path / "logs")}, timeout=120)
    line = _one_line(r.stderr)
    assert r.returncode == 2, (r.returncode, r.stdout[-2000:], r.stderr)
    assert "--compression-level 1 needs an engine with the containerd image store" in line
    assert "image store overlay2" in line, line
    assert not (tmp_path / "logs").exists(), "a build step ran"


def test_engine_killed_mid_build_is_exit_3_one_line(docker_engine, base_image, tmp_path):
    if not (shutil.which("dockerd") and shutil.which("ip")):
        need("needs dockerd and ip (a private second engine to kill)")
    t, _ = base_image
    try:
        eng = SecondEngine(prefix="gf18-")
    except (StartError, subprocess.CalledProcessError) as e:
        pytest.fail(f"second engine: {e}")
    try:
        eng.load(t.base_image)  # the build starts at once (no bootstrap) and then runs for minutes
        env = {**os.environ, "DOCKER_HOST": eng.host, "GPUFORGE_STATE_DIR": str(tmp_path / "state"),
               "GPUFORGE_LOG_DIR": str(tmp_path / "logs")}
        proc = subprocess.Popen([sys.executable, "-m", "gpuforge", "build", "--progress", "plain"], cwd=ROOT, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        seen = []
        for line in proc.stdout:  # the build is under way once BuildKit prints its first step
            seen.append(line)
            if line.startswith(f"[{t.id}] #"):
                break
        else:
            pytest.fail(f"the build never started:\n{''.join(seen)[-3000:]}\n{proc.stderr.read()[-2000:]}")
        time.sleep(3)
        eng.proc.send_signal(signal.SIGKILL)  # the engine dies mid-build (its containerd is stopped below)
        out, err = proc.communicate(timeout=300)
        line = _one_line(err)
        assert proc.returncode == 3, f"exit {proc.returncode}: {line}"
        assert "stopped answering during the build of" in line and t.id in line
        assert not (tmp_path / "state" / "builds.json").exists() or t.id not in (tmp_path / "state" / "builds.json").read_text()
    finally:
        for pid in _containerd_pids(eng.d):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        eng.stop()
