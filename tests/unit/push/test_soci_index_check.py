"""soci.check: what gpuforge accepts as the SOCI index of a pushed image, read back from the registry (here a dict of
manifests by reference; the real registry, containerd and soci CLI run in tests/integration/push/test_soci_push.py).
Each way an index can be wrong is refused with its reason."""

from __future__ import annotations

import hashlib
import json

import pytest

from gpuforge.errors import RegistryError
from gpuforge.plan.target import ImageRef
from gpuforge.push import soci
from gpuforge.registry.client import Manifest

REF = ImageRef("127.0.0.1:5000", "gpuforge/pytorch", "t1")
LAYERS = ["sha256:" + c * 64 for c in "ab"]


def _m(doc: dict) -> Manifest:
    body = json.dumps(doc).encode()
    return Manifest("sha256:" + hashlib.sha256(body).hexdigest(), body)


IMAGE = _m({"mediaType": "application/vnd.docker.distribution.manifest.v2+json",
            "layers": [{"digest": d, "size": 20 << 20} for d in LAYERS]})


def _index(subject: str = IMAGE.digest, config: str = soci.INDEX_TYPE, layers: list[str] = LAYERS[:1]) -> Manifest:
    return _m({"config": {"mediaType": config}, "subject": {"digest": subject},
               "layers": [{"mediaType": "application/octet-stream", "annotations": {soci.LAYER_DIGEST: d}} for d in layers]})


class FakeRegistry:
    """Manifests by reference; the index list in the referrers tag (distribution 2.8), or with api=True behind the
    OCI 1.1 referrers API (no tag: what oras leaves on such a registry)."""

    def __init__(self, *indexes: Manifest, api: bool = False):
        self.held = {str(REF.pinned(i.digest)): i for i in indexes}
        self.listed = [{"digest": i.digest, "artifactType": soci.INDEX_TYPE} for i in indexes]
        self.api = api
        if indexes and not api:
            self.held[str(REF.bare().with_tag(soci.referrers_tag(IMAGE.digest)))] = _m({"manifests": self.listed})

    def manifest(self, ref: ImageRef) -> Manifest | None:
        return self.held.get(str(ref))

    def referrers(self, ref: ImageRef, digest: str, artifact_type: str) -> list[dict] | None:
        return [d for d in self.listed if d["artifactType"] == artifact_type] if self.api and digest == IMAGE.digest \
            else None


def test_an_index_of_this_image_is_accepted_and_the_newest_wins():
    old, new = _index(layers=LAYERS[1:]), _index()
    got = soci.check(FakeRegistry(old, new), REF, IMAGE)
    assert (got.digest, got.subject, got.ztocs) == (new.digest, IMAGE.digest, 1)


@pytest.mark.parametrize(("index", "why"), [
    (_index(subject="sha256:" + "c" * 64), "refers to another image"),
    (_index(config="application/vnd.oci.image.config.v1+json"), "is not a SOCI index v1"),
    (_index(layers=["sha256:" + "d" * 64]), "has zTOCs of layers this image lacks"),
    (_index(layers=[]), "has zTOCs of layers this image lacks"),
])
def test_a_wrong_index_is_refused_with_its_reason(index, why):
    with pytest.raises(RegistryError, match=why):
        soci.check(FakeRegistry(index), REF, IMAGE)


def test_an_index_behind_the_referrers_api_is_found_without_the_tag():
    new = _index()
    assert soci.check(FakeRegistry(new, api=True), REF, IMAGE).digest == new.digest


def test_no_index_at_all_is_refused():
    with pytest.raises(RegistryError, match="holds no SOCI index referring to it"):
        soci.check(FakeRegistry(), REF, IMAGE)


def test_a_listed_index_the_registry_lacks_is_refused():
    reg = FakeRegistry(_index())
    del reg.held[str(REF.pinned(_index().digest))]
    with pytest.raises(RegistryError, match="is missing"):
        soci.check(reg, REF, IMAGE)


def test_referrers_tag_is_the_oci_fallback_form():
    assert soci.referrers_tag("sha256:" + "a" * 64) == "sha256-" + "a" * 64
