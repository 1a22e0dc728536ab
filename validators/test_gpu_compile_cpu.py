"""gpu compile on the CPU: what the GPU smoke compiles, compiled here without a GPU, so an image whose Triton cannot
build the smoke's kernel, or whose AOTInductor cannot build a CUDA wrapper (no CUDA_HOME, no crt/ headers, no libcuda
to link), fails on the CPU box before any GPU runner sees it (images/programs/gpu_compile_cpu.py)."""

from __future__ import annotations

import pytest

from vutil import json_of


def triton_capabilities(arch_list) -> list[int]:
    """The target's real architectures Triton kernels run on (sm_80 and newer): the ones to compile for."""
    caps = sorted({int(a[3:].rstrip("a")) for a in arch_list or () if a.startswith("sm_")})
    return [c for c in caps if c >= 80]


@pytest.fixture(scope="module")
def report(host, programs, target, timeout, facts):
    caps = triton_capabilities(target.arch_list)
    assert caps, f"the target's arch list {target.arch_list} names no sm_80 or newer architecture to compile for"
    r = json_of(host, "python3 %s --capabilities %s", f"{programs}/gpu_compile_cpu.py", ",".join(map(str, caps)),
                timeout=max(timeout, 300))
    facts["gpu_compile_cpu"] = r
    return r


def test_smoke_triton_kernel_compiles_under_the_image_triton(report, target):
    t = report["triton"]
    assert t.get("ok"), t.get("error", t)
    assert t["triton"] == target.triton, f"compiled under Triton {t['triton']}, the target says {target.triton}"


def test_aotinductor_cuda_wrapper_builds_and_links(report):
    a = report["aoti"]
    assert a.get("ok"), f"{a.get('error')} (CUDA_HOME {a.get('cuda_home')})"
