"""versions: what is really installed, read on the host, equal to what the target says; every nvidia-*
wheel at the version the host-side constraints pin."""

from __future__ import annotations

import json
import re

import pytest

from vutil import sh

CUDA_WHEEL = re.compile(r"^nvidia-.+-cu\d+$")  # NVIDIA's CUDA library wheels (not nvidia-ml-py)


@pytest.fixture(scope="module")
def found(runtime_versions):
    return runtime_versions


def _cudnn(n: int) -> str:
    # torch.backends.cudnn.version(): 90501 -> 9.5.1 (major*10000 + minor*100 + patch for cuDNN >= 9)
    return f"{n // 10000}.{n // 100 % 100}.{n % 100}"


def test_torch(found, target):
    assert found["torch"] == target.torch


def test_cuda(found, target):
    assert found["cuda"] == target.cuda


def test_cudnn(found, target):
    want = ".".join(str(target.cudnn).split(".")[:3])
    assert _cudnn(found["cudnn"]) == want, f"cuDNN {_cudnn(found['cudnn'])}, target says {target.cudnn}"


def test_nccl(found, target):
    assert found["nccl"] == target.nccl


def test_triton(found, target):
    assert found["triton"] == target.triton


def test_torchvision(found, target):
    assert found["torchvision"].split("+")[0] == target.torchvision


def test_torchaudio(found, target):
    assert found["torchaudio"].split("+")[0] == target.torchaudio, f"torchaudio: {found['torchaudio']}"


def test_python(found, target):
    assert found["python"] == target.python


def test_nvidia_wheels_match_the_constraints(host, constraints, facts, timeout):
    """Each installed nvidia-*-cuXX wheel is pinned by the target's constraints, at exactly that version."""
    pip = json.loads(sh(host, "python3 -m pip list --format json 2>/dev/null", timeout=timeout).stdout)
    names = {p["name"].lower().replace("_", "-"): p["version"] for p in pip}
    installed = {k: v for k, v in names.items() if CUDA_WHEEL.match(k)}
    facts["nvidia_wheels"] = installed
    pinned = {k: v for k, v in constraints.items() if CUDA_WHEEL.match(k)}
    assert pinned, "the target's constraints pin no nvidia-* wheel"
    differ = {k: (v, pinned.get(k, "unpinned")) for k, v in installed.items() if pinned.get(k) != v}
    assert not differ, f"nvidia-* wheels differ from the constraints (wheel: (installed, pinned)): {differ}"


def test_pip_check_clean(host, timeout):
    r = sh(host, "python3 -m pip check", timeout=timeout, check=False)
    assert r.rc == 0, f"pip check found broken requirements:\n{r.stdout[-2000:]}"


def test_no_pip_cache_or_apt_lists(root_host, image, timeout):
    r = sh(root_host, "find /root/.cache/pip /home/*/.cache/pip /var/lib/apt/lists /var/cache/apt/archives "
           "-type f ! -name lock 2>/dev/null | head -20", timeout=timeout, check=False)
    left = r.stdout.split()
    assert not left, f"caches left in the image: {left}"
