"""images/context/cuda_home.py: the runtime image's CUDA_HOME for AOTInductor, made from a wheel and a runtime
folder laid out as NVIDIA's wheels lay them out (real files, a real zip, the real gcc)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile

import pytest

from gpuforge import paths

sys.path.insert(0, str(paths.project_root() / "images" / "context"))
import cuda_home

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc (the image build has it)")

CUDA_H = """#include <stddef.h>
typedef int CUresult; typedef void* CUmodule; typedef void* CUfunction;
#define cuCtxCreate cuCtxCreate_v2
CUresult cuModuleLoad(CUmodule *m, const char *f);
CUresult cuCtxCreate(void **c, unsigned int flags, int dev);
CUresult cuLaunchKernel(CUfunction f, unsigned gx);
"""


@pytest.fixture
def parts(tmp_path):
    rt = tmp_path / "site" / "nvidia" / "cuda_runtime"
    (rt / "include" / "cooperative_groups").mkdir(parents=True)
    (rt / "lib").mkdir()
    (rt / "include" / "__init__.py").write_text("")
    (rt / "include" / "cuda.h").write_text(CUDA_H)
    (rt / "include" / "cuda_runtime_api.h").write_text('#include "crt/host_defines.h"\n')
    (rt / "lib" / "libcudart.so.12").write_bytes(b"\x7fELF")
    wheel = tmp_path / "nvidia_cuda_nvcc_cu12-12.6.77-py3-none-manylinux2014_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("nvidia/cuda_nvcc/include/crt/host_defines.h", "#define __host__\n")
        z.writestr("nvidia/cuda_nvcc/include/crt/host_config.h", "\n")
        z.writestr("nvidia/cuda_nvcc/bin/nvcc", "compiler")
        z.writestr("nvidia/cuda_nvcc/include/crt/../../../../evil.h", "no")
    return wheel, rt, tmp_path / "cuda"


def test_cuda_home_has_the_runtime_headers_the_crt_headers_and_a_libcuda_stub(parts):
    wheel, rt, out = parts
    assert cuda_home.main(["--nvcc-wheel", str(wheel), "--runtime", str(rt), "--out", str(out)]) == 0
    assert (out / "include" / "cuda_runtime_api.h").resolve() == (rt / "include" / "cuda_runtime_api.h").resolve()
    assert (out / "include" / "cooperative_groups").is_symlink() and not (out / "include" / "__init__.py").exists()
    assert sorted(p.name for p in (out / "include" / "crt").iterdir()) == ["host_config.h", "host_defines.h"]
    assert not (out / "bin").exists() and not (out.parent / "evil.h").exists()
    assert (out / "lib64" / "libcudart.so").resolve() == (rt / "lib" / "libcudart.so.12").resolve()
    dyn = subprocess.run(["readelf", "-dW", "--dyn-syms", str(out / "lib64" / "libcuda.so")], capture_output=True,
                         text=True, check=True).stdout
    assert "Library soname: [libcuda.so.1]" in dyn
    assert all(f" {n}" in dyn for n in ("cuModuleLoad", "cuCtxCreate_v2", "cuLaunchKernel"))  # the linked names
    m = json.loads((out / "cuda_home.json").read_text())
    assert m["crt_from"] == "nvidia-cuda-nvcc-cu12==12.6.77" and m["libcuda_stub_functions"] == 3 and m["bytes"] > 0


@pytest.mark.parametrize(("change", "words"), [
    ("wheel-without-crt", "holds no nvidia/cuda_nvcc/include/crt/host_defines.h"),
    ("not-a-wheel-name", "not an nvidia-cuda-nvcc wheel file"),
    ("no-runtime-headers", "no include/cuda_runtime_api.h"),
    ("out-exists", "already exists"),
])
def test_bad_parts_are_one_line_exit_64(parts, change, words, capsys):
    wheel, rt, out = parts
    if change == "wheel-without-crt":
        with zipfile.ZipFile(wheel, "w") as z:
            z.writestr("nvidia/cuda_nvcc/bin/nvcc", "compiler")
    elif change == "not-a-wheel-name":
        wheel = wheel.rename(wheel.with_name("something.whl"))
    elif change == "no-runtime-headers":
        (rt / "include" / "cuda_runtime_api.h").unlink()
    else:
        out.mkdir()
    assert cuda_home.main(["--nvcc-wheel", str(wheel), "--runtime", str(rt), "--out", str(out)]) == 64
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1, err


@pytest.fixture
def site(tmp_path):
    """An installed nvidia/ folder as the devel image has it: torch's CUDA wheels plus the nvcc and cccl wheels."""
    nv = tmp_path / "site" / "nvidia"
    files = {
        "cuda_runtime/include/cuda.h": CUDA_H, "cuda_runtime/include/cuda_runtime_api.h": "\n",
        "cuda_runtime/include/__init__.py": "", "cuda_runtime/lib/libcudart.so.12": "ELF",
        "cuda_nvcc/bin/ptxas": "ptxas", "cuda_nvcc/include/crt/host_defines.h": "\n", "cuda_nvcc/nvvm/libdevice/libdevice.10.bc": "bc",
        "cuda_cccl/include/cub/cub.cuh": "\n", "cuda_cccl/include/thrust/version.h": "\n",
        "cublas/include/cublas_v2.h": "\n", "cublas/lib/libcublas.so.12": "ELF", "cublas/lib/libcublasLt.so.12": "ELF",
        "cuda_nvrtc/include/nvrtc.h": "\n", "cuda_nvrtc/lib/libnvrtc.so.12": "ELF", "cuda_nvrtc/lib/libnvrtc-builtins.so.12.6": "ELF",
        "cuda_cupti/lib/libnvperf_host.so": "ELF",
    }
    for rel, text in files.items():
        (nv / rel).parent.mkdir(parents=True, exist_ok=True)
        (nv / rel).write_text(text)
    return nv, tmp_path / "cuda"


def test_devel_cuda_home_links_every_wheel_header_library_and_tool(site):
    nv, out = site
    assert cuda_home.main(["--site", str(nv), "--out", str(out)]) == 0
    for rel, src in (("include/cuda_runtime_api.h", "cuda_runtime/include/cuda_runtime_api.h"), ("include/crt", "cuda_nvcc/include/crt"),
                     ("include/cub", "cuda_cccl/include/cub"), ("include/nvrtc.h", "cuda_nvrtc/include/nvrtc.h"),
                     ("bin/ptxas", "cuda_nvcc/bin/ptxas"), ("nvvm", "cuda_nvcc/nvvm"),
                     ("lib64/libcublas.so", "cublas/lib/libcublas.so.12"), ("lib64/libcublas.so.12", "cublas/lib/libcublas.so.12"),
                     ("lib64/libnvrtc-builtins.so", "cuda_nvrtc/lib/libnvrtc-builtins.so.12.6"),
                     ("lib64/libnvperf_host.so", "cuda_cupti/lib/libnvperf_host.so"), ("lib64/libcudart.so", "cuda_runtime/lib/libcudart.so.12")):
        assert (out / rel).is_symlink() and (out / rel).resolve() == (nv / src).resolve(), rel
    assert not (out / "include" / "__init__.py").exists()
    assert "Library soname: [libcuda.so.1]" in subprocess.run(["readelf", "-d", str(out / "lib64" / "libcuda.so")],
                                                               capture_output=True, text=True, check=True).stdout
    m = json.loads((out / "cuda_home.json").read_text())
    assert m["mode"] == "devel" and m["header_entries"]["cuda_cccl"] == 2 and m["bin"] == ["ptxas"]


@pytest.mark.parametrize(("change", "words"), [
    ("no-ptxas", "no cuda_nvcc/bin/ptxas (install the nvcc and cccl wheels"),
    ("no-cccl", "no cuda_cccl/include"),
    ("header-in-two-wheels", "cublas_v2.h is in both"),
    ("with-wheel", "give it without --nvcc-wheel/--runtime"),
])
def test_devel_bad_site_is_one_line_exit_64(site, change, words, capsys):
    nv, out = site
    extra = []
    if change == "no-ptxas":
        (nv / "cuda_nvcc" / "bin" / "ptxas").unlink()
    elif change == "no-cccl":
        shutil.rmtree(nv / "cuda_cccl")
    elif change == "header-in-two-wheels":
        (nv / "cusparse" / "include").mkdir(parents=True)
        (nv / "cusparse" / "include" / "cublas_v2.h").write_text("\n")
    else:
        extra = ["--runtime", str(nv / "cuda_runtime")]
    assert cuda_home.main(["--site", str(nv), "--out", str(out), *extra]) == 64
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1, err
