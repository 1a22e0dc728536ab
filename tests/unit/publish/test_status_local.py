"""`status` shows this checkout's build record, read typed: what was built how, where it was pushed, and whether each
report file validate wrote still holds what that run observed (its recorded digest)."""

from __future__ import annotations

import json

from gpuforge.publish import status
from gpuforge.state.models import BuildRecord
from gpuforge.validate import evidence

IMG, DIGEST = "sha256:" + "a" * 64, "sha256:" + "b" * 64


def test_a_report_file_is_as_validated_until_it_is_edited(tmp_path):
    rep = {"target": "t", "exit_status": 0, "gpu": False, "green": True, "checks": []}
    f = tmp_path / "report.json"
    f.write_text(json.dumps(rep))
    rec = BuildRecord(image_id=IMG, digest=DIGEST, report=str(f), report_digest=evidence.digest_of(rep),
                      gpu_report=str(tmp_path / "gone.json"), gpu_report_digest="sha256:1")
    local = status._local(rec, DIGEST)
    assert local["reports"] == {"report": {"path": str(f), "state": "as validated"},
                                "gpu_report": {"path": str(tmp_path / "gone.json"), "state": "missing"}}
    f.write_text(json.dumps({**rep, "green": False}))
    assert status._local(rec, DIGEST)["reports"]["report"]["state"] == "changed since validate"
    assert status._local(rec, "sha256:" + "c" * 64)["differs"] is True and local["differs"] is False


def test_the_text_shows_the_record_and_the_reports(tmp_path):
    rec = BuildRecord(image_id=IMG, digest=DIGEST, size=2_500_000_000, seconds=61.0, driver="buildx", engine="26.1.5",
                      pushed_ref="r/x:t-20261206T203015Z", report=str(tmp_path / "r.json"), report_digest="sha256:1",
                      build="20261206T203015Z", version="t-20261206T203015Z")
    row = {"target": "t", "env": "dev", "repository": "r/x", "tags": {}, "digest": DIGEST, "version": None,
           "promotion": None, "interrupted": None, "evidence": None, "local": status._local(rec, DIGEST), "warnings": []}
    text = "\n".join(status._text(row))
    assert "local record: version t-20261206T203015Z, image sha256:aaaaaaaaaaaa, 2.50 GB" in text
    assert "by buildx" in text and "on 26.1.5" in text and "  version:" not in text
    assert "local push: r/x:t-20261206T203015Z" in text and f"local report: {tmp_path / 'r.json'} (missing)" in text
    assert "SOCI index" not in text
    lazy = status._local(rec.model_copy(update={"soci_index": "sha256:" + "5" * 64}), DIGEST)
    assert "local push: r/x:t-20261206T203015Z; SOCI index sha256:555555555555" in "\n".join(
        status._text({**row, "local": lazy}))
    held = "\n".join(status._text({**row, "version": "t-20261201T000000Z",
                                   "local": status._local(rec, "sha256:" + "c" * 64)}))
    assert "  version: t-20261201T000000Z" in held  # the build dev holds, as its promotion record names it
    assert "local build: DIFFERS: sha256:bbbbbbbbbbbb (t-20261206T203015Z)" in held


def test_evidence_expiry_against_the_time_to_live():
    import datetime as dt

    now = dt.datetime(2026, 12, 31, 12, tzinfo=dt.UTC)
    assert status.expiry("2026-12-30T12:00:00+00:00", 30, now) == {
        "at": "2027-01-29T12:00:00+00:00", "in_days": 29.0, "state": "fresh"}
    assert status.expiry("2026-12-05T12:00:00+00:00", 30, now)["state"] == "expiring"  # 4 days left: the last fifth
    gone = status.expiry("2026-11-01T12:00:00+00:00", 30, now)
    assert gone["state"] == "EXPIRED" and gone["in_days"] == -30.0
    assert status.expiry(None, 30, now)["state"] == "unknown"
    assert status.expiry("2026-12-30T12:00:00", 30, now)["in_days"] == 29.0  # no zone: UTC, as signed


def test_the_text_says_when_evidence_expires():
    ev = {"signed": 2, "green": True, "validated_at": "2026-11-01T12:00:00+00:00",
          "expires": {"at": "2026-12-01T12:00:00+00:00", "in_days": -3.5, "state": "EXPIRED"},
          "gpu": {"green": True, "model": "NVIDIA H200", "driver": "580.159.04", "validated_at": "2026-12-20T00:00:00+00:00",
                  "expires": {"at": "2027-01-19T00:00:00+00:00", "in_days": 4.2, "state": "expiring"}}}
    row = {"target": "t", "env": "prod", "repository": "r/x", "tags": {}, "digest": DIGEST, "version": None,
           "promotion": None, "interrupted": None, "evidence": ev, "local": None, "warnings": []}
    line = next(ln for ln in status._text(row) if "evidence:" in ln)
    assert "2026-11-01T12:00:00+00:00, EXPIRED 3.5 d ago" in line and "EXPIRES in 4.2 d" in line, line
