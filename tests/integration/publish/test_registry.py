"""Push, attest and promote against real Debian docker-registry instances on 127.0.0.1: one with
htpasswd basic auth, one with token auth (scoped JWTs from a real token server, see registries.py).
Signatures are real cosign attestations with a key pair made for the run.

Cost: one push of the default image (~3 min on 2 cores), one skopeo copy to the token registry (blobs
stay compressed), then manifest copies and cosign calls (< 2 s each).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import shutil
import subprocess
import time

import pytest
from registries import DOC_REF, LocalRegistry, documented_consumer_command, free_port

from conftest import gpuforge, need
from gpuforge.build import bases
from gpuforge.errors import PromotionRefused, RegistryError
from gpuforge.publish import attest, promote
from gpuforge.publish.registry import Registry, auth_file
from gpuforge.state import records
from gpuforge.validate import evidence

pytestmark = pytest.mark.docker
USER, PASSWORD = "ci-pusher", "s3cret-registry-pass"
READER, READER_PASSWORD = "ci-reader", "read-only-pass"
USERS = {USER: (PASSWORD, {"pull", "push"}), READER: (READER_PASSWORD, {"pull"})}
KEY_PASSWORD = "cosign-test-key-pass"


@pytest.fixture(scope="session")
def cosign_keys(tmp_path_factory):
    """A cosign key pair made for this run (the private key encrypted with KEY_PASSWORD)."""
    if not shutil.which("cosign"):
        need("needs cosign (Debian trixie's; tools/start-engine.sh installs it)")
    d = tmp_path_factory.mktemp("cosign")
    subprocess.run(["cosign", "generate-key-pair", "--output-key-prefix", str(d / "test")], check=True,
                   capture_output=True, env={**os.environ, "COSIGN_PASSWORD": KEY_PASSWORD})
    return {"key": str(d / "test.key"), "pub": str(d / "test.pub")}


@pytest.fixture(scope="module")
def auth_registry(tmp_path_factory):
    reg = LocalRegistry(tmp_path_factory.mktemp("reg-auth"), "htpasswd", USERS)
    yield reg.host
    reg.stop()


@pytest.fixture(scope="module")
def token_registry(tmp_path_factory):
    reg = LocalRegistry(tmp_path_factory.mktemp("reg-token"), "token", USERS)
    yield reg
    reg.stop()


@pytest.fixture(scope="module")
def open_registry(tmp_path_factory):
    reg = LocalRegistry(tmp_path_factory.mktemp("reg-open"), None)
    yield reg.host
    reg.stop()


def _env(mp, cosign_keys, user=USER, password=PASSWORD):
    mp.setenv("GPUFORGE_REGISTRY_USER", user)
    mp.setenv("GPUFORGE_REGISTRY_PASSWORD", password)
    mp.setenv("GPUFORGE_COSIGN_PUBLIC_KEY", cosign_keys["pub"])
    mp.setenv("COSIGN_PASSWORD", KEY_PASSWORD)


@pytest.fixture
def creds(monkeypatch, cosign_keys):
    _env(monkeypatch, cosign_keys)


def _target(validated, registry: str, repo: str):
    t = validated["target"]
    return dataclasses.replace(t, tags=(f"{registry}/{repo}:{t.tag}",), registry=registry, repository=repo)


@pytest.fixture(scope="module")
def pushed(validated, auth_registry, cosign_keys):
    """The validated default image, pushed once (with credentials) to the basic-auth registry and attested."""
    mp = pytest.MonkeyPatch()
    _env(mp, cosign_keys)
    t = _target(validated, auth_registry, "gpuforge/pytorch")
    t0 = time.monotonic()
    [res] = promote.push_targets([t])
    print(f"\npush of the default image: {time.monotonic() - t0:.0f} s")
    promote.attest_targets([t], reports=validated["reports"], key=cosign_keys["key"])
    mp.undo()
    return t, res


@pytest.fixture(scope="module")
def token_pushed(pushed, token_registry, validated, cosign_keys):
    """The same bytes copied by skopeo to the token-auth registry (digest preserved), attested there."""
    mp = pytest.MonkeyPatch()
    _env(mp, cosign_keys)
    t, res = pushed
    tt = _target(validated, token_registry.host, "gpuforge/pytorch")
    t0 = time.monotonic()
    with auth_file(t.registry, tt.registry) as af:
        subprocess.run(["skopeo", "copy", "--preserve-digests", "--src-tls-verify=false", "--dest-tls-verify=false",
                        "--authfile", af, f"docker://{t.registry}/{t.repository}@{res['digest']}",
                        f"docker://{tt.registry}/{tt.repository}:{tt.tag}"], check=True, capture_output=True)
    print(f"\nskopeo copy to the token registry: {time.monotonic() - t0:.0f} s")
    promote.attest_targets([tt], reports=validated["reports"], key=cosign_keys["key"])
    mp.undo()
    return tt, res


@pytest.fixture
def restore_record(validated):
    """Tests that rewrite the build record (as a tampering user would) get it back afterwards."""
    t = validated["target"]
    before = copy.deepcopy(records.require(t.id))
    yield
    records.update(t.id, **before)


def _digest(registry: str, repo: str, tag: str) -> str | None:
    m = Registry(registry).manifest(repo, tag)
    return m.digest if m else None


def _copy_reports(validated, tmp_path) -> tuple:
    t = validated["target"]
    shutil.copytree(validated["reports"] / t.id, tmp_path / t.id)
    return tmp_path, tmp_path / t.id / "report.json"


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


def test_consumer_verifies_the_promoted_image_with_cosign(pushed, validated, creds, cosign_keys):
    """What the README tells a consumer to run before pulling: the signed report, green, for these bytes."""
    t, res = pushed
    promote.promote_targets([t], env="dev", reports=validated["reports"])
    with auth_file(t.registry) as af:
        r = subprocess.run(["cosign", "verify-attestation", "--key", cosign_keys["pub"], "--type", attest.VALIDATION_TYPE,
                            "--insecure-ignore-tlog=true", "--allow-http-registry", f"{t.registry}/{t.repository}:{t.tag}-dev"],
                           capture_output=True, text=True, env={**os.environ, "DOCKER_CONFIG": os.path.dirname(af)})
    assert r.returncode == 0, r.stderr[-2000:]
    [pred] = attest.verified_predicates(f"{t.registry}/{t.repository}@{res['digest']}", attest.VALIDATION_TYPE,
                                        attest.Verifier(key=cosign_keys["pub"]))
    assert pred["green"] and not evidence.problems(pred)
    assert pred["evidence"]["image_id"] == validated["record"]["image_id"]
    [inv] = attest.verified_predicates(f"{t.registry}/{t.repository}@{res['digest']}", attest.INVENTORY_TYPE,
                                       attest.Verifier(key=cosign_keys["pub"]))
    assert inv["python"]["torch"].startswith("2.7.1")


def test_the_documented_consumer_command_works_verbatim(pushed, validated, creds, cosign_keys):
    """The command a consumer copies from the docs, run by bash as written (only the key file and the image
    reference replaced), against the attested image signed with a key and without the transparency log."""
    t, _ = pushed
    promote.promote_targets([t], env="dev", reports=validated["reports"])
    cmd = documented_consumer_command()
    assert DOC_REF in cmd and "--key cosign.pub " in cmd
    cmd = cmd.replace(DOC_REF, f"{t.registry}/{t.repository}:{t.tag}-dev").replace("--key cosign.pub ",
                                                                                  f"--key {cosign_keys['pub']} ")
    with auth_file(t.registry) as af:  # what `docker login` leaves for cosign
        r = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], capture_output=True, text=True, timeout=300,
                           env={**os.environ, "DOCKER_CONFIG": os.path.dirname(af)})
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"true false {validated['record']['image_id']}" in r.stdout.splitlines(), r.stdout


def test_never_validated_image_has_no_verifiable_attestation(pushed, auth_registry, docker_engine, creds, cosign_keys):
    t, _ = pushed
    other = docker_engine.images.get(t.base_image)
    other.tag(f"{auth_registry}/gpuforge/unvalidated", "1")
    for ev in docker_engine.images.push(f"{auth_registry}/gpuforge/unvalidated", "1", stream=True, decode=True,
                                        auth_config={"username": USER, "password": PASSWORD}):
        assert "error" not in ev, ev
    with auth_file(auth_registry) as af:
        r = subprocess.run(["cosign", "verify-attestation", "--key", cosign_keys["pub"], "--type", attest.VALIDATION_TYPE,
                            "--insecure-ignore-tlog=true", "--allow-http-registry", f"{auth_registry}/gpuforge/unvalidated:1"],
                           capture_output=True, text=True, env={**os.environ, "DOCKER_CONFIG": os.path.dirname(af)})
    assert r.returncode != 0 and "no matching attestations" in r.stderr + r.stdout, r.stderr[-1000:]
    docker_engine.images.remove(f"{auth_registry}/gpuforge/unvalidated:1")


def test_promoting_twice_changes_nothing(pushed, validated, creds):
    t, res = pushed
    promote.promote_targets([t], env="dev", reports=validated["reports"])
    [again] = promote.promote_targets([t], env="dev", reports=validated["reports"])
    assert again["moved"] == [] and set(again["unchanged"]) == {f"{t.tag}-dev", *t.aliases["dev"]}


def _refused(t, match: str, reports, env: str = "prod", **kw):
    before = [_digest(t.registry, t.repository, f"{t.tag}-{e}") for e in ("dev", "prod")]
    with pytest.raises(PromotionRefused, match=match) as e:
        promote.promote_targets([t], env=env, reports=reports, **kw)
    assert [_digest(t.registry, t.repository, f"{t.tag}-{e}") for e in ("dev", "prod")] == before, "a tag moved"
    return str(e.value)


def test_missing_report_is_refused(pushed, creds, tmp_path):
    t, _ = pushed
    _refused(t, "no validation report", tmp_path)


def test_red_report_is_refused(pushed, creds, tmp_path, restore_record):
    t, _ = pushed
    r = gpuforge("validate", "--reports", str(tmp_path), "--pytest-args", "-k test_torch --gpuforge-expect torch=0.0.0")
    assert r.returncode == 5
    _refused(t, "failed: test_torch", tmp_path)


def test_subset_run_is_partial_and_refused(pushed, creds, tmp_path, restore_record):
    t, _ = pushed
    r = gpuforge("validate", "--reports", str(tmp_path), "--pytest-args", "-k test_torch")
    assert r.returncode == 0 and "partial run" in r.stderr, r.stderr[-2000:]
    rep = json.loads((tmp_path / t.id / "report.json").read_text())
    assert rep["evidence"]["partial"] and not rep["green"]
    assert "PARTIAL" in (tmp_path / t.id / "report.md").read_text()
    _refused(t, "it is partial: .* required check\\(s\\) did not run", tmp_path)


def test_skipped_required_check_is_refused(pushed, validated, creds, tmp_path, restore_record):
    """A required check that skipped for a reason off the reviewed list (as a broken fixture or a stray
    pytest.skip would make it) is not evidence, even with every other check green."""
    t, _ = pushed
    reports, path = _copy_reports(validated, tmp_path)
    rep = json.loads(path.read_text())
    check = next(c for c in rep["checks"] if c["name"] == "test_root_login_refused")
    check.update(outcome="skipped", message="sshd did not start in time")
    path.write_text(json.dumps(rep))
    records.update(t.id, report_digest=evidence.digest_of(rep))  # as if validate had written it
    _refused(t, "required check test_root_login_refused skipped \\(sshd did not start in time; reason not on the reviewed list\\)",
             reports)


def test_hand_edited_report_is_refused(pushed, validated, creds, tmp_path, restore_record):
    t, _ = pushed
    reports, path = _copy_reports(validated, tmp_path)
    rep = json.loads(path.read_text())
    rep["facts"]["versions"]["torch"] = "2.7.1+cu999"
    path.write_text(json.dumps(rep))
    _refused(t, "was changed after validation", reports)
    # an editor who also rewrites the local build record still meets the signed report on the registry
    records.update(t.id, report_digest=evidence.digest_of(rep))
    _refused(t, "differs from the signed one on the registry", reports, env="dev")


def test_report_for_another_image_is_refused(pushed, validated, creds, tmp_path, restore_record):
    t, _ = pushed
    reports, path = _copy_reports(validated, tmp_path)
    rep = json.loads(path.read_text())
    rep["evidence"]["image_id"] = rep["facts"]["image_id"] = "sha256:" + "0" * 64
    path.write_text(json.dumps(rep))
    records.update(t.id, report_digest=evidence.digest_of(rep))
    _refused(t, "report is for image sha256:0+, not the pushed image", reports)


def test_unsigned_or_wrongly_signed_evidence_is_refused(pushed, validated, creds, monkeypatch, tmp_path):
    t, _ = pushed
    monkeypatch.delenv("GPUFORGE_COSIGN_PUBLIC_KEY")
    _refused(t, "no way to verify the signed evidence", validated["reports"], env="dev")
    subprocess.run(["cosign", "generate-key-pair", "--output-key-prefix", str(tmp_path / "other")], check=True,
                   capture_output=True, env={**os.environ, "COSIGN_PASSWORD": "x"})
    _refused(t, "carries no signed validation attestation that verifies", validated["reports"], env="dev",
             key=str(tmp_path / "other.pub"))


def test_prod_needs_a_gpu_report_when_required(pushed, validated, creds):
    t, _ = pushed
    _refused(t, "no GPU validation report", validated["reports"], require_gpu=True)


def test_non_gpu_report_cannot_stand_in_for_a_gpu_one(pushed, validated, creds, tmp_path, restore_record):
    t, _ = pushed
    reports, path = _copy_reports(validated, tmp_path)
    shutil.copy(path, path.with_name("report-gpu.json"))
    records.update(t.id, gpu_report_digest=records.require(t.id)["report_digest"])
    _refused(t, "not a GPU report", reports, require_gpu=True)


def test_repushed_tag_after_validation_is_refused(validated, auth_registry, creds, docker_engine, cosign_keys):
    t = _target(validated, auth_registry, "gpuforge/repush")
    [res] = promote.push_targets([t])
    promote.attest_targets([t], reports=validated["reports"], key=cosign_keys["key"])
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


def test_digest_gone_from_the_registry_is_refused(validated, auth_registry, creds, restore_record):
    t = _target(validated, auth_registry, "gpuforge/gone")
    [res] = promote.push_targets([t])
    with auth_file(auth_registry) as af:
        subprocess.run(["skopeo", "delete", "--tls-verify=false", "--authfile", af,
                        f"docker://{auth_registry}/gpuforge/gone@{res['digest']}"], check=True, capture_output=True)
    with pytest.raises(PromotionRefused, match=f"the registry has no manifest {res['digest']}"):
        promote.promote_targets([t], env="dev", reports=validated["reports"])
    assert _digest(auth_registry, "gpuforge/gone", f"{t.tag}-dev") is None


def test_prod_before_dev_is_refused(validated, auth_registry, creds):
    t = _target(validated, auth_registry, "gpuforge/nodev")
    promote.push_targets([t])
    with pytest.raises(PromotionRefused, match="promote to dev first"):
        promote.promote_targets([t], env="prod", reports=validated["reports"])


def test_token_auth_registry_promotes_with_scoped_tokens(token_pushed, token_registry, validated, creds):
    """Reads get a pull token, the tag copy a pull+push token (the first token is not reused)."""
    t, res = token_pushed
    reports = validated["reports"]
    token_registry.tokens.issued.clear()
    [dev] = promote.promote_targets([t], env="dev", reports=reports)
    [prod] = promote.promote_targets([t], env="prod", reports=reports)
    for tag in (f"{t.tag}-dev", f"{t.tag}-prod", *t.aliases["dev"], *t.aliases["prod"]):
        assert _digest(t.registry, t.repository, tag) == res["digest"], tag
    assert dev["moved"] and prod["moved"]
    grants = [a["actions"] for i in token_registry.tokens.issued for a in i["access"] if a["name"] == t.repository]
    assert ["pull"] in grants and ["pull", "push"] in grants, grants


def test_token_auth_read_only_account_is_refused_clearly(token_pushed, token_registry, validated, monkeypatch, cosign_keys):
    t, res = token_pushed
    _env(monkeypatch, cosign_keys, READER, READER_PASSWORD)
    with pytest.raises(RegistryError, match="refused the credentials for PUT") as e:
        promote.promote_targets([dataclasses.replace(t, aliases={"dev": ("reader-try",)})], env="dev", reports=validated["reports"])
    assert READER_PASSWORD not in str(e.value)
    assert _digest(t.registry, t.repository, "reader-try") is None


def test_docker_config_credentials_are_used(token_pushed, validated, monkeypatch, tmp_path, cosign_keys):
    """No GPUFORGE_REGISTRY_* variables: skopeo and cosign read $DOCKER_CONFIG/config.json as `docker login` writes it."""
    import base64

    t, res = token_pushed
    monkeypatch.setenv("GPUFORGE_COSIGN_PUBLIC_KEY", cosign_keys["pub"])
    monkeypatch.delenv("GPUFORGE_REGISTRY_USER", raising=False)
    monkeypatch.delenv("GPUFORGE_REGISTRY_PASSWORD", raising=False)
    (tmp_path / "config.json").write_text(json.dumps(
        {"auths": {t.registry: {"auth": base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()}}}))
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    [dev] = promote.promote_targets([t], env="dev", reports=validated["reports"])
    assert dev["digest"] == res["digest"]


def test_registry_down_is_a_clear_error(validated, pushed, creds):
    t = _target(validated, f"127.0.0.1:{free_port()}", "gpuforge/pytorch")
    with pytest.raises(RegistryError, match=r"cannot reach registry 127\.0\.0\.1"):
        promote.promote_targets([t], env="dev", reports=validated["reports"])


def test_wrong_credentials_are_refused_and_never_printed(pushed, validated, monkeypatch, capsys, cosign_keys):
    t, _ = pushed
    _env(monkeypatch, cosign_keys, USER, "wrong-password-xyz")
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
    missing = dataclasses.replace(t, base_image=f"127.0.0.1:{free_port()}/nothing/here:1", bootstrap=None)
    from gpuforge.errors import EngineError

    with pytest.raises(EngineError, match=r"cannot pull base image 127\.0\.0\.1"):
        bases.ensure_base(missing, log=lambda _: None)
