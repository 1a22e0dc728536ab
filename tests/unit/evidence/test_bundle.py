"""The bundle's format and attach's checks, without a registry or a signature: the envelopes here carry no real
signature (cosign's part, the signature check, runs in tests/integration/evidence/test_gpu_bundle.py against a real
registry). Reports are the real H200 run made a GPU report (tests/fleet_reports.py), with content facts stamped as
`validate --gpu` stamps them."""

from __future__ import annotations

import base64
import copy
import datetime as dt
import json

import pytest
from fleet_reports import BASE, FLEET, base_from_h200_run, gpu_report

from gpuforge import cli
from gpuforge.errors import BundleRefused, ConfigError, StateError
from gpuforge.evidence import attach, bundle, signed_run, statements
from gpuforge.plan.matrix import load_matrix
from gpuforge.registry import attest
from gpuforge.validate import evidence
from gpuforge.validate.report_model import Report

DIGEST = "sha256:" + "ab" * 32
REF = f"127.0.0.1:5000/gpuforge/pytorch@{DIGEST}"
CONTENT = {"diff_ids": ["sha256:" + "1" * 64], "config": "sha256:" + "2" * 64, "inputs": "sha256:" + "3" * 64}


def unsigned(ref: str, type_uri: str, predicate: dict) -> dict:
    """A DSSE envelope of the shape cosign writes, with a signature that is no signature."""
    name, _, digest = ref.partition("@")
    stmt = {"_type": "https://in-toto.io/Statement/v0.1", "predicateType": type_uri,
            "subject": [{"name": name, "digest": {"sha256": digest.split(":")[1]}}], "predicate": predicate}
    return {"payloadType": "application/vnd.in-toto+json",
            "payload": base64.b64encode(json.dumps(stmt, sort_keys=True).encode()).decode(),
            "signatures": [{"keyid": "", "sig": "bm90IGEgc2lnbmF0dXJl"}]}


@pytest.fixture
def target(tmp_path):
    (tmp_path / "matrix.yaml").write_text(BASE + FLEET)
    return load_matrix(tmp_path / "matrix.yaml").select(None)[0]


@pytest.fixture
def offline(monkeypatch):
    """cosign attest --no-upload stood in for: each statement becomes an unsigned envelope (the format, not cosign)."""
    monkeypatch.setattr(attest, "envelope", lambda ref, data, type_uri, signer: json.dumps(unsigned(ref, type_uri, data)))


def gpu_run(**change) -> Report:
    rep = gpu_report(base_from_h200_run())
    rep["evidence"].update({**CONTENT, **change})
    return Report.of(rep)


def made(tmp_path, target, rep: Report | None = None):
    out = tmp_path / "gpu.bundle"
    signed_run.sign_into_bundle(REF, rep or gpu_run(), signer=attest.Signer(key="cosign.key"), target=target, out=out)
    return out


def test_a_bundle_holds_its_signed_table_then_the_statements_validate_attest_signs(tmp_path, target, offline):
    out = made(tmp_path, target)
    doc = json.loads(out.read_text())
    assert sorted(doc) == ["envelopes", "schema"], "the wrapper lists envelopes, nothing else"
    b = bundle.read(out)
    c = b.contents()
    assert b.head.type_uri == bundle.BUNDLE_TYPE
    assert [s.type_uri for s in b.body] == [attest.VALIDATION_TYPE, statements.TEST_RESULT_TYPE]
    assert [(x.type, x.sha256) for x in c.statements] == [(s.type_uri, s.payload_sha256) for s in b.body]
    assert (c.subject, c.image_id, c.diff_ids, c.config) == (REF, "sha256:" + "d" * 64, CONTENT["diff_ids"], CONTENT["config"])
    assert c.validator_set == evidence.validator_set_hash() and c.pools == ["h200"] and c.green
    assert c.gpu_host.gpu_models == ["H200"] and c.gpu_host.driver == "580.159.04"
    assert c.content_key.startswith("sha256:")
    assert b.body[0].predicate["run"]["signed_offline"] is True and b.body[0].predicate["run"]["subject"] == REF
    assert attach.agreeing(b, c).gpu_run()


def test_the_same_statements_go_onto_the_registry_or_into_a_bundle(target, monkeypatch):
    """One path builds them: only the delivery differs (and the run says it was signed offline)."""
    pushed: list[tuple[str, dict]] = []
    monkeypatch.setattr(attest, "attest_data", lambda ref, data, type_uri, signer: pushed.append((type_uri, data)))
    rep = gpu_run()
    signed_run.sign_report(REF, rep, signer=attest.Signer(key="k"), target=target)
    collected: list[tuple[str, dict]] = []
    signed_run.sign_report(REF, rep, signer=attest.Signer(key="k"), target=target,
                           deliver=lambda ref, item: collected.append((item.type_uri, item.predicate)))

    def same(items):
        out = copy.deepcopy(items)
        for _, p in out:
            if "run" in p:
                p["run"] = {k: v for k, v in p["run"].items() if k not in ("signed_at", "signed_offline")}
            for c in p.get("configuration", []):
                c.get("annotations", {}).pop("signedAt", None)
                c.get("digest", {}).pop("sha256", None)  # the run entry's digest covers its signing time
        return out

    assert [t for t, _ in pushed] == [t for t, _ in collected] == [attest.VALIDATION_TYPE, statements.TEST_RESULT_TYPE]
    assert same(pushed) == same(collected)
    assert "signed_offline" not in pushed[0][1]["run"] and collected[0][1]["run"]["signed_offline"] is True


@pytest.mark.parametrize(("text", "says"), [
    ("", "not JSON"),
    ('{"schema": "gpuforge.bundle/1", "envelopes": [', "truncated?"),
    ("[]", "not a gpuforge bundle ((top level)"),
    ('{"schema": "gpuforge.bundle/2", "envelopes": []}', "not a gpuforge bundle (schema:"),
    ('{"schema": "gpuforge.bundle/1", "envelopes": [], "signed": true}', "not a gpuforge bundle ("),
    ('{"schema": "gpuforge.bundle/1", "envelopes": [{"payloadType": "text/plain", "payload": "e30=", "signatures": []},'
     ' {"payloadType": "text/plain", "payload": "e30=", "signatures": []}]}', "envelopes.0.payloadType"),
])
def test_a_file_that_is_no_bundle_is_one_line_exit_8(tmp_path, text, says):
    p = tmp_path / "b.bundle"
    p.write_text(text)
    with pytest.raises(StateError) as e:
        bundle.read(p)
    assert says in str(e.value) and "\n" not in str(e.value) and e.value.return_code == 8, str(e.value)


def test_payloads_that_are_no_in_toto_statement_and_a_missing_table_are_refused(tmp_path, target, offline):
    doc = json.loads(made(tmp_path, target).read_text())
    p = tmp_path / "edited.bundle"
    for change, says in [(lambda d: d["envelopes"][1].update(payload="not base64!"), "not a base64 in-toto statement"),
                         (lambda d: d["envelopes"][1].update(payload=base64.b64encode(b'{"a": 1}').decode()),
                          "not an in-toto envelope"),
                         (lambda d: d["envelopes"].reverse(), "its first envelope is a")]:
        d = copy.deepcopy(doc)
        change(d)
        p.write_text(json.dumps(d))
        with pytest.raises(StateError) as e:
            bundle.read(p)
        assert says in str(e.value), str(e.value)
    with pytest.raises(StateError, match="does not exist"):
        bundle.read(tmp_path / "absent.bundle")


def test_a_table_that_does_not_list_the_envelopes_or_disagrees_with_the_run_is_refused(tmp_path, target, offline):
    b = bundle.read(made(tmp_path, target))
    c = b.contents()
    swapped = bundle.Bundle(path=b.path, head=b.head, body=tuple(reversed(b.body)))
    with pytest.raises(BundleRefused, match="its envelopes are not the 2 its signed table"):
        attach.agreeing(swapped, c)
    for field, value, says in [("image_id", "sha256:" + "e" * 64, "image id"), ("diff_ids", ["sha256:" + "f" * 64], "layers"),
                               ("pools", ["a100"], "pools"), ("content_key", "sha256:" + "0" * 64, "content key")]:
        with pytest.raises(BundleRefused, match=f"name other {says}") as e:
            attach.agreeing(b, c.model_copy(update={field: value}))
        assert e.value.return_code == 11 and "nothing was attached" in str(e.value)


def test_the_validator_set_the_age_and_the_pool_are_judged(tmp_path, target, offline):
    b = bundle.read(made(tmp_path, target))
    c = b.contents()
    rep = attach.agreeing(b, c)
    attach.judge(b, c, rep, target, pool="h200", max_age_days=30)  # holds
    with pytest.raises(BundleRefused, match="made by another validator set"):
        attach.judge(b, c.model_copy(update={"validator_set": "sha256:" + "0" * 64}), rep, target, pool=None, max_age_days=30)
    old = (dt.datetime.now(dt.UTC) - dt.timedelta(days=31)).isoformat(timespec="seconds")
    with pytest.raises(BundleRefused, match=r"signed 31\.0 days ago .* past prod's time to live of 30 days"):
        attach.judge(b, c.model_copy(update={"signed_at": old}), rep, target, pool=None, max_age_days=30)
    with pytest.raises(BundleRefused, match="a statement names no signing time"):
        attach.judge(b, c.model_copy(update={"signed_at": "yesterday"}), rep, target, pool=None, max_age_days=30)
    with pytest.raises(BundleRefused, match=r"evidence for pool\(s\) h200 \(1 x NVIDIA H200, driver 580.159.04\), not a100"):
        attach.judge(b, c, rep, target, pool="a100", max_age_days=30)
    with pytest.raises(ConfigError, match="--pool gpu9: not a fleet pool of"):
        attach.judge(b, c, rep, target, pool="gpu9", max_age_days=30)


def test_a_bundle_for_another_target_than_the_selected_is_refused(tmp_path, target, offline):
    b = bundle.read(made(tmp_path, target))
    other = target.__class__(**{**target.__dict__, "id": "another-target"})
    with pytest.raises(BundleRefused, match=f"it is evidence for {target.id}, not the selected another-target"):
        attach._target(b, b.contents(), [other], selected=True)
    with pytest.raises(ConfigError, match=r"is not a target of this matrix\.yaml"):
        attach._target(b, b.contents(), [other], selected=False)


def test_the_envelope_line_is_cosigns_compact_form():
    env = unsigned(REF, attest.VALIDATION_TYPE, {"a": 1})
    compact = json.dumps(env, separators=(",", ":"))
    assert bundle.Envelope.model_validate(env).line() == compact


@pytest.fixture
def keys(tmp_path, monkeypatch):
    for k in ("GPUFORGE_COSIGN_KEY", "GPUFORGE_COSIGN_PUBLIC_KEY", "GPUFORGE_COSIGN_TLOG", "SIGSTORE_ID_TOKEN"):
        monkeypatch.delenv(k, raising=False)
    (tmp_path / "cosign.key").write_text("-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----\n")
    (tmp_path / "cosign.pub").write_text("-----BEGIN PUBLIC KEY-----\n")
    return tmp_path


@pytest.mark.parametrize(("argv", "env", "says"), [
    (["--gpu", "--bundle", "b", "--attest", "--sign-key", "{d}/cosign.key"], {}, "--bundle and --attest are two ways"),
    (["--bundle", "b", "--sign-key", "{d}/cosign.key"], {}, "--bundle carries a GPU run's evidence: give --gpu"),
    (["--gpu", "--bundle", "b"], {}, "validate --bundle signs offline with a key pair"),
    (["--gpu", "--bundle", "b", "--sign-key", "{d}/cosign.key", "*"], {}, "--bundle holds one run: select one target"),
    (["--gpu", "--bundle", "b", "--sign-key", "{d}/cosign.key"], {"GPUFORGE_COSIGN_TLOG": "1"}, "cannot reach the Rekor"),
])
def test_validate_bundle_is_refused_in_one_line_before_anything_runs(keys, monkeypatch, capsys, argv, env, says):
    """Refused before the engine is touched: not even the dead runs' containers are removed (a refused command
    changes nothing, and on a shared engine that clean-up is someone else's line)."""
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    reaped = []
    monkeypatch.setattr(cli, "_reap", lambda: reaped.append(True))
    rc = cli.main(["validate", *(a.format(d=keys) for a in argv)])
    err = capsys.readouterr().err
    assert rc == 2 and says in err and err.count("\n") == 1, err
    assert not reaped, "validate removed dead runs' containers before refusing its input"


def test_attach_verifies_with_a_public_key_only(keys, monkeypatch, capsys):
    rc = cli.main(["attach", str(keys / "absent.bundle")])
    err = capsys.readouterr().err
    assert rc == 2 and "attach verifies a bundle with the public key" in err and err.count("\n") == 1, err
    monkeypatch.setenv("GPUFORGE_COSIGN_TLOG", "1")
    rc = cli.main(["attach", str(keys / "absent.bundle"), "--key", str(keys / "cosign.pub")])
    err = capsys.readouterr().err
    assert rc == 2 and "its statements are not in the Rekor log" in err, err
    monkeypatch.delenv("GPUFORGE_COSIGN_TLOG")
    rc = cli.main(["attach", str(keys / "absent.bundle"), "--key", str(keys / "cosign.pub")])
    err = capsys.readouterr().err
    assert rc == 8 and "absent.bundle: does not exist" in err, err
