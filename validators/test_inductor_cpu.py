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
