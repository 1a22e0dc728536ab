"""What the host's NVIDIA driver and GPUs are: NVML first, then nvidia-smi, then /proc.

Runs on the GPU host and inside images (the entrypoint's preflight); stdlib + optional pynvml only.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

PROC_VERSION = Path("/proc/driver/nvidia/version")


@dataclass(frozen=True, kw_only=True)
class Gpu:
    index: int
    name: str
    capability: str  # "9.0"
    memory_mib: int
    brand: str = ""  # NVML brand (e.g. Tesla), when NVML is there


@dataclass(frozen=True, kw_only=True)
class HostGpus:
    driver: str | None  # None: no NVIDIA driver visible
    source: str  # nvml | nvidia-smi | proc | none
    gpus: tuple[Gpu, ...] = ()
    detail: str = ""
    compat_package: bool = False  # a cuda-compat libcuda is on LD_LIBRARY_PATH (forward compatibility)


def compat_package_loaded() -> bool:
    """cuda-compat installs libcuda under /usr/local/cuda-X.Y/compat and works only when that folder
    is on LD_LIBRARY_PATH (the package does not configure the loader)."""
    for d in os.environ.get("LD_LIBRARY_PATH", "").split(":"):
        if d.rstrip("/").endswith("/compat") and (Path(d) / "libcuda.so.1").exists():
            return True
    return False


def _nvml() -> HostGpus | None:
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        return HostGpus(driver=None, source="none", detail=f"NVML: {e}")
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        driver = driver.decode() if isinstance(driver, bytes) else driver
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            name = name.decode() if isinstance(name, bytes) else name
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(h)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h).total // (1024 * 1024)
            try:
                brand = "Tesla" if pynvml.nvmlDeviceGetBrand(h) == pynvml.NVML_BRAND_TESLA else ""
            except pynvml.NVMLError:
                brand = ""
            gpus.append(Gpu(index=i, name=name, capability=f"{major}.{minor}", memory_mib=int(mem), brand=brand))
        return HostGpus(driver=driver, source="nvml", gpus=tuple(gpus), compat_package=compat_package_loaded())
    finally:
        pynvml.nvmlShutdown()


def _smi() -> HostGpus | None:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    q = "index,name,compute_cap,memory.total,driver_version"
    try:
        out = subprocess.run([exe, f"--query-gpu={q}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
    except (subprocess.SubprocessError, OSError) as e:
        return HostGpus(driver=None, source="none", detail=f"nvidia-smi: {e}")
    gpus, driver = [], None
    for line in out.strip().splitlines():
        idx, name, cap, mem, drv = (x.strip() for x in line.split(","))
        driver = drv
        gpus.append(Gpu(index=int(idx), name=name, capability=cap, memory_mib=int(float(mem))))
    return HostGpus(driver=driver, source="nvidia-smi", gpus=tuple(gpus), compat_package=compat_package_loaded()) if driver else None


def _proc() -> HostGpus | None:
    try:
        text = PROC_VERSION.read_text()
    except OSError:
        return None
    m = re.search(r"Kernel Module(?: for x86_64)?\s+(\d+\.\d+(?:\.\d+)?)", text)
    return HostGpus(driver=m.group(1), source="proc", compat_package=compat_package_loaded()) if m else None


def detect() -> HostGpus:
    notes = []
    for probe in (_nvml, _smi, _proc):
        found = probe()
        if found and found.driver:
            return found
        if found and found.detail:
            notes.append(found.detail)
    return HostGpus(driver=None, source="none", detail="; ".join(notes) or "no NVML, nvidia-smi or /proc/driver/nvidia")
