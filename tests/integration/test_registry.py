"""Push and promotion against real Debian docker-registry instances on 127.0.0.1 (one with htpasswd auth)."""

from __future__ import annotations

import dataclasses
import shutil
import socket
import subprocess
import time

import pytest
import requests

from conftest import REQUIRE, gpuforge
from gpuforge import bases, promote, records
from gpuforge.errors import PromotionRefused, RegistryError
from gpuforge.registry import Registry

pytestmark = pytest.mark.docker
USER, PASSWORD = "ci-pusher", "s3cret-registry-pass"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_registry(tmp, auth: bool):
    exe = shutil.which("docker-registry")
    if not exe:
        msg = "needs Debian's docker-registry (apt-get install docker-registry)"
        if REQUIRE:
            pytest.fail(msg)
        pytest.skip(msg)
    port = _free_port()
    cfg = tmp / "config.yml"
    text = f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {tmp / 'data'}\nhttp:\n  addr: 127.0.0.1:{port}\n"
    if auth:
        pw = subprocess.run(["htpasswd", "-Bbn", USER, PASSWORD], capture_output=True, text=True, check=True).stdout
        (tmp / "htpasswd").write_text(pw)
        text += f"auth:\n  htpasswd:\n    realm: gpuforge-test\n    path: {tmp / 'htpasswd'}\n"
    cfg.write_text(text)
    proc = subprocess.Popen([exe, "serve", str(cfg)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(100):
        try:
            requests.get(f"http://127.0.0.1:{port}/v2/", timeout=1)
            return proc, f"127.0.0.1:{port}"
        except requests.ConnectionError:
            time.sleep(0.1)
    proc.kill()
    pytest.fail("docker-registry did not start")


@pytest.fixture(scope="module")
def auth_registry(tmp_path_factory):
    proc, host = _start_registry(tmp_path_factory.mktemp("reg-auth"), auth=True)
    yield host
    proc.terminate()
    proc.wait()


@pytest.fixture(scope="module")
def open_registry(tmp_path_factory):
    proc, host = _start_registry(tmp_path_factory.mktemp("reg-open"), auth=False)
    yield host
    proc.terminate()
    proc.wait()


@pytest.fixture
def creds(monkeypatch):
    monkeypatch.setenv("GPUFORGE_REGISTRY_USER", USER)
    monkeypatch.setenv("GPUFORGE_REGISTRY_PASSWORD", PASSWORD)


def _target(validated, registry: str, repo: str):
    t = validated["target"]
    return dataclasses.replace(t, tags=(f"{registry}/{repo}:{t.tag}",), registry=registry, repository=repo)


@pytest.fixture(scope="module")
def pushed(validated, auth_registry):
    """The validated default image, pushed once (with credentials) to the auth registry."""
    mp = pytest.MonkeyPatch()
    mp.setenv("GPUFORGE_REGISTRY_USER", USER)
    mp.setenv("GPUFORGE_REGISTRY_PASSWORD", PASSWORD)
    t = _target(validated, auth_registry, "gpuforge/pytorch")
    t0 = time.monotonic()
    [res] = promote.push_targets([t])
    print(f"\npush of the default image: {time.monotonic() - t0:.0f} s")
    mp.undo()
    return t, res


def _digest(registry: str, repo: str, tag: str) -> str | None:
    m = Registry(registry).manifest(repo, tag)
    return m.digest if m else None


def test_push_records_the_digest_of_the_validated_image(pushed, validated, creds):
    t, res = pushed
    assert records.get(t.id)["digest"] == res["digest"]
    m = Registry(t.registry).manifest(t.repository, res["digest"])
    assert m.config_digest == validated["record"]["image_id"]


def test_promote_dev_then_prod_moves_exactly_the_validated_digest(pushed, validated, creds, capsys):
    t, res = pushed
    reports = validated["reports"]
    [dev] = promote.promote_targets([t], env="dev", reports=reports)
    [prod] = promote.promote_targets([t], env="prod", reports=reports)
    for tag in (f"{t.tag}-dev", f"{t.tag}-prod", *t.aliases["dev"], *t.aliases["prod"]):
        assert _digest(t.registry, t.repository, tag) == res["digest"], tag
    assert "latest" in prod["moved"] and dev["digest"] == prod["digest"] == res["digest"]
    out = capsys.readouterr()
    assert PASSWORD not in out.out + out.err


def test_promoting_twice_changes_nothing(pushed, validated, creds):
    t, res = pushed
    promote.promote_targets([t], env="dev", reports=validated["reports"])
    [again] = promote.promote_targets([t], env="dev", reports=validated["reports"])
    assert again["moved"] == [] and set(again["unchanged"]) == {f"{t.tag}-dev", *t.aliases["dev"]}


def test_missing_report_is_refused(pushed, creds, tmp_path):
    t, res = pushed
    before = _digest(t.registry, t.repository, f"{t.tag}-prod")
    with pytest.raises(PromotionRefused, match="no validation report"):
        promote.promote_targets([t], env="prod", reports=tmp_path)
    assert _digest(t.registry, t.repository, f"{t.tag}-prod") == before


def test_red_report_is_refused(pushed, creds, tmp_path):
    t, res = pushed
    r = gpuforge("validate", "--reports", str(tmp_path), "--pytest-args", "-k test_torch --gpuforge-expect torch=0.0.0")
    assert r.returncode == 5
    before = _digest(t.registry, t.repository, f"{t.tag}-prod")
    with pytest.raises(PromotionRefused, match="is red \\(failed: test_torch\\)"):
        promote.promote_targets([t], env="prod", reports=tmp_path)
    assert _digest(t.registry, t.repository, f"{t.tag}-prod") == before


def test_prod_needs_a_gpu_report_when_required(pushed, validated, creds):
    t, _ = pushed
    with pytest.raises(PromotionRefused, match="no GPU validation report"):
        promote.promote_targets([t], env="prod", reports=validated["reports"], require_gpu=True)


def test_repushed_tag_after_validation_is_refused(validated, auth_registry, creds, docker_engine):
    t = _target(validated, auth_registry, "gpuforge/repush")
    [res] = promote.push_targets([t])
    promote.promote_targets([t], env="dev", reports=validated["reports"])
    # someone pushes other bytes under the build tag after validation
    other = docker_engine.images.get(t.base_image)
    other.tag(f"{auth_registry}/gpuforge/repush", t.tag)
    for ev in docker_engine.images.push(f"{auth_registry}/gpuforge/repush", t.tag, stream=True, decode=True,
                                        auth_config={"username": USER, "password": PASSWORD}):
        assert "error" not in ev, ev
    records.update(t.id, digest=res["digest"])
    with pytest.raises(PromotionRefused, match="re-pushed after validation"):
        promote.promote_targets([t], env="prod", reports=validated["reports"])
    assert _digest(auth_registry, "gpuforge/repush", f"{t.tag}-prod") is None
    assert _digest(auth_registry, "gpuforge/repush", f"{t.tag}-dev") == res["digest"]


def test_prod_before_dev_is_refused(validated, auth_registry, creds):
    t = _target(validated, auth_registry, "gpuforge/nodev")
    promote.push_targets([t])
    with pytest.raises(PromotionRefused, match="promote to dev first"):
        promote.promote_targets([t], env="prod", reports=validated["reports"])


def test_registry_down_is_a_clear_error(validated, pushed, creds):
    t = _target(validated, f"127.0.0.1:{_free_port()}", "gpuforge/pytorch")
    with pytest.raises(RegistryError, match=r"cannot reach registry 127\.0\.0\.1"):
        promote.promote_targets([t], env="dev", reports=validated["reports"])


def test_wrong_credentials_are_refused_and_never_printed(pushed, validated, monkeypatch, capsys):
    t, _ = pushed
    monkeypatch.setenv("GPUFORGE_REGISTRY_USER", USER)
    monkeypatch.setenv("GPUFORGE_REGISTRY_PASSWORD", "wrong-password-xyz")
    with pytest.raises(RegistryError, match="refused the credentials") as e:
        promote.promote_targets([t], env="dev", reports=validated["reports"])
    out = capsys.readouterr()
    assert "wrong-password-xyz" not in str(e.value) + out.out + out.err


def test_promote_cli_refusal_is_one_line(pushed, tmp_path, creds):
    t, _ = pushed
    r = gpuforge("promote", "--to", "prod", "--reports", str(tmp_path), "--registry", t.registry)
    assert r.returncode == 7, r.stderr
    assert r.stderr.count("\n") == 1 and "promotion refused" in r.stderr and "no tag was changed" in r.stderr


def test_base_is_pulled_from_a_registry(default_build, open_registry, docker_engine):
    t, _ = default_build
    ref = f"{open_registry}/mirror/debian:bookworm"
    docker_engine.images.get(t.base_image).tag(f"{open_registry}/mirror/debian", "bookworm")
    for ev in docker_engine.images.push(f"{open_registry}/mirror/debian", "bookworm", stream=True, decode=True):
        assert "error" not in ev, ev
    docker_engine.images.remove(ref)
    pulled = dataclasses.replace(t, base_image=ref, bootstrap=None)
    logs = []
    image_id = bases.ensure_base(pulled, log=logs.append)
    assert "pulling" in logs[0]
    assert docker_engine.images.get(ref).id == image_id
    docker_engine.images.remove(ref)


def test_unreachable_base_is_a_clear_error(default_build):
    t, _ = default_build
    missing = dataclasses.replace(t, base_image=f"127.0.0.1:{_free_port()}/nothing/here:1", bootstrap=None)
    from gpuforge.errors import EngineError

    with pytest.raises(EngineError, match=r"cannot pull base image 127\.0\.0\.1"):
        bases.ensure_base(missing, log=lambda _: None)
