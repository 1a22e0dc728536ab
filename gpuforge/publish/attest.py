"""Signed validation evidence on the registry, through cosign (Debian trixie's 2.5).

`attest` attaches a green report (and the image's inventory) to the pushed image digest as in-toto
attestations; `verified_predicates` reads them back with `cosign verify-attestation`, so promotion
(and any consumer) judges the signed statement on the registry, not a local file.

Signing: a key pair (`--key cosign.key`, password in COSIGN_PASSWORD) or keyless through the CI
runner's OIDC identity (no key: cosign asks Fulcio; needs `id-token: write`). Verification: the
public key (GPUFORGE_COSIGN_PUBLIC_KEY) or the expected identity + issuer (GPUFORGE_COSIGN_IDENTITY,
GPUFORGE_COSIGN_ISSUER). GPUFORGE_COSIGN_TLOG=1 uploads to / checks the Rekor transparency log
(off by default: the test registries are offline).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from gpuforge import options
from gpuforge.errors import PromotionRefused, RegistryError
from gpuforge.plan.target import ImageRef
from gpuforge.publish.registry import auth_file, insecure

VALIDATION_TYPE = "https://gpuforge.dev/attestations/validation/v1"
INVENTORY_TYPE = "https://gpuforge.dev/attestations/inventory/v1"


@dataclass(frozen=True)
class Verifier:
    """How signatures are checked: a public key, or a keyless identity + OIDC issuer."""

    key: str | None = None
    identity: str | None = None
    issuer: str | None = None

    @classmethod
    def from_env(cls, key: str | None = None) -> Verifier | None:
        """--key, else GPUFORGE_COSIGN_PUBLIC_KEY, else the keyless identity + issuer (gpuforge.options)."""
        key = options.resolve_one(options.SETTINGS["verify_key"], cli=key).value
        ident, issuer = options.setting("cosign_identity"), options.setting("cosign_issuer")
        if key:
            return cls(key=key)
        if ident and issuer:
            return cls(identity=ident, issuer=issuer)
        return None

    def args(self) -> list[str]:
        if self.key:
            return ["--key", self.key]
        return ["--certificate-identity", str(self.identity), "--certificate-oidc-issuer", str(self.issuer)]


def _tlog() -> bool:
    return options.setting("cosign_tlog")


def _cosign(args: list[str], host: str, what: str, env: dict | None = None) -> subprocess.CompletedProcess:
    exe = shutil.which("cosign")
    if not exe:
        msg = "cosign is not installed (Debian trixie's cosign; tools/start-engine.sh installs it)"
        raise RegistryError(msg)
    with auth_file(host) as af:
        e = {**os.environ, **(env or {})}
        if af:  # cosign reads $DOCKER_CONFIG/config.json (credential helpers included)
            e["DOCKER_CONFIG"] = str(Path(af).parent)
        http = ["--allow-http-registry", "--allow-insecure-registry"] if insecure(host) else []
        try:
            return subprocess.run([exe, *args[:1], *http, *args[1:]], capture_output=True, text=True, env=e,
                                  timeout=600, check=False)
        except subprocess.TimeoutExpired:
            msg = f"cosign {what} on {host} did not finish within 10 minutes"
            raise RegistryError(msg) from None


def attest(ref: str, predicate: Path, type_uri: str, *, key: str | None) -> None:
    """Sign `predicate` as an in-toto statement about `ref` (host/repo@sha256:...) and push it."""
    host = ImageRef.parse(ref).registry
    args = ["attest", "--yes", "--type", type_uri, "--predicate", str(predicate),
            f"--tlog-upload={'true' if _tlog() else 'false'}", *(["--key", key] if key else []), ref]
    r = _cosign(args, host, "attest")
    if r.returncode != 0:
        msg = f"cosign attest {ref} failed: {(r.stderr or r.stdout).strip().splitlines()[-1][-300:]}"
        raise RegistryError(msg)


def verified_predicates(ref: str, type_uri: str, verifier: Verifier) -> list[dict]:
    """The predicates of every attestation of `type_uri` on `ref` whose signature verifies and whose
    subject is exactly this digest; [] when there is none."""
    parsed = ImageRef.parse(ref)
    host, digest = parsed.registry, parsed.digest
    args = ["verify-attestation", "--type", type_uri, "--output", "json", *verifier.args(),
            *([] if _tlog() else ["--insecure-ignore-tlog=true"]), ref]
    r = _cosign(args, host, "verify-attestation")
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
    out = []
    for line in r.stdout.splitlines():
        if not line.strip().startswith("{"):
            continue
        env = json.loads(line)
        stmt = json.loads(base64.b64decode(env["payload"]))
        if stmt.get("predicateType") != type_uri:
            continue
        if not any(s.get("digest", {}).get("sha256") == digest.split(":", 1)[1] for s in stmt.get("subject", [])):
            continue  # signed, but about other bytes
        pred = stmt.get("predicate")
        # cosign --type URI wraps non-standard predicates as {"Data": "<file text>", "Timestamp": ...}
        if isinstance(pred, dict) and "Data" in pred and isinstance(pred["Data"], str):
            try:
                pred = json.loads(pred["Data"])
            except json.JSONDecodeError:
                continue
        out.append(pred)
    return out
