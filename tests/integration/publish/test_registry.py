"""Push, sign and promote against real Debian docker-registry instances on 127.0.0.1: one with htpasswd
basic auth (the run's registry: this module keeps to its `gpuforge/` repositories), one with token auth (scoped JWTs
from a real token server, see registries.py), one open (killed mid-promotion). Signatures are real cosign
attestations with a key pair made for the run; the evidence is signed by the run's real `gpuforge validate --attest`
of the default image (`validated` in conftest.py, shared with the other modules that promote or report it).

FIXTURES, said where used: the GPU statements (no GPU here) are made from docs/measurements/smoke-cdi-h200.json,
a real H200 run, merged into this run's report; the statements of the derived image (a one-file layer on the
default image, the cheap second digest rollback needs) are this run's report with that image's id. Both go
through the real signing path (gpuforge.evidence.signed_run.sign_report, cosign with the test key) and say
`"facts": {"fixture": ...}` inside. The canary's digest is the devel image's, and the statement it could reuse but
must not is a FIXTURE too: this run's report with the devel image's content facts (tests/devel_canary.py).

Cost: the run's push and signed validation (once per run, ~3 min + ~2 min on 2 cores, counted in the first module
that needs them), one skopeo copy to the token registry and one to the open registry (blobs stay compressed; the
run's registries share one blob folder, so neither stores a second copy), then manifest copies and cosign calls
(< 2 s each). The canary's run is the devel image's one full validation (~3 min; tests/devel_canary.py), shared with
test_devel_target.py.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import docker.errors
import pytest
import state_here
from devel_canary import DEVEL, REPO, fixture_rep, on_registry, set_env, sign
from fleet_reports import KIND, gpu_checks
from registries import (
    DOC_REF,
    PASSWORD,
    READER,
    READER_PASSWORD,
    USER,
    USERS,
    LocalRegistry,
    documented_consumer_command,
    free_port,
    link_run_layers,
    run_registry,
)
from second_engine import Registry as RegistryProcess
from second_engine import checkout_snapshot, matrix_copy
from state_here import records

from conftest import KEY_PASSWORD, ROOT, gpuforge
from gpuforge.builder import bases
from gpuforge.errors import ConfigError, PromotionRefused, RegistryError
from gpuforge.plan.target import ImageRef
from gpuforge.plan.version import BuildId
from gpuforge.publish import history, promote, rollback
from gpuforge.push import pusher
from gpuforge.registry import attest
from gpuforge.registry.client import Registry, auth_file
from gpuforge.validate import evidence

pytestmark = pytest.mark.docker
H200 = ROOT / "docs" / "measurements" / "smoke-cdi-h200.json"


@pytest.fixture(scope="module")
def auth_registry():
    """The run's htpasswd registry (registries.py): this module keeps to the `gpuforge/` repositories in it."""
    return run_registry()


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
    set_env(mp, cosign_keys, user, password)


@pytest.fixture
def creds(monkeypatch, cosign_keys):
    _env(monkeypatch, cosign_keys)


_target = on_registry


def _promote(t, env: str, cosign_keys, **kw) -> dict:
    [res] = promote.promote_targets([t], env=env, **state_here.promote_kw(cosign_keys["key"], kw.pop("key", None)), **kw)
    return res


def _matrix(tmp_path, registry: str, repo: str) -> Path:
    """The project matrix pointed at a test registry and repository, for CLI runs."""
    return matrix_copy(ROOT, tmp_path / f"matrix-{repo.replace('/', '-')}.yaml", registry, repo)


def _carry_evidence(t, digest: str, dst_repo: str) -> None:
    """Copy the digest's signed statements (its `.att` manifest, digest preserved) to another repository."""
    att = "sha256-" + digest.split(":", 1)[1] + ".att"
    with auth_file(state_here.auth(), t.registry) as af:
        subprocess.run(["skopeo", "copy", "--preserve-digests", "--src-tls-verify=false", "--dest-tls-verify=false",
                        *(["--authfile", af] if af else []), f"docker://{t.registry}/{t.repository}:{att}",
                        f"docker://{t.registry}/{dst_repo}:{att}"], check=True, capture_output=True)


@pytest.fixture(scope="module")
def pushed(validated, auth_registry):
    """The run's validated image (conftest.py): the default image pushed with credentials to the run's basic-auth
    registry, then validated with `gpuforge validate --attest`: the full validator suite, its result signed in that
    run. This module promotes, copies and signs from that digest."""
    t = _target(validated["target"], auth_registry, "gpuforge/pytorch")
    # the run's push is of this target's build, under its version tag, to this registry
    assert validated["push"]["ref"] == str(t.version_ref(validated["record"]["version"]))
    report = json.loads((validated["reports"] / t.id / "report.json").read_text())
    return t, {"target": t.id, **validated["push"], "reports": validated["reports"], "report": report}


def _fixture_rep(base: dict, note: str, image_id: str | None = None) -> dict:
    return fixture_rep(base, note, image_id, origin="tests/integration/publish/test_registry.py")


def gpu_fixture(base: dict, image_id: str | None = None) -> dict:
    """A GPU validation report: this run's checks with the driver + GPU checks and GPU facts of a real H200
    run (docs/measurements/smoke-cdi-h200.json) in place of the ones skipped here for want of a GPU."""
    h200 = json.loads(H200.read_text())
    rep = _fixture_rep(base, "GPU checks from docs/measurements/smoke-cdi-h200.json", image_id)
    required = evidence.required_checks(KIND)
    rep["checks"] = gpu_checks(rep["checks"], required)
    rep["gpu"] = True
    rep["selection"] = {**rep.get("selection", {}), "kind": KIND.as_dict(), "not_applicable": []}
    rep["facts"]["gpus"], rep["facts"]["driver"] = h200["facts"]["gpus"], h200["facts"]["driver"]
    rep["evidence"] = evidence.stamp(rep, required=required, gpu=True)
    rep["problems"] = evidence.problems(rep, require_gpu=True)
    rep["green"] = not rep["problems"]
    assert rep["green"], rep["problems"]
    return rep


def _sign(t, digest: str, rep: dict, cosign_keys) -> None:
    """The one signing path validate --attest uses, for a fixture report."""
    sign(t, digest, rep, cosign_keys, USER, PASSWORD)


@pytest.fixture(scope="module")
def gpu_signed(pushed, cosign_keys):
    """The pushed digest also carries a signed GPU validation statement (FIXTURE from the H200 report)."""
    t, res = pushed
    _sign(t, res["digest"], gpu_fixture(res["report"]), cosign_keys)
    return t, res


@pytest.fixture(scope="module")
def token_pushed(gpu_signed, token_registry, cosign_keys):
    """The same bytes and their signed statements copied by skopeo to the token-auth registry (digests kept)."""
    mp = pytest.MonkeyPatch()
    _env(mp, cosign_keys)
    t, res = gpu_signed
    tt = _target(t, token_registry.host, "gpuforge/pytorch")
    att = "sha256-" + res["digest"].split(":", 1)[1] + ".att"
    t0 = time.monotonic()
    assert t.registry == run_registry() and link_run_layers(t.repository, token_registry, tt.repository)
    with auth_file(state_here.auth(), t.registry, tt.registry) as af:
        for src, dst in ((f"{t.repository}@{res['digest']}", f"{tt.repository}:{_version(tt)}"),
                         (f"{t.repository}:{att}", f"{tt.repository}:{att}")):
            subprocess.run(["skopeo", "copy", "--preserve-digests", "--src-tls-verify=false", "--dest-tls-verify=false",
                            "--authfile", af, f"docker://{t.registry}/{src}", f"docker://{tt.registry}/{dst}"],
                           check=True, capture_output=True)
    print(f"\nskopeo copy to the token registry: {time.monotonic() - t0:.0f} s")
    mp.undo()
    return tt, res


@pytest.fixture
def restore_record(default_build):
    """Tests that rewrite the build record (as a tampering user would) get it back afterwards."""
    t = default_build[0]
    before = records.require_build(t.id)
    yield
    records.restore_build(t.id, before)


def _digest(registry: str, repo: str, tag: str) -> str | None:
    m = Registry(state_here.auth()).manifest(ImageRef(registry, repo, tag))
    return m.digest if m else None


def _version(t) -> str:
    """The version tag of the target's recorded build (the run's default build, unless a test records another)."""
    return records.require_build(t.id).version


def _env_tags(t, env: str, version: str | None = None) -> list[str]:
    """The tags a promotion of the recorded build (or of `version`) to `env` points at its digest."""
    return promote.env_tags(t, env, version or _version(t)).all()


def _moving(t, env: str) -> tuple[str, ...]:
    """The environment's own tags, which follow promotions and rollbacks: `<tag>-<env>` and the aliases."""
    return promote.env_tags(t, env).moving


def _snapshot(t) -> dict:
    return {tag: _digest(t.registry, t.repository, tag) for env in ("dev", "prod") for tag in _env_tags(t, env)}


def _refused(t, match: str, cosign_keys, env: str = "prod", **kw) -> str:
    before = _snapshot(t)
    with pytest.raises(PromotionRefused, match=match) as e:
        _promote(t, env, cosign_keys, **kw)
    assert _snapshot(t) == before, "a tag moved"
    return str(e.value)


def _repo_copy(pushed, repo: str, *, evidence_too: bool = True):
    """The pushed image in another repository of the same registry (blobs mounted), with or without its
    signed statements: an isolated place for tests that sign red statements."""
    t, res = pushed
    tr = _target(t, t.registry, repo)
    [r] = pusher.push_targets([tr], **state_here.push_kw())
    assert r["digest"] == res["digest"]
    if evidence_too:
        _carry_evidence(t, res["digest"], repo)
    return tr, res


def test_push_records_the_digest_of_the_validated_image(pushed, creds):
    t, res = pushed
    assert records.require_build(t.id).digest == res["digest"]
    m = Registry(state_here.auth()).manifest(t.ref.pinned(res["digest"]))
    assert m.config_digest == records.require_build(t.id).image_id


def test_validate_attest_signs_the_runs_own_report(pushed, creds, cosign_keys):
    """What the run signed is its report (the local copy is that, byte for byte in content), plus who signed it."""
    t, res = pushed
    ref = f"{t.registry}/{t.repository}@{res['digest']}"
    [first, *_] = attest.verified_statements(ref, attest.VALIDATION_TYPE, state_here.verifier(cosign_keys["pub"]))
    pred = dict(first.predicate)
    run = pred.pop("run")
    local = dict(res["report"])
    local_run = local.pop("run", {})  # the report's own run facts; the statement's run block adds who signed it
    assert evidence.digest_of(pred) == evidence.digest_of(local)
    assert {k: run.get(k) for k in local_run} == local_run
    assert run["signed_in_run"] is True and run["subject"] == ref
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert run["git_revision"] == (head or None)


def test_validate_attest_refuses_a_target_not_pushed_there(pushed, creds, cosign_keys, tmp_path):
    t, _ = pushed
    m = _matrix(tmp_path, t.registry, "gpuforge/never-pushed")
    r = gpuforge("--matrix", str(m), "validate", "--attest", "--sign-key", cosign_keys["key"], "--reports", str(tmp_path))
    assert r.returncode == 6, r.stderr[-2000:]
    assert r.stderr.count("\n") == 1 and "is missing, not the built image" in r.stderr, r.stderr
    assert "validating" not in r.stdout  # refused before any check ran


def test_attest_of_a_report_file_is_refused_in_one_line(pushed, creds, cosign_keys, tmp_path):
    t, res = pushed
    r = gpuforge("attest", "--key", cosign_keys["key"], "--registry", t.registry, "--reports", str(res["reports"]))
    assert r.returncode == 7, r.stderr
    assert r.stderr.count("\n") == 1 and "attest of a report file is refused" in r.stderr
    assert "validate --attest" in r.stderr


def test_promote_dev_then_prod_moves_exactly_the_validated_digest(gpu_signed, creds, cosign_keys, capsys):
    t, res = gpu_signed
    dev = _promote(t, "dev", cosign_keys)
    prod = _promote(t, "prod", cosign_keys)
    for tag in (*_env_tags(t, "dev"), *_env_tags(t, "prod")):
        assert _digest(t.registry, t.repository, tag) == res["digest"], tag
    assert "latest" in prod["moved"] and dev["digest"] == prod["digest"] == res["digest"]
    out = capsys.readouterr()
    assert PASSWORD not in out.out + out.err
    h = history.load(Registry(state_here.auth()), t.ref.bare(), state_here.verifier(cosign_keys["pub"]), target=t.id, env="prod")
    last = h.last()
    assert last.phase == "done" and last.digest == res["digest"] and not last.allow_no_gpu
    assert last.evidence.gpu_model == "NVIDIA H200" and last.evidence.green


def test_consumer_verifies_the_promoted_image_with_cosign(gpu_signed, creds, cosign_keys):
    """What the README tells a consumer to run before pulling: the signed report, green, for these bytes."""
    t, res = gpu_signed
    _promote(t, "dev", cosign_keys)
    with auth_file(state_here.auth(), t.registry) as af:
        r = subprocess.run(["cosign", "verify-attestation", "--key", cosign_keys["pub"], "--type", attest.VALIDATION_TYPE,
                            "--insecure-ignore-tlog=true", "--allow-http-registry", f"{t.registry}/{t.repository}:{t.tag}-dev"],
                           capture_output=True, text=True, env={**os.environ, "DOCKER_CONFIG": os.path.dirname(af)})
    assert r.returncode == 0, r.stderr[-2000:]
    preds = attest.verified_predicates(f"{t.registry}/{t.repository}@{res['digest']}", attest.VALIDATION_TYPE,
                                       state_here.verifier(cosign_keys["pub"]))
    assert preds[0]["green"] and not evidence.problems(preds[0])
    assert preds[0]["evidence"]["image_id"] == records.require_build(t.id).image_id
    [inv] = attest.verified_predicates(f"{t.registry}/{t.repository}@{res['digest']}", attest.INVENTORY_TYPE,
                                       state_here.verifier(cosign_keys["pub"]))
    assert inv["python"]["torch"].startswith("2.7.1")


def test_the_documented_consumer_command_works_verbatim(pushed, validated, creds, cosign_keys):
    """The command a consumer copies from the docs, run by bash as written (only the key file and the image
    reference replaced), against the attested image signed with a key and without the transparency log."""
    t, _ = pushed
    promote.promote_targets([t], env="dev", reports=validated["reports"], **state_here.promote_kw(cosign_keys["key"]))
    cmd = documented_consumer_command()
    assert DOC_REF in cmd and "--key cosign.pub " in cmd
    cmd = cmd.replace(DOC_REF, f"{t.registry}/{t.repository}:{t.tag}-dev").replace("--key cosign.pub ",
                                                                                  f"--key {cosign_keys['pub']} ")
    with auth_file(state_here.auth(), t.registry) as af:  # what `docker login` leaves for cosign
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
    with auth_file(state_here.auth(), auth_registry) as af:
        r = subprocess.run(["cosign", "verify-attestation", "--key", cosign_keys["pub"], "--type", attest.VALIDATION_TYPE,
                            "--insecure-ignore-tlog=true", "--allow-http-registry", f"{auth_registry}/gpuforge/unvalidated:1"],
                           capture_output=True, text=True, env={**os.environ, "DOCKER_CONFIG": os.path.dirname(af)})
    assert r.returncode != 0 and "no matching attestations" in r.stderr + r.stdout, r.stderr[-1000:]
    docker_engine.images.remove(f"{auth_registry}/gpuforge/unvalidated:1")


def test_promoting_twice_changes_nothing(pushed, creds, cosign_keys):
    t, _ = pushed
    _promote(t, "dev", cosign_keys)
    n = len(history.load(Registry(state_here.auth()), t.ref.bare(), state_here.verifier(cosign_keys["pub"]), target=t.id,
                         env="dev").records)
    again = _promote(t, "dev", cosign_keys)
    assert again["moved"] == [] and set(again["unchanged"]) == set(_env_tags(t, "dev"))
    assert len(history.load(Registry(state_here.auth()), t.ref.bare(), state_here.verifier(cosign_keys["pub"]), target=t.id,
                            env="dev").records) == n, "a no-op promotion wrote a record"


def test_prod_without_gpu_evidence_is_refused_by_default(pushed, creds, cosign_keys, tmp_path, restore_record):
    """No GPUFORGE_PROD_REQUIRE_GPU, no --require-gpu: prod still needs signed GPU evidence; --allow-no-gpu is
    the explicit way round it, printed as a warning and kept in the signed promotion record."""
    tr, res = _repo_copy(pushed, "gpuforge/nogpu", evidence_too=False)
    _sign(tr, res["digest"], res["report"], cosign_keys)  # the run's own (non-GPU) report, and nothing else
    m = _matrix(tmp_path, tr.registry, "gpuforge/nogpu")
    r = gpuforge("--matrix", str(m), "promote", "--env", "dev", "--sign-key", cosign_keys["key"], "--key", cosign_keys["pub"])
    assert r.returncode == 0, r.stderr[-2000:]
    r = gpuforge("--matrix", str(m), "promote", "--env", "prod", "--sign-key", cosign_keys["key"], "--key", cosign_keys["pub"])
    assert r.returncode == 7, r.stderr
    assert r.stderr.count("\n") == 1 and "carries no signed GPU validation" in r.stderr, r.stderr
    assert _digest(tr.registry, tr.repository, f"{tr.tag}-prod") is None
    r = gpuforge("--matrix", str(m), "promote", "--env", "prod", "--allow-no-gpu", "--sign-key", cosign_keys["key"], "--key", cosign_keys["pub"])
    assert r.returncode == 0, r.stderr[-2000:]
    assert "WARNING" in r.stderr and "WITHOUT GPU evidence" in r.stderr
    assert _digest(tr.registry, tr.repository, f"{tr.tag}-prod") == res["digest"]
    last = history.load(Registry(state_here.auth()), tr.ref.bare(), state_here.verifier(cosign_keys["pub"]), target=tr.id, env="prod").last()
    assert last.phase == "done" and last.allow_no_gpu
    r = gpuforge("--matrix", str(m), "history", tr.id, "--env", "prod", "--key", cosign_keys["pub"])
    assert r.returncode == 0 and "WITHOUT GPU evidence" in r.stdout, r.stdout + r.stderr


def test_forged_report_sequence_is_refused(pushed, creds, cosign_keys, tmp_path, restore_record):
    """The issue's sequence, exactly: edit report.json (torch 6.6.6), write evidence.digest_of(report) into
    builds.json, raise `started`, `gpuforge attest --key`, `promote --to dev`. Here on a repository where
    the image has no signed run: nothing is signed and nothing moves."""
    t, res = pushed
    tr, _ = _repo_copy(pushed, "gpuforge/forged", evidence_too=False)
    m = _matrix(tmp_path, tr.registry, "gpuforge/forged")
    reports = tmp_path / "reports"
    shutil.copytree(res["reports"] / t.id, reports / t.id)
    path = reports / t.id / "report.json"
    rep = json.loads(path.read_text())
    rep["facts"]["versions"]["torch"] = "6.6.6"
    rep["started"] = time.time() + 10 * 365 * 86400
    path.write_text(json.dumps(rep))
    records.update_build(t.id, report_digest=evidence.digest_of(rep))
    r = gpuforge("--matrix", str(m), "attest", "--key", cosign_keys["key"], "--reports", str(reports))
    assert r.returncode == 7 and "attest of a report file is refused" in r.stderr, r.stderr
    att = "sha256-" + res["digest"].split(":", 1)[1] + ".att"
    assert _digest(tr.registry, tr.repository, att) is None, "something was signed"
    r = gpuforge("--matrix", str(m), "promote", "--env", "dev", "--reports", str(reports), "--key", cosign_keys["pub"], "--sign-key", cosign_keys["key"])
    assert r.returncode == 7, r.stderr
    assert r.stderr.count("\n") == 1 and "carries no signed validation attestation" in r.stderr, r.stderr
    assert all(_digest(tr.registry, tr.repository, tag) is None for tag in _env_tags(tr, "dev"))


def test_red_statement_newer_than_green_blocks_whatever_its_fields_say(pushed, creds, cosign_keys, tmp_path):
    """Registry order decides, never a field the signer wrote: a red run signed after the green one blocks
    even when its `started` claims it is older; a green run signed after that unblocks."""
    t, res = pushed
    tr, _ = _repo_copy(pushed, "gpuforge/red")
    red = _fixture_rep(res["report"], "a failed check written in")
    next(c for c in red["checks"] if c["name"] == "test_root_login_refused").update(outcome="failed", message="FIXTURE")
    red["started"] = res["report"]["started"] - 86400
    _sign(tr, res["digest"], red, cosign_keys)
    msg = _refused(tr, "newest signed validation statement .* newer than [12] green one\\(s\\)\\) is not evidence: failed: "
                       "test_root_login_refused", cosign_keys, env="dev")
    assert "no tag was changed" in msg
    _sign(tr, res["digest"], res["report"], cosign_keys)  # the same green report signed again, after the red one
    assert _promote(tr, "dev", cosign_keys)["moved"]


def test_a_real_red_run_signed_by_validate_attest_blocks(pushed, creds, cosign_keys, tmp_path, restore_record):
    """`validate --attest` signs a red (and partial) run too, and being the newest it blocks the earlier green."""
    tr, _ = _repo_copy(pushed, "gpuforge/redrun")
    m = _matrix(tmp_path, tr.registry, "gpuforge/redrun")
    r = gpuforge("--matrix", str(m), "validate", "--attest", "--sign-key", cosign_keys["key"], "--reports", str(tmp_path),
                 "--pytest-args", "-k test_torch --gpuforge-expect torch=0.0.0")
    assert r.returncode == 5, r.stderr[-2000:]
    assert "signed this run's validation (NOT green)" in r.stdout
    _refused(tr, "is not evidence: .*partial.*failed: test_torch", cosign_keys, env="dev")


def test_skipped_required_check_is_refused(pushed, creds, cosign_keys):
    """A required check that skipped without a typed environmental reason (as a broken fixture or a stray
    pytest.skip would make it) is not evidence, even with every other check green."""
    t, res = pushed
    tr, _ = _repo_copy(pushed, "gpuforge/skip", evidence_too=False)
    rep = _fixture_rep(res["report"], "a required check made to skip")
    next(c for c in rep["checks"] if c["name"] == "test_root_login_refused").update(
        outcome="skipped", message="sshd did not start in time")
    _sign(tr, res["digest"], rep, cosign_keys)
    _refused(tr, "required check test_root_login_refused skipped \\(sshd did not start in time; a chosen check may "
                 "skip only for a typed environmental reason\\)", cosign_keys, env="dev")


def test_statement_for_another_image_is_refused(pushed, creds, cosign_keys):
    t, res = pushed
    tr, _ = _repo_copy(pushed, "gpuforge/otherimage", evidence_too=False)
    _sign(tr, res["digest"], _fixture_rep(res["report"], "another image id", "sha256:" + "0" * 64), cosign_keys)
    _refused(tr, "is for image sha256:0+, not sha256:", cosign_keys, env="dev")


def test_unsigned_or_wrongly_signed_evidence_is_refused(pushed, creds, cosign_keys, monkeypatch, tmp_path):
    t, _ = pushed
    monkeypatch.delenv("GPUFORGE_COSIGN_PUBLIC_KEY")
    _refused(t, "no way to verify the signed evidence", cosign_keys, env="dev")
    subprocess.run(["cosign", "generate-key-pair", "--output-key-prefix", str(tmp_path / "other")], check=True,
                   capture_output=True, env={**os.environ, "COSIGN_PASSWORD": "x"})
    _refused(t, "carries no signed validation attestation that verifies", cosign_keys, env="dev",
             key=str(tmp_path / "other.pub"))


def test_repushed_tag_after_validation_is_refused(pushed, auth_registry, creds, docker_engine, cosign_keys):
    t, res = pushed
    tr, _ = _repo_copy(pushed, "gpuforge/repush")
    _promote(tr, "dev", cosign_keys)
    # someone pushes other bytes under the build's version tag after validation
    version = _version(t)
    other = docker_engine.images.get(t.base_image)
    other.tag(f"{auth_registry}/gpuforge/repush", version)
    for ev in docker_engine.images.push(f"{auth_registry}/gpuforge/repush", version, stream=True, decode=True,
                                        auth_config={"username": USER, "password": PASSWORD}):
        assert "error" not in ev, ev
    docker_engine.images.remove(f"{auth_registry}/gpuforge/repush:{version}")
    with pytest.raises(PromotionRefused, match="re-pushed after validation"):
        _promote(tr, "prod", cosign_keys)
    assert _digest(auth_registry, "gpuforge/repush", f"{t.tag}-prod") is None
    assert _digest(auth_registry, "gpuforge/repush", f"{version}-prod") is None
    assert _digest(auth_registry, "gpuforge/repush", f"{t.tag}-dev") == res["digest"]
    assert _digest(auth_registry, "gpuforge/repush", f"{version}-dev") == res["digest"]
    # and gpuforge's own push will not move the version tag back without --replace
    with pytest.raises(PromotionRefused, match="version tags are immutable: pass --replace"):
        pusher.push_targets([tr], **state_here.push_kw())


def test_digest_gone_from_the_registry_is_refused(pushed, auth_registry, creds, cosign_keys):
    tr, res = _repo_copy(pushed, "gpuforge/gone", evidence_too=False)
    with auth_file(state_here.auth(), auth_registry) as af:
        subprocess.run(["skopeo", "delete", "--tls-verify=false", "--authfile", af,
                        f"docker://{auth_registry}/gpuforge/gone@{res['digest']}"], check=True, capture_output=True)
    with pytest.raises(PromotionRefused, match=f"the registry has no manifest {res['digest']}"):
        _promote(tr, "dev", cosign_keys)
    assert _digest(auth_registry, "gpuforge/gone", f"{tr.tag}-dev") is None


def test_prod_before_dev_is_refused(pushed, creds, cosign_keys):
    tr, _ = _repo_copy(pushed, "gpuforge/nodev")
    with pytest.raises(PromotionRefused, match="promote this build to dev first"):
        _promote(tr, "prod", cosign_keys)


def test_token_auth_registry_promotes_with_scoped_tokens(token_pushed, token_registry, creds, cosign_keys):
    """Reads get a pull token, the tag copy a pull+push token (the first token is not reused)."""
    t, res = token_pushed
    token_registry.tokens.issued.clear()
    dev = _promote(t, "dev", cosign_keys)
    prod = _promote(t, "prod", cosign_keys)
    for tag in (*_env_tags(t, "dev"), *_env_tags(t, "prod")):
        assert _digest(t.registry, t.repository, tag) == res["digest"], tag
    assert dev["moved"] and prod["moved"]
    grants = [a["actions"] for i in token_registry.tokens.issued for a in i["access"] if a["name"] == t.repository]
    assert ["pull"] in grants and ["pull", "push"] in grants, grants


def test_token_auth_read_only_account_is_refused_clearly(token_pushed, token_registry, monkeypatch, cosign_keys):
    t, res = token_pushed
    _env(monkeypatch, cosign_keys, READER, READER_PASSWORD)
    with pytest.raises(RegistryError, match="refused the credentials for") as e:
        _promote(dataclasses.replace(t, aliases={"dev": ("reader-try",)}), "dev", cosign_keys)
    assert READER_PASSWORD not in str(e.value)
    assert _digest(t.registry, t.repository, "reader-try") is None


def test_docker_config_credentials_are_used(token_pushed, monkeypatch, tmp_path, cosign_keys):
    """No GPUFORGE_REGISTRY_* variables: skopeo and cosign read $DOCKER_CONFIG/config.json as `docker login` writes it."""
    import base64

    t, res = token_pushed
    monkeypatch.setenv("GPUFORGE_COSIGN_PUBLIC_KEY", cosign_keys["pub"])
    monkeypatch.setenv("COSIGN_PASSWORD", KEY_PASSWORD)
    monkeypatch.delenv("GPUFORGE_REGISTRY_USER", raising=False)
    monkeypatch.delenv("GPUFORGE_REGISTRY_PASSWORD", raising=False)
    (tmp_path / "config.json").write_text(json.dumps(
        {"auths": {t.registry: {"auth": base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()}}}))
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    assert _promote(t, "dev", cosign_keys)["digest"] == res["digest"]


def test_registry_down_is_a_clear_error(pushed, creds, cosign_keys):
    t = _target(pushed[0], f"127.0.0.1:{free_port()}", "gpuforge/pytorch")
    with pytest.raises(RegistryError, match=r"cannot reach registry 127\.0\.0\.1"):
        _promote(t, "dev", cosign_keys)


def test_wrong_credentials_are_refused_and_never_printed(pushed, monkeypatch, capsys, cosign_keys):
    t, _ = pushed
    _env(monkeypatch, cosign_keys, USER, "wrong-password-xyz")
    with pytest.raises(RegistryError, match="refused the credentials") as e:
        _promote(t, "dev", cosign_keys)
    out = capsys.readouterr()
    assert "wrong-password-xyz" not in str(e.value) + out.out + out.err


# --- a promotion as a transaction: the registry killed between two tag copies ------------------------------

SKOPEO_KILLER = """#!/bin/sh
# A skopeo that kills the test registry (SIGKILL) just before the Nth `skopeo copy`, then runs the real one.
if [ "$1" = copy ]; then
  n=$(( $(cat "$GF_COPY_COUNT" 2>/dev/null || echo 0) + 1 ))
  echo "$n" > "$GF_COPY_COUNT"
  if [ "$n" -eq "$GF_KILL_AT" ]; then kill -9 "$GF_REGISTRY_PID"; sleep 0.5; fi
fi
exec /usr/bin/skopeo "$@"
"""


def test_registry_killed_between_tag_copies_names_the_moved_tags_and_the_next_run_completes(
        gpu_signed, creds, cosign_keys, tmp_path_factory, tmp_path):
    t, res = gpu_signed
    d = tmp_path_factory.mktemp("reg-killed")
    reg = LocalRegistry(d, None)
    port = int(reg.host.rsplit(":", 1)[1])
    try:
        tk = _target(t, reg.host, "gpuforge/pytorch")
        att = "sha256-" + res["digest"].split(":", 1)[1] + ".att"
        assert t.registry == run_registry() and link_run_layers(t.repository, reg, tk.repository)
        with auth_file(state_here.auth(), t.registry) as af:
            for src, dst in ((f"{t.repository}@{res['digest']}", f"{tk.repository}:{_version(tk)}"),
                             (f"{t.repository}:{att}", f"{tk.repository}:{att}")):
                subprocess.run(["skopeo", "copy", "--preserve-digests", "--src-tls-verify=false", "--dest-tls-verify=false",
                                "--src-authfile", af, f"docker://{t.registry}/{src}", f"docker://{tk.registry}/{dst}"],
                               check=True, capture_output=True)
        m = _matrix(tmp_path, reg.host, "gpuforge/pytorch")
        wrap = tmp_path / "bin"
        wrap.mkdir()
        (wrap / "skopeo").write_text(SKOPEO_KILLER)
        (wrap / "skopeo").chmod(0o755)
        tags = _env_tags(tk, "dev")  # the build's own <version>-dev, then <tag>-dev and the two aliases
        assert len(tags) == 4 and tags[0] == f"{_version(tk)}-dev"
        env = {"PATH": f"{wrap}:{os.environ['PATH']}", "GF_COPY_COUNT": str(tmp_path / "count"), "GF_KILL_AT": "3",
               "GF_REGISTRY_PID": str(reg.proc.pid), "GPUFORGE_REGISTRY_USER": "", "GPUFORGE_REGISTRY_PASSWORD": ""}
        r = gpuforge("--matrix", str(m), "promote", "--env", "dev", "--key", cosign_keys["pub"], "--sign-key", cosign_keys["key"], env=env)
        assert r.returncode == 6, r.stdout + r.stderr
        line = r.stderr.strip().splitlines()[-1]
        assert f"interrupted: moved {tags[0]}, {tags[1]} to {res['digest'][:19]}, not moved {tags[2]}, {tags[3]}" in line, line
        assert "cannot reach registry" in line and "completes it" in line
        reg.proc.wait()
        reg.log.close()
        RegistryProcess.__init__(reg, d, port)  # the same registry back: same storage, same address
        assert [_digest(reg.host, tk.repository, tg) for tg in tags] == [res["digest"], res["digest"], None, None]
        r = gpuforge("--matrix", str(m), "status", "--env", "dev", "--key", cosign_keys["pub"])
        assert r.returncode == 0 and "INTERRUPTED promote" in r.stdout, r.stdout + r.stderr
        r = gpuforge("--matrix", str(m), "promote", "--env", "dev", "--key", cosign_keys["pub"], "--sign-key", cosign_keys["key"])
        assert r.returncode == 0, r.stdout + r.stderr
        assert "completing the interrupted promote" in r.stderr and f"already moved: {tags[0]}, {tags[1]}" in r.stderr
        assert all(_digest(reg.host, tk.repository, tg) == res["digest"] for tg in tags)
        h = history.load(Registry(state_here.auth()), ImageRef(reg.host, tk.repository), state_here.verifier(cosign_keys["pub"]), target=tk.id, env="dev")
        last = h.last()
        assert last.phase == "done" and last.resumed and last.moved == tags and h.interrupted() is None
        assert not h.warnings, h.warnings
    finally:
        reg.stop()


# --- version tags of two builds, rollback, status and history from a second checkout ------------------------

@pytest.fixture
def derived_image(docker_engine, pushed, tmp_path):
    """A second image of the same target: the default image plus one file (a new digest in seconds)."""
    t, _ = pushed
    base_tag = f"gpuforge-test/rollback-base:{uuid.uuid4().hex[:12]}"
    docker_engine.images.get(records.require_build(t.id).image_id).tag(base_tag)
    (tmp_path / "ctx").mkdir()
    (tmp_path / "ctx" / "marker").write_text(uuid.uuid4().hex)
    (tmp_path / "ctx" / "Dockerfile").write_text(f"FROM {base_tag}\nCOPY marker /opt/gpuforge-rollback-marker\n")
    # named: a runner's clean-up of untagged gpuforge images (images.yml) must not take it while the module runs
    img, _ = docker_engine.images.build(path=str(tmp_path / "ctx"), rm=True, labels={"gpuforge.test": "rollback"},
                                        tag=f"gpuforge-test/rollback:{uuid.uuid4().hex[:12]}")
    yield img.id
    docker_engine.images.remove(base_tag)
    try:
        docker_engine.images.remove(img.id, force=True)
    except docker.errors.APIError:  # best effort: a tag elsewhere may still hold it
        pass


def test_a_second_build_promotes_without_replace_rollback_restores_prod_and_a_second_checkout_sees_it(
        pushed, derived_image, creds, cosign_keys, tmp_path, restore_record, docker_engine):
    t, res = pushed
    a, va = res["digest"], _version(t)
    tr, _ = _repo_copy(pushed, "gpuforge/rollback")
    _sign(tr, a, gpu_fixture(res["report"]), cosign_keys)
    _promote(tr, "dev", cosign_keys)
    _promote(tr, "prod", cosign_keys)
    # other bytes under A's build identifier are a re-push of A's version tag: refused without --replace
    records.update_build(t.id, image_id=derived_image)
    with pytest.raises(PromotionRefused, match=r"already holds .* version tags are immutable: pass --replace"):
        pusher.push_targets([tr], **state_here.push_kw())
    # B: the next build of the same target, as `gpuforge build` records it: its own version tag, pushed beside A's
    build_b = BuildId.at_time(dt.datetime.now(dt.UTC))
    vb = tr.version(build_b)
    records.update_build(t.id, image_id=derived_image, build=str(build_b), version=vb)
    [pb] = pusher.push_targets([tr], **state_here.push_kw())  # no --replace
    b = pb["digest"]
    assert b != a and vb != va
    assert _digest(tr.registry, tr.repository, va) == a and _digest(tr.registry, tr.repository, vb) == b
    _sign(tr, b, _fixture_rep(res["report"], "the default image's run, for the derived image", derived_image), cosign_keys)
    _sign(tr, b, gpu_fixture(res["report"], derived_image), cosign_keys)
    # the environments' tags follow B; A's own -dev and -prod stay on A; no --replace anywhere
    dev = _promote(tr, "dev", cosign_keys)
    prod = _promote(tr, "prod", cosign_keys)
    assert dev["replaced"] == prod["replaced"] == [] and f"{vb}-prod" in prod["moved"]
    assert all(_digest(tr.registry, tr.repository, tg) == b for tg in _env_tags(tr, "prod"))
    assert _digest(tr.registry, tr.repository, f"{va}-dev") == _digest(tr.registry, tr.repository, f"{va}-prod") == a
    # rollback prod one step, from the CLI, timed: the environment's tags go back to A, no version tag moves
    m = _matrix(tmp_path, tr.registry, "gpuforge/rollback")
    t0 = time.monotonic()
    r = gpuforge("--matrix", str(m), "rollback", "--env", "prod", tr.id, "--steps", "1", "--key", cosign_keys["pub"], "--sign-key", cosign_keys["key"])
    seconds = time.monotonic() - t0
    print(f"\nrollback of prod (CLI, evidence re-verified, 3 tags): {seconds:.1f} s")
    assert r.returncode == 0, r.stdout + r.stderr
    assert seconds < 60 and f"version {va}" in r.stdout, r.stdout
    assert all(_digest(tr.registry, tr.repository, tg) == a for tg in _moving(tr, "prod"))
    assert _digest(tr.registry, tr.repository, f"{vb}-prod") == b and _digest(tr.registry, tr.repository, f"{va}-prod") == a
    assert all(_digest(tr.registry, tr.repository, tg) == b for tg in _env_tags(tr, "dev"))
    # a second checkout, with no local state at all, sees the same
    second = checkout_snapshot(ROOT, tmp_path / "second")
    m2 = matrix_copy(second, second / "matrix.yaml", tr.registry, "gpuforge/rollback")
    state = tmp_path / "empty-state"
    state.mkdir()
    env2 = {"GPUFORGE_STATE_DIR": str(state), "GPUFORGE_LOG_DIR": str(state / "logs"), "PYTHONPATH": ""}
    run2 = [sys.executable, "-m", "gpuforge", "--matrix", str(m2)]

    def in_second(*args):
        return subprocess.run([*run2, *args], cwd=second, capture_output=True, text=True, timeout=300,
                              env={**os.environ, **env2})

    r = in_second("status", tr.id, "--env", "prod", "--key", cosign_keys["pub"], "--json")
    assert r.returncode == 0, r.stderr
    [row] = json.loads(r.stdout)
    assert row["digest"] == a and row["promotion"]["kind"] == "rollback" and row["local"] is None
    assert row["version"] == va and row["tags"][f"{va}-prod"] == a
    assert row["evidence"]["green"] and row["evidence"]["gpu"]["model"] == "NVIDIA H200"
    assert row["evidence"]["expires"]["state"] == "fresh" and 29 < row["evidence"]["expires"]["in_days"] <= 30
    r = in_second("status", tr.id, "--env", "prod", "--key", cosign_keys["pub"])
    assert "promoted: rollback" in r.stdout and "GPU green on NVIDIA H200" in r.stdout, r.stdout
    r = in_second("status", tr.id, "--env", "prod", "--key", cosign_keys["pub"], "--max-age-days", "prod=0.0001")
    assert "EXPIRED" in r.stdout, r.stdout  # the same evidence, held to a time to live of 9 seconds
    r = in_second("history", tr.id, "--env", "prod", "--key", cosign_keys["pub"], "--json")
    assert r.returncode == 0, r.stderr
    done = [x for x in json.loads(r.stdout)["records"] if x["phase"] == "done"]
    assert [(x["kind"], x["digest"], x["version"]) for x in done] == [("promote", a, va), ("promote", b, vb),
                                                                      ("rollback", a, va)]
    assert not any(x["replaced"] for x in done) and done[2]["rollback_to_seq"] == done[0]["seq"]
    r = in_second("history", tr.id, "--env", "prod", "--key", cosign_keys["pub"])
    assert r.returncode == 0 and "3 promotion(s)" in r.stdout and "back to #" in r.stdout, r.stdout + r.stderr
    # a rollback re-verifies: B's newest statement turned red, and going back to B is refused
    red = _fixture_rep(res["report"], "red, for the derived image", derived_image)
    next(c for c in red["checks"] if c["name"] == "test_root_login_refused").update(outcome="failed", message="FIXTURE")
    _sign(tr, b, red, cosign_keys)
    with pytest.raises(PromotionRefused, match="is not evidence: failed: test_root_login_refused"):
        rollback.rollback(tr, env="prod", to=b, steps=None, verifier=state_here.verifier(cosign_keys["pub"]), signer=state_here.signer(cosign_keys["key"]))
    with pytest.raises(PromotionRefused, match="was never promoted"):
        rollback.rollback(tr, env="prod", to="sha256:" + "1" * 64, steps=None, verifier=state_here.verifier(cosign_keys["pub"]), signer=state_here.signer(cosign_keys["key"]))
    with pytest.raises(ConfigError, match="not both"):
        rollback.rollback(tr, env="prod", to=a, steps=1, verifier=state_here.verifier(cosign_keys["pub"]), signer=state_here.signer(cosign_keys["key"]))
    assert all(_digest(tr.registry, tr.repository, tg) == a for tg in _moving(tr, "prod"))


def test_a_builds_environment_tag_moves_only_with_replace(pushed, derived_image, creds, cosign_keys, restore_record):
    """`<version>-dev` names one build for good. Only a re-push of that very version tag with other bytes (`push
    --replace`) can leave it naming another digest; promoting the new bytes then needs --replace too, recorded."""
    t, res = pushed
    a, va = res["digest"], _version(t)
    tr, _ = _repo_copy(pushed, "gpuforge/replace")
    _promote(tr, "dev", cosign_keys)
    records.update_build(t.id, image_id=derived_image)  # other bytes, the same build identifier
    [pb] = pusher.push_targets([tr], replace=True, **state_here.push_kw())
    b = pb["digest"]
    last = records.require_build(t.id).replaced[-1]
    assert b != a and (last["tag"], last["from"], last["to"]) == (va, a, b)
    _sign(tr, b, _fixture_rep(res["report"], "the default image's run, for the derived image", derived_image), cosign_keys)
    msg = _refused(tr, f"version tag\\(s\\) .*{va}-dev .*immutable: pass --replace", cosign_keys, env="dev")
    assert a[:19] in msg
    done = _promote(tr, "dev", cosign_keys, replace=True)
    assert done["replaced"] == [f"{va}-dev"]
    assert all(_digest(tr.registry, tr.repository, tg) == b for tg in _env_tags(tr, "dev"))


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


def test_canary_validates_again_what_dev_holds_and_a_red_canary_blocks_it(devel_canary, devel_build, creds, cosign_keys):
    """`gpuforge canary --env dev` pulls the digest dev holds, runs every validator on it (never reused by content, though
    a signed statement it could reuse is there) and signs the result onto that digest, marked as a canary; a red
    canary, being the newest statement, blocks the digest's promotion and `status` says so, until a green run is signed
    after it. The digest is the devel image's (tests/devel_canary.py): this canary is that image's one full validation."""
    c = devel_canary
    t, rec = devel_build
    tr = on_registry(t, run_registry(), REPO)
    ref, digest, m = c["ref"], c["digest"], c["matrix"]
    # what it could have reused: validate --attest of these bytes reused the signed statement (a FIXTURE) as they came
    assert "gpuforge: reused: the image checks" in c["attest_stdout"], c["attest_stdout"][-3000:]
    out = c["stdout"]
    assert c["rc"] == 0, out[-3000:] + c["stderr"][-2000:]
    assert f"dev holds {digest}; pulling it" in out
    assert "gpuforge: reused" not in out and f"validating {tr.id}" in out
    assert f"signed this run's validation (green) of what dev holds for {tr.id}, {ref}" in out
    statements = attest.verified_statements(ref, attest.VALIDATION_TYPE, state_here.verifier(cosign_keys["pub"]))
    newest = statements[-1].predicate
    assert newest["run"]["canary"] == "dev" and newest["run"]["subject"] == ref and not newest["run"].get("reused_from")
    assert newest["facts"]["image_id"] == rec["image_id"] and "fixture" not in newest["facts"]  # the bytes dev holds
    # status names one target (the matrix default without a selector): the devel one here
    r = gpuforge("--matrix", m, "status", *DEVEL, "--env", "dev", "--key", cosign_keys["pub"])
    assert r.returncode == 0 and "canary (dev, image): green at" in r.stdout, r.stdout[-2000:]
    # red: a canary whose check failed (a driver that moved, a new CVE check): signed like any run, newest
    red = _fixture_rep(newest, "a canary's failed check written in")
    next(c for c in red["checks"] if c["name"] == "test_root_login_refused").update(outcome="failed", message="FIXTURE")
    red["run"] = {k: v for k, v in red["run"].items() if k in ("canary", "gpuforge_version", "revision", "machine", "finished")}
    _sign(tr, digest, red, cosign_keys)
    r = gpuforge("--matrix", m, "status", *DEVEL, "--env", "dev", "--key", cosign_keys["pub"])
    assert "canary (dev, image): RED at" in r.stdout and "; blocks promotion of this digest until a green run" in r.stdout, r.stdout
    _refused(tr, "is not evidence: failed: test_root_login_refused", cosign_keys, env="dev")
    # nothing to prove where the environment holds nothing
    r = gpuforge("--matrix", m, "canary", "--env", "prod", "--sign-key", cosign_keys["key"],
                 env={"COSIGN_PASSWORD": KEY_PASSWORD})
    assert r.returncode == 0 and f"{tr.id}: prod holds no digest" in r.stdout, r.stdout + r.stderr
