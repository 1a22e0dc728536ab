"""The bundle the H100 signed offline (docs/measurements/gpu-h100-proof/), kept as a fixture only for what it is
evidence of: the built image by content. Its every envelope verifies with the recorded public key (cosign, offline),
its signed table agrees with its validation statement, and both name the image id and the 18 layers the carry tool
recorded of the image built here; the node-unfit run's bundle beside it is signed, and not green."""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path

import pytest

from gpuforge.errors import BundleRefused
from gpuforge.evidence import attach, bundle
from gpuforge.registry import attest

PROOF = Path(__file__).resolve().parents[3] / "docs" / "measurements" / "gpu-h100-proof"
BUILT = json.loads((PROOF / "connected" / "carry-manifest.json").read_text())  # the image built here, as carried
KEY = attest.Verifier(key=str(PROOF / "cosign.pub"), identity=None, issuer=None)


@pytest.fixture(autouse=True)
def _cosign():
    if not shutil.which("cosign"):
        pytest.fail("needs cosign (tools/start-engine.sh installs it)")


def test_the_h100_bundle_is_signed_evidence_for_the_built_image():
    b = bundle.read(PROOF / "gpu" / "bundle" / "gpu.bundle")
    attach.verify_signatures(b, KEY)
    c = b.contents()
    rep = attach.agreeing(b, c)
    assert (c.image_id, c.diff_ids) == (BUILT["image_id"], BUILT["diff_ids"]) and len(c.diff_ids) == 18
    assert c.green and c.pools == ["h100"] and rep.green
    assert c.gpu_host.gpu_names == ["NVIDIA H100 80GB HBM3"] and c.gpu_host.driver == "580.159.04"
    assert c.subject.endswith("@sha256:95734f819ef3a9cd13b00114a012b39bbe0bdb52f3837e659ba7b551edac7366")


def test_the_unfit_nodes_bundle_is_not_green():
    """Signed before a run whose node readiness blames signed nothing: kept as the fault the H100 run found."""
    b = bundle.read(PROOF / "gpu" / "bundle-node-unfit" / "gpu.bundle")
    attach.verify_signatures(b, KEY)
    c = b.contents()
    assert c.image_id == BUILT["image_id"] and not c.green
    readiness = attach.agreeing(b, c).facts["readiness"]
    assert readiness["exit"] == 10 and "gemm_bf16" in readiness["verdict"]


def test_the_recorded_run_edited_is_refused(tmp_path):
    """Its validation statement with one fact changed (re-encoded, so the file still reads): the signature fails."""
    env = json.loads((PROOF / "gpu" / "bundle" / "gpu.bundle").read_text())
    stmt = json.loads(base64.b64decode(env["envelopes"][1]["payload"]))
    stmt["predicate"]["green"] = not stmt["predicate"]["green"]
    env["envelopes"][1]["payload"] = base64.b64encode(json.dumps(stmt).encode()).decode()
    edited = tmp_path / "gpu.bundle"
    edited.write_text(json.dumps(env))
    with pytest.raises(BundleRefused, match=r"envelope 2 .* does not verify with"):
        attach.verify_signatures(bundle.read(edited), KEY)
