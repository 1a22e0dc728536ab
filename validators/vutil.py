"""Helpers for validators. testinfra has no timeouts of its own: every command goes through `sh`.

Commands are templates: values go in as `%s` arguments and are shell-quoted by testinfra
(`host.backend.quote`), never spliced into the text.
"""

from __future__ import annotations

import json
import re
import time
from datetime import datetime

import pytest

from gpuforge.validate.selection import EnvSkip


class EnvSkipped(pytest.skip.Exception):
    """A chosen check's skip for a reason of where it runs (one of EnvSkip): the plugin records the typed reason in
    the report, and the evidence allows only those. Any other skip of a chosen check makes the report not evidence.

    >>> raise EnvSkipped(EnvSkip.ONE_GPU, "world size 1")  # doctest: +SKIP
    """

    __module__ = "builtins"  # as pytest's own Skipped: the report's message reads "EnvSkipped: ...", not a module path

    def __init__(self, reason: EnvSkip, detail: str):
        super().__init__(f"{reason.describe} ({detail})")
        self.env_skip = reason


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


def engine_time(stamp: str) -> float:
    """An engine timestamp (RFC 3339 with nanoseconds: State.StartedAt, a health probe's Start and End) as epoch
    seconds, so that times the engine took can be compared with each other rather than with this machine's clock.

    >>> engine_time("2026-12-07T00:11:18.123456789Z")  # doctest: +SKIP
    """
    m = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)", stamp.strip())
    if not m:
        pytest.fail(f"not an engine timestamp: {stamp!r}")
    zone = "+00:00" if m[3] == "Z" else m[3]
    return datetime.fromisoformat(m[1] + zone).timestamp() + float(m[2] or 0)


class Health:
    """A running container's HEALTHCHECK as the engine reports it (`docker inspect`: State.Health): the status and
    every probe seen. The engine keeps a container's last five probes; polled more often than it probes, none is missed.

    >>> h = Health(running)  # doctest: +SKIP
    >>> h.wait("healthy", 30), h.last()  # doctest: +SKIP
    (True, 'jupyter: GET http://127.0.0.1:8888/api/status answered 200 in 4 ms')
    """

    def __init__(self, running):
        self.running = running
        self.probes: dict[str, dict] = {}
        self.status = ""
        self.t0 = time.monotonic()  # this machine's clock near the start, for waits (the engine's may be another's)
        running.reload()
        self.started = engine_time(running.container.attrs["State"]["StartedAt"])

    def poll(self) -> str:
        """The health status now ("starting", "healthy", "unhealthy"; the container's own when it is not running)."""
        self.running.reload()
        state = self.running.container.attrs["State"]
        health = state.get("Health") or {}
        for p in health.get("Log") or []:
            self.probes.setdefault(p["Start"], p)
        self.status = health.get("Status", "none") if state.get("Status") == "running" else state.get("Status", "gone")
        return self.status

    def seen(self, since: float = 0.0) -> list[dict]:
        """The probes begun at or after `since` (engine time), oldest first."""
        return sorted((p for p in self.probes.values() if engine_time(p["Start"]) >= since), key=lambda p: engine_time(p["Start"]))

    def last(self) -> str:
        seen = self.seen()
        return seen[-1]["Output"].strip() if seen else "no probe yet"

    def wait(self, want: str, timeout: float, stop_if=None) -> bool:
        """Poll until the status is `want` (True), the container stops or `timeout` s pass (False). `stop_if(self)`
        returning a message fails the check at once: a probe that already settles the verdict."""
        deadline = time.monotonic() + timeout
        while self.poll() != want:
            why = stop_if(self) if stop_if else None
            if why:
                pytest.fail(why)
            if self.status in ("exited", "dead", "gone") or time.monotonic() > deadline:
                return False
            time.sleep(0.5)
        return True
