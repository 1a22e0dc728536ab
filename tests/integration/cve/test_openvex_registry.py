"""`gpuforge cve-gate --attest` signs its OpenVEX document onto the digest, for real: a loopback docker-registry, real
cosign with a key pair made here and no transparency log, as every other attestation is signed. The OpenVEX
attestation then verifies with a consumer's `cosign verify-attestation --type openvex`, and the documented fetch
command of docs/cve.md, run by bash as written (key file and image replaced), returns the document the gate wrote,
valid against the schema openvex/spec publishes (tests/openvex_check.py).

The image is a one-file image of its own (`docker import`, as test_consumer_verify.py makes one): the gate judges a
scan of the default image's SBOM (tests/unit/fixtures/cve), not the bytes at the digest, so any pushed digest serves.
Cost: one small push per test, then cosign calls (about 1 s each).
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import json
import shutil
import subprocess

import docker.errors
import pytest
from openvex_check import problems
from registries import LocalRegistry, pushed_tiny_image

from conftest import ROOT, need
from gpuforge.cli import main
from gpuforge.cve import openvex
from gpuforge.registry import attest

pytestmark = pytest.mark.docker
F = ROOT / "tests" / "unit" / "fixtures" / "cve"
TARGET = "pt271-cu126-py311-debian12-runtime-wheels"
DOC_REF = "registry.example.com/gpuforge/pytorch@sha256:DIGEST"  # the image docs/cve.md's fetch command names


def documented_fetch_command() -> str:
    """The fetch command docs/cve.md gives, between its marker and the end of its bash block."""
    doc = (ROOT / "docs" / "cve.md").read_text()
    return doc.split("<!-- openvex-fetch:", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]


@pytest.fixture
def pushed(docker_engine, tmp_path, monkeypatch):
    for tool in ("cosign", "jq"):
        if not shutil.which(tool):
            need(f"needs {tool} (tools/start-engine.sh installs it)")
    monkeypatch.delenv("GPUFORGE_COSIGN_TLOG", raising=False)  # the default: no Rekor upload
    monkeypatch.setenv("COSIGN_PASSWORD", "vex-test-key-pass")
    subprocess.run(["cosign", "generate-key-pair", "--output-key-prefix", str(tmp_path / "k")], check=True,
                   capture_output=True)
    reg = LocalRegistry(tmp_path / "reg", None)
    tag = f"{reg.host}/gpuforge/pytorch:vex-1"
    try:
        digest = pushed_tiny_image(docker_engine, tag)
        yield {"host": reg.host, "digest": digest, "ref": f"{reg.host}/gpuforge/pytorch@{digest}",
               "key": tmp_path / "k.key", "pub": tmp_path / "k.pub"}
    finally:
        with contextlib.suppress(docker.errors.ImageNotFound):  # not made when an earlier step failed
            docker_engine.images.remove(tag, force=True)
        reg.stop()


def test_cve_gate_attest_signs_an_openvex_document_that_cosign_verifies_as_openvex(pushed, tmp_path, capsys):
    meta = tmp_path / "trivy-version.json"
    fresh = (dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)).isoformat()
    meta.write_text(json.dumps({"Version": "0.58.1", "VulnerabilityDB": {"Version": 2, "UpdatedAt": fresh}}))
    review = (dt.date.today() + dt.timedelta(days=30)).isoformat()
    (tmp_path / "allow.yaml").write_text(f"""\
global:
  - id: CVE-2026-99001
    package: libssl3
    reason: "the image makes no TLS connection with a client certificate"
    review_by: {review}
    justification: vulnerable_code_not_in_execute_path
""")
    out = tmp_path / "reports" / "cve-verdict.json"
    args = ["cve-gate", str(F / "trivy-default.json"), "--db-metadata", str(meta), "--allowlist",
            str(tmp_path / "allow.yaml"), "--target", TARGET, "--registry", pushed["host"], "--digest", pushed["digest"],
            "--output", str(out), "--attest", "--sign-key", str(pushed["key"]), "--vex-author", "gpuforge tests"]
    # jinja2's fixable HIGH finding has no exception: red (exit 9), and the red verdict and its document are signed too
    assert main(args) == 9
    printed = capsys.readouterr().out
    assert f"signed the OpenVEX document onto {pushed['ref']} ({openvex.OPENVEX_TYPE}" in printed, printed
    written = json.loads(openvex.path_beside(out).read_text())
    assert problems(written) == []
    assert {(s["vulnerability"]["name"], s["status"]) for s in written["statements"]} == {
        ("CVE-2026-99001", "not_affected"), ("CVE-2026-99004", "affected")}

    # a consumer's own check: cosign's openvex type, the public key, no log
    r = subprocess.run(["cosign", "verify-attestation", "--type", "openvex", "--key", str(pushed["pub"]),
                        "--insecure-ignore-tlog=true", pushed["ref"]], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    [stmt] = [json.loads(base64.b64decode(json.loads(line)["payload"])) for line in r.stdout.splitlines()
              if line.startswith("{")]
    assert stmt["predicateType"] == "https://openvex.dev/ns"
    assert stmt["subject"][0]["digest"] == {"sha256": pushed["digest"].removeprefix("sha256:")}
    assert stmt["predicate"] == written and problems(stmt["predicate"]) == []
    # the verdict is beside it, under its own type: the OpenVEX type does not pick it up
    r = subprocess.run(["cosign", "verify-attestation", "--type", "https://gpuforge.dev/attestations/cve/v1", "--key",
                        str(pushed["pub"]), "--insecure-ignore-tlog=true", pushed["ref"]], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and len([x for x in r.stdout.splitlines() if x.startswith("{")]) == 1, r.stderr[-2000:]

    # the documented fetch, as written: the document the gate wrote, from the registry
    cmd = documented_fetch_command()
    assert DOC_REF in cmd and "--key cosign.pub " in cmd
    cmd = cmd.replace("--key cosign.pub ", f"--key {pushed['pub']} ").replace(DOC_REF, pushed["ref"])
    r = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    fetched = json.loads((tmp_path / "image.openvex.json").read_text())
    assert fetched == written


def test_the_versioned_context_is_not_cosigns_openvex_type_and_fetches_nothing(pushed, tmp_path):
    """Why the gate signs with https://openvex.dev/ns: a document signed under its @context URI
    (https://openvex.dev/ns/v0.2.0) is not what `verify-attestation --type openvex` asks for."""
    doc = tmp_path / "v.openvex.json"
    doc.write_text(json.dumps({"@context": openvex.CONTEXT, "@id": openvex.ID_PREFIX + "0" * 64, "author": "t",
                               "timestamp": "2026-12-03T14:30:00+00:00", "version": 1, "statements": [
                                   {"vulnerability": {"name": "CVE-2026-99001"}, "status": "under_investigation",
                                    "products": [{"@id": "pkg:oci/pytorch"}]}]}))
    assert problems(json.loads(doc.read_text())) == []
    attest.attest(pushed["ref"], doc, openvex.CONTEXT, signer=attest.Signer(key=str(pushed["key"])))
    cmd = documented_fetch_command().replace("--key cosign.pub ", f"--key {pushed['pub']} ").replace(DOC_REF, pushed["ref"])
    r = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode != 0, r.stderr[-1000:]
    assert f"none of the attestations matched the predicate type: openvex, found: {openvex.CONTEXT}" in r.stderr
    assert json.loads((tmp_path / "image.openvex.json").read_text() or "null") is None  # jq -e's null: no document
    # without pipefail, as a shell runs it by default, jq -e still fails
    r = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode != 0
