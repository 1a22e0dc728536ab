"""GPU smoke: the selftest program's JSON report, asserted check by check (needs --gpuforge-gpu).

Every bar comes from the host toolkit (gpuforge/image/data/compat.yaml's smoke_thresholds, read in this
process): it is passed to the program and re-applied here to the raw figures by the same verdict functions the
program uses (gpuforge.image.smoke_verdicts), so an image that lowers its own bar still fails.
"""

from __future__ import annotations

import json
import os

import pytest

from gpuforge.image import compat, hostinfo
from gpuforge.image import smoke_verdicts as verdict
from gpuforge.validate.selection import EnvSkip
from vutil import EnvSkipped, sh

pytestmark = pytest.mark.gpu  # chosen for GPU runs only (gpuforge.validate.selection)


@pytest.fixture(scope="session")
def thresholds() -> dict:
    return compat.smoke_thresholds()


@pytest.fixture(scope="module")
def smoke(host, programs, facts, thresholds, target):
    devel = " --devel" if target.get("flavor") == "devel" else ""  # devel images promise the C++ AOTI path too
    r = sh(host, "python3 %s --multi-gpu" + devel + " --thresholds %s", f"{programs}/gpu_smoke.py", json.dumps(thresholds),
           timeout=1800, check=False)
    try:
        rep = json.loads(r.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        pytest.fail(f"the smoke program printed no report (exit {r.rc}): {(r.stderr or r.stdout)[-3000:]}")
    facts["gpu_smoke"] = rep
    facts["gpu_smoke_seconds"] = {"total": rep.get("seconds"), **{n: c.get("seconds") for n, c in rep["checks"].items()}}
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
def device(request, host, programs, timeout):
    """What CUDA sees: the full smoke's own device check when this run has smoke checks (a GPU process's start is
    seconds of the smoke's wall: one, not two), else a quick probe of the count alone."""
    if any("smoke" in item.fixturenames for item in request.session.items):
        return request.getfixturevalue("smoke")["device"]
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


def test_versions_are_the_expected_ones(device, target, facts):
    """torch, CUDA, cuDNN, Triton and the arch list as the GPU process reports them, against the target (with
    smoke --expect overrides): a mismatch fails with both values."""
    assert device.get("ok"), device.get("error")
    wrong, compared = verdict.version_mismatches(device, target.expected.as_dict())
    facts["versions_compared"] = {k: device.get(k) for k in compared}
    assert compared, "the target gives none of torch, cuda, cudnn, triton, arch_list: pass --expect KEY=VALUE"
    assert not wrong, "; ".join(wrong)


# --- single-GPU checks ------------------------------------------------------------------------------------

def test_cuda_available(smoke):
    d = smoke["device"]
    assert d["ok"], d.get("error")


def test_shm_at_least_1_gib(smoke):
    s = _ok(smoke, "shm")
    assert s["ok"], f"/dev/shm is {s['gib']} GiB (< 1 GiB): {s['hint']}"


def test_cublas_matmul_fp32_tf32_bf16(smoke, thresholds):
    problems = verdict.matmul_errors(_ok(smoke, "matmul"), thresholds)
    assert not problems, "; ".join(problems)


def test_tf32_really_used(smoke, thresholds):
    """With TF32 allowed the error must grow by the mantissa cut; equal errors mean TF32 never ran."""
    problems = verdict.tf32_used(_ok(smoke, "matmul"), thresholds)
    assert not problems, "; ".join(problems)


def test_cudnn_conv_fp32_and_bf16(smoke, thresholds):
    problems = verdict.cudnn_conv(_ok(smoke, "cudnn_conv"), thresholds)
    assert not problems, "; ".join(problems)


def test_sdpa_backends_match_math(smoke, thresholds):
    problems = verdict.sdpa(_ok(smoke, "sdpa"), thresholds)
    assert not problems, "; ".join(problems)


def test_cufft(smoke, thresholds):
    problems = verdict.cufft(_ok(smoke, "cufft"), thresholds)
    assert not problems, "; ".join(problems)


def test_curand_host_api(smoke, thresholds):
    problems = verdict.curand(_ok(smoke, "curand"), thresholds)
    assert not problems, "; ".join(problems)


def test_cusolver(smoke, thresholds):
    problems = verdict.cusolver(_ok(smoke, "cusolver"), thresholds)
    assert not problems, "; ".join(problems)


def test_nvrtc_jiterator(smoke, thresholds):
    problems = verdict.nvrtc(_ok(smoke, "nvrtc"), thresholds)
    assert not problems, "; ".join(problems)


def test_aotinductor_package_round_trip(smoke, thresholds, target):
    """Python: package, load in a fresh process, compare with eager; devel images: also a C++ loader."""
    problems = verdict.aoti(_ok(smoke, "aoti"), thresholds)
    if target.get("flavor") == "devel":
        problems += [f"the C++ loader: {p}" for p in verdict.aoti(_ok(smoke, "aoti_cpp"), thresholds)]
    assert not problems, "; ".join(problems)


@pytest.mark.flavor("devel")
def test_devel_cuda_extension_runs(smoke, thresholds):
    """devel: a load_inline extension whose NVRTC-compiled kernel runs on torch's stream and matches fp64 eager."""
    problems = verdict.cuda_extension(_ok(smoke, "cuda_extension"), thresholds)
    assert not problems, "; ".join(problems)


def test_handwritten_triton_kernel(smoke):
    assert _ok(smoke, "triton_kernel")["ok"]


def test_fusion_kernel_counts(smoke):
    problems = verdict.fusion_kernels(_ok(smoke, "fusion"))
    assert not problems, "; ".join(problems)


def test_fusion_bandwidth(smoke, thresholds):
    problems = verdict.fusion_bandwidth(_ok(smoke, "fusion"), thresholds)
    assert not problems, "; ".join(problems)


def test_compile_modes(smoke):
    problems = verdict.compile_modes(_ok(smoke, "compile_modes"))
    assert not problems, "; ".join(problems)


def test_bf16_autocast_training_step(smoke):
    assert _ok(smoke, "amp_training")["ok"]


def test_warm_compile_hits_the_cache(smoke):
    problems = verdict.compile_cache_hits(_ok(smoke, "compile_cache"))
    assert not problems, "; ".join(problems)


def test_warm_compile_3x_faster_than_cold(smoke, thresholds):
    problems = verdict.compile_cache_speedup(_ok(smoke, "compile_cache"), thresholds)
    assert not problems, "; ".join(problems)


# --- multi-GPU: skipped, not passed, on one GPU -----------------------------------------------------------

def _multi(smoke) -> dict:
    m = _ok(smoke, "multi_gpu")
    if m.get("skipped"):
        if m.get("world_size") == 1:  # the one environmental skip here; any other is not evidence
            raise EnvSkipped(EnvSkip.ONE_GPU, m["skipped"])
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
