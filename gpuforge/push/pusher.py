"""`gpuforge push [SEL]`: each target's recorded build pushed under its version tag, as gzip through the engine, a
zstd copy (gpuforge.push.compress) or gzip with a SOCI index beside it (gpuforge.push.soci).

Every build has its own version tag (its record's `version`, gpuforge.plan.version): push pushes it, and it never
moves without --replace, so each build of a pipeline is pushed without touching the ones before it. Every refusal
comes before the first push.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import re
import sys
from pathlib import Path

import docker.errors

from gpuforge.engine import client as engine
from gpuforge.engine import progress as engine_progress
from gpuforge.engine import retry
from gpuforge.errors import ConfigError, PromotionRefused, RegistryError, StateError
from gpuforge.plan.target import ImageRef, Target
from gpuforge.push import compress, soci
from gpuforge.registry.client import Registry, RegistryAuth, credentials
from gpuforge.state.models import BuildRecord
from gpuforge.state.records import Records


def pushed_digest(status: str, tag: str) -> str | None:
    m = re.fullmatch(rf"{re.escape(tag)}: digest: (sha256:[0-9a-f]{{64}}) size: \d+", status.strip())
    return m.group(1) if m else None


def pushed_version(t: Target, rec: BuildRecord) -> ImageRef:
    """The build's version tag in the target's repository (and --registry): what push pushes, validate signs onto and
    promote names. A record written before builds had version tags names none: refused, saying how to get one."""
    if not rec.version:
        msg = (f"{t.id}: its build record names no version tag (built by an earlier gpuforge); run `gpuforge build "
               f"{t.id}` again (the cache makes it quick), then push it")
        raise StateError(msg)
    return t.version_ref(rec.version)


def push_targets(targets: list[Target], *, records: Records, auth: RegistryAuth, log_dir: Path,
                 replace: bool = False, compression: str = "gzip",
                 progress: str = "auto") -> list[dict]:
    """Push each target's recorded build under its version tag (gzip, and/or a zstd copy `<version>-zstd` whose build
    logs go to log_dir; soci: gzip and a SOCI index of it, whose work folder and log are in log_dir)."""
    compress.check(compression)
    c = engine.client()
    info = engine.engine_info()
    recs = {t.id: records.require_build(t.id) for t in targets}
    refs = {t.id: pushed_version(t, recs[t.id]) for t in targets}  # every refusal before the first push
    if compression == "soci" and (why := soci.refusal()):  # refused before anything moves
        raise ConfigError(why)
    if compression in ("zstd", "both"):
        for t in targets:
            if why := compress.refusal(recs[t.id], info):
                msg = f"{t.id}: {why}"
                raise ConfigError(msg)
    out = []
    for t in targets:
        rec, ref = recs[t.id], refs[t.id]
        try:
            img = c.images.get(rec.image_id)
        except docker.errors.ImageNotFound:
            msg = f"{t.id}: the built image {rec.image_id[:19]} is gone; rebuild it"
            raise RegistryError(msg) from None
        replaced = _version_tag_move(t, ref, rec, Registry(auth), replace=replace)
        res = {"target": t.id, "ref": str(ref)}
        if compression in ("zstd", "both"):
            zdigest = compress.push_zstd(t.id, rec, ref, log_dir, auth)
            zref = compress.zstd_ref(ref)
            records.update_build(t.id, digest_zstd=zdigest, pushed_ref_zstd=str(zref))
            print(f"gpuforge: pushed {zref.at(zdigest)} (zstd, {info.describe()})", flush=True)
            res["digest_zstd"] = zdigest
        if compression == "zstd":
            out.append(res)
            continue
        digest = _push_gzip(c, img, ref, rec, auth, progress)
        records.update_build(t.id, digest=digest, pushed_ref=str(ref),
                             **({"replaced": [*(rec.replaced or []), {**replaced, "to": digest}]} if replaced else {}))
        print(f"gpuforge: pushed {ref.at(digest)} (gzip, {info.describe()})", flush=True)
        res["digest"] = digest
        if compression == "soci":
            log = log_dir / f"{t.id}-soci.log"
            print(f"gpuforge: making the SOCI index of {ref.at(digest)} (log {log})", flush=True)
            idx = soci.index_pushed(ref, digest, auth, log_dir, log)
            records.update_build(t.id, soci_index=idx.digest)
            print(f"gpuforge: pushed SOCI index {idx.digest} of {ref.at(digest)} ({idx.ztocs} layers lazily served)",
                  flush=True)
            res["soci_index"] = idx.digest
        out.append(res)
    return out


def _version_tag_move(t: Target, ref: ImageRef, rec: BuildRecord, reg: Registry, *, replace: bool) -> dict | None:
    """The version tag names one image. When the registry holds another image there (the same build identifier pushed
    with other bytes), refuse, or (--replace) return what is moved off, to record."""
    held = reg.manifest(ref)
    if held is None or held.holds(rec.image_id):
        return None
    repo, tag = ref.repository, ref.tag
    if not replace:
        msg = (f"{t.id}: {repo}:{tag} already holds {held.digest} (image {str(held.config_digest or 'an index')[:19]}), not "
               f"image {rec.image_id[:19]}; version tags are immutable: pass --replace to move it (recorded)")
        raise PromotionRefused(msg)
    print(f"gpuforge: --replace: moving version tag {repo}:{tag} off {held.digest}", file=sys.stderr, flush=True)
    return {"tag": tag, "from": held.digest, "at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")}


def _push_gzip(c, img, ref: ImageRef, rec: BuildRecord, auth: RegistryAuth, progress: str) -> str:
    """Push the image through the engine as `ref`; returns the digest, checked to be this very image on the registry.
    The engine pushes a tag it holds, so `ref` is tagged for the push and untagged after it: kept, every version
    would keep its image on the engine after the next build moved the target's tag on."""
    creds = credentials(ref.registry, auth)
    engine_auth = {"username": creds[0], "password": creds[1]} if creds else None
    print(f"gpuforge: pushing {ref} ({rec.image_id[:19]})", flush=True)
    held = _image_at(c, ref)
    img.tag(ref.name, ref.tag)
    try:
        digest = retry.pushed(lambda: _engine_push(c, ref, engine_auth, progress), f"push of {ref}")
    finally:
        if held is None:
            with contextlib.suppress(docker.errors.APIError):
                c.images.remove(str(ref), noprune=True)
    if not digest:
        msg = f"push of {ref} reported no digest"
        raise RegistryError(msg)
    m = Registry(auth).manifest(ref.pinned(digest))
    if m is None or not m.holds(rec.image_id):
        msg = f"{ref}: the registry's {digest} is not image {rec.image_id[:19]}"
        raise RegistryError(msg)
    return digest


def _image_at(c, ref: ImageRef) -> str | None:
    try:
        return c.images.get(str(ref)).id
    except docker.errors.ImageNotFound:
        return None


def _engine_push(c, ref: ImageRef, engine_auth: dict | None, progress: str) -> str | None:
    """One push of `ref` through the engine; returns the digest it reported (None: none). Fails as RegistryError."""
    digest = None
    try:
        shown = engine_progress.PushProgress(ref, progress)  # layers and bytes; plain lines in logs
        for ev in shown.feed(c.images.push(ref.name, ref.tag, auth_config=engine_auth, stream=True, decode=True)):
            if "error" in ev:
                msg = f"push of {ref} failed: {ev['error']}"
                raise RegistryError(msg)
            # 20.10 sends {"aux": {"Digest"}}; 26.1 with the containerd store only the status line
            # "TAG: digest: sha256:... size: N"
            digest = (ev.get("aux") or {}).get("Digest") or pushed_digest(ev.get("status", ""), ref.tag) or digest
    except docker.errors.APIError as e:
        msg = f"push of {ref} failed: {e.explanation or e}"
        raise RegistryError(msg) from None
    return digest
