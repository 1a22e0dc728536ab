"""The build paths users run: buildx (the primary driver), the registry's inline cache shared with a second, empty
engine (another runner), and the fleet's bake file. Classic BuildKit (the fallback) builds the devel image on the
engine matrix's empty engine (test_engine_matrix.py), where its steps always run. Costs in CI (2 cores): push to the
run's registry seconds (its layers mounted from another module's push; ~3 min of gzip when none came first), cache
rebuild on the second engine ~2-3 min, bake of the default target (warm) seconds.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from registries import PASSWORD, USER, run_registry
from second_engine import SecondEngine, StartError, checkout_snapshot, matrix_copy, run_steps
from state_here import records

from conftest import ROOT, gpuforge, need
from gpuforge import options
from gpuforge.builder import runner as build
from gpuforge.engine import client as engine
from gpuforge.plan.matrix import load_matrix
from gpuforge.registry.client import RegistryAuth, auth_file
from gpuforge.render import dockerfile as render

pytestmark = pytest.mark.docker
DOCKER = "/usr/bin/docker"


def _matrix(tmp_path: Path, registry: str, repo: str) -> Path:
    return matrix_copy(ROOT, tmp_path / "matrix.yaml", registry, repo)


def _record(state: Path, target_id: str, monkeypatch) -> dict:
    """The target's build record in `state`, as the dict built_by notes (the default build's fixture gives one)."""
    monkeypatch.setenv("GPUFORGE_STATE_DIR", str(state))
    return records.require_build(target_id).model_dump(exclude_none=True)


@pytest.fixture(scope="module")
def built_by(request):
    """note(what, record): which driver + client built each image here; printed when the module ends (CI's
    log then shows them side by side; the classic build is the engine matrix's, which prints its own line)."""
    built: list[str] = []
    yield lambda what, rec: built.append(f"{what}: {rec['driver']} via {rec.get('client', '?')} ({rec.get('seconds', '?')} s)")
    tr = request.config.pluginmanager.get_plugin("terminalreporter")
    if tr and built:
        tr.write_sep("-", "images built, by driver")
        for line in built:
            tr.write_line(line)


@pytest.fixture(scope="module")
def buildx_present(docker_engine):
    if subprocess.run([DOCKER, "buildx", "version"], capture_output=True).returncode != 0:
        need("needs the buildx plugin (tools/start-engine.sh installs docker-buildx from trixie)")


def test_buildx_is_chosen_when_present_and_classic_can_be_forced(buildx_present, default_build, built_by):
    assert engine.choose_driver().name == "buildx"
    assert engine.choose_driver(want="classic").name == "classic"
    t, rec = default_build
    built_by(f"{t.id} (default build)", rec)
    assert rec["driver"] == "buildx"


@pytest.fixture(scope="module")
def second_engine(docker_engine):
    if not (shutil.which("dockerd") and shutil.which("ip")):
        need("needs dockerd and ip (a second engine: runner B of the registry-cache test)")
    try:
        eng = SecondEngine(outbound=True)  # a step the registry cache lacks would download its wheels
    except (StartError, subprocess.CalledProcessError) as e:
        pytest.fail(f"second engine: {e}")
    # bootstrapped bases are made locally: load the default's rather than debootstrap again
    eng.load(load_matrix().select(None)[0].base_image)
    yield eng
    eng.stop()


@pytest.fixture(scope="module")
def cache_registry():
    """The run's registry: runner A's push mounts the layers another module pushed there (a gzip of 6 GB otherwise)."""
    return run_registry()


@pytest.fixture(scope="module")
def cache_login(cache_registry):
    """DOCKER_CONFIG holding a login to the run's registry (gpuforge's own auth file), for both runners' CLIs."""
    with auth_file(RegistryAuth(user=USER, password=PASSWORD), cache_registry) as path:
        yield {"DOCKER_CONFIG": str(Path(path).parent)}


def test_registry_inline_cache_rebuilds_on_an_empty_engine_without_rebuilding_torch(
        buildx_present, default_build, docker_engine, second_engine, cache_registry, cache_login, tmp_path, built_by,
        monkeypatch):
    """Runner A builds with --cache-to type=inline (no CA flag: the host's pip trust is the secret) and pushes;
    runner B, whose build cache is empty, builds with --cache-from the pushed ref: the torch layer is reused."""
    t, _ = default_build
    m = _matrix(tmp_path, cache_registry, "gpuforge-test-13/cache")
    ref = load_matrix(m).select(None)[0].tags[0]
    # both runners build one snapshot of the checkout (as two CI runners check out one commit)
    snap = checkout_snapshot(ROOT, tmp_path / "checkout")
    env_a = {"GPUFORGE_STATE_DIR": str(tmp_path / "a"), "GPUFORGE_LOG_DIR": str(tmp_path / "a-logs"),
             "GPUFORGE_ROOT": str(snap)}
    r = gpuforge("--matrix", str(m), "build", "--cache-to", "type=inline", "--progress", "plain", env=env_a, cwd=snap)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    if options.resolve(command="build").source("extra_ca") in build.HOST_TRUST_ENV:
        assert "using the host's pip trust" in r.stdout
    rec_a = _record(tmp_path / "a", t.id, monkeypatch)
    built_by(f"{t.id} (runner A, --cache-to type=inline)", rec_a)
    t0 = time.monotonic()
    subprocess.run([DOCKER, "push", "-q", ref], check=True, capture_output=True, timeout=1800,
                   env={**os.environ, **cache_login})
    print(f"\npush of the inline-cache image: {time.monotonic() - t0:.0f} s")

    # runner B: the same base (loaded by the fixture), and no image of this repository
    assert not second_engine.client.images.list(name=ref.rsplit(":", 1)[0])
    env_b = {"DOCKER_HOST": second_engine.host, "GPUFORGE_STATE_DIR": str(tmp_path / "b"),
             "GPUFORGE_LOG_DIR": str(tmp_path / "b-logs"), "GPUFORGE_ROOT": str(snap), **cache_login}
    r = gpuforge("--matrix", str(m), "build", "--cache-from", f"type=registry,ref={ref}", "--progress", "plain", env=env_b,
                 cwd=snap)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    rec_b = _record(tmp_path / "b", t.id, monkeypatch)
    built_by(f"{t.id} (runner B, --cache-from the registry)", rec_b)
    steps = run_steps(Path(rec_b["log"]).read_text())
    torch_steps = [h for h in steps if "uv pip install" in h]
    assert torch_steps and all(steps[h] for h in torch_steps), f"torch step rebuilt: {steps}"
    assert all(steps.values()), f"steps rebuilt on runner B: {[h[:80] for h, c in steps.items() if not c]}"
    a = docker_engine.images.get(rec_a["image_id"]).attrs["RootFS"]["Layers"]
    b = second_engine.client.images.get(rec_b["image_id"]).attrs["RootFS"]["Layers"]
    assert a == b
    print(f"runner B rebuild from the registry cache: {rec_b['seconds']} s (runner A's cold default build: see bench)")
    docker_engine.images.remove(ref)


def test_bake_file_prints_the_fleet_and_builds_the_default(buildx_present, default_build, docker_engine, built_by, tmp_path):
    t, rec = default_build
    bake = ROOT / render.BAKE
    p = subprocess.run([DOCKER, "buildx", "bake", "-f", str(bake), "--print", "all"], cwd=ROOT, capture_output=True,
                       text=True)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    fleet = load_matrix().targets
    assert set(doc["target"]) == {x.id for x in fleet}
    for x in fleet:
        bt = doc["target"][x.id]
        assert bt["dockerfile"] == f"images/dist/{x.id}/Dockerfile" and (ROOT / bt["dockerfile"]).is_file()
        assert bt["tags"] == list(x.tags)
        assert bt["secret"] == ["id=ca,src=/etc/ssl/certs/ca-certificates.crt"]
    p = subprocess.run([DOCKER, "buildx", "bake", "-f", str(bake), "--print"], cwd=ROOT, capture_output=True, text=True)
    assert json.loads(p.stdout)["group"]["default"]["targets"] == [t.id]
    # a real bake of the default target (warm cache), CA bundle and tag overridden the way a user would
    tag = "gpuforge-test-13/bake:default"
    t0 = time.monotonic()
    p = subprocess.run([DOCKER, "buildx", "bake", "-f", str(bake), "--load", "--set", f"*.tags={tag}", "--progress", "plain"],
                       cwd=ROOT, capture_output=True, text=True, env={**os.environ,
                                                                     "GPUFORGE_CA": rec.get("extra_ca") or "/dev/null"})
    assert p.returncode == 0, p.stderr[-3000:]
    img = docker_engine.images.get(tag)
    built_by(f"{t.id} (docker buildx bake default)", {"driver": "buildx bake", "client": DOCKER,
                                                     "seconds": round(time.monotonic() - t0, 1)})
    # the same recipe as gpuforge's build: every step comes from the cache the fleet's builds made
    steps = run_steps(p.stdout + p.stderr)
    assert steps and all(steps.values()), f"bake rebuilt steps: {[h[:80] for h, c in steps.items() if not c]}"
    assert img.labels["org.opencontainers.image.version"] == t.variant.torch_local_version
    assert img.labels["org.opencontainers.image.revision"] == "unknown"  # the bake file's variable default
    docker_engine.images.remove(tag)
