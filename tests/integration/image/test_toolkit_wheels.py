"""The CUDA toolkit of every devel image built from wheels, checked on the CPU, without an image or torch: for each
variant with `toolkit_wheels` in the compat data (cu118, cu126, cu128), those pinned wheels and the CUDA runtime and
NVRTC wheels torch pins are installed with no dependencies into one folder, as the image's toolkit layer installs them
beside torch (there with pip; here with the uv of gpuforge's own environment, which has no pip: both unpack the same
wheels); images/context/cuda_home.py --site assembles CUDA_HOME from them, as the image does; then what the devel
validators (validators/test_devel.py) hold the image to is asked of that CUDA_HOME:
- every part they look for is there, but those torch's cuBLAS, cuSPARSE, cuDNN and NCCL wheels bring (1.7 GB for
  cu118), and no link dangles;
- its ptxas is the variant's CUDA and the nvcc wheel's build;
- the extension's CUDA half (images/programs/cuda_extension.py's CUDA_CPP) builds with the host's g++ against it,
  links CUDA_HOME's NVRTC and runtime, and runs: NVRTC compiles the extension's kernel (libcu++ from CCCL) to a cubin
  for the variant's newest architecture, and its PTX, which CUDA_HOME's ptxas assembles.
No nvcc runs: NVIDIA's CUDA 11.8 and 12 wheels hold none (docs/images.md), so the host compiler checks of nvcc's
crt/host_config.h (CUDA 11.8 takes gcc up to 11) never apply; g++ compiles host code only, as in the image.

The cu118 devel image itself needs torch's cu118 wheels from download.pytorch.org; this is its toolkit's check where
that index is out of reach. uv keeps the wheels in its own cache (about 50 MB of downloads a variant, 200 MB
unpacked), so a machine downloads them once: 6 s for the three variants then, 10 s with an empty cache."""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT, need
from gpuforge.image import compat
from gpuforge.plan.matrix import load_matrix

sys.path.insert(0, str(ROOT / "images" / "programs"))
import cuda_extension

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ (the devel image has it)")

# What torch's CUDA library wheels bring to CUDA_HOME, not the toolkit's: left out here (1.7 GB for cu118). The
# one-off run with every cu118 wheel torch pins found them all, and no header in two wheels.
LIBRARY_WHEEL_PARTS = {"include/cublas_v2.h", "include/cusparse.h", "include/cudnn.h", "include/nccl.h", "lib64/libcublas.so"}

MAIN = r"""
#include <cstdio>
#include <fstream>
#include <sstream>

// argv: kernel source, SASS arch (sm_90), PTX arch (compute_80), include dir, PTX file to write
int main(int argc, char** argv) {
  if (argc != 6) return 64;
  std::ifstream in(argv[1]);
  std::stringstream src;
  src << in.rdbuf();
  std::string cubin = compile_cubin(src.str(), argv[2], argv[4]);
  nvrtcProgram prog;
  nvrtc_ok(nvrtcCreateProgram(&prog, src.str().c_str(), "gpuforge_kernel.cu", 0, nullptr, nullptr), "nvrtcCreateProgram");
  std::string arch = std::string("--gpu-architecture=") + argv[3], inc = std::string("-I") + argv[4];
  const char* opts[] = {arch.c_str(), inc.c_str(), "--std=c++17", "-default-device"};
  nvrtc_ok(nvrtcCompileProgram(prog, 4, opts), "nvrtcCompileProgram (PTX)");
  size_t n = 0;
  nvrtc_ok(nvrtcGetPTXSize(prog, &n), "nvrtcGetPTXSize");
  std::string ptx(n, '\0');
  nvrtc_ok(nvrtcGetPTX(prog, &ptx[0]), "nvrtcGetPTX");
  nvrtcDestroyProgram(&prog);
  std::ofstream(argv[5]) << ptx.c_str();
  auto lookup = &driver<decltype(&cuLaunchKernel)>;  // instantiated: the GPU half's driver lookup compiles too
  (void)lookup;
  std::vector<int64_t> v = versions();
  std::printf("{\"cudart\": %lld, \"nvrtc\": \"%lld.%lld\", \"thrust\": %lld, \"cub\": %lld, \"cubin_bytes\": %zu, "
              "\"cubin_elf\": %s}\n", (long long)v[0], (long long)v[1], (long long)v[2], (long long)v[3],
              (long long)v[4], cubin.size(), cubin.compare(0, 4, "\x7f" "ELF") == 0 ? "true" : "false");
  return 0;
}
"""


def _toolkit_variants() -> dict[str, compat.Variant]:
    """One variant per distinct toolkit (torch 2.7.0 and 2.7.1 share theirs), by name."""
    out: dict[str, compat.Variant] = {}
    for torch in compat.torch_releases():
        for cuda in compat.cuda_variants(torch):
            v = compat.variant(torch, cuda)
            if v and v.toolkit_wheels:
                out.setdefault(v.name, v)
    return out


VARIANTS = _toolkit_variants()


def _devel_files() -> dict[str, str]:
    """validators/test_devel.py's DEVEL_FILES, read as data (importing a validator would drag in its host)."""
    tree = ast.parse((ROOT / "validators" / "test_devel.py").read_text())
    node = next(n for n in tree.body if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "DEVEL_FILES")
    return ast.literal_eval(node.value)


@pytest.fixture(scope="module", params=sorted(VARIANTS), ids=sorted(VARIANTS))
def toolkit(request, tmp_path_factory):
    """(variant, CUDA_HOME): the toolkit layer's steps, outside an image."""
    v = VARIANTS[request.param]
    tmp = tmp_path_factory.mktemp(f"toolkit-{v.name}")
    pypi = load_matrix().select(None)[0].settings.pypi_url  # the index the image's toolkit layer installs from
    major = v.cuda.split(".")[0]
    wheels = [*v.toolkit_wheels, *(f"{n}=={v.nvidia_pins[n]}" for n in (f"nvidia-cuda-runtime-cu{major}",
                                                                          f"nvidia-cuda-nvrtc-cu{major}"))]
    r = subprocess.run([sys.executable, "-m", "uv", "pip", "install", "--no-config", "--quiet", "--no-deps",
                        "--only-binary", ":all:", "--index-url", pypi, "--target", str(tmp / "site"), *wheels],
                       capture_output=True, text=True)
    if r.returncode != 0:
        need(f"needs the toolkit wheels {wheels} from {pypi}: uv failed: {r.stderr.strip()[-500:]}")
    home = tmp / "cuda"
    r = subprocess.run([sys.executable, str(ROOT / "images" / "context" / "cuda_home.py"), "--site",
                        str(tmp / "site" / "nvidia"), "--out", str(home)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return v, home


def test_cuda_home_holds_what_the_devel_validators_look_for(toolkit):
    v, home = toolkit
    missing = {p for p in _devel_files() if not (home / p).exists()}
    assert missing == LIBRARY_WHEEL_PARTS, f"{v.name}: CUDA_HOME lacks {sorted(missing - LIBRARY_WHEEL_PARTS)}"
    dangling = [str(p) for p in home.rglob("*") if p.is_symlink() and not p.exists()]
    assert not dangling, dangling
    m = json.loads((home / "cuda_home.json").read_text())
    assert m["mode"] == "devel" and m["bin"] == ["ptxas"] and m["header_entries"]["cuda_cccl"] >= 3, m


def test_ptxas_is_the_variant_cuda_and_the_nvcc_wheel_build(toolkit):
    v, home = toolkit
    out = subprocess.run([str(home / "bin" / "ptxas"), "--version"], capture_output=True, text=True, check=True).stdout
    nvcc = next(w.split("==")[1] for w in v.toolkit_wheels if w.startswith("nvidia-cuda-nvcc"))
    assert re.search(rf"release {re.escape(v.cuda)}, V{re.escape(nvcc)}\b", out), out


def test_the_extension_cuda_half_builds_and_its_kernel_compiles(toolkit, tmp_path):
    v, home = toolkit
    src, exe = tmp_path / "ext.cpp", tmp_path / "ext"
    src.write_text(cuda_extension.CUDA_CPP + MAIN)
    (tmp_path / "kernel.cu").write_text(cuda_extension.KERNEL)
    lib64 = home / "lib64"
    r = subprocess.run(["g++", "-std=c++17", "-O1", "-I", str(home / "include"), str(src), "-o", str(exe), f"-L{lib64}",
                        "-lnvrtc", "-lcudart", f"-Wl,-rpath,{lib64}"], capture_output=True, text=True)
    assert r.returncode == 0, f"the extension's CUDA half does not build against {v.name}'s CUDA_HOME: {r.stderr[-3000:]}"
    sass = max((a for a in v.arch_list if a.startswith("sm_")), key=lambda a: int(re.sub(r"\D", "", a)))
    r = subprocess.run([str(exe), str(tmp_path / "kernel.cu"), sass, "compute_80", str(home / "include"),
                        str(tmp_path / "kernel.ptx")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    rep = json.loads(r.stdout)
    major, minor = (int(x) for x in v.cuda.split("."))
    assert rep["cudart"] == major * 1000 + minor * 10 and rep["nvrtc"] == v.cuda, rep
    assert rep["cubin_elf"] and rep["cubin_bytes"] > 0, rep
    r = subprocess.run([str(home / "bin" / "ptxas"), "-arch=sm_80", str(tmp_path / "kernel.ptx"), "-o",
                        str(tmp_path / "kernel.cubin")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (tmp_path / "kernel.cubin").read_bytes()[:4] == b"\x7fELF"
