"""`gpuforge pull [SEL]`: bring each selected target's pushed digest into the engine: on a GPU runner, the very bytes
the image job validated and signed, for `validate --gpu --attest` to prove again.

The build record (the state dir: GPUFORGE_STATE_DIR) names what was pushed: `<repository>@<digest>` (the repository of
its pushed_ref, its digest). The engine pulls that reference through its API with the registry credentials gpuforge
resolves (GPUFORGE_REGISTRY_USER / GPUFORGE_REGISTRY_PASSWORD, else the docker config's own entry), given as the
pull's auth_config: they travel in the request's header and are never written to a docker config file, as a
`docker login` would leave them in the runner's ~/.docker/config.json. With none, the pull is anonymous.

The pulled image must be the recorded one: its id is the record's image_id (the config digest on a graphdriver
engine; the manifest or index digest, which is the pushed digest, on the containerd store) and its RepoDigests name
the reference; anything else is refused (exit 6), as are a refused, unreachable or missing registry (6). A missing,
unpushed or malformed record is exit 8, checked for every target before anything is pulled; a lost engine is 3.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import docker
import docker.errors
import requests

from gpuforge.engine import client as engine
from gpuforge.errors import RegistryError, StateError
from gpuforge.plan.target import ImageRef, Target
from gpuforge.registry.client import RegistryAuth, credentials, denied, not_found, unreachable
from gpuforge.state.models import BuildRecord
from gpuforge.state.records import Records

_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


@dataclass(frozen=True, kw_only=True)
class Pulled:
    """One target's pull: the reference, the engine's image id, and whether the engine already held it."""

    target: str
    ref: ImageRef
    image_id: str
    fresh: bool

    def line(self) -> str:
        how = "pulled" if self.fresh else "already in the engine"
        return f"gpuforge: pull {self.target}: {self.ref} {how}; image {self.image_id[:19]}, as recorded"


def recorded_ref(target_id: str, rec: BuildRecord, records: Records) -> ImageRef:
    """`<repository>@<digest>` of the record's push; StateError (exit 8) when it has none, or a malformed one."""
    where = f"{target_id}: the build record in {records.path()}"
    if not rec.digest and not rec.pushed_ref:
        msg = f"{where} has no pushed digest; run `gpuforge push {target_id}` first"
        raise StateError(msg)
    try:
        repo = ImageRef.parse(str(rec.pushed_ref)).bare()
    except ValueError:
        repo = None
    if repo is None or not _DIGEST.fullmatch(str(rec.digest)):
        msg = (f"{where} names no pullable push (pushed_ref {str(rec.pushed_ref)[:120]!r}, digest "
               f"{str(rec.digest)[:80]!r}); run `gpuforge push {target_id}` again")
        raise StateError(msg)
    return repo.pinned(str(rec.digest))


def pull_targets(targets: list[Target], *, records: Records, auth: RegistryAuth) -> list[Pulled]:
    """Pull every selected target's recorded digest and check it is the recorded image; a line on stdout for each."""
    recs = {t.id: records.require_build(t.id) for t in targets}  # every record first: a bad one pulls nothing
    refs = {t.id: recorded_ref(t.id, recs[t.id], records) for t in targets}
    c = engine.client()
    out = []
    for t in targets:
        p = _pull(c, t.id, refs[t.id], recs[t.id], auth)
        print(p.line(), flush=True)
        out.append(p)
    return out


def _pull(c: docker.DockerClient, target_id: str, ref: ImageRef, rec: BuildRecord, auth: RegistryAuth) -> Pulled:
    creds = credentials(ref.registry, auth)
    last = _engine_pull(c, ref, {"username": creds[0], "password": creds[1]} if creds else None, given=bool(creds))
    try:
        img = c.images.get(str(ref))
    except docker.errors.ImageNotFound:
        msg = f"{target_id}: the engine reported pulling {ref}, yet holds no image by that digest"
        raise RegistryError(msg) from None
    named = str(ref) in (img.attrs.get("RepoDigests") or [])  # ref is pinned: REGISTRY/REPOSITORY@DIGEST
    if img.id != rec.image_id or not named:
        msg = (f"{target_id}: {ref} is image {img.id[:19]}{'' if named else ' (not named by that digest)'}, not the "
               f"recorded {rec.image_id[:19]}; refused (the record is not this push's, or this engine's image store "
               f"names images otherwise than the building engine's)")
        raise RegistryError(msg)
    return Pulled(target=target_id, ref=ref, image_id=img.id, fresh="up to date" not in last)


def _engine_pull(c: docker.DockerClient, ref: ImageRef, engine_auth: dict[str, Any] | None, *, given: bool) -> str:
    """One pull of `ref` through the engine (credentials in the request only); returns its last status line."""
    last = ""
    try:
        for ev in c.api.pull(str(ref), stream=True, decode=True, auth_config=engine_auth):
            if "error" in ev:
                msg = _why(ref, str(ev["error"]), given=given)
                raise RegistryError(msg)
            last = str(ev.get("status") or last)
    except docker.errors.APIError as e:
        msg = _why(ref, str(e.explanation or e), given=given)
        raise RegistryError(msg) from None
    except requests.exceptions.ConnectionError:
        if engine.alive():
            raise
        msg = f"the pull of {ref}"
        raise engine.lost(msg) from None
    return last


def _why(ref: ImageRef, text: str, *, given: bool) -> str:
    """The engine's pull error as one line that says what to do; never the credentials."""
    host, what = ref.registry, f"{ref.repository}@{str(ref.digest)[:19]}"
    if unreachable(text):
        return f"cannot reach registry {host} to pull {what}; is it running, and is the address right?"
    if denied(text):
        if given:
            return (f"registry {host} refused the credentials for pulling {what} (GPUFORGE_REGISTRY_USER / "
                    "GPUFORGE_REGISTRY_PASSWORD, else the docker config's entry; the account needs pull)")
        return (f"registry {host} wants credentials to pull {what}: set GPUFORGE_REGISTRY_USER and "
                "GPUFORGE_REGISTRY_PASSWORD")
    if not_found(text):
        return f"registry {host} no longer holds {ref}, the recorded push; push it again"
    return f"pulling {ref} failed: {text.strip().splitlines()[-1][-300:] if text.strip() else 'no reason given'}"
