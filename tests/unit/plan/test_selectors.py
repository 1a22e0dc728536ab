from __future__ import annotations

from dataclasses import dataclass

import pytest

from gpuforge.errors import SelectorError
from gpuforge.plan.selectors import matches, select


@dataclass(frozen=True)
class T:
    id: str
    torch: str = "2.7.1"
    cuda: str = "12.6"
    python: str = "3.12"
    os: str = "ubuntu24.04"
    flavor: str = "runtime"
    source: str = "cuda-base"


TS = [T("a-runtime", cuda="12.6"), T("b-devel", cuda="12.8", flavor="devel"), T("c-runtime", cuda="12.8")]


def test_key_value_selectors_and_together():
    assert [t.id for t in select(TS, ["cuda=12.8", "flavor=runtime"])] == ["c-runtime"]


def test_value_globs_and_braces():
    assert [t.id for t in select(TS, ["cuda=12.{6,8}", "flavor=run*"])] == ["a-runtime", "c-runtime"]


def test_id_globs_or_together():
    assert [t.id for t in select(TS, ["a-*", "b-*"])] == ["a-runtime", "b-devel"]


def test_space_separated_in_one_argument():
    assert matches(TS[1], ["cuda=12.8 flavor=devel"])


@pytest.mark.parametrize(("sels", "msg"), [
    (["cuda=12.4"], "selector cuda=12.4 matches no target (cuda values in the matrix: 12.6, 12.8)"),
    (["*-nope"], "selector '*-nope' matches no target id"),
    (["gpu=h100"], "unknown key 'gpu'"),
    (["cuda="], "empty value"),
    (["cuda=12.6", "flavor=devel"], "together match no target"),
])
def test_selector_errors(sels, msg):
    with pytest.raises(SelectorError, match=msg.replace("(", r"\(").replace(")", r"\)").replace("*", r"\*")):
        select(TS, sels)


def test_compiled_selectors_match_like_matches():
    from gpuforge.plan.selectors import compile, hit

    c = compile(["cuda=12.{6,8}", "*-devel"])
    assert [t.id for t in TS if hit(t, c)] == [t.id for t in TS if matches(t, ["cuda=12.{6,8}", "*-devel"])] == ["b-devel"]


def test_brace_bombs_are_refused_before_expanding():
    with pytest.raises(SelectorError, match="expand to more than 1024 patterns"):
        select(TS, ["{a,b}" * 30])
    with pytest.raises(SelectorError, match="expand to more than 1024 patterns"):
        matches(TS[0], ["cuda=" + "{1,2}" * 11])
