"""The entrypoint's preflight in real containers of the default image, fed recorded nvidia-smi outputs through a
fake nvidia-smi on PATH (no GPU here), and the engine's refusal of GPU requests turned into actionable errors.
Cost: about 10 s once the default image is built."""

from __future__ import annotations

import pytest

from gpuforge.engine import containers as run
from gpuforge.errors import EngineError

pytestmark = pytest.mark.docker


def _start(engine, image, smi_line: str, tmp_path, env=None) -> tuple[int, str]:
    fake = tmp_path / "nvidia-smi"
    fake.write_text(f"#!/bin/sh\nprintf '%s\\n' '{smi_line}'\n")
    fake.chmod(0o755)
    c = engine.containers.create(image, ["true"], environment=env or {},
                                 volumes={str(fake): {"bind": "/usr/local/bin/nvidia-smi", "mode": "ro"}})
    try:
        c.start()
        code = c.wait(timeout=120)["StatusCode"]
        return code, c.logs(stdout=True, stderr=True).decode()
    finally:
        c.remove(force=True)


def test_old_driver_exits_70(default_build, docker_engine, tmp_path):
    _, rec = default_build
    code, logs = _start(docker_engine, rec["image_id"], "0, Tesla T4, 7.5, 15109, 470.82.01", tmp_path)
    assert code == 70, logs
    assert "gpuforge: error: driver 470.82.01 cannot run CUDA 12.6" in logs and "GPUFORGE_SKIP_DRIVER_CHECK=1" in logs
    code, logs = _start(docker_engine, rec["image_id"], "0, Tesla T4, 7.5, 15109, 470.82.01", tmp_path,
                        env={"GPUFORGE_SKIP_DRIVER_CHECK": "1"})
    assert code == 0 and "starting anyway" in logs, logs


def test_na_fields_do_not_kill_the_entrypoint(default_build, docker_engine, tmp_path):
    _, rec = default_build
    code, logs = _start(docker_engine, rec["image_id"], "0, NVIDIA H200, [N/A], [N/A], 580.159.04", tmp_path)
    assert code == 0 and "Traceback" not in logs, logs
    assert "compute capability unknown" in logs, logs


def test_gpu_request_without_nvidia_runtime_is_actionable(default_build, docker_engine):
    _, rec = default_build
    with pytest.raises(EngineError, match=r"no NVIDIA container runtime.*install nvidia-container-toolkit.*--gpu-request cdi"), \
            run.container(rec["image_id"], ["true"], gpus=True, gpu_request="nvidia"):
        pass
    # Engine 20.10 here has no CDI driver at all
    with pytest.raises(EngineError, match=r"CDI GPU request: this engine has no CDI support.*features.*cdi"), \
            run.container(rec["image_id"], ["true"], gpus=True, gpu_request="cdi"):
        pass
