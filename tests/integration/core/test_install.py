"""A normal (non-editable) install works from the repository root: paths come from package data and the
checkout is found once (gpuforge.paths), not by `Path(__file__).parent.parent` arithmetic. The installed copy
(`installed`, tests/installed.py) makes the run's one signed validation (`validated`), with its `clean` run again and
again beside it: that full validation also carries test_clean.py's claim that a validate stays green with `clean`
run beside it."""

from __future__ import annotations

import json

import pytest
from installed import run_installed

from conftest import ROOT

pytestmark = pytest.mark.docker


def test_plan_and_generate_check_from_the_repo_root(installed):
    r = run_installed(installed, "plan", "--json")
    assert r.returncode == 0, r.stderr
    assert '"default": true' in r.stdout
    r = run_installed(installed, "generate", "--check")
    assert r.returncode == 0, r.stderr
    assert "up to date" in r.stdout


def test_outside_a_checkout_is_one_clear_error(installed, tmp_path):
    r = run_installed(installed, "plan", cwd=tmp_path)
    assert r.returncode == 2 and "matrix.yaml" in r.stderr and "Traceback" not in r.stderr
    (tmp_path / "matrix.yaml").write_text((ROOT / "matrix.yaml").read_text())
    r = run_installed(installed, "generate", "--check", cwd=tmp_path)
    assert r.returncode == 2 and "no gpuforge checkout" in r.stderr and "Traceback" not in r.stderr


def test_validate_from_the_repo_root_stays_green_with_clean_run_beside_it(validated):
    """The installed copy's full `validate --attest` from the repo root (the run's signed validation), with the
    installed copy's `clean` run again and again beside it: a live run's containers are kept, and the validation
    ends green and signed."""
    t, beside = validated["target"], validated["beside"]
    out, cleans = beside["out"], beside["cleans"]
    assert beside["rc"] == 0, out[-5000:]
    kept_live = 0
    for c in cleans:
        assert c["rc"] == 0 and c["stderr"] == "", c["stderr"]
        [line] = c["stdout"].splitlines()
        assert line.startswith("removed "), line
        if c["live"]:  # one of validate's containers there before and after this clean: kept as live
            assert "of live runs" in line, line
            kept_live += 1
    assert kept_live >= 3, f"clean ran {len(cleans)} times but only {kept_live} while validate had containers"
    rep = json.loads((validated["reports"] / t.id / "report.json").read_text())
    assert rep["green"], rep.get("problems")
    assert "[" in out and "/" in out and "check(s) collected" in out  # plain progress: checks done of total
    assert "signed this run's validation (green)" in out
