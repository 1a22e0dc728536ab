"""report.md of the full non-GPU validator run on the default image, read field by field."""

from __future__ import annotations

import re

import pytest
from report_md import parse

from gpuforge import __version__
from gpuforge.validate import report

pytestmark = pytest.mark.docker


def test_report_md_says_what_a_non_gpu_run_proved(validated):
    t = validated["target"]
    d = validated["reports"] / t.id
    rep = report.load(d / "report.json")
    f = parse((d / "report.md").read_text())
    assert f["verdict"] == f"GREEN for dev; {report.NO_GPU}"
    assert f["target"] == t.id
    assert f["image"].startswith(f"`{validated['record']['image_id']}`")
    assert f["gpuforge"].startswith(f"{__version__}, git revision ") and rep["run"]["revision"] in f["gpuforge"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", f["date"])
    assert f["host"].startswith("no GPU (docker on ")
    checks = rep["checks"]
    passed = [c for c in checks if c["outcome"] == "passed"]
    modules = {c["module"] for c in passed}
    assert len(f["What was proven"]) == len(modules)  # one line per concern that proved something
    assert len(f["What was proven (items)"]) == len(passed)
    assert any(line.startswith("**ssh entrypoint: key login as the non-root user works") for line in f["What was proven"])
    skipped = [c for c in checks if c["outcome"] == "skipped"]
    counted = sum(int(line.split(" x ", 1)[0]) for line in f["What was skipped, and why"])
    assert skipped and counted == len(skipped)
    assert any(line.startswith("the GPU: no GPU check ran") for line in f["What was not checked"])
    assert (d / "report.md").read_text() in validated["summary"].read_text()
