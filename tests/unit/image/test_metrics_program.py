"""images/programs/metrics.py: exact dcgm-exporter names and types in the text it writes, both label sets, the
info metric, and a machine without a GPU (served as up 0 / 0 GPUs, never a crash). NVML is replaced by fixed
readings here; the real GPU is measured on the H200 (`python images/programs/metrics.py --once`)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuforge import paths

PROG = paths.project_root() / "images" / "programs" / "metrics.py"
sys.path.insert(0, str(PROG.parent))
import metrics  # noqa: E402


class Readings:
    """Two GPUs as NVML would describe them."""

    nv, error, driver = object(), "", "580.159.04"

    def ready(self):
        return True

    def read(self):
        return [({"gpu": str(i), "UUID": f"GPU-{i}", "modelName": "NVIDIA H200", "pci_bus_id": f"00000000:{i:02x}:00.0",
                  "device": f"nvidia{i}"}, {k: float(n + i) for n, (_, _, _, k) in enumerate(metrics.FIELDS)}) for i in range(2)]


def _text(names="classic", readings=True):
    col = metrics.GpuCollector(names, hostname="node-1")
    if readings:
        col.nvml = Readings()
    return metrics.exposition(col).decode()


def test_names_and_types_are_dcgm_exporters_exactly():
    text = _text()
    for name, typ, _, _ in metrics.FIELDS:
        assert f"# TYPE {name} {typ}\n" in text  # prometheus_client's writer would say DCGM_..._total here
        assert f"\n{name}{{gpu=\"0\"" in text
    assert "_total" not in text


@pytest.mark.parametrize(("names", "host"), [("classic", "Hostname"), ("4.9", "hostname")])
def test_label_sets(names, host):
    fams = {f.name: f for f in text_string_to_metric_families(_text(names))}
    s = fams["DCGM_FI_DEV_GPU_TEMP"].samples
    assert [x.labels for x in s] == [{"gpu": str(i), "UUID": f"GPU-{i}", "pci_bus_id": f"00000000:{i:02x}:00.0",
                                      "device": f"nvidia{i}", "modelName": "NVIDIA H200", host: "node-1"} for i in range(2)]
    assert fams["gpuforge_gpus"].samples[0].value == 2


def test_info_metric_carries_the_target(monkeypatch, tmp_path):
    t = tmp_path / "target.json"
    t.write_text('{"id": "pt271-x", "torch": "2.7.1+cu126", "cuda": "12.6"}')
    monkeypatch.setenv("GPUFORGE_TARGET_JSON", str(t))
    fams = {f.name: f for f in text_string_to_metric_families(_text())}
    info = (fams.get("gpuforge_image_info") or fams["gpuforge_image"]).samples[0].labels
    assert info["target"] == "pt271-x" and info["torch"] == "2.7.1+cu126" and info["driver"] == "580.159.04"


def test_without_nvml_it_serves_up_0_and_no_gpu(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails as on a machine without nvidia-ml-py or a driver
    fams = {f.name: f for f in text_string_to_metric_families(_text(readings=False))}
    assert fams["gpuforge_metrics_up"].samples[0].value == 0 and fams["gpuforge_gpus"].samples[0].value == 0
    assert not any(n.startswith("DCGM_") for n in fams)


def test_bad_port_is_one_line():
    r = subprocess.run([sys.executable, str(PROG), "--port", "70000"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 64 and r.stderr.count("\n") == 1 and "not in 1-65535" in r.stderr


class _Mem:
    def __init__(self, **kw):
        self.__dict__.update(kw)


class _NvmlV2:
    """The two NVML memory calls as a driver with the v2 call answers them (bytes)."""

    nvmlMemory_v2 = 0x02000028

    def nvmlDeviceGetMemoryInfo(self, h, version=None):
        if version == self.nvmlMemory_v2:
            return _Mem(total=1000 << 20, reserved=615 << 20, used=100 << 20, free=285 << 20)
        return _Mem(total=1000 << 20, used=715 << 20, free=285 << 20)  # v1: reserved counted as used


class _NvmlV1(_NvmlV2):
    def nvmlDeviceGetMemoryInfo(self, h, version=None):
        if version is not None:
            msg = "NVML_ERROR_FUNCTION_NOT_FOUND"
            raise RuntimeError(msg)
        return super().nvmlDeviceGetMemoryInfo(h)


def test_fb_used_leaves_out_the_reserved_memory():
    assert metrics.memory(_NvmlV2(), None) == {"fb_free": 285, "fb_used": 100, "fb_reserved": 615}


def test_fb_without_the_v2_call_is_v1s_and_no_reserved_series():
    assert metrics.memory(_NvmlV1(), None) == {"fb_free": 285, "fb_used": 715}
