"""zstd layers: the validated image pushed a second time as `<version>-zstd` (its build's version tag, then
-zstd), its layers zstd-compressed (OCI media types), for engines that pull zstd (Docker 23+, containerd 1.5+);
`<version>` stays gzip for the rest (Docker 20.10 cannot pull zstd). Two tags, not one index with both: an index offering the same
platform twice lets each client pick the first entry, so an old engine could pick zstd and fail.

How: the build stage runs the recorded buildx build again (gpuforge.builder.export; every step from BuildKit's
cache) with the image exporter `compression=zstd,force-compression=true,oci-mediatypes=true,push=true`. That needs a builder that can
export images with a chosen compression: the docker driver on an engine with the containerd image store
(Docker 24+, `{"features": {"containerd-snapshotter": true}}`), or a docker-container/remote builder
(`gpuforge build --builder`). The docker driver on a graphdriver engine (20.10's overlay2) exports only
`--load`; gpuforge refuses there with one line, before pushing anything.

What is checked after the push: every layer of `<version>-zstd` is zstd, and its image config has the same
layers (rootfs.diff_ids: digests of the uncompressed layers) and the same runtime config as the validated
image in the engine: the same files and settings, compressed otherwise.

`gzip` pushes `<version>`, `zstd` pushes `<version>-zstd` only, `both` pushes both, `soci` pushes `<version>` and a
SOCI index of it for lazy pulling (gpuforge.push.soci). Promotion moves the gzip
digest, the one `validate --attest` signs; the zstd copy is not signed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpuforge.builder import export
from gpuforge.engine import client as engine
from gpuforge.errors import RegistryError
from gpuforge.plan.target import ImageRef
from gpuforge.provenance import redact
from gpuforge.registry.client import Manifest, Registry, RegistryAuth, auth_file
from gpuforge.state.models import BuildRecord

ZSTD_SUFFIX = "-zstd"


def refusal(rec: BuildRecord, info: engine.EngineInfo) -> str | None:
    """Why this engine/builder cannot export zstd layers (None: it can)."""
    if not export.exports(rec):
        return (f"--compression zstd re-runs the buildx build, but {rec.image_id[:19]} was built with the "
                f"{rec.driver or 'unknown'} driver; rebuild with buildx (`gpuforge build --driver buildx`)")
    if not export.recorded(rec):
        return (f"--compression zstd re-runs the recorded build, and the record of {rec.image_id[:19]} "
                "has no build command (built by an older gpuforge); rebuild it")
    if not info.containerd_store and not export.named_builder(rec):
        return (f"--compression zstd needs a builder that exports zstd layers: this is {info.describe()}, whose buildx "
                "docker driver cannot; use an engine with the containerd image store (Docker 24+, daemon.json "
                '{"features": {"containerd-snapshotter": true}}) or a docker-container builder (--builder), or push gzip')
    return None


RUNTIME_KEYS = ("Env", "Entrypoint", "Cmd", "User", "WorkingDir", "Labels", "ExposedPorts")


def _same_content(local: dict[str, Any], zs: dict[str, Any]) -> str | None:
    """`local`: the engine's inspect of the validated image; `zs`: the pushed zstd image's config."""
    if local.get("RootFS", {}).get("Layers") != zs.get("rootfs", {}).get("diff_ids"):
        return "its layers (uncompressed digests) differ from the validated image's"
    want, got = local.get("Config") or {}, zs.get("config") or {}
    diff = [k for k in RUNTIME_KEYS if (want.get(k) or None) != (got.get(k) or None)]
    if diff:
        return f"its runtime config differs from the validated image's ({', '.join(diff)})"
    return None


def zstd_ref(ref: ImageRef) -> ImageRef:
    """Where the zstd copy of a build's version tag goes: the same repository, version tag + ZSTD_SUFFIX."""
    return ref.with_tag(f"{ref.tag}{ZSTD_SUFFIX}")


def push_zstd(tid: str, rec: BuildRecord, build_ref: ImageRef, log_dir: Path, auth: RegistryAuth) -> str:
    """Push the recorded build as its version tag's -zstd copy; returns its digest (checked as described above)."""
    zref = zstd_ref(build_ref)
    ref = str(zref)
    log = log_dir / f"{tid}{ZSTD_SUFFIX}.log"
    with auth_file(auth, zref.registry) as af:
        print(f"gpuforge: pushing {ref} (zstd layers, from the build cache; log {log})", flush=True)
        rc, digest = export.push_copy(rec, ref=ref, compression="zstd", log=log,
                                      docker_config=Path(af).parent if af else None)
    if rc != 0 or not digest:
        last = log.read_text(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
        msg = f"zstd push of {ref} failed (exit {rc}); log: {log}; last line: {redact(last[0])[-200:]}"
        raise RegistryError(msg)
    reg = Registry(auth)
    m = reg.manifest(zref.pinned(digest))
    if m is None:
        msg = f"zstd push of {ref} reported {digest}, which the registry does not hold"
        raise RegistryError(msg)
    zs = reg.config(zref.pinned(digest))
    layers = _layers(reg, zref, m)
    if not layers or not all(mt.endswith("+zstd") for mt in layers):
        msg = f"{zref.at(digest)}: not every layer is zstd ({sorted(set(layers))})"
        raise RegistryError(msg)
    why = _same_content(engine.client().images.get(rec.image_id).attrs, zs)
    if why:
        msg = f"{zref.at(digest)}: {why} (the checkout changed since the build? rebuild, validate, push again)"
        raise RegistryError(msg)
    return digest


def _layers(reg: Registry, ref: ImageRef, m: Manifest) -> list[str]:
    """The layer media types of the image manifest (an index's linux/amd64 manifest; [] when it has none)."""
    image = reg.image_manifest(ref, m)
    return [layer.get("mediaType", "") for layer in json.loads(image.body).get("layers", [])] if image else []

