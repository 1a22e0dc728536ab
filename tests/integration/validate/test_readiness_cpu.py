"""Readiness level r1 in real containers of the default image (`selftest --level r1`), on this machine without a
GPU: the checks a GPU is not needed for fail for their stated reason, each blamed on the host or the image, and
pass when the container is set up as gpuforge's GPU runs set it up. The NVML checks fail here (no driver), as a
check that could not run must. Cost: a few seconds once the default image is built."""

from __future__ import annotations

import json

import docker.types
import pytest

from conftest import ROOT, gpuforge
from gpuforge.image import readiness

pytestmark = pytest.mark.docker
REASONS = {  # the check -> the words its failure must say
    "shm": "/dev/shm is 64 MiB, under 1.00 GiB",
    "memlock": "locked memory limited to 64 KiB, under 1.00 GiB",
    "require_cuda": "NVIDIA_REQUIRE_CUDA asks for cuda>=13.0, above the CUDA 12.6 it carries",
}


def _r1(engine, image: str, **kw) -> tuple[int, dict, str]:
    c = engine.containers.create(image, ["selftest", "--level", "r1", "--gpus", "1"], **kw)
    try:
        c.start()
        code = c.wait(timeout=120)["StatusCode"]
        out, err = c.logs(stdout=True, stderr=False).decode(), c.logs(stdout=False, stderr=True).decode()
    finally:
        c.remove(force=True)
    report = json.loads(out.strip().splitlines()[-1])
    return code, {f["check"]: f for f in report["findings"]}, err


def test_r1_names_each_container_fault_with_its_blame(default_build, docker_engine):
    _, rec = default_build
    code, found, err = _r1(docker_engine, rec["image_id"], shm_size="64m", environment={"NVIDIA_REQUIRE_CUDA": "cuda>=13.0"},
                           ulimits=[docker.types.Ulimit(name="memlock", soft=65536, hard=65536)])
    assert code == 10, err  # the node is not fit (it is judged before the image)
    for check, words in REASONS.items():
        assert not found[check]["ok"] and words in found[check]["reason"], found[check]
        assert f"gpuforge selftest r1: {check}: FAILED ({found[check]['blame']})" in err
    assert found["require_cuda"]["blame"] == "image" and found["shm"]["blame"] == found["memlock"]["blame"] == "host"
    assert "NVML could not be read" in found["persistence"]["reason"]  # no driver here: a check that cannot run fails
    assert "gpuforge selftest r1: NODE NOT FIT (host): " in err and "Traceback" not in err


def test_r1_limits_pass_as_gpuforge_sets_the_container_up(default_build, docker_engine):
    """`--shm-size 2g` and the image's own NVIDIA_REQUIRE_CUDA pass. Locked memory stays at the engine's limit: this
    machine's dockerd may not raise RLIMIT_MEMLOCK past its own 8 MiB (runc: "operation not permitted"), so the
    memlock rule's passing side is proven on NVML facts (tests/unit/image/test_readiness.py) and its figure here."""
    _, rec = default_build
    code, found, err = _r1(docker_engine, rec["image_id"], shm_size="2g")
    assert code == 10, err  # no GPU here
    assert found["shm"]["ok"] and found["shm"]["figure"] == "2.00 GiB", found["shm"]
    assert found["require_cuda"]["ok"] and "'cuda>=12.6'" in found["require_cuda"]["figure"], found["require_cuda"]
    limit = docker_engine.containers.run(rec["image_id"], ["sh", "-c", "ulimit -l"], entrypoint="", remove=True).decode()
    kib = int(limit) if limit.strip().isdigit() else -1
    assert found["memlock"]["ok"] == (kib < 0 or kib << 10 >= readiness.bars()["memlock_min_bytes"]), found["memlock"]


def test_smoke_level_r1_exits_10_naming_the_hosts_faults(default_build, docker_engine, tmp_path):
    """`gpuforge smoke docker://CONTAINER --level r1` end to end: the validator runs the program in the container,
    re-judges its facts with the host's bars, and gpuforge exits 10 (the node is not fit) in one line."""
    t, rec = default_build
    c = docker_engine.containers.run(rec["image_id"], ["sleep", "infinity"], detach=True, shm_size="64m",
                                     ulimits=[docker.types.Ulimit(name="memlock", soft=65536, hard=65536)])
    try:
        r = gpuforge("smoke", f"docker://{c.id}", "--level", "r1", "--gpus", "1", "--reports", str(tmp_path),
                     "--target-json", str(ROOT / "images" / "dist" / t.id / "target.json"))
    finally:
        c.remove(force=True)
    assert r.returncode == 10, r.stdout[-3000:] + r.stderr[-2000:]
    [line] = [x for x in r.stderr.splitlines() if x.startswith("gpuforge: error:")]
    assert "NODE NOT FIT (host): " in line and REASONS["shm"] in line and REASONS["memlock"] in line, line
    rep = json.loads((tmp_path / "smoke" / f"{t.id}-r1.json").read_text())
    r1 = rep["facts"]["readiness"]
    assert r1["exit"] == 10 and {f["check"] for f in r1["findings"]} == set(readiness.CHECKS)
    failed = {c["id"].split("[")[-1].rstrip("]") for c in rep["checks"] if c["outcome"] == "failed"}
    assert {"shm", "memlock", "persistence"} <= failed and "require_cuda" not in failed
