"""Target selectors: `key=value` (value may be a glob) and id globs with {a,b} braces.

All key=value selectors must match (AND); a target must match at least one id glob, if any are given.
Each selector must match at least one target on its own, so a typo is an error, not an empty build.
"""

from __future__ import annotations

import fnmatch
import functools
import re
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from gpuforge.errors import SelectorError

KEYS = ("id", "torch", "cuda", "python", "os", "flavor", "source")


class Selectable(Protocol):
    """What a selector reads: a Target, or any object with its id and the KEYS as attributes."""

    @property
    def id(self) -> str: ...


MAX_PATTERNS = 1024  # what one selector's {a,b} braces may expand to (`{a,b}` x 30 would be 2**30)


@functools.lru_cache(maxsize=4096)
def _braces(pattern: str) -> tuple[str, ...]:
    todo, out = [pattern], []
    while todo:
        p = todo.pop()
        m = re.search(r"\{([^{}]*)\}", p)
        if not m:
            out.append(p)
        else:
            todo.extend(p[: m.start()] + alt + p[m.end():] for alt in reversed(m.group(1).split(",")))
        if len(out) + len(todo) > MAX_PATTERNS:
            msg = f"selector {pattern!r}: its {{a,b}} braces expand to more than {MAX_PATTERNS} patterns"
            raise SelectorError(msg)
    return tuple(out)


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
                _braces(v)
                kv.append((k, v))
            else:
                _braces(s)
                globs.append(s)
    return kv, globs


def _hit(target: Selectable, kv: list[tuple[str, str]], globs: list[str]) -> bool:
    if not all(_glob(str(getattr(target, k)), v) for k, v in kv):
        return False
    return not globs or any(_glob(target.id, g) for g in globs)


def compile(sels: Sequence[str]) -> tuple[list[tuple[str, str]], list[str]]:
    """Parse (and check) selectors once, for `hit` on many targets."""
    return _parse(sels)


def hit(target: Selectable, compiled: tuple[list[tuple[str, str]], list[str]]) -> bool:
    return _hit(target, *compiled)


def matches(target: Selectable, sels: Sequence[str]) -> bool:
    kv, globs = _parse(sels)
    return _hit(target, kv, globs)


def select(targets: Sequence[Any], sels: Sequence[str]) -> list[Any]:
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
