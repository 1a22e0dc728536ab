"""What prod needs beyond the green reports promote already checks: a green GPU attestation from every fleet pool
the target declares, newer than its build; and (GPUFORGE_PROD_REQUIRE_CVE=1) a green signed CVE verdict.

Both are judged from signed statements on the registry (cosign verify-attestation), never from local files:
a pool is covered when a verified GPU validation predicate for this digest covers it (gpuforge.evidence.coverage:
green, and its evidence.gpu_host — the GPU model, driver and count the validators saw on the runner — matches the
pool).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpuforge.errors import PromotionRefused
from gpuforge.evidence import statements
from gpuforge.evidence.coverage import covers
from gpuforge.plan.target import ImageRef
from gpuforge.state.models import BuildRecord
from gpuforge.validate.report_model import Report

if TYPE_CHECKING:
    from gpuforge.plan.fleet import Pool
    from gpuforge.plan.target import Target
    from gpuforge.registry.attest import Verifier


def _deciding(pool: Pool, attestations: list[Report]) -> list[Report]:
    """What decides for `pool`: the newest GPU statement (registry order) from a node of the pool when there is one,
    so a red run there (a nightly canary after a driver upgrade) is not hidden by an older green one; else all of
    them, each then saying why it does not cover the pool."""
    on_pool = [rep for rep in attestations if rep.gpu and statements.host_matches(pool, rep.host_of()) is None]
    return on_pool[-1:] or attestations


def pools_missing(target: Target, attestations: list[Report], *, built_at: str | None = None,
                  image_id: str | None = None, max_age_days: float | None = None) -> list[str]:
    """The names of the pools `target` declares (target.pools, from matrix.yaml's fleet) whose deciding statement in
    `attestations` (verified GPU validation predicates of this digest, in registry order) does not cover them, in the
    fleet's order."""
    return [p.name for p in target.pools
            if not any(covers(p, a, built_at=built_at, image_id=image_id, max_age_days=max_age_days) is None
                       for a in _deciding(p, attestations))]


def why_missing(target: Target, attestations: list[Report], *, built_at: str | None = None, image_id: str | None = None,
                max_age_days: float | None = None) -> str:
    """One phrase per missing pool: its description and the deciding attestation's reason (for the refusal)."""
    out = []
    for p in target.pools:
        reasons = [covers(p, a, built_at=built_at, image_id=image_id, max_age_days=max_age_days)
                   for a in _deciding(p, attestations)]
        if None in reasons:
            continue
        known = [r for r in reasons if r is not None]  # all of them, after the check above
        out.append(f"{p.describe()}: " + (known[-1] if known else "no GPU attestation"))
    return "; ".join(out)


def check(t: Target, *, ref: str, record: BuildRecord, verifier: Verifier, require_cve: bool, max_age_days: float | None = None) -> None:
    """prod's extra requirements for target `t` at `ref` (host/repo@digest); raises PromotionRefused naming what
    is missing. Called once from gpuforge.publish.promote's plan for env == prod; `require_cve` is the
    prod_require_cve setting (GPUFORGE_PROD_REQUIRE_CVE)."""
    from gpuforge.cve import gate as cve
    from gpuforge.registry import attest

    def refuse(why: str) -> None:
        msg = f"{t.id}: promotion refused: {why}; no tag was changed"
        raise PromotionRefused(msg)

    if t.pools:
        reps = [Report.of(p, f"{ref}: signed validation statement")
                for p in attest.verified_predicates(ref, attest.VALIDATION_TYPE, verifier)]
        preds = [r for r in reps if r.gpu]
        kw: dict[str, Any] = {"built_at": record.built_at, "image_id": record.image_id, "max_age_days": max_age_days}
        missing = pools_missing(t, preds, **kw)
        if missing:
            refuse(f"no green GPU attestation newer than the build for pool(s) {', '.join(missing)} of the fleet "
                   f"({why_missing(t, preds, **kw)}); run the GPU validation on a runner of each "
                   "(images.yml's gpu job: `gpuforge validate --gpu --attest --sign-key cosign.key`; a runner with no "
                   "registry: `validate --gpu --bundle`, then `gpuforge attach`)")
    if require_cve:
        probs = cve.cve_ok(attest.verified_predicates(ref, cve.CVE_TYPE, verifier), digest=str(ImageRef.parse(ref).digest),
                           built_at=record.built_at)
        if probs:
            refuse("; ".join(probs))
