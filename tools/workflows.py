"""GitHub Actions workflow lint for `nox -s lint`, with well-kept tools rather than a hand-written check:

1. check-jsonschema against its vendored GitHub workflow schema (structure: triggers, jobs, step keys, types);
2. zizmor --offline (security: template injection, unpinned actions, persisted credentials, dangerous
   triggers, ...). zizmor refuses a file the schema rejects, so it audits only the files that passed 1.

Each finding is one line, `file[:line]: tool: rule: message`. (No actionlint: no wheel that ships its
binary installs here.)
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def _tool(name: str) -> str:
    exe = Path(sys.executable).parent / name  # the venv's copy (the wheels ship the binaries)
    return str(exe) if exe.exists() else name


def schema_problems(paths: list[Path]) -> list[str]:
    p = subprocess.run([_tool("check-jsonschema"), "--builtin-schema", "vendor.github-workflows", "-o", "json",
                        *map(str, paths)], capture_output=True, text=True)
    try:
        doc = json.loads(p.stdout)
    except json.JSONDecodeError:
        return [f"check-jsonschema failed (exit {p.returncode}): {p.stderr.strip()[-300:]}"]
    out = [f"{e['filename']}: schema: not YAML: {e.get('message', '')}" for e in doc.get("parse_errors", [])]
    for e in doc.get("errors", []):
        best = e.get("best_deep_match") or e.get("best_match") or e
        out.append(f"{e['filename']}: schema: {best['path']}: {best['message']}")
    return out


def zizmor_problems(paths: list[Path]) -> list[str]:
    if not paths:
        return []
    p = subprocess.run([_tool("zizmor"), "--offline", "--no-progress", "--format", "json", *map(str, paths)],
                       capture_output=True, text=True)
    try:
        findings = json.loads(p.stdout)
    except json.JSONDecodeError:
        return [f"zizmor failed (exit {p.returncode}): {p.stderr.strip()[-300:]}"]
    out = []
    for f in findings:
        if f.get("ignored"):
            continue
        primary = next((loc for loc in f["locations"] if loc["symbolic"].get("kind") == "Primary"), f["locations"][0])
        key = primary["symbolic"]["key"]
        where = next(iter(key.values())).get("verbatim_path", "?") if isinstance(key, dict) else str(key)
        row = primary["concrete"]["location"]["start_point"]["row"] + 1
        note = primary["symbolic"].get("annotation", "")
        out.append(f"{where}:{row}: zizmor: {f['ident']}: {f['desc']} ({note})")
    return out


def problems(paths: list[Path]) -> list[str]:
    bad_schema = schema_problems(paths)
    rejected = {line.split(": schema:")[0] for line in bad_schema}
    return bad_schema + zizmor_problems([p for p in paths if str(p) not in rejected])


if __name__ == "__main__":
    found = problems([Path(a) for a in sys.argv[1:]] or sorted(Path(".github/workflows").glob("*.yml")))
    print("\n".join(found) or "workflows: clean")
    sys.exit(1 if found else 0)
