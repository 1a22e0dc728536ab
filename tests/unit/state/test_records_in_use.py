"""Records are typed in use: gpuforge reads BuildRecord fields by name (never a string-keyed dict view of the
record), and every field it writes is read by something (no write-only field)."""

from __future__ import annotations

import ast

from gpuforge import paths
from gpuforge.state.models import BuildRecord

PKG = paths.project_root() / "gpuforge"
DICT_VIEWS = {"get", "require", "update", "load"}  # Records' dict views, for readers outside the package
OWNERS = {PKG / "state" / "models.py", PKG / "state" / "records.py"}


def _trees():
    return {py: ast.parse(py.read_text(), str(py)) for py in sorted(PKG.rglob("*.py")) if py not in OWNERS}


def _dict_view_calls(tree: ast.Module) -> list[int]:
    """Lines calling records.get/require/update/load (a Records held as `records`, or self.records / opts.records)."""
    out = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in DICT_VIEWS:
            holder = n.func.value
            name = holder.id if isinstance(holder, ast.Name) else holder.attr if isinstance(holder, ast.Attribute) else ""
            if name == "records":
                out.append(n.lineno)
    return sorted(out)


def test_gpuforge_reads_records_typed():
    bad = [f"{py.relative_to(PKG.parent)}:{line}" for py, tree in _trees().items() for line in _dict_view_calls(tree)]
    assert not bad, "string-keyed record reads (use build/require_build/update_build): " + ", ".join(bad)


def test_the_finder_finds_a_dict_read():
    assert _dict_view_calls(ast.parse('rec = records.require(t.id)["image_id"]\nself.opts.records.get("x")')) == [1, 2]


def test_every_record_field_is_read():
    read = {n.attr for tree in _trees().values() for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load)}
    unread = sorted(set(BuildRecord.model_fields) - read)
    assert not unread, f"build record fields written and never read: {', '.join(unread)} (use them or drop them)"
