"""Promote exactly the validated bytes, by digest, from the build's version tag (what gpuforge.push.pusher pushed) to
dev and prod (skopeo copies by digest), as a recorded transaction (gpuforge.publish.transaction).

A promotion is planned for every selected target before any tag is written. It is refused (and no
tag moves) unless:
  - the target was pushed, the registry still holds that digest, and its version tag still points at it;
    for prod, the build's dev version tag (`<version>-dev`) does: it went through dev;
  - the registry holds validation statements on that digest signed by the expected key or identity
    (made by `gpuforge validate --attest`, in the validating run), and the NEWEST of them in registry
    order is complete evidence for this image (gpuforge.validate.evidence), made by this validator set:
    a red statement newer than a green one blocks. Nothing local (reports/, builds.json's report
    digests) is read: a checkout edit cannot stand in for a signed run;
  - prod: the newest signed GPU validation statement is green too, unless --allow-no-gpu (a warning,
    recorded in the promotion record and history);
  - the build's environment version tag (`<version>-dev`, `<version>-prod`) is absent or already at this digest, or
    --replace (recorded) is given. The environment's tags (`<tag>-dev`, `<tag>-prod`, the matrix's aliases such as
    `latest`) name no build: they follow promotions and rollbacks.
"""

from __future__ import annotations

import datetime as dt
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from gpuforge.errors import ConfigError, PromotionRefused
from gpuforge.evidence.age import age_days
from gpuforge.plan.target import ImageRef, Target
from gpuforge.publish import history, prod, transaction
from gpuforge.push.pusher import pushed_version
from gpuforge.registry import attest
from gpuforge.registry.client import Manifest, Registry, RegistryAuth
from gpuforge.state.promotions import Evidence, PromotionRecord
from gpuforge.state.records import Records
from gpuforge.validate import evidence
from gpuforge.validate.report_model import Evidence as ReportEvidence
from gpuforge.validate.report_model import Report


def _refuse(t_id: str, why: str) -> NoReturn:
    msg = f"{t_id}: promotion refused: {why}; no tag was changed"
    raise PromotionRefused(msg)


def signed_reports(ref: str, signed: list[attest.Signed]) -> dict[int, Report]:
    """Each signed validation statement on `ref` as a Report, by layer index: one of another shape is one line
    (StateError, exit 8), never a guess."""
    return {s.index: Report.of(s.predicate, f"{ref}: signed validation statement (layer {s.index + 1})") for s in signed}


def judge(ref: str, image: str | Manifest, verifier: attest.Verifier, *, require_gpu: bool,
          check_validator_set: bool = True, who: str) -> Evidence:
    """The signed validation statements on `ref` (host/repo@digest), judged in registry order: the newest
    decides (a red one newer than a green one blocks); under `require_gpu` the newest GPU one too.
    `image`: the validated image's id (from its build record), or, with no record (resume, rollback), the
    registry's manifest at `ref`: the evidence must then name an image id that manifest holds (its config
    digest on a graphdriver engine, the manifest or index digest itself on the containerd store).
    Raises PromotionRefused naming the reason. Returns the evidence relied on."""
    is_image = image.holds if isinstance(image, Manifest) else image.__eq__
    image_id = image.digest if isinstance(image, Manifest) else image
    signed = attest.verified_statements(ref, attest.VALIDATION_TYPE, verifier)
    if not signed:
        _refuse(who, f"{ref} carries no signed validation attestation that verifies (sign in the validating run: "
                     f"`gpuforge validate --attest --sign-key KEY {who}` after `gpuforge push`)")

    reports = signed_reports(ref, signed)

    def check(s: attest.Signed, what: str, gpu: bool) -> None:
        p = reports[s.index]
        n_green_before = sum(not evidence.problems(reports[o.index]) for o in signed if o.index < s.index)
        where = f"the newest signed {what} statement on {ref} (layer {s.index + 1} of the attestations"
        where += f", newer than {n_green_before} green one(s))" if n_green_before else ")"
        if not (p.run and p.run.signed_in_run):
            _refuse(who, f"{where} was not signed by the validating run (a report file signed after the fact); "
                         "re-validate with `gpuforge validate --attest`")
        probs = evidence.problems(p, require_gpu=gpu)
        if probs:
            _refuse(who, f"{where} is not evidence: {'; '.join(probs)}")
        ev = p.evidence or ReportEvidence()
        if not ev.image_id or not is_image(ev.image_id):
            _refuse(who, f"{where} is for image {str(ev.image_id)[:19]}, not {image_id[:19]}")
        if check_validator_set and ev.validator_set != evidence.validator_set_hash():
            _refuse(who, f"{where} was made by another validator set ({str(ev.validator_set)[:19]}, this "
                         f"checkout has {evidence.validator_set_hash()[:19]}); re-run validation")

    newest = signed[-1]
    rep = reports[newest.index]
    check(newest, "validation", rep.gpu_run() and require_gpu)
    gpu_layer = gpu_at = None
    gpu_rep = rep if rep.gpu_run() else None
    if require_gpu:
        gpu_runs = [s for s in signed if reports[s.index].gpu_run()]
        if not gpu_runs:
            _refuse(who, f"{ref} carries no signed GPU validation (prod requires GPU evidence: run "
                         f"`gpuforge validate --gpu --attest` on a GPU runner, or `validate --gpu --bundle` and "
                         f"`gpuforge attach` where it has no registry; or pass --allow-no-gpu to promote without it)")
        check(gpu_runs[-1], "GPU validation", True)
        gpu_layer = gpu_runs[-1].layer
        gpu_rep = reports[gpu_runs[-1].index]
        gpu_at = gpu_rep.validated_at()
    model, driver = gpu_rep.gpu_summary() if gpu_rep else (None, None)
    return Evidence(validation=newest.layer, green=True, gpu=gpu_layer, gpu_model=model, driver=driver,
                    validated_at=rep.validated_at(), gpu_validated_at=gpu_at if gpu_layer else None,
                    gpu_signed_offline=bool(gpu_rep and gpu_rep.run and gpu_rep.run.signed_offline),
                    validator_set=rep.evidence.validator_set if rep.evidence else None)


def too_old(ev: Evidence, max_age_days: float, now: dt.datetime | None = None) -> str | None:
    """Why the evidence a promotion relies on is past the environment's time to live (None: within it). A statement
    with no signing time is past it: its age cannot be shown."""
    held = [("validation", ev.validated_at), *([("GPU validation", ev.gpu_validated_at)] if ev.gpu else [])]
    for what, at in held:
        if not at:
            return f"the newest signed {what} statement names no signing time"
        age = age_days(at, now)
        if age is None:
            return f"the newest signed {what} statement's signing time {at!r} is not an ISO time"
        if age > max_age_days:
            return (f"the newest signed {what} statement was signed {age:.1f} days ago ({at}), past the time to live of "
                    f"{max_age_days:g} days (GPUFORGE_EVIDENCE_TTL_DAYS); re-validate (`validate --attest --no-reuse`: "
                    "a reuse keeps its source's age)")
    return None


@dataclass(frozen=True, kw_only=True)
class EnvTags:
    """The tags a promotion of one build to one environment points at its digest."""

    version: tuple[str, ...]  # `<version>-<env>`: this build was promoted there; names it for good (--replace aside)
    moving: tuple[str, ...]  # `<tag>-<env>` first, then the matrix's aliases: what the environment holds now

    def all(self) -> list[str]:
        return list(dict.fromkeys([*self.version, *self.moving]))


def env_tags(t: Target, env: str, version: str | None = None) -> EnvTags:
    """The environment's tags for target `t`; with `version` (a build's version tag), that build's own tag in it too.
    A rollback moves only the moving ones: the build it restores has its own already."""
    return EnvTags(version=(f"{version}-{env}",) if version else (),
                   moving=tuple(dict.fromkeys([f"{t.tag}-{env}", *t.aliases.get(env, ())])))


def version_tags_moved(reg: Registry, repo: ImageRef, tags: EnvTags, digest: str) -> dict[str, str]:
    """The version tags among `tags` that now name another digest (tag -> that digest)."""
    out = {}
    for tg in tags.version:
        held = reg.manifest(repo.with_tag(tg))
        if held is not None and held.digest != digest:
            out[tg] = held.digest
    return out


def gpu_rule(env: str, *, require_gpu: bool, allow_no_gpu: bool) -> bool:
    """Prod needs GPU evidence unless --allow-no-gpu says otherwise, out loud."""
    if require_gpu and allow_no_gpu:
        msg = "--require-gpu and --allow-no-gpu contradict each other"
        raise ConfigError(msg)
    return require_gpu or (env == "prod" and not allow_no_gpu)


def _plan(t: Target, *, records: Records, auth: RegistryAuth, env: str, require_gpu: bool,
          allow_no_gpu: bool, replace: bool, verifier: attest.Verifier | None, require_cve: bool,
          max_age_days: float | None) -> tuple[transaction.Move, history.History]:
    rec = records.require_build(t.id)
    if not rec.digest:
        _refuse(t.id, f"it was never pushed (run `gpuforge push {t.id}`)")
    image_id, digest = rec.image_id, str(rec.digest)
    ref = pushed_version(t, rec)
    repo, version = ref.bare(), str(ref.tag)
    reg = Registry(auth)
    m = reg.manifest(ref.pinned(digest))
    if m is None:
        _refuse(t.id, f"the registry has no manifest {digest}")
    if not m.holds(image_id):
        _refuse(t.id, f"{digest} holds image {m.config_digest or 'an index'}, not the validated {image_id[:19]}")
    current = reg.manifest(ref)
    if current is None or current.digest != digest:
        now = current.digest if current else "nothing"
        _refuse(t.id, f"{ref.repository}:{version} now points to {now}, not the validated {digest} (re-pushed after "
                      f"validation, or not pushed yet: `gpuforge push {t.id}`)")
    if env == "prod":
        dev = reg.manifest(ref.with_tag(f"{version}-dev"))
        if dev is None or dev.digest != digest:
            _refuse(t.id, f"{ref.repository}:{version}-dev does not point to {digest}; promote this build to dev first")
    if verifier is None:
        _refuse(t.id, "no way to verify the signed evidence: pass --key cosign.pub, set GPUFORGE_COSIGN_PUBLIC_KEY, "
                      "or GPUFORGE_COSIGN_IDENTITY + GPUFORGE_COSIGN_ISSUER for keyless signatures")
    ev = judge(str(ref.pinned(digest)), image_id, verifier, require_gpu=require_gpu, who=t.id)
    if max_age_days is not None and (why := too_old(ev, max_age_days)):
        _refuse(t.id, why)
    if env == "prod":  # prod also needs GPU evidence from every fleet pool and a green CVE verdict (prod_require_cve)
        prod.check(t, ref=str(ref.pinned(digest)), record=rec, verifier=verifier, require_cve=require_cve,
                   max_age_days=max_age_days)
    tags = env_tags(t, env, version)
    replaced = version_tags_moved(reg, repo, tags, digest)
    if replaced and not replace:
        _refuse(t.id, f"version tag(s) {', '.join(f'{ref.repository}:{tg} (at {d[:19]})' for tg, d in replaced.items())} "
                      "name another digest; version tags are immutable: pass --replace to move them to this digest "
                      "(recorded in the promotion record)")
    hist = history.load(reg, repo, verifier, target=t.id, env=env)
    mv = transaction.Move(target=t.id, env=env, reg=reg, repo=repo, digest=digest, tags=tags.all(), replaced=list(replaced),
                          allow_no_gpu=env == "prod" and not require_gpu, evidence=ev, version=version)
    return mv, hist


def rejudge(reg: Registry, repo: ImageRef, verifier: attest.Verifier, rec: PromotionRecord) -> None:
    """An interrupted intent is completed only if its evidence still holds (a red run may have come since)."""
    m = reg.manifest(repo.pinned(rec.digest))
    if m is None:
        _refuse(rec.target, f"the registry has no manifest {rec.digest}")
    judge(str(repo.pinned(rec.digest)), m, verifier,
          require_gpu=rec.env == "prod" and not rec.allow_no_gpu, check_validator_set=False, who=rec.target)


def resume(t: Target, *, env: str, verifier: attest.Verifier | None, signer: attest.Signer,
           reports: Path | None) -> PromotionRecord | None:
    """Complete an interrupted promotion or rollback of `t` in `env`, if the registry shows one."""
    if verifier is None:
        return None  # the plan refuses with the reason
    repo, reg = t.ref.bare(), Registry(verifier.auth)
    hist = history.load(reg, repo, verifier, target=t.id, env=env)
    return transaction.complete_interrupted(hist, reg, repo, signer=signer, reports=reports,
                                            judge=lambda rec: rejudge(reg, repo, verifier, rec))


def promote_targets(targets: list[Target], *, env: str, records: Records, auth: RegistryAuth,
                    verifier: attest.Verifier | None, signer: attest.Signer, reports: Path | None = None,
                    require_gpu: bool = False, allow_no_gpu: bool = False,
                    replace: bool = False, require_cve: bool = False, max_age_days: float | None = None) -> list[dict[str, Any]]:
    """Promote each target's pushed digest to `env`; `verifier` checks the evidence (None: refused, saying how to
    give one), `signer` signs the promotion records, `require_cve` (prod) asks for a green signed CVE verdict,
    `max_age_days` (the environment's evidence time to live) refuses evidence signed longer ago. A rollback, and the
    completion of an interrupted promotion, hold no time to live: they restore what was promoted."""
    require_gpu = gpu_rule(env, require_gpu=require_gpu, allow_no_gpu=allow_no_gpu)
    for t in targets:
        resume(t, env=env, verifier=verifier, signer=signer, reports=reports)
    plans = [_plan(t, records=records, auth=auth, env=env, require_gpu=require_gpu,
                   allow_no_gpu=allow_no_gpu, replace=replace, verifier=verifier, require_cve=require_cve,
                   max_age_days=max_age_days)
             for t in targets]
    results = []
    for mv, hist in plans:
        if mv.allow_no_gpu:
            print(f"gpuforge: WARNING: {mv.target} -> prod WITHOUT GPU evidence (--allow-no-gpu); this is recorded "
                  "in the promotion record and history", file=sys.stderr, flush=True)
        results.append(transaction.execute(mv, hist, signer=signer, reports=reports))
    return results


def attest_targets(targets: list[Target], **_ignored: object) -> list[dict[str, Any]]:
    """Signing a report file is refused: the file can be edited after the run that made it."""
    ids = " ".join(t.id for t in targets) or "SEL"
    msg = (f"attest of a report file is refused: a file can be edited after the run that wrote it, so only the "
           f"validating run signs; run `gpuforge validate --attest --sign-key KEY {ids}` after `gpuforge push`")
    raise PromotionRefused(msg)
