"""A CUDA extension as an ML engineer builds one in a devel image: torch.utils.cpp_extension.load_inline, compiled
with the image's g++ against libtorch and CUDA_HOME's headers, linked with CUDA_HOME/lib64.

The extension compiles a fused bias + GELU kernel (CUDA C++, libcu++ from CCCL) at run time with NVRTC for the
GPU's architecture, loads the cubin through the driver API (reached through the CUDA runtime's entry points, so
the extension needs no libcuda at load time) and launches it on torch's current stream.

  --compile-only --arch sm_90   build, import and NVRTC-compile for that architecture; no GPU needed
  (default)                     also run on GPU 0 and compare with torch's eager reference

Prints one JSON object. Needs CUDA_HOME (a devel image's).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

# The extension's CUDA half: torch-free, so a CPU test builds it against a CUDA_HOME assembled from the toolkit
# wheels alone (tests/integration/image/test_toolkit_wheels.py), for CUDA 11.8 and 12 alike.
CUDA_CPP = r"""
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <nvrtc.h>
#include <thrust/version.h>
#include <cub/version.cuh>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

static void nvrtc_ok(nvrtcResult r, const char* what) {
  if (r != NVRTC_SUCCESS) throw std::runtime_error(std::string(what) + ": " + nvrtcGetErrorString(r));
}

// NVRTC: CUDA C++ source -> cubin for one architecture (sm_90); the log says why a compile failed.
std::string compile_cubin(const std::string& source, const std::string& arch, const std::string& include_dir) {
  nvrtcProgram prog;
  nvrtc_ok(nvrtcCreateProgram(&prog, source.c_str(), "gpuforge_kernel.cu", 0, nullptr, nullptr), "nvrtcCreateProgram");
  std::string arch_opt = "--gpu-architecture=" + arch, inc = "-I" + include_dir;
  std::vector<const char*> opts = {arch_opt.c_str(), inc.c_str(), "--std=c++17", "-default-device"};
  nvrtcResult r = nvrtcCompileProgram(prog, (int)opts.size(), opts.data());
  if (r != NVRTC_SUCCESS) {
    size_t n = 0;
    nvrtcGetProgramLogSize(prog, &n);
    std::string log(n, '\0');
    nvrtcGetProgramLog(prog, &log[0]);
    nvrtcDestroyProgram(&prog);
    throw std::runtime_error("NVRTC could not compile the kernel: " + log);
  }
  size_t size = 0;
  nvrtc_ok(nvrtcGetCUBINSize(prog, &size), "nvrtcGetCUBINSize");
  std::string cubin(size, '\0');
  nvrtc_ok(nvrtcGetCUBIN(prog, &cubin[0]), "nvrtcGetCUBIN");
  nvrtcDestroyProgram(&prog);
  return cubin;
}

template <typename F> static F driver(const char* name) {
  void* fn = nullptr;
#if CUDART_VERSION >= 12000
  cudaDriverEntryPointQueryResult found;
  if (cudaGetDriverEntryPoint(name, &fn, cudaEnableDefault, &found) != cudaSuccess || found != cudaDriverEntryPointSuccess)
#else  // CUDA 11's call has no query result: a symbol the driver lacks is cudaErrorSymbolNotFound (null: checked too)
  if (cudaGetDriverEntryPoint(name, &fn, cudaEnableDefault) != cudaSuccess || fn == nullptr)
#endif
    throw std::runtime_error(std::string("the CUDA driver has no ") + name);
  return reinterpret_cast<F>(fn);
}

static void cu_ok(CUresult r, const char* what) {
  if (r != CUDA_SUCCESS) throw std::runtime_error(std::string(what) + " failed: CUresult " + std::to_string((int)r));
}

std::vector<int64_t> versions() {
  int nv_major = 0, nv_minor = 0;
  nvrtcVersion(&nv_major, &nv_minor);
  return {CUDART_VERSION, nv_major, nv_minor, THRUST_VERSION, CUB_VERSION};
}
"""

CPP = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
""" + CUDA_CPP + r"""
py::bytes compile_kernel(const std::string& source, const std::string& arch, const std::string& include_dir) {
  return py::bytes(compile_cubin(source, arch, include_dir));
}

// out = gelu(x + bias[col]) with the kernel `name` of `cubin`, on torch's current stream.
torch::Tensor launch(py::bytes cubin, const std::string& name, torch::Tensor x, torch::Tensor bias) {
  TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat && x.dim() == 2 && x.is_contiguous(), "x: 2-D float CUDA");
  TORCH_CHECK(bias.is_cuda() && bias.numel() == x.size(1), "bias: one value per column, on the GPU");
  auto out = torch::empty_like(x);
  std::string image = cubin;
  CUmodule mod;
  CUfunction fn;
  cu_ok(driver<decltype(&cuModuleLoadData)>("cuModuleLoadData")(&mod, image.data()), "cuModuleLoadData");
  cu_ok(driver<decltype(&cuModuleGetFunction)>("cuModuleGetFunction")(&fn, mod, name.c_str()), "cuModuleGetFunction");
  const float* xp = x.data_ptr<float>();
  const float* bp = bias.data_ptr<float>();
  float* op = out.data_ptr<float>();
  long long n = x.numel(), cols = x.size(1);
  void* args[] = {&xp, &bp, &op, &n, &cols};
  unsigned threads = 256, blocks = (unsigned)((n + threads - 1) / threads);
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  cu_ok(driver<decltype(&cuLaunchKernel)>("cuLaunchKernel")(fn, blocks, 1, 1, threads, 1, 1, 0, (CUstream)stream, args,
                                                            nullptr), "cuLaunchKernel");
  C10_CUDA_CHECK(cudaStreamSynchronize(stream));
  cu_ok(driver<decltype(&cuModuleUnload)>("cuModuleUnload")(mod), "cuModuleUnload");
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("compile_kernel", &compile_kernel);
  m.def("launch", &launch);
  m.def("versions", &versions);
}
"""

KERNEL = r"""
#include <cuda/std/cstdint>
using index_t = cuda::std::int64_t;
extern "C" __global__ void bias_gelu(const float* x, const float* bias, float* out, index_t n, index_t cols) {
  index_t i = blockIdx.x * (index_t)blockDim.x + threadIdx.x;
  if (i >= n) return;
  float v = x[i] + bias[i % cols];
  out[i] = 0.5f * v * (1.0f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));
}
"""


def build(build_dir: str):
    """The extension, built by load_inline (ninja + g++) and imported."""
    from torch.utils import cpp_extension

    home = os.environ.get("CUDA_HOME")
    if not home or not os.path.isdir(os.path.join(home, "include")):
        msg = f"CUDA_HOME={home!r} has no include/: not a devel image's CUDA_HOME"
        raise RuntimeError(msg)
    lib64 = os.path.join(home, "lib64")
    return cpp_extension.load_inline(
        name="gpuforge_cuda_extension", cpp_sources=[CPP], build_directory=build_dir, with_cuda=False,
        extra_include_paths=[os.path.join(home, "include")],
        extra_cflags=["-O2"],
        extra_ldflags=[f"-L{lib64}", "-lnvrtc", "-lcudart", f"-Wl,-rpath,{lib64}",
                       "-L" + os.path.join(os.path.dirname(cpp_extension.__file__), "..", "lib"), "-lc10_cuda", "-ltorch_cuda"],
        verbose=False)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--compile-only", action="store_true", help="build, import and NVRTC-compile; launch nothing")
    ap.add_argument("--arch", help="the architecture to compile for (default: GPU 0's)")
    args = ap.parse_args(argv)
    print(json.dumps(run(compile_only=args.compile_only, arch=args.arch)))
    return 0


def run(*, compile_only: bool, arch: str | None = None) -> dict:
    import torch

    out: dict = {}
    with tempfile.TemporaryDirectory(prefix="gpuforge-ext-") as d:
        t0 = time.perf_counter()
        try:
            ext = build(d)
        except Exception as e:  # the build's own message (g++'s or ninja's) is the finding
            return {"ok": False, "stage": "build", "error": f"{type(e).__name__}: {str(e)[-3000:]}"}
        out["build_s"] = round(time.perf_counter() - t0, 1)
        cudart, nv_major, nv_minor, thrust, cub = ext.versions()
        out.update(cudart=cudart, nvrtc=f"{nv_major}.{nv_minor}", thrust=thrust, cub=cub)
        if arch is None:
            if not torch.cuda.is_available():
                return {**out, "ok": False, "stage": "arch", "error": "no GPU visible: give --arch (and --compile-only)"}
            major, minor = torch.cuda.get_device_capability(0)
            arch = f"sm_{major}{minor}"
        out["arch"] = arch
        t0 = time.perf_counter()
        try:
            cubin = ext.compile_kernel(KERNEL, arch, os.path.join(os.environ["CUDA_HOME"], "include"))
        except RuntimeError as e:
            return {**out, "ok": False, "stage": "nvrtc", "error": str(e)[-3000:]}
        out.update(nvrtc_s=round(time.perf_counter() - t0, 2), cubin_bytes=len(cubin))
        if compile_only:
            return {**out, "ok": True}
        torch.manual_seed(0)
        x = torch.randn(512, 1024, device="cuda")
        bias = torch.randn(1024, device="cuda")
        got = ext.launch(cubin, "bias_gelu", x, bias)
        ref = torch.nn.functional.gelu((x + bias).double(), approximate="tanh")
        out["rel_err"] = float((got.double() - ref).norm() / ref.norm())
        return out


if __name__ == "__main__":
    sys.exit(main())
