"""What the host's NVIDIA driver and GPUs are: NVML first, then nvidia-smi, then /proc.

Runs on the GPU host and inside images (the entrypoint's preflight); stdlib + optional pynvml only.
A probe never raises: whatever goes wrong is recorded in `detail`, so the entrypoint can always decide.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

PROC_VERSION = Path("/proc/driver/nvidia/version")
LDCONF = Path("/etc/ld.so.conf")
LDCONF_D = Path("/etc/ld.so.conf.d")
DEV = Path("/dev")
_NODE = re.compile(r"^nvidia(\d+)$")
# nvidia-smi prints these where a field has no value (MIG, vGPU, old drivers).
_SMI_NA = ("[N/A]", "N/A", "[Not Supported]", "[Unknown Error]", "[Insufficient Permissions]")


@dataclass(frozen=True, kw_only=True)
class Gpu:
    index: int
    name: str
    capability: str  # "9.0"; "" when the driver could not say
    memory_mib: int
    brand: str = ""  # NVML brand (e.g. Tesla), when NVML is there


@dataclass(frozen=True, kw_only=True)
class HostGpus:
    driver: str | None  # None: no NVIDIA driver visible
    source: str  # nvml | nvidia-smi | proc | none
    gpus: tuple[Gpu, ...] = ()
    detail: str = ""
    compat_package: bool = False  # a cuda-compat libcuda is what the loader will pick (forward compatibility)
    compat_dir: str = ""  # where that libcuda was found
    device_nodes: tuple[str, ...] = ()  # /dev/nvidiaN present (what a container was given)
    visible_devices: str | None = None  # NVIDIA_VISIBLE_DEVICES as the container runtime saw it


def _ld_conf_dirs(conf: Path = LDCONF, conf_d: Path = LDCONF_D) -> list[str]:
    """Directories the dynamic loader searches through /etc/ld.so.conf and /etc/ld.so.conf.d/*.conf
    (where NVIDIA's container toolkit hook and cuda-compat's postinst put the compat folder)."""
    out: list[str] = []
    files = [conf] + (sorted(conf_d.glob("*.conf")) if conf_d.is_dir() else [])
    for f in files:
        try:
            text = f.read_text(errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            line = line.split("#", 1)[0].strip()
            if line and not line.startswith("include"):
                out.append(line)
    return out


def find_compat_package(env: Mapping[str, str] | None = None, conf: Path = LDCONF, conf_d: Path = LDCONF_D) -> str:
    """The folder of a cuda-compat libcuda (…/cuda-X.Y/compat) the loader will use, or "".

    Found on LD_LIBRARY_PATH or in an ld.so.conf(.d) entry; only a folder that holds libcuda.so.1 counts.
    """
    env = os.environ if env is None else env
    dirs: list[str] = env.get("LD_LIBRARY_PATH", "").split(":") + _ld_conf_dirs(conf, conf_d)
    for d in dirs:
        if d and d.rstrip("/").endswith("/compat") and (Path(d) / "libcuda.so.1").exists():
            return d
    return ""


def compat_package_loaded() -> bool:
    return bool(find_compat_package())


def device_nodes(dev: Path = DEV) -> tuple[str, ...]:
    """The GPU device nodes a process can see (/dev/nvidia0 …): what a container was actually given."""
    try:
        nodes = [(int(m.group(1)), p.name) for p in dev.iterdir() if (m := _NODE.match(p.name))]
    except OSError:
        return ()
    return tuple(str(dev / name) for _, name in sorted(nodes, key=lambda node: node[0]))


def _text(x: object) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def nvml_probe(pynvml: ModuleType) -> HostGpus:  # the pynvml module (no stubs: its calls are Any)
    """Driver and GPUs through NVML. An NVML error on one device records that device as unknown
    instead of losing the others (or crashing the entrypoint)."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        return HostGpus(driver=None, source="none", detail=f"NVML: {e}")
    notes: list[str] = []
    try:
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            try:
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                name = _text(pynvml.nvmlDeviceGetName(h))
                major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(h)
                mem = pynvml.nvmlDeviceGetMemoryInfo(h).total // (1024 * 1024)
            except pynvml.NVMLError as e:
                notes.append(f"NVML: GPU {i}: {e}")
                gpus.append(Gpu(index=i, name=f"GPU {i} (NVML: {e})", capability="", memory_mib=0))
                continue
            try:
                brand = "Tesla" if pynvml.nvmlDeviceGetBrand(h) == pynvml.NVML_BRAND_TESLA else ""
            except pynvml.NVMLError:
                brand = ""
            gpus.append(Gpu(index=i, name=name, capability=f"{major}.{minor}", memory_mib=int(mem), brand=brand))
    except pynvml.NVMLError as e:
        return HostGpus(driver=None, source="none", detail=f"NVML: {e}")
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass
    return HostGpus(driver=driver, source="nvml", gpus=tuple(gpus), detail="; ".join(notes))


def _nvml() -> HostGpus | None:
    try:
        import pynvml
    except ImportError:
        return None
    return nvml_probe(pynvml)


def _smi_field(v: str) -> str:
    v = v.strip()
    return "" if v in _SMI_NA else v


def parse_smi(text: str) -> HostGpus | None:
    """Parse `nvidia-smi --query-gpu=index,name,compute_cap,memory.total,driver_version --format=csv,noheader,nounits`.

    Fields printed as [N/A] (MIG, vGPU, old drivers without compute_cap) become unknown, not a crash.
    """
    gpus, driver, notes = [], None, []
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 5:
            notes.append(f"nvidia-smi: unreadable line {line.strip()[:120]!r}")
            continue
        # A GPU name may itself hold a comma: the first field is the index, the last three are fixed.
        idx, name, cap, mem, drv = parts[0], ",".join(parts[1:-3]), *parts[-3:]
        drv = _smi_field(drv)
        driver = driver or drv or None
        try:
            index = int(idx)
        except ValueError:
            notes.append(f"nvidia-smi: unreadable line {line.strip()[:120]!r}")
            continue
        cap, mem = _smi_field(cap), _smi_field(mem)
        if not cap:
            notes.append(f"nvidia-smi: GPU {index}: compute capability {parts[-3]}")
        try:
            memory = int(float(mem)) if mem else 0
        except ValueError:
            memory = 0
        gpus.append(Gpu(index=index, name=_smi_field(name) or f"GPU {index}", capability=cap, memory_mib=memory))
    if not driver:
        return HostGpus(driver=None, source="none", detail="; ".join(notes) or "nvidia-smi listed no GPU")
    return HostGpus(driver=driver, source="nvidia-smi", gpus=tuple(gpus), detail="; ".join(notes))


def _smi() -> HostGpus | None:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    q = "index,name,compute_cap,memory.total,driver_version"
    try:
        out = subprocess.run([exe, f"--query-gpu={q}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
    except subprocess.CalledProcessError as e:
        return HostGpus(driver=None, source="none", detail=f"nvidia-smi: exit {e.returncode}: {(e.stdout or e.stderr or '').strip()[:300]}")
    except (subprocess.SubprocessError, OSError) as e:
        return HostGpus(driver=None, source="none", detail=f"nvidia-smi: {e}")
    return parse_smi(out)


def parse_proc(text: str) -> str | None:
    m = re.search(r"Kernel Module(?: for x86_64)?\s+(\d+\.\d+(?:\.\d+)?)", text)
    return m.group(1) if m else None


def _proc() -> HostGpus | None:
    try:
        text = PROC_VERSION.read_text()
    except OSError:
        return None
    drv = parse_proc(text)
    return HostGpus(driver=drv, source="proc") if drv else None


def detect() -> HostGpus:
    import dataclasses

    notes = []
    found: HostGpus | None = None
    for probe in (_nvml, _smi, _proc):
        try:
            got = probe()
        except Exception as e:  # a broken driver install must not stop the container from starting
            got = HostGpus(driver=None, source="none", detail=f"{probe.__name__.strip('_')}: {type(e).__name__}: {e}")
        if got and got.detail:
            notes.append(got.detail)
        if got and got.driver:
            found = got
            break
    found = found or HostGpus(driver=None, source="none")
    return dataclasses.replace(
        found,
        detail="; ".join(notes) or ("" if found.driver else "no NVML, nvidia-smi or /proc/driver/nvidia"),
        compat_dir=find_compat_package(), compat_package=bool(find_compat_package()),
        device_nodes=device_nodes(), visible_devices=os.environ.get("NVIDIA_VISIBLE_DEVICES"),
    )
