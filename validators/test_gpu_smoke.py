"""GPU smoke: the selftest program's JSON report, asserted check by check (needs --gpuforge-gpu)."""

from __future__ import annotations

import json

import pytest

from vutil import sh


@pytest.fixture(scope="module")
def smoke(host, programs, gpu, facts):
    if not gpu:
        pytest.skip("GPU checks not requested (pass --gpu / --gpuforge-gpu on a GPU runner)")
    r = sh(host, "python3 %s --multi-gpu", f"{programs}/gpu_smoke.py", timeout=1500, check=False)
    try:
        rep = json.loads(r.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        pytest.fail(f"the smoke program printed no report (exit {r.rc}): {(r.stderr or r.stdout)[-3000:]}")
    facts["gpu_smoke"] = rep
    return rep["checks"]


def _ok(checks: dict, name: str) -> dict:
    c = checks.get(name)
    assert c is not None, f"check {name} did not run (device: {checks.get('device')})"
    assert "error" not in c, f"{name}: {c['error']}"
    return c


def test_cuda_available(smoke):
    d = smoke["device"]
    assert d["ok"], d.get("error")


def test_shm_at_least_1_gib(smoke):
    s = _ok(smoke, "shm")
    assert s["ok"], f"/dev/shm is {s['gib']} GiB (< 1 GiB): {s['hint']}"


def test_cublas_matmul_fp32_tf32_bf16(smoke):
    m = _ok(smoke, "matmul")
    assert m["ok"], f"matmul errors vs fp64 over limits {m['limits']}: {m}"


def test_cudnn_conv_forward_backward(smoke):
    c = _ok(smoke, "cudnn_conv")
    assert c["ok"], c


def test_handwritten_triton_kernel(smoke):
    assert _ok(smoke, "triton_kernel")["ok"]


def test_fusion_kernel_counts(smoke):
    f = _ok(smoke, "fusion")
    assert f["eager_kernels"] == 3, f"eager launched {f['eager_kernels']} kernels, expected 3"
    assert f["compiled_kernels"] == 1, f"compiled launched {f['compiled_kernels']} kernels, expected 1 (no fusion)"
    assert f["equal"], "compiled result differs from eager"


def test_fusion_bandwidth(smoke):
    f = _ok(smoke, "fusion")
    assert f["ratio_to_copy"] >= f["min_ratio"], (
        f"fused kernel {f['compiled_gbs']} GB/s is {f['ratio_to_copy']:.0%} of the device copy {f['copy_gbs']} GB/s")


def test_compile_modes(smoke):
    c = _ok(smoke, "compile_modes")
    assert c["ok"], c


def test_bf16_autocast_training_step(smoke):
    assert _ok(smoke, "amp_training")["ok"]


def test_warm_compile_faster_than_cold(smoke):
    c = _ok(smoke, "compile_cache")
    assert c["warm_s"] < c["cold_s"], f"warm {c['warm_s']} s is not faster than cold {c['cold_s']} s"


def test_multi_gpu_allreduce_exact(smoke):
    m = _ok(smoke, "multi_gpu")
    bad = [a for a in m["allreduce"] if not a["exact"]]
    assert not bad, f"all-reduce sums wrong at sizes {[a['bytes'] for a in bad]}"


def test_multi_gpu_compiled_ddp_matches_reference(smoke):
    m = _ok(smoke, "multi_gpu")
    assert m["ddp"]["ok"], f"DDP(compiled) differs from the one-process reference by {m['ddp']['max_abs_diff']}"


def test_multi_gpu_bus_bandwidth(smoke, pytestconfig):
    m = _ok(smoke, "multi_gpu")
    if m["world_size"] == 1:
        pytest.skip("world size 1: bus bandwidth is 0 by definition (one GPU visible)")
    want = pytestconfig.getoption("gpuforge_min_busbw")
    got = max(a["busbw_gbs"] for a in m["allreduce"])
    assert got >= want, f"peak all-reduce bus bandwidth {got} GB/s < {want} GB/s for this runner class"
