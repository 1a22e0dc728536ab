"""The image's SBOM as CycloneDX 1.6 JSON (cyclonedx-python-lib + packageurl-python), from the inventory
the validators collect (validators/test_inventory.py: Python and Debian/Ubuntu packages), so scanners
and policy tools can read it. Written next to the report as sbom.cdx.json.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from cyclonedx.model.bom import Bom
from cyclonedx.model.component import Component, ComponentType
from cyclonedx.output.json import JsonV1Dot6
from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator
from packageurl import PackageURL

ARCH = "amd64"  # every gpuforge image is linux/amd64 (the torch CUDA wheels exist only there)


def _distro(os_name: str) -> tuple[str, str]:
    """matrix os (debian12, ubuntu24.04) -> purl namespace and distro qualifier (debian-12, ubuntu-24.04)."""
    for ns in ("debian", "ubuntu"):
        if os_name.startswith(ns):
            return ns, f"{ns}-{os_name[len(ns):]}"
    return "debian", os_name


def bom(*, target_id: str, image_id: str, os_name: str, inventory: dict[str, Any]) -> Bom:
    ns, distro = _distro(os_name)
    b = Bom(serial_number=uuid.uuid5(uuid.NAMESPACE_URL, f"gpuforge:{target_id}:{image_id}"))  # one serial per image
    root = b.metadata.component = Component(name=f"gpuforge/{target_id}", version=image_id,
                                            type=ComponentType.CONTAINER, bom_ref=image_id)
    for name, version in sorted(inventory.get("python", {}).items()):
        purl = PackageURL(type="pypi", name=name, version=version)
        b.components.add(Component(name=name, version=version, type=ComponentType.LIBRARY, purl=purl,
                                   bom_ref=purl.to_string()))
    for name, version in sorted(inventory.get("debian", {}).items()):
        purl = PackageURL(type="deb", namespace=ns, name=name, version=version,
                          qualifiers={"arch": ARCH, "distro": distro})
        b.components.add(Component(name=name, version=version, type=ComponentType.APPLICATION, purl=purl,
                                   bom_ref=purl.to_string()))
    b.register_dependency(root, list(b.components))  # the image holds every package it lists
    return b


def to_json(b: Bom) -> str:
    return JsonV1Dot6(b).output_as_string(indent=2) + "\n"


def problems(text: str) -> str | None:
    """Why `text` is not a valid CycloneDX 1.6 JSON document (None when it is)."""
    err = JsonStrictValidator(SchemaVersion.V1_6).validate_str(text)
    return str(err) if err else None


def write(path: Path, *, target_id: str, image_id: str, os_name: str, inventory: dict[str, Any]) -> Path:
    path.write_text(to_json(bom(target_id=target_id, image_id=image_id, os_name=os_name, inventory=inventory)))
    return path
