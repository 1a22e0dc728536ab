"""tools/gpu_carry.py's measure steps, their pure parts (no GPU, no Docker): each fault applies to the GPU it runs
on, a fault's verdict is read from its line and exit code, and the startup probe runs where only the carried
wheels are."""

from __future__ import annotations

import ast
import sys

import pytest

from gpuforge import paths
from gpuforge.image import readiness

sys.path.insert(0, str(paths.project_root() / "tools"))
import gpu_carry
import ready_probe


@pytest.mark.parametrize(("name", "model"), [("NVIDIA H100 80GB HBM3", "H100"), ("NVIDIA H200", "H200"),
                                             ("NVIDIA H100 PCIe", "H100 PCIe")])
def test_the_injected_floors_are_the_seen_models_own_raised_above_a_healthy_node(name, model):
    bars = readiness.bars()
    before = {m: dict(f) for m, f in bars["r2"]["floors"].items()}
    got = gpu_carry.raised_floors(bars, [name])["r2"]["floors"]
    for key in ("hbm_copy", "gemm_bf16"):
        assert got[model][key] == pytest.approx(before[model][key] * gpu_carry.FLOOR_RAISE)
    assert got[model]["gemm_tf32"] == before[model]["gemm_tf32"]
    assert {m: f for m, f in got.items() if m != model} == {m: f for m, f in before.items() if m != model}


def test_a_gpu_without_floors_cannot_have_the_fault_injected():
    with pytest.raises(gpu_carry.Fail, match="no r2 floors for the GPU"):
        gpu_carry.raised_floors(readiness.bars(), ["NVIDIA GeForce RTX 4090"])
    with pytest.raises(gpu_carry.Fail, match=r"\(none\)"):
        gpu_carry.raised_floors(readiness.bars(), [])


LOG = """$ docker run ...
gpuforge selftest r2: xid: not known: kernel log unreadable: XID errors not known
gpuforge selftest r2: hbm_copy: FAILED (host): GPU 0: 3.1 TB/s
gpuforge selftest r2: {verdict} (9.8 s)
"""


@pytest.mark.parametrize(("verdict", "rc", "blame", "right"), [
    ("READY r2: 21 checks passed", 0, None, True),
    ("READY r2: 20 checks passed, 1 not known: xid: ...", 0, None, False),  # healthy runs are given the log
    ("READY r2: 20 checks passed, 1 not known: xid: ...", 0, "unknown", True),
    ("NODE NOT FIT (host): xid: could not read XID errors", 10, "unknown", False),  # the old blame
    ("NOT SHOWN FIT (unknown; unknowns block here): xid: ...", 12, "unknown-strict", True),
    ("NODE NOT FIT (host): hbm_copy: ...", 10, "host", True),
    ("IMAGE AT FAULT: the probe crashed after its verdict ('READY r2: 21 checks passed', exit 0): ...", 5, None, False),
    ("IMAGE AT FAULT: require_cuda: ...", 5, "image", True),
    ("IMAGE AT FAULT: the probe crashed before its verdict: it died by SIGSEGV ...", 5, "image", False),
])
def test_a_faults_verdict_is_its_line_and_exit_code(verdict, rc, blame, right):
    line = gpu_carry._verdict_line(LOG.format(verdict=verdict))
    assert line == f"gpuforge selftest r2: {verdict} (9.8 s)"
    assert gpu_carry.blamed_right(rc, line, blame) is right


def test_the_kernel_log_is_given_to_every_fault_but_the_closed_log_ones():
    assert "/dev/kmsg" in gpu_carry._selftest_cmd([], ["--level", "r1"])
    closed = gpu_carry._selftest_cmd([gpu_carry.NO_KMSG], ["--level", "r1", "--strict"])
    assert "/dev/kmsg" not in closed and "SYSLOG" not in closed and gpu_carry.NO_KMSG not in closed
    assert closed[-4:] == ["selftest", "--level", "r1", "--strict"]


def test_every_step_is_known_and_the_long_ones_run_only_when_named():
    assert set(gpu_carry.ALL) < set(gpu_carry.STEPS)
    assert {"repeat", "perf-train", "autotune", "autotune-artifacts"} == set(gpu_carry.STEPS) - set(gpu_carry.ALL)


def test_the_startup_probe_imports_nothing_the_carried_wheels_lack():
    """measure startup runs where only the carried wheels are: the probe's module imports nothing at all."""
    tree = ast.parse((paths.project_root() / "tools" / "ready_probe.py").read_text())
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]
    assert 'mark("first_cuda_op")' in ready_probe.PROBE and "import torch" in ready_probe.PROBE


def test_warm_bench_starts_max_autotune_with_the_bf16_built_ins_and_leaves_the_default_alone():
    import warm_bench

    assert warm_bench.ways_for("resnet50-bs1", None) == {k: warm_bench.WAYS[k] for k in ("aot", "artifacts", "none")}
    ma = warm_bench.ways_for("resnet50-bs64-bf16", "max-autotune-no-cudagraphs")
    assert ma["aot"]["GPUFORGE_AOT_MODEL"] == "warm_start:resnet50_bs64_bf16_model"
    assert ma["artifacts"]["GPUFORGE_WARMUP"] == "warm_start:resnet50_bs64_bf16"
    assert all(w["GPUFORGE_COMPILE_MODE"] == "max-autotune-no-cudagraphs" for w in ma.values())
    assert warm_bench.cold_compile_s({"report": {"compile_calls_s": 212.5}}) == 212.5
    assert warm_bench.cold_compile_s({"report": {"warmup_s": 180.0, "import_s": 2.0}}) == 180.0


@pytest.mark.parametrize("levels", ["r3", "r1,r9", ""])
def test_repeat_refuses_levels_it_does_not_know(monkeypatch, tmp_path, levels):
    """GPUFORGE_CARRY_LEVELS picks the levels one `measure repeat` runs: anything but r1 and r2 is refused before a
    container starts (a misspelt level would otherwise repeat nothing and call it clean)."""
    started = []
    monkeypatch.setattr(gpu_carry, "LEVELS", tuple(x for x in levels.split(",") if x))
    monkeypatch.setattr(gpu_carry, "_timed", lambda *a, **k: started.append(a))
    with pytest.raises(gpu_carry.Fail, match="GPUFORGE_CARRY_LEVELS"):
        gpu_carry.step_repeat(tmp_path)
    assert started == []
