"""Which validators apply to an image, decided before the run from the host-side target, and the few reasons a
chosen validator may still skip.

A validator names what it applies to with markers: `@pytest.mark.flavor("devel")`, `@pytest.mark.source("wheels")`,
`@pytest.mark.gpu` (on a function, or as a module's `pytestmark`). A validator without them applies to every image.
The target's kind (its flavor and source from target.json, and whether the run has GPUs) decides the rest: what
does not apply is deselected at collection and listed in the report as not applicable, with the reason below. The
required set of a run is the set that applies to its kind (gpuforge.validate.evidence.required_checks), so a check
chosen for an image has to run.

A chosen check may skip only for a reason of the environment the image cannot change, and only by raising
`vutil.EnvSkipped` with one of `EnvSkip`: the typed reason travels in the report (a check's `skip`), never its
wording. Every other skip of a chosen check makes the report not evidence.

This module's source is part of the validator set's hash (gpuforge.validate.evidence.validator_set_hash): a change of
the rules or the reasons is a change of the validator set.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuforge.image.expected import Expected

# marker name -> the kind's field it is read against
MARKERS: dict[str, str] = {"flavor": "flavor", "source": "source", "gpu": "gpu"}
MARKER_HELP: dict[str, str] = {
    "flavor": "flavor(*names): applies only to images of these flavors (runtime, devel)",
    "source": "source(*names): applies only to images built from these sources (wheels, cuda-base)",
    "gpu": "gpu: applies only to runs with GPUs (--gpuforge-gpu)",
}


@dataclass(frozen=True)
class Kind:
    """What decides which validators apply: the image's flavor and source (None: the target does not say), and
    whether the run has GPUs."""

    flavor: str | None
    source: str | None
    gpu: bool

    @classmethod
    def of(cls, expected: Expected | None, gpu: bool) -> Kind:
        e = expected or Expected()
        return cls(flavor=e.flavor, source=e.source, gpu=gpu)

    def label(self) -> str:
        """e.g. 'runtime/wheels, no GPU': how a report and an error name the kind."""
        return f"{self.flavor or 'any flavor'}/{self.source or 'any source'}, {'GPU' if self.gpu else 'no GPU'}"

    def as_dict(self) -> dict[str, Any]:
        return {"flavor": self.flavor, "source": self.source, "gpu": self.gpu}


Marks = Mapping[str, tuple[str, ...]]  # marker name -> its arguments (() for gpu)


def not_applicable(marks: Marks, kind: Kind) -> str | None:
    """Why a validator with these selection markers does not apply to `kind`; None when it applies.

    >>> not_applicable({"flavor": ("devel",)}, Kind("runtime", "wheels", gpu=False))
    'devel images only: this image is runtime'
    >>> not_applicable({"gpu": ()}, Kind("devel", "wheels", gpu=True)) is None
    True
    """
    if "gpu" in marks and not kind.gpu:
        return "GPU runs only: this run has no GPU (`gpuforge validate --gpu` on a GPU runner)"
    for name in ("flavor", "source"):
        want = marks.get(name)
        if want is None:
            continue
        have = getattr(kind, MARKERS[name])
        if have not in want:
            what = " or ".join(want)
            if have is None:
                return f"{what} images only: the target names no {name}"
            return f"{what} images only: this image is {have}" if name == "flavor" else \
                f"images built from {what} only: this image is built from {have}"
    return None


def marks_of(markers: Iterable[Any]) -> dict[str, tuple[str, ...]]:
    """The selection markers among a pytest item's (`item.iter_markers()`), closest first; a marker repeated at
    module and function level: the function's wins."""
    out: dict[str, tuple[str, ...]] = {}
    for m in markers:
        if m.name in MARKERS and m.name not in out:
            out[m.name] = tuple(str(a) for a in m.args)
    return out


def applying(marked: Mapping[str, Marks], kind: Kind) -> tuple[str, ...]:
    """The node ids (of `marked`: node id -> its selection markers) that apply to `kind`, sorted."""
    return tuple(sorted(i for i, m in marked.items() if not_applicable(m, kind) is None))


class EnvSkip(enum.Enum):
    """The reasons a chosen check may skip: facts of where it runs, not of the image. `describe` is what the report
    says; `runs` the runs that can meet the reason (with GPUs, without, or both): in another run it is not allowed."""

    NO_BUILD_CA = "no-build-ca"
    ONE_GPU = "one-gpu"
    NO_DRIVER = "no-driver"

    @property
    def describe(self) -> str:
        return _ENV_SKIPS[self][0]

    @property
    def runs(self) -> frozenset[bool]:
        """The values of `gpu_run` this reason is allowed in."""
        return _ENV_SKIPS[self][1]


_ANY, _GPU, _NO_GPU = frozenset({True, False}), frozenset({True}), frozenset({False})
# why each environmental skip is honest
_ENV_SKIPS: dict[EnvSkip, tuple[str, frozenset[bool]]] = {
    # the build was given no extra CA bundle, so there is none to search the image for
    EnvSkip.NO_BUILD_CA: ("no build CA: the build was given no extra CA bundle", _ANY),
    # a one-GPU runner has no collective to check; honest because test_sees_exactly_the_gpus_asked_for fails when
    # the container sees fewer GPUs than the runner was given
    EnvSkip.ONE_GPU: ("one GPU: no collective to check", _GPU),
    # the driver checks run in every run (a CPU box proves them against an image's fake nvidia-smi), and a container
    # of a run without GPUs sees no driver; in a GPU run a missing driver is a failure, never this skip
    EnvSkip.NO_DRIVER: ("no NVIDIA driver visible in a run without GPUs", _NO_GPU),
}


def env_skip_allowed(value: str | None, gpu_run: bool) -> bool:
    """Whether a check's typed skip reason (its report's `skip`) is one of EnvSkip, in a run that can meet it."""
    try:
        reason = EnvSkip(value)
    except ValueError:
        return False
    return gpu_run in reason.runs
