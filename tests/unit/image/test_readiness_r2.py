"""Readiness level r2 (gpuforge/image/readiness.py judge_r2): every speed rule, both ways, on the H200's figures.

HEALTHY is an r2 run's facts as recorded on the lent H200 (tests/unit/image/data/h200-ready.json; where it comes
from is in docs/measurements/gpu-29.md). Each broken case changes one figure the way a sick node or a broken image
would show it.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from gpuforge.image import readiness

HEALTHY = json.loads((Path(__file__).parent / "data" / "h200-ready.json").read_text())
BARS = readiness.bars()
FLOORS = BARS["r2"]["floors"]["H200"]


def judge(speed: dict) -> dict[str, readiness.Finding]:
    found = readiness.judge_r2(speed, bars=BARS)
    assert [f.check for f in found] == list(readiness.R2_CHECKS)
    return {f.check: f for f in found}


def speed(**figures) -> dict:
    s = copy.deepcopy(HEALTHY["speed"])
    for key, value in figures.items():
        if key in ("fusion", "allreduce"):
            s[key] = value
        else:
            s["gpus"][0][key] = value
    return s


def test_the_recorded_h200_is_ready_at_r2_and_r1():
    found = judge(HEALTHY["speed"])
    assert all(f.ok and not f.reason for f in found.values()), [f for f in found.values() if not f.ok]
    r1 = readiness.judge(HEALTHY, request=1, image_cuda="12.6", bars=BARS)
    assert all(f.ok for f in r1 if f.check != "require_cuda"), [f for f in r1 if not f.ok]
    assert readiness.verdict(list(found.values()), "r2") == (f"READY r2: {len(readiness.R2_CHECKS)} checks passed", 0)
    for check in readiness.SPEED:  # the figure a user reads: best, trials, CV and the floor
        v = HEALTHY["speed"]["gpus"][0][check]
        assert found[check].figure == (f"GPU 0: {v['best']:g} {v['unit']} best of {len(v['trials'])} "
                                       f"(CV {v['cv']:.1%}), floor {FLOORS[check]:g}")
        assert v["best"] >= FLOORS[check] * 1.05, f"{check}: the floor sits too close to a healthy H200's figure"
    assert found["allreduce"].figure == "1 GPU: no collective to measure"


@pytest.mark.parametrize("check", readiness.SPEED)
def test_a_figure_under_its_floor_fails_on_the_host_naming_both(check):
    v = copy.deepcopy(HEALTHY["speed"]["gpus"][0][check])
    v["best"] = round(FLOORS[check] * 0.8, 3)
    f = judge(speed(**{check: v}))[check]
    assert not f.ok and f.blame == "host", f
    assert f"{v['best']:g} {v['unit']} is under the H200's floor of {FLOORS[check]:g} {v['unit']}" in f.reason


@pytest.mark.parametrize("check", readiness.SPEED)
def test_unsteady_trials_fail_on_the_host(check):
    v = copy.deepcopy(HEALTHY["speed"]["gpus"][0][check])
    limit = readiness.cv_limit(check, BARS["r2"])
    v["cv"] = limit + 0.01
    f = judge(speed(**{check: v}))[check]
    assert not f.ok and f.blame == "host" and f"(CV), over {limit:.0%}" in f.reason, f


@pytest.mark.parametrize(("check", "cv", "ok"), [
    ("gemm_bf16", 0.060, True),  # the widest spread of a healthy H100 at its power limit (64 runs)
    ("gemm_tf32", 0.060, True),
    ("hbm_copy", 0.060, False),  # a copy is not power-bound: a healthy node's copies vary by 0.2% at most
    ("h2d", 0.060, False),
])
def test_the_products_spread_at_the_power_limit_is_not_unsteadiness(check, cv, ok):
    v = copy.deepcopy(HEALTHY["speed"]["gpus"][0][check])
    v["cv"] = cv
    assert judge(speed(**{check: v}))[check].ok is ok


def test_bars_without_a_products_limit_hold_every_figure_to_one():
    """Bars a host wrote before `cv_max_gemm` (`selftest --bars`): the one limit applies to the products too."""
    old = {k: v for k, v in BARS["r2"].items() if k != "cv_max_gemm"}
    assert readiness.cv_limit("gemm_bf16", old) == old["cv_max"] == readiness.cv_limit("hbm_copy", BARS["r2"])


@pytest.mark.parametrize(("error", "blame"), [
    ("ImportError: libcublasLt.so.12: cannot open shared object file", "image"),
    ("RuntimeError: CUDA error: no kernel image is available for execution on the device", "image"),
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "host"),
    ("RuntimeError: CUDA error: uncorrectable ECC error encountered", "host"),
])
def test_a_figure_that_could_not_be_measured_fails_blamed_by_its_error(error, blame):
    f = judge(speed(gemm_bf16={"error": error}))["gemm_bf16"]
    assert not f.ok and f.blame == blame and error in f.reason and f.figure == "GPU 0: not measured", f


def test_nothing_measured_fails_every_r2_check_once_with_its_reason():
    found = judge({"error": "ModuleNotFoundError: No module named 'torch'"})
    assert all(not f.ok and f.blame == "image" and "No module named 'torch'" in f.reason for f in found.values())
    line, code = readiness.verdict(list(found.values()), "r2")
    assert code == 5 and line.count("No module named 'torch'") == 1, line


def test_a_gpu_model_without_floors_cannot_be_shown_fit():
    s = speed()
    s["gpus"][0]["name"] = "NVIDIA GeForce RTX 4090"
    found = judge(s)
    for check in readiness.SPEED:
        f = found[check]
        assert not f.ok and f.blame == "host" and f"no r2 floor for {check} of a 'NVIDIA GeForce RTX 4090'" in f.reason


def test_of_two_gpus_the_slow_one_is_named():
    s = speed()
    slow = copy.deepcopy(s["gpus"][0])
    slow["index"] = 1
    slow["hbm_copy"]["best"] = 2.9
    s["gpus"].append(slow)
    s["allreduce"] = {"world_size": 2, "names": ["NVIDIA H200"] * 2, "allreduce": [
        {"bytes": 1 << 30, "exact": True, "busbw_gbs": 350.0, "busbw_cv": 0.01}]}
    found = judge(s)
    assert not found["hbm_copy"].ok and found["hbm_copy"].reason.startswith("GPU 1: 2.9 TB/s"), found["hbm_copy"]
    assert "GPU 0:" not in found["hbm_copy"].reason and found["allreduce"].ok, found


def test_one_gpu_with_an_image_error_and_one_slow_blames_the_host():
    s = speed(h2d={"error": "ImportError: libcudart.so.12"})
    other = copy.deepcopy(HEALTHY["speed"]["gpus"][0])
    other["index"] = 1
    other["h2d"]["best"] = 10.0
    s["gpus"].append(other)
    f = judge(s)["h2d"]
    assert not f.ok and f.blame == "host" and "GPU 0:" in f.reason and "GPU 1:" in f.reason, f


@pytest.mark.parametrize(("change", "words"), [
    ({"compiled_kernels": 3}, "launched 3 kernels, not 1: no fusion"),
    ({"equal": False}, "compiled and eager results differ"),
    ({"ratio_to_copy": 0.5}, "reaches 50% of a copy's bandwidth, under 85%"),
])
def test_a_bad_fused_kernel_is_the_images_fault(change, words):
    f = judge(speed(fusion={**HEALTHY["speed"]["fusion"], **change}))["fusion"]
    assert not f.ok and f.blame == "image" and words in f.reason, f


def test_a_fused_kernel_that_does_not_compile_is_the_images_fault():
    f = judge(speed(fusion={"error": "BackendCompilerFailed: backend='inductor' raised: triton not found"}))["fusion"]
    assert not f.ok and f.blame == "image" and "could not be built or run" in f.reason, f


@pytest.mark.parametrize(("allreduce", "words"), [
    (None, "NCCL all-reduce could not run (not measured)"),
    ({"error": "NCCL error: unhandled system error"}, "NCCL all-reduce could not run (NCCL error"),
    ({"world_size": 2, "names": ["NVIDIA H200"] * 2, "allreduce": [
        {"bytes": 1 << 30, "exact": True, "busbw_gbs": 40.0, "busbw_cv": 0.01}]}, "40 GB/s is under the H200's floor of 180"),
    ({"world_size": 2, "names": ["NVIDIA H200"] * 2, "allreduce": [
        {"bytes": 1 << 20, "exact": False, "busbw_gbs": 50.0, "busbw_cv": 0.01},
        {"bytes": 1 << 30, "exact": True, "busbw_gbs": 350.0, "busbw_cv": 0.01}]}, "an all-reduce gave a wrong sum"),
])
def test_two_gpus_without_a_good_all_reduce_fail_on_the_host(allreduce, words):
    s = speed()
    two = copy.deepcopy(s["gpus"][0])
    two["index"] = 1
    s["gpus"].append(two)
    if allreduce is not None:
        s["allreduce"] = allreduce
    f = judge(s)["allreduce"]
    assert not f.ok and f.blame == "host" and words in f.reason, f


def test_every_gpu_model_the_data_knows_has_r2_floors():
    """A model in gpu_capability or busbw_floor_gbs without r2 floors would fail every `validate --gpu` on it."""
    from gpuforge.image import compat

    d = compat.data()
    floors = BARS["r2"]["floors"]
    missing = [m for m in [*d["gpu_capability"], *d["busbw_floor_gbs"]] if compat.model_key(f"NVIDIA {m}", floors) is None]
    assert not missing, f"no r2 floors for {missing}"
    for model, row in floors.items():
        assert set(readiness.SPEED) <= set(row) and row.get("source"), f"{model}: every figure's floor and a source"
        measured = model in ("H200", "H100")  # the models measured on the GPU machines lent here
        assert measured == str(row["source"]).startswith("measured:") == (not row.get("unconfirmed")), model


def test_an_unconfirmed_floor_says_so_when_it_fails():
    s = speed()
    s["gpus"][0]["name"] = "NVIDIA L40S"
    s["gpus"][0]["hbm_copy"]["best"] = 0.5
    f = judge(s)["hbm_copy"]
    assert not f.ok and "under the L40S's floor of 0.69 TB/s (a floor from the datasheet, not yet measured" in f.reason


def test_a_model_without_the_unit_is_measured_not_judged():
    s = speed()
    s["gpus"][0]["name"] = "Tesla V100-SXM2-32GB"
    for check in ("hbm_copy", "h2d", "d2h"):
        s["gpus"][0][check]["best"] = 50.0  # above V100's floors whatever the unit
    found = judge(s)
    assert found["gemm_bf16"].ok and found["gemm_bf16"].figure.endswith(", not judged"), found["gemm_bf16"]
    assert found["hbm_copy"].ok and found["hbm_copy"].figure.endswith("floor 0.72"), found["hbm_copy"]


@pytest.mark.parametrize(("figures", "check"), [
    ({"gemm_bf16": {"best": 700.0, "unit": "TFLOP/s"}}, "gemm_bf16"),  # no trials, no cv
    ({"fusion": {"compiled_kernels": 1}}, "fusion"),
    ({"allreduce": {"world_size": 2, "allreduce": [{"bytes": 1 << 30}]}}, "allreduce"),
])
def test_malformed_figures_fail_on_the_image_and_judge_the_rest(figures, check):
    found = judge(speed(**figures))
    f = found[check]
    assert not f.ok and f.blame == "image" and f"the program's {check} figures are malformed" in f.reason, f
    assert all(g.ok for c, g in found.items() if c != check), [g for g in found.values() if not g.ok]


def test_a_gpu_without_a_name_is_malformed_not_a_crash():
    s = speed()
    del s["gpus"][0]["name"]
    assert all(not judge(s)[c].ok and judge(s)[c].blame == "image" for c in readiness.SPEED)


def test_the_nodes_signs_win_over_a_compiler_wrapper():
    err = "BackendCompilerFailed: backend='inductor' raised: RuntimeError: CUDA error: uncorrectable ECC error encountered"
    f = judge(speed(fusion={"error": err}))["fusion"]
    assert not f.ok and f.blame == "host", f
    oom = "triton.runtime.errors.OutOfResources: out of memory"
    assert judge(speed(gemm_tf32={"error": oom}))["gemm_tf32"].blame == "host"


def test_a_runners_own_all_reduce_floor_applies_to_any_model():
    s = speed()
    two = copy.deepcopy(s["gpus"][0])
    two["index"] = 1
    s["gpus"].append(two)
    s["allreduce"] = {"world_size": 2, "names": ["NVIDIA GeForce RTX 4090"] * 2, "allreduce": [
        {"bytes": 1 << 30, "exact": True, "busbw_gbs": 12.0, "busbw_cv": None}]}
    f = readiness.judge_r2(s, bars={**BARS, "busbw_floor_gbs": {"": 20.0}})[-1]
    assert not f.ok and "12 GB/s is under the given floor of 20 GB/s" in f.reason and "CV unknown" in f.figure, f
