"""`gpuforge pull`: the pushed digest of a build record, pulled through the engine's API with gpuforge's credentials,
against real registries (Debian's docker-registry on 127.0.0.1: anonymous, and htpasswd). The image is a one-layer
image made here (docker import of 2 KB of random bytes, a few milliseconds to push), pushed through the engine and
recorded as `gpuforge push` records a push; each pull starts with the image gone from the engine, so the bytes really come from the
registry. No docker config file is written: HOME and DOCKER_CONFIG point at folders of the test, checked after."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import uuid
from dataclasses import dataclass
from pathlib import Path

import docker.errors
import pytest
from registries import PASSWORD, USER, USERS, LocalRegistry

from conftest import BASE_MATRIX, ROOT, need
from gpuforge.plan.matrix import load_matrix
from gpuforge.state.records import Records

pytestmark = pytest.mark.docker

CREDENTIAL_VARS = ("GPUFORGE_REGISTRY", "GPUFORGE_REGISTRY_USER", "GPUFORGE_REGISTRY_PASSWORD",
                   "GPUFORGE_REGISTRY_INSECURE", "REGISTRY_AUTH_FILE")


@dataclass(frozen=True)
class Pushed:
    """A tiny image pushed to `registry`, recorded as the matrix default's build and push in a state dir of its own."""

    registry: LocalRegistry
    matrix: Path
    state: Path
    target: str
    image_id: str
    digest: str
    ref: str  # host/repo@digest


def _run(*args: str, pushed: Pushed, home: Path, docker_config: Path, env: dict | None = None,
         state: Path | None = None) -> subprocess.CompletedProcess:
    """The real CLI with only the variables given here: no credentials of the caller's, HOME and DOCKER_CONFIG ours."""
    base = {k: v for k, v in os.environ.items() if k not in CREDENTIAL_VARS}
    full = {**base, "HOME": str(home), "DOCKER_CONFIG": str(docker_config),
            "GPUFORGE_STATE_DIR": str(state or pushed.state), **(env or {})}
    return subprocess.run([sys.executable, "-m", "gpuforge", "--matrix", str(pushed.matrix), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, env=full)


def _tiny_image(engine) -> str:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = os.urandom(2048)  # random: an image id of its own, shared with nobody on this engine
        info = tarfile.TarInfo("payload")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return subprocess.run(["docker", "import", "-", f"gpuforge-test/pull-{uuid.uuid4().hex[:12]}:1"],
                          input=buf.getvalue(), capture_output=True, check=True).stdout.decode().strip()


def _push(engine, d: Path, reg: LocalRegistry, image_id: str, auth: dict | None) -> Pushed:
    """Push the image through the engine (credentials in the request only) and record the build and the push as
    `gpuforge push` records them: image_id, digest, and the reference pushed (pushed_ref)."""
    repo = f"{reg.host}/gpuforge-test/pull-{uuid.uuid4().hex[:12]}"
    d.mkdir(parents=True)
    matrix = d / "matrix.yaml"
    matrix.write_text(BASE_MATRIX.replace("registry: 127.0.0.1:5000", f"registry: {reg.host}"))
    [t] = load_matrix(matrix).select(None)
    engine.images.get(image_id).tag(repo, "1")
    events = list(engine.images.push(repo, "1", auth_config=auth, stream=True, decode=True))
    assert not [ev for ev in events if "error" in ev], events
    [digest] = [ev["aux"]["Digest"] for ev in events if "Digest" in (ev.get("aux") or {})]
    state = d / "state"
    Records(state).update_build(t.id, image_id=image_id, digest=digest, pushed_ref=f"{repo}:1")
    return Pushed(reg, matrix, state, t.id, image_id, digest, f"{repo}@{digest}")


@pytest.fixture(scope="module")
def image(docker_engine):
    iid = _tiny_image(docker_engine)
    yield iid
    try:
        docker_engine.images.remove(iid, force=True)  # every tag and digest of it, ours alone
    except docker.errors.ImageNotFound:
        pass


@pytest.fixture(scope="module")
def open_pushed(image, docker_engine, tmp_path_factory):
    d = tmp_path_factory.mktemp("pull-open")
    reg = LocalRegistry(d / "reg", None)
    try:
        yield _push(docker_engine, d / "push", reg, image, None)
    finally:
        reg.stop()


@pytest.fixture(scope="module")
def auth_pushed(image, docker_engine, tmp_path_factory):
    if not shutil.which("htpasswd"):
        need("needs htpasswd (apt-get install apache2-utils)")
    d = tmp_path_factory.mktemp("pull-auth")
    (d / "reg").mkdir()  # the htpasswd file goes there before the registry starts
    reg = LocalRegistry(d / "reg", "htpasswd", USERS)
    try:
        yield _push(docker_engine, d / "push", reg, image, {"username": USER, "password": PASSWORD})
    finally:
        reg.stop()


@pytest.fixture
def homes(tmp_path):
    """A HOME with no .docker and a DOCKER_CONFIG holding a config of no credentials: both must stay as they are."""
    home, cfg = tmp_path / "home", tmp_path / "docker-config"
    home.mkdir()
    cfg.mkdir()
    (cfg / "config.json").write_text('{"auths": {}}\n')
    return home, cfg


def _tree(d: Path) -> dict[str, tuple[bytes, int]]:
    return {str(p.relative_to(d)): (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(d.rglob("*")) if p.is_file()}


def _gone(engine, image_id: str) -> None:
    """The image off the engine, so that a pull has to fetch it."""
    try:
        engine.images.remove(image_id, force=True)
    except docker.errors.ImageNotFound:
        pass


def _one_line(r: subprocess.CompletedProcess, code: int) -> str:
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    assert r.stderr.startswith("gpuforge: error: ") and r.stderr.count("\n") == 1, r.stderr
    return r.stderr


def test_an_anonymous_registry_pulls_with_no_credentials_set(open_pushed, docker_engine, homes):
    """No `docker login`, no credentials: the pull is anonymous, and the engine holds the recorded image again."""
    _gone(docker_engine, open_pushed.image_id)
    r = _run("pull", pushed=open_pushed, home=homes[0], docker_config=homes[1])
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [f"gpuforge: pull {open_pushed.target}: {open_pushed.ref} pulled; image "
                                     f"{open_pushed.image_id[:19]}, as recorded"]
    img = docker_engine.images.get(open_pushed.ref)
    assert img.id == open_pushed.image_id and open_pushed.ref in img.attrs["RepoDigests"]
    again = _run("pull", open_pushed.target, pushed=open_pushed, home=homes[0], docker_config=homes[1])
    assert again.returncode == 0 and "already in the engine" in again.stdout, again


def test_credentials_go_to_the_pull_and_into_no_docker_config(auth_pushed, docker_engine, homes):
    home, cfg = homes
    before = _tree(cfg)
    _gone(docker_engine, auth_pushed.image_id)
    r = _run("pull", auth_pushed.target, pushed=auth_pushed, home=home, docker_config=cfg,
             env={"GPUFORGE_REGISTRY_USER": USER, "GPUFORGE_REGISTRY_PASSWORD": PASSWORD})
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [f"gpuforge: pull {auth_pushed.target}: {auth_pushed.ref} pulled; image "
                                     f"{auth_pushed.image_id[:19]}, as recorded"]
    assert docker_engine.images.get(auth_pushed.ref).id == auth_pushed.image_id
    assert _tree(cfg) == before, "the docker config was changed"
    assert list(home.rglob("*")) == [], "something was written under HOME (a ~/.docker/config.json?)"
    assert PASSWORD not in r.stdout + r.stderr


def test_wrong_credentials_are_exit_6_in_one_line(auth_pushed, docker_engine, homes):
    _gone(docker_engine, auth_pushed.image_id)
    r = _run("pull", pushed=auth_pushed, home=homes[0], docker_config=homes[1],
             env={"GPUFORGE_REGISTRY_USER": USER, "GPUFORGE_REGISTRY_PASSWORD": "not-the-password"})
    err = _one_line(r, 6)
    assert f"registry {auth_pushed.registry.host} refused the credentials for pulling" in err
    assert "not-the-password" not in r.stdout + r.stderr
    with pytest.raises(docker.errors.ImageNotFound):
        docker_engine.images.get(auth_pushed.image_id)


def test_no_credentials_on_a_registry_that_wants_them_is_exit_6(auth_pushed, docker_engine, homes):
    _gone(docker_engine, auth_pushed.image_id)
    err = _one_line(_run("pull", pushed=auth_pushed, home=homes[0], docker_config=homes[1]), 6)
    assert "wants credentials to pull" in err and "GPUFORGE_REGISTRY_USER" in err


def test_a_pushed_digest_of_another_image_is_refused(open_pushed, homes, tmp_path):
    """The record says the build was another image than the registry's digest holds: refused, exit 6."""
    state = tmp_path / "state"
    Records(state).update_build(open_pushed.target, image_id="sha256:" + "0" * 64, digest=open_pushed.digest,
                                pushed_ref=f"{open_pushed.ref.split('@')[0]}:any")
    err = _one_line(_run("pull", pushed=open_pushed, home=homes[0], docker_config=homes[1], state=state), 6)
    assert f"{open_pushed.ref} is image {open_pushed.image_id[:19]}, not the recorded sha256:000000000000" in err


def test_a_missing_or_unpushed_record_is_exit_8_before_any_pull(open_pushed, homes, tmp_path):
    state = tmp_path / "state"
    err = _one_line(_run("pull", pushed=open_pushed, home=homes[0], docker_config=homes[1], state=state), 8)
    assert f"{open_pushed.target} has not been built (no record in {state / 'builds.json'})" in err
    Records(state).update_build(open_pushed.target, image_id=open_pushed.image_id)  # built, never pushed
    err = _one_line(_run("pull", pushed=open_pushed, home=homes[0], docker_config=homes[1], state=state), 8)
    assert "has no pushed digest; run `gpuforge push" in err
    (state / "builds.json").write_text(json.dumps({"schema_version": 1, "builds": {open_pushed.target: {}}}))
    _one_line(_run("pull", pushed=open_pushed, home=homes[0], docker_config=homes[1], state=state), 8)
