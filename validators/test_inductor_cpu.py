"""inductor on CPU: torch.compile really generates and compiles C++ (catches a missing g++/gcc/Python.h)."""

from __future__ import annotations

import pytest

from vutil import json_of


@pytest.fixture(scope="module")
def report(host, programs, timeout, facts):
    r = json_of(host, "python3 %s", f"{programs}/inductor_cpu.py", timeout=max(timeout, 300))
    facts["inductor_cpu"] = r
    return r


def test_compile_succeeds(report):
    assert "error" not in report, report.get("error")


def test_fused_elementwise_matches_eager(report):
    assert report.get("fused_match") is True, report.get("error", "compiled result differs from eager")


def test_mlp_matches_eager(report):
    assert report.get("mlp_match") is True, report.get("error", "compiled MLP differs from eager")


def test_cpp_code_was_generated_and_compiled(report):
    assert report.get("cpp_sources", 0) >= 1, f"Inductor wrote no C++ source ({report})"
    assert report.get("shared_objects", 0) >= 1, f"Inductor built no shared object ({report})"


def test_warm_start_opens_packages_with_the_direct_loader(report):
    """The warm start's loader on this torch: a CPU AOTInductor package, opened the way a GPU warm start opens its
    package. Falling back to aoti_load_package costs 0.9 s of a 3 s warm start on torch 2.7.1 (its module import)."""
    got = report.get("aoti_loader") or {}
    assert "error" not in got, f"the CPU AOTInductor package could not be built or run: {got.get('error')}"
    assert got.get("binding", "").startswith("direct"), (
        f"warm_start.open_package fell back to {got.get('binding')!r}: no AOTIModelPackageLoader binding of this "
        "torch matched the ones it knows")
    assert got.get("match") is True, f"the CPU package's output differs from eager ({got})"
