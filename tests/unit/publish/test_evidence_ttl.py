"""The evidence time to live: `GPUFORGE_EVIDENCE_TTL_DAYS` / `--max-age-days` is one number or one per
environment; promote refuses evidence (the newest validation statement, and for prod the newest GPU one) signed longer
ago, naming its age; a statement with no signing time is refused, never taken as fresh."""

from __future__ import annotations

import datetime as dt

import pytest

from gpuforge import options
from gpuforge.errors import ConfigError
from gpuforge.publish import promote
from gpuforge.state.promotions import Evidence

NOW = dt.datetime(2026, 12, 31, 12, tzinfo=dt.UTC)


@pytest.mark.parametrize(("text", "dev", "prod"), [("30", 30, 30), ("dev=30,prod=14", 30, 14), ("prod=7", 30, 7),
                                                   (" 2.5 ", 2.5, 2.5)])
def test_one_number_or_one_per_environment(monkeypatch, text, dev, prod):
    monkeypatch.setenv("GPUFORGE_EVIDENCE_TTL_DAYS", text)
    ttl = options.resolve(command="promote").value("evidence_ttl")
    assert (ttl.of("dev"), ttl.of("prod")) == (dev, prod)


@pytest.mark.parametrize("text", ["0", "-1", "forever", "qa=3", "dev=3,dev=4", "prod=", "dev=99999"])
def test_a_bad_time_to_live_is_one_line_naming_its_source(monkeypatch, text):
    monkeypatch.setenv("GPUFORGE_EVIDENCE_TTL_DAYS", text)
    with pytest.raises(ConfigError, match=r"^GPUFORGE_EVIDENCE_TTL_DAYS: "):
        options.resolve(command="promote")


def test_the_default_is_30_days_for_both():
    assert options.resolve(command="status", environ={}).value("evidence_ttl") == options.Ttl(30.0, 30.0)


def _ev(at: str | None, gpu_at: str | None = None, gpu: bool = False) -> Evidence:
    return Evidence(validation="sha256:1", green=True, gpu="sha256:2" if gpu else None, validated_at=at,
                    gpu_validated_at=gpu_at)


def test_fresh_evidence_promotes_and_old_evidence_is_refused_with_its_age():
    assert promote.too_old(_ev("2026-12-30T12:00:00+00:00"), 30, NOW) is None
    why = promote.too_old(_ev("2026-11-01T12:00:00+00:00"), 30, NOW)
    assert why and "signed 60.0 days ago" in why and "time to live of 30 days" in why


def test_prod_holds_the_gpu_statement_to_it_too():
    assert promote.too_old(_ev("2026-12-30T12:00:00+00:00", "2026-12-29T12:00:00+00:00", gpu=True), 14, NOW) is None
    why = promote.too_old(_ev("2026-12-30T12:00:00+00:00", "2026-12-01T12:00:00+00:00", gpu=True), 14, NOW)
    assert why and "GPU validation statement was signed 30.0 days ago" in why


def test_a_statement_with_no_signing_time_is_refused():
    assert "names no signing time" in promote.too_old(_ev(None), 30, NOW)
    assert "names no signing time" in promote.too_old(_ev("2026-12-30T12:00:00+00:00", None, gpu=True), 30, NOW)


def test_a_signing_time_that_is_not_an_iso_time_is_refused_not_a_traceback():
    why = promote.too_old(_ev("last tuesday"), 30, NOW)
    assert why and "'last tuesday' is not an ISO time" in why


def test_prod_holds_every_pool_s_gpu_evidence_to_it(tmp_path):
    """A fresh H200 run and an A100 run signed 90 days ago: the a100 pool is not covered at a 30-day time to live."""
    import copy

    from fleet_reports import BASE, FLEET, base_from_h200_run, gpu_report

    from gpuforge.plan.matrix import load_matrix
    from gpuforge.publish import prod
    from gpuforge.validate.report_model import Report

    (tmp_path / "matrix.yaml").write_text(BASE + FLEET.split("  l4x2:")[0])
    t = load_matrix(tmp_path / "matrix.yaml").select(None)[0]
    h200 = gpu_report(base_from_h200_run())
    a100 = copy.deepcopy(gpu_report(base_from_h200_run(), model="A100", driver="570.133.20"))
    h200["run"] = {"signed_in_run": True, "signed_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")}
    a100["run"] = {"signed_in_run": True,
                   "signed_at": (dt.datetime.now(dt.UTC) - dt.timedelta(days=90)).isoformat(timespec="seconds")}
    signed = [Report.of(h200), Report.of(a100)]
    assert prod.pools_missing(t, signed) == []
    assert prod.pools_missing(t, signed, max_age_days=30) == ["a100"]
    assert "past the time to live of 30 days" in prod.why_missing(t, signed, max_age_days=30)


def test_status_shows_an_unreadable_time_as_unknown_and_no_negative_zero():
    from gpuforge.publish import status

    assert status.expiry("yesterday-ish", 30, NOW)["state"] == "unknown"
    assert status._expiry_text({"at": "x", "in_days": -0.0, "state": "EXPIRED"}) == ", EXPIRED 0 d ago"
