"""perf_table.py's pure parts (no GPU): best of N with CV, the ABBA order, the seeds' claims judged."""

from __future__ import annotations

import sys

import pytest

from gpuforge import paths

sys.path.insert(0, str(paths.project_root() / "images" / "programs"))
import perf_table


def test_spread_best_median_cv():
    sp = perf_table.spread([10.0, 12.0, 11.0, 9.0, 13.0])
    assert sp["best"] == 9.0 and sp["median"] == 11.0 and sp["n"] == 5
    assert sp["cv"] == pytest.approx(2 ** 0.5 / 11.0)  # pstdev 1.414 over mean 11
    assert perf_table.spread([4.0, 4.0])["cv"] == 0.0
    with pytest.raises(ValueError):
        perf_table.spread([])


def test_interleaved_order_alternates_who_goes_first():
    order = perf_table.interleaved_order(4)
    assert order == [("eager", "compiled"), ("compiled", "eager"), ("eager", "compiled"), ("compiled", "eager")]
    firsts = [a for a, _ in perf_table.interleaved_order(7)]
    assert firsts.count("eager") == 4 and firsts.count("compiled") == 3


def _rows(workload, e_ms, c_ms, e_mem=100.0, c_mem=100.0):
    return [{"workload": workload, "mode": "eager", "ms": e_ms, "cv": 0.01, "peak_mem_mib": e_mem},
            {"workload": workload, "mode": "compiled", "ms": c_ms, "cv": 0.02, "peak_mem_mib": c_mem,
             "speedup": round(e_ms / c_ms, 2)}]


def test_claims_are_judged_from_the_rows():
    rows = (_rows("resnet18 train step bs64", 15.0, 9.6, e_mem=2000.0, c_mem=1500.0)
            + _rows("resnet50 inference bs1", 3.2, 2.4) + _rows("resnet50 inference bs64", 9.4, 5.0))
    got = {c["id"]: c for c in perf_table.claims_table(rows, {"eager_kernels": 3, "compiled_kernels": 1})}
    assert got["resnet18_train_speedup"]["measured"] == 1.56 and got["resnet18_train_speedup"]["verdict"] == "holds"
    assert got["resnet18_train_peak_mem"]["measured"] == 0.25 and got["resnet18_train_peak_mem"]["verdict"] == "holds"
    assert got["resnet50_infer_bs1"]["verdict"] == "does not hold"  # 1.33x < 2.0x
    assert got["resnet50_infer_bs64"]["measured"] == 1.88 and got["resnet50_infer_bs64"]["verdict"] == "does not hold"
    assert got["fusion_kernels"]["measured"] == [3, 1] and got["fusion_kernels"]["verdict"] == "holds"


def test_a_claim_without_its_figure_is_not_measured_and_a_miss_does_not_hold():
    rows = _rows("resnet18 train step bs64", 15.0, 14.0, e_mem=2000.0, c_mem=1900.0)
    got = {c["id"]: c for c in perf_table.claims_table(rows, {"eager_kernels": 3, "compiled_kernels": 2})}
    assert got["resnet18_train_speedup"]["verdict"] == "does not hold"
    assert got["resnet18_train_peak_mem"]["verdict"] == "does not hold"
    assert got["resnet50_infer_bs1"]["verdict"] == "not measured"
    assert got["fusion_kernels"]["verdict"] == "does not hold"
    md = perf_table.markdown([], list(got.values()), "test GPU")
    assert "**not measured**" in md and "**does not hold**" in md


def test_a_profiler_that_saw_no_kernel_is_not_a_verdict():
    """Seen on the shipped image on the H200: both counts 0 in a process that had profiled before."""
    got = {c["id"]: c for c in perf_table.claims_table([], {"eager_kernels": 0, "compiled_kernels": 0})}
    assert got["fusion_kernels"]["verdict"] == "not measured" and "saw no CUDA kernel" in got["fusion_kernels"]["detail"]
