"""Functions stay short enough to read in one screen: at most MAX_LONG functions in gpuforge/ run over LIMIT lines
(def to last line, docstring included). A longer one is split by meaning into named helpers, not cut anywhere."""

from __future__ import annotations

import ast

from gpuforge import paths

PKG = paths.project_root() / "gpuforge"
LIMIT = 60
MAX_LONG = 3


def long_functions(tree: ast.Module, where: str = "") -> list[tuple[int, str]]:
    """(lines, where:name) of every function or method over LIMIT lines, nested ones included."""
    return [(n.end_lineno - n.lineno + 1, f"{where}:{n.lineno} {n.name}") for n in ast.walk(tree)
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.end_lineno - n.lineno + 1 > LIMIT]


def test_at_most_three_long_functions():
    found = sorted((hit for py in sorted(PKG.rglob("*.py"))
                    for hit in long_functions(ast.parse(py.read_text(), str(py)), str(py.relative_to(PKG.parent)))),
                   reverse=True)
    assert len(found) <= MAX_LONG, f"{len(found)} functions over {LIMIT} lines (at most {MAX_LONG}):\n" + "\n".join(
        f"  {n} lines: {name}" for n, name in found)


def test_the_counter_counts_a_long_method():
    body = "\n".join(f"        x{i} = {i}" for i in range(LIMIT))
    tree = ast.parse(f"class C:\n    def long(self):\n{body}\n\n    def short(self):\n        pass\n")
    assert [name for _, name in long_functions(tree, "m.py")] == ["m.py:2 long"]
