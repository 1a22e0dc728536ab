"""driver: can the host's NVIDIA driver run the image's CUDA, and are the GPUs in torch's arch list?"""

from __future__ import annotations

import pytest

from conftest import expect
from gpuforge import compat
from vutil import py

PROBE = """
import dataclasses, json, sys
sys.path.insert(0, %r)
from gpuforge import hostinfo
h = hostinfo.detect()
print(json.dumps({"driver": h.driver, "source": h.source, "detail": h.detail,
                  "gpus": [dataclasses.asdict(g) for g in h.gpus]}))
"""


@pytest.fixture(scope="module")
def driver(host, gpuforge_home, facts, gpu, timeout):
    d = py(host, PROBE % gpuforge_home, timeout=timeout)
    facts["driver"] = d
    if d["driver"] is None:
        if gpu:
            pytest.fail(f"GPU checks requested but no NVIDIA driver is visible: {d['detail']}")
        pytest.skip(f"no NVIDIA driver visible ({d['detail']})")
    return d


def test_driver_runs_the_image_cuda(driver, target, facts):
    v = compat.driver_verdict(driver["driver"], expect(target, "cuda"))
    facts["driver_verdict"] = {"kind": v.kind, "message": v.message, "full_min": v.full_min, "minor_min": v.minor_min}
    assert v.ok, v.message


def test_gpus_in_arch_list(driver, target, facts):
    assert driver["gpus"], f"driver {driver['driver']} visible but no GPU listed"
    arch, ptx = expect(target, "arch_list"), target.get("ptx", [])
    bad = [f"GPU {g['index']} {g['name']} sm_{g['capability'].replace('.', '')}" for g in driver["gpus"]
           if not compat.arch_supported(g["capability"], arch, ptx)]
    facts["gpus"] = driver["gpus"]
    assert not bad, f"not in this build's arch list {arch}: {bad}"
