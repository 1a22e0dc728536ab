"""Target selectors: `key=value` (value may be a glob) and id globs with {a,b} braces.

All key=value selectors must match (AND); a target must match at least one id glob, if any are given.
Each selector must match at least one target on its own, so a typo is an error, not an empty build.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Sequence

from gpuforge.errors import SelectorError

KEYS = ("id", "torch", "cuda", "python", "os", "flavor", "source")


def _braces(pattern: str) -> list[str]:
    m = re.search(r"\{([^{}]*)\}", pattern)
    if not m:
        return [pattern]
    out = []
    for alt in m.group(1).split(","):
        out.extend(_braces(pattern[: m.start()] + alt + pattern[m.end():]))
    return out


def _glob(value: str, pattern: str) -> bool:
    return any(fnmatch.fnmatchcase(value, p) for p in _braces(pattern))


def _parse(sels: Iterable[str]) -> tuple[list[tuple[str, str]], list[str]]:
    kv, globs = [], []
    for raw in sels:
        for s in raw.split():
            if "=" in s:
                k, v = s.split("=", 1)
                if k not in KEYS:
                    msg = f"selector {s!r}: unknown key {k!r} (allowed: {', '.join(KEYS)})"
                    raise SelectorError(msg)
                if not v:
                    msg = f"selector {s!r}: empty value (write {k}=VALUE)"
                    raise SelectorError(msg)
                kv.append((k, v))
            else:
                globs.append(s)
    return kv, globs


def _hit(target: object, kv: list[tuple[str, str]], globs: list[str]) -> bool:
    if not all(_glob(str(getattr(target, k)), v) for k, v in kv):
        return False
    return not globs or any(_glob(target.id, g) for g in globs)


def matches(target: object, sels: Sequence[str]) -> bool:
    kv, globs = _parse(sels)
    return _hit(target, kv, globs)


def select(targets: Sequence, sels: Sequence[str]) -> list:
    kv, globs = _parse(sels)
    for k, v in kv:
        if not any(_glob(str(getattr(t, k)), v) for t in targets):
            known = sorted({str(getattr(t, k)) for t in targets})
            msg = f"selector {k}={v} matches no target ({k} values in the matrix: {', '.join(known)})"
            raise SelectorError(msg)
    for g in globs:
        if not any(_glob(t.id, g) for t in targets):
            msg = f"selector {g!r} matches no target id (run `gpuforge plan` to list them)"
            raise SelectorError(msg)
    chosen = [t for t in targets if _hit(t, kv, globs)]
    if not chosen:
        msg = f"selectors {' '.join(sels)!r} together match no target"
        raise SelectorError(msg)
    return chosen
