"""A small client of the registry HTTP API (v2): read and put manifests by digest, with basic or
bearer auth. Promotion copies a manifest inside the registry this way: no rebuild, no layer pull.

Credentials: GPUFORGE_REGISTRY_USER / GPUFORGE_REGISTRY_PASSWORD, else the docker config's `auths`
entry for the registry. They are never printed.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import requests

from gpuforge.errors import RegistryError

MANIFEST_TYPES = ", ".join([
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.index.v1+json",
])


def credentials(registry: str) -> tuple[str, str] | None:
    user, pw = os.environ.get("GPUFORGE_REGISTRY_USER"), os.environ.get("GPUFORGE_REGISTRY_PASSWORD")
    if user and pw:
        return user, pw
    cfg = Path(os.environ.get("DOCKER_CONFIG", Path.home() / ".docker")) / "config.json"
    try:
        auths = json.loads(cfg.read_text()).get("auths", {})
    except (OSError, json.JSONDecodeError):
        return None
    for key in (registry, f"https://{registry}", f"http://{registry}"):
        auth = auths.get(key, {}).get("auth")
        if auth:
            u, _, p = base64.b64decode(auth).decode().partition(":")
            return u, p
    return None


@dataclass(frozen=True)
class Manifest:
    digest: str
    media_type: str
    body: bytes

    @property
    def config_digest(self) -> str | None:
        """The image config digest (== the docker image id) of a single-platform manifest."""
        return json.loads(self.body).get("config", {}).get("digest")


class Registry:
    def __init__(self, host: str):
        self.host = host
        loopback = re.match(r"^(127\.\d+\.\d+\.\d+|localhost)(:\d+)?$", host)
        insecure = os.environ.get("GPUFORGE_REGISTRY_INSECURE") == "1"
        self.base = f"{'http' if loopback or insecure else 'https'}://{host}/v2"
        self.session = requests.Session()
        self.creds = credentials(host)
        self._bearer: str | None = None

    def _request(self, method: str, path: str, **kw) -> requests.Response:
        url = f"{self.base}/{path}"
        headers = kw.pop("headers", {})
        for _ in range(2):
            if self._bearer:
                headers["Authorization"] = f"Bearer {self._bearer}"
            try:
                r = self.session.request(method, url, headers=headers, timeout=60,
                                         auth=self.creds if not self._bearer else None, **kw)
            except requests.ConnectionError:
                msg = f"cannot reach registry {self.host} ({self.base}); is it running, and is the address right?"
                raise RegistryError(msg) from None
            if r.status_code == 401 and not self._bearer and r.headers.get("WWW-Authenticate", "").startswith("Bearer"):
                self._bearer = self._token(r.headers["WWW-Authenticate"])
                continue
            return r
        return r

    def _token(self, challenge: str) -> str:
        params = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
        realm = params.pop("realm", "")
        try:
            r = requests.get(realm, params=params, auth=self.creds, timeout=60)
        except requests.ConnectionError:
            msg = f"cannot reach the token service of {self.host}"
            raise RegistryError(msg) from None
        if r.status_code != 200:
            msg = f"registry {self.host} refused the credentials (token service answered {r.status_code})"
            raise RegistryError(msg)
        return r.json().get("token") or r.json().get("access_token", "")

    def _check(self, r: requests.Response, what: str) -> None:
        if r.status_code == 401:
            msg = (f"registry {self.host} refused the credentials for {what} (set GPUFORGE_REGISTRY_USER/"
                   "GPUFORGE_REGISTRY_PASSWORD or `docker login`)")
            raise RegistryError(msg)
        if r.status_code >= 400:
            msg = f"registry {self.host}: {what}: HTTP {r.status_code} {r.text[:300]}"
            raise RegistryError(msg)

    def manifest(self, repo: str, ref: str) -> Manifest | None:
        """The manifest a tag or digest names, or None when there is none."""
        r = self._request("GET", f"{repo}/manifests/{ref}", headers={"Accept": MANIFEST_TYPES})
        if r.status_code == 404:
            return None
        self._check(r, f"GET {repo}:{ref}")
        body = r.content
        digest = r.headers.get("Docker-Content-Digest") or "sha256:" + hashlib.sha256(body).hexdigest()
        return Manifest(digest=digest, media_type=r.headers.get("Content-Type", "").split(";")[0], body=body)

    def put_manifest(self, repo: str, tag: str, m: Manifest) -> str:
        r = self._request("PUT", f"{repo}/manifests/{tag}", data=m.body, headers={"Content-Type": m.media_type})
        self._check(r, f"PUT {repo}:{tag}")
        return r.headers.get("Docker-Content-Digest", m.digest)
