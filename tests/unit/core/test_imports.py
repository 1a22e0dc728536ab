"""Imports follow the pipeline: no cycle, no import that runs back up a stage, and `GPUFORGE_*` read from the
environment only in gpuforge/options.py (and gpuforge/image/, for the variables an image reads), never at import.

Every module under gpuforge/ is parsed (imports inside functions count: a lazy import is still an edge).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpuforge import paths

PKG = paths.project_root() / "gpuforge"

# Which stage (folder, or core module) may import which. Stage order: plan < render < builder and validate (side by side:
# the validating run reads the image, never the build's code) < push (bytes to a registry), evidence (what a run signs
# and how it is read back) and cve, side by side < publish (the decisions) and fleet (reports from signed evidence);
# engine is used by builder, validate, push, evidence and fleet; registry (images and signed statements on a registry)
# sits under cve, push, evidence, publish and fleet; state and image are the floor. Core: cli may import anything (it
# is the only one); errors and grammar import nothing of gpuforge; options checks values with the grammar (the value
# grammar and the GPU request choices live on the floor, so no stage sits under the options: no exception);
# provenance (git revision, created time, source URL, redaction) is read by the build, the validating run and the
# pushers alike, so it sits on the floor and none of them reaches into another's room for it. push may import validate
# for one helper only: pytest_run.die_with_parent, the one home of "a child never outlives gpuforge".
FLOOR = {"__init__", "errors", "grammar", "options", "paths", "provenance"}  # __init__: the version
ALLOWED: dict[str, set[str]] = {
    "__main__": {"cli"},
    "__init__": set(),
    "cli": {"*"},
    "errors": set(),
    "grammar": set(),
    "options": {"errors", "grammar"},
    "paths": {"errors", "options"},
    "provenance": {"errors", "paths"},
    "image": set(),
    "state": FLOOR | {"image"},
    "plan": FLOOR | {"image"},
    "render": FLOOR | {"image", "plan", "state"},
    "engine": FLOOR | {"image", "plan", "state"},
    "builder": FLOOR | {"image", "plan", "state", "render", "engine"},
    "validate": FLOOR | {"image", "plan", "state", "render", "engine"},
    "registry": FLOOR | {"image", "plan", "state"},
    "cve": FLOOR | {"image", "plan", "state", "registry"},
    "push": FLOOR | {"image", "plan", "state", "render", "engine", "builder", "validate", "registry"},
    "evidence": FLOOR | {"image", "plan", "state", "engine", "validate", "registry"},
    "publish": FLOOR | {"image", "plan", "state", "render", "engine", "validate", "registry", "cve", "push", "evidence"},
    "fleet": FLOOR | {"image", "plan", "state", "render", "engine", "builder", "validate", "registry", "cve", "push", "evidence",
                      "publish"},
}
MODULE_EXCEPTIONS: set[tuple[str, str]] = set()  # none: every edge follows ALLOWED
ENV_READERS = ("gpuforge.options", "gpuforge.image")


def _name(py: Path) -> str:
    parts = py.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, ast.Module]:
    return {_name(py): ast.parse(py.read_text(), str(py)) for py in sorted(PKG.rglob("*.py"))}


MODULES = _modules()


def _target(module: str) -> str:
    """The module an import names (`from gpuforge import options` names gpuforge.options)."""
    while module not in MODULES and "." in module:
        module = module.rsplit(".", 1)[0]
    return module


def _edges(name: str, tree: ast.Module) -> set[str]:
    out = set()
    pkg = name if (PKG.parent / Path(*name.split("."))).is_dir() else name.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(_target(a.name) for a in node.names if a.name.split(".")[0] == "gpuforge")
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            if base.split(".")[0] != "gpuforge":
                continue
            for a in node.names:
                full = f"{base}.{a.name}"
                out.add(full if full in MODULES else _target(base))
    out.discard(name)
    return out


GRAPH = {name: _edges(name, tree) for name, tree in MODULES.items()}


def stage(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_the_graph_is_read():
    assert len(MODULES) > 30
    assert "gpuforge.options" in GRAPH["gpuforge.builder.runner"]
    assert "gpuforge.grammar" in GRAPH["gpuforge.options"]


def test_every_stage_is_in_the_table():
    assert {stage(m) for m in MODULES} <= set(ALLOWED), sorted({stage(m) for m in MODULES} - set(ALLOWED))


def test_no_upward_import():
    bad = []
    for a, targets in GRAPH.items():
        for b in targets:
            sa, sb = stage(a), stage(b)
            if sa == sb or "*" in ALLOWED[sa] or sb in ALLOWED[sa] or (a, b) in MODULE_EXCEPTIONS:
                continue
            bad.append(f"{a} imports {b} ({sa} may import {', '.join(sorted(ALLOWED[sa])) or 'nothing outside itself'})")
    assert not bad, "\n".join(bad)


def test_nothing_imports_the_cli():
    assert [a for a, t in GRAPH.items() if "gpuforge.cli" in t] == ["gpuforge.__main__"]


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle():
    assert _cycles(GRAPH) == []


def test_the_cycle_finder_finds_one():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _env_reads(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, variable) of every GPUFORGE_* read from an environment mapping or os.getenv: by its literal name, or
    through a module-level name bound to it (`FD_ENV = "GPUFORGE_..."; os.environ.pop(FD_ENV)`)."""
    names = {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
             for t in n.targets if isinstance(t, ast.Name) and isinstance(n.value.value, str)}

    def gpuforge_const(n) -> str | None:
        value = names.get(n.id) if isinstance(n, ast.Name) else n.value if isinstance(n, ast.Constant) else None
        return value if isinstance(value, str) and value.startswith("GPUFORGE_") else None

    def environ(n) -> bool:
        text = ast.unparse(n)
        return "environ" in text or text in ("env", "os")

    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
            var = gpuforge_const(node.args[0])
            if var and (node.func.attr == "getenv" or (node.func.attr in ("get", "pop", "setdefault")
                                                       and environ(node.func.value))):
                out.append((node.lineno, var))
        elif isinstance(node, ast.Subscript) and environ(node.value) and (var := gpuforge_const(node.slice)):
            out.append((node.lineno, var))
        elif isinstance(node, ast.Compare) and (var := gpuforge_const(node.left)) and any(environ(c) for c in node.comparators):
            out.append((node.lineno, var))
    return out


def test_only_the_options_module_reads_gpuforge_variables():
    bad = [f"{m}:{line}: reads {var}" for m, tree in MODULES.items()
           if not m.startswith(ENV_READERS) for line, var in _env_reads(tree)]
    assert not bad, "\n".join(bad) + "\n(declare the setting in gpuforge/options.py's TABLE; the CLI resolves it and passes the value down)"


@pytest.mark.parametrize("code", [
    'os.environ.get("GPUFORGE_X")', 'os.environ["GPUFORGE_X"]', 'os.getenv("GPUFORGE_X", "1")',
    '"GPUFORGE_X" in os.environ', 'environ.get("GPUFORGE_X")', 'os.environ.pop("GPUFORGE_X", "")',
    'V = "GPUFORGE_X"\nos.environ.pop(V, "")',
])
def test_the_env_read_finder_finds_each_form(code):
    assert [var for _, var in _env_reads(ast.parse(code))] == ["GPUFORGE_X"]


def test_no_gpuforge_variable_is_read_at_import():
    """Import every module with an environment that records each GPUFORGE_* lookup: none may happen."""
    probe = """
import importlib, json, os, sys
seen = []
class Recording(dict):
    def _note(self, k):
        if isinstance(k, str) and k.startswith("GPUFORGE_"):
            seen.append(k)
    def __getitem__(self, k):
        self._note(k); return dict.__getitem__(self, k)
    def get(self, k, d=None):
        self._note(k); return dict.get(self, k, d)
    def __contains__(self, k):
        self._note(k); return dict.__contains__(self, k)
    def pop(self, k, *d):
        self._note(k); return dict.pop(self, k, *d)
    def setdefault(self, k, d=None):
        self._note(k); return dict.setdefault(self, k, d)
os.environ = Recording(os.environ)
for name in json.loads(sys.argv[1]):
    importlib.import_module(name)
print(json.dumps(seen))
"""
    names = sorted(m for m in MODULES if not m.endswith("__main__"))
    r = subprocess.run([sys.executable, "-c", probe, json.dumps(names)], capture_output=True, text=True, timeout=120,
                       cwd=PKG.parent, env={"GPUFORGE_DRIVER": "auto", "GPUFORGE_PROGRESS_FD": "9", "PATH": "/usr/bin:/bin", "HOME": str(Path.home())},
                       check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout.splitlines()[-1]) == []


def rules_table() -> str:
    """ALLOWED as docs/architecture.md shows it (the page is checked against this, like docs/options.md)."""
    rows = ["| module or folder | may import |", "|---|---|"]
    for name, allowed in ALLOWED.items():
        shown = "everything" if "*" in allowed else ", ".join(f"`{a}`" for a in sorted(allowed)) or "nothing of gpuforge"
        rows.append(f"| `{name}` | {shown} |")
    return "\n".join(rows) + "\n"


def test_the_architecture_page_shows_the_import_rules():
    page = (paths.project_root() / "docs" / "architecture.md").read_text()
    assert rules_table() in page, ("docs/architecture.md's import rules are stale: paste the output of "
                                   "`python -c 'import sys; sys.path[:0] = [\"tests/unit/core\", \".\"]; "
                                   "import test_imports; print(test_imports.rules_table())'`")


# Resolve once, pass down: the CLI resolves the options of its command once and hands each stage its typed settings
# (gpuforge.options.STAGES) or the small objects made from them (Records, RegistryAuth, Signer, Verifier). There is no
# global lookup of the options: nothing in the package, in what runs beside it (the validator plugin, the in-image
# programs, the tools) or in the tests calls one of these names on gpuforge.options.
LOOKUPS = {"setting", "current", "for_args", "activate", "use_matrix"}
LOOKUP_OWNERS: set[Path] = set()
LOOKUP_ROOTS = ("gpuforge", "validators", "images/programs", "tools", "tests")


def _lookups(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, name) of each call of an options lookup: `options.setting(...)`, or `setting(...)` imported by name."""
    imported = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module == "gpuforge.options"
                for a in n.names if a.name in LOOKUPS}
    out = []
    for n in ast.walk(tree):
        if not isinstance(n, ast.Call):
            continue
        f = n.func
        if isinstance(f, ast.Attribute) and f.attr in LOOKUPS and isinstance(f.value, ast.Name) and f.value.id == "options":
            out.append((n.lineno, f.attr))
        elif isinstance(f, ast.Name) and f.id in imported:
            out.append((n.lineno, f.id))
    return out


def test_only_the_cli_looks_the_options_up():
    root = paths.project_root()
    bad = [f"{py.relative_to(root)}:{line}: options.{name}()" for top in LOOKUP_ROOTS for py in sorted((root / top).rglob("*.py"))
           if py not in LOOKUP_OWNERS for line, name in _lookups(ast.parse(py.read_text(), str(py)))]
    assert not bad, "\n".join(bad) + "\n(resolve it in gpuforge/cli.py and pass the value to the stage's entry point)"


@pytest.mark.parametrize("code", ['from gpuforge import options\noptions.setting("x")',
                                  'from gpuforge.options import setting\nsetting("x")',
                                  'from gpuforge.options import setting as s\ns("x")',
                                  'from gpuforge import options\noptions.current()'])
def test_the_lookup_finder_finds_each_form(code):
    assert len(_lookups(ast.parse(code))) == 1
