"""The record of builds (and of what validate and push learnt about each image) that validate, push and
promote read: $GPUFORGE_STATE_DIR/builds.json (default .gpuforge/), typed by models.BuildRecord.

`build(id)` / `require_build(id)` / `update_build(id, ...)` give the typed record. `get`, `require` and
`update` are the same records as plain dicts (None fields left out) for callers that index them.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from gpuforge.errors import StateError
from gpuforge.state import store
from gpuforge.state.models import BuildRecord, BuildsFile

NAME = "builds.json"
# what validate and push learnt about one image: dropped when a build records another image
IMAGE_FACTS = ("report", "report_digest", "gpu_report", "gpu_report_digest", "digest", "pushed_ref", "digest_zstd",
               "pushed_ref_zstd")
FIX = "delete it (or restore it from a backup) and run `gpuforge build` again"


def state_dir() -> Path:
    return store.state_dir()


def path() -> Path:
    return state_dir() / NAME


def _migrate(raw: dict) -> dict:
    """Version 0 (before schema_version): the bare {target id: record} mapping."""
    return {"schema_version": 1, "builds": raw}


def load_file() -> BuildsFile:
    return store.load(NAME, BuildsFile, migrate=_migrate, fix=FIX)


def build(target_id: str) -> BuildRecord | None:
    return load_file().builds.get(target_id)


def require_build(target_id: str) -> BuildRecord:
    rec = build(target_id)
    if rec is None:
        msg = f"{target_id} has not been built (no record in {path()}); run `gpuforge build {target_id}` first"
        raise StateError(msg)
    return rec


def update_build(target_id: str, **fields) -> BuildRecord:
    """Merge fields into a target's record under the exclusive lock (a new record needs image_id)."""
    unknown = sorted(set(fields) - set(BuildRecord.model_fields))
    if unknown:  # a programming error: the record's shape is models.BuildRecord, one home
        msg = f"unknown build record field(s) {', '.join(unknown)}; add them to gpuforge/state/models.py"
        raise TypeError(msg)
    out: list[BuildRecord] = []

    def change(doc: BuildsFile) -> None:
        old = doc.builds.get(target_id)
        merged = {**(old.model_dump() if old else {}), **fields}
        try:
            doc.builds[target_id] = BuildRecord.model_validate(merged)
        except ValidationError as e:
            msg = f"{path()}: refusing to record {target_id}: {store.first_error(e)}"
            raise StateError(msg) from None
        out.append(doc.builds[target_id])

    store.update(NAME, BuildsFile, change, migrate=_migrate, fix=FIX)
    return out[0]


def restore_build(target_id: str, rec: BuildRecord | None) -> None:
    """Put a target's record back as it was (`None`: it had none), e.g. when its tags could not move."""
    def change(doc: BuildsFile) -> None:
        if rec is None:
            doc.builds.pop(target_id, None)
        else:
            doc.builds[target_id] = rec

    store.update(NAME, BuildsFile, change, migrate=_migrate, fix=FIX)


# --- the same records as dicts ------------------------------------------------------------------------

def _dict(rec: BuildRecord | None) -> dict | None:
    return None if rec is None else rec.model_dump(exclude_none=True)


def load() -> dict[str, dict]:
    return {k: v.model_dump(exclude_none=True) for k, v in load_file().builds.items()}


def get(target_id: str) -> dict | None:
    return _dict(build(target_id))


def require(target_id: str) -> dict:
    return require_build(target_id).model_dump(exclude_none=True)


def update(target_id: str, **fields) -> dict:
    return update_build(target_id, **fields).model_dump(exclude_none=True)
