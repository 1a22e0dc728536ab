"""ssh-audit's JSON (the pinned 3.9.0), read against its shape: on any surprise a problem naming what was found,
never an AttributeError in the middle of a check (ssh-audit has answered a loaded engine's container with output of
another shape, `'str' object has no attribute 'get'`, with nothing kept to say why). The validator keeps the raw
output in the report."""

from __future__ import annotations

import json

SECTIONS = ("kex", "key", "enc", "mac")


def parse(stdout: str) -> tuple[dict | None, list[str]]:
    """(report, shape problems): the report when ssh-audit's JSON has the shape 3.9.0 writes."""
    try:
        rep = json.loads(stdout)
    except json.JSONDecodeError as e:
        return None, [f"not JSON ({e.msg} at line {e.lineno})"]
    if not isinstance(rep, dict):
        return None, [f"the top level is a {type(rep).__name__}, not an object"]
    problems = []
    for sec in SECTIONS:
        items = rep.get(sec, [])
        if not isinstance(items, list):
            problems.append(f"{sec!r} is a {type(items).__name__}, not a list")
            continue
        for i, a in enumerate(items):
            if not isinstance(a, dict) or not isinstance(a.get("algorithm"), str):
                problems.append(f"{sec}[{i}] is {json.dumps(a)[:120]}, not an object with an algorithm")
            elif not isinstance(a.get("notes", {}), dict) or not all(
                    isinstance(v, list) and all(isinstance(n, str) for n in v) for v in a.get("notes", {}).values()):
                problems.append(f"{sec}[{i}] ({a['algorithm']}): notes are {json.dumps(a.get('notes'))[:120]}")
    cves = rep.get("cves", [])
    if not isinstance(cves, list) or not all(isinstance(c, dict) for c in cves):
        problems.append(f"'cves' is {json.dumps(cves)[:120]}, not a list of objects")
    return (rep if not problems else None), problems


def fail_items(rep: dict) -> list[str]:
    """What ssh-audit rates `fail`, and every CVE it names, from a report parse() accepted."""
    out = [f"{sec} {a['algorithm']}: {'; '.join(a['notes']['fail'])}"
           for sec in SECTIONS for a in rep.get(sec, []) if a.get("notes", {}).get("fail")]
    return out + [f"CVE {c.get('name')}" for c in rep.get("cves", [])]
