"""`gpuforge push [SEL]`: each target's recorded build pushed under its version tag, as gzip through the engine, a
zstd copy (gpuforge.push.compress) or gzip with a SOCI index beside it (gpuforge.push.soci): one `Pusher` for each
`--compression` choice, in PUSHERS.

Every build has its own version tag (its record's `version`, gpuforge.plan.version): push pushes it, and it never
moves without --replace, so each build of a pipeline is pushed without touching the ones before it. Every refusal
comes before the first push.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import docker
import docker.errors
from docker.models.images import Image

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


@dataclass(frozen=True)
class PushJob:
    """One target's push: its recorded build, the version tag it goes to, and what the pushers write with."""

    target: Target
    rec: BuildRecord
    ref: ImageRef  # the build's version tag (pushed_version)
    image: Image  # the recorded build in the engine
    replaced: dict[str, str | None] | None  # --replace: what the version tag was moved off, to record with the gzip push
    client: docker.DockerClient
    info: engine.EngineInfo
    records: Records
    auth: RegistryAuth
    log_dir: Path
    progress: str


@dataclass(frozen=True)
class Pushed:
    """One thing a pusher put on the registry: `key` names it in push_targets' result (as in the build record)."""

    key: str  # digest | digest_zstd | soci_index
    digest: str


class Pusher(Protocol):
    """One `--compression` choice: what it refuses before anything moves, and how it pushes one target."""

    @property
    def name(self) -> str: ...

    def refusal(self, recs: Mapping[str, BuildRecord], info: engine.EngineInfo) -> str | None:
        """Why these builds cannot be pushed this way here (None: they can); one line, said before the first push."""
        ...

    def push(self, job: PushJob) -> tuple[Pushed, ...]: ...


@dataclass(frozen=True)
class Gzip:
    """The image through the engine as its version tag (gzip layers): the digest validate signs and promote moves."""

    name: str = "gzip"

    def refusal(self, recs: Mapping[str, BuildRecord], info: engine.EngineInfo) -> str | None:
        return None

    def push(self, job: PushJob) -> tuple[Pushed, ...]:
        t, rec, ref = job.target, job.rec, job.ref
        digest = _push_gzip(job.client, job.image, ref, rec, job.auth, job.progress)
        moved = {"replaced": [*(rec.replaced or []), {**job.replaced, "to": digest}]} if job.replaced else {}
        job.records.update_build(t.id, digest=digest, pushed_ref=str(ref), **moved)
        print(f"gpuforge: pushed {ref.at(digest)} (gzip, {job.info.describe()})", flush=True)
        return (Pushed("digest", digest),)


@dataclass(frozen=True)
class Zstd:
    """A zstd copy as `<version>-zstd`, BuildKit re-running the recorded build (gpuforge.push.compress)."""

    name: str = "zstd"

    def refusal(self, recs: Mapping[str, BuildRecord], info: engine.EngineInfo) -> str | None:
        for tid, rec in recs.items():
            if why := compress.refusal(rec, info):
                return f"{tid}: {why}"
        return None

    def push(self, job: PushJob) -> tuple[Pushed, ...]:
        t, ref = job.target, job.ref
        zdigest = compress.push_zstd(t.id, job.rec, ref, job.log_dir, job.auth)
        zref = compress.zstd_ref(ref)
        job.records.update_build(t.id, digest_zstd=zdigest, pushed_ref_zstd=str(zref))
        print(f"gpuforge: pushed {zref.at(zdigest)} (zstd, {job.info.describe()})", flush=True)
        return (Pushed("digest_zstd", zdigest),)


@dataclass(frozen=True)
class Soci:
    """gzip, then a SOCI index of that very digest beside it (gpuforge.push.soci), whose work folder and log are in
    log_dir: the index needs the gzip digest, so this pusher makes the gzip push itself."""

    gzip: Pusher
    name: str = "soci"

    def refusal(self, recs: Mapping[str, BuildRecord], info: engine.EngineInfo) -> str | None:
        return self.gzip.refusal(recs, info) or soci.refusal()

    def push(self, job: PushJob) -> tuple[Pushed, ...]:
        pushed = self.gzip.push(job)
        digest = next(p.digest for p in pushed if p.key == "digest")
        ref = job.ref
        log = job.log_dir / f"{job.target.id}-soci.log"
        print(f"gpuforge: making the SOCI index of {ref.at(digest)} (log {log})", flush=True)
        idx = soci.index_pushed(ref, digest, job.auth, job.log_dir, log)
        job.records.update_build(job.target.id, soci_index=idx.digest)
        print(f"gpuforge: pushed SOCI index {idx.digest} of {ref.at(digest)} ({idx.ztocs} layers lazily served)",
              flush=True)
        return (*pushed, Pushed("soci_index", idx.digest))


@dataclass(frozen=True)
class InTurn:
    """Several pushers, each a push of its own, one after the other (the first refusal of any refuses them all)."""

    name: str
    parts: tuple[Pusher, ...]

    def refusal(self, recs: Mapping[str, BuildRecord], info: engine.EngineInfo) -> str | None:
        return next((why for p in self.parts if (why := p.refusal(recs, info))), None)

    def push(self, job: PushJob) -> tuple[Pushed, ...]:
        return tuple(pushed for p in self.parts for pushed in p.push(job))


GZIP, ZSTD = Gzip(), Zstd()
# one pusher for each --compression choice (gpuforge.options, `compression`); both: the zstd copy, then gzip
PUSHERS: dict[str, Pusher] = {p.name: p for p in (GZIP, ZSTD, InTurn("both", (ZSTD, GZIP)), Soci(GZIP))}


def pusher_for(compression: str) -> Pusher:
    """The pusher of a --compression choice; an unknown one is refused in one line."""
    try:
        return PUSHERS[compression]
    except KeyError:
        msg = f"--compression / GPUFORGE_COMPRESSION={compression!r}: allowed: {', '.join(PUSHERS)}"
        raise ConfigError(msg) from None


def push_targets(targets: list[Target], *, records: Records, auth: RegistryAuth, log_dir: Path,
                 replace: bool = False, compression: str = "gzip",
                 progress: str = "auto") -> list[dict[str, str]]:
    """Push each target's recorded build under its version tag with the pusher of `compression` (PUSHERS); returns,
    for each target, its id, its version tag and what was pushed (digest, digest_zstd, soci_index)."""
    how = pusher_for(compression)
    c = engine.client()
    info = engine.engine_info()
    recs = {t.id: records.require_build(t.id) for t in targets}
    refs = {t.id: pushed_version(t, recs[t.id]) for t in targets}  # every refusal before the first push
    if why := how.refusal(recs, info):
        raise ConfigError(why)
    out = []
    for t in targets:
        rec, ref = recs[t.id], refs[t.id]
        try:
            img = c.images.get(rec.image_id)
        except docker.errors.ImageNotFound:
            msg = f"{t.id}: the built image {rec.image_id[:19]} is gone; rebuild it"
            raise RegistryError(msg) from None
        replaced = _version_tag_move(t, ref, rec, Registry(auth), replace=replace)
        job = PushJob(target=t, rec=rec, ref=ref, image=img, replaced=replaced, client=c, info=info, records=records,
                      auth=auth, log_dir=log_dir, progress=progress)
        out.append({"target": t.id, "ref": str(ref)} | {p.key: p.digest for p in how.push(job)})
    return out


def _version_tag_move(t: Target, ref: ImageRef, rec: BuildRecord, reg: Registry, *,
                      replace: bool) -> dict[str, str | None] | None:
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


def _push_gzip(c: docker.DockerClient, img: Image, ref: ImageRef, rec: BuildRecord, auth: RegistryAuth, progress: str) -> str:
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


def _image_at(c: docker.DockerClient, ref: ImageRef) -> str | None:
    try:
        return str(c.images.get(str(ref)).id)
    except docker.errors.ImageNotFound:
        return None


def _engine_push(c: docker.DockerClient, ref: ImageRef, engine_auth: dict[str, str] | None, progress: str) -> str | None:
    """One push of `ref` through the engine; returns the digest it reported (None: none). Fails as RegistryError."""
    digest = None
    try:
        shown = engine_progress.PushProgress(str(ref), progress)  # layers and bytes; plain lines in logs
        for ev in shown.feed(c.images.push(ref.name, ref.tag, auth_config=engine_auth, stream=True, decode=True)):
            if "error" in ev:
                msg = f"push of {ref} failed: {ev['error']}"
                raise RegistryError(msg)
            # 20.10 sends {"aux": {"Digest"}}; 26.1 with the containerd store only the status line
            # "TAG: digest: sha256:... size: N"
            digest = (ev.get("aux") or {}).get("Digest") or pushed_digest(ev.get("status", ""), ref.tag or "") or digest
    except docker.errors.APIError as e:
        msg = f"push of {ref} failed: {e.explanation or e}"
        raise RegistryError(msg) from None
    return digest
