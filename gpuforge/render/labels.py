"""Image label names: one rule shared by rendering (which writes them) and validators (which read them)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpuforge.image.expected import Expected

NS = "io.gpuforge"
# Expected-version keys that are not labels (the target id has its own label, `io.gpuforge.target`).
NOT_LABELS = ("id",)


def label_key(key: str) -> str:
    """>>> label_key("size_budget_gb")
    'io.gpuforge.size-budget-gb'
    """
    return f"{NS}.{key.replace('_', '-')}"


def label_value(value: object) -> str:
    return ",".join(value) if isinstance(value, list | tuple) else str(value)


def expected_labels(expected: Expected) -> dict[str, str]:
    """The labels of a target's expected values (a gpuforge.image.expected.Expected)."""
    given = expected.as_dict()
    out = {label_key(k): label_value(v) for k, v in given.items() if k not in NOT_LABELS}
    out[f"{NS}.target"] = given["id"]
    return out


OCI = "org.opencontainers.image"
# What the image's software is distributed under (SPDX): PyTorch and its Python stack are BSD-3-Clause
# or compatible; NVIDIA's CUDA wheels are under NVIDIA's own licence. The Debian packages keep theirs
# in /usr/share/doc/*/copyright, which the image keeps.
LICENSES = "BSD-3-Clause AND LicenseRef-NVIDIA-Software-License-Agreement"
# Set at build time with --label, not written in the Dockerfile: they change per commit (a LABEL line
# would change the committed images/dist files), and labels given to the build touch no cached layer.
BUILD_LABELS = (f"{OCI}.revision", f"{OCI}.created", f"{OCI}.source", f"{NS}.recipe")


def build_labels(*, revision: str, created: str, source: str | None, recipe: str) -> dict[str, str]:
    """The labels only a build knows; the source only when a repository URL is known (never a path or `unknown`)."""
    out = dict(zip(BUILD_LABELS, (revision, created, source, recipe), strict=True))
    return {k: v for k, v in out.items() if v is not None}
