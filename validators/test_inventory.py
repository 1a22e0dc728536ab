"""inventory: the installed Python and Debian packages, saved with the report as the image's manifest."""

from __future__ import annotations

import json

import pytest

from vutil import sh


@pytest.fixture(scope="module")
def inventory(host, timeout, facts):
    pip = json.loads(sh(host, "python3 -m pip list --format json 2>/dev/null", timeout=timeout).stdout)
    deb = sh(host, "dpkg-query -W -f '${Package}\\t${Version}\\n'", timeout=timeout, check=False).stdout
    inv = {"python": {p["name"].lower(): p["version"] for p in pip},
           "debian": dict(line.split("\t", 1) for line in deb.splitlines() if "\t" in line)}
    facts["sbom"] = inv
    return inv


def test_inventory_lists_the_torch_stack(inventory, target):
    py = inventory["python"]
    for name in ("torch", "torchvision", "triton"):
        assert name in py, f"{name} missing from pip list"
    assert py["torch"] == target.torch.split("+")[0] or py["torch"] == target.torch


def test_inventory_lists_system_packages(inventory, image):
    for name in ("openssh-server", "tini", "gcc"):
        assert name in inventory["debian"], f"{name} missing from dpkg"
