"""The record of builds (and of what validate and push learnt about each image) that validate, push and
promote read: <state dir>/builds.json, typed by models.BuildRecord.

`Records(state_dir)` is that file in one state dir; the CLI makes it once from the state_dir setting and hands
it to each stage. Records are read and written typed: `build(id)` / `require_build(id)` / `update_build(id, ...)` /
`restore_build(id, rec)`, and `load_file()` for the whole file.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gpuforge.errors import StateError
from gpuforge.state import store
from gpuforge.state.models import BuildRecord, BuildsFile

NAME = "builds.json"
# what validate and push learnt about one image: dropped when a build records another image
IMAGE_FACTS = ("report", "report_digest", "gpu_report", "gpu_report_digest", "digest", "pushed_ref", "digest_zstd",
               "pushed_ref_zstd", "soci_index")
FIX = "delete it (or restore it from a backup) and run `gpuforge build` again"


def _migrate(raw: dict[str, Any]) -> dict[str, Any]:
    """Version 0 (before schema_version): the bare {target id: record} mapping."""
    return {"schema_version": 1, "builds": raw}


@dataclass(frozen=True)
class Records:
    """builds.json in `state_dir` (the state_dir setting: GPUFORGE_STATE_DIR, else .gpuforge)."""

    state_dir: Path

    def path(self) -> Path:
        return self.state_dir / NAME

    def load_file(self) -> BuildsFile:
        return store.load(self.state_dir, NAME, BuildsFile, migrate=_migrate, fix=FIX)

    def build(self, target_id: str) -> BuildRecord | None:
        return self.load_file().builds.get(target_id)

    def require_build(self, target_id: str) -> BuildRecord:
        rec = self.build(target_id)
        if rec is None:
            msg = f"{target_id} has not been built (no record in {self.path()}); run `gpuforge build {target_id}` first"
            raise StateError(msg)
        return rec

    def update_build(self, target_id: str, **fields: Any) -> BuildRecord:
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
                msg = f"{self.path()}: refusing to record {target_id}: {store.first_error(e)}"
                raise StateError(msg) from None
            out.append(doc.builds[target_id])

        store.update(self.state_dir, NAME, BuildsFile, change, migrate=_migrate, fix=FIX)
        return out[0]

    def restore_build(self, target_id: str, rec: BuildRecord | None) -> None:
        """Put a target's record back as it was (`None`: it had none), e.g. when its tags could not move."""
        def change(doc: BuildsFile) -> None:
            if rec is None:
                doc.builds.pop(target_id, None)
            else:
                doc.builds[target_id] = rec

        store.update(self.state_dir, NAME, BuildsFile, change, migrate=_migrate, fix=FIX)
