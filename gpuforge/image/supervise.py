"""A probe whose verdict and exit code always agree: the measuring work runs in a child process, and this process
prints the verdict only once the child has exited cleanly with a report that says the same exit code.

The child (NVML, CUDA, Inductor's compile workers, timing threads) prints its findings on stderr as it goes and its
report as the last line of stdout, then leaves with os._exit(code): nothing of the interpreter's teardown runs after
its verdict is decided. This process imports none of that. It waits for the child, then:

- the child exited with the code its report names: print the report (stdout) and the verdict line (stderr);
- the child died by a signal, or exited with another code than its report's, or left no report: one line saying
  so (after its verdict, or before it), exit 5: a probe that crashes is the image's fault, never a verdict;
- this process was asked to stop (SIGTERM, SIGINT): the child is stopped too, and the line says so (128 + signal).

In every case the verdict is this process's very last act: stdout, then stderr, flushed, then os._exit.
Stdlib only: every image carries gpuforge/image.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

CRASH_EXIT = 5  # the image's fault, as readiness's IMAGE AT FAULT


@dataclass(frozen=True, kw_only=True)
class Child:
    returncode: int  # negative: killed by that signal (Popen's convention)
    stdout: str
    stopped_by: int | None = None  # the signal this process was stopped by and passed on, if any


def run(argv: list[str], env: dict[str, Any] | None = None) -> Child:
    """Run the child with stderr shared and stdout to a file, passing SIGTERM and SIGINT on. A file, not a pipe: a
    worker the child leaves behind may keep a pipe open long after the child is gone; the child's exit is the end."""
    stopped: list[int] = []
    with tempfile.TemporaryFile(mode="w+") as out:
        p = subprocess.Popen(argv, stdout=out, stdin=subprocess.DEVNULL, env=env)

        def forward(signum: int, _frame: object) -> None:
            stopped.append(signum)
            if p.poll() is None:
                p.send_signal(signum)

        old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            rc = p.wait()
        finally:
            for s, h in old.items():
                signal.signal(s, h)
        out.seek(0)
        return Child(returncode=rc, stdout=out.read(), stopped_by=stopped[0] if stopped else None)


def _report(stdout: str) -> dict[str, Any] | None:
    """The child's report: its stdout's last line, a JSON object with a verdict and an exit code."""
    lines = stdout.strip().splitlines()
    try:
        rep = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        return None
    ok = isinstance(rep, dict) and isinstance(rep.get("verdict"), str) and isinstance(rep.get("exit"), int)
    return rep if ok else None


def how_it_ended(returncode: int) -> str:
    """'died by SIGABRT (a shell says exit 134)' or 'exited 1'."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"died by {name} (a shell says exit {128 - returncode})"
    return f"exited {returncode}"


def settle(child: Child, level: str) -> tuple[str, int, dict[str, Any]]:
    """(verdict line, exit code, report to print) of a finished child."""
    rep = _report(child.stdout)
    said = f"its verdict ({rep['verdict']!r}, exit {rep['exit']})" if rep else "its verdict"
    when = "after" if rep else "before"
    if child.stopped_by is not None:
        name = signal.Signals(child.stopped_by).name
        line = f"STOPPED: the probe was stopped by {name} {when} {said}; it {how_it_ended(child.returncode)}"
        code = 128 + child.stopped_by
    elif rep is not None and child.returncode == rep["exit"]:
        return rep["verdict"], rep["exit"], rep
    elif child.returncode < 0 or rep is None:
        line = (f"IMAGE AT FAULT: the probe crashed {when} {said}: it {how_it_ended(child.returncode)}; "
                f"{'that verdict does not count' if rep else 'no verdict'}")
        code = CRASH_EXIT
    else:
        line = (f"IMAGE AT FAULT: the probe exited {child.returncode} but its verdict says exit {rep['exit']} "
                f"({rep['verdict']!r}); a probe whose verdict and exit code differ is not believed")
        code = CRASH_EXIT
    # No "facts": a caller that judges the facts again must not find a crashed probe's facts fit
    crash = {"returncode": child.returncode, "ended": how_it_ended(child.returncode), "after_verdict": bool(rep),
             "stopped_by": child.stopped_by}
    return line, code, {"level": level, "verdict": line, "exit": code, "probe": crash, "child_report": rep}


def finish(report: str, line: str, code: int) -> NoReturn:
    """The process's last act: the report on stdout, the verdict line on stderr, both flushed, then os._exit."""
    try:
        sys.stdout.write(report + "\n")
        sys.stdout.flush()
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    finally:
        os._exit(code)


def probe(argv: list[str], *, level: str, label: str, out: str | None = None,
          extra_s: Callable[[dict[str, Any]], float | None] | None = None) -> NoReturn:
    """Run the child `argv`, settle its verdict and end this process with it (never returns). `label` starts the
    verdict line ('gpuforge selftest r2'); `out`: also write the report there; `extra_s(report)`: the seconds shown
    after the verdict, or None."""
    line, code, rep = settle(run(argv), level)
    seconds = extra_s(rep) if extra_s else None
    text = json.dumps(rep, default=str)
    if out:
        try:
            with open(out, "w") as f:
                f.write(json.dumps(rep, indent=2, default=str) + "\n")
        except OSError as e:  # the verdict still comes out; the file's failure is said with it
            line += f" (could not write {out}: {e.strerror})"
    finish(text, f"{label}: {line}" + (f" ({seconds} s)" if seconds is not None else ""), code)
