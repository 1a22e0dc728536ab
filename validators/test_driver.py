"""driver: can the host's NVIDIA driver run the image's CUDA, and are the GPUs in torch's arch list?"""

from __future__ import annotations

import pytest

from gpuforge.image import hostinfo, preflight
from gpuforge.validate.selection import EnvSkip
from vutil import EnvSkipped, py

PROBE = """
import dataclasses, json, sys
sys.path.insert(0, sys.argv[1])
from gpuforge.image import hostinfo
h = hostinfo.detect()
print(json.dumps(dataclasses.asdict(h)))
"""


@pytest.fixture(scope="module")
def driver(host, gpuforge_lib, facts, gpu, timeout):
    """The host's driver and GPUs as the image's own probe sees them. Chosen for every run: without GPUs a container
    sees no driver (a typed skip), unless the image fakes one (the broken-image tests' nvidia-smi)."""
    d = py(host, PROBE, gpuforge_lib, timeout=timeout)
    facts["driver"] = d
    if d["driver"] is None:
        if gpu:
            pytest.fail(f"GPU checks requested but no NVIDIA driver is visible: {d['detail']}")
        raise EnvSkipped(EnvSkip.NO_DRIVER, d["detail"])
    return d


def _host(d: dict) -> hostinfo.HostGpus:
    return hostinfo.HostGpus(**{**d, "gpus": tuple(hostinfo.Gpu(**g) for g in d["gpus"]),
                                "device_nodes": tuple(d.get("device_nodes", ()))})


def test_driver_runs_the_image_cuda(driver, target, facts):
    assert target.cuda, "the target gives no CUDA version"
    v = preflight.verdict_for(target.expected, _host(driver))  # the same decision the image's entrypoint makes
    facts["driver_verdict"] = {"kind": v.kind, "message": v.message, "full_min": v.full_min, "minor_min": v.minor_min}
    assert v.ok, v.message


def test_gpus_in_arch_list(driver, target, facts):
    assert driver["gpus"], f"driver {driver['driver']} visible but no GPU: {preflight.no_device_reason(_host(driver))}"
    assert target.arch_list, "the target gives no arch list"
    state, msgs = preflight.check(target.expected, _host(driver))
    facts["gpus"] = driver["gpus"]
    assert state == "ok", "; ".join(msgs)
