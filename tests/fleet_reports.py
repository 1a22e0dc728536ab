"""GPU validation reports for fleet pools, made from REAL reports (labelled FIXTURES where a field is changed).

No Docker runs on the lent H200 machine, so `gpuforge validate --gpu` of an image cannot run there; the GPU checks
and driver facts come from the real H200 run docs/measurements/smoke-cdi-h200.json (the default image's smoke
suite on the H200 through CDI). A pool's report is that run's GPU checks merged into a real non-GPU report of the
image (its image id, validator set), stamped as `gpuforge validate --gpu` stamps it. For a pool whose GPU is not
an H200, the device name, capability and driver are changed: a FIXTURE, marked in `facts.fixture`.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

from gpuforge.image import compat
from gpuforge.validate import evidence

H200_RUN = Path(__file__).parents[1] / "docs" / "measurements" / "smoke-cdi-h200.json"

# A one-target matrix and a three-pool fleet for it (the pools the fixtures below stand for)
BASE = """\
bases:
  debian12:
    bootstrap: {suite: bookworm}
matrix:
  include:
    - {torch: "2.7.1", cuda: "12.6", python: "3.11", os: debian12, flavor: runtime, source: wheels}
default: ["os=debian12"]
"""
FLEET = """\
fleet:
  h200:
    gpu: {model: H200, capability: "9.0"}
    drivers: ["580.159.04"]
    runs_on: [self-hosted, gpu, h200]
  a100:
    gpu: {model: A100, capability: "8.0"}
    drivers: ["570.133.20", "580.159.04"]
    runs_on: [self-hosted, gpu, a100]
  l4x2:
    gpu: {model: L4, capability: "8.9"}
    drivers: ["575.57.08"]
    runs_on: [self-hosted, gpu, l4]
    gpus: 2
"""


def newer_gpu_checks_passed(checks: list[dict], h200_ids: set[str]) -> list[dict]:
    """GPU-only checks added after the H200 run (e.g. the metrics mode's) are not in it: in a fixture they are set
    to passed and say so in their message (FIXTURE), so the rest of the real run can stand for a GPU run."""
    out = []
    for c in checks:
        if c["id"] not in h200_ids and c.get("outcome") == "skipped" and "GPU checks not requested" in c.get("message", ""):
            c = {**c, "outcome": "passed", "message": "FIXTURE: a GPU check newer than the H200 run, marked passed"}
        out.append(c)
    return out


def gpu_report(base: dict, *, model: str = "H200", driver: str = "580.159.04", count: int = 1,
               started: float | None = None, required: tuple[str, ...] | None = None) -> dict:
    """A green GPU report for `base`'s image from a host with `count` GPUs of `model` on `driver`."""
    real = json.loads(H200_RUN.read_text())
    gpu_checks = {c["id"]: c for c in real["checks"]}
    rep = copy.deepcopy(base)
    rep["checks"] = newer_gpu_checks_passed([gpu_checks.get(c["id"], c) for c in base["checks"]], set(gpu_checks))
    rep["gpu"] = True
    drv = copy.deepcopy(real["facts"]["driver"])
    gpu = drv["gpus"][0]
    if model != "H200" or driver != drv["driver"] or count != len(drv["gpus"]):
        rep["facts"]["fixture"] = (f"made from {H200_RUN.name} with the model fields changed to {count} x {model}, "
                                   f"driver {driver}")
        gpu = {**gpu, "name": f"NVIDIA {model}", "capability": compat.gpu_capability(model)}
    drv["driver"] = driver
    drv["gpus"] = [{**gpu, "index": i} for i in range(count)]
    rep["facts"]["driver"] = drv
    if started is not None:
        rep["started"] = started
    req = required if required is not None else tuple(c["id"] for c in rep["checks"])
    rep["evidence"] = evidence.stamp(rep, required=req, gpu=True)
    rep["problems"] = evidence.problems(rep)
    rep["green"] = not rep["problems"]
    return rep


def base_from_h200_run() -> dict:
    """A stand-in for the non-GPU report when no image was validated (unit tests): the H200 run itself."""
    real = json.loads(H200_RUN.read_text())
    real["facts"]["image_id"] = "sha256:" + "d" * 64
    real["exit_status"] = 0
    return real
