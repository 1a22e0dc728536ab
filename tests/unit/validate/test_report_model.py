"""Reports are a typed model: real reports (the measured runs kept in docs/measurements, and a report as `validate`
finishes and signs it) load through it and dump byte for byte as written; another shape is one line, exit 8."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from fleet_reports import base_from_h200_run, gpu_report

from gpuforge import paths
from gpuforge.errors import StateError
from gpuforge.validate import evidence, report
from gpuforge.validate.report_model import Report

MEASURED = sorted(p for p in (paths.project_root() / "docs" / "measurements").rglob("*.json")
                  if '"exit_status"' in p.read_text())


def test_the_measured_reports_are_found():
    assert len(MEASURED) >= 5


@pytest.mark.parametrize("path", MEASURED, ids=lambda p: str(p.relative_to(paths.project_root())))
def test_a_real_report_round_trips_unchanged(path):
    text = report.to_json(json.loads(path.read_text()))
    rep = Report.from_json(text, str(path))
    assert report.to_json(rep.dump()) == text
    assert rep.checks and rep.checks[0].id == json.loads(text)["checks"][0]["id"]


def test_a_finished_and_signed_report_round_trips_with_its_digest():
    from gpuforge.evidence import signed_run

    rep = gpu_report(base_from_h200_run(), started=1.0)
    text = report.to_json(rep)
    typed = Report.from_json(text, "r.json")
    assert report.to_json(typed.dump()) == text and evidence.digest_of(typed) == evidence.digest_of(rep)
    assert typed.evidence.gpu_host.gpu_models == ["H200"] and typed.gpu_run()
    signed = signed_run.statement(typed, "r/x@sha256:" + "e" * 64)
    assert signed.run.signed_in_run and signed.run.subject == "r/x@sha256:" + "e" * 64
    assert {k: v for k, v in signed.dump().items() if k != "run"} == {k: v for k, v in rep.items() if k != "run"}


def test_a_go_json_round_trip_keeps_ints_ints():
    """cosign hands a predicate back through Go: 2.0 comes back as 2, and the dump keeps it 2 (digest unchanged)."""
    rep = copy.deepcopy(base_from_h200_run())
    rep["seconds"], rep["checks"][0]["seconds"] = 2, 0
    assert Report.of(rep).dump() == rep


@pytest.mark.parametrize(("change", "field"), [
    (lambda r: r.pop("exit_status"), "exit_status: Field required"),
    (lambda r: r.pop("checks"), "checks: Field required"),
    (lambda r: r.update(gpu="yes"), "gpu: Input should be a valid boolean"),
    (lambda r: r.update(exit_status="0"), "exit_status: Input should be a valid integer"),
    (lambda r: r["checks"][0].update(seconds="fast"), "checks.0.seconds"),
    (lambda r: r["checks"][0].pop("outcome"), "checks.0.outcome: Field required"),
    (lambda r: r.update(evidence={"required": "all"}), "evidence.required: Input should be a valid list"),
    (lambda r: r.update(verdict="green"), "verdict: Extra inputs are not permitted"),
])
def test_a_report_of_another_shape_is_refused_in_one_line(change, field):
    rep = copy.deepcopy(base_from_h200_run())
    change(rep)
    with pytest.raises(StateError) as e:
        Report.of(rep, "reports/t/report.json")
    msg = str(e.value)
    assert msg.startswith("reports/t/report.json: not a validation report of this gpuforge (") and field in msg
    assert "\n" not in msg and e.value.return_code == 8


@pytest.mark.parametrize(("text", "words"), [("{", "report is not valid JSON"), ("[]", "expected an object"),
                                             ('{"checks": []}', "exit_status: Field required")])
def test_a_report_file_of_another_shape_is_one_line(tmp_path, text, words):
    f = tmp_path / "report.json"
    f.write_text(text)
    with pytest.raises(StateError) as e:
        report.read(f)
    assert str(e.value).startswith(str(f)) and words in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(StateError):
        report.load(f)


def test_a_missing_report_file_says_to_validate(tmp_path):
    with pytest.raises(StateError, match="run `gpuforge validate` first"):
        report.read(Path(tmp_path / "none.json"))
