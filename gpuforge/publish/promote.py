"""Push built targets; attach signed validation evidence; promote exactly the validated bytes, by
digest, from the build tag to dev and prod (skopeo copies by digest).

A promotion is planned for every selected target before any tag is written. It is refused (and no
tag moves) unless:
  - the target was pushed, and its local report is complete evidence (gpuforge.validate.evidence: every
    required check ran and passed, not partial), made by this validator set, for the pushed image,
    and unchanged since validation (its digest is in the build record);
  - the registry holds a cosign attestation of that report on that digest, signed by the expected key
    or identity, whose predicate is the same report (prod with --require-gpu: a GPU one too);
  - the registry still holds that digest and the build tag still points at it; for prod, the dev tag does.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from dataclasses import dataclass
from pathlib import Path

import docker.errors

from gpuforge.engine import client as engine
from gpuforge.engine import progress as engine_progress
from gpuforge.errors import PromotionRefused, RegistryError
from gpuforge.plan.matrix import Target
from gpuforge.publish import attest
from gpuforge.publish.registry import Manifest, Registry, credentials
from gpuforge.state import records
from gpuforge.validate import evidence, report


def split_ref(ref: str) -> tuple[str, str, str]:
    """'127.0.0.1:5000/gpuforge/pytorch:tag' -> ('127.0.0.1:5000', 'gpuforge/pytorch', 'tag')."""
    name, tag = ref.rsplit(":", 1)
    host, repo = name.split("/", 1)
    return host, repo, tag


def ref_for(t: Target, registry: str | None) -> str:
    ref = t.tags[0]
    if registry:
        _, repo, tag = split_ref(ref)
        ref = f"{registry}/{repo}:{tag}"
    return ref


def push_targets(targets: list[Target], *, registry: str | None = None, progress: str = "auto") -> list[dict]:
    c = engine.client()
    out = []
    for t in targets:
        rec = records.require(t.id)
        ref = ref_for(t, registry)
        host, repo, tag = split_ref(ref)
        try:
            img = c.images.get(rec["image_id"])
        except docker.errors.ImageNotFound:
            msg = f"{t.id}: the built image {rec['image_id'][:19]} is gone; rebuild it"
            raise RegistryError(msg) from None
        img.tag(f"{host}/{repo}", tag)
        creds = credentials(host)
        auth = {"username": creds[0], "password": creds[1]} if creds else None
        print(f"gpuforge: pushing {ref} ({rec['image_id'][:19]})", flush=True)
        digest = None
        try:
            shown = engine_progress.PushProgress(ref, progress)  # layers and bytes; plain lines in logs
            for ev in shown.feed(c.images.push(f"{host}/{repo}", tag, auth_config=auth, stream=True, decode=True)):
                if "error" in ev:
                    msg = f"push of {ref} failed: {ev['error']}"
                    raise RegistryError(msg)
                digest = (ev.get("aux") or {}).get("Digest", digest)
        except docker.errors.APIError as e:
            msg = f"push of {ref} failed: {e.explanation or e}"
            raise RegistryError(msg) from None
        if not digest:
            msg = f"push of {ref} reported no digest"
            raise RegistryError(msg)
        m = Registry(host).manifest(repo, digest)
        if m is None or m.config_digest != rec["image_id"]:
            msg = f"{ref}: the registry's {digest} is not image {rec['image_id'][:19]}"
            raise RegistryError(msg)
        records.update(t.id, digest=digest, pushed_ref=ref)
        print(f"gpuforge: pushed {ref}@{digest}", flush=True)
        out.append({"target": t.id, "ref": ref, "digest": digest})
    return out


@dataclass
class _Plan:
    target: Target
    reg: Registry
    repo: str
    manifest: Manifest
    tags: list[str]
    report: str


def _refuse(t: Target, why: str) -> None:
    msg = f"{t.id}: promotion refused: {why}; no tag was changed"
    raise PromotionRefused(msg)


def _local_report(t: Target, path: Path, image_id: str, what: str, *, gpu: bool, recorded: str | None) -> dict:
    """The local report, judged before anything on the registry is read (clear, early refusals)."""
    if not path.exists():
        _refuse(t, f"no {what} report at {path} (run `gpuforge validate{' --gpu' if gpu else ''} {t.id}`)")
    rep = report.load(path)
    probs = evidence.problems(rep, require_gpu=gpu)
    if probs:
        _refuse(t, f"the {what} report {path} is not evidence: {'; '.join(probs)}")
    if recorded != evidence.digest_of(rep):
        _refuse(t, f"the {what} report {path} was changed after validation (its digest is not the one "
                   f"`gpuforge validate` recorded); re-run validation")
    _same_run(t, rep, image_id, what)
    return rep


def _same_run(t: Target, rep: dict, image_id: str, what: str) -> None:
    ev = rep["evidence"]
    if ev.get("image_id") != image_id:
        _refuse(t, f"the {what} report is for image {str(ev.get('image_id'))[:19]}, not the pushed image {image_id[:19]}")
    if ev.get("validator_set") != evidence.validator_set_hash():
        _refuse(t, f"the {what} report was made by another validator set ({str(ev.get('validator_set'))[:19]}, "
                   f"this checkout has {evidence.validator_set_hash()[:19]}); re-run validation")


def _signed_report(t: Target, ref: str, local: dict, image_id: str, what: str, verifier, *, gpu: bool) -> None:
    """The newest signed validation predicate of this kind on the digest must be this very report."""
    preds = [p for p in attest.verified_predicates(ref, attest.VALIDATION_TYPE, verifier)
             if isinstance(p, dict) and bool(p.get("gpu")) == gpu]
    if not preds:
        _refuse(t, f"{ref} carries no signed {what} attestation that verifies "
                   f"(run `gpuforge attest{' --gpu' if gpu else ''} {t.id}` after a green run)")
    newest = max(preds, key=lambda p: p.get("started", 0))
    probs = evidence.problems(newest, require_gpu=gpu)
    if probs:
        _refuse(t, f"the signed {what} attestation on {ref} is not evidence: {'; '.join(probs)}")
    _same_run(t, newest, image_id, f"signed {what}")
    if evidence.digest_of(newest) != evidence.digest_of(local):
        _refuse(t, f"the local {what} report differs from the signed one on the registry (hand-edited?)")


def plan(t: Target, *, env: str, reports: Path, registry: str | None, require_gpu: bool, verifier) -> _Plan:
    rec = records.require(t.id)
    if not rec.get("digest"):
        _refuse(t, f"it was never pushed (run `gpuforge push {t.id}`)")
    image_id, digest = rec["image_id"], rec["digest"]
    rpath = reports / t.id / "report.json"
    kinds = [(rpath, "validation", False, rec.get("report_digest"))]
    if require_gpu:
        kinds.append((reports / t.id / "report-gpu.json", "GPU validation", True, rec.get("gpu_report_digest")))
    locals_ = [(_local_report(t, p, image_id, what, gpu=g, recorded=d), what, g) for p, what, g, d in kinds]
    host, repo, tag = split_ref(ref_for(t, registry))
    reg = Registry(host)
    m = reg.manifest(repo, digest)
    if m is None:
        _refuse(t, f"the registry has no manifest {digest}")
    if m.config_digest != image_id:
        _refuse(t, f"{digest} holds image {m.config_digest}, not the validated {image_id[:19]}")
    current = reg.manifest(repo, tag)
    if current is None or current.digest != digest:
        now = current.digest if current else "nothing"
        _refuse(t, f"{repo}:{tag} now points to {now}, not the validated {digest} (re-pushed after validation?)")
    if env == "prod":
        dev = reg.manifest(repo, f"{tag}-dev")
        if dev is None or dev.digest != digest:
            _refuse(t, f"{repo}:{tag}-dev does not point to {digest}; promote to dev first")
    if verifier is None:
        _refuse(t, "no way to verify the signed evidence: pass --key cosign.pub, set GPUFORGE_COSIGN_PUBLIC_KEY, "
                   "or GPUFORGE_COSIGN_IDENTITY + GPUFORGE_COSIGN_ISSUER for keyless signatures")
    for rep, what, g in locals_:
        _signed_report(t, f"{host}/{repo}@{digest}", rep, image_id, what, verifier, gpu=g)
    tags = list(dict.fromkeys([f"{tag}-{env}", *t.aliases.get(env, ())]))
    return _Plan(target=t, reg=reg, repo=repo, manifest=m, tags=tags, report=str(rpath))


def promote_targets(targets: list[Target], *, env: str, reports: Path, registry: str | None = None,
                    require_gpu: bool = False, key: str | None = None) -> list[dict]:
    require_gpu = require_gpu or (env == "prod" and os.environ.get("GPUFORGE_PROD_REQUIRE_GPU") == "1")
    verifier = attest.Verifier.from_env(key)
    plans = [plan(t, env=env, reports=reports, registry=registry, require_gpu=require_gpu, verifier=verifier)
             for t in targets]
    results = []
    for p in plans:
        moved, unchanged = [], []
        for tag in p.tags:
            cur = p.reg.manifest(p.repo, tag)
            if cur and cur.digest == p.manifest.digest:
                unchanged.append(tag)
                continue
            p.reg.copy(p.repo, p.manifest.digest, tag)
            got = p.reg.manifest(p.repo, tag)
            if got is None or got.digest != p.manifest.digest:
                msg = f"{p.repo}:{tag}: registry holds {got.digest if got else 'nothing'}, expected {p.manifest.digest}"
                raise RegistryError(msg)
            moved.append(tag)
        res = {"target": p.target.id, "env": env, "digest": p.manifest.digest, "repository": f"{p.reg.host}/{p.repo}",
               "moved": moved, "unchanged": unchanged, "report": p.report,
               "at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")}
        out = reports / p.target.id / f"promotion-{env}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(res, indent=2) + "\n")
        print(f"gpuforge: {p.target.id} -> {env}: {p.manifest.digest}: moved {moved or 'nothing'}, unchanged {unchanged or 'none'}")
        results.append(res)
    return results


def attest_targets(targets: list[Target], *, reports: Path, registry: str | None = None, gpu: bool = False,
                   key: str | None = None) -> list[dict]:
    """Sign the green report (and the inventory) of each pushed target onto its registry digest."""
    out = []
    for t in targets:
        rec = records.require(t.id)
        if not rec.get("digest"):
            msg = f"{t.id}: nothing to attest: it was never pushed (run `gpuforge push {t.id}`)"
            raise PromotionRefused(msg)
        what = "GPU validation" if gpu else "validation"
        rpath = reports / t.id / ("report-gpu.json" if gpu else "report.json")
        _local_report(t, rpath, rec["image_id"], what, gpu=gpu, recorded=rec.get("gpu_report_digest" if gpu else "report_digest"))
        host, repo, _ = split_ref(ref_for(t, registry))
        m = Registry(host).manifest(repo, rec["digest"])
        if m is None or m.config_digest != rec["image_id"]:
            msg = f"{t.id}: the registry's {rec['digest']} is not the validated image {rec['image_id'][:19]}"
            raise RegistryError(msg)
        ref = f"{host}/{repo}@{rec['digest']}"
        attest.attest(ref, rpath, attest.VALIDATION_TYPE, key=key)
        for name, kind in (("sbom.json", attest.INVENTORY_TYPE), ("sbom.cdx.json", "cyclonedx")):
            if not gpu and (reports / t.id / name).exists():  # the inventory, and its CycloneDX form
                attest.attest(ref, reports / t.id / name, kind, key=key)
        print(f"gpuforge: attested {what} report of {t.id} on {ref}", flush=True)
        out.append({"target": t.id, "ref": ref, "report": str(rpath)})
    return out
