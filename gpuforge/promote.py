"""Push built targets; promote exactly the validated bytes, by digest, from the build tag to dev and prod.

A promotion is planned for every selected target before any tag is written. It is refused (and no
tag moves) unless: the target was pushed; a green report exists for the very image that was pushed
(prod with --require-gpu: a green GPU report too); the registry still holds that digest and the build
tag still points at it (a re-push after validation is caught); for prod, the dev tag points at it.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from dataclasses import dataclass
from pathlib import Path

import docker.errors

from gpuforge import engine, records, report
from gpuforge.errors import PromotionRefused, RegistryError
from gpuforge.matrix import Target
from gpuforge.registry import Manifest, Registry, credentials


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


def push_targets(targets: list[Target], *, registry: str | None = None) -> list[dict]:
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
            for ev in c.images.push(f"{host}/{repo}", tag, auth_config=auth, stream=True, decode=True):
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


def _green_report(t: Target, path: Path, image_id: str, what: str) -> dict:
    if not path.exists():
        _refuse(t, f"no {what} report at {path} (run `gpuforge validate{' --gpu' if 'GPU' in what else ''} {t.id}`)")
    rep = report.load(path)
    if not report.is_green(rep):
        failed = [c["name"] for c in rep.get("checks", []) if c["outcome"] == "failed"]
        _refuse(t, f"the {what} report {path} is red (failed: {', '.join(failed) or 'pytest exit ' + str(rep.get('exit_status'))})")
    validated = rep.get("facts", {}).get("image_id")
    if validated != image_id:
        _refuse(t, f"the {what} report is for image {str(validated)[:19]}, not the pushed image {image_id[:19]}")
    return rep


def plan(t: Target, *, env: str, reports: Path, registry: str | None, require_gpu: bool) -> _Plan:
    rec = records.require(t.id)
    if not rec.get("digest"):
        _refuse(t, f"it was never pushed (run `gpuforge push {t.id}`)")
    image_id, digest = rec["image_id"], rec["digest"]
    rpath = reports / t.id / "report.json"
    _green_report(t, rpath, image_id, "validation")
    if require_gpu:
        _green_report(t, reports / t.id / "report-gpu.json", image_id, "GPU validation")
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
    tags = list(dict.fromkeys([f"{tag}-{env}", *t.aliases.get(env, ())]))
    return _Plan(target=t, reg=reg, repo=repo, manifest=m, tags=tags, report=str(rpath))


def promote_targets(targets: list[Target], *, env: str, reports: Path, registry: str | None = None,
                    require_gpu: bool = False) -> list[dict]:
    require_gpu = require_gpu or (env == "prod" and os.environ.get("GPUFORGE_PROD_REQUIRE_GPU") == "1")
    plans = [plan(t, env=env, reports=reports, registry=registry, require_gpu=require_gpu) for t in targets]
    results = []
    for p in plans:
        moved, unchanged = [], []
        for tag in p.tags:
            cur = p.reg.manifest(p.repo, tag)
            if cur and cur.digest == p.manifest.digest:
                unchanged.append(tag)
                continue
            got = p.reg.put_manifest(p.repo, tag, p.manifest)
            if got != p.manifest.digest:
                msg = f"{p.repo}:{tag}: registry stored {got}, expected {p.manifest.digest}"
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
