"""report.md is written for a person: the verdict, what image on which host by which gpuforge when, what was
proven by concern in words, what skipped and why (counted), what was not checked. Parsed field by field
from real-shaped reports: the H200 GPU run in docs/measurements and a non-GPU run made from it."""

from __future__ import annotations

import copy
import json
import re

import pytest
from fleet_reports import KIND, gpu_checks
from report_md import parse

from gpuforge import __version__, paths
from gpuforge.validate import report, selection

H200 = paths.project_root() / "docs" / "measurements" / "smoke-cdi-h200.json"
NO_GPU = selection.Kind("runtime", "wheels", gpu=False)


def _gpu_report() -> dict:
    """The H200 run, kept to the checks that apply to its image's kind (runtime from wheels, with GPUs)."""
    raw = json.loads(H200.read_text())
    raw["facts"]["image_id"] = "sha256:" + "d" * 64
    raw["checks"] = gpu_checks([])
    required = tuple(c["id"] for c in raw["checks"])
    return report.finish(raw, required=required, gpu=True, revision="0123abc", kind=KIND)


def _no_gpu_report() -> dict:
    """The same image as a build host without a GPU validates it: the GPU checks are not applicable, never run."""
    raw = json.loads(H200.read_text())
    raw["gpu"] = False
    raw["facts"] = {k: v for k, v in raw["facts"].items() if k not in ("driver", "gpu_count", "gpu_smoke")}
    raw["facts"]["image_id"] = "sha256:" + "e" * 64
    why = selection.not_applicable({"gpu": ()}, NO_GPU)
    raw["selection"] = {"narrowed": False, "kind": NO_GPU.as_dict(),
                        "not_applicable": [{"id": c["id"], "why": why} for c in raw["checks"] if c["module"] != "test_driver"]}
    no_driver = selection.EnvSkip.NO_DRIVER
    raw["checks"] = [{**c, "outcome": "skipped", "message": f"Skipped: {no_driver.describe} (no libnvidia-ml)",
                      "skip": no_driver.value} for c in raw["checks"] if c["module"] == "test_driver"]
    raw["checks"].append({"id": "test_metadata.py::test_default_user_is_not_root", "module": "test_metadata",
                          "name": "test_default_user_is_not_root", "outcome": "passed", "seconds": 0.1, "message": ""})
    return report.finish(raw, required=tuple(c["id"] for c in raw["checks"]), gpu=False, revision="0123abc",
                         kind=NO_GPU)


def test_gpu_report_reads_green_with_host_and_provenance():
    rep = _gpu_report()
    f = parse(report.markdown(rep))
    assert f["verdict"] == "GREEN"
    assert f["target"] == "pt271-cu126-py311-debian12-runtime-wheels"
    assert f["image"].startswith("`sha256:" + "d" * 64 + "`")
    assert f["gpuforge"] == f"{__version__}, git revision 0123abc"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", f["date"])
    assert f["host"].startswith("NVIDIA H200 x1, driver 580.159.04")
    n = len(rep["checks"])
    skips = [c for c in rep["checks"] if c["outcome"] == "skipped"]
    assert f["checks"].startswith(f"{n - len(skips)} passed, 0 failed, {len(skips)} skipped of {n} ({n} required)")
    concerns, proven = f["What was proven"], f["What was proven (items)"]
    assert concerns == [  # each module's docstring, with its count
        "**driver: can the host's NVIDIA driver run the image's CUDA, and are the GPUs in torch's arch list?** (2 of 2 passed)",
        f"**GPU smoke: the selftest program's JSON report, asserted check by check (needs --gpuforge-gpu).** "
        f"({n - 2 - len(skips)} of {n - 2} passed)"]
    assert len(proven) == n - len(skips)
    assert "With TF32 allowed the error must grow by the mantissa cut; equal errors mean TF32 never ran" in proven
    assert "driver runs the image cuda" in proven  # a check without a docstring: its name in words
    skipped = f["What was skipped, and why"]
    assert skipped == [f"{len(skips)} x world size 1: one GPU visible, no collective to check (test_gpu_smoke)"]
    assert f["What was not checked"] == ["nothing: every required check ran"]


def test_report_without_gpu_is_not_promotable_to_prod():
    f = parse(report.markdown(_no_gpu_report()))
    assert f["verdict"] == f"GREEN for dev; {report.NO_GPU}"
    assert f["host"].startswith("no GPU (docker on ")
    assert f["What was skipped, and why"] == [
        "2 x no NVIDIA driver visible in a run without GPUs (no libnvidia-ml) (test_driver)"]
    assert f["Not applicable to this image (runtime/wheels, no GPU)"] == [
        "22 x GPU runs only: this run has no GPU (`gpuforge validate --gpu` on a GPU runner) (test_gpu_smoke)"]
    assert any(line.startswith("the GPU: no GPU check ran") for line in f["What was not checked"])
    assert f["What was proven"][0].startswith("**metadata: what the image says about itself")


def test_partial_and_red_say_so_and_why():
    rep = _gpu_report()
    partial = report.finish(rep, required=(*rep["evidence"]["required"], "test_ssh.py::test_root_login_refused"), gpu=True)
    f = parse(report.markdown(partial))
    assert f["verdict"] == "PARTIAL (never promotes)"
    assert f["What was not checked"] == ["1 required check(s) not run: test_ssh.py::test_root_login_refused"]
    red = copy.deepcopy(rep)
    red["checks"][0].update(outcome="failed", message="AssertionError: driver 470 cannot run CUDA 12.6")
    red = report.finish(red, required=tuple(red["evidence"]["required"]), gpu=True)
    md = report.markdown(red)
    f = parse(md)
    assert f["verdict"] == "RED"
    assert f["What failed"] == ["driver: can the host's NVIDIA driver run the image's CUDA, and are the GPUs in torch's "
                                "arch list?: driver runs the image cuda: AssertionError: driver 470 cannot run CUDA 12.6"]
    assert "**Why it is not evidence:**" in md


@pytest.mark.parametrize("verdict", ["PASSED (host check, not evidence)", "RED"])
def test_host_smoke_is_never_evidence(verdict):
    raw = json.loads(H200.read_text())
    if verdict == "RED":
        raw["exit_status"] = 1
    f = parse(report.markdown(report.finish(raw)))
    assert f["verdict"] == verdict
    assert "the image as evidence: a host check has no required set and never promotes" in f["What was not checked"]


@pytest.mark.parametrize(("exit_code", "blame"), [(10, "NODE NOT FIT (host): shm: /dev/shm is 64 MiB"),
                                                  (5, "IMAGE AT FAULT: require_cuda: asks for cuda>=13.1")])
def test_the_verdict_line_names_whom_readiness_blames(exit_code, blame):
    raw = json.loads(H200.read_text())
    raw["exit_status"] = 1
    raw["facts"]["readiness"] = {"level": "r1", "verdict": blame, "exit": exit_code, "findings": [], "facts": {}}
    f = parse(report.markdown(report.finish(raw)))
    assert f["verdict"] == f"RED: {blame}"


def test_a_ready_node_adds_nothing_to_the_verdict():
    raw = json.loads(H200.read_text())
    raw["facts"]["readiness"] = {"level": "r2", "verdict": "READY r2: 21 checks passed", "exit": 0, "findings": [],
                                 "facts": {}}
    assert parse(report.markdown(report.finish(raw)))["verdict"] == "PASSED (host check, not evidence)"


def test_report_md_takes_the_validators_words_without_tracker_references():
    """report.md speaks of the product: a validator docstring's pointer to a tracker ("devel (#30): ...") is left out
    of the concern and sentences the report prints."""
    for module in sorted(p.stem for p in paths.validators().glob("test_*.py")):
        said = [report.concern(module), *report._docs()[module][1].values()]
        assert not [s for s in said if re.search(r"#\d", s)], module
    assert report.concern("test_devel").startswith("devel: what a devel image promises")
    assert report.concern("test_linking").startswith("linking: every binary of the image finds the libraries")
    assert report._words("gpu (#26, #28): a line\n  over two") == "gpu: a line over two"
