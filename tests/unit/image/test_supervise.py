"""The readiness probe's exit path (gpuforge/image/supervise.py, gpu_smoke.py --level), on the CPU: a child that
crashes after printing READY is exit 5 with one line saying so, never a silent 134 or a READY that does not hold;
a clean child's verdict and exit code pass through unchanged, the verdict last."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

from gpuforge import paths
from gpuforge.image import supervise

READY = {"level": "r2", "verdict": "READY r2: 21 checks passed", "exit": 0, "findings": [], "facts": {"seconds": 9.5}}
VERDICTS = ("READY", "NODE NOT FIT", "IMAGE AT FAULT", "NOT SHOWN FIT", "STOPPED")
UNFIT = {**READY, "verdict": "NODE NOT FIT (host): memlock: ...", "exit": 10}


def child(report: dict | None, then: str) -> list[str]:
    """A child that prints `report` as its last stdout line (flushed), then runs `then`."""
    say = f"print({json.dumps(json.dumps(report))}, flush=True); " if report is not None else ""
    return [sys.executable, "-c", f"import os, sys, time, signal; {say}{then}"]


def probe(argv: list[str]) -> subprocess.CompletedProcess:
    """The whole exit path in a process of its own: supervise.probe ends it with os._exit."""
    code = (f"import sys; sys.path.insert(0, {str(paths.project_root())!r}); from gpuforge.image import supervise; "
            f"supervise.probe({argv!r}, level='r2', label='gpuforge selftest r2', "
            "extra_s=lambda rep: (rep.get('facts') or {}).get('seconds'))")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)


def test_a_child_that_aborts_after_its_ready_verdict_is_exit_5_saying_so():
    r = probe(child(READY, "os.abort()"))
    assert r.returncode == supervise.CRASH_EXIT == 5, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("gpuforge selftest r2: IMAGE AT FAULT: the probe crashed after its verdict "
                           "('READY r2: 21 checks passed', exit 0): it died by SIGABRT (a shell says exit 134)"), last
    rep = json.loads(r.stdout.strip().splitlines()[-1])
    assert rep["exit"] == 5 and rep["verdict"] in last and rep["probe"]["after_verdict"] is True
    assert "facts" not in rep  # a caller that judges facts again finds none to call fit
    assert rep["child_report"]["verdict"] == READY["verdict"]


def test_a_clean_childs_verdict_passes_through_last_with_its_exit_code():
    for rep, code in ((READY, 0), (UNFIT, 10)):
        r = probe(child(rep, f"sys.stderr.write('finding lines\\n'); sys.stderr.flush(); os._exit({code})"))
        assert r.returncode == code, r.stderr
        lines = r.stderr.strip().splitlines()
        assert lines == ["finding lines", f"gpuforge selftest r2: {rep['verdict']} (9.5 s)"]
        assert json.loads(r.stdout.strip().splitlines()[-1]) == rep


@pytest.mark.parametrize(("then", "words"), [
    ("os._exit(0)", "the probe crashed before its verdict: it exited 0; no verdict"),
    ("os.kill(os.getpid(), signal.SIGSEGV)", "the probe crashed before its verdict: it died by SIGSEGV (a shell says "
                                             "exit 139); no verdict"),
])
def test_a_child_that_leaves_no_report_is_the_images_fault(then, words):
    line, code, rep = supervise.settle(supervise.run(child(None, then)), "r1")
    assert code == 5 and line == f"IMAGE AT FAULT: {words}", line
    assert rep["probe"]["after_verdict"] is False and rep["child_report"] is None


def test_an_exit_code_that_disagrees_with_the_report_is_not_believed():
    line, code, _ = supervise.settle(supervise.run(child(READY, "os._exit(1)")), "r2")
    assert code == 5 and "the probe exited 1 but its verdict says exit 0 ('READY r2: 21 checks passed')" in line


def test_a_stop_is_passed_to_the_child_and_said_as_a_stop():
    """docker stop (SIGTERM to the probe): the child is stopped too, and the line says so, not a crash."""
    got = supervise.settle(supervise.Child(returncode=-signal.SIGTERM, stdout="", stopped_by=signal.SIGTERM), "r1")
    assert got[1] == 128 + signal.SIGTERM and got[0].startswith("STOPPED: the probe was stopped by SIGTERM before")


def test_gpu_smoke_level_r1_on_a_cpu_is_supervised_and_its_verdict_is_last():
    """The real program: the child collects r1's facts here (no driver), the parent prints the verdict once, last."""
    program = paths.project_root() / "images" / "programs" / "gpu_smoke.py"
    r = subprocess.run([sys.executable, str(program), "--level", "r1", "--cuda", "12.6", "--gpus", "1"],
                       capture_output=True, text=True, timeout=120, check=False)
    rep = json.loads(r.stdout.strip().splitlines()[-1])
    lines = r.stderr.strip().splitlines()
    verdicts = [ln for ln in lines if ln.startswith(tuple(f"gpuforge selftest r1: {v}" for v in VERDICTS))]
    assert r.returncode == rep["exit"] == 10 and rep["facts"]["level"] == "r1", r.stderr[-2000:]
    assert verdicts == [lines[-1]] and lines[-1].startswith(f"gpuforge selftest r1: {rep['verdict']} (")
