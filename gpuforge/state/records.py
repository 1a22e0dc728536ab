"""The machine-readable record of builds and pushes that validate, push and promote read.

.gpuforge/builds.json (GPUFORGE_STATE_DIR moves it): target id -> last successful build.
Writes are atomic (temp file + rename) so an interrupted run never leaves a torn file.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

from gpuforge.errors import StateError

_lock = threading.Lock()


def state_dir() -> Path:
    d = Path(os.environ.get("GPUFORGE_STATE_DIR", ".gpuforge"))
    d.mkdir(parents=True, exist_ok=True)
    return d


def _path() -> Path:
    return state_dir() / "builds.json"


def load() -> dict[str, dict]:
    p = _path()
    if not p.exists():
        return {}
    try:
        return json.loads(p.read_text())
    except json.JSONDecodeError as e:
        msg = f"{p}: build record is corrupt ({e.msg} at line {e.lineno}); delete it and rebuild"
        raise StateError(msg) from None


def update(target_id: str, **fields) -> dict:
    """Merge fields into a target's record and save atomically."""
    with _lock:
        data = load()
        rec = {**data.get(target_id, {}), **fields}
        data[target_id] = rec
        tmp = _path().with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
        tmp.replace(_path())
        return rec


def get(target_id: str) -> dict | None:
    return load().get(target_id)


def require(target_id: str) -> dict:
    rec = get(target_id)
    if not rec:
        msg = f"{target_id} has not been built (no record in {_path()}); run `gpuforge build {target_id}` first"
        raise StateError(msg)
    return rec
