"""Registry access through skopeo (Debian's, installed by tools/start-engine.sh): read manifests and
copy by digest. skopeo does the token dance (a bearer token per scope: pull for reads, pull+push for
the copy), and reads docker configs with `credsStore`/`credHelpers`; gpuforge only decides what may move.

Credentials: a RegistryAuth, which the CLI makes once from the registry_user / registry_password settings
(GPUFORGE_REGISTRY_USER / GPUFORGE_REGISTRY_PASSWORD; written to a private temporary auth file, never to a command
line), else $REGISTRY_AUTH_FILE / $DOCKER_CONFIG/config.json / ~/.docker/config.json as skopeo finds them. They are
never printed.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuforge.errors import RegistryError
from gpuforge.plan.target import ImageRef

# what skopeo prints for "no such manifest" (registry/distribution error codes, and containers/image text)
_NOT_FOUND = re.compile(r"manifest unknown|MANIFEST_UNKNOWN|NAME_UNKNOWN|name unknown|not found", re.I)
# status codes as whole words: a digest in the same message is hex and may hold "401" or "403" (CI once failed so)
_DENIED = re.compile(r"unauthorized|authentication required|denied|\b40[13]\b|invalid username/password|"
                     r"no basic auth credentials", re.I)
_UNREACHABLE = re.compile(r"connection refused|no such host|i/o timeout|connection reset|no route to host", re.I)


def denied(text: str) -> bool:
    """Whether a registry client's error text is a refusal of the credentials."""
    return bool(_DENIED.search(text))


def unreachable(text: str) -> bool:
    """Whether a registry client's error text says the registry could not be reached."""
    return bool(_UNREACHABLE.search(text))


def not_found(text: str) -> bool:
    """Whether a registry client's error text says the manifest or repository is not there (and is no refusal)."""
    return bool(_NOT_FOUND.search(text)) and not denied(text)


@dataclass(frozen=True)
class RegistryAuth:
    """How gpuforge speaks to registries: the registry_user / registry_password / registry_insecure settings,
    resolved once by the CLI. The default is no credentials of gpuforge's own (the docker config's, if any)."""

    user: str | None = None
    password: str | None = field(default=None, repr=False)
    insecure: bool = False  # plain HTTP / no TLS verification for every registry (loopback ones always are)

    def given(self) -> tuple[str, str] | None:
        return (self.user, self.password) if self.user and self.password else None


ANONYMOUS = RegistryAuth()


def credentials(registry: str, auth: RegistryAuth) -> tuple[str, str] | None:
    """The given user and password, else the docker config's plain `auths` entry (for the engine's push)."""
    if auth.given():
        return auth.given()
    cfg = Path(os.environ.get("DOCKER_CONFIG", Path.home() / ".docker")) / "config.json"
    try:
        auths = json.loads(cfg.read_text()).get("auths", {})
    except (OSError, json.JSONDecodeError):
        return None
    for key in (registry, f"https://{registry}", f"http://{registry}"):
        encoded = auths.get(key, {}).get("auth")  # base64 of user:password
        if encoded:
            u, _, p = base64.b64decode(encoded).decode().partition(":")
            return u, p
    return None


def insecure(host: str, auth: RegistryAuth) -> bool:
    """Plain HTTP / no TLS verification: loopback registries, or registry_insecure (GPUFORGE_REGISTRY_INSECURE=1)."""
    return bool(re.match(r"^(127\.\d+\.\d+\.\d+|localhost)(:\d+)?$", host)) or auth.insecure


@contextlib.contextmanager
def auth_file(auth: RegistryAuth, *hosts: str) -> Iterator[str | None]:
    """An auth file for skopeo/cosign: a private temporary one holding the given credentials, else the
    user's own (None: let the tool find it)."""
    if not auth.given():
        cfg = os.environ.get("REGISTRY_AUTH_FILE") or (
            str(Path(os.environ["DOCKER_CONFIG"]) / "config.json") if os.environ.get("DOCKER_CONFIG") else None)
        yield cfg if cfg and Path(cfg).exists() else None
        return
    with tempfile.TemporaryDirectory(prefix="gpuforge-auth-") as d:
        p = Path(d) / "config.json"
        token = base64.b64encode(f"{auth.user}:{auth.password}".encode()).decode()
        p.touch(mode=0o600)
        p.write_text(json.dumps({"auths": {h: {"auth": token} for h in hosts}}))
        yield str(p)


def private_ca(host: str) -> Path | None:
    """A registry's private CA where docker and skopeo find it (/etc/docker/certs.d/HOST[:PORT]/ca.crt), or None."""
    ca = Path("/etc/docker/certs.d") / host / "ca.crt"
    return ca if ca.is_file() else None


def skopeo(args: list[str], what: str, host: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("skopeo")
    if not exe:
        msg = "skopeo is not installed (apt-get install skopeo, or run tools/start-engine.sh)"
        raise RegistryError(msg)
    try:
        return subprocess.run([exe, *args], capture_output=True, text=True, timeout=3600, check=False)
    except subprocess.TimeoutExpired:
        msg = f"registry {host}: {what} did not finish within an hour"
        raise RegistryError(msg) from None


def _fail(r: subprocess.CompletedProcess[str], host: str, what: str) -> None:
    err = (r.stderr or r.stdout).strip().splitlines()
    last = err[-1] if err else f"skopeo exit {r.returncode}"
    if _UNREACHABLE.search(last):
        msg = f"cannot reach registry {host}; is it running, and is the address right?"
    elif _DENIED.search(last):
        msg = (f"registry {host} refused the credentials for {what} (set GPUFORGE_REGISTRY_USER/"
               "GPUFORGE_REGISTRY_PASSWORD, `docker login`, or a credential helper)")
    else:
        msg = f"registry {host}: {what}: {last[-300:]}"
    raise RegistryError(msg)


@dataclass(frozen=True)
class Manifest:
    digest: str
    body: bytes

    @property
    def config_digest(self) -> str | None:
        """The image config digest (== the docker image id on a graphdriver store) of a single-platform manifest."""
        digest: str | None = json.loads(self.body).get("config", {}).get("digest")
        return digest

    @property
    def is_index(self) -> bool:
        return "manifests" in json.loads(self.body)

    def holds(self, image_id: str) -> bool:
        """Whether these are the bytes of the engine's image `image_id`. A graphdriver engine (20.10's
        overlay2) names an image by its config digest, which the pushed manifest points to; the containerd
        store names it by its manifest or index digest (an index when BuildKit attached provenance), and
        pushes those very bytes."""
        return image_id in (self.digest, self.config_digest)


def _named(ref: ImageRef) -> str:
    """REPOSITORY@DIGEST or REPOSITORY:TAG, for messages (the host is said apart)."""
    return ref.repository + (f"@{ref.digest}" if ref.digest else f":{ref.tag}" if ref.tag else "")


class Registry:
    """The registry client: spoken to with `auth`; every call names its image by an ImageRef (the one
    reference grammar), whose registry says which host is asked."""

    def __init__(self, auth: RegistryAuth):
        self.auth = auth

    def _tls(self, ref: ImageRef) -> list[str]:
        return ["--tls-verify=false"] if insecure(ref.registry, self.auth) else []

    @staticmethod
    def _docker(ref: ImageRef) -> str:
        """skopeo's name for the repository, a tag of it or a digest of it (a digest wins over a tag)."""
        return f"docker://{ref.pinned(ref.digest) if ref.digest else ref}"

    def _skopeo(self, args: list[str], ref: ImageRef, what: str) -> subprocess.CompletedProcess[str]:
        with auth_file(self.auth, ref.registry) as af:
            return skopeo([*args[:1], "--retry-times", "2", *(self._tls(ref) if args[0] != "copy" else []),
                           *(["--authfile", af] if af else []), *args[1:]], what, ref.registry)

    def manifest(self, ref: ImageRef) -> Manifest | None:
        """The manifest a tag or digest names (its raw bytes: the digest is theirs), or None when there is none."""
        what = f"GET {_named(ref)}"
        r = self._skopeo(["inspect", "--raw", self._docker(ref)], ref, what)
        if r.returncode != 0:
            if _NOT_FOUND.search(r.stderr) and not _DENIED.search(r.stderr):
                return None
            _fail(r, ref.registry, what)
        body = r.stdout.encode()
        return Manifest(digest="sha256:" + hashlib.sha256(body).hexdigest(), body=body)

    def tags(self, ref: ImageRef) -> list[str]:
        """Every tag of `ref`'s repository ([] when the repository does not exist)."""
        repo = ImageRef(ref.registry, ref.repository)
        what = f"list tags of {ref.repository}"
        r = self._skopeo(["list-tags", self._docker(repo)], repo, what)
        if r.returncode != 0:
            if _NOT_FOUND.search(r.stderr) and not _DENIED.search(r.stderr):
                return []
            _fail(r, ref.registry, what)
        try:
            return list(json.loads(r.stdout).get("Tags") or [])
        except json.JSONDecodeError:
            msg = f"registry {ref.registry}: the tag list of {ref.repository} is not JSON"
            raise RegistryError(msg) from None

    def image_manifest(self, ref: ImageRef, m: Manifest) -> Manifest | None:
        """The single-platform manifest `m` stands for: `m` itself, or an image index's linux/amd64 entry (None: the
        index has none; its attestation manifests are platform unknown/unknown)."""
        doc = json.loads(m.body)
        if "manifests" not in doc:
            return m
        plat = [d for d in doc["manifests"] if (d.get("platform") or {}).get("os") == "linux"
                and (d.get("platform") or {}).get("architecture") == "amd64"]
        return self.manifest(ref.pinned(plat[0]["digest"])) if plat else None

    def config(self, ref: ImageRef) -> dict[str, Any]:
        """The image config a manifest (or, for an index, its linux/amd64 manifest) points to."""
        what = f"GET config of {ref.repository}@{str(ref.digest)[:19]}"
        r = self._skopeo(["inspect", "--config", "--raw", self._docker(ref)], ref, what)
        if r.returncode != 0:
            _fail(r, ref.registry, what)
        config: dict[str, Any] = json.loads(r.stdout)  # an image config: a JSON object
        return config

    def save(self, ref: ImageRef, dest: Path) -> None:
        """The manifest a digest names and every blob it points to, bytes unchanged, into a `dir:` folder (skopeo's
        layout: manifest.json and one file per blob, named by its hex digest)."""
        tls = ["--src-tls-verify=false"] if self._tls(ref) else []
        r = self._skopeo(["copy", "--quiet", "--preserve-digests", *tls, self._docker(ref), f"dir:{dest}"], ref,
                         f"GET {_named(ref)} and its blobs")
        if r.returncode != 0:
            _fail(r, ref.registry, f"GET {_named(ref)} and its blobs")

    def referrers(self, ref: ImageRef, digest: str, artifact_type: str) -> list[dict[str, Any]] | None:
        """The descriptors the OCI 1.1 referrers API lists for `digest` (of `artifact_type`), or None when the registry
        has no such API (distribution 2.8 answers 404: its referrers live in the `sha256-<hex>` tag instead). skopeo
        does not speak this API, so it is asked here, with the same credentials (basic, or a bearer token for pull)."""
        import requests

        host = ref.registry
        loopback = insecure(host, ANONYMOUS)  # plain HTTP, as skopeo speaks to it
        url = f"{'http' if loopback else 'https'}://{host}/v2/{ref.repository}/referrers/{digest}"
        ca = private_ca(host)
        verify: bool | str = False if self.auth.insecure else str(ca) if ca else True
        creds = credentials(host, self.auth)
        try:
            r = requests.get(url, params={"artifactType": artifact_type}, auth=creds, verify=verify, timeout=30)
            challenge = r.headers.get("WWW-Authenticate", "")
            if r.status_code == 401 and challenge.lower().startswith("bearer "):
                fields = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
                tok = requests.get(fields.get("realm", ""), auth=creds, verify=verify, timeout=30,
                                   params={"service": fields.get("service", ""),
                                           "scope": f"repository:{ref.repository}:pull"})
                body = tok.json() if tok.ok else {}
                token = body.get("token") or body.get("access_token")
                if token:
                    r = requests.get(url, params={"artifactType": artifact_type}, verify=verify, timeout=30,
                                     headers={"Authorization": f"Bearer {token}"})
        except (requests.RequestException, ValueError) as e:
            msg = f"registry {host}: GET referrers of {ref.repository}@{digest[:19]}: {type(e).__name__}: {str(e)[:200]}"
            raise RegistryError(msg) from None
        if r.status_code == 404:
            return None
        if r.status_code != 200:
            msg = f"registry {host}: GET referrers of {ref.repository}@{digest[:19]} answered {r.status_code}"
            raise RegistryError(msg)
        try:
            return [d for d in r.json().get("manifests", []) if d.get("artifactType") == artifact_type]
        except (ValueError, AttributeError):
            msg = f"registry {host}: the referrers of {ref.repository}@{digest[:19]} are not an OCI index"
            raise RegistryError(msg) from None

    def copy(self, src: ImageRef, tag: str) -> None:
        """Point `tag` of src's repository at the manifest src's digest names, bytes unchanged (no layer moves
        within one repository)."""
        dest = ImageRef(src.registry, src.repository, tag)
        tls = ["--src-tls-verify=false", "--dest-tls-verify=false"] if self._tls(src) else []
        r = self._skopeo(["copy", "--all", "--preserve-digests", *tls, self._docker(src), self._docker(dest)], src,
                         f"copy {src.repository}@{str(src.digest)[:19]} to :{tag}")
        if r.returncode != 0:
            _fail(r, src.registry, f"PUT {_named(dest)}")
