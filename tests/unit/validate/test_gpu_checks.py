"""GPU validators on recorded reports: host-side bars, honest multi-GPU skips, device counts, GPU request errors.

The recorded report is docs/measurements/smoke.json (a real H200 run); mutated copies stand in for broken images.
"""

from __future__ import annotations

import copy
import json
import sys

import pytest

from gpuforge import options, paths
from gpuforge.engine import containers as run
from gpuforge.errors import ConfigError, EngineError
from gpuforge.image import compat
from gpuforge.validate.pytest_run import gpu_args
from gpuforge.validate.selection import EnvSkip

sys.path.insert(0, str(paths.project_root() / "validators"))
import test_gpu_smoke as v

RECORDED = json.loads((paths.project_root() / "docs/measurements/smoke.json").read_text())["facts"]["gpu_smoke"]["checks"]
TH = compat.smoke_thresholds()


def checks(**patch) -> dict:
    c = copy.deepcopy(RECORDED)
    for name, fields in patch.items():
        c.setdefault(name, {}).update(fields)
    return c


def test_recorded_h200_fusion_passes():
    v.test_fusion_bandwidth(checks(), TH)


def test_image_cannot_lower_its_own_fusion_bar():
    """Mutation M9: the image reports min_ratio 0 and a slow kernel; the host's 0.85 still fails it."""
    slow = checks(fusion={"min_ratio": 0.0, "compiled_gbs": 1000.0, "copy_gbs": 4000.0, "ok": True})
    with pytest.raises(AssertionError, match="25% of the device copy"):
        v.test_fusion_bandwidth(slow, TH)


def test_warm_compile_without_a_cache_hit_fails():
    c = checks(compile_cache={"cold_s": 6.0, "warm_s": 1.0, "warm_fxgraph_cache_hit": 0, "warm_fxgraph_cache_miss": 1,
                              "warm_counters": {"fxgraph_cache_miss": 1}})
    with pytest.raises(AssertionError, match="did not hit Inductor's FX graph cache"):
        v.test_warm_compile_hits_the_cache(c)


def test_warm_compile_must_be_3x_faster():
    """The recorded 11.1 s vs 9.6 s (1.16x) that used to pass now fails."""
    c = checks(compile_cache={"cold_s": 11.1, "warm_s": 9.6, "warm_fxgraph_cache_hit": 1, "warm_fxgraph_cache_miss": 0})
    with pytest.raises(AssertionError, match=r"1.16x \(< 3.0x\)"):
        v.test_warm_compile_3x_faster_than_cold(c, TH)
    v.test_warm_compile_3x_faster_than_cold(checks(compile_cache={"cold_s": 6.0, "warm_s": 1.5}), TH)


def test_tf32_that_did_not_run_fails():
    c = checks(matmul={"fp32_rel_err": 3e-7, "tf32_rel_err": 3e-7})
    with pytest.raises(AssertionError, match="TF32 did not run"):
        v.test_tf32_really_used(c, TH)
    v.test_tf32_really_used(checks(matmul={"fp32_rel_err": 3e-7, "tf32_rel_err": 4e-4}), TH)


def test_sdpa_required_backend_missing_fails():
    s = {"required": ["FLASH_ATTENTION", "EFFICIENT_ATTENTION"],
         "backends": {"FLASH_ATTENTION": {"ran": False, "why": "No available kernel"},
                      "EFFICIENT_ATTENTION": {"ran": True, "rel_err": 3e-3}}}
    with pytest.raises(AssertionError, match="FLASH_ATTENTION unavailable"):
        v.test_sdpa_backends_match_math(checks(sdpa=s), TH)
    s["backends"]["FLASH_ATTENTION"] = {"ran": True, "rel_err": 0.5}
    with pytest.raises(AssertionError, match="off the math backend"):
        v.test_sdpa_backends_match_math(checks(sdpa=s), TH)


def test_multi_gpu_checks_skip_at_world_size_1_for_the_typed_reason():
    c = checks(multi_gpu={"ok": True, "skipped": "world size 1: one GPU visible, no collective to check", "world_size": 1})
    for fn in (v.test_multi_gpu_allreduce_exact, v.test_multi_gpu_compiled_ddp_matches_reference):
        with pytest.raises(pytest.skip.Exception, match="world size 1") as e:
            fn(c)
        assert e.value.env_skip is EnvSkip.ONE_GPU


def test_a_multi_gpu_skip_at_another_world_size_is_untyped():
    """No GPU at all is no one-GPU runner: the skip carries no typed reason, so the evidence refuses it."""
    c = checks(multi_gpu={"ok": True, "skipped": "world size 0: one GPU visible, no collective to check", "world_size": 0})
    with pytest.raises(pytest.skip.Exception) as e:
        v.test_multi_gpu_allreduce_exact(c)
    assert not hasattr(e.value, "env_skip")


class _Cfg:
    def __init__(self, busbw=None):
        self.busbw = busbw

    def getoption(self, name):
        return self.busbw


def _eight_gpus(busbw: float) -> dict:
    return checks(device={"name": "NVIDIA H100 80GB HBM3"}, multi_gpu={
        "world_size": 8, "ddp": {"ok": True}, "skipped": None,
        "allreduce": [{"bytes": 1 << 30, "exact": True, "trials": 5, "busbw_gbs": busbw, "busbw_cv": 0.02}]})


def test_bus_bandwidth_floor_comes_from_the_gpu_model():
    facts: dict = {}
    v.test_multi_gpu_bus_bandwidth(_eight_gpus(360.0), _Cfg(), facts)
    assert facts["busbw"]["floor_gbs"] == 180 and "H100" in facts["busbw"]["floor_from"]
    with pytest.raises(AssertionError, match=r"best-of-5 .* 25.0 GB/s \(CV 0.02\) < 180"):
        v.test_multi_gpu_bus_bandwidth(_eight_gpus(25.0), _Cfg(), {})  # NVLink down: PCIe-class bandwidth
    with pytest.raises(AssertionError, match="< 400"):
        v.test_multi_gpu_bus_bandwidth(_eight_gpus(360.0), _Cfg(400.0), {})


@pytest.mark.parametrize(("option", "is_image", "spec", "env", "runner", "want"), [
    ("2", False, "local://", {}, 1, 2),
    (None, False, "local://", {"NVIDIA_VISIBLE_DEVICES": "0,1"}, 1, 2),
    (None, False, "local://", {"NVIDIA_VISIBLE_DEVICES": "all"}, 8, 8),
    (None, False, "local://", {"NVIDIA_VISIBLE_DEVICES": "void"}, 8, 0),
    (None, False, None, {}, 1, 1),
    (None, True, None, {"NVIDIA_VISIBLE_DEVICES": "0"}, 8, 8),  # a container asked for every GPU of the runner
    ("all", True, None, {}, 4, 4),
    (None, False, "ssh://u@h", {}, 8, None),
    (None, True, None, {}, None, None),
])
def test_gpus_asked(option, is_image, spec, env, runner, want):
    got, why = v.gpus_asked(option, is_image=is_image, host_spec=spec, env=env, runner_count=lambda: runner)
    assert got == want, why


def test_gpus_option_grammar():
    with pytest.raises(pytest.fail.Exception, match="give a GPU count"):
        v.gpus_asked("2;id", is_image=False, host_spec=None, env={}, runner_count=lambda: 1)


def test_fewer_gpus_than_asked_fails(monkeypatch):
    class Cfg:
        def getoption(self, name):
            return {"gpuforge_gpus": None, "gpuforge_host": "local://"}[name]

    monkeypatch.setenv("NVIDIA_VISIBLE_DEVICES", "0,1")
    device = {"ok": True, "count": 1, "names": ["NVIDIA H200"]}
    with pytest.raises(AssertionError, match=r"CUDA sees 1 GPU\(s\) but 2 were asked for \(NVIDIA_VISIBLE_DEVICES=0,1\)"):
        v.test_sees_exactly_the_gpus_asked_for(device, Cfg(), False, "local://", {})


def test_gpu_request_modes():
    assert run.gpu_device_request("nvidia")["Capabilities"] == [["gpu"]]
    cdi = run.gpu_device_request("cdi")
    assert cdi["Driver"] == "cdi" and cdi["DeviceIDs"] == ["nvidia.com/gpu=all"]
    with pytest.raises(EngineError, match="allowed: nvidia, cdi"):
        run.gpu_device_request("amd")
    assert gpu_args("cdi", "2") == ["--gpuforge-gpu-request", "cdi", "--gpuforge-gpus", "2"]
    for name, bad in (("gpu_request", "cuda"), ("gpus", "2; rm -rf /"), ("gpus", "-1")):  # checked once, by the CLI
        with pytest.raises(ConfigError):
            options.resolve_one(options.SETTINGS[name], cli=bad)


def test_no_nvidia_runtime_error_is_actionable():
    text = 'could not select device driver "" with capabilities: [[gpu]]'  # seen on the H200 with Docker 26.1.5
    msg = run.gpu_request_error("img", "nvidia", text)
    assert "no NVIDIA container runtime" in msg and "install nvidia-container-toolkit" in msg and "--gpu-request cdi" in msg
    msg = run.gpu_request_error("img", "cdi", 'could not select device driver "cdi" with capabilities: []')
    assert '"cdi": true' in msg
    msg = run.gpu_request_error("img", "cdi", "unresolvable CDI devices nvidia.com/gpu=all")
    assert "nvidia-ctk cdi generate" in msg
