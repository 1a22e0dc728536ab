"""Signed validation evidence on the registry, through cosign (Debian trixie's 2.5).

`attest_data` attaches an in-memory statement (a validation run's result, the image's inventory, a
promotion record) to a pushed image digest as an in-toto attestation; `verified_statements` reads them
back with `cosign verify-attestation`, in registry order (the order cosign appended them), so promotion
(and any consumer) judges signed statements on the registry, never a local file. Offline (a GPU runner with no
registry): `envelope` signs a statement about a named digest into the DSSE envelope `cosign attest` would push, without
pushing it; `envelope_verifies` checks one against the public key; `attach` appends such envelopes to the digest's
attestations later, on a machine that reaches the registry (gpuforge.evidence.bundle, gpuforge.evidence.attach).

Signing (a Signer): a key pair (`--sign-key cosign.key`, password in COSIGN_PASSWORD) or keyless through the CI
runner's OIDC identity (no key: cosign asks Fulcio; needs `id-token: write`). Verification (a Verifier): the
public key (GPUFORGE_COSIGN_PUBLIC_KEY) or the expected identity + issuer (GPUFORGE_COSIGN_IDENTITY,
GPUFORGE_COSIGN_ISSUER). The Rekor transparency log (`tlog_used`): keyless signing always writes to it and
keyless verification always checks it (cosign trusts a short-lived Fulcio certificate only through the log's
entry); a key pair writes to / checks it only when GPUFORGE_COSIGN_TLOG=1 asks, so a private registry's digests
stay out of a public log and a runner needs no route to it. The CLI makes both once from the options, with the
registry credentials cosign needs; each carries its decision.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuforge.errors import ConfigError, PromotionRefused, RegistryError
from gpuforge.plan.target import ImageRef
from gpuforge.registry.client import ANONYMOUS, Registry, RegistryAuth, auth_file, denied, insecure

VALIDATION_TYPE = "https://gpuforge.dev/attestations/validation/v1"
INVENTORY_TYPE = "https://gpuforge.dev/attestations/inventory/v1"
PROMOTION_TYPE = "https://gpuforge.dev/attestations/promotion/v1"


# Where cosign's keyless signing gets an identity token without a browser: a token given outright, or a GitHub
# Actions job with `id-token: write` (the runner then sets both request variables).
OIDC_TOKEN_SOURCES = (("SIGSTORE_ID_TOKEN",), ("ACTIONS_ID_TOKEN_REQUEST_URL", "ACTIONS_ID_TOKEN_REQUEST_TOKEN"))


def oidc_token_available(env: Mapping[str, Any] | None = None) -> bool:
    """Can a keyless cosign sign here? (Without a token it would try the sigstore OAuth host and fail offline.)"""
    env = os.environ if env is None else env
    return any(all(env.get(k) for k in names) for names in OIDC_TOKEN_SOURCES)


def tlog_used(*, keyless: bool, asked: bool | None) -> bool:
    """Whether cosign uploads to / checks the Rekor transparency log. `asked` is the cosign_tlog setting
    (GPUFORGE_COSIGN_TLOG; None: unset). Keyless: always (a keyless signature without its log entry does not verify
    once the certificate's ten minutes are over), and an explicit 0 is refused (ConfigError). A key pair: only
    when asked (1)."""
    if not keyless:
        return bool(asked)
    if asked is False:
        msg = ("GPUFORGE_COSIGN_TLOG: keyless signing and verification always use the Rekor transparency log (a "
               "short-lived certificate is trusted only through its log entry), so it cannot be turned off (0) here; "
               "unset it, or sign and verify with a key pair (--sign-key, --key) to keep statements out of the log")
        raise ConfigError(msg)
    return True


@dataclass(frozen=True)
class Verifier:
    """How signatures are checked: a public key, or a keyless identity + OIDC issuer; whether the Rekor log is
    checked; and the credentials that read the registry. `tlog` is given as the cosign_tlog setting (None: unset)
    and holds the decision once made (tlog_used): keyless always, a key only when asked."""

    key: str | None = None
    identity: str | None = None
    issuer: str | None = None
    tlog: bool | None = None
    auth: RegistryAuth = ANONYMOUS

    def __post_init__(self) -> None:
        object.__setattr__(self, "tlog", tlog_used(keyless=not self.key, asked=self.tlog))

    @classmethod
    def of(cls, *, key: str | None, identity: str | None, issuer: str | None, tlog: bool | None = None,
           auth: RegistryAuth = ANONYMOUS) -> Verifier | None:
        """The public key, else the keyless identity + issuer; None when neither is given."""
        if key:
            return cls(key=key, tlog=tlog, auth=auth)
        if identity and issuer:
            return cls(identity=identity, issuer=issuer, tlog=tlog, auth=auth)
        return None

    def args(self) -> list[str]:
        """cosign verify-attestation's arguments for who signed and whether the log is checked."""
        who = (["--key", self.key] if self.key else
               ["--certificate-identity", str(self.identity), "--certificate-oidc-issuer", str(self.issuer)])
        return [*who, *([] if self.tlog else ["--insecure-ignore-tlog=true"])]


@dataclass(frozen=True)
class Signer:
    """How statements are signed: a private key (None: keyless, through an OIDC identity token), whether they go to
    the Rekor log, and the credentials that push the signature. `tlog` is given as the cosign_tlog setting (None:
    unset) and holds the decision once made (tlog_used): keyless always, a key pair only when asked."""

    key: str | None = None
    tlog: bool | None = None
    auth: RegistryAuth = ANONYMOUS

    def __post_init__(self) -> None:
        object.__setattr__(self, "tlog", tlog_used(keyless=not self.key, asked=self.tlog))

    def args(self) -> list[str]:
        """cosign attest's arguments for the log and the key (none: keyless)."""
        return [f"--tlog-upload={'true' if self.tlog else 'false'}", *(["--key", self.key] if self.key else [])]


def _cosign(args: list[str], host: str, what: str, auth: RegistryAuth,
            env: dict[str, Any] | None = None) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("cosign")
    if not exe:
        msg = "cosign is not installed (Debian trixie's cosign; tools/start-engine.sh installs it)"
        raise RegistryError(msg)
    with auth_file(auth, host) as af:
        e = {**os.environ, **(env or {})}
        if af:  # cosign reads $DOCKER_CONFIG/config.json (credential helpers included)
            e["DOCKER_CONFIG"] = str(Path(af).parent)
        http = ["--allow-http-registry", "--allow-insecure-registry"] if insecure(host, auth) else []
        try:
            return subprocess.run([exe, *args[:1], *http, *args[1:]], capture_output=True, text=True, env=e,
                                  timeout=600, check=False)
        except subprocess.TimeoutExpired:
            msg = f"cosign {what} on {host} did not finish within 10 minutes"
            raise RegistryError(msg) from None


def attest(ref: str, predicate: Path, type_uri: str, *, signer: Signer) -> None:
    """Sign `predicate` as an in-toto statement about `ref` (host/repo@sha256:...) and push it."""
    host = ImageRef.parse(ref).registry
    args = ["attest", "--yes", "--type", type_uri, "--predicate", str(predicate), *signer.args(), ref]
    r = _cosign(args, host, "attest", signer.auth)
    _pushed_or_raise(r, host, ref, command="attest", to="to sign", doing="signing")


def _pushed_or_raise(r: subprocess.CompletedProcess[str], host: str, ref: str, *, command: str, to: str, doing: str) -> None:
    """A cosign command that writes to the registry: its failure as one line, the registry's reason first."""
    if r.returncode == 0:
        return
    text = (r.stderr or r.stdout).strip()
    if "connection refused" in text:
        msg = f"cannot reach registry {host} {to} {ref}"
    elif denied(text):
        msg = (f"registry {host} refused the credentials for {doing} {ref} (the account needs push; set "
               "GPUFORGE_REGISTRY_USER/GPUFORGE_REGISTRY_PASSWORD, `docker login`, or a credential helper)")
    else:
        msg = f"cosign {command} {ref} failed: {text.splitlines()[-1][-300:] if text else f'exit {r.returncode}'}"
    raise RegistryError(msg)


def attest_data(ref: str, data: dict[str, Any], type_uri: str, *, signer: Signer) -> None:
    """Sign an in-memory predicate: it goes to cosign through a private temporary file (mode 0600 in a
    0700 folder this process made), never through a path a user edits."""
    with tempfile.TemporaryDirectory(prefix="gpuforge-sign-") as d:
        p = Path(d) / "predicate.json"
        p.touch(mode=0o600)
        p.write_text(json.dumps(data, sort_keys=True))
        attest(ref, p, type_uri, signer=signer)


def envelope(ref: str, data: dict[str, Any], type_uri: str, *, signer: Signer) -> str:
    """The DSSE envelope `cosign attest` would push for `data` about `ref` (host/repo@sha256:...), made with no registry
    call (`cosign attest --no-upload`: the digest is named, so nothing is resolved) and no log: one JSON line, what
    `cosign attach attestation` takes later. A key pair only (keyless needs Fulcio and Rekor, so the network)."""
    if not signer.key or signer.tlog:
        msg = ("offline signing takes a key pair and no transparency log: give --sign-key cosign.key (or "
               "GPUFORGE_COSIGN_KEY) and leave GPUFORGE_COSIGN_TLOG unset")
        raise ConfigError(msg)
    with tempfile.TemporaryDirectory(prefix="gpuforge-sign-") as d:
        p = Path(d) / "predicate.json"
        p.touch(mode=0o600)
        p.write_text(json.dumps(data, sort_keys=True))
        args = ["attest", "--yes", "--no-upload", "--type", type_uri, "--predicate", str(p), *signer.args(), ref]
        r = _cosign(args, ImageRef.parse(ref).registry, "attest --no-upload", ANONYMOUS)
    lines = [line for line in r.stdout.splitlines() if line.startswith("{")]
    if r.returncode != 0 or len(lines) != 1:
        text = (r.stderr or r.stdout).strip()
        msg = f"cosign attest --no-upload {ref} failed: {text.splitlines()[-1][-300:] if text else f'exit {r.returncode}'}"
        raise ConfigError(msg)
    return lines[0]


def envelope_verifies(text: str, type_uri: str, verifier: Verifier) -> str | None:
    """None when the DSSE envelope `text` (one JSON document) is signed by the verifier's public key; else cosign's
    reason. Offline: `cosign verify-blob-attestation` checks the signature over the envelope's payload only (no
    registry, no log: statements signed into a bundle never went to one)."""
    if not verifier.key:
        msg = "a bundle's statements are verified with a public key: give --key cosign.pub (or GPUFORGE_COSIGN_PUBLIC_KEY)"
        raise ConfigError(msg)
    with tempfile.TemporaryDirectory(prefix="gpuforge-verify-") as d:
        p = Path(d) / "envelope.json"
        p.write_text(text)
        args = ["verify-blob-attestation", "--key", verifier.key, "--signature", str(p), "--type", type_uri,
                "--check-claims=false", "--insecure-ignore-tlog=true"]
        r = _cosign(args, "", "verify-blob-attestation", ANONYMOUS)
    if r.returncode == 0:
        return None
    lines = [line for line in (r.stderr or r.stdout).strip().splitlines() if not line.startswith("WARNING")]
    return lines[-1].removeprefix("error during command execution: ")[-300:] if lines else f"cosign exit {r.returncode}"


def attach(ref: str, envelopes: list[str], *, auth: RegistryAuth) -> None:
    """Append the DSSE envelopes, in order, to the attestations of `ref` (host/repo@sha256:...) with `cosign attach
    attestation`: each becomes the last layer of the digest's `.att` manifest, as `cosign attest` appends one."""
    host = ImageRef.parse(ref).registry
    with tempfile.TemporaryDirectory(prefix="gpuforge-attach-") as d:
        paths = []
        for i, text in enumerate(envelopes):
            p = Path(d) / f"{i:03d}.json"
            p.write_text(text + "\n")
            paths += ["--attestation", str(p)]
        r = _cosign(["attach", "attestation", *paths, ref], host, "attach attestation", auth)
    _pushed_or_raise(r, host, ref, command="attach attestation", to="to attach attestations to", doing="attaching to")


@dataclass(frozen=True)
class Signed:
    """One verified attestation: its predicate, and where it sits in the registry's attestation manifest
    (cosign appends each new attestation as the last layer of `sha256-<digest>.att`: registry order)."""

    predicate: dict[str, Any]
    layer: str  # sha256 of the DSSE envelope (the layer digest)
    index: int  # position in the .att manifest; larger is newer


def _att_layers(ref: str, auth: RegistryAuth) -> list[str]:
    """The layer digests of the digest's attestation manifest, in registry order ([] when there is none)."""
    parsed = ImageRef.parse(ref)
    m = Registry(auth).manifest(parsed.bare().with_tag("sha256-" + str(parsed.digest).split(":", 1)[1] + ".att"))
    if m is None:
        return []
    return [layer.get("digest") for layer in json.loads(m.body).get("layers", [])]


def verified_statements(ref: str, type_uri: str, verifier: Verifier) -> list[Signed]:
    """Every attestation of `type_uri` on `ref` whose signature verifies and whose subject is exactly
    this digest, oldest first in registry order; [] when there is none. Nothing inside a predicate
    orders them (a signer's field is not a clock)."""
    parsed = ImageRef.parse(ref)
    host, digest = parsed.registry, parsed.digest
    if digest is None:  # a statement's subject is a digest: callers pass pinned refs
        msg = f"{ref}: attestations are read by digest, not by tag"
        raise ValueError(msg)
    args = ["verify-attestation", "--type", type_uri, "--output", "json", *verifier.args(), ref]
    r = _cosign(args, host, "verify-attestation", verifier.auth)
    if r.returncode != 0:
        text = r.stderr or r.stdout
        if any(s in text for s in ("no matching attestations", "none of the attestations matched", "no signatures found",
                                   "MANIFEST_UNKNOWN")):
            return []
        if "connection refused" in text:
            msg = f"cannot reach registry {host} to verify attestations"
            raise RegistryError(msg)
        msg = f"attestations on {ref} do not verify: {text.strip().splitlines()[-1][-300:]}"
        raise PromotionRefused(msg)
    order = {d: i for i, d in enumerate(_att_layers(ref, verifier.auth))}
    out = []
    for line in r.stdout.splitlines():
        if not line.strip().startswith("{"):
            continue
        layer = "sha256:" + hashlib.sha256(line.encode()).hexdigest()  # cosign prints the envelope's bytes
        env = json.loads(line)
        stmt = json.loads(base64.b64decode(env["payload"]))
        if stmt.get("predicateType") != type_uri:
            continue
        if not any(s.get("digest", {}).get("sha256") == digest.split(":", 1)[1] for s in stmt.get("subject", [])):
            continue  # signed, but about other bytes
        pred = stmt.get("predicate")
        # cosign --type URI may wrap non-standard predicates as {"Data": "<file text>", "Timestamp": ...}
        if isinstance(pred, dict) and "Data" in pred and isinstance(pred["Data"], str):
            try:
                pred = json.loads(pred["Data"])
            except json.JSONDecodeError:
                continue
        if not isinstance(pred, dict):
            continue
        if layer not in order:  # verified, yet not a layer of the manifest just read: a concurrent rewrite
            msg = f"the attestations on {ref} changed while being read; retry"
            raise RegistryError(msg)
        out.append(Signed(predicate=pred, layer=layer, index=order[layer]))
    return sorted(out, key=lambda s: s.index)


def verified_predicates(ref: str, type_uri: str, verifier: Verifier) -> list[dict[str, Any]]:
    """The verified predicates of `type_uri` on `ref`, oldest first in registry order."""
    return [s.predicate for s in verified_statements(ref, type_uri, verifier)]
