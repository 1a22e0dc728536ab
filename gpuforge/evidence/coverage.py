"""Whether a signed GPU validation statement covers a fleet pool: green complete evidence from a node of the pool
(its evidence.gpu_host: the GPU model, driver and count the validators saw), made by this checkout's validator set,
newer than the build, within the time to live. Prod's rule (every declared pool covered) and the fleet's support
table both read it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuforge.evidence import statements
from gpuforge.evidence.age import age_days, epoch
from gpuforge.validate import evidence
from gpuforge.validate.report_model import Evidence as ReportEvidence
from gpuforge.validate.report_model import Report

if TYPE_CHECKING:
    from gpuforge.plan.fleet import Pool


def covers(pool: Pool, rep: Report, *, built_at: str | None = None, image_id: str | None = None,
           max_age_days: float | None = None) -> str | None:
    """None when GPU statement `rep` is green evidence from a host of `pool`, newer than the build, made by this
    checkout's validator set (for `image_id`, when given), signed within `max_age_days` (when given); else why not."""
    if not rep.gpu:
        return "not a GPU report"
    probs = evidence.problems(rep, require_gpu=True)
    if probs:
        return f"not green ({probs[0]})"
    ev = rep.evidence or ReportEvidence()
    if ev.validator_set != evidence.validator_set_hash():
        return "made by another validator set"
    if image_id and ev.image_id != image_id:
        return f"for image {str(ev.image_id)[:19]}, not {image_id[:19]}"
    why = statements.host_matches(pool, rep.host_of())
    if why:
        return why
    built = epoch(built_at)
    # a reuse's checks ran on another digest of these bytes, maybe before this build: its content key proved them
    if built is not None and float(rep.started or 0) <= built and not (rep.run and rep.run.reused_from):
        return "older than the build"
    if max_age_days is not None:
        age = age_days(rep.validated_at())
        if age is None or age > max_age_days:
            return (f"signed {age:.1f} days ago, past the time to live of {max_age_days:g} days" if age is not None
                    else "its signing time is missing or not an ISO time")
    return None
