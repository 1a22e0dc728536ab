"""Progress of a validator run: checks done of total and the one running now.

Two halves in one module, so the event format has one home:
- a pytest plugin (loaded in the validator subprocess with `-p gpuforge.validate.progress`) that writes
  one JSON line per event to the pipe named by GPUFORGE_PROGRESS_FD: the number of checks collected,
  each check's start, and each check's outcome;
- Watch, in gpuforge's process: starts pytest with that pipe, forwards pytest's own output, and shows
  the events: a live bar when stdout is a terminal, one plain line per finished check otherwise.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pytest
    from rich.progress import Progress

from gpuforge import options

FD_ENV = options.PROGRESS_FD_ENV

# ---- the plugin half (runs inside pytest) ----

_fd: int | None = None  # taken from the environment when pytest configures the plugin, never at import


def pytest_configure(config: pytest.Config) -> None:
    global _fd
    _fd = options.take_progress_fd()


def _emit(**event: object) -> None:
    if _fd is not None:
        try:
            os.write(_fd, (json.dumps(event) + "\n").encode())
        except OSError:  # the parent stopped reading (Ctrl-C): the run goes on without progress
            pass


def pytest_collection_finish(session: pytest.Session) -> None:
    _emit(total=len(session.items))


def pytest_runtest_logstart(nodeid: str, location: tuple[str, int | None, str]) -> None:
    _emit(start=nodeid)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # a check ends with its call, or earlier when its setup failed or skipped it
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        _emit(done=report.nodeid, outcome=report.outcome, seconds=round(report.duration, 1))


# ---- the watching half (runs in gpuforge) ----


class Watch:
    """Run pytest (`argv`) with progress events on a pipe; `wait()` returns its exit code."""

    def __init__(self, argv: list[str], env: dict[str, str], *, label: str, plain: bool,
                 preexec_fn: Callable[[], object] | None = None) -> None:
        self.label, self.plain = label, plain
        self.total = self.done = 0
        self.current = ""
        self.outcomes: dict[str, int] = {}
        r, w = os.pipe()
        env = {**env, FD_ENV: str(w)}
        self.proc = subprocess.Popen([*argv, "-p", "gpuforge.validate.progress"], env=env, pass_fds=(w,),
                                     preexec_fn=preexec_fn, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
        os.close(w)  # the child holds the only write end: EOF when it exits
        self._events = os.fdopen(r, encoding="utf-8", errors="replace")
        self._live: Progress | None = None

    def wait(self) -> int:
        if self.plain:
            return self._run()
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        with Progress(TextColumn("validate {task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), TextColumn("{task.fields[current]}"), console=Console()) as bar:
            self._live = bar
            self._task = bar.add_task(self.label, total=None, current="collecting")
            return self._run()

    def _run(self) -> int:
        reader = threading.Thread(target=self._read_events, daemon=True)
        reader.start()
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._out(line.rstrip("\n"))
        rc = self.proc.wait()
        reader.join(timeout=10)
        return rc

    def _out(self, line: str) -> None:
        if self._live is not None:
            from rich.text import Text

            self._live.console.print(Text(line), highlight=False)
        else:
            print(line, flush=True)

    def _read_events(self) -> None:
        for raw in self._events:
            try:
                ev = json.loads(raw)
            except json.JSONDecodeError:
                continue
            self._event(ev)
        self._events.close()

    def _event(self, ev: dict[str, Any]) -> None:
        if "total" in ev:
            self.total = int(ev["total"])
            if self.plain:
                print(f"gpuforge: validate {self.label}: {self.total} check(s) collected", flush=True)
        elif "start" in ev:
            self.current = str(ev["start"])
        elif "done" in ev:
            self.done += 1
            outcome = str(ev.get("outcome"))
            self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
            if self.plain:
                print(f"gpuforge: validate {self.label}: [{self.done}/{self.total or '?'}] {outcome} {ev['done']} "
                      f"({ev.get('seconds', 0)} s)", flush=True)
        if self._live is not None:
            self._live.update(self._task, completed=self.done, total=self.total or None,
                              current=self.current.rsplit("/", 1)[-1][-60:])
