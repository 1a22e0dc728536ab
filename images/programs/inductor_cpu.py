"""Inductor on the CPU: compile a fused elementwise function and a small MLP, compare with eager,
and prove Inductor generated and compiled C++ (a missing gcc or Python.h fails here, before any GPU).

Prints one JSON object; exits 0 even on a failed check (the validator asserts on the JSON).
"""

from __future__ import annotations

import glob
import json
import os
import sys
import tempfile
import time


def main() -> int:
    cache = tempfile.mkdtemp(prefix="gpuforge-inductor-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache  # fresh cache: force a real compile
    report: dict = {"cache_dir": cache}
    try:
        import torch
        from torch._dynamo.utils import counters
    except Exception as e:  # report, don't crash: the validator names the problem
        report["error"] = f"import torch failed: {e!r}"
        print(json.dumps(report))
        return 0
    torch.manual_seed(0)

    def fused(x):
        return torch.relu(x + 1) * 0.5

    mlp = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 8)).eval()
    x = torch.randn(4096, 64)
    try:
        t0 = time.perf_counter()
        got = torch.compile(fused)(x)
        report["fused_compile_s"] = round(time.perf_counter() - t0, 3)
        report["fused_match"] = bool(torch.allclose(got, fused(x)))
        with torch.no_grad():
            t0 = time.perf_counter()
            got = torch.compile(mlp)(x)
            report["mlp_compile_s"] = round(time.perf_counter() - t0, 3)
            report["mlp_match"] = bool(torch.allclose(got, mlp(x), atol=1e-5, rtol=1e-4))
    except Exception as e:
        report["error"] = f"torch.compile failed: {type(e).__name__}: {str(e)[-2000:]}"
    report["aoti_loader"] = aoti_loader(torch, mlp, x)
    report["inductor_counters"] = {k: dict(v) for k, v in counters.items() if k in ("inductor", "stats")}
    # Proof of codegen: Inductor writes C++ sources and builds shared objects under its cache.
    report["cpp_sources"] = len(glob.glob(os.path.join(cache, "**", "*.cpp"), recursive=True))
    report["shared_objects"] = len(glob.glob(os.path.join(cache, "**", "*.so"), recursive=True))
    report["torch"] = torch.__version__
    # The vector ISA the kernels were built for, and whether the switch that skips Inductor's per-process ISA
    # probe is set (the image sets TORCHINDUCTOR_VEC_ISA_OK=1; AMX is probed regardless): the compile above is
    # then the proof the toolchain builds that ISA.
    try:
        from torch._inductor.cpu_vec_isa import pick_vec_isa

        report["vec_isa"] = str(pick_vec_isa()) or "none (scalar code)"
    except Exception as e:  # a record only
        report["vec_isa"] = f"unknown ({type(e).__name__})"
    report["vec_isa_ok"] = os.environ.get("TORCHINDUCTOR_VEC_ISA_OK")
    print(json.dumps(report))
    return 0


def aoti_loader(torch, model, x) -> dict:
    """The warm start's package loader on this image's torch, on the CPU: a CPU AOTInductor package of the MLP,
    opened by warm_start.open_package. A warm start that falls back to aoti_load_package (a loader binding
    that changed with torch) pays its module import, 0.9 s of a 3 s start on torch 2.7.1: caught here, not on
    a GPU node."""
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    got: dict = {}
    try:
        from gpu_smoke import aoti_build_configs
        from warm_start import open_package

        with tempfile.TemporaryDirectory(prefix="gpuforge-aoti-cpu-") as d, torch.no_grad():
            t0 = time.perf_counter()
            pkg = torch._inductor.aoti_compile_and_package(torch.export.export(model, (x,)),
                                                           package_path=os.path.join(d, "mlp.pt2"),
                                                           inductor_configs=aoti_build_configs())
            got["build_s"] = round(time.perf_counter() - t0, 3)
            runner = open_package(pkg)
            got["binding"] = getattr(runner, "binding", "unknown")
            got["match"] = bool(torch.allclose(runner(x), model(x), atol=1e-5, rtol=1e-4))
    except Exception as e:
        got["error"] = f"{type(e).__name__}: {str(e)[-1000:]}"
    return got


if __name__ == "__main__":
    sys.exit(main())
