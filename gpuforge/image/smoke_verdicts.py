"""The GPU smoke suite's verdicts, once: each function takes a check's raw figures (as images/programs/gpu_smoke.py
records them) and the bars (gpuforge/image/data/compat.yaml's smoke_thresholds) and returns what is wrong (empty:
the check passes).

The in-image program computes each check's `ok` with these functions and the bars it was given; the validator
(validators/test_gpu_smoke.py) applies the same functions to the same raw figures with the host toolkit's bars,
so an image that lowers its own bar, or reports `ok` without the figures, still fails. Stdlib only (every image
carries gpuforge/image; the bars come in as a dict).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def default_thresholds() -> dict[str, Any]:
    """The compat data's bars (a bare `selftest` in an image; the validator passes the host's instead)."""
    from gpuforge.image import compat  # PyYAML: only when no bars were passed

    return compat.smoke_thresholds()


def _over(figures: dict[str, Any], limits: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: figures[key.format(k)] for k in limits if not figures[key.format(k)] < limits[k]}


def matmul_errors(m: dict[str, Any], th: dict[str, Any]) -> list[str]:
    lim = th["matmul_rel_err"]
    over = _over(m, lim, "{}_rel_err")
    return [f"matmul errors vs fp64 over the limits {lim}: {over}"] if over else []


def tf32_used(m: dict[str, Any], th: dict[str, Any]) -> list[str]:
    """With TF32 allowed the error must grow by the mantissa cut; equal errors mean TF32 never ran."""
    ratio = m["tf32_rel_err"] / max(m["fp32_rel_err"], 1e-30)
    if ratio >= th["tf32_min_err_ratio"]:
        return []
    return [f"TF32 error {m['tf32_rel_err']:.2e} is only {ratio:.1f}x strict fp32's {m['fp32_rel_err']:.2e}: TF32 did not run"]


def cudnn_conv(c: dict[str, Any], th: dict[str, Any]) -> list[str]:
    lim = th["conv_rel_err"]
    out = []
    if not (c["forward_rel_err"] < lim["fp32"] and c["backward_rel_err"] < lim["fp32"]):
        out.append(f"fp32 cuDNN conv errors forward {c['forward_rel_err']:.2e}, backward {c['backward_rel_err']:.2e} "
                   f"> {lim['fp32']}")
    if not c["bf16_forward_rel_err"] < lim["bf16"]:
        out.append(f"bf16 cuDNN conv error {c['bf16_forward_rel_err']:.2e} > {lim['bf16']}")
    return out


def sdpa(s: dict[str, Any], th: dict[str, Any]) -> list[str]:
    out = [f"SDPA backend {n} unavailable on this GPU: {s['backends'][n].get('why')}"
           for n in s["required"] if not s["backends"][n]["ran"]]
    bad = {n: b["rel_err"] for n, b in s["backends"].items() if b["ran"] and not b["rel_err"] < th["sdpa_rel_err"]}
    if bad:
        out.append(f"SDPA backends off the math backend by more than {th['sdpa_rel_err']}: {bad}")
    return out


def cufft(f: dict[str, Any], th: dict[str, Any]) -> list[str]:
    worst = max(f["rfft_rel_err"], f["roundtrip_rel_err"])
    return [] if worst < th["fft_rel_err"] else [f"cuFFT error {worst:.2e} >= {th['fft_rel_err']}"]


def curand(r: dict[str, Any], th: dict[str, Any]) -> list[str]:
    out = [] if all(c == 0 for c in r["status_codes"]) else [f"cuRAND calls returned {r['status_codes']}"]
    tol = th["rand_moment_tol"]
    if not (abs(r["mean"]) < tol and abs(r["std"] - 1) < tol):
        out.append(f"cuRAND normals: mean {r['mean']}, std {r['std']} (tolerance {tol})")
    return out


def cusolver(s: dict[str, Any], th: dict[str, Any]) -> list[str]:
    lim = th["solver_residual"]
    figures = {k: s[k] for k in ("solve_residual", "cholesky_residual", "eigvalsh_rel_err")}
    over = {k: v for k, v in figures.items() if not v < lim}
    return [f"cuSOLVER residuals over {lim}: {over}"] if over else []


def nvrtc(n: dict[str, Any], th: dict[str, Any]) -> list[str]:
    ok = n["rel_err"] < th["jiterator_rel_err"]
    return [] if ok else [f"NVRTC (jiterator) kernel off eager by {n['rel_err']:.2e} >= {th['jiterator_rel_err']}"]


def aoti(a: dict[str, Any], th: dict[str, Any]) -> list[str]:
    ok = a["rel_err"] < th["aoti_rel_err"]
    return [] if ok else [f"the AOTInductor package's output is off eager by {a['rel_err']:.2e} (>= {th['aoti_rel_err']})"]


def cuda_extension(e: dict[str, Any], th: dict[str, Any]) -> list[str]:
    ok = e["rel_err"] < th["extension_rel_err"]
    return [] if ok else [f"the load_inline extension's NVRTC kernel is off eager by {e['rel_err']:.2e} "
                          f"(>= {th['extension_rel_err']})"]


# torch.compile modes the smoke compiles one fused GEMM epilogue in; each must be there and match eager
COMPILE_MODES = ("reduce-overhead", "max-autotune-no-cudagraphs")
COMPILE_MODE_REL_ERR = 1e-3  # fp32 (TF32 off) against eager: a mode that is wrong, not merely rounded


def compile_modes(c: dict[str, Any], th: dict[str, Any] | None = None) -> list[str]:
    out = []
    for mode in COMPILE_MODES:
        m = c.get(mode)
        if not isinstance(m, dict):
            out.append(f"mode {mode} did not run")
        elif "error" in m:
            out.append(f"mode {mode}: {m['error'][-300:]}")
        elif not m["rel_err"] < COMPILE_MODE_REL_ERR:
            out.append(f"mode {mode} is off eager by {m['rel_err']:.2e} (>= {COMPILE_MODE_REL_ERR})")
    return out


def fusion_kernels(f: dict[str, Any], th: dict[str, Any] | None = None) -> list[str]:
    out = []
    if f["eager_kernels"] != 3:
        out.append(f"eager launched {f['eager_kernels']} kernels, expected 3")
    if f["compiled_kernels"] != 1:
        out.append(f"compiled launched {f['compiled_kernels']} kernels, expected 1 (no fusion)")
    if not f["equal"]:
        out.append("compiled result differs from eager")
    return out


def fusion_bandwidth(f: dict[str, Any], th: dict[str, Any]) -> list[str]:
    ratio = f["compiled_gbs"] / f["copy_gbs"]
    if ratio >= th["fusion_min_ratio"]:
        return []
    return [f"fused kernel {f['compiled_gbs']} GB/s is {ratio:.0%} of the device copy {f['copy_gbs']} GB/s "
            f"(< {th['fusion_min_ratio']:.0%})"]


def compile_cache_hits(c: dict[str, Any], th: dict[str, Any] | None = None) -> list[str]:
    if c["warm_fxgraph_cache_hit"] >= 1 and c["warm_fxgraph_cache_miss"] == 0:
        return []
    return [f"the warm process did not hit Inductor's FX graph cache: {c['warm_counters']}"]


def compile_cache_speedup(c: dict[str, Any], th: dict[str, Any]) -> list[str]:
    speedup = c["cold_s"] / max(c["warm_s"], 1e-9)
    if speedup >= th["compile_cache_min_speedup"]:
        return []
    return [f"warm compile {c['warm_s']} s vs cold {c['cold_s']} s = {speedup:.2f}x (< {th['compile_cache_min_speedup']}x)"]


# check name (as gpu_smoke.py reports it) -> the verdicts that decide it
VERDICTS: dict[str, tuple[Callable[[dict[str, Any], dict[str, Any]], list[str]], ...]] = {
    "matmul": (matmul_errors, tf32_used),
    "cudnn_conv": (cudnn_conv,),
    "sdpa": (sdpa,),
    "cufft": (cufft,),
    "curand": (curand,),
    "cusolver": (cusolver,),
    "nvrtc": (nvrtc,),
    "aoti": (aoti,),
    "aoti_cpp": (aoti,),
    "cuda_extension": (cuda_extension,),
    "fusion": (fusion_kernels, fusion_bandwidth),
    "compile_cache": (compile_cache_hits, compile_cache_speedup),
    "compile_modes": (compile_modes,),
}


def judge(name: str, res: dict[str, Any], th: dict[str, Any]) -> dict[str, Any]:
    """`res` with `problems` and `ok` set by the check's verdicts; a check that errored, or whose own
    precondition (`ok` it recorded, e.g. cuDNN available) is false, stays failed."""
    if name not in VERDICTS or "error" in res:
        return res
    try:
        problems = [p for v in VERDICTS[name] for p in v(res, th)]
    except (KeyError, TypeError, ZeroDivisionError) as e:  # figures missing: the program is not the one expected
        problems = [f"figures missing or malformed ({type(e).__name__}: {e})"]
    return {**res, "problems": problems, "ok": not problems and res.get("ok", True)}


def cudnn_dotted(n: int) -> str:
    """torch.backends.cudnn.version(): 90501 -> 9.5.1 (major*10000 + minor*100 + patch, cuDNN 9 and later)."""
    return f"{n // 10000}.{n // 100 % 100}.{n % 100}"


def version_mismatches(device: dict[str, Any], expected: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(what differs, what was compared) between the versions the GPU process reports (the device check: torch,
    CUDA, cuDNN, Triton, the arch list with its PTX) and the expected ones (target.json with smoke --expect
    overrides). A field the target does not give is not compared; each mismatch names both values."""
    wrong, compared = [], []

    def cmp(name: str, want: object, got: object) -> None:
        compared.append(name)
        if want != got:
            wrong.append(f"{name}: the image reports {got}, expected {want}")

    for name in ("torch", "cuda", "triton"):
        if expected.get(name) is not None:
            cmp(name, str(expected[name]), device.get(name))
    if expected.get("cudnn") is not None:
        got = device.get("cudnn")
        cmp("cudnn", ".".join(str(expected["cudnn"]).split(".")[:3]), cudnn_dotted(got) if isinstance(got, int) else got)
    if expected.get("arch_list") is not None:
        arch = device.get("arch_list") or []
        want = sorted(expected["arch_list"]) + sorted(expected.get("ptx") or [])
        cmp("arch_list", ",".join(want), ",".join(sorted(a for a in arch if a.startswith("sm_"))
                                                  + sorted(a for a in arch if a.startswith("compute_"))))
    return wrong, compared
