"""Readiness of the GPU node, level r1 or r2 (`--gpuforge-level`, default r2; needs --gpuforge-gpu): the smoke
program's `--level` facts and figures, judged here with the host toolkit's bars (gpuforge/image/data/compat.yaml's
`readiness`), one check per rule. Each failure says whom it blames (host or image): `gpuforge smoke --level` exits 10
when the host is at fault, 5 when the image is.

r1 (about a second): NVML health, driver, limits. r2 (about 10 s a GPU): r1, then each GPU's speed against its model's
floors, the fused kernel's ratio, NCCL's all-reduce over two or more GPUs. `validate --gpu` runs r2: its checks are
part of the GPU evidence a promotion needs.

XID errors live in the kernel log. A container cannot read it, so where this process runs on the GPU node itself
(gpuforge started the container, or docker://, local://) the node's own log is read here; over ssh:// the
program's reading counts. A log that cannot be read leaves the XID check not known: it passes, the report's
readiness verdict naming what is missing; with `unknown_blocks: true` in the compat data's `readiness` it fails,
blamed on no one (readiness exits 12, gpuforge 10).
"""

from __future__ import annotations

import json

import pytest

from gpuforge.image import readiness
from vutil import sh

pytestmark = pytest.mark.gpu  # chosen for GPU runs only (gpuforge.validate.selection)


def _level(config) -> str:
    return config.getoption("gpuforge_level") or "r2"


def pytest_generate_tests(metafunc):
    if "check" in metafunc.fixturenames:  # the level's checks, so `smoke --level r1` reports r1's alone
        metafunc.parametrize("check", readiness.LEVELS[_level(metafunc.config)])


@pytest.fixture(scope="module")
def ready(request, host, host_spec, programs, facts, target) -> dict[str, readiness.Finding]:
    level = _level(request.config)
    asked = request.config.getoption("gpuforge_gpus")
    count = int(asked) if asked and asked.isdigit() else None
    bars = readiness.bars()
    busbw = request.config.getoption("gpuforge_min_busbw")
    if busbw is not None:  # the runner's own all-reduce floor, for every model (the key "" matches any name)
        bars["busbw_floor_gbs"] = {"": busbw}
    # r2's multi-GPU part may take up to its own 900 s (multi_gpu.py); r1 is a second
    r = sh(host, f"python3 %s --level {level} --cuda %s --bars %s" + (f" --gpus {count}" if count is not None else ""),
           f"{programs}/gpu_smoke.py", target.cuda, json.dumps(bars), timeout=1200 if level == "r2" else 120,
           check=False)
    try:
        printed = json.loads(r.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        pytest.fail(f"the smoke program printed no {level} report (exit {r.rc}): {(r.stderr or r.stdout)[-3000:]}")
    if "probe" in printed:  # the probe crashed or was stopped: its facts are not given, and never judged fit
        pytest.fail(f"the {level} probe did not finish cleanly (exit {r.rc}): {printed['verdict']}")
    got = printed.get("facts")
    if not isinstance(got, dict):
        pytest.fail(f"the smoke program printed no {level} facts (exit {r.rc}): {(r.stderr or r.stdout)[-3000:]}")
    if not (host_spec or "").startswith("ssh://"):  # this process runs on the node: its kernel log is the node's
        got["xid"] = readiness.xid()
    found = readiness.judge_level(got, level, request=count, image_cuda=target.cuda, bars=bars)
    facts["readiness"] = readiness.report(got, found, level)
    return {f.check: f for f in found}


def test_node_ready(ready, check):
    f = ready[check]
    if f.unknown:  # could not look: passes unless the bars make an unknown block
        assert f.ok, f"{check} NOT KNOWN, and unknowns block here (unknown_blocks): {f.reason}"
        return
    assert f.ok, f"{check} FAILED, blamed on the {f.blame}: {f.reason} (measured: {f.figure})"
