"""GPU evidence from a GPU runner that cannot reach the registry: signed offline into one bundle file
(`validate --gpu --bundle`), attached on the connected side (`gpuforge attach`), then promoted to prod.

Real engine, real docker-registry (htpasswd), real cosign and skopeo. The image is a one-layer image imported here (2 KB
of random bytes), pushed through the engine and recorded as `gpuforge push` records a push. The GPU runs are
FIXTURES (no GPU here): tests/fleet_reports.py's real H200 run, stamped with this image's id and content (its
diff_ids, config) as `validate --gpu` stamps a run, and for the A100 pool with the model fields changed (labelled in
`facts.fixture`). Everything after the run is gpuforge's own code: the offline signing (signed_run.sign_into_bundle,
the function `validate --gpu --bundle` calls with its run's report, and validate_into_bundle itself, its validators
stood in for), the attach, the promotion. Each hostile bundle is refused in one line with its exit code, and the
registry's `.att` manifest is unchanged after it.
"""

from __future__ import annotations

import base64
import copy
import datetime as dt
import io
import json
import os
import re
import subprocess
import tarfile
import time
import types
import uuid
from pathlib import Path

import docker.errors
import pytest
import state_here
from fleet_reports import BASE, base_from_h200_run, gpu_report, non_gpu
from registries import PASSWORD, USER, USERS, LocalRegistry

from conftest import need
from gpuforge.cli import main
from gpuforge.errors import ConfigError, PromotionRefused
from gpuforge.evidence import bundle, signed_run
from gpuforge.plan.matrix import load_matrix
from gpuforge.plan.target import ImageRef
from gpuforge.publish import promote
from gpuforge.registry import attest
from gpuforge.registry.client import Registry
from gpuforge.state.records import Records
from gpuforge.validate import evidence
from gpuforge.validate.report_model import Report

pytestmark = pytest.mark.docker
KEY_PASSWORD = "bundle-test-key-pass"
FLEET = """\
fleet:
  h200:
    gpu: {model: H200, capability: "9.0"}
    drivers: ["580.159.04"]
    runs_on: [self-hosted, gpu, h200]
  a100:
    gpu: {model: A100, capability: "8.0"}
    drivers: ["570.133.20"]
    runs_on: [self-hosted, gpu, a100]
"""
BUILD = "20260101T000000Z"
REFUSED: list[str] = []  # each refusal's line, printed at the end of a test (after its last captured output)


def _tiny_image() -> str:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = os.urandom(2048)  # an image id of its own
        info = tarfile.TarInfo("payload")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return subprocess.run(["docker", "import", "-", f"gpuforge-test/bundle-{uuid.uuid4().hex[:12]}:1"],
                          input=buf.getvalue(), capture_output=True, check=True).stdout.decode().strip()


def _keys(d: Path, name: str) -> dict:
    subprocess.run(["cosign", "generate-key-pair", "--output-key-prefix", str(d / name)], check=True, capture_output=True,
                   env={**os.environ, "COSIGN_PASSWORD": KEY_PASSWORD})
    return {"key": str(d / f"{name}.key"), "pub": str(d / f"{name}.pub")}


@pytest.fixture(scope="module")
def setup(docker_engine, tmp_path_factory):
    """The image pushed to an htpasswd registry of this module, recorded as the matrix default's build and push in a
    state dir of this module; a matrix with two fleet pools; this run's key pair and another one."""
    import shutil

    for tool in ("cosign", "skopeo", "htpasswd"):
        if not shutil.which(tool):
            need(f"needs {tool} (tools/start-engine.sh installs it)")
    d = tmp_path_factory.mktemp("bundle")
    (d / "reg").mkdir()
    reg = LocalRegistry(d / "reg", "htpasswd", USERS)
    images = [_tiny_image(), _tiny_image()]  # the pushed one, and another the hostile bundle is about
    mp = pytest.MonkeyPatch()
    try:
        repo = f"gpuforge-bundle-{uuid.uuid4().hex[:8]}/pytorch"
        (d / "matrix.yaml").write_text(f"registry: {reg.host}\nrepository: {repo}\n" + BASE + FLEET)
        t = load_matrix(d / "matrix.yaml").select(None)[0]
        version = f"{t.tag}-{BUILD}"
        ref = t.version_ref(version)
        docker_engine.images.get(images[0]).tag(ref.name, version)
        events = list(docker_engine.images.push(ref.name, version, auth_config={"username": USER, "password": PASSWORD},
                                                stream=True, decode=True))
        assert not [ev for ev in events if "error" in ev], events
        [digest] = [ev["aux"]["Digest"] for ev in events if "Digest" in (ev.get("aux") or {})]
        state = d / "state"
        built = (dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)).isoformat(timespec="seconds")
        Records(state).update_build(t.id, image_id=images[0], digest=digest, pushed_ref=str(ref), version=version,
                                    build=BUILD, built_at=built)
        for k, v in {"GPUFORGE_STATE_DIR": str(state), "GPUFORGE_REGISTRY_USER": USER,
                     "GPUFORGE_REGISTRY_PASSWORD": PASSWORD, "COSIGN_PASSWORD": KEY_PASSWORD}.items():
            mp.setenv(k, v)
        for k in ("GPUFORGE_PROD_REQUIRE_CVE", "GPUFORGE_COSIGN_TLOG", "GPUFORGE_EVIDENCE_TTL_DAYS", "GPUFORGE_REGISTRY",
                  "GPUFORGE_COSIGN_KEY", "GPUFORGE_COSIGN_PUBLIC_KEY"):
            mp.delenv(k, raising=False)
        yield types.SimpleNamespace(d=d, reg=reg, t=t, images=images, digest=digest, ref=str(t.ref.pinned(digest)),
                                    ours=_keys(d, "ours"), theirs=_keys(d, "theirs"), engine=docker_engine)
    finally:
        mp.undo()
        reg.stop()
        for iid in images:
            try:
                docker_engine.images.remove(iid, force=True)
            except docker.errors.ImageNotFound:
                pass


def _report(s, *, image: int = 0, gpu: bool = True, model: str = "H200", driver: str = "580.159.04") -> dict:
    """A FIXTURE run of image `image`: the real H200 run stamped with that image's id and content as `validate`
    stamps a run (a GPU run of `model` on `driver`, or, gpu=False, the non-GPU checks dev needs)."""
    base = base_from_h200_run()
    iid = s.images[image]
    base["facts"]["image_id"] = iid
    if gpu:
        rep = gpu_report(base, model=model, driver=driver, started=time.time())
        # the run's own GPU list too (gpu_report changes the driver facts'): what status and history name
        rep["facts"]["gpus"] = [{**g, "name": f"NVIDIA {model}"} for g in rep["facts"]["driver"]["gpus"]]
    else:
        rep = non_gpu(base)
        rep["facts"]["fixture"] = "the H200 run's checks standing for a non-GPU run"
        rep["evidence"] = evidence.stamp(rep, required=tuple(c["id"] for c in rep["checks"]), gpu=False)
    content = evidence.content(s.engine.images.get(iid), inputs=[b"FIXTURE: the run's target.json"])
    rep["evidence"].update(content)
    rep["problems"] = evidence.problems(rep)
    rep["green"] = not rep["problems"]
    assert rep["green"], rep["problems"]
    return rep


def _bundle(s, name: str, rep: dict, *, ref: str | None = None, keys: dict | None = None) -> Path:
    out = s.d / "bundles" / f"{name}.bundle"
    signer = attest.Signer(key=(keys or s.ours)["key"])
    signed_run.sign_into_bundle(ref or s.ref, Report.of(rep), signer=signer, target=s.t, out=out)
    return out


def _att(s) -> str | None:
    """The digest of the registry's attestation manifest of the pushed digest (None: there is none)."""
    p = ImageRef.parse(s.ref)
    m = Registry(state_here.auth()).manifest(p.bare().with_tag(f"sha256-{s.digest.split(':')[1]}.att"))
    return m.digest if m else None


def _attach(s, path: Path, *args: str, key: str | None = None, capsys) -> tuple[int, str, str]:
    rc = main(["--matrix", str(s.d / "matrix.yaml"), "attach", str(path), *args, "--key", key or s.ours["pub"]])
    out = capsys.readouterr()
    return rc, out.out, out.err


def _refused(s, path: Path, *args: str, code: int, why: str, capsys, key: str | None = None) -> None:
    before = _att(s)
    rc, out, err = _attach(s, path, *args, key=key, capsys=capsys)
    assert rc == code and err.startswith("gpuforge: error: ") and err.count("\n") == 1 and why in err, (rc, out, err)
    assert out == "" and _att(s) == before, "something was attached"
    REFUSED.append(f"{path.name}: exit {rc}: {err.strip()}")


@pytest.fixture(scope="module")
def dev(setup):
    """The digest's green non-GPU statement (signed as `validate --attest` signs), then promoted to dev."""
    signed_run.sign_report(setup.ref, Report.of(_report(setup, gpu=False)), signer=state_here.signer(setup.ours["key"]),
                           target=setup.t)
    promote.promote_targets([setup.t], env="dev", **state_here.promote_kw(setup.ours["key"], setup.ours["pub"]))
    return setup


def test_validate_bundle_signs_offline_with_no_registry_call(setup, monkeypatch, capsys):
    """validate_into_bundle, its validators stood in for (no GPU here): the run's report becomes a bundle about the
    record's pushed digest, and the registry hears nothing (its log does not grow)."""
    from gpuforge.validate import pytest_run

    rep = _report(setup)

    def stand_in(targets, *, on_report, gpu, **_):
        assert gpu and [t.id for t in targets] == [setup.t.id]
        on_report(targets[0], Report.of(rep), None)
        return 0

    monkeypatch.setattr(pytest_run, "validate_targets", stand_in)
    out = setup.d / "bundles" / "gpu.bundle"
    kw = {"out": out, "reports": setup.d / "reports", "signer": attest.Signer(key=setup.ours["key"]),
          "records": state_here.records.here()}
    monkeypatch.setenv("COSIGN_PASSWORD", "not-the-password")  # refused before the run, not after it
    with pytest.raises(ConfigError, match="cosign attest --no-upload"):
        signed_run.validate_into_bundle(setup.t, **kw)
    monkeypatch.setenv("COSIGN_PASSWORD", KEY_PASSWORD)
    log = setup.reg.d / "registry.log"
    before = log.stat().st_size
    assert signed_run.validate_into_bundle(setup.t, **kw) == 0
    assert log.stat().st_size == before, "the offline run spoke to the registry"
    said = capsys.readouterr().out
    assert f"signed this run's GPU validation (green) of {setup.t.id} about {setup.ref} offline into {out}" in said
    doc = json.loads(out.read_text())
    assert sorted(doc) == ["envelopes", "schema"] and doc["schema"] == "gpuforge.bundle/1"
    b = bundle.read(out)
    c = b.contents()
    assert [s.type_uri for s in b.body] == [attest.VALIDATION_TYPE, "https://in-toto.io/attestation/test-result/v0.1"]
    assert c.subject == setup.ref and c.image_id == setup.images[0] and c.pools == ["h200"]
    assert c.gpu_host.gpu_models == ["H200"] and c.gpu_host.driver == "580.159.04" and c.green
    assert c.diff_ids == setup.engine.images.get(setup.images[0]).attrs["RootFS"]["Layers"]
    assert b.body[0].predicate["run"]["signed_offline"] is True and b.body[0].statement.digest() == setup.digest


def test_seven_hostile_bundles_are_refused_in_one_line_and_nothing_is_attached(dev, monkeypatch, capsys):
    s = dev
    good = _bundle(s, "h200", _report(s))
    # 1. another image's layers: a run of the other image, signed about the pushed digest
    _refused(s, _bundle(s, "other-image", _report(s, image=1)), code=11, why="other layers", capsys=capsys)
    # 2. another validator set
    rep = _report(s)
    rep["evidence"]["validator_set"] = "sha256:" + "0" * 64
    _refused(s, _bundle(s, "other-validators", rep), code=11, why="made by another validator set", capsys=capsys)
    # 3. a bad signature, and a missing one
    doc = json.loads(good.read_text())
    bad = copy.deepcopy(doc)
    sig = base64.b64decode(bad["envelopes"][1]["signatures"][0]["sig"])
    bad["envelopes"][1]["signatures"][0]["sig"] = base64.b64encode(sig[:-1] + bytes([sig[-1] ^ 1])).decode()
    (s.d / "bad-sig.bundle").write_text(json.dumps(bad))
    _refused(s, s.d / "bad-sig.bundle", code=11, why="envelope 2 (https://gpuforge.dev/attestations/validation/v1) "
             "does not verify", capsys=capsys)
    bad["envelopes"][1]["signatures"] = []
    (s.d / "no-sig.bundle").write_text(json.dumps(bad))
    _refused(s, s.d / "no-sig.bundle", code=11, why="carries no signature", capsys=capsys)
    # 4. another signer: a bundle signed with another key pair
    _refused(s, _bundle(s, "other-key", _report(s), keys=s.theirs), code=11, why="does not verify with", capsys=capsys)
    # 5. expired: signed on a GPU node 40 days ago
    monkeypatch.setattr(signed_run, "dt", _clock(days_ago=40))
    expired = _bundle(s, "expired", _report(s))
    monkeypatch.undo()
    _refused(s, expired, code=11, why="past prod's time to live of 30 days", capsys=capsys)
    # 6. truncated, and malformed
    (s.d / "truncated.bundle").write_text(good.read_text()[: len(good.read_text()) // 2])
    _refused(s, s.d / "truncated.bundle", code=8, why="not JSON", capsys=capsys)
    (s.d / "malformed.bundle").write_text(json.dumps({"schema": "gpuforge.bundle/1", "envelopes": "all of them"}))
    _refused(s, s.d / "malformed.bundle", code=8, why="not a gpuforge bundle (envelopes:", capsys=capsys)
    # 7. a bundle for another pool than the one asked
    a100 = _bundle(s, "a100", _report(s, model="A100", driver="570.133.20"))
    _refused(s, a100, "--pool", "h200", code=11, why="it is evidence for pool(s) a100", capsys=capsys)
    # and: a dropped envelope (the signed table no longer matches), statements about another digest
    dropped = copy.deepcopy(doc)
    del dropped["envelopes"][2]
    (s.d / "dropped.bundle").write_text(json.dumps(dropped))
    _refused(s, s.d / "dropped.bundle", code=11, why="its envelopes are not the 2 its signed table", capsys=capsys)
    elsewhere = _bundle(s, "elsewhere", _report(s), ref=s.ref.rpartition("@")[0] + "@sha256:" + "0" * 64)
    _refused(s, elsewhere, code=11, why="its statements are about sha256:00000000000", capsys=capsys)
    print("\n" + "\n".join(REFUSED))


def test_an_attached_bundle_promotes_to_prod_as_a_signed_gpu_run_would(dev, monkeypatch, capsys):
    s = dev
    good = _bundle(s, "h200-promoted", _report(s))
    monkeypatch.setattr(signed_run, "dt", _clock(days_ago=2))
    older = _bundle(s, "h200-older", _report(s))
    monkeypatch.undo()
    a100 = _bundle(s, "a100-promoted", _report(s, model="A100", driver="570.133.20"))
    with pytest.raises(PromotionRefused, match="no signed GPU validation"):
        promote.promote_targets([s.t], env="prod", **state_here.promote_kw(s.ours["key"], s.ours["pub"]))

    rc, out, err = _attach(s, good, s.t.id, "--pool", "h200", capsys=capsys)
    assert rc == 0, err
    lines = out.splitlines()
    assert len(lines) == 2, out
    assert lines[0].startswith(f"gpuforge: attached {s.t.id}'s GPU validation (green) on 1 x NVIDIA H200, driver "
                               "580.159.04, signed offline at ") and lines[0].endswith(f" onto {s.ref}")
    assert "Test Result PASSED (pool h200), signed " in lines[1] or "Test Result WARNED (pool h200)" in lines[1], lines[1]
    att = _att(s)
    rc, out, _ = _attach(s, good, capsys=capsys)  # again: already there, nothing attached twice
    assert rc == 0 and out.count("is already on") == 2 and _att(s) == att, out
    # an older run of the same GPU host, attached after a newer one, would become the newest: refused
    _refused(s, older, code=11, why="already carries a GPU statement from this GPU host signed later", capsys=capsys)

    # the consumer's check: cosign verifies the attached statements with the key, as if `validate --gpu --attest` signed
    r = subprocess.run(["cosign", "verify-attestation", "--key", s.ours["pub"], "--insecure-ignore-tlog=true",
                        "--allow-http-registry", "--type", attest.VALIDATION_TYPE, s.ref], capture_output=True, text=True,
                       env={**os.environ, "DOCKER_CONFIG": str(_docker_config(s))}, timeout=120)
    assert r.returncode == 0, r.stderr
    runs = [json.loads(base64.b64decode(json.loads(line)["payload"]))["predicate"]["run"]
            for line in r.stdout.splitlines() if line.startswith("{")]
    assert [x.get("signed_offline", False) for x in runs] == [False, True], runs

    with pytest.raises(PromotionRefused, match=re.escape("pool(s) a100 of the fleet")):
        promote.promote_targets([s.t], env="prod", **state_here.promote_kw(s.ours["key"], s.ours["pub"]))
    rc, out, err = _attach(s, a100, "--pool", "a100", capsys=capsys)
    assert rc == 0 and "GPU validation (green) on 1 x NVIDIA A100, driver 570.133.20" in out, err
    m = ["--matrix", str(s.d / "matrix.yaml")]
    rc = main([*m, "promote", "--env", "prod", s.t.id, "--key", s.ours["pub"], "--sign-key", s.ours["key"]])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert main([*m, "status", s.t.id, "--env", "prod", "--key", s.ours["pub"]]) == 0
    shown = capsys.readouterr().out
    assert "GPU green on NVIDIA A100 driver 570.133.20" in shown and "signed offline, attached from a bundle" in shown, shown
    assert main([*m, "history", s.t.id, "--env", "prod", "--key", s.ours["pub"]]) == 0
    shown = capsys.readouterr().out
    assert "NVIDIA A100 driver 570.133.20 at " in shown and ", signed offline, attached from a bundle)" in shown, shown


def _clock(*, days_ago: float) -> types.SimpleNamespace:
    """A datetime module whose now() is `days_ago` days back: a GPU node that signed then."""
    class Then(dt.datetime):
        @classmethod
        def now(cls, tz=None):
            return dt.datetime.now(tz) - dt.timedelta(days=days_ago)

    return types.SimpleNamespace(datetime=Then, UTC=dt.UTC, timedelta=dt.timedelta)


def _docker_config(s) -> Path:
    d = s.d / "docker-config"
    d.mkdir(exist_ok=True)
    token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    (d / "config.json").write_text(json.dumps({"auths": {s.reg.host: {"auth": token}}}))
    return d
