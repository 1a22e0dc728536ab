"""devel: what a devel image promises an ML engineer who builds extensions, without a GPU: a CUDA_HOME whose
headers, libraries and tools are all there and of the target's CUDA, the toolkit wheels at their pins, a
load_inline CUDA extension that builds, imports and NVRTC-compiles its kernel for the target's newest architecture,
and the C++ AOTInductor loader built and linked against the image's libtorch. A runtime image promises the
opposite: no CUDA compiler. The GPU half (the extension's kernel and the C++ loader run and match eager) is
test_gpu_smoke's `cuda_extension` and `aoti_cpp`.

Expected values come from target.json (flavor, cuda, toolkit pins, arch_list), never from the image."""

from __future__ import annotations

import json
import re

import pytest

from vutil import py, sh

# What a CUDA_HOME must hold for torch.utils.cpp_extension, CMake's FindCUDAToolkit and AOTInductor: the path under
# CUDA_HOME and what breaks without it.
DEVEL_FILES = {
    "include/cuda_runtime.h": "every CUDA source and torch's ATen/cuda headers",
    "include/cuda.h": "the driver API (AOTInductor's wrapper, launching NVRTC cubins)",
    "include/crt/host_defines.h": "the runtime headers include it (CUDA ships it with its compiler)",
    "include/nvrtc.h": "compiling kernels at run time",
    "include/cublas_v2.h": "ATen/cuda/CUDAContext.h includes it",
    "include/cusparse.h": "ATen/cuda/CUDAContext.h includes it",
    "include/cudnn.h": "extensions that call cuDNN",
    "include/nccl.h": "extensions that call NCCL",
    "include/cub/cub.cuh": "CCCL: CUB",
    "include/thrust/version.h": "CCCL: Thrust",
    "include/cuda/std/cstdint": "CCCL: libcu++ (host and NVRTC kernels)",
    "lib64/libcudart.so": "-lcudart",
    "lib64/libnvrtc.so": "-lnvrtc",
    "lib64/libcublas.so": "-lcublas",
    "lib64/libcuda.so": "-lcuda (a link-time stub; the node's driver loads at run time)",
    "bin/ptxas": "PTX to SASS (Triton, numba and NVRTC users call it)",
    "nvvm/libdevice/libdevice.10.bc": "NVVM's math library",
}
_RELEASE = re.compile(r"release (\d+\.\d+), V(\d+\.\d+\.\d+)")  # what ptxas and nvcc --version print


# Each check is chosen by the image's kind (markers, gpuforge.validate.selection): a devel image from wheels assembles
# its own CUDA_HOME, one on nvidia/cuda's devel base carries NVIDIA's toolkit, and a runtime image promises neither.


@pytest.fixture(scope="module")
def cuda_home(host) -> str:
    home = sh(host, "printenv CUDA_HOME", check=False).stdout.strip()
    assert home, "CUDA_HOME is not set: torch.utils.cpp_extension and CMake cannot find the toolkit"
    return home


@pytest.mark.flavor("devel")
@pytest.mark.source("wheels")
def test_cuda_home_holds_the_toolkit(host, cuda_home, facts):
    missing = [f"{p} ({why})" for p, why in DEVEL_FILES.items() if not host.file(f"{cuda_home}/{p}").exists]
    dangling = sh(host, "find -L %s -type l", cuda_home, check=False).stdout.split()
    facts.setdefault("devel", {})["cuda_home"] = cuda_home
    assert not missing, f"CUDA_HOME={cuda_home} lacks: " + "; ".join(missing)
    assert not dangling, f"CUDA_HOME has dangling links: {dangling[:10]}"


@pytest.mark.flavor("devel")
@pytest.mark.source("wheels")
def test_toolkit_wheels_at_their_pins(host, target, cuda_home, facts):
    pins = dict(p.split("==") for p in target.toolkit)
    got = py(host, "import importlib.metadata as m, json, sys\n"
                   "out = {}\n"
                   "for n in sys.argv[1:]:\n"
                   "    try:\n"
                   "        out[n] = m.version(n)\n"
                   "    except m.PackageNotFoundError:\n"
                   "        out[n] = None\n"
                   "print(json.dumps(out))", *pins)
    off = {n: (got[n], want) for n, want in pins.items() if got[n] != want}
    assert not off, f"toolkit wheels not at their pins (installed, pinned): {off}"
    out = sh(host, "%s/bin/ptxas --version", cuda_home).stdout
    m = _RELEASE.search(out)
    assert m, f"ptxas --version printed no release: {out[-300:]}"
    facts.setdefault("devel", {})["ptxas"] = m.group(2)
    nvcc = next((v for n, v in pins.items() if n.startswith("nvidia-cuda-nvcc")), None)
    assert m.group(1) == target.cuda, f"ptxas is CUDA {m.group(1)}, the target's CUDA is {target.cuda}"
    assert nvcc is None or m.group(2) == nvcc, f"ptxas is V{m.group(2)}, its wheel is pinned at {nvcc}"


@pytest.mark.flavor("devel")
@pytest.mark.source("wheels")
def test_cuda_extension_builds_and_compiles_its_kernel(host, target, cuda_home, programs, facts):
    """load_inline with the image's g++ and CUDA_HOME; NVRTC compiles the kernel for the target's newest SASS arch."""
    arch = max((a for a in target.arch_list if a.startswith("sm_")), key=lambda a: int(re.sub(r"\D", "", a)))
    r = sh(host, "python3 %s --compile-only --arch %s", f"{programs}/cuda_extension.py", arch, timeout=600, check=False)
    try:
        rep = json.loads(r.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        pytest.fail(f"cuda_extension.py printed no report (exit {r.rc}): {(r.stderr or r.stdout)[-3000:]}")
    facts.setdefault("devel", {})["extension"] = rep
    assert rep.get("ok"), f"the extension failed at {rep.get('stage')}: {rep.get('error')}"
    major, minor = target.cuda.split(".")
    assert rep["cudart"] // 1000 == int(major) and rep["cudart"] % 1000 // 10 == int(minor), (
        f"the extension was compiled against CUDA runtime headers {rep['cudart']}, the target's CUDA is {target.cuda}")
    assert rep["nvrtc"] == target.cuda, f"NVRTC is {rep['nvrtc']}, the target's CUDA is {target.cuda}"
    assert rep["cubin_bytes"] > 0, "NVRTC returned an empty cubin"


@pytest.mark.flavor("devel")
@pytest.mark.source("wheels")
def test_aoti_cpp_loader_builds_and_links(host, programs, facts):
    """The C++ AOTInductor loader (images/programs/gpu_smoke.py's) compiled and linked against the wheel's libtorch;
    every library it needs resolves but the driver's, which the GPU node mounts."""
    rep = py(host, "import json, sys, tempfile, subprocess\n"
                   "sys.path.insert(0, sys.argv[1])\n"
                   "import gpu_smoke\n"
                   "d = tempfile.mkdtemp(prefix='gpuforge-loader-')\n"
                   "r = gpu_smoke.build_aoti_loader(d)\n"
                   "if 'exe' in r:\n"
                   "    r['ldd'] = subprocess.run(['ldd', r['exe']], capture_output=True, text=True).stdout\n"
                   "print(json.dumps(r))", programs, timeout=900)
    assert "exe" in rep, rep.get("error")
    missing = [line.split()[0] for line in rep["ldd"].splitlines() if "not found" in line]
    facts.setdefault("devel", {})["aoti_loader_build_s"] = rep["build_s"]
    assert not [m for m in missing if m != "libcuda.so.1"], f"the C++ loader does not resolve: {missing}"


@pytest.mark.flavor("devel")
@pytest.mark.source("cuda-base")
def test_cuda_base_devel_nvcc_is_the_target_cuda(host, target, facts):
    """A devel image on nvidia/cuda's devel base carries NVIDIA's whole toolkit: its nvcc is the target's CUDA."""
    r = sh(host, "PATH=\"$PATH:/usr/local/cuda/bin\" nvcc --version", check=False)
    m = _RELEASE.search(r.stdout)
    assert m, f"no nvcc in a cuda-base devel image (exit {r.rc}): {(r.stderr or r.stdout)[-300:]}"
    facts.setdefault("devel", {})["nvcc"] = m.group(2)
    assert m.group(1) == target.cuda, f"nvcc is CUDA {m.group(1)}, the target's CUDA is {target.cuda}"


@pytest.mark.flavor("runtime")
def test_runtime_has_no_cuda_compiler(host):
    """A runtime image ships no CUDA compiler or toolkit wheel: that is the devel image's promise and its size."""
    # one name per `command -v`: dash's looks at its first operand only
    found = sh(host, "for c in nvcc ptxas; do command -v \"$c\"; done; ls \"${CUDA_HOME:-/nonexistent}/bin\" 2>/dev/null; "
                     "python3 -m pip list --format=freeze 2>/dev/null | grep -iE '^nvidia-cuda-(nvcc|cccl)' || true",
               check=False).stdout.split()
    assert not found, f"a runtime image holds CUDA compiler parts: {found}"
