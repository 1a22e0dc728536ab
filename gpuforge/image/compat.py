"""Version-compatibility knowledge: pure functions over gpuforge/image/data/compat.yaml.

This module is the only reader of the data file; everything else asks it.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import yaml
from packaging.version import InvalidVersion, Version


@functools.cache
def data() -> dict[str, Any]:
    text = resources.files("gpuforge.image").joinpath("data/compat.yaml").read_text()
    loaded: dict[str, Any] = yaml.safe_load(text)  # the packaged compat.yaml: a mapping
    return loaded


@dataclass(frozen=True, kw_only=True)
class Variant:
    """One published torch build: torch release x CUDA variant, with everything it pins."""

    torch: str
    name: str  # e.g. cu126
    cuda: str
    status: str
    cudnn: str
    nccl: str
    triton: str
    torchvision: str
    torchaudio: str
    index_url: str
    on_pypi: bool  # the variant PyPI's plain `torch` wheel is
    arch_list: tuple[str, ...]
    ptx: tuple[str, ...]
    nvidia_pins: dict[str, Any] = field(hash=False, compare=False)
    pythons: tuple[str, ...]
    unconfirmed: bool = False
    cuda_headers: str | None = None  # the nvcc wheel (name==version) whose crt/ headers a runtime CUDA_HOME takes
    toolkit_wheels: tuple[str, ...] = ()  # name==version: what a devel image built from wheels adds (ptxas, NVVM, CCCL)

    @property
    def torch_local_version(self) -> str:
        return f"{self.torch}+{self.name}"


def torch_releases() -> list[str]:
    return sorted(data()["torch"], key=Version)


def cuda_variant_name(cuda: str) -> str:
    return "cu" + cuda.replace(".", "")


def variant(torch: str, cuda: str) -> Variant | None:
    rel = data()["torch"].get(torch)
    if rel is None:
        return None
    name = cuda_variant_name(cuda)
    v = rel["variants"].get(name)
    if v is None:
        return None
    return Variant(
        torch=torch,
        name=name,
        cuda=v["cuda"],
        status=v["status"],
        cudnn=v["cudnn"],
        nccl=v["nccl"],
        triton=rel["triton"],
        torchvision=rel["torchvision"],
        torchaudio=rel["torchaudio"],
        index_url=v["index_url"],
        on_pypi=rel["pypi_default_variant"] == name,
        arch_list=tuple(v["arch_list"]),
        ptx=tuple(v.get("ptx", [])),
        nvidia_pins=dict(v["nvidia_pins"]),
        pythons=tuple(rel["python"]),
        unconfirmed=bool(v.get("unconfirmed", False)),
        cuda_headers=v.get("cuda_headers"),
        toolkit_wheels=tuple(v.get("toolkit_wheels", ())),
    )


def cuda_variants(torch: str) -> list[str]:
    rel = data()["torch"].get(torch, {})
    return sorted((v["cuda"] for v in rel.get("variants", {}).values()), key=Version)


def os_names() -> list[str]:
    return sorted(data()["os"])


def os_info(os_name: str) -> dict[str, Any] | None:
    info: dict[str, Any] | None = data()["os"].get(os_name)
    return info


def cuda_image(cuda: str, flavor: str, os_name: str, template: str) -> tuple[str | None, str | None]:
    """(image reference, None) for an nvidia/cuda base that exists, or (None, why not)."""
    img = data()["cuda_images"].get(cuda)
    if img is None:
        known = ", ".join(sorted(data()["cuda_images"], key=Version))
        return None, f"no nvidia/cuda base image is known for CUDA {cuda} (known: {known})"
    if os_name not in img["os"]:
        return None, (
            f"nvidia/cuda:{img['full']}-{img['cudnn_tag']}-{flavor}-{os_name} does not exist "
            f"(CUDA {cuda} cuDNN images exist for: {', '.join(img['os'])}); use source: wheels for {os_name}"
        )
    ref = template.format(cuda_full=img["full"], cudnn_tag=img["cudnn_tag"], flavor=flavor, os=os_name)
    return ref, None


def problems(*, torch: str, cuda: str, python: str, os_name: str, source: str, flavor: str,
             cuda_base_template: str) -> list[str]:
    """Why a combination cannot be built; an empty list means it can."""
    out: list[str] = []
    if torch not in data()["torch"]:
        out.append(f"torch {torch} is not a known release (allowed: {', '.join(torch_releases())})")
        return out
    v = variant(torch, cuda)
    if v is None:
        out.append(
            f"torch {torch} publishes no CUDA {cuda} variant (allowed: {', '.join(cuda_variants(torch))})"
        )
        return out
    if python not in v.pythons:
        out.append(f"torch {torch} does not support python {python} (allowed: {', '.join(v.pythons)})")
    osi = os_info(os_name)
    if osi is None:
        out.append(f"unknown os {os_name!r} (allowed: {', '.join(os_names())})")
        return out
    if python != osi["python"]:
        out.append(
            f"{os_name} ships python {osi['python']}, not {python} (images use the OS's system Python; "
            f"use python {osi['python']} or an OS that ships {python})"
        )
    if source == "cuda-base":
        _, why = cuda_image(cuda, flavor, os_name, cuda_base_template)
        if why:
            out.append(why)
    elif flavor == "devel" and not v.toolkit_wheels:
        out.append(f"no CUDA toolkit wheels are known for torch {torch} {v.name}, so a devel image cannot be built "
                   f"from wheels (use source: cuda-base)")
    return out


# --- driver compatibility ------------------------------------------------------------------------

_DRIVER_RE = re.compile(r"^\d+(\.\d+){1,2}$")


def parse_driver(text: str) -> Version:
    text = text.strip()
    if not _DRIVER_RE.match(text):
        msg = f"not an NVIDIA driver version: {text!r} (expected e.g. 570.124.06)"
        raise ValueError(msg)
    return Version(text)


def min_driver(cuda: str) -> str | None:
    least: str | None = data()["cuda_driver_min"].get(_minor(cuda))
    return least


def _minor(cuda: str) -> str:
    try:
        v = Version(cuda)
    except InvalidVersion:
        msg = f"not a CUDA version: {cuda!r}"
        raise ValueError(msg) from None
    return f"{v.major}.{v.minor}"


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """How (and whether) a host driver runs an image's CUDA."""

    kind: str  # full | minor-version | forward | incompatible
    driver: str
    cuda: str
    full_min: str | None
    minor_min: str | None
    message: str
    limits: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.kind != "incompatible"


def driver_verdict(driver: str, cuda: str, *, datacenter: bool | None = False, compat_package: bool = False) -> Verdict:
    """Decide from the compat data whether driver `driver` runs CUDA `cuda`.

    `datacenter`: whether every GPU may use forward compatibility (None: GPUs unknown).
    A cuda-compat libcuda on a GPU that is not a datacenter part fails every CUDA call with error 804
    (CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE), whatever the driver version.

    >>> driver_verdict("580.159.04", "12.6").kind
    'full'
    >>> driver_verdict("550.54.14", "12.6").kind
    'minor-version'
    """
    d = parse_driver(driver)
    minor = _minor(cuda)
    major = minor.split(".")[0]
    full = data()["cuda_driver_min"].get(minor)
    mvc = data()["minor_version_compat"].get(major, {}).get("min_driver")
    if full is None:
        known = ", ".join(sorted(data()["cuda_driver_min"], key=Version))
        msg = f"no driver minimum is known for CUDA {cuda} (known: {known})"
        raise ValueError(msg)
    common = {"driver": driver, "cuda": minor, "full_min": full, "minor_min": mvc}
    if compat_package and datacenter is False:
        return Verdict(
            kind="incompatible",
            message=(f"a cuda-compat libcuda is loaded but forward compatibility works on datacenter GPUs only: "
                     f"CUDA fails with error 804 (CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE); remove the compat folder "
                     f"from LD_LIBRARY_PATH and /etc/ld.so.conf.d (driver {driver} "
                     f"{'fully supports' if d >= Version(full) else 'needs >= ' + full + ' for'} CUDA {minor})"),
            **common,
        )
    if d >= Version(full):
        return Verdict(kind="full", message=f"driver {driver} fully supports CUDA {minor} (needs >= {full})", **common)
    # A cuda-compat package on a datacenter GPU gives the full feature set, so it wins over minor-version.
    fwd = data()["forward_compat"]
    branch = str(d.major)
    if datacenter and compat_package and branch in fwd["branches"].get(minor, []):
        pkg = fwd["package"].format(major=major, minor=minor.split(".")[1])
        return Verdict(
            kind="forward",
            message=f"driver {driver} runs CUDA {minor} through forward compatibility ({pkg}, datacenter GPU)",
            **common,
        )
    if mvc and d >= Version(mvc):
        limits = tuple(data()["minor_version_limits"])
        return Verdict(
            kind="minor-version",
            message=(f"driver {driver} runs CUDA {minor} through minor-version compatibility only "
                     f"(full support needs >= {full}): {'; '.join(limits)}"),
            limits=limits,
            **common,
        )
    need = mvc or full
    return Verdict(
        kind="incompatible",
        message=(f"driver {driver} cannot run CUDA {minor}: needs >= {need} "
                 f"(>= {full} for full support); update the driver or use an image with an older CUDA"),
        **common,
    )


def gpu_models() -> list[str]:
    """The GPU models whose compute capability the data knows (a fleet pool names one of these)."""
    return sorted(data()["gpu_capability"])


def gpu_capability(model: str) -> str | None:
    """The compute capability of a GPU model ("H200" -> "9.0"), or None for a model the data does not list."""
    capability: str | None = data()["gpu_capability"].get(model)
    return capability


def model_key(name: str, keys: Iterable[str]) -> str | None:
    """The key of `keys` naming the GPU called `name` (an NVML or CUDA device name), or None: every word of the key
    must be a word of the name, and the longest key wins ("H100 PCIe" over "H100", "RTX 5090" needs both words)."""
    words = re.split(r"[\s-]+", name.upper())
    best = None
    for key in keys:
        parts = key.upper().split()
        if all(k in words for k in parts) and (best is None or len(parts) > len(best.split())):
            best = key
    return best


def gpu_model_of(name: str) -> str | None:
    """The compat data's GPU model for an NVML device name ("NVIDIA H200" -> "H200"), or None.

    >>> gpu_model_of("NVIDIA H200"), gpu_model_of("NVIDIA GeForce RTX 5090"), gpu_model_of("NVIDIA H20")
    ('H200', 'RTX 5090', None)
    """
    return model_key(name, data()["gpu_capability"])


def datacenter_gpu(name: str, brand: str = "") -> bool:
    """Whether forward compatibility (cuda-compat) is allowed on this GPU: datacenter parts only."""
    fwd = data()["forward_compat"]
    if brand in fwd["eligible_brands"]:
        return True
    words = re.split(r"[\s-]+", name.upper())
    return any(m.upper() in words for m in fwd["datacenter_models"])


# --- GPU architectures ---------------------------------------------------------------------------

def sm(capability: str) -> str:
    major, minor = capability.split(".")
    return f"sm_{major}{minor}"


def _cc(arch: str) -> tuple[int, int]:
    digits = arch.split("_")[1]
    return int(digits[:-1]), int(digits[-1])


def arch_supported(capability: str, arch_list: tuple[str, ...] | list[str], ptx: tuple[str, ...] | list[str] = ()) -> bool:
    """True when a GPU of `capability` ("9.0") can run a build with these cubins/PTX.

    A cubin runs on GPUs of the same major and an equal or higher minor; PTX JITs forward.

    >>> arch_supported("8.9", ["sm_80", "sm_86"])
    True
    >>> arch_supported("12.0", ["sm_80", "sm_90"])
    False
    """
    want = tuple(int(x) for x in capability.split("."))
    for a in arch_list:
        if a.startswith("sm_"):
            mj, mn = _cc(a)
            if mj == want[0] and mn <= want[1]:
                return True
    return any(_cc(p) <= want for p in ptx if p.startswith("compute_"))


def variants_supporting(torch: str, capability: str) -> list[str]:
    out = []
    for cuda in cuda_variants(torch):
        v = variant(torch, cuda)
        if v and arch_supported(capability, v.arch_list, v.ptx):
            out.append(v.name)
    return out


# --- smoke thresholds (host-side: the validator passes them to the in-image programs) ------------

def smoke_thresholds() -> dict[str, Any]:
    """The bars the GPU smoke suite is held to; the validator reads them here, on the host."""
    return dict(data()["smoke_thresholds"])


def busbw_floor(gpu_name: str) -> tuple[str, float] | None:
    """(model, GB/s) all-reduce bus-bandwidth floor for a GPU by its name, or None for an unlisted model."""
    table = data()["busbw_floor_gbs"]
    model = model_key(gpu_name, table)
    return (model, float(table[model]["floor"])) if model else None
