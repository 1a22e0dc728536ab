"""Helpers for validators. testinfra has no timeouts of its own: every command goes through `sh`."""

from __future__ import annotations

import json

import pytest


def sh(host, command: str, *, timeout: int = 120, check: bool = True):
    """Run `command` with a hard timeout inside the host; a hang fails the check, never the run.

    >>> sh(host, "python3 -V").stdout  # doctest: +SKIP
    'Python 3.11.2\\n'
    """
    r = host.run("timeout -k 5 %s sh -c %s", str(timeout), command)
    if r.rc in (124, 137):
        pytest.fail(f"timed out after {timeout}s: {command}")
    if check and r.rc != 0:
        pytest.fail(f"command failed (exit {r.rc}): {command}\n{(r.stderr or r.stdout)[-3000:]}")
    return r


def json_of(host, command: str, *, timeout: int = 120) -> dict:
    """Run a command that prints one JSON object on its last stdout line."""
    out = sh(host, command, timeout=timeout).stdout.strip().splitlines()
    if not out:
        pytest.fail(f"no output from: {command}")
    try:
        return json.loads(out[-1])
    except json.JSONDecodeError:
        pytest.fail(f"not JSON from {command}: {out[-1][:500]}")


def py(host, code: str, *, timeout: int = 120) -> dict:
    """Run Python code on the host that prints one JSON object."""
    return json_of(host, "python3 -c " + _quote(code), timeout=timeout)


def _quote(s: str) -> str:
    return "'" + s.replace("'", "'\"'\"'") + "'"
