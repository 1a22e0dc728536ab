"""Every CLI error path that needs no engine (or a dead one) is ONE line on stderr with its documented exit
code (gpuforge/errors.py, listed in --help and README.md). Engine-needing rows (smoke --image without an
NVIDIA runtime, a non-gpuforge image, the engine lost mid-build, clean next to a live run) are in
tests/integration/core/test_cli_errors_engine.py."""

from __future__ import annotations

import glob
import json
import shutil

import pytest

from conftest import dead_runs_window, gpuforge
from gpuforge.errors import exit_codes

DEAD = {"DOCKER_HOST": "unix:///nonexistent/gpuforge-dead.sock"}
DOCUMENTED = {c for c, _ in exit_codes()}

# (id, args, env, state: builds.json text or None, exit code, words in the one line)
ROWS = [
    ("matrix missing", ["--matrix", "/nonexistent/matrix.yaml", "plan"], {}, None, 2, "matrix.yaml"),
    ("selector matches nothing", ["plan", "cuda=99.9"], {}, None, 2, "cuda=99.9"),
    ("bad gpu request", ["smoke", "--image", "x", "--gpu-request", "bogus"], {}, None, 2, "not a GPU request mode"),
    ("smoke: host and image", ["smoke", "local://", "--image", "x:1"], {}, None, 2, "either HOST"),
    ("not built", ["validate"], {}, None, 8, "has not been built"),
    ("truncated record", ["validate"], {}, '{"pt271": {"image_id": "sha', 8, "builds.json: not valid JSON"),
    ("validators pointed elsewhere", ["validate", "--pytest-args=--gpuforge-image=debian:12"], {}, None, 2,
     "may not set --gpuforge-image"),
    ("unknown option", ["build", "--no-such-option"], {}, None, 2, "unrecognized arguments: --no-such-option"),
    ("bad choice", ["promote", "--env", "staging"], {}, None, 2, "--env: 'staging' is not a promotion environment"),
    ("bad progress env", ["validate"], {"GPUFORGE_PROGRESS": "fancy"}, None, 2, "GPUFORGE_PROGRESS: 'fancy' is not a progress style"),
    ("engine gone: clean", ["clean"], DEAD, None, 3, "cannot reach the Docker engine"),
    ("engine gone: build", ["build", "--progress", "plain"], DEAD, None, 3, "cannot reach the Docker engine"),
    ("engine gone: push", ["push"], DEAD, "RECORD", 3, "cannot reach the Docker engine"),
    ("engine gone: smoke --image", ["smoke", "--image", "x:1"], DEAD, None, 3, "cannot reach the Docker engine"),
]


def _one_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}:\n{stderr[-3000:]}"
    assert lines[0].startswith("gpuforge: error: ") and "Traceback" not in stderr
    return lines[0]


@pytest.mark.parametrize(("args", "env", "state", "code", "words"), [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_error_is_one_line_with_its_documented_code(args, env, state, code, words, tmp_path):
    assert code in DOCUMENTED
    if state == "RECORD":  # a target that was built, so push gets as far as the engine
        from gpuforge.plan.matrix import load_matrix

        t = load_matrix().select(None)[0]
        state = json.dumps({t.id: {"image_id": "sha256:" + "0" * 64, "tags": list(t.tags)}})
    if state is not None:
        (tmp_path / "builds.json").write_text(state)
    with dead_runs_window(leaves_them=False):  # build and validate reap first: never another test's killed run
        r = gpuforge(*args, env={"GPUFORGE_STATE_DIR": str(tmp_path), **env}, timeout=300)
    line = _one_line(r.stderr)
    assert r.returncode == code, f"exit {r.returncode}, documented {code}: {line}"
    assert words in line


def test_smoke_local_without_a_gpu_is_one_line_exit_3(tmp_path):
    if glob.glob("/dev/nvidia[0-9]*") and shutil.which("nvidia-smi"):
        pytest.skip("this machine has an NVIDIA GPU: smoke local:// runs for real here (tools/gpu_run.sh)")
    r = gpuforge("smoke", "local://", "--reports", str(tmp_path), env={"GPUFORGE_STATE_DIR": str(tmp_path)})
    line = _one_line(r.stderr)
    assert r.returncode == 3 and "no NVIDIA GPU" in line
    assert not (tmp_path / "smoke").exists(), "pytest must not have started"
