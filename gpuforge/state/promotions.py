"""The promotion record: one signed statement per phase of a promotion (or rollback) of one target to one
environment, kept in the registry as a cosign attestation of type
https://gpuforge.dev/attestations/promotion/v1 on the promoted digest (gpuforge.publish.history reads them
back). `intent` is signed before any tag moves (the planned tags and the digest each held); `done` after the
last copy. An intent with no done of the same id is an interrupted promotion.

Records are read from a registry, so they are untrusted input until their signature verifies and this
schema accepts them.
"""

from __future__ import annotations

from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

SCHEMA: Final = "gpuforge.promotion/1"  # Final: its type is the literal the model's field allows
DIGEST = r"^sha256:[0-9a-f]{64}$"


class RunInfo(BaseModel):
    """Who made a statement: the gpuforge run, its checkout's git revision, the host."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    id: str = Field(max_length=80)
    git_revision: str | None = Field(default=None, max_length=80)
    git_dirty: bool | None = None
    gpuforge_version: str = Field(max_length=40)
    host: str = Field(max_length=255)
    user: str = Field(default="", max_length=255)


class Evidence(BaseModel):
    """What the promotion relied on: the signed validation statements (layer digests of the .att manifest)."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    validation: str | None = None  # layer digest of the newest signed validation statement
    green: bool = False
    gpu: str | None = None  # layer digest of the newest signed GPU validation statement, if any
    gpu_model: str | None = None
    driver: str | None = None
    validated_at: str | None = None  # what the signed run says (never used to order; promote holds it to the TTL)
    gpu_validated_at: str | None = None  # the same, of the GPU statement
    gpu_signed_offline: bool = False  # that GPU statement was signed into a bundle and attached later (gpuforge attach)
    validator_set: str | None = None


class PromotionRecord(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)
    schema_: Literal["gpuforge.promotion/1"] = Field(default=SCHEMA, alias="schema")
    id: str = Field(pattern=r"^[0-9a-f]{32}$")
    phase: Literal["intent", "done"]
    kind: Literal["promote", "rollback"]
    target: str = Field(max_length=200)
    env: Literal["dev", "prod"]
    repository: str = Field(max_length=400)
    digest: str = Field(pattern=DIGEST)
    tags: list[str]  # planned: every tag of the environment this promotion points at `digest`
    prior: dict[str, str | None]  # the digest each planned tag held before (None: it did not exist)
    moved: list[str] = []  # done: the tags it moved (including those a resumed run moved)
    replaced: list[str] = []  # version tags moved off another digest (promote --replace)
    allow_no_gpu: bool = False  # prod without GPU evidence, on purpose (--allow-no-gpu)
    resumed: bool = False  # done written by a later run that completed an interrupted intent
    rollback_to_seq: int | None = None  # rollback: the seq of the promotion whose digest it restores
    version: str | None = Field(default=None, max_length=200)  # the build's version tag (None: a record of before them)
    evidence: Evidence = Evidence()
    seq: int = Field(ge=0)  # position in this target+environment's history
    prev: str | None = None  # "<id>:<phase>" of the record before it: a removed record shows as a gap
    at: str = Field(max_length=40)  # UTC time the record was written (display; order is seq)
    run: RunInfo

    def ref(self) -> str:
        return f"{self.id}:{self.phase}"

    def dump(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, mode="json")


def parse(data: dict[str, Any]) -> PromotionRecord | None:
    """A record, or None when the signed predicate is not one this gpuforge understands."""
    try:
        return PromotionRecord.model_validate(data)
    except ValidationError:
        return None
