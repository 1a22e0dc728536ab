"""A Ctrl-C and a tag move exclude each other: an image BuildKit finished just before the interrupt is left untagged,
and an interrupt that lands while a tag moves waits for that move to end (its record and tags then agree)."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from gpuforge.builder import runner

IMG = "sha256:" + "c" * 64


def _runner(moves: list[str], started: threading.Event | None = None) -> runner._Runner:
    """A runner with only what tagging reads; its tag move is recorded, not done (no engine here)."""
    r = object.__new__(runner._Runner)
    r.stop, r.tagging, r.lock, r.procs = threading.Event(), threading.RLock(), threading.Lock(), set()

    def move(t, img, res, *a, **k):
        if started:
            started.set()
        time.sleep(0.3)  # long enough for a Ctrl-C to land mid-way
        moves.append(img.id)
        res.ok, res.state = True, "built"

    r._tag = move  # type: ignore[method-assign]
    return r


def _tag(r: runner._Runner) -> runner.Result:
    res = runner.Result(target=SimpleNamespace(id="t"))  # type: ignore[arg-type]
    r._tag_unless_stopped(res.target, SimpleNamespace(id=IMG), res, "recipe", 1, index=False, argv=[])  # type: ignore[arg-type]
    return res


def test_an_image_finished_after_the_interrupt_gets_no_tag():
    moves: list[str] = []
    r = _runner(moves)
    r.kill_all()
    res = _tag(r)
    assert moves == [] and not res.ok and res.state == "failed"
    assert res.error == f"built {IMG[:19]} but stopped before its tags moved"


def test_an_interrupt_during_a_tag_move_waits_for_it_to_end():
    moves: list[str] = []
    started = threading.Event()
    r = _runner(moves, started)
    worker = threading.Thread(target=_tag, args=(r,))
    worker.start()
    assert started.wait(10)  # the move is under way
    r.kill_all()  # returns only once the move ended: what the interrupt then reports is what happened
    assert moves == [IMG] and r.stop.is_set()
    worker.join()


def test_without_an_interrupt_the_tags_move():
    moves: list[str] = []
    res = _tag(_runner(moves))
    assert moves == [IMG] and res.ok
