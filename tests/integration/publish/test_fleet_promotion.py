"""A fleet of three pools, against a real docker-registry and real cosign attestations (a key made for the run):
green GPU evidence for two pools blocks prod and names the third; with all three (and a green signed CVE verdict)
it promotes; `gpuforge support` and the release notes then render from the signed statements on the registry.

The image and its non-GPU report are real (the `validated` default image). The GPU reports are made by
tests/fleet_reports.py from the real H200 run in docs/measurements (no Docker on the lent H200 machine); the A100
and L4 pools' reports are that run with the model fields changed: FIXTURES, labelled in their facts.
Cost: one push of the default image to the run's registry (seconds when another module pushed it there first: the
layers are mounted; ~3 min of gzip otherwise), then cosign and skopeo calls (< 2 s each).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import re
import subprocess
import time
from pathlib import Path

import pytest
import state_here
from fleet_reports import KIND, gpu_report
from registries import PASSWORD, USER, run_registry

from conftest import ROOT, need
from gpuforge.cli import main
from gpuforge.cve import gate as cve
from gpuforge.errors import PromotionRefused
from gpuforge.evidence import signed_run, statements
from gpuforge.plan.matrix import load_matrix
from gpuforge.publish import promote
from gpuforge.push import pusher
from gpuforge.registry import attest
from gpuforge.validate import evidence
from gpuforge.validate.report_model import Report

pytestmark = pytest.mark.docker
KEY_PASSWORD = "fleet-test-key-pass"
FLEET = """
fleet:
  h200:
    gpu: {model: H200, capability: "9.0"}
    drivers: ["580.159.04"]
    runs_on: [self-hosted, linux, x64, gpu, h200]
  a100:
    gpu: {model: A100, capability: "8.0"}
    drivers: ["570.133.20"]
    runs_on: [self-hosted, linux, x64, gpu, a100]
  l4x2:
    gpu: {model: L4, capability: "8.9"}
    drivers: ["575.57.08"]
    runs_on: [self-hosted, linux, x64, gpu, l4]
    gpus: 2
"""
REPO = "gpuforge-fleet/pytorch"  # this module's repository in the run's registry
POOLS = {"h200": ("H200", "580.159.04", 1), "a100": ("A100", "570.133.20", 1), "l4x2": ("L4", "575.57.08", 2)}


@pytest.fixture(scope="module")
def fleet(validated, tmp_path_factory):
    """The default image pushed to a fresh registry; a matrix whose fleet has three pools; a cosign key."""
    import shutil

    if not shutil.which("cosign"):
        need("needs cosign (Debian trixie's; tools/start-engine.sh installs it)")
    d = tmp_path_factory.mktemp("fleet")
    host = run_registry()  # the run's registry: the push mounts the layers another module pushed (or gzips them first)
    mp = pytest.MonkeyPatch()
    mp.setenv("COSIGN_PASSWORD", KEY_PASSWORD)
    mp.setenv("GPUFORGE_REGISTRY_USER", USER)
    mp.setenv("GPUFORGE_REGISTRY_PASSWORD", PASSWORD)
    subprocess.run(["cosign", "generate-key-pair", "--output-key-prefix", str(d / "k")], check=True, capture_output=True)
    mp.setenv("GPUFORGE_COSIGN_PUBLIC_KEY", str(d / "k.pub"))
    text = (ROOT / "matrix.yaml").read_text().partition("\n# fleet:\n")[0]  # the shipped example left out
    text = re.sub(r"(?m)^repository: .*$", f"repository: {REPO}", text)
    (d / "matrix.yaml").write_text(text + FLEET)
    m = load_matrix(d / "matrix.yaml")
    t0 = m.by_id(validated["target"].id)
    t = dataclasses.replace(t0, tags=(f"{host}/{REPO}:{t0.tag}",), registry=host)
    assert t.repository == REPO
    start = time.monotonic()
    [res] = pusher.push_targets([t], **state_here.push_kw())
    print(f"\npush of the default image: {time.monotonic() - start:.0f} s")
    ref = f"{host}/{REPO}@{res['digest']}"
    # signed as `validate --attest` signs (the only signing path): this image's real non-GPU report and inventory
    out = validated["reports"] / t.id
    rep = Report.from_json((out / "report.json").read_text(), str(out / "report.json"))
    signed_run.sign_report(ref, rep, signer=state_here.signer(str(d / "k.key")), target=t,
                           inventory=json.loads((out / "sbom.json").read_text()), os_name=t.os)
    yield {"t": t, "digest": res["digest"], "ref": ref, "key": str(d / "k.key"),
           "matrix": d / "matrix.yaml", "dir": d, "host": host}
    mp.undo()


def _attest_pool(fleet, validated, pool: str) -> None:
    model, driver, count = POOLS[pool]
    base = json.loads((validated["reports"] / fleet["t"].id / "report.json").read_text())
    rep = gpu_report(base, model=model, driver=driver, count=count, started=time.time(),
                     required=evidence.required_checks(KIND))
    assert rep["green"], rep["problems"]
    signed_run.sign_report(fleet["ref"], Report.of(rep), signer=state_here.signer(fleet["key"]), target=fleet["t"])  # labelled a fixture inside (gpu_report)


def _sign_green_cve_verdict(fleet, capsys) -> None:
    """`gpuforge cve-gate --attest` on the recorded Trivy fixture (a fresh DB), its paste-ready entries in the
    allowlist: the verdict is signed onto the pushed digest."""
    fx = Path(__file__).parents[2] / "unit" / "fixtures" / "cve"
    meta = fleet["dir"] / "trivy-version.json"
    fresh = (dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)).isoformat()
    meta.write_text(json.dumps({"Version": "0.58.1", "VulnerabilityDB": {"Version": 2, "UpdatedAt": fresh}}))
    scan = cve.read_scan(fx / "trivy-default.json", db_metadata=meta)
    allow = fleet["dir"] / "allow.yaml"
    allow.write_text("global:\n" + cve.suggestions(cve.judge([scan], cve.Allowlist())))
    args = ["--matrix", str(fleet["matrix"]), "cve-gate", str(fx / "trivy-default.json"), "--db-metadata", str(meta),
            "--sbom", str(fx / "sbom-default.cdx.json"), "--allowlist", str(allow), "--target", fleet["t"].id,
            "--output", str(fleet["dir"] / "cve.json"), "--attest", "--sign-key", fleet["key"], "--registry", fleet["host"]]
    assert main(args) == 0, capsys.readouterr()
    assert f"signed the verdict onto {fleet['ref']}" in capsys.readouterr().out


def test_two_of_three_pools_block_prod_naming_the_third_then_all_three_promote(fleet, validated, monkeypatch, capsys):
    t = fleet["t"]
    reports = validated["reports"]
    assert [p.name for p in t.pools] == ["h200", "a100", "l4x2"]
    promote.promote_targets([t], env="dev", reports=reports, **state_here.promote_kw(fleet["key"]))
    _attest_pool(fleet, validated, "h200")
    _attest_pool(fleet, validated, "a100")
    # beside gpuforge's predicate, each run signed an in-toto Test Result per pool its host is a node of
    results = attest.verified_predicates(fleet["ref"], statements.TEST_RESULT_TYPE, state_here.verifier(fleet["key"].replace(".key", ".pub")))
    scopes = [r["configuration"][0]["name"] for r in results]
    assert scopes == [statements.IMAGE, "gpuforge.dev/pool/h200", "gpuforge.dev/pool/a100"], scopes
    with pytest.raises(PromotionRefused) as e:
        promote.promote_targets([t], env="prod", reports=reports, **state_here.promote_kw(fleet["key"]))
    msg = str(e.value)
    assert "pool(s) l4x2 of the fleet" in msg and "l4x2 (L4, sm_89" in msg and "h200," not in msg, msg
    _attest_pool(fleet, validated, "l4x2")
    monkeypatch.setenv("GPUFORGE_PROD_REQUIRE_CVE", "1")
    with pytest.raises(PromotionRefused, match="no signed CVE verdict"):
        promote.promote_targets([t], env="prod", reports=reports, **state_here.promote_kw(fleet["key"]))
    _sign_green_cve_verdict(fleet, capsys)
    [res] = promote.promote_targets([t], env="prod", reports=reports, **state_here.promote_kw(fleet["key"]))
    assert res["digest"] == fleet["digest"] and f"{t.tag}-prod" in res["moved"]
    # each promotion signed a SLSA verification summary naming the digest and the statements it was decided from
    vsas = attest.verified_predicates(fleet["ref"], statements.VSA_TYPE, state_here.verifier(fleet["key"].replace(".key", ".pub")))
    assert [v["verifiedLevels"] for v in vsas] == [["GPUFORGE_PROMOTED_DEV"], ["GPUFORGE_PROMOTED_PROD"]]
    assert vsas[-1]["resourceUri"] == fleet["ref"] and vsas[-1]["verificationResult"] == "PASSED"
    assert len(vsas[-1]["inputAttestations"]) == 2  # the newest validation statement and the newest GPU one

    capsys.readouterr()  # what promotion printed
    # gpuforge support: the prod digest x the three pools, from the registry's signed statements
    m = ["--matrix", str(fleet["matrix"])]
    sel = [t.id, "--registry", fleet["host"]]
    assert main([*m, "support", *sel, "--format", "json"]) == 0
    row = json.loads(capsys.readouterr().out)["rows"][0]
    assert row["digest"] == fleet["digest"]
    assert {p: c["result"] for p, c in row["pools"].items()} == {"h200": "green", "a100": "green", "l4x2": "green"}
    assert row["pools"]["l4x2"]["gpus"] == 2 and row["pools"]["a100"]["driver"] == "570.133.20"
    assert main([*m, "support", *sel, "--format", "markdown"]) == 0
    md = capsys.readouterr().out
    assert "| target | prod digest | h200 (H200, 580.159.04)" in md and md.count("green 20") == 3

    # release notes of the promoted digest
    out = fleet["dir"] / "notes"
    assert main([*m, "release-notes", *sel, "--format", "json", "--output-dir", str(out), "--attest",
                 "--sign-key", fleet["key"]]) == 0
    n = json.loads(capsys.readouterr().out)
    assert n["versions"]["torch"] == "2.7.1+cu126" and n["driver_floor"]["full"] == "560.28.03"
    assert {g["gpu"] for g in n["gpus_validated"]} == {"NVIDIA H200", "NVIDIA A100", "NVIDIA L4"}
    assert n["cve"]["ok"] is True and n["cve"]["allowed"] == 2
    assert n["size_gb"] and n["packages"] > 250
    skipped = {k["check"] for k in n["known_issues"]}
    assert "test_gpu_smoke::test_multi_gpu_allreduce_exact" in skipped  # one-GPU runs: the reviewed skip, said
    notes_md = (out / t.id / "release-notes.md").read_text()
    assert re.search(r"\*\*CVE verdict\*\*: green", notes_md) and "no previous prod digest" in notes_md
    signed = attest.verified_predicates(fleet["ref"], "https://gpuforge.dev/attestations/release-notes/v1",
                                        state_here.verifier(str(fleet["dir"] / "k.pub")))
    assert signed and signed[0]["digest"] == fleet["digest"]

    # the nightly re-scan's input: the prod digest's signed SBOM, verified, without pulling the image
    assert main([*m, "prod-sboms", *sel, "--output-dir", str(fleet["dir"] / "rescan")]) == 0
    got = fleet["dir"] / "rescan" / t.id
    assert (got / "digest").read_text().strip() == fleet["digest"]
    local = json.loads((validated["reports"] / t.id / "sbom.cdx.json").read_text())
    assert json.loads((got / "sbom.cdx.json").read_text())["components"] == local["components"]
