"""Rendering: deterministic, committed output current, drift detected, Dockerfiles carry what users rely on."""

from __future__ import annotations

import json
import shutil

import pytest

from gpuforge import paths
from gpuforge.cli import main
from gpuforge.errors import ConfigError
from gpuforge.plan.matrix import load_matrix
from gpuforge.render import dockerfile as render

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


def test_a_crash_while_writing_a_target_leaves_its_folder_whole(tmp_path, monkeypatch):
    """`generate` replaces images/dist/<id>/ as one: a failure after the first file is written (here a file that
    cannot be written; a full disk or Ctrl-C alike) leaves the previous folder as it was and nothing beside it."""
    dist = tmp_path / "dist"
    t = FLEET[0]
    render.write(t, dist)
    before = {f.name: f.read_bytes() for f in (dist / t.id).iterdir()}
    broken = {"Dockerfile": b"FROM scratch\n", "target.json": None, "constraints.txt": b""}
    monkeypatch.setattr(render, "render_target", lambda t: broken)
    with pytest.raises(TypeError):
        render.write(t, dist)
    assert {f.name: f.read_bytes() for f in (dist / t.id).iterdir()} == before
    assert [p.name for p in dist.iterdir()] == [t.id]  # no temp folder left
    monkeypatch.undo()
    (dist / t.id / "leftover.txt").write_text("x")  # a successful write replaces the whole folder
    render.write(t, dist)
    assert sorted(f.name for f in (dist / t.id).iterdir()) == sorted(render.PER_TARGET)
    assert [p.name for p in dist.iterdir()] == [t.id]


@pytest.fixture
def checkout(tmp_path, monkeypatch):
    """A copy of what `generate` reads and writes, as the checkout (GPUFORGE_ROOT): the real one is never written."""
    root = paths.project_root()
    copy = tmp_path / "checkout"
    for rel in ("images", "validators", "gpuforge/__init__.py", "gpuforge/image", "matrix.yaml", ".dockerignore"):
        src, dest = root / rel, copy / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(src, dest) if src.is_dir() else shutil.copy2(src, dest)
    monkeypatch.setenv("GPUFORGE_ROOT", str(copy))
    monkeypatch.chdir(copy)
    return copy


def test_generate_check_cli_fails_on_drift(checkout, capsys):
    t = FLEET[0]
    f = checkout / "images" / "dist" / t.id / "target.json"
    assert main(["generate", "--check"]) == 0
    f.write_bytes(f.read_bytes() + b"\n")
    assert main(["generate", "--check"]) == 2
    assert f"{t.id}/target.json" in capsys.readouterr().err


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


@pytest.mark.parametrize("t", FLEET, ids=[t.id for t in FLEET])
def test_the_system_layer_applies_the_os_updates_and_is_keyed_by_the_apt_state(t):
    """Every os: the system layer upgrades what the base has (its sources hold <release>-updates and -security) before
    it installs, and its RUN uses GPUFORGE_APT_STATE, so a new value (gpuforge resolves it per build) rebuilds it."""
    df = render.render_target(t)["Dockerfile"].decode()
    system = df[df.index("ARG GPUFORGE_APT_STATE=unset\nRUN "):]
    system = system[:system.index("\n\n")]
    assert 'echo "apt state: ${GPUFORGE_APT_STATE}"' in system
    update, upgrade = system.index("apt-get update"), system.index("apt-get upgrade -y")
    assert update < upgrade < system.index("apt-get install -y --no-install-recommends")
    assert df.index("ARG GPUFORGE_APT_STATE") < df.index("torch==")  # the torch layer sits above it
    bake = json.loads(render.bake_file(list(FLEET), list(FLEET)))
    assert bake["target"][t.id]["args"] == {"GPUFORGE_APT_STATE": "${GPUFORGE_APT_STATE}"}


def test_dist_holds_only_per_target_files():
    for t in FLEET:
        assert sorted(render.render_target(t)) == sorted(render.PER_TARGET)
        assert sorted(p.name for p in (paths.dist() / t.id).iterdir()) == sorted(render.PER_TARGET)


def test_every_copy_source_is_in_the_one_context():
    """Each COPY names a path the root .dockerignore lets through: the shared context or the target's own files."""
    allowed = (*paths.CONTEXT_PATHS, "images/dist/")
    for t in FLEET:
        df = render.render_target(t)["Dockerfile"].decode()
        sources = [line.split()[1] for line in df.splitlines() if line.startswith("COPY ")]
        assert "gpuforge/image" in sources and "images/programs" in sources
        for src in sources:
            assert src.startswith(allowed), src
            assert (paths.project_root() / src).exists(), src
            if src.startswith("images/dist/"):
                assert src.startswith(f"images/dist/{t.id}/"), src


def test_dockerignore_whitelists_the_context():
    text = (paths.project_root() / ".dockerignore").read_text()
    assert text == render.dockerignore()
    lines = text.splitlines()
    assert "*" in lines and lines.index("*") < lines.index("!gpuforge/image")
    assert "**/__pycache__" in lines


def test_recipe_hash_covers_the_shared_context(tmp_path):
    t = FLEET[0]
    ctx = render.copy_context(tmp_path / "ctx")
    before = render.recipe_hash(t, ctx)
    assert before == render.recipe_hash(t)  # the copy is the same context
    with (ctx / "images" / "context" / "entrypoint.sh").open("a") as f:
        f.write("# changed\n")
    assert render.recipe_hash(t, ctx) != before


def test_generate_removes_targets_that_left_the_matrix(checkout):
    dist = checkout / "images" / "dist"
    (dist / "pt000-old-target").mkdir()
    assert main(["generate"]) == 0
    assert not (dist / "pt000-old-target").exists()
    assert (checkout / ".dockerignore").exists() and (dist / "docker-bake.json").exists()  # written in the copy


def test_a_cu118_devel_image_from_wheels_takes_the_cuda_11_8_toolkit_wheels(write_matrix):
    """The toolkit layer of a cu118 devel image: NVIDIA's CUDA 11.8 toolkit wheels at compat's pins, installed beside
    torch's cu11 wheels and assembled into CUDA_HOME as for CUDA 12 (tests/integration/image/test_toolkit_wheels.py
    runs those steps on the CPU)."""
    text = ("registry: 127.0.0.1:5000\nrepository: gpuforge/pytorch\nbases:\n  debian12:\n    bootstrap: {suite: bookworm}\n"
            'matrix:\n  torch: ["2.7.1"]\n  cuda: ["11.8"]\n  python: ["3.11"]\n  os: [debian12]\n  flavor: [devel]\n'
            '  source: [wheels]\ndefault: ["cuda=11.8"]\n')
    [t] = load_matrix(write_matrix(text)).targets
    files = render.render_target(t)
    df = files["Dockerfile"].decode()
    toolkit = df[df.index("COPY images/context/cuda_home.py"):df.index("COPY images/context/profile-devel.sh")]
    assert "        nvidia-cuda-nvcc-cu11==11.8.89 \\\n        nvidia-cuda-cccl-cu11==11.8.89.post1 \\\n" in toolkit
    assert 'cuda_home.py --site "$SITE/nvidia" --out /opt/gpuforge/cuda' in toolkit
    assert "CUDA_HOME=/opt/gpuforge/cuda \\" in df and ":/opt/gpuforge/cuda/bin \\" in df
    assert " nvidia-cuda-nvcc-cu11==11.8.89 nvidia-cuda-cccl-cu11==11.8.89.post1; } > /opt/gpuforge/pip-constraints.txt" in df
    assert 'io.gpuforge.toolkit="nvidia-cuda-nvcc-cu11==11.8.89,nvidia-cuda-cccl-cu11==11.8.89.post1"' in df
    assert "ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu118" in df
    pins = files["constraints.txt"].decode()
    assert "nvidia-cuda-nvrtc-cu11==11.8.89\n" in pins and "-cu12==" not in pins
    assert json.loads(files["target.json"])["toolkit"] == list(t.toolkit_wheels)
