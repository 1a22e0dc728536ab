"""What an image installs besides the CUDA wheels compat pins: image.yaml's tools and the target's pip_packages.

Its own module because both the Dockerfile (dockerfile.py) and the Python lock (locks.py) need it: owned by
either, the two imported each other.
"""

from __future__ import annotations

import functools
from importlib import resources
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpuforge.plan.target import Target

import yaml


@functools.cache
def image_spec() -> dict[str, Any]:
    """gpuforge/render/data/image.yaml: the apt and pip tools every image gets, and uv's version."""
    spec: dict[str, Any] = yaml.safe_load(resources.files("gpuforge.render").joinpath("data/image.yaml").read_text())
    return spec


def pip_tools(t: Target) -> list[str]:
    """What the image pip-installs besides torch (exact pins, from image.yaml and the target's settings)."""
    return [*image_spec()["pip"], *t.settings.pip_packages]


def metrics_tools() -> list[str]:
    """What the metrics mode imports (image.yaml `metrics:`), declared in its own step after the torch layer."""
    return list(image_spec().get("metrics", []))
