"""Readiness level r1 of the GPU node (`gpuforge smoke --level r1`; needs --gpuforge-gpu): the smoke program's
`--level r1` facts, judged here with the host toolkit's bars (gpuforge/image/data/compat.yaml's `readiness`), one
check per rule. Each failure says whom it blames (host or image): gpuforge exits 10 when the host is at fault.

XID errors live in the kernel log. A container cannot read it, so where this process runs on the GPU node itself
(gpuforge started the container, or docker://, local://) the node's own log is read here; over ssh:// the
program's reading counts. A log that cannot be read fails the check, saying so (DCGM counts a test that could not
run as a failure).

Named outside test_*.py on purpose: r1 is a level of its own, run only by `smoke --level r1`, and not (yet) one of
the checks a validation's evidence must hold (gpuforge.validate.evidence.required_checks collects test_*.py). It
joins the GPU evidence once it has been measured on the H200 with the shipped image (#29).
"""

from __future__ import annotations

import json

import pytest

from gpuforge.image import readiness
from vutil import sh


@pytest.fixture(scope="module")
def r1(request, host, host_spec, programs, gpu, facts, target) -> dict[str, readiness.Finding]:
    if not gpu:
        pytest.skip("GPU checks not requested (pass --gpu / --gpuforge-gpu on a GPU runner)")
    asked = request.config.getoption("gpuforge_gpus")
    count = int(asked) if asked and asked.isdigit() else None
    bars = readiness.bars()
    r = sh(host, "python3 %s --level r1 --cuda %s --bars %s" + (f" --gpus {count}" if count is not None else ""),
           f"{programs}/gpu_smoke.py", target.cuda, json.dumps(bars), timeout=120, check=False)
    try:
        got = json.loads(r.stdout.strip().splitlines()[-1])["facts"]
    except (IndexError, KeyError, json.JSONDecodeError):
        pytest.fail(f"the smoke program printed no r1 report (exit {r.rc}): {(r.stderr or r.stdout)[-3000:]}")
    if not (host_spec or "").startswith("ssh://"):  # this process runs on the node: its kernel log is the node's
        got["xid"] = readiness.xid()
    found = readiness.judge(got, request=count, image_cuda=target.cuda, bars=bars)
    facts["readiness_r1"] = readiness.report(got, found)
    return {f.check: f for f in found}


@pytest.mark.parametrize("check", readiness.CHECKS)
def test_node_ready_r1(r1, check):
    f = r1[check]
    assert f.ok, f"{check} FAILED, blamed on the {f.blame}: {f.reason} (measured: {f.figure})"
