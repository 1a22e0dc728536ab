"""gpu_smoke.py's check runner (no GPU needed): isolated checks start first and run concurrently, timed parts
(after `yield QUIET`) resume only once everything else has finished, one at a time; a failed device stops all and
kills the isolated processes already started."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from gpuforge import paths
from gpuforge.image import smoke_verdicts

PROGRAMS = paths.project_root() / "images" / "programs"
sys.path.insert(0, str(PROGRAMS))
import gpu_smoke  # noqa: E402  (the image's program, imported by path)


class Log:
    def __init__(self):
        self.events: list[str] = []

    def plain(self, name, ok=True):
        def check():
            self.events.append(name)
            return {"ok": ok}
        return check

    def timed(self, name):
        def check():
            self.events.append(f"{name}:setup")
            yield gpu_smoke.QUIET
            self.events.append(f"{name}:timed")
            return {"ok": True, "figure": 1}
        return check

    def spawn(self, name):
        self.events.append(f"spawn:{name}")

        def result(timeout=1800):
            self.events.append(f"joined:{name}" if timeout > 1 else f"killed:{name}")
            return {"ok": True, "process_s": 2.5}
        return result


def _checks(log):
    return {"device": log.plain("device"), "matmul": log.plain("matmul"), "fusion": log.timed("fusion"),
            "compile_cache": log.timed("compile_cache"), "aoti": log.plain("aoti"),
            "compile_modes": log.plain("compile_modes")}


def test_concurrent_schedule():
    log = Log()
    names = ["device", "matmul", "fusion", "compile_modes", "aoti", "compile_cache"]
    res = gpu_smoke.run_checks(names, _checks(log), serial=False, spawn=log.spawn)
    assert list(res) == names  # the report keeps the suite's order
    ev = log.events
    # both isolated checks are started first: their processes start up while the device check runs here
    assert ev[:3] == ["spawn:compile_modes", "spawn:aoti", "device"]
    # the set-ups run next, the compile cache's first (its children then start up while the rest runs)
    assert ev[3:6] == ["compile_cache:setup", "fusion:setup", "matmul"]
    # every isolated process is joined before any timed part, and the timed parts run one after another
    assert ev[6:] == ["joined:compile_modes", "joined:aoti", "compile_cache:timed", "fusion:timed"]
    assert res["aoti"]["seconds"] == 2.5 and res["fusion"]["figure"] == 1
    assert "aoti:" not in " ".join(ev) and "aoti" not in ev  # an isolated check never runs in this process


def test_serial_schedule_runs_in_order_here():
    log = Log()
    names = ["device", "fusion", "aoti", "matmul"]
    res = gpu_smoke.run_checks(names, _checks(log), serial=True, spawn=log.spawn)
    assert log.events == ["device", "fusion:setup", "fusion:timed", "aoti", "matmul"]
    assert all(r["ok"] for r in res.values()) and all("seconds" in r for r in res.values())


def test_failed_device_stops_everything():
    log = Log()
    checks = {**_checks(log), "device": log.plain("device", ok=False)}
    res = gpu_smoke.run_checks(["device", "matmul", "aoti", "fusion"], checks, serial=False, spawn=log.spawn)
    assert log.events == ["spawn:aoti", "device", "killed:aoti"] and list(res) == ["device"]


def test_a_raising_check_is_recorded_and_the_rest_still_run():
    log = Log()

    def broken():
        msg = "cuBLAS said no"
        raise RuntimeError(msg)

    def broken_after_quiet():
        yield gpu_smoke.QUIET
        msg = "timing went wrong"
        raise ValueError(msg)

    checks = {**_checks(log), "matmul": broken, "fusion": broken_after_quiet}
    res = gpu_smoke.run_checks(["device", "matmul", "fusion", "compile_cache"], checks, serial=False, spawn=log.spawn)
    assert res["matmul"]["ok"] is False and "cuBLAS said no" in res["matmul"]["error"]
    assert res["fusion"]["ok"] is False and "timing went wrong" in res["fusion"]["error"]
    assert res["compile_cache"]["ok"] is True


def test_seconds_count_a_checks_own_work_not_the_wait():
    def slow_setup():
        time.sleep(0.2)
        yield gpu_smoke.QUIET
        time.sleep(0.1)
        return {"ok": True}

    def spawn(name):
        return lambda timeout=1800: (time.sleep(0.3), {"ok": True, "process_s": 0.3})[1]

    res = gpu_smoke.run_checks(["fusion", "aoti"], {"fusion": slow_setup, "aoti": None}, serial=False, spawn=spawn)
    assert 0.28 <= res["fusion"]["seconds"] < 0.5  # 0.2 + 0.1, not the 0.3 s spent waiting for aoti


@pytest.fixture(autouse=True)
def _temp_here(monkeypatch, tmp_path):
    """The program makes fresh Inductor cache folders in the temp folder (in an image, /tmp goes with the container):
    this test's temp folder, for its own process and the ones it starts, so the suite leaves none behind on the host."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("TMPDIR", str(tmp_path))


def _run(*args):
    return subprocess.run([sys.executable, str(PROGRAMS / "gpu_smoke.py"), *args], capture_output=True, text=True,
                          timeout=120)


def test_an_isolated_check_runs_in_a_fresh_process_and_its_result_comes_back():
    r = _run("--only", "shm", "--isolate", "shm")  # the shm check needs no GPU
    rep = json.loads(r.stdout.strip().splitlines()[-1])
    shm = rep["checks"]["shm"]
    assert "bytes" in shm and shm["process_s"] >= shm["seconds"] >= 0
    assert rep["schedule"] == {"serial": False, "isolated": ["shm"]}
    assert "gpuforge selftest: shm:" in r.stderr


@pytest.mark.parametrize("args", [["--only", "shm,nope"], ["--only", "shm", "--isolate", "aoti,bogus"]])
def test_unknown_check_names_are_one_line_and_exit_64(args):
    r = _run(*args)
    assert r.returncode == 64 and "unknown check" in r.stderr and "Traceback" not in r.stderr


def test_package_contents_counts_kinds(tmp_path):
    import zipfile

    pkg = tmp_path / "m.pt2"
    with zipfile.ZipFile(pkg, "w") as z:
        for name in ("m/data/aotinductor/model/a.cpp", "m/data/aotinductor/model/a.o", "m/data/aotinductor/model/a.so",
                     "m/data/aotinductor/model/k1.cubin", "m/data/aotinductor/model/k2.cubin", "m/version"):
            z.writestr(name, b"x")
    assert gpu_smoke.package_contents(str(pkg)) == {"(none)": 1, "cpp": 1, "cubin": 2, "o": 1, "so": 1}
    assert "error" in gpu_smoke.package_contents(str(tmp_path / "missing.pt2"))
    (tmp_path / "not-a-zip.pt2").write_bytes(b"garbage")
    assert "BadZipFile" in gpu_smoke.package_contents(str(tmp_path / "not-a-zip.pt2"))["error"]


# A stand-in for the compile-cache child (no torch here): "compiles" into TORCHINDUCTOR_CACHE_DIR after the
# parent's go, a hit when the entry is already there, and notes when it got the go and when it finished.
_FAKE_COMPILE_CHILD = r"""
import json, os, sys, time
cache = os.environ["TORCHINDUCTOR_CACHE_DIR"]
open(os.path.join(cache, f"ready.{os.getpid()}"), "w").close()
sys.stdin.readline()
go = time.time()
entry = os.path.join(cache, "fxgraph-block")
hit = os.path.exists(entry)
time.sleep(0.05 if hit else 0.4)
if not hit:
    open(entry, "w").close()
print(json.dumps({"s": time.time() - go, "inductor": {"fxgraph_cache_hit" if hit else "fxgraph_cache_miss": 1},
                  "aot": {}, "go": go, "end": time.time(), "ready": sorted(os.listdir(cache))}))
"""


def test_compile_cache_children_start_early_and_time_cold_then_warm(monkeypatch):
    monkeypatch.setattr(gpu_smoke, "_COMPILE_CHILD", _FAKE_COMPILE_CHILD)
    monkeypatch.setattr(gpu_smoke, "TH", smoke_verdicts.default_thresholds())  # main() fills TH so
    gen = gpu_smoke.check_compile_cache()
    assert next(gen) is gpu_smoke.QUIET  # both children started; nothing timed yet
    time.sleep(0.5)  # they start up meanwhile (here: mark themselves ready) and wait for the go
    with pytest.raises(StopIteration) as stop:
        next(gen)
    res = stop.value.value
    assert res["warm_fxgraph_cache_hit"] == 1 and res["warm_fxgraph_cache_miss"] == 0
    assert res["cold_counters"] == {"fxgraph_cache_miss": 1}
    assert res["speedup"] > 3
    assert smoke_verdicts.judge("compile_cache", res, gpu_smoke.TH)["ok"] is True  # the verdict main() applies


def test_compile_cache_reports_a_child_that_dies(monkeypatch):
    monkeypatch.setattr(gpu_smoke, "_COMPILE_CHILD", "import sys; sys.exit('no CUDA here')")
    gen = gpu_smoke.check_compile_cache()
    next(gen)
    with pytest.raises(StopIteration) as stop:
        next(gen)
    assert stop.value.value["ok"] is False and "no CUDA here" in stop.value.value["error"]


def test_compile_modes_start_one_process_per_mode_from_the_program_itself():
    """No process in between: each mode's process is a child of the smoke program, and the merged result names
    every mode. Here (no torch, no GPU) each fails, and the failure carries the mode process's exit."""
    finish = gpu_smoke.spawn_isolated("compile_modes", smoke_verdicts.default_thresholds())
    res = finish(120)
    assert set(res) == {*gpu_smoke.COMPILE_MODES, "ok", "process_s"}
    assert res["ok"] is False
    for mode in gpu_smoke.COMPILE_MODES:
        assert res[mode]["ok"] is False and "mode process exit" in res[mode]["error"], res[mode]

