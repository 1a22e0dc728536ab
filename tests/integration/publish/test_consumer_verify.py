"""The consumer's verify command of docs/promotion.md (and README.md), run by bash as written — only the key
file and the image reference replaced — against an image that gpuforge's own attest code signed with a key
and without the transparency log, on a loopback docker-registry. Seconds, no image build: the same command
runs against the validated default image in test_registry.py::test_the_documented_consumer_command_works_verbatim.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess

import docker.errors
import pytest
import state_here
from registries import DOC_REF, LocalRegistry, documented_consumer_command, pushed_tiny_image

from conftest import need
from gpuforge.registry import attest

pytestmark = pytest.mark.docker


def _run(cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-o", "pipefail", "-c", cmd], capture_output=True, text=True, timeout=300)


def test_the_documented_command_verifies_a_key_signed_attestation_without_the_log(docker_engine, tmp_path, monkeypatch):
    for tool in ("cosign", "jq"):
        if not shutil.which(tool):
            need(f"needs {tool} (tools/start-engine.sh installs it)")
    monkeypatch.delenv("GPUFORGE_COSIGN_TLOG", raising=False)  # the default: no Rekor upload
    reg = LocalRegistry(tmp_path / "reg", None)
    signed, unsigned = f"{reg.host}/gpuforge/pytorch:verify-1", f"{reg.host}/gpuforge/pytorch:verify-2"
    try:
        subprocess.run(["cosign", "generate-key-pair", "--output-key-prefix", str(tmp_path / "k")], check=True,
                       capture_output=True, env={**os.environ, "COSIGN_PASSWORD": "pw"})
        monkeypatch.setenv("COSIGN_PASSWORD", "pw")
        digest = pushed_tiny_image(docker_engine, signed)
        image_id = docker_engine.images.get(signed).id
        pred = tmp_path / "pred.json"
        pred.write_text(json.dumps({"green": True, "evidence": {"partial": False, "image_id": image_id}}))
        attest.attest(f"{reg.host}/gpuforge/pytorch@{digest}", pred, attest.VALIDATION_TYPE,
                      signer=state_here.signer(str(tmp_path / "k.key")))
        cmd = documented_consumer_command()
        assert DOC_REF in cmd and "--key cosign.pub " in cmd
        cmd = cmd.replace("--key cosign.pub ", f"--key {tmp_path / 'k.pub'} ")

        r = _run(cmd.replace(DOC_REF, signed))
        assert r.returncode == 0, r.stderr[-2000:]
        assert r.stdout.splitlines() == [f"true false {image_id}"]
        # the flag is why it works: without it cosign refuses a signature that is in no transparency log
        r = _run(cmd.replace(DOC_REF, signed).replace(" --insecure-ignore-tlog=true", ""))
        assert r.returncode != 0 and r.stdout == ""
        # an image nobody signed: cosign fails, nothing on stdout
        pushed_tiny_image(docker_engine, unsigned)
        r = _run(cmd.replace(DOC_REF, unsigned))
        assert r.returncode != 0 and r.stdout == "" and "no matching attestations" in r.stderr, r.stderr[-1000:]
    finally:
        for ref in (signed, unsigned):
            with contextlib.suppress(docker.errors.ImageNotFound):  # not made when an earlier step failed
                docker_engine.images.remove(ref, force=True)
        reg.stop()
