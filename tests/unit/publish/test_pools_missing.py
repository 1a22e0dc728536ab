"""prod needs a green GPU attestation from every pool the target declares, newer than its build; missing pools are
named. pools_missing is pure: these tests feed it predicates made from the real H200 run (tests/fleet_reports.py)."""

from __future__ import annotations

import datetime as dt

from fleet_reports import BASE, FLEET, base_from_h200_run, gpu_report

from gpuforge.plan.matrix import load_matrix
from gpuforge.publish import prod
from gpuforge.validate.report_model import Report

BUILT = "2026-12-01T10:00:00+00:00"
AFTER = dt.datetime(2026, 12, 2, tzinfo=dt.UTC).timestamp()


def missing(t, reps: list[dict], **kw) -> list[str]:
    """prod.pools_missing of the fixture reports, read as the signed predicates are (Report.of)."""
    return prod.pools_missing(t, [Report.of(r) for r in reps], **kw)


def why_not(t, reps: list[dict], **kw) -> str:
    return prod.why_missing(t, [Report.of(r) for r in reps], **kw)


def _target(tmp_path):
    (tmp_path / "matrix.yaml").write_text(BASE + FLEET)
    return load_matrix(tmp_path / "matrix.yaml").select(None)[0]


def _three():
    base = base_from_h200_run()
    return [gpu_report(base, started=AFTER), gpu_report(base, model="A100", driver="570.133.20", started=AFTER),
            gpu_report(base, model="L4", driver="575.57.08", count=2, started=AFTER)]


def test_the_fixture_reports_are_green_gpu_evidence():
    for rep in _three():
        assert rep["green"], rep["problems"]
        assert rep["evidence"]["gpu_host"]["runner"]


def test_two_of_three_pools_block_prod_and_the_third_is_named(tmp_path):
    t = _target(tmp_path)
    assert [p.name for p in t.pools] == ["h200", "a100", "l4x2"]
    h200, a100, l4 = _three()
    assert missing(t, [h200, a100], built_at=BUILT) == ["l4x2"]
    assert missing(t, [h200, a100, l4], built_at=BUILT) == []
    assert missing(t, [], built_at=BUILT) == ["h200", "a100", "l4x2"]
    assert "l4x2 (L4, sm_89" in why_not(t, [h200, a100], built_at=BUILT)


def test_evidence_that_does_not_match_the_pool_does_not_count(tmp_path):
    t = _target(tmp_path)
    base = base_from_h200_run()
    h200, a100, _ = _three()
    one_l4 = gpu_report(base, model="L4", driver="575.57.08", count=1, started=AFTER)  # the pool gives 2 GPUs
    other_driver = gpu_report(base, model="L4", driver="580.159.04", count=2, started=AFTER)
    before_build = gpu_report(base, model="L4", driver="575.57.08", count=2, started=AFTER - 3 * 86400)
    for rep, why in ((one_l4, "1 GPU(s), the pool gives 2"), (other_driver, "driver 580.159.04, not one of"),
                     (before_build, "older than the build")):
        assert missing(t, [h200, a100, rep], built_at=BUILT) == ["l4x2"]
        assert why in why_not(t, [h200, a100, rep], built_at=BUILT)
    red = gpu_report(base, model="L4", driver="575.57.08", count=2, started=AFTER)
    red["checks"][0] = {**red["checks"][0], "outcome": "failed"}
    assert missing(t, [h200, a100, red], built_at=BUILT) == ["l4x2"]
    not_gpu = {**red, "gpu": False}
    assert "not a GPU report" in why_not(t, [h200, a100, not_gpu], built_at=BUILT)


def test_a_target_without_pools_needs_nothing_more(tmp_path):
    (tmp_path / "matrix.yaml").write_text(BASE)
    t = load_matrix(tmp_path / "matrix.yaml").select(None)[0]
    assert t.pools == () and missing(t, []) == []


def test_a_reused_gpu_run_of_the_same_bytes_counts_though_it_ran_before_this_build(tmp_path):
    """A copy (zstd, a mirror, another provenance setting) reuses its source's GPU run by content: the checks
    ran before the copy was built, and the content key, not the clock, proved them for these bytes."""
    t = _target(tmp_path)
    h200, a100, _ = _three()
    earlier = gpu_report(base_from_h200_run(), model="L4", driver="575.57.08", count=2, started=AFTER - 3 * 86400)
    assert missing(t, [h200, a100, earlier], built_at=BUILT) == ["l4x2"]
    earlier["run"] = {"reused_from": {"source": "127.0.0.1:5000/gpuforge/a@sha256:" + "1" * 64,
                                      "key": "sha256:" + "2" * 64}}
    assert missing(t, [h200, a100, earlier], built_at=BUILT) == []


def test_the_newest_statement_of_a_pool_decides_for_it(tmp_path):
    """A red run on a node of a pool (a nightly canary after a driver upgrade) blocks that pool though an older green
    one is there; a green run signed after it covers the pool again; another pool's red run does not count here."""
    t = _target(tmp_path)
    base = base_from_h200_run()
    h200, a100, l4 = _three()
    red_h200 = gpu_report(base, started=AFTER + 3600)
    red_h200["checks"][0] = {**red_h200["checks"][0], "outcome": "failed"}
    assert missing(t, [h200, a100, l4, red_h200], built_at=BUILT) == ["h200"]
    assert "not green" in why_not(t, [h200, a100, l4, red_h200], built_at=BUILT)
    assert missing(t, [h200, a100, l4, red_h200, gpu_report(base, started=AFTER + 7200)], built_at=BUILT) == []
    assert missing(t, [red_h200, h200, a100, l4], built_at=BUILT) == []  # the red one is older
