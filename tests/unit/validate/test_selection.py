"""The selection rules (gpuforge.validate.selection): which validators apply to an image's kind, and which typed
reasons a chosen check may skip for. Pure logic; the validators' own markers are exercised in test_evidence.py and
test_plugin.py."""

from __future__ import annotations

import pytest

from gpuforge.image.expected import Expected
from gpuforge.validate.selection import EnvSkip, Kind, applying, env_skip_allowed, marks_of, not_applicable

RUNTIME = Kind("runtime", "wheels", gpu=False)


@pytest.mark.parametrize(("marks", "kind", "why"), [
    ({}, RUNTIME, None),
    ({"flavor": ("devel",)}, RUNTIME, "devel images only: this image is runtime"),
    ({"flavor": ("runtime", "devel")}, RUNTIME, None),
    ({"flavor": ("devel",), "source": ("cuda-base",)}, Kind("devel", "wheels", gpu=False),
     "images built from cuda-base only: this image is built from wheels"),
    ({"flavor": ("devel",)}, Kind(None, None, gpu=True), "devel images only: the target names no flavor"),
    ({"gpu": ()}, RUNTIME, "GPU runs only: this run has no GPU (`gpuforge validate --gpu` on a GPU runner)"),
    ({"gpu": (), "flavor": ("devel",)}, Kind("devel", "wheels", gpu=True), None),
])
def test_not_applicable(marks, kind, why):
    assert not_applicable(marks, kind) == why


def test_the_kind_comes_from_the_target_json():
    assert Kind.of(Expected(flavor="devel", source="cuda-base"), gpu=True) == Kind("devel", "cuda-base", gpu=True)
    assert Kind.of(None, gpu=False) == Kind(None, None, gpu=False)
    assert RUNTIME.label() == "runtime/wheels, no GPU"


def test_the_closest_marker_wins():
    """iter_markers() yields the function's markers before the module's: a function may narrow its module's."""
    class M:
        def __init__(self, name, *args):
            self.name, self.args = name, args
    assert marks_of([M("flavor", "devel"), M("parametrize", "x"), M("flavor", "runtime"), M("gpu")]) == {
        "flavor": ("devel",), "gpu": ()}


def test_applying_keeps_what_applies_sorted():
    marked = {"b.py::t": {}, "a.py::t": {"flavor": ("runtime",)}, "c.py::t": {"flavor": ("devel",)}}
    assert applying(marked, RUNTIME) == ("a.py::t", "b.py::t")


@pytest.mark.parametrize(("value", "gpu_run", "allowed"), [
    ("no-build-ca", False, True), ("no-build-ca", True, True),
    ("one-gpu", True, True), ("one-gpu", False, False),
    ("no-driver", False, True), ("no-driver", True, False),
    (None, False, False), ("GPU checks not requested", False, False),
])
def test_typed_reasons_and_the_runs_that_can_meet_them(value, gpu_run, allowed):
    assert env_skip_allowed(value, gpu_run) is allowed


def test_every_typed_reason_says_why():
    assert all(r.describe and r.runs for r in EnvSkip)
