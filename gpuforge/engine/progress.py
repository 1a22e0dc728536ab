"""Progress of long engine operations (a push of a 6 GB image takes minutes): a live display when stdout
is a terminal, plain lines otherwise (CI logs), chosen by --progress auto|tty|plain.

PushProgress reads the docker SDK's push stream (one JSON event per layer state change) and shows
layers done of total and bytes sent; the events pass through unchanged for the caller to judge.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import requests.exceptions
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn

from gpuforge.engine import client as engine

MODES = ("auto", "tty", "plain")
PLAIN_EVERY_S = 10.0  # a plain summary line at most this often while bytes flow (layer ends are always shown)
DONE = ("Pushed", "Layer already exists", "Mounted from")


def plain(mode: str) -> bool:
    return mode == "plain" or (mode == "auto" and not sys.stdout.isatty())


def gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


@dataclass
class _Layer:
    state: str = "waiting"
    current: int = 0
    total: int = 0
    done: bool = False


@dataclass
class PushState:
    """What the push stream has said so far, per layer id."""

    layers: dict[str, _Layer] = field(default_factory=dict)

    def feed(self, ev: dict[str, Any]) -> str | None:
        """Take one event; returns the layer id when that layer just finished."""
        lid: str | None = ev.get("id")  # the engine's JSON event: a layer id when present
        status = str(ev.get("status", ""))
        if not lid or not status or "digest: sha256:" in status:
            return None  # "The push refers to ...", and the tag's line "TAG: digest: sha256:... size: N"
        layer = self.layers.setdefault(lid, _Layer())
        layer.state = status
        detail = ev.get("progressDetail") or {}
        if status == "Pushing" and detail.get("total"):
            layer.total = int(detail["total"])
            layer.current = min(int(detail.get("current", 0)), layer.total)  # the engine overshoots by a block
        if status.startswith(DONE) and not layer.done:
            layer.done = True
            layer.current = layer.total
            return lid
        return None

    @property
    def done(self) -> int:
        return sum(layer.done for layer in self.layers.values())

    @property
    def sent(self) -> int:
        return sum(layer.current for layer in self.layers.values())

    @property
    def total(self) -> int:
        return sum(layer.total for layer in self.layers.values())

    def line(self) -> str:
        size = f", {gb(self.sent)} of {gb(self.total)} sent" if self.total else ""
        return f"{self.done}/{len(self.layers)} layers done{size}"


class PushProgress:
    """Wraps the push event stream: shows progress; an engine that goes away mid-push is one EngineError."""

    def __init__(self, ref: str, mode: str = "auto"):
        self.ref, self.plain, self.state = ref, plain(mode), PushState()

    def feed(self, events: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        if self.plain:
            yield from self._plain(events)
            return
        with Progress(TextColumn("push {task.description}"), BarColumn(), DownloadColumn(),
                      TextColumn("{task.fields[layers]}"), TimeElapsedColumn(), console=Console()) as bar:
            task = bar.add_task(self.ref, total=None, layers="")
            for ev in self._guarded(events):
                self.state.feed(ev)
                bar.update(task, completed=self.state.sent, total=self.state.total or None,
                           layers=f"{self.state.done}/{len(self.state.layers)} layers")
                yield ev

    def _plain(self, events: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        last = time.monotonic()
        for ev in self._guarded(events):
            finished = self.state.feed(ev)
            now = time.monotonic()
            if finished:
                how = self.state.layers[finished].state.replace("Layer already exists", "already in the registry")
                print(f"gpuforge: push {self.ref}: layer {finished} {how.lower()}; {self.state.line()}", flush=True)
                last = now
            elif self.state.sent and now - last >= PLAIN_EVERY_S:
                print(f"gpuforge: push {self.ref}: {self.state.line()}", flush=True)
                last = now
            yield ev

    def _guarded(self, events: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        try:
            yield from events
        except requests.exceptions.ConnectionError:
            if engine.alive():
                raise
            msg = f"the push of {self.ref}"
            raise engine.lost(msg) from None
