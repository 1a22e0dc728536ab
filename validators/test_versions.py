"""versions: what is really installed, read on the host, equal to what the target says."""

from __future__ import annotations

import pytest

from vutil import py, sh

PROBE = """
import json, sys, torch, triton
out = {"torch": torch.__version__, "cuda": torch.version.cuda,
       "cudnn": torch.backends.cudnn.version(), "nccl": ".".join(map(str, torch.cuda.nccl.version())),
       "triton": triton.__version__, "python": "%d.%d" % sys.version_info[:2]}
try:
    import torchvision; out["torchvision"] = torchvision.__version__
except Exception as e:
    out["torchvision"] = "import failed: %r" % e
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def found(host, facts, timeout):
    v = py(host, PROBE, timeout=timeout)
    facts["versions"] = v
    return v


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


def test_python(found, target):
    assert found["python"] == target.python


def test_pip_check_clean(host, timeout):
    r = sh(host, "python3 -m pip check", timeout=timeout, check=False)
    assert r.rc == 0, f"pip check found broken requirements:\n{r.stdout[-2000:]}"


def test_no_pip_cache_or_apt_lists(root_host, image, timeout):
    r = sh(root_host, "find /root/.cache/pip /home/*/.cache/pip /var/lib/apt/lists /var/cache/apt/archives "
           "-type f ! -name lock 2>/dev/null | head -20", timeout=timeout, check=False)
    left = r.stdout.split()
    assert not left, f"caches left in the image: {left}"
