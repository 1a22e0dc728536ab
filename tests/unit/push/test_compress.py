"""zstd pushes: refused, in one line, where the builder cannot export zstd layers (no engine needed)."""

from __future__ import annotations

from gpuforge.engine.client import EngineInfo
from gpuforge.push import compress
from gpuforge.state.models import BuildRecord

BUILDX = {"image_id": "sha256:" + "a" * 64, "driver": "buildx", "argv": ["docker", "buildx", "build", "--load", "."]}


def test_graphdriver_engine_is_refused_naming_what_can():
    why = compress.refusal(BuildRecord(**BUILDX), EngineInfo(version="20.10.24+dfsg1", store="overlay2"))
    assert why and "engine 20.10.24+dfsg1, image store overlay2" in why and "containerd-snapshotter" in why
    assert "\n" not in why


def test_containerd_store_or_a_builder_can():
    assert compress.refusal(BuildRecord(**BUILDX), EngineInfo(version="26.1.5", store="containerd/overlayfs")) is None
    rec = {**BUILDX, "argv": ["docker", "buildx", "build", "--load", "--builder", "remote", "."]}
    assert compress.refusal(BuildRecord(**rec), EngineInfo(version="20.10.24", store="overlay2")) is None


def test_a_classic_build_cannot_be_exported_again():
    rec = {**BUILDX, "driver": "classic", "argv": ["docker", "build", "."]}
    assert "classic driver" in compress.refusal(BuildRecord(**rec), EngineInfo(version="26.1.5", store="containerd/overlayfs"))


def test_same_content_compares_layers_and_runtime_config():
    local = {"RootFS": {"Layers": ["sha256:1", "sha256:2"]}, "Config": {"Env": ["A=1"], "User": "1000", "Hostname": "x"}}
    same = {"rootfs": {"diff_ids": ["sha256:1", "sha256:2"]}, "config": {"Env": ["A=1"], "User": "1000"}}
    assert compress._same_content(local, same) is None
    assert "layers" in compress._same_content(local, {**same, "rootfs": {"diff_ids": ["sha256:1"]}})
    assert "User" in compress._same_content(local, {**same, "config": {"Env": ["A=1"], "User": "0"}})
