"""The GPU smoke suite's compile steps, proven without a GPU (the CPU validators run this in every validation).

- triton: the smoke's hand-written kernel (smoke_kernels.axpy) compiled ahead of time under the image's own
  Triton, for each capability asked (default: sm_80 and sm_90), to a cubin — a kernel the image's Triton cannot
  compile fails here, on the CPU box, not first on a GPU runner.
- aoti: the C++ wrapper AOTInductor writes for a CUDA package, built and linked the way torch builds it
  (torch._inductor.cpp_builder with the CUDA device options: CUDA_HOME's headers, torch's libraries, -lcuda):
  a source that includes what the generated wrapper includes (torch/csrc/inductor/aoti_include/cuda.h, which pulls
  cuda.h, cuda_runtime_api.h and through it crt/host_defines.h) and calls the driver API as the wrapper does
  (cuModuleLoad, cuLaunchKernel). A missing CUDA_HOME, a missing crt/ header or no libcuda to link fails here.

  python3 gpu_compile_cpu.py [--capabilities 80,90]

Prints one JSON object; exits 0 even on a failed part (the validator asserts on the JSON and names the error).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback

WRAPPER = r"""
#include <torch/csrc/inductor/aoti_include/cuda.h>
#include <cuda.h>
#include <cuda_runtime_api.h>

extern "C" int gpuforge_probe(const char* cubin, const char* name) {
    CUmodule module;
    CUfunction fn;
    if (cuModuleLoad(&module, cubin) != CUDA_SUCCESS) return 1;
    if (cuModuleGetFunction(&fn, module, name) != CUDA_SUCCESS) return 2;
    if (cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, nullptr) != CUDA_SUCCESS) return 3;
    int device = 0;
    return cudaGetDevice(&device) == cudaSuccess ? 0 : 4;
}
"""


def _error(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e)[-1500:]}"


def triton_part(capabilities: list[int]) -> dict:
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    out: dict = {}
    try:
        import smoke_kernels
        import triton
    except Exception as e:
        return {"ok": False, "error": f"import: {_error(e)}"}
    out["triton"] = triton.__version__
    out["compiled"] = []
    for cap in capabilities:
        t0 = time.perf_counter()
        try:
            got = smoke_kernels.compile_axpy(cap)
        except Exception as e:
            out.update(ok=False, error=f"smoke_kernels.axpy for sm_{cap} under Triton {triton.__version__}: {_error(e)}",
                       traceback=traceback.format_exc()[-2000:])
            return out
        out["compiled"].append({**got, "seconds": round(time.perf_counter() - t0, 3)})
    out["ok"] = all(c["cubin_bytes"] > 0 for c in out["compiled"])
    return out


def aoti_part() -> dict:
    try:
        import torch
        from torch._inductor.cpp_builder import CppBuilder, CppTorchDeviceOptions
        from torch.utils import cpp_extension
    except Exception as e:
        return {"ok": False, "error": f"import: {_error(e)}"}
    out: dict = {"cuda_home": cpp_extension.CUDA_HOME, "torch": torch.__version__}
    with tempfile.TemporaryDirectory(prefix="gpuforge-aoti-toolchain-") as d:
        src = os.path.join(d, "wrapper.cpp")
        with open(src, "w") as f:
            f.write(WRAPPER)
        t0 = time.perf_counter()
        try:
            opts = CppTorchDeviceOptions(device_type="cuda", aot_mode=True)
            builder = CppBuilder("wrapper", [src], opts, output_dir=d)
            out["command"] = builder.get_command_line()[-1500:]
            builder.build()
            so = builder.get_target_file_path()
        except Exception as e:
            out.update(ok=False, error=_error(e))
            return out
        out["build_s"] = round(time.perf_counter() - t0, 3)
        # the linked library must need the driver's libcuda.so.1 (what loads on a GPU node), as AOTI's does
        r = subprocess.run(["readelf", "-d", so], capture_output=True, text=True, check=False)
        needed = [ln.split("[", 1)[1].rstrip("]") for ln in r.stdout.splitlines() if "(NEEDED)" in ln]
        out["needed"] = needed
        out["ok"] = "libcuda.so.1" in needed
        if not out["ok"]:
            out["error"] = f"the wrapper links no libcuda.so.1 (NEEDED: {', '.join(needed) or r.stderr.strip()})"
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--capabilities", default="80,90", help="compute capabilities to compile the Triton kernel for")
    args = ap.parse_args(argv)
    try:
        caps = [int(c) for c in args.capabilities.split(",")]
    except ValueError:
        print(f"gpuforge: error: --capabilities {args.capabilities!r}: use numbers such as 80,90", file=sys.stderr)
        return 64
    print(json.dumps({"triton": triton_part(caps), "aoti": aoti_part()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
