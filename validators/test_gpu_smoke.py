"""GPU smoke: the selftest program's JSON report, asserted check by check (needs --gpuforge-gpu).

Every bar comes from the host toolkit (gpuforge/image/data/compat.yaml's smoke_thresholds, read in this
process): it is passed to the program and re-applied here to the raw figures, so an image that lowers its
own bar still fails.
"""

from __future__ import annotations

import json
import os

import pytest

from gpuforge.image import compat, hostinfo
from vutil import sh


@pytest.fixture(scope="session")
def thresholds() -> dict:
    return compat.smoke_thresholds()


@pytest.fixture(scope="module")
def smoke(host, programs, gpu, facts, thresholds, target):
    if not gpu:
        pytest.skip("GPU checks not requested (pass --gpu / --gpuforge-gpu on a GPU runner)")
    devel = " --devel" if target.get("flavor") == "devel" else ""  # devel images promise the C++ AOTI path too
    r = sh(host, "python3 %s --multi-gpu" + devel + " --thresholds %s", f"{programs}/gpu_smoke.py", json.dumps(thresholds),
           timeout=1800, check=False)
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


# --- the GPUs the container (or host) sees vs the GPUs the runner was asked to give -------------------------

def gpus_asked(option: str | None, *, is_image: bool, host_spec: str | None, env: dict, runner_count) -> tuple[int | None, str]:
    """(count, where that number comes from); count None: nobody can say here (the check is skipped)."""
    if option and option != "all":
        if not option.isdigit():
            pytest.fail(f"--gpuforge-gpus {option!r}: give a GPU count or 'all'")
        return int(option), f"--gpuforge-gpus {option}"
    if not option and not is_image:
        nvd = (env.get("NVIDIA_VISIBLE_DEVICES") or "").strip()
        if nvd in ("none", "void"):
            return 0, f"NVIDIA_VISIBLE_DEVICES={nvd}"
        if nvd and nvd != "all":
            return len([x for x in nvd.split(",") if x.strip()]), f"NVIDIA_VISIBLE_DEVICES={nvd}"
    if host_spec and host_spec.startswith(("ssh://", "docker://")):
        return None, f"{host_spec} is not this machine: pass --gpuforge-gpus N (the GPUs the runner was given)"
    n = runner_count()
    if n is None:
        return None, "this runner lists no GPU (no NVML or nvidia-smi here): pass --gpuforge-gpus N"
    return n, "every GPU of this runner (its NVML / nvidia-smi)"


def _runner_count() -> int | None:
    h = hostinfo.detect()
    return len(h.gpus) if h.driver else None


@pytest.fixture(scope="module")
def device(host, programs, gpu, timeout):
    """A quick probe of what CUDA sees (the full smoke run is not needed for the count)."""
    if not gpu:
        pytest.skip("GPU checks not requested (pass --gpu / --gpuforge-gpu on a GPU runner)")
    r = sh(host, "python3 %s --only device", f"{programs}/gpu_smoke.py", timeout=max(timeout, 300), check=False)
    try:
        return json.loads(r.stdout.strip().splitlines()[-1])["checks"]["device"]
    except (IndexError, KeyError, json.JSONDecodeError):
        pytest.fail(f"the device probe printed no report (exit {r.rc}): {(r.stderr or r.stdout)[-3000:]}")


def test_sees_exactly_the_gpus_asked_for(device, pytestconfig, is_image, host_spec, facts):
    want, why = gpus_asked(pytestconfig.getoption("gpuforge_gpus"), is_image=is_image,
                           host_spec=host_spec, env=dict(os.environ), runner_count=_runner_count)
    seen = device.get("count", 0) if device.get("ok") else 0
    facts["gpu_count"] = {"asked": want, "asked_from": why, "seen_by_cuda": seen, "names": device.get("names")}
    if want is None:
        pytest.skip(why)
    assert seen == want, (f"CUDA sees {seen} GPU(s) but {want} were asked for ({why}); "
                          f"{device.get('error') or 'names: ' + ', '.join(device.get('names', []))}")


# --- single-GPU checks ------------------------------------------------------------------------------------

def test_cuda_available(smoke):
    d = smoke["device"]
    assert d["ok"], d.get("error")


def test_shm_at_least_1_gib(smoke):
    s = _ok(smoke, "shm")
    assert s["ok"], f"/dev/shm is {s['gib']} GiB (< 1 GiB): {s['hint']}"


def test_cublas_matmul_fp32_tf32_bf16(smoke, thresholds):
    m = _ok(smoke, "matmul")
    lim = thresholds["matmul_rel_err"]
    over = {k: m[f"{k}_rel_err"] for k in lim if not m[f"{k}_rel_err"] < lim[k]}
    assert not over, f"matmul errors vs fp64 over the limits {lim}: {over}"


def test_tf32_really_used(smoke, thresholds):
    """With TF32 allowed the error must grow by the mantissa cut; equal errors mean TF32 never ran."""
    m = _ok(smoke, "matmul")
    ratio = m["tf32_rel_err"] / max(m["fp32_rel_err"], 1e-30)
    assert ratio >= thresholds["tf32_min_err_ratio"], (
        f"TF32 error {m['tf32_rel_err']:.2e} is only {ratio:.1f}x strict fp32's {m['fp32_rel_err']:.2e}: TF32 did not run")


def test_cudnn_conv_fp32_and_bf16(smoke, thresholds):
    c = _ok(smoke, "cudnn_conv")
    lim = thresholds["conv_rel_err"]
    assert c["forward_rel_err"] < lim["fp32"] and c["backward_rel_err"] < lim["fp32"], c
    assert c["bf16_forward_rel_err"] < lim["bf16"], f"bf16 cuDNN conv error {c['bf16_forward_rel_err']:.2e} > {lim['bf16']}"


def test_sdpa_backends_match_math(smoke, thresholds):
    s = _ok(smoke, "sdpa")
    for name in s["required"]:
        b = s["backends"][name]
        assert b["ran"], f"SDPA backend {name} unavailable on this GPU: {b.get('why')}"
    bad = {n: b["rel_err"] for n, b in s["backends"].items() if b["ran"] and not b["rel_err"] < thresholds["sdpa_rel_err"]}
    assert not bad, f"SDPA backends off the math backend by more than {thresholds['sdpa_rel_err']}: {bad}"


def test_cufft(smoke, thresholds):
    f = _ok(smoke, "cufft")
    assert max(f["rfft_rel_err"], f["roundtrip_rel_err"]) < thresholds["fft_rel_err"], f


def test_curand_host_api(smoke, thresholds):
    r = _ok(smoke, "curand")
    assert all(c == 0 for c in r["status_codes"]), f"cuRAND calls returned {r['status_codes']}"
    tol = thresholds["rand_moment_tol"]
    assert abs(r["mean"]) < tol and abs(r["std"] - 1) < tol, f"cuRAND normals: mean {r['mean']}, std {r['std']}"


def test_cusolver(smoke, thresholds):
    s = _ok(smoke, "cusolver")
    lim = thresholds["solver_residual"]
    assert s["solve_residual"] < lim and s["cholesky_residual"] < lim and s["eigvalsh_rel_err"] < lim, s


def test_nvrtc_jiterator(smoke, thresholds):
    n = _ok(smoke, "nvrtc")
    assert n["rel_err"] < thresholds["jiterator_rel_err"], n


def test_aotinductor_package_round_trip(smoke, thresholds):
    """Python: package, load in a fresh process, compare with eager; devel images: also a C++ loader."""
    a = _ok(smoke, "aoti")
    assert a["rel_err"] < thresholds["aoti_rel_err"], f"AOTInductor package output off eager by {a['rel_err']:.2e}"
    if "aoti_cpp" in smoke:
        c = _ok(smoke, "aoti_cpp")
        assert c["rel_err"] < thresholds["aoti_rel_err"], f"the C++ loader's output is off eager by {c['rel_err']:.2e}"


def test_handwritten_triton_kernel(smoke):
    assert _ok(smoke, "triton_kernel")["ok"]


def test_fusion_kernel_counts(smoke):
    f = _ok(smoke, "fusion")
    assert f["eager_kernels"] == 3, f"eager launched {f['eager_kernels']} kernels, expected 3"
    assert f["compiled_kernels"] == 1, f"compiled launched {f['compiled_kernels']} kernels, expected 1 (no fusion)"
    assert f["equal"], "compiled result differs from eager"


def test_fusion_bandwidth(smoke, thresholds):
    f = _ok(smoke, "fusion")
    ratio = f["compiled_gbs"] / f["copy_gbs"]
    assert ratio >= thresholds["fusion_min_ratio"], (
        f"fused kernel {f['compiled_gbs']} GB/s is {ratio:.0%} of the device copy {f['copy_gbs']} GB/s "
        f"(< {thresholds['fusion_min_ratio']:.0%})")


def test_compile_modes(smoke):
    c = _ok(smoke, "compile_modes")
    assert c["ok"], c


def test_bf16_autocast_training_step(smoke):
    assert _ok(smoke, "amp_training")["ok"]


def test_warm_compile_hits_the_cache(smoke):
    c = _ok(smoke, "compile_cache")
    assert c["warm_fxgraph_cache_hit"] >= 1 and c["warm_fxgraph_cache_miss"] == 0, (
        f"the warm process did not hit Inductor's FX graph cache: {c['warm_counters']}")


def test_warm_compile_3x_faster_than_cold(smoke, thresholds):
    c = _ok(smoke, "compile_cache")
    speedup = c["cold_s"] / max(c["warm_s"], 1e-9)
    assert speedup >= thresholds["compile_cache_min_speedup"], (
        f"warm compile {c['warm_s']} s vs cold {c['cold_s']} s = {speedup:.2f}x (< {thresholds['compile_cache_min_speedup']}x)")


# --- multi-GPU: skipped, not passed, on one GPU -----------------------------------------------------------

def _multi(smoke) -> dict:
    m = _ok(smoke, "multi_gpu")
    if m.get("skipped"):
        pytest.skip(m["skipped"])
    return m


def test_multi_gpu_allreduce_exact(smoke):
    m = _multi(smoke)
    bad = [a for a in m["allreduce"] if not a["exact"]]
    assert not bad, f"all-reduce sums wrong at sizes {[a['bytes'] for a in bad]}"


def test_multi_gpu_compiled_ddp_matches_reference(smoke):
    m = _multi(smoke)
    assert m["ddp"]["ok"], f"DDP(compiled) differs from the one-process reference by {m['ddp']['max_abs_diff']}"


def test_multi_gpu_bus_bandwidth(smoke, pytestconfig, facts):
    m = _multi(smoke)
    name = smoke["device"]["name"]
    want, source = pytestconfig.getoption("gpuforge_min_busbw"), "--gpuforge-min-busbw"
    if want is None:
        floor = compat.busbw_floor(name)
        assert floor, f"no bus-bandwidth floor for {name} in the compat data: pass --gpuforge-min-busbw GB/s"
        (_model, want), source = floor, f"the compat data's floor for {floor[0]}"
    big = max(m["allreduce"], key=lambda a: a["bytes"])
    facts["busbw"] = {"best_gbs": big["busbw_gbs"], "cv": big["busbw_cv"], "trials": big["trials"], "floor_gbs": want,
                      "floor_from": source}
    assert big["busbw_gbs"] >= want, (f"best-of-{big['trials']} all-reduce bus bandwidth at {big['bytes'] >> 20} MiB is "
                                      f"{big['busbw_gbs']} GB/s (CV {big['busbw_cv']}) < {want} GB/s ({source})")
