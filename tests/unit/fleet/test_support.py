"""The support table and release notes from verified predicates (pure): made from the real H200 run
(tests/fleet_reports.py; the A100 report is that run with the model fields changed, a FIXTURE)."""

from __future__ import annotations

import copy
import json
import time

import pytest
from fleet_reports import BASE, base_from_h200_run, gpu_report

from gpuforge.errors import StateError
from gpuforge.fleet import support
from gpuforge.plan.matrix import load_matrix

MATRIX = BASE + """\
fleet:
  h200:
    gpu: {model: H200, capability: "9.0"}
    drivers: ["580.159.04"]
    runs_on: [self-hosted, gpu, h200]
  a100:
    gpu: {model: A100, capability: "8.0"}
    drivers: ["570.133.20"]
    runs_on: [self-hosted, gpu, a100]
  rtx5090:
    gpu: {model: RTX 5090, capability: "12.0"}
    drivers: ["575.64.03"]
    runs_on: [self-hosted, gpu, rtx5090]
    exclude: ["cuda=12.6"]
"""


def _setup(tmp_path):
    from gpuforge.plan import fleet

    (tmp_path / "matrix.yaml").write_text(MATRIX)
    m = load_matrix(tmp_path / "matrix.yaml")
    t = m.select(None)[0]
    base = base_from_h200_run()
    image = copy.deepcopy(base)
    image["gpu"] = False
    image["checks"] = [c for c in image["checks"] if not c.get("skip")]  # a run without GPUs meets no one-GPU skip
    image["facts"].update(size_gb=6.24, versions={"torch": "2.7.1+cu126", "python": "3.11"})
    image["evidence"] = {"required": [c["id"] for c in image["checks"]], "missing": [], "partial": False,
                         "gpu_required": False, "validator_set": "x", "image_id": base["facts"]["image_id"]}
    h200 = gpu_report(base, started=time.time())
    return m, t, fleet.pools_of(m), image, h200, base


def test_support_table_names_each_pools_evidence_or_its_absence(tmp_path):
    m, t, pools, image, h200, _ = _setup(tmp_path)
    ev = support.Evidence(target=t, digest="sha256:" + "e" * 64, validation=[image, h200])
    rows = support.support_rows([ev], pools)
    cells = rows[0]["pools"]
    assert cells["h200"]["result"] == "green" and cells["h200"]["driver"] == "580.159.04"
    assert cells["a100"]["result"] == "not validated"
    assert cells["rtx5090"] == {"gpu": "RTX 5090", "drivers": ["575.64.03"], "result": "excluded", "by": "cuda=12.6"}
    text = support.render_support(rows, pools, "text")
    assert "not validated" in text and "excluded (cuda=12.6)" in text
    md = support.render_support(rows, pools, "markdown")
    assert md.count("\n|") == 3 and "| h200 (H200, 580.159.04) |" in md
    assert json.loads(support.render_support(rows, pools, "json"))["rows"] == rows
    never = support.support_rows([support.Evidence(target=t, digest=None)], pools)
    assert never[0]["pools"]["h200"]["result"] == "not promoted"


def test_release_notes_carry_versions_driver_floor_gpus_skips_cve_and_size_change(tmp_path):
    m, t, pools, image, h200, base = _setup(tmp_path)
    digest = "sha256:" + "e" * 64
    verdict = {"subject": {"digest": digest}, "ok": False, "judged_at": "2026-12-03T14:00:00+00:00",
               "counted": [{"id": "CVE-2026-99001"}], "allowed": [], "problems": ["CRITICAL CVE-2026-99001 ..."]}
    prev_image = copy.deepcopy(image)
    prev_image["facts"]["size_gb"] = 6.0
    ev = support.Evidence(target=t, digest=digest, validation=[image, h200], cve=[verdict],
                          inventory=[{"python": {"torch": "2.7.1"}, "debian": {"libc6": "2.36"}}])
    prev = support.Evidence(target=t, digest="sha256:" + "f" * 64, validation=[prev_image])
    n = support.release_notes(ev, pools, previous=prev)
    assert n["versions"]["torch"] == "2.7.1+cu126"
    assert n["driver_floor"] == {"full": "560.28.03", "minor_version_compat": "525.60.13"}  # the compat data's
    assert n["gpus_validated"] == [{"gpu": "NVIDIA H200", "driver": "580.159.04", "count": 1}]
    assert n["size_change_gb"] == 0.24 and n["packages"] == 2
    assert n["cve"]["ok"] is False and n["cve"]["counted"] == 1
    assert any(k["reason"].startswith("world size 1") for k in n["known_issues"])
    md = support.render_notes(n)
    assert "**CVE verdict**: RED" in md and "+0.240 GB from `sha256:ffffffffffff" in md
    assert "| a100 | not validated |" in md


def test_a_step_summary_that_cannot_be_written_is_one_state_error(tmp_path, monkeypatch):
    """$GITHUB_STEP_SUMMARY is GitHub's file, appended to; one that cannot be written (here a folder) is exit 8 naming
    it, as report.md's append is, not a traceback."""
    m, t, pools, image, h200, _ = _setup(tmp_path)
    digest = "sha256:" + "e" * 64
    monkeypatch.setattr(support, "collect", lambda t, **kw: support.Evidence(target=t, digest=digest,
                                                                              validation=[image, h200]))
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    text = support.support_cli(m, [t], fmt="markdown", verifier=None, records=None)
    assert summary.read_text() == text + "\n"
    blocked = tmp_path / "a-folder"
    blocked.mkdir()
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(blocked))
    calls = [lambda: support.support_cli(m, [t], fmt="markdown", verifier=None, records=None),
             lambda: support.notes_cli(m, [t], fmt="markdown", verifier=None, records=None, digest=None,
                                       previous=None, output=None)]
    for call in calls:
        with pytest.raises(StateError) as e:
            call()
        assert e.value.return_code == 8 and str(e.value) == f"{blocked}: is a directory, not a file: remove or rename it"
