"""Typed JSON files in the state dir: read with a schema check, changed by read-modify-write under the
state dir's exclusive lock, written atomically (gpuforge.state.files).

A file of another shape is one StateError line (exit 8) naming the file, what is wrong, and what to do,
never a traceback.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from gpuforge.errors import StateError
from gpuforge.state import files
from gpuforge.state.models import SCHEMA_VERSION

M = TypeVar("M", bound=BaseModel)


def _folder(d: Path, *, create: bool) -> files.Folder:
    """The state dir, given by the caller (the CLI resolves state_dir once); the folder itself must not be a symlink."""
    return files.Folder(d.parent, d.name, create=create)


def first_error(e: ValidationError) -> str:
    err = e.errors()[0]
    loc = ".".join(str(x) for x in err["loc"]) or "top level"
    more = f" (+{e.error_count() - 1} more)" if e.error_count() > 1 else ""
    return f"{loc}: {err['msg']}{more}"


Migrate = Callable[[dict[str, Any]], dict[str, Any]]  # an old (version 0) document to the current shape


def parse(path: Path, text: str, model: type[M], *, migrate: Migrate | None, fix: str) -> M:
    """The file's content as `model`, or one StateError line naming the file, the problem and `fix`."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        what = "empty" if not text.strip() else f"not valid JSON ({e.msg} at line {e.lineno} column {e.colno}; truncated?)"
        msg = f"{path}: {what}; {fix}"
        raise StateError(msg) from None
    if not isinstance(raw, dict):
        msg = f"{path}: top level is a JSON {type(raw).__name__ if not isinstance(raw, list) else 'list'}, not an object; {fix}"
        raise StateError(msg)
    version = raw.get("schema_version", 0)
    if version == 0 and migrate is not None:
        raw = migrate(raw)
    elif not isinstance(version, int) or isinstance(version, bool) or version > SCHEMA_VERSION or version < 0:
        msg = (f"{path}: schema_version {version!r} is not one this gpuforge reads (0..{SCHEMA_VERSION}); "
               f"use the gpuforge that wrote it, or {fix}")
        raise StateError(msg)
    try:
        return model.model_validate(raw)
    except ValidationError as e:
        msg = f"{path}: not a {model.__doc__.strip().rstrip('.') if model.__doc__ else model.__name__} file: {first_error(e)}; {fix}"
        raise StateError(msg) from None


def load(state_dir: Path, name: str, model: type[M], *, migrate: Migrate | None = None, fix: str) -> M:
    """The file under the state dir's shared lock (an empty `model` when there is no file yet)."""
    try:
        d = _folder(state_dir, create=False)
    except StateError as e:
        if e.errno == 2:  # ENOENT: no state dir yet, nothing recorded
            return model()
        raise
    with d, d.locked(shared=True):
        data = d.read_bytes(name)
    return _decode(d.path / name, data, model, migrate=migrate, fix=fix)


def _decode(path: Path, data: bytes | None, model: type[M], *, migrate: Migrate | None, fix: str) -> M:
    if data is None:
        return model()
    try:
        text = data.decode()
    except UnicodeDecodeError:
        msg = f"{path}: not UTF-8 text (random bytes?); {fix}"
        raise StateError(msg) from None
    return parse(path, text, model, migrate=migrate, fix=fix)


def update(state_dir: Path, name: str, model: type[M], change: Callable[[M], None], *, migrate: Migrate | None = None, fix: str) -> M:
    """Read, change (in place) and write back the file while holding the exclusive lock: two processes
    updating it at once both keep their fields."""
    with _folder(state_dir, create=True) as d, d.locked():
        doc = _decode(d.path / name, d.read_bytes(name), model, migrate=migrate, fix=fix)
        change(doc)
        try:
            doc = model.model_validate(doc.model_dump())  # the change obeys the schema too
        except ValidationError as e:
            msg = f"{d.path / name}: refusing to write a record of the wrong shape: {first_error(e)}"
            raise StateError(msg) from None
        d.write_text(name, doc.model_dump_json(indent=2, exclude_none=True) + "\n")
        return doc
