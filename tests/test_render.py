"""Rendering: deterministic, committed output current, drift detected, Dockerfiles carry what users rely on."""

from __future__ import annotations

import shutil

import pytest

from gpuforge import render
from gpuforge.cli import main
from gpuforge.errors import ConfigError
from gpuforge.matrix import load_matrix

FLEET = load_matrix().targets


def test_rendering_is_deterministic():
    for t in FLEET:
        assert render.render_target(t) == render.render_target(t)


def test_committed_dist_is_current():
    assert render.stale(list(FLEET)) == []


def test_check_names_stale_missing_and_extra_files(tmp_path):
    dist = tmp_path / "dist"
    t = FLEET[0]
    render.write(t, dist)
    assert render.stale([t], dist) == []
    (dist / t.id / "Dockerfile").write_text("FROM scratch\n")
    (dist / t.id / "target.json").unlink()
    (dist / t.id / "leftover.txt").write_text("x")
    (dist / "gone-target").mkdir()
    bad = render.stale([t], dist)
    assert any(b.endswith(f"{t.id}/Dockerfile") for b in bad)
    assert any(b.endswith(f"{t.id}/target.json") for b in bad)
    assert any(b.endswith("leftover.txt") for b in bad)
    assert any(b.endswith("gone-target") for b in bad)
    with pytest.raises(ConfigError, match="stale; run `gpuforge generate`"):
        render.check([t], dist)


def test_generate_check_cli_fails_on_drift(capsys):
    t = FLEET[0]
    f = render.DIST / t.id / "entrypoint.sh"
    saved = f.read_bytes()
    try:
        f.write_bytes(saved + b"# drift\n")
        assert main(["generate", "--check"]) == 2
        assert f"{t.id}/entrypoint.sh" in capsys.readouterr().err
    finally:
        f.write_bytes(saved)
    assert main(["generate", "--check"]) == 0


@pytest.mark.parametrize("t", FLEET, ids=[t.id for t in FLEET])
def test_dockerfile_contents(t):
    df = render.render_target(t)["Dockerfile"].decode()
    v = t.variant
    assert "# syntax=" not in df
    assert f"FROM {t.base_image}\n" in df
    for pin in (f"torch=={v.torch}", f"torchvision=={v.torchvision}", f"torchaudio=={v.torchaudio}", f"triton=={v.triton}"):
        assert pin in df
    assert "--mount=type=cache,target=/var/cache/apt" in df and "--mount=type=cache,target=/root/.cache/pip" in df
    assert "--mount=type=secret,id=ca" in df and "COPY ca" not in df.lower().replace("copy constraints", "")
    assert "--no-install-recommends" in df
    for pkg in ("gcc", "g++", "python3-dev", "openssh-server", "tini"):
        assert f"        {pkg} \\" in df
    assert f"USER {t.settings.uid}\n" in df and t.settings.uid != 0
    assert 'ENTRYPOINT ["/usr/bin/tini", "-g", "--", "/usr/local/bin/gpuforge-entrypoint"]' in df
    assert "EXPOSE 22 8888" in df
    assert "NVIDIA_DRIVER_CAPABILITIES=compute,utility" in df and "NVIDIA_VISIBLE_DEVICES=all" in df
    assert (f'NVIDIA_REQUIRE_CUDA="cuda>={v.cuda}"' in df) == (t.source == "wheels")  # cuda-base inherits NVIDIA's
    assert f'io.gpuforge.torch="{v.torch_local_version}"' in df and f'io.gpuforge.cudnn="{v.cudnn}"' in df
    assert f"ARG TORCH_INDEX_URL={t.index_url}" in df
    if t.flavor == "devel":
        assert "        build-essential \\" in df


def test_context_carries_preflight_and_units():
    files = render.render_target(FLEET[0])
    for name in ("entrypoint.sh", "sshd_config", "target.json", "constraints.txt", "gpuforge/preflight.py",
                 "gpuforge/compat.py", "gpuforge/data/compat.yaml", "units/gpu_smoke.py", "units/inductor_cpu.py"):
        assert name in files, name


def test_generate_removes_targets_that_left_the_matrix(tmp_path, monkeypatch):
    dist = tmp_path / "dist"
    shutil.copytree(render.DIST, dist)
    (dist / "pt000-old-target").mkdir()
    monkeypatch.setattr(render, "DIST", dist)
    assert main(["generate"]) == 0
    assert not (dist / "pt000-old-target").exists()
