"""The CycloneDX SBOM (gpuforge/validate/sbom.py) from a validator inventory: schema-valid, with purls per ecosystem."""

from __future__ import annotations

import json

from gpuforge.validate import sbom

INVENTORY = {"python": {"torch": "2.7.1", "pyyaml": "6.0.3", "nvidia-cudnn-cu12": "9.5.1.17"},
             "debian": {"openssh-server": "1:9.2p1-2+deb12u3", "tini": "0.19.0-1"}}


def _doc(os_name="debian12"):
    text = sbom.to_json(sbom.bom(target_id="pt271-cu126-py311-debian12-runtime-wheels", image_id="sha256:" + "a" * 64,
                                 os_name=os_name, inventory=INVENTORY))
    return text, json.loads(text)


def test_sbom_is_valid_cyclonedx_with_a_purl_per_package():
    text, doc = _doc()
    assert sbom.problems(text) is None
    assert doc["bomFormat"] == "CycloneDX" and doc["specVersion"] == "1.6"
    purls = {c["purl"] for c in doc["components"]}
    assert "pkg:pypi/torch@2.7.1" in purls and "pkg:pypi/nvidia-cudnn-cu12@9.5.1.17" in purls
    assert "pkg:deb/debian/openssh-server@1:9.2p1-2%2Bdeb12u3?arch=amd64&distro=debian-12" in purls
    assert len(doc["components"]) == 5
    assert doc["metadata"]["component"]["type"] == "container"
    [root] = [d for d in doc["dependencies"] if d["ref"] == "sha256:" + "a" * 64]
    assert len(root["dependsOn"]) == 5


def test_ubuntu_packages_get_the_ubuntu_namespace():
    _, doc = _doc("ubuntu24.04")
    assert "pkg:deb/ubuntu/tini@0.19.0-1?arch=amd64&distro=ubuntu-24.04" in {c["purl"] for c in doc["components"]}


def test_serial_is_stable_per_image():
    assert _doc()[1]["serialNumber"] == _doc()[1]["serialNumber"]


def test_schema_check_can_fail():
    text, doc = _doc()
    doc["components"][0]["type"] = "not-a-type"
    assert "not-a-type" in sbom.problems(json.dumps(doc))
