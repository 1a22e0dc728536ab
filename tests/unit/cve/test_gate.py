"""The CVE gate, one test per cause, on recorded scanner output made from the default image's real SBOM
(tests/unit/fixtures/cve: make_fixtures.py says what is real and what is written in the tools' shapes).
pip-audit-image-py311.json is pip-audit's real output here: the false pass the gate must refuse."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from gpuforge.cli import main
from gpuforge.cve import gate as cve
from gpuforge.errors import ConfigError

F = Path(__file__).parents[1] / "fixtures" / "cve"
SBOM = F / "sbom-default.cdx.json"
TARGET = "pt271-cu126-py311-debian12-runtime-wheels"
NOW = dt.datetime(2026, 12, 3, 14, 30, tzinfo=dt.UTC)  # 8 h after the fixtures' databases were built


def _trivy():
    return cve.read_scan(F / "trivy-default.json", db_metadata=F / "trivy-version.json")


def _allow(tmp_path, text: str) -> cve.Allowlist:
    p = tmp_path / "allow.yaml"
    p.write_text(text)
    return cve.load_allowlist(p)


def _purl(name: str) -> str:
    return next(c["purl"] for c in json.loads(SBOM.read_text())["components"] if c["name"] == name)


def test_the_fixtures_name_real_components_of_the_default_images_sbom():
    purls = cve.sbom_purls(SBOM)
    assert len(purls) > 250
    for scan in (_trivy(), cve.read_scan(F / "grype-default.json")):
        assert scan.findings and all(f.purl in purls for f in scan.findings)


def test_fixable_critical_is_counted_and_unfixable_or_low_are_not():
    v = cve.judge([_trivy()], cve.Allowlist(), target=TARGET, sbom=SBOM, now=NOW)
    assert not v["ok"]
    counted = {(f["id"], f["package"], f["severity"]) for f in v["counted"]}
    assert counted == {("CVE-2026-99001", "libssl3", "CRITICAL"), ("CVE-2026-99004", "jinja2", "HIGH")}
    assert any("CRITICAL CVE-2026-99001 in libssl3" in p and "fixable (3.0.20-1~deb12u3)" in p for p in v["problems"])
    # the floor is configurable: at MEDIUM the fixable perl-base finding counts too; the unfixable zlib1g never
    low = cve.judge([_trivy()], cve.Allowlist(), severity="MEDIUM", now=NOW)
    assert {f["package"] for f in low["counted"]} == {"libssl3", "jinja2", "perl-base"}
    g = cve.judge([cve.read_scan(F / "grype-default.json")], cve.Allowlist(), now=NOW)
    assert [(f["package"], f["severity"]) for f in g["counted"]] == [("libexpat1", "HIGH")]  # Critical tornado: not-fixed


def test_the_suggested_entries_pasted_in_clear_the_findings(tmp_path):
    red = cve.judge([_trivy()], cve.Allowlist(), target=TARGET, sbom=SBOM, now=NOW)
    text = cve.suggestions(red, today=NOW.date())
    assert text.count("  - id: ") == 2 and f"review_by: {NOW.date() + dt.timedelta(days=30)}" in text
    allow = _allow(tmp_path, f"targets:\n  {TARGET}:\n{text}")
    green = cve.judge([_trivy()], allow, target=TARGET, sbom=SBOM, now=NOW)
    assert green["ok"], green["problems"]
    assert {f["id"] for f in green["allowed"]} == {"CVE-2026-99001", "CVE-2026-99004"}
    # per-target entries do not apply to another target; global ones do
    assert not cve.judge([_trivy()], allow, target="other", now=NOW)["ok"]
    assert cve.judge([_trivy()], _allow(tmp_path, f"global:\n{text}"), target="other", now=NOW)["ok"]


def test_an_expired_exception_fails_the_gate(tmp_path):
    allow = _allow(tmp_path, f"""\
global:
  - {{id: CVE-2026-99001, package: libssl3, reason: "fixed in the next rebuild, tracked in #99", review_by: 2026-12-31}}
  - {{id: CVE-2026-99004, reason: "jinja2 sandbox not used in the image", review_by: {NOW.date() - dt.timedelta(days=1)}}}
""")
    v = cve.judge([_trivy()], allow, now=NOW)
    assert not v["ok"]
    assert [e["id"] for e in v["expired"]] == ["CVE-2026-99004"]
    assert any("CVE-2026-99004 (global) expired on 2026-12-02" in p for p in v["problems"])


def test_unaudited_packages_fail_the_gate_trivy_coverage_and_end_of_life(tmp_path):
    doc = json.loads((F / "trivy-default.json").read_text())
    dropped = _purl("libc6")
    doc["Results"][0]["Packages"] = [p for p in doc["Results"][0]["Packages"] if p["Identifier"]["PURL"] != dropped]
    (tmp_path / "t.json").write_text(json.dumps(doc))
    every_finding_allowed = _allow(tmp_path, "global:\n" + cve.suggestions(cve.judge([_trivy()], cve.Allowlist(), now=NOW)))
    v = cve.judge([cve.read_scan(tmp_path / "t.json", db_metadata=F / "trivy-version.json")], every_finding_allowed,
                  sbom=SBOM, now=NOW)
    assert not v["ok"] and any(dropped.split("?")[0] in u for u in v["unaudited"]), v["problems"]
    doc = json.loads((F / "trivy-default.json").read_text())
    doc["Metadata"]["OS"]["EOSL"] = True
    (tmp_path / "eosl.json").write_text(json.dumps(doc))
    v = cve.judge([cve.read_scan(tmp_path / "eosl.json", db_metadata=F / "trivy-version.json")], cve.Allowlist(), now=NOW)
    assert any("end of life" in u for u in v["unaudited"])


def test_pip_audit_not_found_is_refused_as_a_false_pass():
    """pip-audit -s pypi here: every pin "not found on PyPI and could not be audited", then "No known
    vulnerabilities found" and exit 0 (recorded in the .txt). The gate reads the JSON and refuses it."""
    assert "No known vulnerabilities found" in (F / "pip-audit-image-py311.txt").read_text()
    scan = cve.read_scan(F / "pip-audit-image-py311.json")
    v = cve.judge([scan], cve.Allowlist(), now=NOW)
    assert not v["ok"] and not v["counted"]
    lock = Path(__file__).parents[3] / "gpuforge/render/data/locks/image-py311-torch271.txt"
    pins = [line for line in lock.read_text().splitlines() if "==" in line and not line.startswith("#")]
    assert len(v["unaudited"]) == len(pins) == 101
    assert "could not be audited" in v["problems"][0]


def test_a_stale_or_undated_database_fails_the_gate(tmp_path):
    built = _trivy().db_built
    assert built == dt.datetime(2026, 12, 3, 6, 10, 12, tzinfo=dt.UTC)
    late = built + dt.timedelta(hours=cve.DEFAULT_MAX_DB_AGE_HOURS + 1)
    allow = _allow(tmp_path, "global:\n" + cve.suggestions(cve.judge([_trivy()], cve.Allowlist(), now=NOW)))
    assert cve.judge([_trivy()], allow, now=NOW)["ok"]
    stale = cve.judge([_trivy()], allow, now=late)
    assert not stale["ok"] and "73 h ago (at most 72 h)" in stale["problems"][0]
    assert cve.judge([_trivy()], allow, now=late, max_db_age_hours=96)["ok"]
    undated = cve.judge([cve.read_scan(F / "trivy-default.json")], allow, now=NOW)  # no `trivy version` metadata
    assert not undated["ok"] and "database's age is unknown" in undated["problems"][0]
    doc = json.loads((F / "grype-default.json").read_text())
    doc["descriptor"] = {"name": "grype", "version": "[not provided]", "timestamp": ""}  # as grype's own golden file
    (tmp_path / "g.json").write_text(json.dumps(doc))
    assert "database's age is unknown" in " ".join(cve.judge([cve.read_scan(tmp_path / "g.json")], allow, now=NOW)["problems"])
    doc["descriptor"] = {"name": "grype", "db": {"status": {"built": "2026-11-20T01:02:03Z", "schemaVersion": "v6.0.2"}}}
    (tmp_path / "g6.json").write_text(json.dumps(doc))
    assert "database was built 2026-11-20 01:02" in " ".join(cve.judge([cve.read_scan(tmp_path / "g6.json")], allow,
                                                                      now=NOW)["problems"])


@pytest.mark.parametrize(("text", "line", "want"), [
    ("global:\n  - {id: 'CVE-2026-1; rm -rf /', reason: 'a good enough reason', review_by: 2026-12-31}\n", 2,
     "is not a vulnerability id"),
    ("global:\n  - {id: CVE-2026-99001, review_by: 2026-12-31}\n", 2, "Field required"),
    ("global:\n  - {id: CVE-2026-99001, reason: ok, review_by: 2026-12-31}\n", 2, "at least 10 printable"),
    ("global:\n  - {id: CVE-2026-99001, reason: 'a good enough reason', review_by: 2099-01-01}\n", 2, "more than 366 days"),
    ("global:\n  - {id: CVE-2026-99001, reason: 'a good enough reason', review_by: someday}\n", 2, "date"),
    ("global:\n  - {id: CVE-2026-99001, reason: 'a good enough reason', review_by: 2026-12-31, until: x}\n", 2,
     "unknown key"),
    ("targets:\n  x:\n    - {id: CVE-2026-99001, reason: 'a good enough reason'}\n", 3, "Field required"),
])
def test_a_bad_allowlist_is_one_line_at_the_entry(tmp_path, text, line, want):
    p = tmp_path / "allow.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError) as e:
        cve.load_allowlist(p)
    assert str(e.value).startswith(f"{p}:{line}: ") and want in str(e.value), str(e.value)


def test_cli_is_red_with_exit_8_then_green_with_the_pasted_entries(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("GPUFORGE_STATE_DIR", str(tmp_path / "state"))
    meta = tmp_path / "trivy-version.json"
    fresh = (dt.datetime.now(dt.UTC) - dt.timedelta(hours=2)).isoformat()
    meta.write_text(json.dumps({"Version": "0.58.1", "VulnerabilityDB": {"Version": 2, "UpdatedAt": fresh}}))
    out = tmp_path / "verdict.json"
    args = ["cve-gate", str(F / "trivy-default.json"), "--db-metadata", str(meta), "--sbom", str(SBOM),
            "--target", TARGET, "--output", str(out)]
    assert main(args) == 9
    printed = capsys.readouterr().out
    assert "CRITICAL CVE-2026-99001 in libssl3" in printed and "RED: 2 counted" in printed
    assert json.loads(out.read_text())["ok"] is False
    entries = printed.split("(and say why in `reason`):\n", 1)[1].split("gpuforge: cve-gate: RED")[0]
    (tmp_path / "allow.yaml").write_text(f"targets:\n  {TARGET}:\n{entries}")
    assert main([*args, "--allowlist", str(tmp_path / "allow.yaml")]) == 0, capsys.readouterr()
    verdict = json.loads(out.read_text())
    assert verdict["ok"] and verdict["sbom_sha256"] and verdict["scanners"] == [{"name": "trivy", "version": "0.58.1"}]


def test_cve_ok_needs_the_newest_verdict_on_this_digest_green_and_after_the_build():
    d = "sha256:" + "a" * 64
    green = {"subject": {"digest": d}, "ok": True, "problems": [], "judged_at": "2026-12-03T14:00:00+00:00"}
    red = {**green, "ok": False, "problems": ["CRITICAL x"], "judged_at": "2026-12-04T14:00:00+00:00"}
    assert cve.cve_ok([green], digest=d, built_at="2026-12-03T13:00:00+00:00") == []
    assert "no signed CVE verdict" in cve.cve_ok([{**green, "subject": {"digest": "sha256:" + "b" * 64}}], digest=d)[0]
    assert "is red: CRITICAL x" in cve.cve_ok([green, red], digest=d)[0]  # the verdict turned red: newest decides
    assert "older than the build" in cve.cve_ok([green], digest=d, built_at="2026-12-03T15:00:00+00:00")[0]
    assert "older than 24 h" in cve.cve_ok([green], digest=d, max_verdict_age_hours=24,
                                            now=dt.datetime(2026, 12, 5, tzinfo=dt.UTC))[0]
