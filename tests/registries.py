"""Real registries for the tests: Debian's docker-registry on 127.0.0.1 with htpasswd basic auth, or
with `auth: token` backed by a small real token server (the Docker token protocol: basic auth in,
a scoped RS256 JWT out, signed by a key whose certificate the registry trusts). Not mocks: docker,
skopeo and cosign talk to them exactly as to a hosted registry.

Ports: 5100-5199 (the range this suite may use on the shared machine).

One registry serves the whole run (`run_registry()`, started by the controlling pytest process): the main engine's
pushes of the default image to it after the first mount the layers instead of gzipping 6 GB again (about 180 s of
CPU each). Every registry of the run keeps its blobs in one shared, content-addressed folder, so a copy of the image
between two of them stores no second 3 GB (a repository's tags and links stay its own).
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import io
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import jwt
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID
from second_engine import Registry, StartError
from second_engine import free_port as _free_port

from conftest import need

PORTS = range(5100, 5200)
SERVICE, ISSUER = "gpuforge-test-registry", "gpuforge-test-token-server"
# the run's registry and blob folder, set by the controlling process for its xdist workers (not GPUFORGE_: not an option)
RUN_REGISTRY, RUN_BLOBS = "GF_TEST_RUN_REGISTRY", "GF_TEST_RUN_BLOBS"
USER, PASSWORD = "ci-pusher", "s3cret-registry-pass"
READER, READER_PASSWORD = "ci-reader", "read-only-pass"
USERS = {USER: (PASSWORD, {"pull", "push"}), READER: (READER_PASSWORD, {"pull"})}


def free_port() -> int:
    try:
        return _free_port(PORTS)
    except StartError as e:
        pytest.fail(str(e))


def _key_and_cert(d: Path) -> tuple[rsa.RSAPrivateKey, x509.Certificate]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, ISSUER)])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    (d / "token-ca.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return key, cert


class TokenServer:
    """Issues JWTs granting, per requested scope, only the actions the account may do."""

    def __init__(self, d: Path, users: dict[str, tuple[str, set[str]]]):
        self.key, self.cert = _key_and_cert(d)
        self.users = users
        self.issued: list[dict] = []  # the granted access of every token, for the tests to inspect
        self.port = free_port()
        self.realm = f"http://127.0.0.1:{self.port}/token"
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _answer(self, params: dict[str, list[str]]):
                account = None
                hdr = self.headers.get("Authorization", "")
                if hdr.startswith("Basic "):
                    user, _, pw = base64.b64decode(hdr[6:]).decode().partition(":")
                    if server.users.get(user, ("",))[0] != pw:
                        self.send_response(401)
                        self.end_headers()
                        return
                    account = user
                elif params.get("grant_type") == ["password"]:  # OAuth2 form (docker's refresh-token flow)
                    user, pw = params.get("username", [""])[0], params.get("password", [""])[0]
                    if server.users.get(user, ("",))[0] != pw:
                        self.send_response(401)
                        self.end_headers()
                        return
                    account = user
                allowed = server.users[account][1] if account else set()
                access = []
                for scope in params.get("scope", []):
                    for one in scope.split(" "):
                        kind, _, rest = one.partition(":")
                        name, _, actions = rest.rpartition(":")
                        if kind == "repository":
                            access.append({"type": kind, "name": name,
                                           "actions": sorted(set(actions.split(",")) & allowed)})
                server.issued.append({"account": account, "access": access})
                now = int(time.time())
                claims = {"iss": ISSUER, "sub": account or "", "aud": SERVICE, "iat": now, "nbf": now - 10,
                          "exp": now + 300, "jti": uuid.uuid4().hex, "access": access}
                x5c = base64.b64encode(server.cert.public_bytes(serialization.Encoding.DER)).decode()
                token = jwt.encode(claims, server.key, algorithm="RS256", headers={"x5c": [x5c]})
                body = json.dumps({"token": token, "access_token": token, "expires_in": 300,
                                   "issued_at": dt.datetime.now(dt.UTC).isoformat()}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                self._answer(parse_qs(urlparse(self.path).query))

            def do_POST(self):
                n = int(self.headers.get("Content-Length") or 0)
                self._answer(parse_qs(self.rfile.read(n).decode()))

        self.httpd = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


class LocalRegistry(Registry):
    """A docker-registry process; `auth` is None, ("htpasswd", users) or ("token", users)."""

    def __init__(self, d: Path, auth: str | None, users: dict[str, tuple[str, set[str]]] | None = None):
        if not shutil.which("docker-registry"):
            need("needs Debian's docker-registry (apt-get install docker-registry)")
        self.tokens: TokenServer | None = TokenServer(d, users or {}) if auth == "token" else None
        port = free_port()  # after the token server has bound its own
        text = ""
        if auth == "htpasswd":
            lines = [subprocess.run(["htpasswd", "-Bbn", u, pw], capture_output=True, text=True, check=True).stdout.strip()
                     for u, (pw, _) in (users or {}).items()]
            (d / "htpasswd").write_text("\n".join(lines) + "\n")
            text = f"auth:\n  htpasswd:\n    realm: gpuforge-test\n    path: {d / 'htpasswd'}\n"
        elif auth == "token":
            assert self.tokens
            text = (f"auth:\n  token:\n    realm: {self.tokens.realm}\n    service: {SERVICE}\n    issuer: {ISSUER}\n"
                    f"    rootcertbundle: {d / 'token-ca.pem'}\n")
        blobs = os.environ.get(RUN_BLOBS)
        if blobs:  # the run's one blob folder: a blob is a file named by its digest, written by rename, never changed
            v2 = d / "data" / "docker" / "registry" / "v2"
            v2.mkdir(parents=True, exist_ok=True)
            (v2 / "blobs").symlink_to(blobs, target_is_directory=True)
        try:
            super().__init__(d, port, text)
        except StartError as e:
            if self.tokens:
                self.tokens.stop()
            pytest.fail(str(e))
        hosts = _hosts_file()
        if hosts:  # the run's registries: their tags leave the engine when the run ends
            with open(hosts, "a") as f:
                f.write(self.host + "\n")

    def stop(self):
        """Stops it and deletes what it stored: a push of the default image is 3 GB, and pytest keeps the
        directory (CI ran out of disk with them kept). Its log and config stay for a failed test's reader."""
        super().stop()
        if self.tokens:
            self.tokens.stop()
        shutil.rmtree(self.d / "data", ignore_errors=True)  # the shared blobs' link, not the blobs


def link_run_layers(repo: str, dst: LocalRegistry, dst_repo: str) -> int:
    """Make `dst_repo` of the test registry `dst` hold every blob `repo` of the run's registry holds, linked as
    distribution links a blob into a repository after an upload. Every registry of the run keeps its blobs in one
    folder, so a skopeo copy of the 3 GB image there then finds each blob present and pushes only the manifests
    (it uploaded 3 GB again before: 25 s of registry CPU and disk writes a copy). Returns the number of links."""
    layers = Path("data/docker/registry/v2/repositories")
    src = Path(os.environ[RUN_BLOBS]).parent / "run" / layers / repo / "_layers"
    out = dst.d / layers / dst_repo / "_layers"
    n = 0
    for link in src.rglob("link"):
        made = out / link.relative_to(src)
        made.parent.mkdir(parents=True, exist_ok=True)
        made.write_bytes(link.read_bytes())
        n += 1
    return n


def start_run_registry() -> tuple[LocalRegistry, Path] | None:
    """In the controlling process, before the workers start: the run's blob folder and its htpasswd registry, named
    to the workers through the environment they inherit. None where docker-registry or htpasswd is absent (the
    tests that need it then say so)."""
    if not (shutil.which("docker-registry") and shutil.which("htpasswd")):
        return None
    root = Path(tempfile.mkdtemp(prefix="gpuforge-test-registries-"))
    (root / "blobs").mkdir()
    (root / "run").mkdir()
    os.environ[RUN_BLOBS] = str(root / "blobs")
    try:
        reg = LocalRegistry(root / "run", "htpasswd", USERS)
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        del os.environ[RUN_BLOBS]
        raise
    os.environ[RUN_REGISTRY] = reg.host
    return reg, root


def stop_run_registry(started: tuple[LocalRegistry, Path] | None) -> None:
    if started:
        reg, root = started
        reg.stop()
        shutil.rmtree(root, ignore_errors=True)


def _hosts_file() -> Path | None:
    """This run's list of its registries (in the run's own folder; None in a run without one)."""
    blobs = os.environ.get(RUN_BLOBS)
    return Path(blobs).parent / "registry-hosts" if blobs else None


def drop_run_tags() -> None:
    """At the end of the run, in the controlling process: the engine's tags and repository digests naming this run's
    registries (a push tags the image so). Each kept an image alive after the run (12 GB a run, once). Another run's
    are touched only if it took one of this run's ports after this run let it go (ports 5100-5199 are shared)."""
    try:
        hosts = tuple(h + "/" for h in set(_hosts_file().read_text().split()))
    except (OSError, AttributeError):  # no run folder, or no registry started
        return
    import docker
    import docker.errors

    try:
        client = docker.from_env(timeout=60)
        # tags, and the repository digests a push or pull leaves (`repo:<none>` in `docker images`): each holds an image
        refs = [ref for img in client.images.list() for ref in (*img.tags, *(img.attrs.get("RepoDigests") or []))
                if ref.startswith(hosts)]
    except docker.errors.DockerException:
        return  # no engine answers: nothing was tagged on it
    for ref in refs:
        with contextlib.suppress(docker.errors.DockerException):  # one a container still uses stays: nothing lost
            client.images.remove(ref)


def run_registry() -> str:
    """The run's htpasswd registry (USERS): host:port. Each module keeps to repositories of its own in it."""
    host = os.environ.get(RUN_REGISTRY)
    if not host:
        need("needs the run's registry: docker-registry and htpasswd (apt-get install docker-registry apache2-utils)")
    return host


# The image reference docs/promotion.md's consumer verify command names; tests swap in their own (and the key file).
DOC_REF = "registry.example.com/gpuforge/pytorch:pt271-cu126-py311-debian12-runtime-wheels-prod"


def documented_consumer_command() -> str:
    """The consumer's verify command, as docs/promotion.md gives it (README.md must give the same text)."""
    root = Path(__file__).resolve().parent.parent
    doc = (root / "docs" / "promotion.md").read_text()
    block = doc.split("<!-- consumer-verify:", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    assert block in (root / "README.md").read_text(), "README.md and docs/promotion.md must give the same command"
    return block


def pushed_tiny_image(docker_engine, ref: str) -> str:
    """A one-layer image of 4 kB of random bytes (`docker import`), pushed as `ref`: a digest of its own to sign,
    in seconds. Returns the pushed digest."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = os.urandom(4096)
        info = tarfile.TarInfo("blob")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    subprocess.run(["docker", "import", "-", ref], input=buf.getvalue(), capture_output=True, check=True)
    digest = None
    for ev in docker_engine.images.push(*ref.rsplit(":", 1), stream=True, decode=True):
        assert "error" not in ev, ev
        digest = (ev.get("aux") or {}).get("Digest", digest)
    return digest
