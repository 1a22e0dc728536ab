"""The standard statements: an in-toto Test Result per validating run, naming exactly the fleet pools the run's
GPU host is a node of, with skipped required checks counted as failed; a SLSA VSA per promotion. Each is checked
against the in-toto framework's own message types before it would be signed. Reports come from the real H200 run
(tests/fleet_reports.py)."""

from __future__ import annotations

import copy
import datetime as dt

import pytest
from fleet_reports import BASE, FLEET, base_from_h200_run, gpu_report

from gpuforge.evidence import statements
from gpuforge.plan.matrix import load_matrix
from gpuforge.validate import evidence
from gpuforge.validate.report_model import Report

REF = "127.0.0.1:5000/gpuforge/pytorch@sha256:" + "ab" * 32
AT = dt.datetime(2026, 12, 4, 12, 0, tzinfo=dt.UTC)


@pytest.fixture
def target(tmp_path):
    (tmp_path / "matrix.yaml").write_text(BASE + FLEET)
    return load_matrix(tmp_path / "matrix.yaml").select(None)[0]


def _results(rep: dict, target) -> list[dict]:
    return statements.test_results(Report.of(rep), ref=REF, target=target, signed_at=AT)


def _result(rep: dict, target) -> dict:
    [one] = _results(rep, target)
    return one


def _scope(pred: dict) -> str:
    return pred["configuration"][0]["name"]


def _names(pred: dict) -> list[str]:
    return [c["name"] for c in pred["configuration"]]


def _restamp(rep: dict) -> dict:
    rep["evidence"] = evidence.stamp(rep, required=tuple(rep["evidence"]["required"]), gpu=rep["gpu"])
    return rep


def test_a_green_gpu_run_is_a_statement_for_each_pool_its_host_belongs_to_and_no_other(target):
    pred = _result(gpu_report(base_from_h200_run()), target)
    assert pred["result"] in ("PASSED", "WARNED") and pred["failedTests"] == []
    assert _scope(pred) == "gpuforge.dev/pool/h200"  # a100 shares the driver, not the model; l4x2 is another GPU
    assert [n for n in _names(pred) if n.startswith(statements.POOL_PREFIX)] == ["gpuforge.dev/pool/h200"]
    a100 = _result(gpu_report(base_from_h200_run(), model="A100", driver="570.133.20"), target)
    assert _scope(a100) == "gpuforge.dev/pool/a100"
    one_l4 = _result(gpu_report(base_from_h200_run(), model="L4", driver="575.57.08", count=1), target)
    assert _scope(one_l4) == statements.GPU_UNPOOLED  # the pool gives 2 GPUs: a node of no pool


def test_a_host_that_is_a_node_of_two_pools_signs_one_statement_for_each(tmp_path):
    twin = FLEET.replace("  a100:\n    gpu: {model: A100", "  h200b:\n    gpu: {model: H200").replace(
        '"8.0"}\n    drivers: ["570.133.20", "580.159.04"]', '"9.0"}\n    drivers: ["580.159.04"]')
    (tmp_path / "matrix.yaml").write_text(BASE + twin)
    t = load_matrix(tmp_path / "matrix.yaml").select(None)[0]
    preds = _results(gpu_report(base_from_h200_run()), t)
    assert [_scope(p) for p in preds] == ["gpuforge.dev/pool/h200", "gpuforge.dev/pool/h200b"]
    assert all(p["configuration"][1:] == preds[0]["configuration"][1:] for p in preds)


def test_the_configuration_names_validators_target_run_and_host(target):
    rep = gpu_report(base_from_h200_run())
    pred = _result(rep, target)
    by = {c["name"]: c for c in pred["configuration"]}
    assert by[statements.VALIDATORS]["digest"]["sha256"] == rep["evidence"]["validator_set"].removeprefix("sha256:")
    assert by[statements.TARGET_PREFIX + target.id]["annotations"]["torch"] == target.variant.torch_local_version
    assert by[statements.RUN]["annotations"]["signedAt"] == "2026-12-04T12:00:00+00:00"
    assert by[statements.RUN]["annotations"]["subject"] == REF
    assert by[statements.HOST]["annotations"]["gpu_models"] == ["H200"]


def test_passed_and_warned_tests_partition_a_green_run(target):
    rep = gpu_report(base_from_h200_run())
    pred = _result(rep, target)
    ids = {c["id"] for c in rep["checks"]}
    assert set(pred["passedTests"]) | set(pred["warnedTests"]) == ids
    skipped = {c["id"] for c in rep["checks"] if c["outcome"] == "skipped"}
    assert set(pred["warnedTests"]) == skipped  # allowed skips (one GPU: no collective) warn, never fail
    assert pred["result"] == ("WARNED" if skipped else "PASSED")


def test_a_failed_check_fails_the_result_and_is_named(target):
    rep = copy.deepcopy(gpu_report(base_from_h200_run()))
    victim = next(c for c in rep["checks"] if c["outcome"] == "passed")
    victim["outcome"] = "failed"
    pred = _result(rep, target)
    assert pred["result"] == "FAILED" and pred["failedTests"] == [victim["id"]]
    assert victim["id"] not in pred["passedTests"]


def test_a_required_check_skipped_for_an_unlisted_reason_is_a_failed_test(target):
    rep = copy.deepcopy(gpu_report(base_from_h200_run()))
    victim = next(c for c in rep["checks"] if c["outcome"] == "passed" and c["id"] in rep["evidence"]["required"])
    victim.update(outcome="skipped", message="Skipped: flaky today")
    pred = _result(rep, target)
    assert pred["result"] == "FAILED" and victim["id"] in pred["failedTests"]
    assert victim["id"] not in pred["warnedTests"]


def test_a_required_check_that_never_ran_is_a_failed_test(target):
    rep = copy.deepcopy(gpu_report(base_from_h200_run()))
    gone = rep["checks"].pop(0)
    pred = _result(rep, target)
    assert pred["result"] == "FAILED" and gone["id"] in pred["failedTests"]


def test_a_run_that_is_not_evidence_for_another_reason_names_why(target):
    rep = copy.deepcopy(gpu_report(base_from_h200_run()))
    rep["exit_status"] = 2  # pytest's own error, every check passed
    pred = _result(rep, target)
    assert pred["result"] == "FAILED"
    assert pred["failedTests"] == ["gpuforge.dev/evidence: pytest exited 2"]


def test_a_non_gpu_run_names_no_pool_and_no_host(target):
    rep = copy.deepcopy(gpu_report(base_from_h200_run()))
    rep["gpu"] = False
    pred = _result(_restamp(rep), target)
    assert _scope(pred) == statements.IMAGE
    assert not [n for n in _names(pred) if n.startswith(statements.POOL_PREFIX)] and statements.HOST not in _names(pred)


def test_the_configuration_order_policies_read_by_position(target):
    pred = _result(gpu_report(base_from_h200_run()), target)
    assert _names(pred)[1:] == [statements.VALIDATORS, statements.RUN, statements.TARGET_PREFIX + target.id,
                                statements.HOST]


def test_a_field_outside_the_standard_is_refused_before_signing():
    good = {"result": "PASSED", "configuration": [{"name": "x", "digest": {"sha256": "ab"}}], "passedTests": ["a"]}
    statements.check(statements.TEST_RESULT_TYPE, good, REF)
    for bad, why in (({**good, "verdict": "green"}, "no field named"),
                     ({**good, "passedTests": "a"}, "passedTests"),
                     ({**good, "configuration": [{"annotations": {"no": "name, uri or digest"}}]}, "At least one of"),):
        with pytest.raises(statements.NotStandard, match=why):
            statements.check(statements.TEST_RESULT_TYPE, bad, REF)


def test_the_verification_summary_of_a_promotion():
    pred = statements.vsa(REF, env="prod", requirements={"pools": ["h200"]}, inputs=["sha256:" + "cd" * 32],
                          verified_at=AT)
    assert pred["resourceUri"] == REF and pred["verificationResult"] == "PASSED"
    assert pred["timeVerified"] == "2026-12-04T12:00:00Z"
    assert pred["inputAttestations"] == [{"digest": {"sha256": "cd" * 32}}]
    assert pred["verifiedLevels"] == ["GPUFORGE_PROMOTED_PROD"]
    other = statements.vsa(REF, env="prod", requirements={"pools": ["h200", "a100"]}, inputs=[], verified_at=AT)
    assert other["policy"]["digest"] != pred["policy"]["digest"]  # the requirements are named by digest
