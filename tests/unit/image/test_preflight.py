"""The image's preflight on recorded inputs: nvidia-smi outputs, NVML errors, GPU-less containers, compat libs."""

from __future__ import annotations

import json

import pytest

from gpuforge.image import hostinfo, preflight
from gpuforge.image.hostinfo import Gpu, HostGpus

EXPECTED = {"torch": "2.7.1+cu126", "cuda": "12.6", "arch_list": ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"],
            "ptx": []}
H200 = Gpu(index=0, name="NVIDIA H200", capability="9.0", memory_mib=143771)

# Recorded `nvidia-smi --query-gpu=index,name,compute_cap,memory.total,driver_version --format=csv,noheader,nounits`
SMI_H200 = "0, NVIDIA H200, 9.0, 143771, 580.159.04\n"
SMI_MIG_NA = "0, NVIDIA A100-SXM4-40GB, 8.0, [N/A], 535.104.05\n1, NVIDIA A100-SXM4-40GB, [N/A], [N/A], 535.104.05\n"
SMI_OLD_DRIVER = "0, Tesla T4, [Not Supported], 15109, 470.82.01\n"  # old drivers know no compute_cap field


def test_parse_smi_h200():
    h = hostinfo.parse_smi(SMI_H200)
    assert h.driver == "580.159.04" and h.gpus == (H200,) and h.source == "nvidia-smi"


def test_parse_smi_na_fields_are_unknown_not_a_crash():
    h = hostinfo.parse_smi(SMI_MIG_NA)
    assert [g.capability for g in h.gpus] == ["8.0", ""] and [g.memory_mib for g in h.gpus] == [0, 0]
    assert "GPU 1: compute capability [N/A]" in h.detail
    old = hostinfo.parse_smi(SMI_OLD_DRIVER)
    assert old.driver == "470.82.01" and old.gpus[0].capability == ""


def test_parse_smi_garbage():
    assert hostinfo.parse_smi("").driver is None
    h = hostinfo.parse_smi("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")
    assert h.driver is None and "unreadable line" in h.detail


def test_unknown_capability_is_a_warning_not_an_arch_failure():
    host = HostGpus(driver="580.159.04", source="nvidia-smi", gpus=(Gpu(index=0, name="GPU 0", capability="", memory_mib=0),))
    state, msgs = preflight.check(EXPECTED, host)
    assert state == "ok" and "compute capability unknown" in msgs[1]
    code, lines = preflight.decide(state, msgs, {})
    assert code == 0 and lines == ["gpuforge: warning: GPU 0 GPU 0: compute capability unknown; arch support not checked"]


class FakeNVML:
    """pynvml's surface as hostinfo uses it, answering from a recorded table; `fail` maps call -> error text."""

    NVML_BRAND_TESLA = 2

    class NVMLError(Exception):
        pass

    def __init__(self, gpus, fail=None):
        self.gpus, self.fail, self.shut = gpus, fail or {}, False

    def _maybe(self, call, i=None):
        err = self.fail.get((call, i)) or self.fail.get(call)
        if err:
            raise self.NVMLError(err)

    def nvmlInit(self):
        self._maybe("init")

    def nvmlShutdown(self):
        self.shut = True

    def nvmlSystemGetDriverVersion(self):
        return b"580.159.04"

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):
        self._maybe("handle", i)
        return i

    def nvmlDeviceGetName(self, h):
        return self.gpus[h][0]

    def nvmlDeviceGetCudaComputeCapability(self, h):
        self._maybe("cc", h)
        return self.gpus[h][1]

    def nvmlDeviceGetMemoryInfo(self, h):
        class M:
            total = 143771 * 1024 * 1024
        return M()

    def nvmlDeviceGetBrand(self, h):
        self._maybe("brand", h)
        return 2


def test_nvml_probe_reads_every_gpu():
    fake = FakeNVML([("NVIDIA H200", (9, 0)), ("NVIDIA H200", (9, 0))])
    h = hostinfo.nvml_probe(fake)
    assert h.driver == "580.159.04" and len(h.gpus) == 2 and h.gpus[1].brand == "Tesla" and fake.shut


def test_nvml_error_on_one_device_keeps_the_others():
    """GPU_IS_LOST / Unknown Error on one device (recorded messages) used to crash the entrypoint in every mode."""
    fake = FakeNVML([("NVIDIA H200", (9, 0)), ("NVIDIA H200", (9, 0))], fail={("handle", 1): "GPU is lost"})
    h = hostinfo.nvml_probe(fake)
    assert [g.capability for g in h.gpus] == ["9.0", ""] and "GPU 1: GPU is lost" in h.detail and fake.shut
    state, _ = preflight.check(EXPECTED, h)
    assert state == "ok"


def test_nvml_error_in_capability_and_brand():
    h = hostinfo.nvml_probe(FakeNVML([("NVIDIA H200", (9, 0))], fail={("cc", 0): "Unknown Error", ("brand", 0): "Not Supported"}))
    assert h.gpus[0].capability == "" and "Unknown Error" in h.detail


def test_nvml_init_failure_falls_through():
    h = hostinfo.nvml_probe(FakeNVML([], fail={"init": "Driver Not Loaded"}))
    assert h.driver is None and h.detail == "NVML: Driver Not Loaded"


def test_detect_survives_a_probe_that_raises(monkeypatch):
    def boom():
        msg = "libnvidia-ml.so.1: cannot open shared object file"
        raise RuntimeError(msg)

    monkeypatch.setattr(hostinfo, "_nvml", boom)
    monkeypatch.setattr(hostinfo, "_smi", lambda: hostinfo.parse_smi(SMI_H200))
    h = hostinfo.detect()
    assert h.driver == "580.159.04" and "RuntimeError: libnvidia-ml.so.1" in h.detail


def test_parse_proc_version():
    text = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (dvs-builder@U16)\n"
    assert hostinfo.parse_proc(text) == "580.159.04"


# --- driver visible, no GPU device: never a silent ok ------------------------------------------------------

@pytest.mark.parametrize(("nvd", "nodes", "want"), [
    ("void", (), "NVIDIA_VISIBLE_DEVICES=void: the container runtime was told to pass no GPU"),
    ("none", (), "NVIDIA_VISIBLE_DEVICES=none"),
    (None, (), "no /dev/nvidiaN device node: the container was started without a GPU request"),
    ("all", ("/dev/nvidia0",), "1 GPU device node(s) (/dev/nvidia0) but neither NVML nor nvidia-smi could list them"),
])
def test_driver_visible_but_no_device(nvd, nodes, want):
    host = HostGpus(driver="580.159.04", source="proc", visible_devices=nvd, device_nodes=nodes)
    state, msgs = preflight.check(EXPECTED, host)
    assert state == "no-device" and want in msgs[0]
    code, lines = preflight.decide(state, msgs, {})
    assert code == 0 and lines[0].startswith("gpuforge: warning: NVIDIA driver 580.159.04 visible but no GPU")
    code, lines = preflight.decide(state, msgs, {"GPUFORGE_REQUIRE_GPU": "1"})
    assert code == preflight.EXIT_INCOMPATIBLE and lines[0].startswith("gpuforge: error:")


def test_cdi_void_with_devices_is_ok():
    """CDI specs set NVIDIA_VISIBLE_DEVICES=void (so the legacy hook stays out) and inject the devices themselves."""
    host = HostGpus(driver="580.159.04", source="nvml", gpus=(H200,), visible_devices="void", device_nodes=("/dev/nvidia0",))
    assert preflight.check(EXPECTED, host)[0] == "ok"


def test_compat_libcuda_on_geforce_is_error_804():
    rtx = Gpu(index=0, name="NVIDIA GeForce RTX 4090", capability="8.9", memory_mib=24564)
    for driver in ("535.104.05", "580.159.04"):
        host = HostGpus(driver=driver, source="nvml", gpus=(rtx,), compat_package=True, compat_dir="/usr/local/cuda-12.6/compat")
        state, msgs = preflight.check(EXPECTED, host)
        assert state == "incompatible" and "error 804" in msgs[0] and "ld.so.conf.d" in msgs[0]


def test_unknown_cuda_minor_is_an_error_not_a_traceback():
    host = HostGpus(driver="580.159.04", source="nvml", gpus=(H200,))
    state, msgs = preflight.check({**EXPECTED, "cuda": "12.7"}, host)
    assert state == "unknown" and "no driver minimum is known for CUDA 12.7" in msgs[0]
    code, lines = preflight.decide(state, msgs, {})
    assert code == 70 and lines[-1] == "gpuforge: set GPUFORGE_SKIP_DRIVER_CHECK=1 to start anyway"


# --- main(): what the entrypoint runs -----------------------------------------------------------------------

def _main(tmp_path, capsys, host, env=None, expected=EXPECTED):
    t = tmp_path / "target.json"
    t.write_text(json.dumps(expected))
    detect = host if callable(host) else (lambda: host)
    code = preflight.main(["--target", str(t)], detect=detect, env=env or {})
    return code, capsys.readouterr().err


def test_main_exit_70_for_an_old_driver(tmp_path, capsys):
    code, err = _main(tmp_path, capsys, hostinfo.parse_smi("0, Tesla T4, 7.5, 15109, 470.82.01\n"))
    assert code == 70 and "driver 470.82.01 cannot run CUDA 12.6" in err and "GPUFORGE_SKIP_DRIVER_CHECK=1" in err
    code, err = _main(tmp_path, capsys, hostinfo.parse_smi("0, Tesla T4, 7.5, 15109, 470.82.01\n"),
                      env={"GPUFORGE_SKIP_DRIVER_CHECK": "1"})
    assert code == 0 and "starting anyway" in err


def test_main_ok_is_silent(tmp_path, capsys):
    assert _main(tmp_path, capsys, hostinfo.parse_smi(SMI_H200)) == (0, "")


def test_main_unknown_cuda(tmp_path, capsys):
    code, err = _main(tmp_path, capsys, hostinfo.parse_smi(SMI_H200), expected={**EXPECTED, "cuda": "12.7"})
    assert code == 70 and "Traceback" not in err and "cannot judge driver 580.159.04" in err


def test_main_never_dies_of_a_broken_probe(tmp_path, capsys):
    def boom():
        msg = "Input/output error"
        raise OSError(msg)

    code, err = _main(tmp_path, capsys, boom)
    assert code == 0 and "the driver check itself failed (OSError: Input/output error)" in err


def test_device_nodes(tmp_path):
    for n in ("nvidia10", "nvidia2", "nvidiactl", "nvidia-uvm", "nvidia0"):
        (tmp_path / n).touch()
    assert hostinfo.device_nodes(tmp_path) == tuple(str(tmp_path / n) for n in ("nvidia0", "nvidia2", "nvidia10"))
