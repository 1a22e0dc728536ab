"""The pure parts of promotion: the record schema, which promoted digest a rollback restores, which tags are
version tags, and the prod GPU rule. The registry-facing parts are in tests/integration/publish/."""

from __future__ import annotations

import dataclasses

import pytest

from gpuforge.errors import ConfigError, PromotionRefused
from gpuforge.publish import promote, rollback
from gpuforge.publish.history import Entry, History
from gpuforge.state import promotions
from gpuforge.state.promotions import PromotionRecord, RunInfo

A, B, C = ("sha256:" + c * 64 for c in "abc")
RUN = RunInfo(id="r1", gpuforge_version="0", host="h")


def rec(seq: int, digest: str, phase: str = "done", kind: str = "promote", **kw) -> PromotionRecord:
    return PromotionRecord(id=f"{seq // 2:032x}", phase=phase, kind=kind, target="t", env="prod", repository="r/x",
                           digest=digest, tags=["t-prod"], prior={"t-prod": None}, seq=seq, at="2026-01-01T00:00:00+00:00",
                           run=RUN, **kw)


@dataclasses.dataclass
class _T:
    id: str = "t"


def test_record_round_trips_and_rejects_bad_fields():
    r = rec(1, A, replaced=["t-prod"], allow_no_gpu=True)
    assert promotions.parse(r.dump()) == r
    for bad in ({"digest": "sha256:xyz"}, {"phase": "maybe"}, {"env": "staging"}, {"seq": -1}, {"id": "../../etc"}):
        assert promotions.parse({**r.dump(), **bad}) is None, bad
    assert promotions.parse({"Data": "not a record"}) is None


@pytest.mark.parametrize(("digests", "current", "steps", "want"), [
    ([A, B], B, 1, A),
    ([A, B, C], C, 2, A),
    ([A, A, B], B, 1, A),  # promoting the same digest twice is one step
    ([A, B, A], A, 1, B),  # after a rollback, one step back is the digest rolled away from
])
def test_rollback_steps_walk_back_over_changes_of_digest(digests, current, steps, want):
    done = [rec(i, d) for i, d in enumerate(digests)]
    assert rollback.choose(_T(), done, current, to=None, steps=steps).digest == want


def test_rollback_refuses_what_history_cannot_give():
    done = [rec(0, A), rec(1, B)]
    with pytest.raises(PromotionRefused, match="nothing 2 step"):
        rollback.choose(_T(), done, B, to=None, steps=2)
    with pytest.raises(PromotionRefused, match="was never promoted"):
        rollback.choose(_T(), done, B, to=C, steps=None)
    with pytest.raises(PromotionRefused, match="moved outside gpuforge"):
        rollback.choose(_T(), done, C, to=None, steps=1)
    with pytest.raises(ConfigError, match="not a digest"):
        rollback.choose(_T(), done, B, to="latest", steps=None)
    with pytest.raises(ConfigError, match="must be 1 or more"):
        rollback.choose(_T(), done, B, to=None, steps=0)
    assert rollback.choose(_T(), done, B, to=A[:19], steps=None).digest == A


def test_interrupted_is_an_intent_at_the_head_without_its_done():
    intent = rec(2, B, phase="intent")
    h = History("t", "prod", [Entry(rec(0, A, phase="intent"), ""), Entry(rec(1, A), ""), Entry(intent, "")])
    assert h.interrupted() == intent and h.next_seq() == 3
    h.entries.append(Entry(rec(3, B), ""))
    assert h.interrupted() is None


@pytest.mark.parametrize(("tag", "moving"), [("latest", True), ("latest-dev", True), ("t-prod", False),
                                             ("2.7.1-cu126-debian12-runtime-wheels", False), ("latestx", False)])
def test_only_latest_aliases_move(tag, moving):
    assert promote.moving_alias(tag) is moving


def test_prod_needs_gpu_unless_opted_out_out_loud():
    assert promote.gpu_rule("prod", require_gpu=False, allow_no_gpu=False) is True
    assert promote.gpu_rule("prod", require_gpu=False, allow_no_gpu=True) is False
    assert promote.gpu_rule("dev", require_gpu=False, allow_no_gpu=False) is False
    assert promote.gpu_rule("dev", require_gpu=True, allow_no_gpu=False) is True
    with pytest.raises(ConfigError, match="contradict"):
        promote.gpu_rule("prod", require_gpu=True, allow_no_gpu=True)
