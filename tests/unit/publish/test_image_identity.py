"""Which registry manifest is "the built image" on each engine: a graphdriver engine (20.10's overlay2)
names an image by its config digest; the containerd store (26.1) by its manifest or index digest, which is what
it pushes. Every stage that compares a record's image id with the registry goes through `Manifest.holds`
(the signing run, the build tag check of push, resume and rollback); each once compared config digests only,
so `validate --attest` refused every image built on the containerd store."""

from __future__ import annotations

import hashlib
import json
from types import SimpleNamespace

import pytest

from gpuforge.errors import PromotionRefused, RegistryError
from gpuforge.evidence import signed_run
from gpuforge.plan.target import ImageRef
from gpuforge.publish import promote
from gpuforge.registry import attest
from gpuforge.registry.client import Manifest
from gpuforge.state.models import BuildRecord

CONFIG = "sha256:" + "c0" * 32


def _manifest(body: dict) -> Manifest:
    raw = json.dumps(body).encode()
    return Manifest(digest="sha256:" + hashlib.sha256(raw).hexdigest(), body=raw)


IMAGE = _manifest({"schemaVersion": 2, "config": {"digest": CONFIG}, "layers": []})  # what both engines push
INDEX = _manifest({"schemaVersion": 2, "manifests": [{"digest": IMAGE.digest, "platform": {"os": "linux"}},
                                                     {"digest": "sha256:" + "a7" * 32, "platform": {"os": "unknown"}}]})


@pytest.mark.parametrize(("pushed", "image_id"), [(IMAGE, CONFIG),          # graphdriver: the config digest
                                                  (IMAGE, IMAGE.digest),    # containerd store, no provenance
                                                  (INDEX, INDEX.digest)])   # containerd store, provenance
def test_the_signing_run_accepts_the_pushed_image_on_either_engine(monkeypatch, pushed, image_id):
    recs = _registry_holding(monkeypatch, pushed, {"image_id": image_id, "digest": pushed.digest})
    assert signed_run.pushed_ref(_target(), recs, attest.Signer()) == f"127.0.0.1:5000/r@{pushed.digest}"


@pytest.mark.parametrize(("pushed", "image_id"), [(IMAGE, "sha256:" + "0" * 64), (INDEX, IMAGE.digest),
                                                  (INDEX, CONFIG)])
def test_the_signing_run_refuses_a_digest_that_is_another_image(monkeypatch, pushed, image_id):
    recs = _registry_holding(monkeypatch, pushed, {"image_id": image_id, "digest": pushed.digest})
    with pytest.raises(RegistryError, match="another image"):
        signed_run.pushed_ref(_target(), recs, attest.Signer())


def _target() -> SimpleNamespace:
    return SimpleNamespace(id="t", ref=ImageRef.parse("127.0.0.1:5000/r:tag"))


def _registry_holding(monkeypatch, m: Manifest, rec: dict) -> SimpleNamespace:
    """A registry holding `m`; returns the build records (holding `rec`) to pass to the signing run."""
    monkeypatch.setattr(signed_run.Registry, "manifest", lambda _self, ref: m if ref.digest == m.digest else None)
    return SimpleNamespace(require_build=lambda _tid: BuildRecord(**rec))


@pytest.mark.parametrize(("at", "evidence_id", "ok"), [(IMAGE, CONFIG, True), (IMAGE, IMAGE.digest, True),
                                                        (INDEX, INDEX.digest, True), (INDEX, IMAGE.digest, False),
                                                        (IMAGE, "sha256:" + "0" * 64, False), (IMAGE, None, False)])
def test_resume_and_rollback_judge_evidence_by_the_manifest(monkeypatch, at, evidence_id, ok):
    """With no build record, the evidence must name an image the manifest at the digest holds."""
    pred = {"exit_status": 0, "gpu": False, "checks": [], "run": {"signed_in_run": True}, "evidence": {"image_id": evidence_id}}
    monkeypatch.setattr(attest, "verified_statements", lambda *_a: [attest.Signed(predicate=pred, layer="l", index=0)])
    monkeypatch.setattr(promote.evidence, "problems", lambda *_a, **_k: [])  # a green report (tested elsewhere)
    judge = lambda: promote.judge(f"127.0.0.1:5000/r@{at.digest}", at, None, require_gpu=False,  # noqa: E731
                                  check_validator_set=False, who="t")
    if ok:
        assert judge().green
    else:
        with pytest.raises(PromotionRefused, match="is for image"):
            judge()
