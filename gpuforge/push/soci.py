"""Lazy pulling: `push --compression soci` pushes the gzip image as `gzip` does, then a SOCI index of that very
digest beside it. The index is a separate OCI artifact whose `subject` is the image manifest; the image's digest,
signature and evidence do not change. A node whose containerd runs the SOCI snapshotter then starts the container
after fetching a few MB and reads the rest of the image as files are opened (docs/measurements/ready-bench.md: Jupyter
ready 4.6x sooner than a gzip pull at 1 Gbit/s, 5.1x at 200 Mbit/s, having read 17-18 % of the image).

How (the soci CLI 0.4.1, Debian trixie's soci-snapshotter package, makes and pushes the index):
  1. skopeo copies the pushed manifest and its blobs, bytes unchanged, into a private folder;
  2. a private containerd (its own root and socket, no CRI) imports them as an OCI layout without unpacking: the
     soci CLI reads images from a containerd content store only, and Docker 20.10's graphdriver store is not one;
  3. `soci create` builds a zTOC (a table of contents and gzip checkpoints) for each layer of 10 MiB or more;
  4. `soci push` pushes the index and its zTOCs; a registry without the referrers API gets the OCI 1.1 referrers
     tag `sha256-<hex of the image manifest digest>`, which is where the snapshotter looks;
  5. gpuforge reads the index back from the registry and checks it: it refers to the pushed image (or, for an image
     index, its linux/amd64 manifest), and each zTOC names a layer of that image.
The soci CLI keeps its index database and zTOCs under /var/lib/soci-snapshotter-grpc (a path 0.4.1 does not let
one choose); gpuforge holds a lock there while it works and afterwards removes the indexes it made (`soci index rm`)
and the blobs they added (zTOCs and index manifests that were not there before).
Needs root (containerd), containerd, ctr and soci. The snapshotter fetches indexes over https only: a plain-http
registry is written to, but nodes pulling from it fall back to whole pulls.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from gpuforge.errors import RegistryError
from gpuforge.plan.target import ImageRef
from gpuforge.registry.client import Manifest, Registry, RegistryAuth, auth_file, insecure, private_ca
from gpuforge.state import files

INDEX_TYPE = "application/vnd.amazon.soci.index.v1+json"
LAYER_DIGEST = "com.amazon.soci.image-layer-digest"
SOCI_ROOT = Path("/var/lib/soci-snapshotter-grpc")  # the soci CLI's store (fixed in 0.4.1)
STORE_BLOBS = SOCI_ROOT / "content" / "blobs" / "sha256"  # its indexes and zTOCs, one file per digest
NAMESPACE = "gpuforge-soci"
MIN_LAYER = 10 * 1024 * 1024  # soci create's default: smaller layers get no zTOC and are pulled whole
TOOLS = ("containerd", "ctr", "soci", "skopeo")


@dataclass(frozen=True)
class SociIndex:
    digest: str  # the index manifest's digest
    subject: str  # the image manifest it indexes
    ztocs: int  # layers with a zTOC (lazily served); the others are pulled whole


def refusal() -> str | None:
    """Why `--compression soci` cannot run here at all (None: it can); said before anything is pushed. An image with
    no layer big enough to serve lazily is known only once pushed (compressed sizes): it is refused then, gzip pushed."""
    missing = [t for t in TOOLS if not shutil.which(t)]
    if missing:
        return (f"--compression soci needs {', '.join(missing)} (apt-get install containerd skopeo, and soci-snapshotter "
                "from Debian trixie; tools/start-engine.sh installs them)")
    if os.geteuid() != 0:
        return "--compression soci runs a private containerd to build the SOCI index, which needs root"
    return None


def referrers_tag(digest: str) -> str:
    """The OCI 1.1 referrers tag of a manifest digest (`sha256:abc` -> `sha256-abc`)."""
    return digest.replace(":", "-", 1)


def index_pushed(ref: ImageRef, digest: str, auth: RegistryAuth, work_dir: Path, log: Path) -> SociIndex:
    """Build and push the SOCI index of `ref`'s repository at `digest` (already pushed); return it, checked."""
    reg = Registry(auth)
    pushed = ref.pinned(digest)
    manifest = reg.manifest(pushed)
    if manifest is None:
        msg = f"{ref.at(digest)}: the registry does not hold the image to index"
        raise RegistryError(msg)
    subject = reg.image_manifest(ref, manifest)
    if subject is None:
        msg = f"{ref.at(digest)}: an image index with no linux/amd64 image to index"
        raise RegistryError(msg)
    big = [x for x in json.loads(subject.body).get("layers", []) if x.get("size", 0) >= MIN_LAYER]
    if not big:
        msg = (f"{ref.at(digest)} is pushed (gzip), but it has no layer of {MIN_LAYER >> 20} MiB or more, so a SOCI "
               "index would serve nothing lazily: none was made")
        raise RegistryError(msg)
    work_dir.mkdir(parents=True, exist_ok=True)
    with _soci_store_lock(), tempfile.TemporaryDirectory(prefix="soci-", dir=work_dir) as work, \
            open(log, "a") as out:
        image_dir = Path(work) / "image"
        reg.save(ref.pinned(subject.digest), image_dir)
        name = f"{ref.name}:{ref.tag or 'soci'}"
        with _containerd(Path(work)) as sock:
            env = {**os.environ, "CONTAINERD_ADDRESS": sock, "CONTAINERD_NAMESPACE": NAMESPACE}
            _import(image_dir, subject, name, env, out)
            shutil.rmtree(image_dir)  # in containerd's store now
            before = _indexes(name, env, out)  # an earlier run's, or a snapshotter's, of the same name stay theirs
            blobs_before = _store_blobs()
            try:
                _run(["soci", "create", name], env, out, f"soci create {name}")
                with auth_file(auth, ref.registry) as af:
                    # the soci CLI reads credentials from $DOCKER_CONFIG/config.json (never from its command line here)
                    push_env = {**env, **_tls_env(ref.registry, Path(work))}
                    if af and af.endswith("/config.json"):
                        push_env["DOCKER_CONFIG"] = str(Path(af).parent)
                    said = _run(["soci", "push", *_tls(ref.registry, auth), name], push_env, out, f"soci push {name}")
            finally:
                with contextlib.suppress(RegistryError):  # a failure above is the one to report
                    for d in sorted(_indexes(name, env, out) - before):
                        _run(["soci", "index", "rm", d], env, out, "soci index rm", check=False)
                for blob in _store_blobs() - blobs_before:  # `index rm` keeps the zTOCs: the ones made here go
                    (STORE_BLOBS / blob).unlink(missing_ok=True)
    made = re.search(r"pushing soci index with digest: (sha256:[0-9a-f]{64})", said)
    if not made:
        msg = f"soci push {name} did not say which index it pushed; log: {log}"
        raise RegistryError(msg)
    if _newest_listed(reg, ref, subject) != made.group(1):
        msg = f"{ref.at(digest)}: the registry's newest SOCI index is not {made.group(1)[:19]}, the one pushed"
        raise RegistryError(msg)
    return _checked(reg, ref, subject, made.group(1))


def check(reg: Registry, ref: ImageRef, subject: Manifest) -> SociIndex:
    """The SOCI index the registry holds for the image manifest `subject`, found where the snapshotter looks, and
    checked against that image."""
    return _checked(reg, ref, subject, _newest_listed(reg, ref, subject))


def _newest_listed(reg: Registry, ref: ImageRef, subject: Manifest) -> str:
    """The digest of the newest SOCI index listed for `subject` in the referrers tag `sha256-<hex>`, else by the OCI
    1.1 referrers API."""
    listing = reg.manifest(ref.bare().with_tag(referrers_tag(subject.digest)))
    entries = ([d for d in json.loads(listing.body).get("manifests", []) if d.get("artifactType") == INDEX_TYPE]
               if listing else reg.referrers(ref, subject.digest, INDEX_TYPE) or [])
    if not entries:
        msg = f"{ref.at(subject.digest)}: the registry holds no SOCI index referring to it"
        raise RegistryError(msg)
    newest: str = entries[-1]["digest"]  # the referrers tag lists in push order
    return newest


def _checked(reg: Registry, ref: ImageRef, subject: Manifest, index: str) -> SociIndex:
    m = reg.manifest(ref.pinned(index))
    doc = json.loads(m.body) if m else {}
    layers = {x["digest"] for x in json.loads(subject.body).get("layers", [])}
    named = [(x.get("annotations") or {}).get(LAYER_DIGEST) for x in doc.get("layers", [])]
    why = (None if m is not None else "is missing")
    why = why or (None if (doc.get("subject") or {}).get("digest") == subject.digest else "refers to another image")
    why = why or (None if (doc.get("config") or {}).get("mediaType") == INDEX_TYPE else "is not a SOCI index v1")
    why = why or (None if named and all(n in layers for n in named) else "has zTOCs of layers this image lacks")
    if why:
        msg = f"{ref.at(subject.digest)}: SOCI index {index[:19]} {why}"
        raise RegistryError(msg)
    return SociIndex(digest=index, subject=subject.digest, ztocs=len(named))


def _store_blobs() -> set[str]:
    """The blobs in the soci CLI's content store now (those of another index, or of a snapshotter, stay)."""
    try:
        return set(os.listdir(STORE_BLOBS))
    except OSError:
        return set()


def _tls(host: str, auth: RegistryAuth) -> list[str]:
    if insecure(host, auth):
        print(f"gpuforge: warning: {host} is spoken to over plain HTTP; the SOCI snapshotter fetches indexes over https "
              "only, so nodes pulling from it pull whole", file=sys.stderr, flush=True)
        return ["--plain-http"]
    return ["--tlscacert", str(ca)] if (ca := private_ca(host)) else []


def _tls_env(host: str, work: Path) -> dict[str, str]:
    """soci 0.4.1 checks the registry's referrers with Go's default HTTP client, which ignores --tlscacert: the
    private CA joins the system ones through SSL_CERT_DIR, a colon-separated list of folders Go reads every
    certificate from. certs.d's folder is named HOST:PORT, so the CA goes in through a copy in a folder of our own."""
    ca = private_ca(host)
    if ca is None:
        return {}
    own = work / "registry-ca"
    own.mkdir(exist_ok=True)
    shutil.copyfile(ca, own / "ca.crt")
    return {"SSL_CERT_DIR": f"{os.environ.get('SSL_CERT_DIR') or '/etc/ssl/certs'}:{own}"}


@contextlib.contextmanager
def _soci_store_lock() -> Iterator[None]:
    """One gpuforge at a time in the soci CLI's fixed store (its index database is one file)."""
    SOCI_ROOT.mkdir(parents=True, exist_ok=True)
    with files.Folder(SOCI_ROOT) as d, d.locked():
        yield


@contextlib.contextmanager
def _containerd(work: Path) -> Iterator[str]:
    """A containerd of this push's own (root under `work`, socket under /run: unix socket paths are short). It dies
    with this process (SIGKILL included), and is stopped and removed on the way out, also after an error or Ctrl-C."""
    from gpuforge.validate.pytest_run import die_with_parent  # one home for "a child never outlives gpuforge"

    run = Path(tempfile.mkdtemp(prefix="gpuforge-soci-", dir="/run" if os.access("/run", os.W_OK) else None))
    proc = None
    try:
        sock = str(run / "containerd.sock")
        try:
            cfg = work / "containerd.toml"
            cfg.write_text(f'version = 2\nroot = "{work / "containerd"}"\nstate = "{run / "state"}"\n'
                           f'disabled_plugins = ["io.containerd.grpc.v1.cri"]\n[grpc]\n  address = "{sock}"\n')
            with open(work / "containerd.log", "wb") as log:
                proc = subprocess.Popen(["containerd", "--config", str(cfg)], stdout=log, stderr=subprocess.STDOUT,
                                        start_new_session=True, preexec_fn=die_with_parent(os.getpid()))
        except OSError as e:
            msg = f"the private containerd for the SOCI index did not start: {e}"
            raise RegistryError(msg) from None
        t_end = time.monotonic() + 60
        while subprocess.run(["ctr", "-a", sock, "version"], capture_output=True, check=False).returncode != 0:
            if proc.poll() is not None or time.monotonic() > t_end:
                tail = (work / "containerd.log").read_text(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
                msg = f"the private containerd for the SOCI index did not start: {tail[0][-200:]}"
                raise RegistryError(msg)
            time.sleep(0.2)
        yield sock
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(run, ignore_errors=True)


def _import(image_dir: Path, subject: Manifest, name: str, env: dict[str, Any], out: TextIO) -> None:
    """The skopeo `dir:` copy into containerd as an OCI layout tar (streamed; docker media types kept: the manifest's
    bytes, so its digest, stay the pushed ones), not unpacked."""
    doc = json.loads(subject.body)
    repo, _, tag = name.rpartition(":")
    index = {"schemaVersion": 2, "manifests": [{"mediaType": doc.get("mediaType", "application/vnd.oci.image.manifest.v1+json"),
                                                "digest": subject.digest, "size": len(subject.body),
                                                "annotations": {"org.opencontainers.image.ref.name": tag}}]}
    p = subprocess.Popen(["ctr", "images", "import", "--no-unpack", "--base-name", repo, "-"], stdin=subprocess.PIPE,
                         stdout=out, stderr=subprocess.STDOUT, env=env)
    stdin = p.stdin
    assert stdin is not None  # Popen(stdin=PIPE) always opens it
    try:
        with tarfile.open(fileobj=stdin, mode="w|") as tar:
            def add(arc: str, data: bytes) -> None:
                info = tarfile.TarInfo(arc)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))

            add("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
            add("index.json", json.dumps(index).encode())
            add(f"blobs/sha256/{subject.digest.split(':', 1)[1]}", subject.body)
            for blob in [doc["config"], *doc.get("layers", [])]:
                hexd = blob["digest"].split(":", 1)[1]
                tar.add(str(image_dir / hexd), arcname=f"blobs/sha256/{hexd}")
    except BrokenPipeError:
        pass  # ctr stopped reading: its exit status says why
    except OSError as e:  # a blob skopeo's copy lacks
        p.kill()
        p.wait()
        msg = f"ctr images import of {name}: {e}"
        raise RegistryError(msg) from None
    finally:
        with contextlib.suppress(BrokenPipeError):
            stdin.close()
    if p.wait() != 0:
        msg = f"ctr images import of {name} failed (exit {p.returncode}); log: {out.name}"
        raise RegistryError(msg)


def _indexes(name: str, env: dict[str, Any], out: TextIO) -> set[str]:
    listed = _run(["soci", "index", "list", "--quiet", "--ref", name], env, out, "soci index list")
    return set(re.findall(r"sha256:[0-9a-f]{64}", listed))


def _run(argv: list[str], env: dict[str, Any], out: TextIO, what: str, *, check: bool = True) -> str:
    try:
        r = subprocess.run(argv, capture_output=True, text=True, env=env, check=False, timeout=3600)
    except (OSError, subprocess.TimeoutExpired) as e:
        msg = f"{what} failed: {type(e).__name__}: {str(e)[:300]}; log: {out.name}"
        raise RegistryError(msg) from None
    out.write(f"$ {' '.join(argv)}\n{r.stdout}{r.stderr}")
    out.flush()
    if check and r.returncode != 0:
        last = (r.stderr or r.stdout).strip().splitlines()[-1:] or [f"exit {r.returncode}"]
        msg = f"{what} failed: {last[0][-300:]}; log: {out.name}"
        raise RegistryError(msg)
    return r.stdout
