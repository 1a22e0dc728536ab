"""The CycloneDX SBOM that `gpuforge validate` writes next to the report, for the real default image."""

from __future__ import annotations

import json

import pytest

from gpuforge.validate import sbom

pytestmark = pytest.mark.docker


def test_default_image_sbom_is_valid_cyclonedx_and_lists_the_torch_stack(validated):
    t, rec = validated["target"], validated["record"]
    f = validated["reports"] / t.id / "sbom.cdx.json"
    text = f.read_text()
    assert sbom.problems(text) is None
    doc = json.loads(text)
    assert doc["metadata"]["component"]["version"] == rec["image_id"]
    purls = {c["purl"] for c in doc["components"]}
    v = t.variant
    for want in (f"pkg:pypi/torch@{v.torch}", f"pkg:pypi/triton@{v.triton}", f"pkg:pypi/torchvision@{v.torchvision}"):
        assert want in purls
    cudnn = [p for p in purls if p.startswith("pkg:pypi/nvidia-cudnn-cu12@")]
    assert cudnn == [f"pkg:pypi/nvidia-cudnn-cu12@{v.nvidia_pins['nvidia-cudnn-cu12']}"]
    assert any(p.startswith("pkg:deb/debian/openssh-server@") and "distro=debian-12" in p for p in purls)
    assert len(purls) > 250  # ~120 Python + ~180 Debian packages
