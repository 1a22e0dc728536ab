"""Helpers for validators. testinfra has no timeouts of its own: every command goes through `sh`.

Commands are templates: values go in as `%s` arguments and are shell-quoted by testinfra
(`host.backend.quote`), never spliced into the text.
"""

from __future__ import annotations

import json

import pytest


def sh(host, command: str, *args: str, timeout: int = 120, check: bool = True):
    """Run `command % quoted(args)` with a hard timeout inside the host; a hang fails the check, never the run.

    >>> sh(host, "python3 %s --json", "/opt/gpuforge/programs/inductor_cpu.py").stdout  # doctest: +SKIP
    """
    cmd = host.backend.quote(command, *map(str, args))
    r = host.run("timeout -k 5 %s sh -c %s", str(timeout), cmd)
    if r.rc in (124, 137):
        pytest.fail(f"timed out after {timeout}s: {cmd}")
    if check and r.rc != 0:
        pytest.fail(f"command failed (exit {r.rc}): {cmd}\n{(r.stderr or r.stdout)[-3000:]}")
    return r


def json_of(host, command: str, *args: str, timeout: int = 120) -> dict:
    """Run a command that prints one JSON object on its last stdout line."""
    r = sh(host, command, *args, timeout=timeout)
    out = r.stdout.strip().splitlines()
    if not out:
        pytest.fail(f"no output from: {command} {args}")
    try:
        return json.loads(out[-1])
    except json.JSONDecodeError:
        pytest.fail(f"not JSON from {command} {args}: {out[-1][:500]}")


def py(host, code: str, *args: str, timeout: int = 120) -> dict:
    """Run Python code on the host that prints one JSON object; args become sys.argv[1:]."""
    return json_of(host, "python3 -c %s" + " %s" * len(args), code, *args, timeout=timeout)


def processes(running) -> list[tuple[str, str]]:
    """(uid, full command line) of every process of a running container, from the engine (`docker top`). `ww`:
    ps cuts the command to the daemon's terminal width otherwise (32 characters were seen on Docker 26.1.5), and a
    check that looks for a word in it then finds nothing."""
    top = running.container.top(ps_args="-ww -eo pid,uid,args")
    return [(row[1], row[-1]) for row in top["Processes"]]
