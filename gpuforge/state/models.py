"""The shapes of the state files, checked on every read and every write (pydantic).

A file carries `schema_version`; this gpuforge reads SCHEMA_VERSION and the unversioned files of
earlier releases (version 0: builds.json as a bare {target id: record} mapping), and refuses newer ones.
Unknown fields are refused, so a typo or a hand edit is found where it happens, not three steps later.
"""

from __future__ import annotations

from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field

from gpuforge import grammar

SCHEMA_VERSION: Final = 1  # Final: its type is the literal the models' field allows

_STRICT = ConfigDict(extra="forbid", validate_assignment=True)


class BuildRecord(BaseModel):
    """A target's last successful build, and what validate and push learnt about that image since."""

    model_config = _STRICT

    image_id: str = Field(pattern=r"^sha256:[0-9a-f]{64}$")  # the engine's image id (config digest)
    tags: list[str] = []  # the engine's tags of the image (the target's tag; never the version tag)
    size: int = 0
    seconds: float = 0.0
    driver: str | None = None  # buildx | classic
    client: str | None = None
    log: str | None = None
    recipe: str | None = None
    extra_ca: str | None = None
    revision: str | None = None  # the checkout's git revision the image was built from
    built_at: str | None = None
    # the build identifier (UTC, gpuforge.plan.version.BuildId) and the version tag it renders: what push pushes and
    # promote names; kept when a rebuild makes the same image, new for another image
    build: str | None = Field(default=None, pattern=rf"^{grammar.BUILD_ID}$")
    version: str | None = Field(default=None, pattern=rf"^{grammar.TAG}$")
    # which engine built it: version, image store (overlay2 | containerd), whether the image is an index
    # (BuildKit's provenance attestation attached), and the build's argv (the zstd push re-runs it from the cache)
    engine: str | None = None
    image_store: str | None = None
    image_index: bool | None = None
    argv: list[str] | None = None
    # validate: the report files and the digest of what they held when written (`status` says whether each file
    # still holds that; promotion judges only the signed statements on the registry)
    report: str | None = None
    report_digest: str | None = None
    gpu_report: str | None = None
    gpu_report_digest: str | None = None
    # push: the registry manifest digest and the reference it was pushed as (the version tag)
    digest: str | None = None
    pushed_ref: str | None = None
    digest_zstd: str | None = None  # push --compression zstd|both: the <version>-zstd copy (same layers, zstd)
    pushed_ref_zstd: str | None = None
    soci_index: str | None = None  # push --compression soci: the SOCI index manifest whose subject is `digest`
    replaced: list[dict[str, Any]] | None = None  # push --replace: the version tag moved off another digest (tag, from, to, at)


class BuildsFile(BaseModel):
    """builds.json."""

    model_config = _STRICT

    schema_version: Literal[1] = SCHEMA_VERSION
    builds: dict[str, BuildRecord] = {}


# Promotion records live in the registry, signed (gpuforge/state/promotions.py), not in the state dir.
