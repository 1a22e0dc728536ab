"""Records are typed in use: Records hands out BuildRecord / BuildsFile (never a dict of a record), and every field
gpuforge writes is read by something (no write-only field)."""

from __future__ import annotations

import ast
import inspect

from gpuforge import paths
from gpuforge.state.models import BuildRecord
from gpuforge.state.records import Records

PKG = paths.project_root() / "gpuforge"
OWNERS = {PKG / "state" / "models.py", PKG / "state" / "records.py"}


def _trees() -> dict:
    return {py: ast.parse(py.read_text(), str(py)) for py in sorted(PKG.rglob("*.py")) if py not in OWNERS}


def test_records_hand_out_typed_records_only():
    public = {n: f for n, f in vars(Records).items() if inspect.isfunction(f) and not n.startswith("_")}
    assert {"build", "require_build", "update_build", "restore_build", "load_file"} <= set(public)
    returns = {n: str(f.__annotations__.get("return")) for n, f in public.items()}
    assert not [n for n, r in returns.items() if "dict" in r], returns


def test_every_record_field_is_read():
    read = {n.attr for tree in _trees().values() for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load)}
    unread = sorted(set(BuildRecord.model_fields) - read)
    assert not unread, f"build record fields written and never read: {', '.join(unread)} (use them or drop them)"
