"""Reports are typed in use: push/, evidence/, publish/ and fleet/ read a validation report (a file or a signed
predicate) through gpuforge.validate.report_model.Report's attributes, never a dict's string keys."""

from __future__ import annotations

import ast

from gpuforge import paths

PKG = paths.project_root() / "gpuforge"
ROOMS = ("push", "evidence", "publish", "fleet")
# Keys only a validation report has (status rows, release notes, promotion records, CVE verdicts and inventories
# share the generic ones: target, gpu, driver, run, evidence, id...): reading one of these by string is reading a
# report as a dict.
REPORT_KEYS = {"checks", "exit_status", "facts", "started", "selection", "narrowed", "deselected", "markexpr",
               "outcome", "gpu_host", "gpu_required", "gpu_models", "gpu_names", "capabilities",
               "validator_set", "repo_digests", "partial", "required", "missing", "signed_in_run", "signed_at"}


def _string_reads(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, key) of `x.get("key")` / `x.pop("key")` / `x["key"]` (a load) with a report's key."""
    out = []
    for n in ast.walk(tree):
        key = None
        if (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in ("get", "pop", "setdefault")
                and n.args and isinstance(n.args[0], ast.Constant)):
            key = n.args[0].value
        elif isinstance(n, ast.Subscript) and isinstance(n.ctx, ast.Load) and isinstance(n.slice, ast.Constant):
            key = n.slice.value
        if key in REPORT_KEYS:
            out.append((n.lineno, key))
    return out


def test_the_rooms_above_validate_read_reports_typed():
    bad = [f"{py.relative_to(PKG.parent)}:{line}: [{key!r}]" for room in ROOMS for py in sorted((PKG / room).rglob("*.py"))
           for line, key in _string_reads(ast.parse(py.read_text(), str(py)))]
    assert not bad, "string-keyed report reads (load it with Report.of and read attributes):\n" + "\n".join(bad)


def test_the_finder_finds_each_form():
    code = ('pred.get("gpu") and (pred.get("evidence") or {}).get("gpu_required")\n'
            'host = best["facts"]["gpu_host"]\n'
            'for c in p.get("checks", []): pass\n'
            'x = row["target"]\n')
    assert sorted(_string_reads(ast.parse(code))) == [(1, "gpu_required"), (2, "facts"), (2, "gpu_host"), (3, "checks")]
