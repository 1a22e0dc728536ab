"""perf_table.py's logic on fake timings (no GPU): best of N with CV, the alternating order over four modes, the
kernel counter's settling, the recommendation, a capped compile, the seeds' claims judged under their own
settings, and the merge of several runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from gpuforge import paths

PROGRAMS = paths.project_root() / "images" / "programs"
sys.path.insert(0, str(PROGRAMS))
import perf_table  # noqa: E402

MA = perf_table.CAPPED


def test_spread_best_median_cv():
    sp = perf_table.spread([10.0, 12.0, 11.0, 9.0, 13.0])
    assert sp["best"] == 9.0 and sp["median"] == 11.0 and sp["n"] == 5
    assert sp["cv"] == pytest.approx(2 ** 0.5 / 11.0)  # pstdev 1.414 over mean 11
    assert perf_table.spread([4.0, 4.0])["cv"] == 0.0
    with pytest.raises(ValueError):
        perf_table.spread([])


def test_interleaved_order_alternates_who_goes_first_over_every_mode():
    assert perf_table.interleaved_order(4) == [("eager", "compiled"), ("compiled", "eager")] * 2
    order = perf_table.interleaved_order(3, perf_table.MODES)
    assert order[0] == perf_table.MODES and order[1] == perf_table.MODES[::-1] and order[2] == order[0]
    firsts = [o[0] for o in perf_table.interleaved_order(7, perf_table.MODES)]
    assert firsts.count("eager") == 4 and firsts.count(MA) == 3


@pytest.mark.parametrize(("totals", "want"), [
    ([9, 9, 9], {"kernels": 3, "agreeing": 3}),  # three calls of a 3-kernel function, every session whole
    ([6, 9, 9], {"kernels": 3, "agreeing": 2}),  # a session that lost a call's kernels at its start
    ([7, 9, 3], {"kernels": 3, "agreeing": 1}),  # a total that is no whole count per call is set aside
    ([0, 3, 3], {"kernels": 1, "agreeing": 2}),  # a CUDA graph replaying one fused kernel: counted as that kernel
])
def test_the_kernel_count_is_the_largest_whole_count_per_call(totals, want):
    got = perf_table.settle_kernels(totals, 3)
    assert {k: got[k] for k in want} == want and got["sessions"] == totals


def test_a_profiler_that_saw_nothing_is_an_error_never_a_zero():
    got = perf_table.settle_kernels([0, 0, 0], 3)
    assert "kernels" not in got and "the profiler saw [0, 0, 0] kernels in 3 sessions" in got["error"]


def row(workload, mode, ms, *, compile_s=None, peak=100.0, kernels=10, cv=0.01):
    return {"workload": workload, "label": perf_table.WORKLOADS[workload].label, "mode": mode, "ms": ms,
            "median_ms": ms, "cv": cv, "trials": 5, "iters": 10, "peak_mem_mib": peak, "kernels": kernels,
            "compile_s": compile_s, "settings": perf_table.WORKLOADS[workload].settings()}


def workload(key, eager, default, ro, ma=None, *, compile_s=(20.0, 25.0, 40.0), peaks=(100.0, 90.0, 95.0, 90.0),
             kernels=(10, 5, 5, 5)):
    rows = [row(key, "eager", eager, peak=peaks[0], kernels=kernels[0]),
            row(key, "default", default, compile_s=compile_s[0], peak=peaks[1], kernels=kernels[1]),
            row(key, "reduce-overhead", ro, compile_s=compile_s[1], peak=peaks[2], kernels=kernels[2])]
    if isinstance(ma, dict):
        rows.append({"workload": key, "mode": MA, **ma})
    elif ma is not None:
        rows.append(row(key, MA, ma, compile_s=compile_s[2], peak=peaks[3], kernels=kernels[3]))
    return rows


def test_the_recommendation_is_the_fastest_mode_with_its_costs():
    rows = workload("resnet50-infer-bs1", 3.87, 2.45, 0.60, {"did_not_finish_s": 300})
    rec = perf_table.recommend(rows)
    assert rec["mode"] == "reduce-overhead" and rec["ms"] == 0.60 and rec["speedup"] == 6.45
    assert rec["compile_s"] == 25.0 and rec["peak_mem_mib"] == 95.0
    assert rec["note"] == f"{MA} did not finish compiling in 300 s"
    assert perf_table.recommend(workload("fusion", 0.01, 0.02, 0.03))["mode"] == "eager"  # compile does not pay


def test_claims_are_judged_under_the_seeds_own_settings():
    """The ResNet-50 bs1 seed says reduce-overhead: held to that row, not to default mode's 1.58x."""
    rows = (workload("resnet50-infer-bs1", 3.87, 2.45, 0.60)
            + workload("resnet18-train-bs64", 14.31, 8.51, 8.9, peaks=(1481.0, 1366.0, 1400.0, 1366.0))
            + workload("resnet50-infer-bs64-bf16", 8.14, 3.48, 3.3, 3.0, compile_s=(30.0, 35.0, 41.0))
            + workload("fusion", 0.02, 0.01, 0.005, kernels=(3, 1, 1, 1)))
    got = {c["id"]: c for c in perf_table.claims_table(rows)}
    bs1 = got["resnet50_infer_bs1"]
    assert bs1["verdict"] == "holds" and bs1["measured"] == 6.45 and bs1["judged_under"].endswith("mode reduce-overhead")
    assert got["resnet18_train_speedup"]["measured"] == 1.68 and got["resnet18_train_speedup"]["verdict"] == "holds"
    mem = got["resnet18_train_peak_mem"]
    assert mem["measured"] == pytest.approx(0.078, abs=1e-3) and mem["verdict"] == "does not hold"
    assert got["fusion_kernels"]["measured"] == [3, 1] and got["fusion_kernels"]["verdict"] == "holds"
    ma = got["max_autotune"]  # +11 s compile (within "about 15 s"), 13.8 % faster than default
    assert ma["measured"] == {"extra_compile_s": 11.0, "faster": 0.138} and ma["verdict"] == "holds"


def test_a_capped_mode_does_not_hold_and_an_absent_workload_is_not_measured():
    rows = workload("resnet50-infer-bs64-bf16", 8.14, 3.48, 3.3, {"did_not_finish_s": 300})
    got = {c["id"]: c for c in perf_table.claims_table(rows)}
    assert got["max_autotune"]["verdict"] == "does not hold"
    assert got["max_autotune"]["detail"] == f"{MA} did not finish compiling in 300 s"
    assert got["resnet50_infer_bs1"]["verdict"] == "not measured"
    assert "this run has no ResNet-50 inference bs1, mode reduce-overhead row" in got["resnet50_infer_bs1"]["detail"]
    md = perf_table.markdown(rows, [perf_table.recommend(rows)], list(got.values()), "test GPU")
    assert f"| {MA} | did not finish compiling in 300 s |" in md and "**does not hold**" in md


def test_a_kernel_count_that_failed_is_said_in_its_claim_not_judged():
    rows = workload("fusion", 0.02, 0.01, 0.005, kernels=(3, None, 1, 1))
    rows[1]["kernel_error"] = "the profiler saw [0, 0, 0] kernels in 3 sessions of 3 calls: no whole count per call"
    got = {c["id"]: c for c in perf_table.claims_table(rows)}["fusion_kernels"]
    assert got["verdict"] == "not measured" and "the profiler saw [0, 0, 0]" in got["detail"]


def test_a_capped_run_past_its_deadline_is_killed_with_its_whole_group(tmp_path):
    """The capped compile: a worker that outlives its cap goes, and so do the processes it started (Inductor's
    compile workers): nothing left running on the GPU past the table."""
    pidfile = tmp_path / "grandchild"
    code = (f"import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            f"open({str(pidfile)!r}, 'w').write(str(p.pid)); time.sleep(60)")
    t0 = time.monotonic()
    assert perf_table.capped_run([sys.executable, "-c", code], 2) == {"did_not_finish_s": 2}
    assert time.monotonic() - t0 < 30
    pid = int(pidfile.read_text())
    for _ in range(50):  # reaped by init once killed
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the worker's own child {pid} outlived the cap")


def test_a_capped_run_returns_its_last_json_line_or_its_error():
    ok = perf_table.capped_run([sys.executable, "-c", "print('noise'); print('{\"compile_s\": 1.5}')"], 30)
    assert ok == {"compile_s": 1.5}
    bad = perf_table.capped_run([sys.executable, "-c", "import sys; sys.stderr.write('boom'); sys.exit(3)"], 30)
    assert bad["error"].startswith("exit 3: boom")


def test_merge_makes_one_table_and_judges_the_claims_again(tmp_path):
    a = perf_table.table([{"device": "NVIDIA H100 80GB HBM3", "torch": "2.7.1", "rows": workload(
        "resnet50-infer-bs1", 3.87, 2.45, 0.60)}])
    b = perf_table.table([{"device": "NVIDIA H100 80GB HBM3", "torch": "2.7.1", "rows": workload(
        "fusion", 0.02, 0.01, 0.005, kernels=(3, 1, 1, 1))}])
    for name, rep in (("a.json", a), ("b.json", b)):
        (tmp_path / name).write_text(json.dumps(rep))
    r = subprocess.run([sys.executable, str(PROGRAMS / "perf_table.py"), "--merge", str(tmp_path / "a.json"),
                        str(tmp_path / "b.json"), "--json", str(tmp_path / "m.json")], capture_output=True, text=True,
                       timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    m = json.loads((tmp_path / "m.json").read_text())
    assert [x["workload"] for x in m["recommendations"]] == ["resnet50-infer-bs1", "fusion"]
    got = {c["id"]: c["verdict"] for c in m["claims"]}
    assert got["resnet50_infer_bs1"] == got["fusion_kernels"] == "holds"
    assert got["resnet18_train_speedup"] == "not measured"


def test_merge_refuses_reports_of_different_gpus(tmp_path):
    for name, dev in (("a.json", "NVIDIA H100 80GB HBM3"), ("b.json", "NVIDIA H200")):
        (tmp_path / name).write_text(json.dumps({"device": dev, "rows": []}))
    r = subprocess.run([sys.executable, str(PROGRAMS / "perf_table.py"), "--merge", str(tmp_path / "a.json"),
                        str(tmp_path / "b.json")], capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 64 and "different GPUs" in r.stderr


@pytest.mark.parametrize("args", [["--workloads", "resnet99"], ["--modes", "max-autotune"], ["--trials", "1"]])
def test_bad_input_is_one_line_and_exit_64_before_any_gpu_work(args):
    r = subprocess.run([sys.executable, str(PROGRAMS / "perf_table.py"), "--no-warm-start", *args],
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 64 and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_every_workload_states_its_settings():
    for w in perf_table.WORKLOADS.values():
        s = w.settings()
        assert "cudnn.benchmark" in s and ("fp32" in s or "bf16" in s) and "TF32" in s
    assert "channels_last" in perf_table.WORKLOADS["resnet18-train-bs64-bf16-cl"].settings()
    assert {c["workload"] for c in perf_table.CLAIMS} <= set(perf_table.WORKLOADS)


FAKE_WORKER = '''
import json, sys, time
key = sys.argv[1]
if "--compile-only" in sys.argv:
    if key == "fusion":
        time.sleep(60)  # past the cap
    print(json.dumps({"mode": sys.argv[-1], "compile_s": 41.0}))
    sys.exit(0)
modes = sys.argv[sys.argv.index("--modes") + 1].split(",")
ms = {"eager": 4.0, "default": 2.5, "reduce-overhead": 0.6, "max-autotune-no-cudagraphs": 2.0}
rows = [{"workload": key, "label": key, "mode": m, "settings": "s", "ms": ms[m], "median_ms": ms[m], "cv": 0.01,
         "trials": 5, "iters": 10, "peak_mem_mib": 10.0, "kernels": 3, "compile_s": None if m == "eager" else 5.0}
        for m in modes]
print(json.dumps({"device": "FAKE GPU", "torch": "2.7.1", "inductor": {}, "rows": rows}))
'''


def test_the_run_caps_max_autotune_and_keeps_its_cold_compile(tmp_path, monkeypatch):
    """The orchestration with a stand-in worker: a capped compile is its row's "did not finish in N s" and the mode
    is left out of the timed process; a finished one's row shows its cold compile, the timed load as warm."""
    (tmp_path / "perf_worker.py").write_text(FAKE_WORKER)
    monkeypatch.setattr(perf_table, "HERE", str(tmp_path))
    done = perf_table.measure("resnet50-infer-bs1", list(perf_table.MODES), trials=5, cap=30, worker_cap=60)
    ma = next(r for r in done["rows"] if r["mode"] == MA)
    assert ma["compile_s"] == 41.0 and ma["warm_load_s"] == 5.0 and ma["speedup"] == 2.0
    assert [r["mode"] for r in done["rows"]] == list(perf_table.MODES)
    capped = perf_table.measure("fusion", list(perf_table.MODES), trials=5, cap=1, worker_cap=60)
    ma = next(r for r in capped["rows"] if r["mode"] == MA)
    assert ma == {"workload": "fusion", "label": perf_table.WORKLOADS["fusion"].label, "mode": MA,
                  "settings": perf_table.WORKLOADS["fusion"].settings(), "did_not_finish_s": 1}
    rep = perf_table.table([done, capped])
    assert {r["workload"]: r["mode"] for r in rep["recommendations"]} == {"resnet50-infer-bs1": "reduce-overhead",
                                                                         "fusion": "reduce-overhead"}
    assert rep["device"] == "FAKE GPU"
