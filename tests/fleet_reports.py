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
from gpuforge.validate import evidence, selection

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


# BASE's one target validated with --gpu: what the GPU checks are chosen for
KIND = selection.Kind("runtime", "wheels", gpu=True)


def _typed(c: dict) -> dict:
    """The H200 run was recorded before a skip carried its typed reason: its one-GPU skips of the collectives are
    given theirs (selection.EnvSkip.ONE_GPU), as the validators now raise them."""
    if c.get("outcome") == "skipped" and (c.get("message") or "").startswith("Skipped: world size 1:"):
        return {**c, "skip": selection.EnvSkip.ONE_GPU.value}
    return c


# The same target validated without GPUs: what a dev (non-GPU) run is chosen for
NON_GPU_KIND = selection.Kind("runtime", "wheels", gpu=False)


def non_gpu(rep: dict) -> dict:
    """`rep` as a non-GPU run of the same image reports it: the checks that apply only with GPUs (and their one-GPU
    skips) are not chosen for it, so they are left out of its checks and its required set, as validate does."""
    marked = evidence.collected()
    keep = [c for c in rep["checks"]
            if c["id"] not in marked or selection.not_applicable(marked[c["id"]], NON_GPU_KIND) is None]
    out = copy.deepcopy(rep)
    out["checks"] = copy.deepcopy(keep)
    out["gpu"] = False
    out.setdefault("selection", {})["kind"] = NON_GPU_KIND.as_dict()
    ev = out.get("evidence")
    if ev:
        ids = {c["id"] for c in keep}
        ev.update(required=[i for i in ev["required"] if i in ids], gpu_required=False)
        ev.pop("gpu_host", None)
        if "kind" in ev:
            ev["kind"] = NON_GPU_KIND.as_dict()
    return out


def gpu_checks(base_checks: list[dict], required: tuple[str, ...] | None = None) -> list[dict]:
    """`base_checks` with the real H200 run's GPU checks in their place and beside them, kept to what applies to a GPU
    run of KIND (and to `required` when given). A required GPU check newer than the H200 run is not in it: it is set
    to passed and says so in its message (FIXTURE), so the rest of the real run can stand for a GPU run."""
    real = {c["id"]: _typed(c) for c in json.loads(H200_RUN.read_text())["checks"]}
    marked = evidence.collected()
    out = {c["id"]: real.get(c["id"], c) for c in base_checks}
    out.update({i: c for i, c in real.items() if i not in out})
    for i in required or ():
        if i not in out:
            module, name = i.split("::", 1)
            out[i] = {"id": i, "module": module.removesuffix(".py"), "name": name, "outcome": "passed", "seconds": 0,
                      "message": "FIXTURE: a GPU check newer than the H200 run, marked passed"}
    return [c for i, c in out.items() if (i not in marked or selection.not_applicable(marked[i], KIND) is None)
            and (required is None or i in required)]


def gpu_report(base: dict, *, model: str = "H200", driver: str = "580.159.04", count: int = 1,
               started: float | None = None, required: tuple[str, ...] | None = None) -> dict:
    """A green GPU report for `base`'s image from a host with `count` GPUs of `model` on `driver`."""
    real = json.loads(H200_RUN.read_text())
    rep = copy.deepcopy(base)
    rep["checks"] = gpu_checks(base["checks"], required)
    rep["gpu"] = True
    sel = rep.setdefault("selection", {})
    ran = {c["id"] for c in rep["checks"]}
    sel.update(kind=KIND.as_dict(), not_applicable=[n for n in sel.get("not_applicable", []) if n["id"] not in ran])
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
    real["checks"] = gpu_checks([])  # those that apply to KIND, the one-GPU skips typed
    real["facts"]["image_id"] = "sha256:" + "d" * 64
    real["exit_status"] = 0
    return real
