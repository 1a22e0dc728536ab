"""`gpuforge policy`'s CUE and Rego: the Rego keeps cosign's contract in OPA's Go engine and in regorus (Rego v0, how
cosign parses a --policy file, and v1), and both engines decide every case of tests/admission_cases.py on the
statement cosign would hand the policy, made here in-process. The same cases signed and verified by cosign, with the
CUE decided by cosign itself: tests/integration/publish/test_admission_policy.py."""

from __future__ import annotations

import datetime as dt
import re
import subprocess
import sys

import opa_bindings
import pytest
import regorus
from admission_cases import CASES, ENGINES, POOL, predicates, rego_allow, statement
from fleet_reports import BASE, FLEET

from gpuforge.cli import main
from gpuforge.plan.matrix import load_matrix
from gpuforge.publish import policy

NOW = dt.datetime(2026, 12, 4, 12, tzinfo=dt.UTC)
REF = "127.0.0.1:5999/gpuforge-admission/case@sha256:" + "ab" * 32


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    m = tmp_path_factory.mktemp("policy") / "matrix.yaml"
    m.write_text(BASE + FLEET + "registry: 127.0.0.1:5999\n")
    return load_matrix(m).select(None)[0]


def test_the_rego_keeps_cosigns_contract_in_both_engines():
    """package signature, a boolean allow (false, never undefined, on anything else), rego.v1 imported: one text for
    cosign's v0 parser and for v1."""
    text = policy.rego(env="prod", pool=POOL, max_age_days=30, now=NOW)
    assert re.search(r"^package signature$", text, re.M) and re.search(r"^import rego\.v1$", text, re.M)
    for junk in ({}, {"predicate": "x"}, {"predicate": {"configuration": {}}}):
        assert rego_allow(text, junk) == dict.fromkeys(ENGINES, False)
    with opa_bindings.OpaEngine() as opa:
        opa.add_policy("p.rego", text)
        assert opa.eval_document("signature.deny", {})  # conftest's reasons, one per requirement that does not hold
    r = regorus.Engine()
    r.set_rego_v0(True)
    r.add_policy("p.rego", text)
    assert r.get_packages() == ["data.signature"]


@pytest.mark.parametrize("name", sorted(n for n, c in CASES.items() if c.verified))
def test_both_engines_decide_each_case_on_the_statement(target, name):
    """The statements a policy sees (cosign's own checks, signer and subject, have passed): each engine admits
    exactly the admitted cases, with no deny reason for them and one at least for the others."""
    case = CASES[name]
    text = policy.rego(env="prod", pool=POOL, max_age_days=30, now=NOW)
    preds = predicates(case, ref=REF, target=target, signed_at=NOW - dt.timedelta(days=case.days))
    allows = [rego_allow(text, statement(p, REF)) for p in preds]
    assert {e: all(a[e] is True for a in allows) for e in ENGINES} == dict.fromkeys(ENGINES, case.admitted)
    with opa_bindings.OpaEngine() as opa:
        opa.add_policy("p.rego", text)
        reasons = [opa.eval_document("signature.deny", statement(p, REF)) for p in preds]
    assert (not any(reasons)) is case.admitted, reasons


@pytest.mark.parametrize("name", sorted(n for n, c in CASES.items() if c.verified))
def test_one_passing_statement_admits_as_policy_controller_decides(target, name):
    """policy-controller admits a digest by one verified statement that passes; cosign --policy needs every one. A
    digest the pipeline promoted carries the non-GPU run's statement beside the pool's: admitted by the first rule,
    refused by the second (docs/promotion.md)."""
    case = CASES[name]
    text = policy.rego(env="prod", pool=POOL, max_age_days=30, now=NOW)
    preds = predicates(case, ref=REF, target=target, signed_at=NOW - dt.timedelta(days=case.days))
    allows = [rego_allow(text, statement(p, REF)) for p in preds]
    assert {e: any(a[e] is True for a in allows) for e in ENGINES} == dict.fromkeys(ENGINES, case.admitted_by_one)


def test_enough_hostile_cases_reach_the_engines():
    hostile = [n for n, c in CASES.items() if c.verified and not c.admitted]
    assert len(hostile) >= 8 and any(c.admitted for c in CASES.values())
    missing = {n for n in CASES if n.startswith("missing-")}
    assert missing == {"missing-result", "missing-failedTests", "missing-configuration", "missing-scope-name",
                       "missing-validators-name", "missing-run-name", "missing-annotations", "missing-signedAt"}


def test_the_cue_requires_every_field_it_constrains():
    """cosign validates a statement against the schema without asking for concrete values: a constrained field that
    is absent passes unless it is marked required (`!`)."""
    text = policy.cue(env="prod", pool=POOL, max_age_days=30, now=NOW)
    body = re.sub(r'"[^"]*"', '""', "\n".join(ln for ln in text.splitlines() if not ln.startswith("//")))
    labels = re.findall(r"([A-Za-z]+)(!?):", body)
    assert {name for name, _ in labels} == {"predicateType", "predicate", "result", "failedTests", "configuration", "name",
                                            "annotations", "signedAt"}
    assert all(bang for _, bang in labels), labels


def test_rego_and_cue_read_the_same_cut_off_and_scope():
    cue, rego = (f(env="prod", pool=POOL, max_age_days=30, now=NOW) for f in (policy.cue, policy.rego))
    for text in (cue, rego):
        assert '"2026-11-04T12:00:00+00:00"' in text and '"gpuforge.dev/pool/h200"' in text
    dev = policy.rego(env="dev", pool=None, max_age_days=30, now=NOW)
    assert '"gpuforge.dev/scope/image"' in dev and "pool/" not in dev


def test_policy_writes_rego_and_refuses_another_format_in_one_line(write_matrix, tmp_path, capsys):
    m = write_matrix(BASE + FLEET + "registry: 127.0.0.1:5999\n")
    out = tmp_path / "prod-h200.rego"
    assert main(["--matrix", str(m), "policy", "--env", "prod", "--pool", POOL, "--format", "rego", "--output",
                 str(out)]) == 0
    assert out.read_text().count("\npackage signature\n") == 1
    assert policy.FORMATS == ("cue", "rego", "policy-controller")
    r = subprocess.run([sys.executable, "-m", "gpuforge", "--matrix", str(m), "policy", "--env", "prod", "--format",
                        "kyverno"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "cue, rego, policy-controller" in r.stderr, r.stderr
