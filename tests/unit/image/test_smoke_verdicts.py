"""The smoke verdicts live once (gpuforge.image.smoke_verdicts): the program decides `ok` with them and the bars it
was given, the validator re-applies them with the host's bars. An image that lowers its own bar still fails."""

from __future__ import annotations

import copy

import pytest

from gpuforge.image import compat
from gpuforge.image import smoke_verdicts as v

TH = compat.smoke_thresholds()
# Figures as gpu_smoke.py records them, each comfortably inside the compat data's bars.
GOOD = {
    "matmul": {"fp32_rel_err": 1e-7, "tf32_rel_err": 1e-4, "bf16_rel_err": 3e-3},
    "cudnn_conv": {"ok": True, "forward_rel_err": 1e-6, "backward_rel_err": 1e-6, "bf16_forward_rel_err": 5e-3},
    "sdpa": {"required": ["FLASH_ATTENTION"], "backends": {"FLASH_ATTENTION": {"ran": True, "rel_err": 5e-3},
                                                          "CUDNN_ATTENTION": {"ran": False, "why": "sm_70"}}},
    "cufft": {"rfft_rel_err": 1e-7, "roundtrip_rel_err": 1e-7},
    "curand": {"status_codes": [0, 0, 0, 0, 0], "mean": 1e-4, "std": 1.0001},
    "cusolver": {"solve_residual": 1e-12, "cholesky_residual": 1e-13, "eigvalsh_rel_err": 1e-14},
    "nvrtc": {"rel_err": 1e-8},
    "aoti": {"rel_err": 1e-6},
    "aoti_cpp": {"rel_err": 1e-6},
    "cuda_extension": {"rel_err": 2e-8},
    "fusion": {"eager_kernels": 3, "compiled_kernels": 1, "equal": True, "compiled_gbs": 3000.0, "copy_gbs": 3200.0},
    "compile_cache": {"warm_fxgraph_cache_hit": 1, "warm_fxgraph_cache_miss": 0, "warm_counters": {}, "cold_s": 20.0,
                      "warm_s": 2.0},
    "compile_modes": {"reduce-overhead": {"rel_err": 1e-9, "compile_s": 4.0},
                      "max-autotune-no-cudagraphs": {"rel_err": 6e-7, "compile_s": 31.0}},
}
# (check, a figure path, a bad value, words of the problem)
BAD = [
    ("matmul", ("bf16_rel_err",), 0.5, "matmul errors vs fp64 over the limits"),
    ("matmul", ("tf32_rel_err",), 2e-7, "TF32 did not run"),
    ("cudnn_conv", ("bf16_forward_rel_err",), 0.1, "bf16 cuDNN conv error"),
    ("cudnn_conv", ("backward_rel_err",), 1e-2, "fp32 cuDNN conv errors"),
    ("sdpa", ("backends", "FLASH_ATTENTION", "ran"), False, "unavailable on this GPU"),
    ("sdpa", ("backends", "FLASH_ATTENTION", "rel_err"), 0.5, "off the math backend"),
    ("cufft", ("roundtrip_rel_err",), 1e-3, "cuFFT error"),
    ("curand", ("status_codes",), [0, 101], "cuRAND calls returned"),
    ("curand", ("std",), 1.5, "cuRAND normals"),
    ("cusolver", ("eigvalsh_rel_err",), 1e-3, "cuSOLVER residuals over"),
    ("nvrtc", ("rel_err",), 1e-3, "NVRTC"),
    ("aoti", ("rel_err",), 1e-2, "AOTInductor"),
    ("cuda_extension", ("rel_err",), 1e-4, "the load_inline extension's NVRTC kernel is off eager"),
    ("fusion", ("compiled_kernels",), 2, "expected 1 (no fusion)"),
    ("fusion", ("compiled_gbs",), 100.0, "of the device copy"),
    ("compile_cache", ("warm_fxgraph_cache_miss",), 1, "did not hit Inductor's FX graph cache"),
    ("compile_cache", ("warm_s",), 15.0, "(< 3.0x)"),
    ("compile_modes", ("max-autotune-no-cudagraphs", "rel_err"), 0.2, "mode max-autotune-no-cudagraphs is off eager"),
    ("compile_modes", ("reduce-overhead",), None, "mode reduce-overhead did not run"),
    ("compile_modes", ("reduce-overhead",), {"ok": False, "error": "mode process exit 1: boom"},
     "mode reduce-overhead: mode process exit 1: boom"),
]


def test_good_figures_pass_every_verdict():
    assert set(GOOD) == set(v.VERDICTS)
    for name, figures in GOOD.items():
        res = v.judge(name, copy.deepcopy(figures), TH)
        assert res["ok"] is True and res["problems"] == [], (name, res["problems"])


@pytest.mark.parametrize(("name", "path", "value", "words"), BAD, ids=[f"{b[0]}-{b[1][-1]}" for b in BAD])
def test_each_bar_fails_for_its_reason(name, path, value, words):
    figures = copy.deepcopy(GOOD[name])
    node = figures
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    res = v.judge(name, figures, TH)
    assert res["ok"] is False
    assert any(words in p for p in res["problems"]), res["problems"]


def test_an_image_that_lowers_its_own_bar_still_fails_on_the_host():
    figures = {**GOOD["nvrtc"], "rel_err": 1e-3}
    lowered = {**TH, "jiterator_rel_err": 1.0}
    assert v.judge("nvrtc", figures, lowered)["ok"] is True  # what a doctored image would report
    assert v.nvrtc(figures, TH)  # what the validator, with the host's bars, says


def test_an_errored_check_or_a_failed_precondition_stays_failed():
    assert v.judge("cufft", {"ok": False, "error": "boom"}, TH) == {"ok": False, "error": "boom"}
    assert v.judge("cudnn_conv", {**GOOD["cudnn_conv"], "ok": False}, TH)["ok"] is False  # cuDNN not available
    res = v.judge("cufft", {"ok": True}, TH)  # an `ok` without the figures
    assert res["ok"] is False and "figures missing" in res["problems"][0]


def test_the_program_has_no_copy_of_the_bars():
    from gpuforge import paths

    text = (paths.programs() / "gpu_smoke.py").read_text()
    assert "DEFAULTS" not in text and "jiterator_rel_err\": " not in text and "smoke_verdicts.judge" in text


DEVICE = {"ok": True, "torch": "2.7.1+cu126", "cuda": "12.6", "cudnn": 90501, "triton": "3.3.1",
          "arch_list": ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"]}
TARGET = {"torch": "2.7.1+cu126", "cuda": "12.6", "cudnn": "9.5.1.17", "triton": "3.3.1",
          "arch_list": ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"], "ptx": []}


def test_versions_of_the_image_match_its_target():
    wrong, compared = v.version_mismatches(DEVICE, TARGET)
    assert wrong == [] and compared == ["torch", "cuda", "triton", "cudnn", "arch_list"]


@pytest.mark.parametrize(("key", "value", "words"), [
    ("torch", "2.6.0", "torch: the image reports 2.7.1+cu126, expected 2.6.0"),
    ("cuda", "12.8", "cuda: the image reports 12.6, expected 12.8"),
    ("cudnn", "9.7.1.26", "cudnn: the image reports 9.5.1, expected 9.7.1"),
    ("triton", "3.6.0", "triton: the image reports 3.3.1, expected 3.6.0"),
    ("arch_list", ["sm_90", "sm_100"], "arch_list: the image reports sm_50,sm_60,sm_70,sm_75,sm_80,sm_86,sm_90, expected sm_100,sm_90"),
    ("ptx", ["compute_90"], "expected sm_50,sm_60,sm_70,sm_75,sm_80,sm_86,sm_90,compute_90"),
])
def test_each_version_mismatch_names_both_values(key, value, words):
    wrong, _ = v.version_mismatches(DEVICE, {**TARGET, key: value})
    assert len(wrong) == 1 and words in wrong[0], wrong


def test_a_target_without_versions_compares_nothing():
    assert v.version_mismatches(DEVICE, {"id": "x"}) == ([], [])
