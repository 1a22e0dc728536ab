"""The long steps of a run, timed where they happen (a cold build, a push, a full validation) and listed at the end
of `nox -s tests` under "slowest steps": a module's total alone does not say which of its steps grew.

A step timed in a test or fixture is attached to the next report its worker makes (tests/conftest.py's
pytest_runtest_makereport), which xdist hands to the controlling process with the report's user_properties."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

KEY = "gpuforge-step"
_PENDING: list[tuple[str, float, float]] = []  # (step, seconds, its start in epoch seconds), not yet on a report


@contextmanager
def step(name: str) -> Iterator[None]:
    """Time the block as step `name` (also when it fails: a slow failure is worth seeing too)."""
    t0, began = time.monotonic(), time.time()
    try:
        yield
    finally:
        _PENDING.append((name, time.monotonic() - t0, began))


def take() -> list[tuple[str, tuple[str, float, float]]]:
    """The steps timed since the last call, as user_properties entries: (KEY, (step, seconds, start)), a
    (name, value) pair as pytest's junitxml reads every entry."""
    out = [(KEY, timed) for timed in _PENDING]
    _PENDING.clear()
    return out
