"""The CVE gate's OpenVEX document, from the gate's own verdicts on the recorded scanner output (tests/unit/fixtures/cve):
each statement as docs/cve.md promises it, every document valid against the schema openvex/spec publishes
(tests/openvex_check.py names the pinned copy), the image named as Trivy and Grype name a scanned image, and hostile
scanner values kept from widening a not_affected claim."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest
import yaml
from openvex_check import problems, schema
from packageurl import PackageURL
from pydantic import ValidationError

from gpuforge import paths
from gpuforge.cli import main
from gpuforge.cve import gate as cve
from gpuforge.cve import openvex
from gpuforge.errors import ConfigError

F = Path(__file__).parents[1] / "fixtures" / "cve"
TARGET = "pt271-cu126-py311-debian12-runtime-wheels"
NOW = dt.datetime(2026, 12, 3, 14, 30, tzinfo=dt.UTC)
DIGEST = "sha256:" + "5d" * 32
REGISTRY, REPOSITORY = "registry.example:5000", "gpuforge/pytorch"


def _trivy():
    return cve.read_scan(F / "trivy-default.json", db_metadata=F / "trivy-version.json")


def _allow(tmp_path, text: str) -> cve.Allowlist:
    p = tmp_path / "allow.yaml"
    p.write_text(text)
    return cve.load_allowlist(p)


def _doc(verdict: dict) -> dict:
    doc, left_out = openvex.document(verdict, registry=REGISTRY, repository=REPOSITORY, author="ML Platform")
    assert doc is not None and left_out == 0
    assert problems(doc) == [], problems(doc)
    return doc


def _by_vuln(doc: dict) -> dict[str, dict]:
    out = {s["vulnerability"]["name"]: s for s in doc["statements"]}
    assert len(out) == len(doc["statements"])
    return out


def test_the_justifications_are_the_pinned_schemas():
    enum = schema()["properties"]["statements"]["items"]["properties"]["justification"]["enum"]
    assert list(openvex.JUSTIFICATIONS) == enum


def test_the_allowlist_accepts_exactly_the_justifications():
    entry = {"id": "CVE-2026-99004", "reason": "not reachable here", "review_by": "2026-12-31"}
    for word in openvex.JUSTIFICATIONS:
        assert cve.Entry.model_validate({**entry, "justification": word}).justification == word
    with pytest.raises(ValidationError):
        cve.Entry.model_validate({**entry, "justification": "not_a_spec_label"})


def test_counted_findings_are_affected_with_what_fixes_them_about_the_digest():
    red = cve.judge([_trivy()], cve.Allowlist(), now=NOW, subject={"digest": DIGEST})
    doc = _doc(red)
    assert doc["@context"] == "https://openvex.dev/ns/v0.2.0" and doc["@id"].startswith(openvex.ID_PREFIX)
    assert doc["timestamp"] == red["judged_at"] and doc["version"] == 1 and doc["author"] == "ML Platform"
    s = _by_vuln(doc)
    assert set(s) == {f["id"] for f in red["counted"]} == {"CVE-2026-99001", "CVE-2026-99004"}
    ssl = s["CVE-2026-99001"]
    assert ssl["status"] == "affected" and "libssl3 3.0.20-1~deb12u2 -> 3.0.20-1~deb12u3" in ssl["action_statement"]
    [product] = ssl["products"]
    assert product["subcomponents"] == [{"@id": "pkg:deb/debian/libssl3"}]
    assert s["CVE-2026-99004"]["products"][0]["subcomponents"] == [{"@id": "pkg:pypi/jinja2"}]
    # the image as Trivy and Grype name a scanned one: an OCI purl of the digest in its repository, and the digest
    p = PackageURL.from_string(product["@id"])
    assert (p.type, p.name, p.version, p.qualifiers) == ("oci", "pytorch", DIGEST,
                                                         {"repository_url": f"{REGISTRY}/{REPOSITORY}"})
    assert product["hashes"] == {"sha-256": DIGEST.removeprefix("sha256:")}
    # the same verdict gives the same document (its @id is a hash of the content)
    assert openvex.document(red, registry=REGISTRY, repository=REPOSITORY, author="ML Platform")[0] == doc


def test_an_exception_with_a_justification_is_not_affected_one_without_is_an_accepted_risk(tmp_path):
    allow = _allow(tmp_path, """\
global:
  - id: CVE-2026-99001
    package: libssl3
    reason: "the image makes no TLS connection with a client certificate"
    review_by: 2027-01-31
    justification: vulnerable_code_not_in_execute_path
  - {id: CVE-2026-99004, package: jinja2, reason: "fixed in the next rebuild, tracked in #99", review_by: 2026-12-31}
""")
    green = cve.judge([_trivy()], allow, now=NOW, subject={"digest": DIGEST})
    assert green["ok"], green["problems"]
    s = _by_vuln(_doc(green))
    ssl = s["CVE-2026-99001"]
    assert ssl["status"] == "not_affected" and ssl["justification"] == "vulnerable_code_not_in_execute_path"
    assert ssl["impact_statement"] == ("the image makes no TLS connection with a client certificate "
                                       "(CVE allowlist, global; review by 2027-01-31)")
    assert ssl["products"][0]["subcomponents"] == [{"@id": "pkg:deb/debian/libssl3"}]
    jinja = s["CVE-2026-99004"]
    assert jinja["status"] == "affected" and "justification" not in jinja
    assert jinja["action_statement"] == ("Accepted until 2026-12-31 (CVE allowlist, global): fixed in the next "
                                         "rebuild, tracked in #99. Fix: jinja2 3.1.6 -> 3.1.7.")


def test_an_expired_exception_is_affected_even_with_a_justification(tmp_path):
    allow = _allow(tmp_path, f"""\
targets:
  {TARGET}:
    - id: CVE-2026-99004
      reason: "the sandbox is not used by anything in the image"
      review_by: {NOW.date() - dt.timedelta(days=1)}
      justification: vulnerable_code_not_in_execute_path
""")
    v = cve.judge([_trivy()], allow, target=TARGET, now=NOW, subject={"digest": DIGEST})
    jinja = _by_vuln(_doc(v))["CVE-2026-99004"]
    assert jinja["status"] == "affected" and "justification" not in jinja
    assert jinja["action_statement"].startswith(f"The exception (CVE allowlist, targets.{TARGET}) expired on 2026-12-02")


def test_grype_findings_and_an_exception_for_every_package_state_each_package(tmp_path):
    scan = cve.read_scan(F / "grype-default.json")
    [f] = [f for f in scan.findings if f.fixable and f.severity in ("HIGH", "CRITICAL")]
    allow = _allow(tmp_path, f"global:\n  - {{id: {f.id}, reason: 'not reachable from the image entrypoint', "
                             "review_by: 2027-01-31, justification: vulnerable_code_not_present}\n")
    s = _by_vuln(_doc(cve.judge([scan], allow, now=NOW, subject={"digest": DIGEST})))
    assert s[f.id]["status"] == "not_affected"
    assert s[f.id]["products"][0]["subcomponents"] == [{"@id": openvex.package_purl(f.purl)}]


def test_no_digest_or_nothing_to_state_is_no_document():
    red = cve.judge([_trivy()], cve.Allowlist(), now=NOW)
    assert openvex.document(red, registry=REGISTRY, repository=REPOSITORY) == (None, 0)
    clean = cve.Scan("trivy", "0.58.1", db_built=NOW)
    assert openvex.document(cve.judge([clean], cve.Allowlist(), now=NOW, subject={"digest": DIGEST}),
                            registry=REGISTRY, repository=REPOSITORY) == (None, 0)


@pytest.mark.parametrize("purl", ["", "libssl3", "pkg:deb/debian/libssl3 3.0?x", "https://example.com/x",
                                  "pkg:/libssl3", "pkg:deb/" + "a" * 1000])
def test_a_finding_without_a_usable_purl_never_widens_not_affected_to_the_image(tmp_path, purl):
    f = cve.Finding(id="CVE-2026-99001", package="libssl3", version="1", severity="HIGH", fixed="2", purl=purl)
    g = cve.Finding(id="CVE-2026-99002", package="libfoo", version="1", severity="HIGH", fixed="2", purl=purl)
    scan = cve.Scan("trivy", "0.58.1", findings=[f, g], db_built=NOW)
    allow = _allow(tmp_path, "global:\n  - {id: CVE-2026-99001, reason: 'not reachable at all here', "
                             "review_by: 2027-01-31, justification: component_not_present}\n")
    doc, left_out = openvex.document(cve.judge([scan], allow, now=NOW, subject={"digest": DIGEST}),
                                     registry=REGISTRY, repository=REPOSITORY)
    assert left_out == 1 and problems(doc) == []
    [affected] = doc["statements"]  # the counted finding: affected, about the whole image (hides nothing)
    assert affected["vulnerability"]["name"] == "CVE-2026-99002" and "subcomponents" not in affected["products"][0]


def test_package_purls_drop_version_and_qualifiers():
    assert openvex.package_purl("pkg:deb/debian/base-files@12.4%2Bdeb12u15?arch=amd64&distro=debian-12") == \
        "pkg:deb/debian/base-files"
    assert openvex.package_purl("pkg:npm/%40types/node@20.1.0") == "pkg:npm/%40types/node"
    assert openvex.package_purl("pkg:pypi/Typing_Extensions@4.12.2") == "pkg:pypi/typing-extensions"
    assert openvex.package_purl("pkg:golang/github.com/docker/docker@v24.0.0#client") == \
        "pkg:golang/github.com/docker/docker"


def test_the_pinned_checks_refuse_what_scanners_would_misread():
    red = cve.judge([_trivy()], cve.Allowlist(), now=NOW, subject={"digest": DIGEST})
    doc = _doc(red)
    bad = json.loads(json.dumps(doc))
    bad["statements"][0].update(status="not_affected")  # no justification nor impact statement, and an action
    bad["timestamp"] = "yesterday"
    found = problems(bad)
    assert any(p.startswith("timestamp:") for p in found), found
    assert any("statements/0" in p and "action_statement with status not_affected" in p for p in found), found
    assert any(p.startswith("statements/0:") and "valid" in p for p in found), found


def test_the_cli_writes_the_document_beside_the_verdict_and_removes_a_stale_one(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("GPUFORGE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("GPUFORGE_REGISTRY", raising=False)
    meta = tmp_path / "trivy-version.json"
    fresh = (dt.datetime.now(dt.UTC) - dt.timedelta(hours=2)).isoformat()
    meta.write_text(json.dumps({"Version": "0.58.1", "VulnerabilityDB": {"Version": 2, "UpdatedAt": fresh}}))
    out, vex = tmp_path / "out" / "cve-verdict.json", tmp_path / "out" / "cve-verdict.openvex.json"
    args = ["cve-gate", str(F / "trivy-default.json"), "--db-metadata", str(meta), "--target", TARGET,
            "--output", str(out), "--digest", DIGEST, "--vex-author", "ML Platform <ml@example.com>"]
    assert main(args) == 9
    printed = capsys.readouterr().out
    assert f"wrote {vex} (OpenVEX: 0 not_affected, 2 affected)" in printed
    doc = json.loads(vex.read_text())
    assert problems(doc) == [] and doc["author"] == "ML Platform <ml@example.com>"
    m = yaml.safe_load((paths.project_root() / "matrix.yaml").read_text())  # the checkout's: a runner's copy may rename it
    assert PackageURL.from_string(doc["statements"][0]["products"][0]["@id"]).qualifiers["repository_url"] == \
        f"{m['registry']}/{m['repository']}"  # the matrix's registry and repository
    # the printed entries, each given a justification: the image is now stated not affected by both
    entries = printed.split("(and say why in `reason`):\n", 1)[1].split("gpuforge: cve-gate: GREEN")[0]
    entries = entries.split("gpuforge: cve-gate: RED")[0].replace(
        "    # justification:", "    justification: inline_mitigations_already_exist #")
    (tmp_path / "allow.yaml").write_text(f"targets:\n  {TARGET}:\n{entries}")
    assert main([*args, "--allowlist", str(tmp_path / "allow.yaml")]) == 0, capsys.readouterr()
    doc = json.loads(vex.read_text())
    assert {s["status"] for s in doc["statements"]} == {"not_affected"} and problems(doc) == []
    # a scan with no findings states nothing: no document, and the earlier one is gone
    clean = json.loads((F / "trivy-default.json").read_text())
    for r in clean["Results"]:
        r.pop("Vulnerabilities", None)
    (tmp_path / "clean.json").write_text(json.dumps(clean))
    assert main([*args[:1], str(tmp_path / "clean.json"), *args[2:]]) == 0
    assert "no OpenVEX document: no finding to state" in capsys.readouterr().out and not vex.exists()
    assert out.exists()


def test_a_bad_justification_is_one_line_at_the_entry(tmp_path):
    p = tmp_path / "allow.yaml"
    p.write_text("global:\n  - {id: CVE-2026-99001, reason: 'a good enough reason', review_by: 2026-12-31,\n"
                 "     justification: not_exploitable}\n")
    with pytest.raises(ConfigError) as e:
        cve.load_allowlist(p)
    assert str(e.value).startswith(f"{p}:3: global.0.justification: ") and "vulnerable_code_not_present" in str(e.value)
    assert "\n" not in str(e.value)
