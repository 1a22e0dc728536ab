"""The pure parts of promotion: the record schema, which promoted digest a rollback restores, which tags are
version tags and which follow the environment, and the prod GPU rule. The registry-facing parts are in tests/integration/publish/."""

from __future__ import annotations

import dataclasses

import pytest

from conftest import BASE_MATRIX
from gpuforge.errors import ConfigError, PromotionRefused, StateError
from gpuforge.plan.matrix import load_matrix
from gpuforge.publish import promote, rollback
from gpuforge.publish.history import Entry, History
from gpuforge.push import pusher
from gpuforge.state import promotions
from gpuforge.state.models import BuildRecord
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


@dataclasses.dataclass
class _Aliased:
    tag: str = "t"
    aliases: dict = dataclasses.field(default_factory=dict)


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


def test_a_builds_own_environment_tag_is_its_version_tag_and_the_environments_tags_move():
    """Promoting build V of target `t` to prod: `V-prod` names that build for good; `t-prod` and the aliases are what
    prod holds now, and follow promotions and rollbacks (a rollback names no build: it moves only those)."""
    t = _Aliased(aliases={"prod": ("2.7.1-cu126-debian12-runtime-wheels", "latest"), "dev": ("latest-dev",)})
    v = "t-20261206T203015Z"
    tags = promote.env_tags(t, "prod", v)
    assert tags.version == (f"{v}-prod",)
    assert tags.moving == ("t-prod", "2.7.1-cu126-debian12-runtime-wheels", "latest")
    assert tags.all() == [f"{v}-prod", "t-prod", "2.7.1-cu126-debian12-runtime-wheels", "latest"]
    back = promote.env_tags(t, "dev")
    assert back.version == () and back.all() == ["t-dev", "latest-dev"]


def test_version_record_round_trips_and_an_older_record_has_none():
    r = rec(1, A, version="t-20261206T203015Z")
    assert promotions.parse(r.dump()).version == "t-20261206T203015Z"
    older = {k: v for k, v in rec(1, A).dump().items() if k != "version"}
    assert promotions.parse(older).version is None


def test_prod_needs_gpu_unless_opted_out_out_loud():
    assert promote.gpu_rule("prod", require_gpu=False, allow_no_gpu=False) is True
    assert promote.gpu_rule("prod", require_gpu=False, allow_no_gpu=True) is False
    assert promote.gpu_rule("dev", require_gpu=False, allow_no_gpu=False) is False
    assert promote.gpu_rule("dev", require_gpu=True, allow_no_gpu=False) is True
    with pytest.raises(ConfigError, match="contradict"):
        promote.gpu_rule("prod", require_gpu=True, allow_no_gpu=True)


def test_push_and_promote_name_the_recorded_version_and_refuse_a_record_without_one(write_matrix):
    t = load_matrix(write_matrix(BASE_MATRIX)).select(None)[0].on("registry.example.com")
    rec = BuildRecord(image_id=A, build="20261206T203015Z", version=f"{t.tag}-20261206T203015Z")
    assert str(pusher.pushed_version(t, rec)) == f"registry.example.com/gpuforge/pytorch:{t.tag}-20261206T203015Z"
    with pytest.raises(StateError, match=f"names no version tag .* run `gpuforge build {t.id}` again"):
        pusher.pushed_version(t, BuildRecord(image_id=A))
