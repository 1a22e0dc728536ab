"""Compat knowledge: refusals, driver verdicts from NVIDIA's published minimums, GPU arch support."""

from __future__ import annotations

import dataclasses

import pytest

from gpuforge.image import compat
from gpuforge.image.hostinfo import Gpu, HostGpus
from gpuforge.image.preflight import check

TEMPLATE = "nvidia/cuda:{cuda_full}-{cudnn_tag}-{flavor}-{os}"


def _problems(**kw):
    args = {"torch": "2.7.1", "cuda": "12.6", "python": "3.12", "os_name": "ubuntu24.04", "source": "cuda-base",
            "flavor": "runtime", "cuda_base_template": TEMPLATE, **kw}
    return compat.problems(**args)


def test_valid_combination_has_no_problems():
    assert _problems() == []


@pytest.mark.parametrize(("kw", "msg"), [
    ({"cuda": "12.4"}, "torch 2.7.1 publishes no CUDA 12.4 variant (allowed: 11.8, 12.6, 12.8)"),
    ({"python": "3.12", "os_name": "debian12", "source": "wheels"}, "debian12 ships python 3.11, not 3.12"),
    ({"python": "3.14"}, "torch 2.7.1 does not support python 3.14"),
    ({"os_name": "debian12", "python": "3.11"}, "nvidia/cuda:12.6.3-cudnn-runtime-debian12 does not exist"),
    ({"cuda": "11.8", "os_name": "ubuntu24.04"}, "nvidia/cuda:11.8.0-cudnn8-runtime-ubuntu24.04 does not exist"),
    ({"torch": "2.8.0"}, "torch 2.8.0 is not a known release"),
])
def test_refusals(kw, msg):
    assert any(msg in p for p in _problems(**kw)), _problems(**kw)


def test_a_variant_without_toolkit_wheels_builds_no_devel_image_from_wheels(monkeypatch):
    real = compat.variant
    monkeypatch.setattr(compat, "variant", lambda torch, cuda: dataclasses.replace(real(torch, cuda), toolkit_wheels=()))
    assert _problems(cuda="11.8", os_name="debian12", python="3.11", source="wheels", flavor="devel") == [
        "no CUDA toolkit wheels are known for torch 2.7.1 cu118, so a devel image cannot be built from wheels "
        "(use source: cuda-base)"]
    assert _problems(cuda="11.8", os_name="debian12", python="3.11", source="wheels", flavor="runtime") == []


def test_variant_pins_are_the_verified_ones():
    v = compat.variant("2.7.1", "12.6")
    assert (v.cudnn, v.nccl, v.triton, v.torchvision, v.torchaudio) == ("9.5.1.17", "2.26.2", "3.3.1", "0.22.1", "2.7.1")
    assert v.nvidia_pins["nvidia-cublas-cu12"] == "12.6.4.1"
    assert v.on_pypi and not compat.variant("2.7.1", "12.8").on_pypi
    assert compat.variant("2.7.0", "12.6").triton == "3.3.0"
    # a devel image from wheels: the toolkit of the runtime wheel's own CUDA release
    assert v.toolkit_wheels == ("nvidia-cuda-nvcc-cu12==12.6.77", "nvidia-cuda-cccl-cu12==12.6.77")
    assert v.cuda_headers in v.toolkit_wheels
    assert _problems(os_name="debian12", python="3.11", source="wheels", flavor="devel") == []


@pytest.mark.parametrize("torch", ["2.7.0", "2.7.1"])
def test_every_cuda_variant_builds_a_devel_image_from_wheels(torch):
    """Each variant's toolkit is NVIDIA's nvcc and cccl wheels of its own CUDA major, the nvcc one the very wheel a
    runtime image takes its crt headers from (11.8: CCCL's one release is 11.8.89.post1)."""
    for cuda in compat.cuda_variants(torch):
        v = compat.variant(torch, cuda)
        major = cuda.split(".")[0]
        assert [w.split("==")[0] for w in v.toolkit_wheels] == [f"nvidia-cuda-nvcc-cu{major}", f"nvidia-cuda-cccl-cu{major}"]
        assert v.cuda_headers == v.toolkit_wheels[0] and v.toolkit_wheels[0].split("==")[1].startswith(cuda + ".")
        assert _problems(torch=torch, cuda=cuda, os_name="debian12", python="3.11", source="wheels", flavor="devel") == []
    assert compat.variant(torch, "11.8").toolkit_wheels == ("nvidia-cuda-nvcc-cu11==11.8.89",
                                                            "nvidia-cuda-cccl-cu11==11.8.89.post1")


# (driver, CUDA) -> verdict; minimums from NVIDIA's CUDA release notes (Table 3) and the
# minor-version compatibility floors (525.60.13 for 12.x, 450.80.02 for 11.x, 580.65.06 for 13.x).
VERDICTS = [
    ("580.159.04", "12.6", "full"),       # the test H200
    ("580.159.04", "13.0", "full"),
    ("560.28.03", "12.6", "full"),        # exactly the 12.6 GA minimum
    ("560.28.02", "12.6", "minor-version"),
    ("550.54.14", "12.6", "minor-version"),
    ("535.104.05", "12.8", "minor-version"),
    ("570.26", "12.8", "full"),
    ("570.124.06", "12.8", "full"),
    ("570.124.06", "12.9", "minor-version"),
    ("525.60.13", "12.8", "minor-version"),  # the 12.x floor
    ("525.60.12", "12.0", "incompatible"),
    ("520.61.05", "11.8", "full"),
    ("470.82.01", "11.8", "minor-version"),
    ("450.80.02", "11.8", "minor-version"),
    ("450.80.01", "11.8", "incompatible"),
    ("470.82.01", "12.6", "incompatible"),
    ("575.51.03", "13.0", "incompatible"),
]


@pytest.mark.parametrize(("driver", "cuda", "kind"), VERDICTS)
def test_driver_verdicts(driver, cuda, kind):
    assert compat.driver_verdict(driver, cuda).kind == kind


def test_incompatible_verdict_names_the_needed_driver():
    v = compat.driver_verdict("470.82.01", "12.6")
    assert not v.ok
    assert "needs >= 525.60.13" in v.message and ">= 560.28.03 for full support" in v.message


def test_minor_version_verdict_states_its_limits():
    v = compat.driver_verdict("550.54.14", "12.6")
    assert v.ok and any("PTX" in lim for lim in v.limits)


def test_forward_compat_needs_datacenter_gpu_and_package():
    assert compat.driver_verdict("535.104.05", "12.6", datacenter=True, compat_package=True).kind == "forward"
    assert compat.driver_verdict("470.82.01", "12.6", datacenter=True, compat_package=True).kind == "incompatible"


@pytest.mark.parametrize("bad", ["580", "abc", "580.x.1", ""])
def test_bad_driver_strings(bad):
    with pytest.raises(ValueError, match="not an NVIDIA driver version"):
        compat.driver_verdict(bad, "12.6")


@pytest.mark.parametrize(("cap", "cuda", "ok"), [
    ("9.0", "12.6", True), ("8.9", "12.6", True),  # sm_89 runs sm_86 cubins
    ("12.0", "12.6", False), ("12.0", "12.8", True), ("10.0", "12.8", True),
    ("7.0", "12.8", False), ("7.0", "12.6", True), ("6.1", "12.6", True), ("12.1", "12.8", True),  # PTX compute_120
])
def test_arch_support(cap, cuda, ok):
    v = compat.variant("2.7.1", cuda)
    assert compat.arch_supported(cap, v.arch_list, v.ptx) is ok


def test_blackwell_on_cu126_suggests_cu128():
    assert compat.variants_supporting("2.7.1", "12.0") == ["cu128"]


def _expected(cuda="12.6"):
    v = compat.variant("2.7.1", cuda)
    return {"torch": v.torch_local_version, "cuda": v.cuda, "arch_list": list(v.arch_list), "ptx": list(v.ptx)}


def test_preflight_no_gpu_is_a_warning():
    state, msgs = check(_expected(), HostGpus(driver=None, source="none", detail="NVML: not found"))
    assert state == "no-gpu" and "no NVIDIA driver visible" in msgs[0]


H200 = (Gpu(index=0, name="NVIDIA H200", capability="9.0", memory_mib=143771),)


def test_preflight_incompatible_driver():
    state, msgs = check(_expected(), HostGpus(driver="470.82.01", source="nvml", gpus=H200))
    assert state == "incompatible" and "cannot run CUDA 12.6" in msgs[0]


def test_preflight_blackwell_gpu_on_cu126_image():
    host = HostGpus(driver="580.159.04", source="nvml", gpus=(Gpu(index=0, name="RTX 5090", capability="12.0", memory_mib=32000),))
    state, msgs = check(_expected(), host)
    assert state == "incompatible" and "use cu128" in msgs[-1]


def test_preflight_h200_ok():
    host = HostGpus(driver="580.159.04", source="nvml", gpus=(Gpu(index=0, name="NVIDIA H200", capability="9.0", memory_mib=143771),))
    assert check(_expected(), host)[0] == "ok"


def test_forward_compat_on_a_datacenter_gpu_with_cuda_compat():
    from gpuforge.image.preflight import verdict_for

    gpus = (Gpu(index=0, name="NVIDIA H100 80GB HBM3", capability="9.0", memory_mib=81559),)
    host = HostGpus(driver="535.104.05", source="nvml", gpus=gpus, compat_package=True)
    assert verdict_for(_expected("12.8"), host).kind == "forward"
    consumer = HostGpus(driver="535.104.05", source="nvml", compat_package=True,
                        gpus=(Gpu(index=0, name="NVIDIA GeForce RTX 4090", capability="8.9", memory_mib=24564),))
    v = verdict_for(_expected("12.8"), consumer)  # GeForce + compat libcuda: CUDA fails with 804
    assert v.kind == "incompatible" and "error 804" in v.message
    assert verdict_for(_expected("12.8"), dataclasses.replace(consumer, compat_package=False)).kind == "minor-version"
    assert compat.datacenter_gpu("Tesla T4") and compat.datacenter_gpu("X", brand="Tesla")
    assert not compat.datacenter_gpu("NVIDIA GeForce RTX 5090")


def test_compat_package_detection(tmp_path):
    from gpuforge.image import hostinfo

    d = tmp_path / "cuda-12.8" / "compat"
    d.mkdir(parents=True)
    env = {"LD_LIBRARY_PATH": f"/usr/lib:{d}"}
    none = tmp_path / "none"
    assert not hostinfo.find_compat_package(env, none, none)
    (d / "libcuda.so.1").write_bytes(b"\x7fELF")
    assert hostinfo.find_compat_package(env, none, none) == str(d)


def test_compat_package_found_through_ld_so_conf_d(tmp_path):
    """NVIDIA's container toolkit hook and cuda-compat's postinst register the folder with the loader."""
    from gpuforge.image import hostinfo

    d = tmp_path / "usr/local/cuda-12.8/compat"
    d.mkdir(parents=True)
    (d / "libcuda.so.1").write_bytes(b"\x7fELF")
    conf_d = tmp_path / "ld.so.conf.d"
    conf_d.mkdir()
    (conf_d / "00-compat-12-8.conf").write_text(f"# cuda-compat\n{d}\n")
    assert hostinfo.find_compat_package({}, tmp_path / "ld.so.conf", conf_d) == str(d)
    (conf_d / "00-compat-12-8.conf").write_text(f"# {d}\n")  # commented out: not loaded
    assert not hostinfo.find_compat_package({}, tmp_path / "ld.so.conf", conf_d)


@pytest.mark.parametrize(("name", "model", "floor"), [
    ("NVIDIA H200", "H200", 180), ("NVIDIA H100 80GB HBM3", "H100", 180), ("NVIDIA H100 PCIe", "H100 PCIe", 20),
    ("NVIDIA A100-SXM4-80GB", "A100", 120), ("NVIDIA A100 80GB PCIe", "A100 PCIe", 10), ("NVIDIA L4", "L4", 10),
    ("NVIDIA L40S", "L40S", 10), ("NVIDIA H200 NVL", "H200 NVL", 120),
])
def test_busbw_floor_per_model(name, model, floor):
    assert compat.busbw_floor(name) == (model, floor)


def test_busbw_floor_unknown_model():
    assert compat.busbw_floor("NVIDIA GeForce RTX 4090") is None


def test_smoke_thresholds_hold_the_documented_bars():
    t = compat.smoke_thresholds()
    assert t["compile_cache_min_speedup"] >= 3 and t["fusion_min_ratio"] == 0.85
    assert t["matmul_rel_err"]["fp32"] < t["matmul_rel_err"]["tf32"] < t["matmul_rel_err"]["bf16"]
