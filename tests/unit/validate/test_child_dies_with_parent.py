"""The validators' pytest child dies with the gpuforge process that started it, even when that one is
SIGKILLed (PR_SET_PDEATHSIG): no orphan runs on to write a report. The control shows a plain child survives."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

PARENT = textwrap.dedent("""
    import os, subprocess, sys, time
    from gpuforge.validate.pytest_run import die_with_parent
    kw = {"preexec_fn": die_with_parent(os.getpid())} if sys.argv[1] == "bound" else {}
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], **kw)
    print(p.pid, flush=True)
    time.sleep(120)
""")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def _orphan_after_sigkill(mode: str, wait: float) -> bool:
    parent = subprocess.Popen([sys.executable, "-c", PARENT, mode], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    try:
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=10)
        deadline = time.monotonic() + wait
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        return _alive(child)
    finally:
        if _alive(child):
            os.kill(child, signal.SIGKILL)


def test_bound_child_dies_with_its_killed_parent():
    assert not _orphan_after_sigkill("bound", 10)


def test_control_a_plain_child_outlives_its_killed_parent():
    assert _orphan_after_sigkill("plain", 1.5)
