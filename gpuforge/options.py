"""Every gpuforge setting, declared once: its CLI flag, `GPUFORGE_*` variable, matrix.yaml key, default
and check (TABLE). `resolve()` turns the parsed flags, the environment and (when a command loads it)
matrix.yaml into one frozen `Options` that remembers where each value came from; `gpuforge -v CMD`
prints them.

Source order, for every setting: the CLI flag, then its environment variable, then its matrix.yaml key,
then any fallback variables (the host's CA trust for extra_ca), then the default. An empty variable is
unset. A value from any source goes through the same check, and a bad one is one line naming its source
(`--driver`, `GPUFORGE_DRIVER`, `matrix.yaml:12: extra_ca`), exit 2.

Nothing else in gpuforge/ reads `GPUFORGE_*` from the environment (gpuforge/image/ reads the in-image
variables itself), and nothing here reads it at import time or keeps it in module state. gpuforge/cli.py
resolves a command's options once, after loading matrix.yaml, and hands each stage its typed settings
(`Options.stage(BuildSettings)`, ... : frozen objects whose fields are settings of the table) or small objects
made from them (Records, RegistryAuth, Signer, Verifier).
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType, NoneType, UnionType
from typing import Any, Protocol, TypeVar, get_args, get_origin, get_type_hints

from gpuforge import grammar
from gpuforge.errors import ConfigError
from gpuforge.grammar import GPU_REQUESTS

PEM_MARK = b"-----BEGIN CERTIFICATE-----"
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_APT_STATE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:+-]{0,127}")


# --- checks: value text -> value, or ValueError saying what is allowed --------------------------------

def pem_problem(path: Path) -> str | None:
    """Why `path` is not a PEM CA bundle (no such file, unreadable, no certificate), or None."""
    try:
        head = path.read_bytes()[: 1 << 20] if path.is_file() else None
    except OSError as e:
        return f"{path}: {e.strerror}"
    if head is None:
        return f"{path}: no such file"
    if PEM_MARK not in head:
        return f"{path}: not a PEM bundle (no {PEM_MARK.decode()} line)"
    return None


def _pem(value: str) -> str:
    why = pem_problem(Path(value))
    if why:
        msg = f"{why} (give a PEM CA bundle; it reaches the build only as a secret)"
        raise ValueError(msg)
    return value


def _bool(value: str | bool) -> bool:
    if isinstance(value, bool):
        return value
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    msg = f"{value!r} is not a switch (allowed: 1 or 0; also true/false, yes/no, on/off)"
    raise ValueError(msg)


def _whole(value: object, low: int, high: int | None = None) -> int | None:
    """`value` as a whole number from `low` to `high` (None: no top), or None: the numeric settings' one rule."""
    try:
        n = int(value)  # type: ignore[call-overload]  # any value: int() says which are numbers (TypeError, ValueError)
    except (TypeError, ValueError):
        return None
    return n if low <= n and (high is None or n <= high) else None


def _gzip_level(value: object) -> int:
    n = _whole(value, 0, 9)
    if n is None or str(value).strip() != str(n):
        msg = f"{value!r} is not a gzip level (allowed: 0 to 9)"
        raise ValueError(msg)
    return n


def _jobs(value: object) -> int:
    n = _whole(value, 1, 256)
    if n is None:
        msg = f"{value!r} is not a number of parallel builds (allowed: 1 to 256)"
        raise ValueError(msg)
    return n


def _gpus(value: str) -> str:
    if not (value == "all" or (value.isdigit() and len(value) < 4)):
        msg = f"{value!r} is not a GPU count or 'all'"
        raise ValueError(msg)
    return value


def _cosign_key(value: str) -> str:
    if "://" not in value and not Path(value).is_file():  # a KMS URI (awskms://, k8s://...) is cosign's to check
        msg = f"cosign key {value} does not exist"
        raise ValueError(msg)
    return value


def _public_key(value: str) -> str:
    """--key: the public key that verifies. A private key here is the old spelling of `validate --key` (it once
    signed): refused, naming --sign-key, before it is handed to cosign as a public key."""
    _cosign_key(value)
    try:
        private = "://" not in value and b"PRIVATE KEY-----" in Path(value).read_bytes()[:4096]
    except OSError:
        private = False
    if private:
        msg = f"{value} is a private key: --key is the public key that verifies; sign with --sign-key KEY"
        raise ValueError(msg)
    return value


# The CVE gate's severity scale, ascending (Grype's words upper-cased); gpuforge.cve.gate uses this one.
CVE_SEVERITIES = ("UNKNOWN", "NEGLIGIBLE", "LOW", "MEDIUM", "HIGH", "CRITICAL")


def _severity(value: str) -> str:
    if value.upper() not in CVE_SEVERITIES:
        msg = f"{value!r} is not a severity (allowed: {', '.join(CVE_SEVERITIES)})"
        raise ValueError(msg)
    return value.upper()


def _hours(value: str | float) -> float:
    try:
        h = float(value)
    except (TypeError, ValueError):
        h = -1.0
    if not 0 < h < 24 * 365:
        msg = f"{value!r} is not a number of hours (allowed: more than 0, less than a year)"
        raise ValueError(msg)
    return h


def _run_id(value: str) -> str:
    if not _RUN_ID.fullmatch(value):
        msg = f"{value!r} is not a run id (allowed: letters, digits, _ . -, at most 64)"
        raise ValueError(msg)
    return value


def _apt_state(value: str) -> str:
    if not _APT_STATE.fullmatch(value):
        msg = f"{value!r} is not an apt state (allowed: letters, digits, _ . : + -, at most 128, e.g. date:2026-12-07)"
        raise ValueError(msg)
    return value


def _url(value: str) -> str:  # a build arg ends up in `docker history`: the URL grammar of matrix.yaml (no credentials)
    return grammar.url(value, what="a package index URL")


# What makes a folder a gpuforge checkout (gpuforge.paths finds one by them when GPUFORGE_ROOT is unset).
CHECKOUT_MARKERS = ("images/context", "validators")


def _root(value: str) -> str:
    root = Path(value).resolve()
    if not all((root / m).is_dir() for m in CHECKOUT_MARKERS):
        msg = f"{value}: not a gpuforge checkout (needs {' and '.join(CHECKOUT_MARKERS)})"
        raise ValueError(msg)
    return str(root)


def _days(value: str | float) -> float:
    try:
        d = float(value)
    except (TypeError, ValueError):
        d = -1.0
    if not 0 < d <= 3650:
        msg = f"{value!r} is not a number of days (allowed: more than 0, at most 3650)"
        raise ValueError(msg)
    return d


@dataclass(frozen=True)
class Ttl:
    """The evidence time to live of each environment, in days (evidence_ttl: `30`, or `dev=30,prod=14`)."""

    dev: float = 30.0
    prod: float = 30.0

    def of(self, env: str) -> float:
        days: float = getattr(self, env)  # env: dev or prod, a field
        return days

    def __str__(self) -> str:
        return f"dev={self.dev:g},prod={self.prod:g}"


def _ttl(value: object) -> Ttl:
    text = str(value).strip()
    if "=" not in text:
        d = _days(text)
        return Ttl(dev=d, prod=d)
    days: dict[str, float] = {}
    for item in text.split(","):
        env, _, v = item.partition("=")
        if env.strip() not in ENVIRONMENTS or env.strip() in days:
            msg = f"{text!r}: {env.strip()!r} is not an environment given once (allowed: {', '.join(ENVIRONMENTS)})"
            raise ValueError(msg)
        days[env.strip()] = _days(v.strip())
    return Ttl(**days)


def _steps(value: object) -> int:
    n = _whole(value, 1)
    if n is None:
        msg = f"{value!r} is not a number of steps back (allowed: 1 or more)"
        raise ValueError(msg)
    return n


ENVIRONMENTS = ("dev", "prod")


def _pinned_ref(value: str) -> str:
    grammar.image_reference(value)  # ValueError (its message) when it is no image reference
    m = grammar.reference_match(value)
    if not (m.group(1) and m.group(4)):  # (registry, repository, tag, digest)
        msg = f"{value!r} is not REGISTRY/REPO@sha256:DIGEST (evidence is read from a pinned digest)"
        raise ValueError(msg)
    return value


def _text(value: str) -> str:
    why = grammar.printable(value)
    if why:
        msg = f"{value!r} may not contain control characters or line breaks ({why})"
        raise ValueError(msg)
    return value


# --- the table ---------------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class Setting:
    """One setting: where it may come from, and the one check every source goes through."""

    name: str  # attribute of Options, argparse dest
    help: str
    flag: str | None = None  # "--driver"
    short: str | None = None  # "-j"
    commands: tuple[str, ...] = ()  # subcommands with the flag; a flag with none is global
    env: str | None = None  # "GPUFORGE_DRIVER"
    key: str | None = None  # a top-level matrix.yaml key
    fallback_env: tuple[str, ...] = ()  # read after matrix.yaml (not GPUFORGE_*: the host's own variables)
    default: object = None
    choices: tuple[str, ...] = ()
    what: str = "a value"  # for "'x' is not a build driver"
    check: Callable[[Any], object] | None = None  # text -> value, ValueError when bad (choices are checked apart)
    action: str | None = None  # argparse: store_true, append
    required_for: tuple[str, ...] = ()  # the commands that cannot run without it
    default_for: tuple[tuple[str, object], ...] = ()  # (command, default) where a command's default differs
    choices_for: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (command, choices) where a command's choices differ
    aliases: tuple[tuple[str, str], ...] = ()  # (command, old flag) kept there because it meant the same
    is_path: bool = False  # relative values from matrix.yaml are read from the matrix file's folder
    secret: bool = False  # -v shows that it is set, never the value

    def sources(self) -> tuple[str, ...]:
        """Where the value may come from, in order."""
        out = [f for f in (self.flag, self.env) if f]
        if self.key:
            out.append(f"matrix.yaml: {self.key}")
        return (*out, *self.fallback_env, "default")

    def default_of(self, command: str | None) -> object:
        return self.default if command is None else dict(self.default_for).get(command, self.default)

    def choices_of(self, command: str | None) -> tuple[str, ...]:
        return self.choices if command is None else dict(self.choices_for).get(command, self.choices)


_BUILD, _GPU = ("build",), ("validate", "smoke")
_FLEET_READS = ("prod-sboms", "outdated", "support", "release-notes")  # read signed evidence from the registry
_REPORTS = ("validate", "smoke", "promote", "rollback", "canary")
_REGISTRY_READS = ("status", "history", "rollback")  # promotion state read from (and, rollback, written to) the registry
_SIGNED = ("validate", "cve-gate", "promote", "policy", "canary", "attach", *_FLEET_READS, *_REGISTRY_READS)  # sign or verify with cosign
_REGISTRY_USE = ("push", *_SIGNED)  # speak to a registry (credentials, TLS)

TABLE: tuple[Setting, ...] = (
    # global
    Setting(name="matrix", flag="--matrix", env="GPUFORGE_MATRIX", default="matrix.yaml", check=_text,
            help="path to matrix.yaml"),
    Setting(name="verbose", flag="--verbose", short="-v", action="store_true", default=False,
            help="print every resolved option and where it came from (flag, environment, matrix.yaml, default)"),
    # plan / generate / schema
    Setting(name="json", flag="--json", commands=("plan", "outdated", "status", "history"), action="store_true",
            default=False, help='print JSON for tools instead of text (plan: a GitHub Actions matrix {"include": [...]})'),
    Setting(name="pools", flag="--pools", commands=("plan",), action="store_true", default=False,
            help="with --json: one row per (target, fleet pool) for GPU jobs"),
    Setting(name="check", flag="--check", commands=("generate", "schema"), action="store_true", default=False,
            help="fail, naming the files, when generated files (or the committed schema) are stale"),
    Setting(name="output", flag="--output", commands=("schema", "cve-gate", "policy"), check=_text,
            default_for=(("schema", "matrix.schema.json"),),
            help="the file this command writes (schema: the JSON schema; cve-gate: the verdict JSON that --attest signs, "
                 "its OpenVEX document beside it as <name>.openvex.json)"),
    Setting(name="output_dir", flag="--output-dir", commands=("prod-sboms", "release-notes"), check=_text,
            required_for=("prod-sboms",),
            help="the folder this command writes into, one subfolder per target (prod-sboms: sbom.cdx.json and digest; "
                 "release-notes: release-notes.json and .md)"),
    Setting(name="format", flag="--format", commands=("support", "release-notes", "policy"),
            choices=("text", "markdown", "json"), default="text",
            default_for=(("release-notes", "markdown"), ("policy", "cue")),
            choices_for=(("policy", ("cue", "rego", "policy-controller")),), what="an output format",
            help="text for a terminal, markdown for a step summary or a docs page (release-notes' text), json for tools; "
                 "policy: cue or rego (cosign verify-attestation --policy; rego also for conftest) or policy-controller "
                 "(a ClusterImagePolicy)"),
    Setting(name="pool", flag="--pool", commands=("policy", "attach"), check=_text,
            help="the fleet pool (matrix.yaml's fleet): policy admits images to it (none: the non-GPU checks); attach "
                 "refuses a bundle whose GPU host is not a node of it"),
    Setting(name="evidence_ttl", flag="--max-age-days", commands=("policy", "status", "promote", "attach"),
            env="GPUFORGE_EVIDENCE_TTL_DAYS", default=Ttl(), check=_ttl,
            help="the evidence time to live in days, DAYS or dev=DAYS,prod=DAYS: older evidence does not promote "
                 "(promote), is not admitted (policy), is shown as EXPIRED (status) and is not attached (attach: "
                 "prod's)"),
    # build
    Setting(name="jobs", flag="--jobs", short="-j", commands=_BUILD, default=1, check=_jobs, help="targets built in parallel"),
    Setting(name="keep_going", flag="--keep-going", commands=_BUILD, action="store_true", default=False,
            help="build the other targets after one fails"),
    Setting(name="extra_ca", flag="--extra-ca", commands=_BUILD, env="GPUFORGE_EXTRA_CA", key="extra_ca",
            fallback_env=("PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE"), check=_pem, is_path=True,
            help="PEM bundle trusted by pip in the build, passed as a BuildKit secret; else matrix.yaml's extra_ca, "
                 "else what the host's pip trusts (PIP_CERT, SSL_CERT_FILE, REQUESTS_CA_BUNDLE)"),
    Setting(name="builder", flag="--builder", commands=_BUILD, env="GPUFORGE_BUILDER", check=_text,
            help="buildx builder (remote BuildKit)"),
    Setting(name="cache_from", flag="--cache-from", commands=_BUILD, action="append", default=(), check=_text,
            help="buildx --cache-from (repeatable)"),
    Setting(name="cache_to", flag="--cache-to", commands=_BUILD, env="GPUFORGE_CACHE_TO", check=_text, help="buildx --cache-to"),
    Setting(name="docker", flag="--docker", commands=_BUILD, env="GPUFORGE_DOCKER", check=_text, help="docker client to use"),
    Setting(name="driver", flag="--driver", commands=_BUILD, env="GPUFORGE_DRIVER", default="auto",
            choices=("auto", "buildx", "classic"), what="a build driver",
            help="build driver: buildx when the client has it (auto), or force one"),
    Setting(name="no_cache", flag="--no-cache", commands=_BUILD, action="store_true", default=False,
            help="rebuild every layer (BuildKit's cache mounts still apply)"),
    Setting(name="index_url", flag="--index-url", commands=_BUILD, env="GPUFORGE_INDEX_URL", check=_url,
            help="override the torch index (a mirror)"),
    Setting(name="pypi_url", flag="--pypi-url", commands=_BUILD, env="GPUFORGE_PYPI_URL", check=_url,
            help="override the PyPI index (a mirror)"),
    Setting(name="apt_state", flag="--apt-state", commands=_BUILD, env="GPUFORGE_APT_STATE", check=_apt_state,
            help="key every target's system layer (apt-get update, upgrade, install) by this value; default: the "
                 "state of the image's apt suites, read from their InRelease files at the start of the build (the "
                 "layer is rebuilt when they publish other packages), or the UTC date when they cannot be read"),
    Setting(name="progress", flag="--progress", commands=("build", "validate", "smoke", "push", "canary"), env="GPUFORGE_PROGRESS",
            default="auto", choices=("auto", "tty", "plain"), what="a progress style",
            help="tty (a live display), plain (one line per step, for logs), or auto: tty when stdout is a terminal"),
    Setting(name="provenance", flag="--provenance", commands=_BUILD, env="GPUFORGE_PROVENANCE", default="default",
            choices=("default", "false", "min", "max"), what="a provenance mode",
            help="BuildKit provenance attestation (buildx --provenance; default: BuildKit's own, none on 20.10)"),
    Setting(name="compression_level", flag="--compression-level", commands=_BUILD, env="GPUFORGE_COMPRESSION_LEVEL",
            check=_gzip_level,
            help="gzip level (0-9) of the layers a build exports to a containerd image store, which keeps them and "
                 "pushes them as they are (default: BuildKit's; GNU gzip at 1 took 2.4x less CPU than at 6 for 6.6 "
                 "percent more bytes over torch's libraries: docs/cli.md)"),
    Setting(name="log_dir", commands=(*_BUILD, "push"), env="GPUFORGE_LOG_DIR", default="reports/build-logs", check=_text,
            help="build logs (and push's zstd re-export logs)"),
    # validate / smoke
    Setting(name="all", flag="--all", commands=("clean",), action="store_true", default=False,
            help="remove every gpuforge container, also those of runs still alive (stops them)"),
    Setting(name="reports", flag="--reports", commands=_REPORTS, default="reports", check=_text, help="reports folder"),
    Setting(name="gpu", flag="--gpu", commands=("validate", "canary"), action="store_true", default=False,
            help="also run the GPU validators (containers get every GPU)"),
    Setting(name="gpu_request", flag="--gpu-request", commands=(*_GPU, "canary"), env="GPUFORGE_GPU_REQUEST", key="gpu_request",
            default=GPU_REQUESTS[0], choices=GPU_REQUESTS, what="a GPU request mode",
            help="how containers ask for GPUs: nvidia (--gpus all, NVIDIA container runtime) or cdi "
                 "(--device nvidia.com/gpu=all, Docker >= 25 with CDI on)"),
    Setting(name="pytest_args", flag="--pytest-args", commands=_GPU, default="", check=_text,
            help="extra pytest arguments, e.g. '-k ssh'"),
    Setting(name="image", flag="--image", commands=("smoke",), check=_text,
            help="start a container of this image with every GPU and check inside it"),
    Setting(name="gpus", flag="--gpus", commands=("smoke",), check=_gpus,
            help="GPUs the runner was asked to give (a count or 'all'); the device-count check fails when the "
                 "container or host sees another number"),
    Setting(name="level", flag="--level", commands=("smoke",), choices=("r1", "r2"), what="a readiness level",
            help="only the node's readiness, each failure blamed on the host (exit 10) or the image (exit 5): r1 NVML "
                 "health, driver, XID, limits (about a second); r2 r1 and each GPU's speed against its model's floors "
                 "(about 10 s per GPU; what validate --gpu runs); default: the driver and GPU smoke checks"),
    Setting(name="expect", flag="--expect", commands=("smoke",), action="append", default=(), check=_text,
            help="KEY=VALUE expected version (overrides the target)"),
    Setting(name="target_json", flag="--target-json", commands=("smoke",), check=_text,
            help="expected versions as JSON (e.g. /opt/gpuforge/target.json)"),
    Setting(name="run_id", commands=("build", "validate", "smoke", "clean"), env="GPUFORGE_RUN_ID", check=_run_id,
            help="labels every container of this run (gpuforge sets it for its pytest child); default: a random id"),
    # push / promote
    Setting(name="registry", flag="--registry", commands=_REGISTRY_USE,
            env="GPUFORGE_REGISTRY",
            check=grammar.registry,
            help="push to / promote on this registry HOST[:PORT] instead of matrix.yaml's"),
    Setting(name="compression", flag="--compression", commands=("push",), env="GPUFORGE_COMPRESSION", default="gzip",
            choices=("gzip", "zstd", "both", "soci"), what="a layer compression",
            help="gzip (every engine pulls it), zstd (Docker 23+; pushed as <version>-zstd; needs the containerd image "
                 "store), both, or soci (gzip plus a SOCI index for lazy pulling by the SOCI snapshotter; needs root, "
                 "containerd and soci)"),
    Setting(name="replace", flag="--replace", commands=("push", "promote"), action="store_true", default=False,
            help="move a version tag that names another digest (push: the build's version tag; promote: its "
                 "<version>-dev/-prod); recorded"),
    Setting(name="env", flag="--env", commands=("promote", "policy", "canary", *_REGISTRY_READS),
            required_for=("promote", "policy", "canary", "history", "rollback"),
            choices=ENVIRONMENTS, what="a promotion environment", aliases=(("promote", "--to"),),
            help="the environment (status: default both)"),
    Setting(name="digest", flag="--digest", commands=("cve-gate", "release-notes", "rollback"), check=_text,
            help="the image digest (sha256:...) this command is about: the one scanned (a prod re-scan), the one to "
                 "write notes for (default: the prod tag's), the one to restore (promoted to this environment before)"),
    Setting(name="steps", flag="--steps", commands=("rollback",), check=_steps,
            help="how many promoted digests back (default 1)"),
    Setting(name="previous", flag="--previous", commands=("release-notes",), check=_text,
            help="the previous prod digest, for the size change"),
    Setting(name="allow_no_gpu", flag="--allow-no-gpu", commands=("promote", "rollback"), action="store_true",
            default=False, help="prod without signed GPU evidence: a warning, recorded in the promotion record and history"),
    Setting(name="attest", flag="--attest", commands=("validate", "cve-gate", "release-notes"), action="store_true",
            default=False,
            help="sign what this command makes onto the pushed digest with cosign, in this process (validate: this "
                 "run's result, green or not, the only way evidence is signed; cve-gate: the verdict and its OpenVEX "
                 "document; release-notes: release-notes.json)"),
    Setting(name="bundle", flag="--bundle", commands=("validate",), check=_text,
            help="validate --gpu on a runner with no registry: sign this run's statements offline with --sign-key "
                 "into this bundle file, about the build record's pushed digest (no registry call; not with "
                 "--attest); `gpuforge attach FILE` attaches them where the registry is reachable"),
    Setting(name="no_reuse", flag="--no-reuse", commands=("validate",), action="store_true", default=False,
            help="validate --attest: run the validators even when a signed green run of the same layers, config and "
                 "validator set exists (reuse by content is the default; it needs --key to verify that run)"),
    Setting(name="reuse_from", flag="--reuse-from", commands=("validate",), action="append", default=(), check=_pinned_ref,
            help="validate --attest: also consider this REGISTRY/REPO@sha256:DIGEST's signed evidence for reuse "
                 "(repeatable; e.g. the image this copy was made from)"),
    Setting(name="require_gpu", flag="--require-gpu", commands=("promote",), action="store_true", default=False,
            help="also require signed GPU evidence (prod always does, unless --allow-no-gpu)"),
    Setting(name="signing_key", flag="--sign-key", commands=("validate", "cve-gate", "release-notes", "promote", "rollback",
                                                             "canary"),
            env="GPUFORGE_COSIGN_KEY", check=_cosign_key,
            help="cosign private key that signs (password in COSIGN_PASSWORD): evidence, verdicts, notes, promotion "
                 "records; none: keyless (OIDC)"),
    Setting(name="verify_key", flag="--key", commands=("validate", "promote", "policy", "attach", *_FLEET_READS,
                                                       *_REGISTRY_READS),
            env="GPUFORGE_COSIGN_PUBLIC_KEY", check=_public_key,
            help="cosign public key that signed the evidence (keyless: GPUFORGE_COSIGN_IDENTITY + GPUFORGE_COSIGN_ISSUER)"),
    Setting(name="cosign_identity", commands=_SIGNED, env="GPUFORGE_COSIGN_IDENTITY", check=_text,
            help="keyless verification: the signer's certificate identity"),
    Setting(name="cosign_issuer", commands=_SIGNED, env="GPUFORGE_COSIGN_ISSUER", check=_text,
            help="keyless verification: its OIDC issuer"),
    Setting(name="cosign_tlog", commands=_SIGNED, env="GPUFORGE_COSIGN_TLOG", check=_bool,
            help="key pairs: 1 also uploads key-signed statements to the public Rekor transparency log and checks "
                 "them there (unset or 0: neither); keyless signing and verification always use the log, and refuse 0"),
    Setting(name="registry_user", commands=(*_REGISTRY_USE, "pull"), env="GPUFORGE_REGISTRY_USER", check=_text,
            help="registry user (with the password)"),
    Setting(name="registry_password", commands=(*_REGISTRY_USE, "pull"), env="GPUFORGE_REGISTRY_PASSWORD",
            secret=True,
            help="registry password or token (written to a private auth file, never to a command line)"),
    Setting(name="registry_insecure", commands=_REGISTRY_USE, env="GPUFORGE_REGISTRY_INSECURE", default=False,
            check=_bool,
            help="plain HTTP / no TLS verification for every registry (loopback registries always are)"),
    # the CVE gate (docs/cve.md)
    Setting(name="target", flag="--target", commands=("cve-gate",), check=_text,
            help="target id: its own allowlist entries apply, and its pushed digest is the subject"),
    Setting(name="db_metadata", flag="--db-metadata", commands=("cve-gate",), check=_text,
            help="Trivy: `trivy version -f json` output (VulnerabilityDB.UpdatedAt)"),
    Setting(name="sbom", flag="--sbom", commands=("cve-gate",), check=_text,
            help="the CycloneDX SBOM scanned: every component must be in a scan that lists packages"),
    Setting(name="cve_allowlist", flag="--allowlist", commands=("cve-gate",), env="GPUFORGE_CVE_ALLOWLIST", check=_text,
            help="YAML exceptions (global: and targets: <id>:), each with id, reason, review_by, optionally package "
                 "and justification"),
    Setting(name="cve_severity", flag="--severity", commands=("cve-gate",), env="GPUFORGE_CVE_SEVERITY", default="HIGH",
            check=_severity, help="lowest severity counted (UNKNOWN NEGLIGIBLE LOW MEDIUM HIGH CRITICAL)"),
    Setting(name="cve_max_db_age_hours", flag="--max-db-age-hours", commands=("cve-gate",),
            env="GPUFORGE_CVE_MAX_DB_AGE_HOURS", default=72.0, check=_hours,
            help="a vulnerability database older than this fails the gate"),
    Setting(name="vex_author", flag="--vex-author", commands=("cve-gate",), env="GPUFORGE_VEX_AUTHOR",
            default="gpuforge cve-gate", check=_text,
            help="the OpenVEX document's author: the person or organisation that stands behind the allowlist "
                 "(e.g. 'ML Platform <ml-platform@example.com>')"),
    # outdated
    Setting(name="images", flag="--images", commands=("outdated",), action="store_true", default=False,
            help="run apt-get -s upgrade (security pocket) in each built image"),
    Setting(name="prod", flag="--prod", commands=("outdated",), action="store_true", default=False,
            help="check each prod digest's newest signed CVE verdict"),
    Setting(name="write_base_lock", flag="--write-base-lock", commands=("outdated",), action="store_true", default=False,
            help="record each pulled base's current digest in bases.lock"),
    Setting(name="prod_require_cve", commands=("promote",), env="GPUFORGE_PROD_REQUIRE_CVE", default=False, check=_bool,
            help="promotion to prod also requires a green signed CVE verdict"),
    # where things are
    Setting(name="state_dir", env="GPUFORGE_STATE_DIR", default=".gpuforge", check=_text, help="build/push records"),
    Setting(name="root", env="GPUFORGE_ROOT", check=_root,
            help="the gpuforge checkout; default: the nearest folder at or above the cwd with images/context and validators/"),
)
SETTINGS: Mapping[str, Setting] = MappingProxyType({s.name: s for s in TABLE})

# Old spellings that meant something else on these commands than the flag means now: refused, naming the new one.
RETIRED: Mapping[tuple[str, str], str] = MappingProxyType({
    ("cve-gate", "--key"): "--key is the public key that verifies; sign with --sign-key KEY",
    ("rollback", "--to"): "--to named the digest to restore; give --digest DIGEST (the environment is --env)",
    ("prod-sboms", "--output"): "--output names a file; give the folder as --output-dir DIR",
    ("release-notes", "--output"): "--output names a file; give the folder as --output-dir DIR",
})

# Not a setting: the validator subprocess's end of the progress pipe (gpuforge.validate.progress.Watch sets it).
PROGRESS_FD_ENV = "GPUFORGE_PROGRESS_FD"


def take_progress_fd() -> int | None:
    """The progress pipe's file descriptor, taken out of the environment (popped: the pipe is this process's own,
    and a grandchild holding the number would write elsewhere). Called by the plugin when pytest configures it."""
    v = os.environ.pop(PROGRESS_FD_ENV, "")
    return int(v) if v.isdigit() else None


# --- the typed settings of each stage ------------------------------------------------------------------
# Each field is the setting of its name, with the table's default (tests/unit/core/test_options.py checks both);
# the CLI fills them once per command (Options.stage) and hands them down, so no stage looks a setting up.

@dataclass(frozen=True, kw_only=True)
class RegistrySettings:
    """How gpuforge speaks to registries: which one replaces matrix.yaml's, as whom, and whether without TLS."""

    registry: str | None = None
    registry_user: str | None = None
    registry_password: str | None = field(default=None, repr=False)
    registry_insecure: bool = False


@dataclass(frozen=True, kw_only=True)
class SigningSettings:
    """Who signs (signing_key; none: keyless) and whom a verification trusts (verify_key, else the keyless
    identity and issuer); cosign_tlog: whether key-pair statements also go to the Rekor log."""

    signing_key: str | None = None
    verify_key: str | None = None
    cosign_identity: str | None = None
    cosign_issuer: str | None = None
    cosign_tlog: bool | None = None


@dataclass(frozen=True, kw_only=True)
class BuildSettings:
    """`gpuforge build`'s settings (the builder's BuildOptions is made from them with the records and the apt pin)."""

    jobs: int = 1
    keep_going: bool = False
    extra_ca: str | None = None
    builder: str | None = None
    cache_from: tuple[str, ...] = ()
    cache_to: str | None = None
    docker: str | None = None
    driver: str = "auto"
    no_cache: bool = False
    index_url: str | None = None
    pypi_url: str | None = None
    apt_state: str | None = None
    progress: str = "auto"
    provenance: str = "default"
    compression_level: int | None = None
    log_dir: str = "reports/build-logs"


@dataclass(frozen=True, kw_only=True)
class PushSettings:
    """`gpuforge push`'s settings."""

    compression: str = "gzip"
    replace: bool = False
    log_dir: str = "reports/build-logs"
    progress: str = "auto"


@dataclass(frozen=True, kw_only=True)
class ValidateSettings:
    """The settings of a validator run (validate, smoke, canary)."""

    reports: str = "reports"
    gpu: bool = False
    gpu_request: str = GPU_REQUESTS[0]
    gpus: str | None = None
    pytest_args: str = ""
    progress: str = "auto"
    attest: bool = False
    bundle: str | None = None
    no_reuse: bool = False
    reuse_from: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class PromoteSettings:
    """What moves a digest between environments, or judges it for one (promote, rollback, policy, status, attach)."""

    env: str | None = None
    evidence_ttl: Ttl = Ttl()
    pool: str | None = None
    require_gpu: bool = False
    allow_no_gpu: bool = False
    replace: bool = False
    prod_require_cve: bool = False


@dataclass(frozen=True, kw_only=True)
class CveGateSettings:
    """`gpuforge cve-gate`'s judgement: what is counted and which scans and exceptions it reads."""

    target: str | None = None
    db_metadata: str | None = None
    sbom: str | None = None
    cve_allowlist: str | None = None
    cve_severity: str = "HIGH"
    cve_max_db_age_hours: float = 72.0
    vex_author: str = "gpuforge cve-gate"


STAGES = (RegistrySettings, SigningSettings, BuildSettings, PushSettings, ValidateSettings, PromoteSettings,
          CveGateSettings)
_Stage = TypeVar("_Stage", RegistrySettings, SigningSettings, BuildSettings, PushSettings, ValidateSettings,
                 PromoteSettings, CveGateSettings)
_T = TypeVar("_T")


def _is(value: object, hint: object) -> bool:
    """Whether `value` is of the stage field type `hint`: a class, a union of them (`str | None`) or `tuple[str, ...]`,
    the forms the stages use. A bool is no number here (it is an int to isinstance); an int is a float."""
    if isinstance(hint, UnionType):
        return any(_is(value, h) for h in get_args(hint))
    if get_origin(hint) is tuple and get_args(hint)[1:] == (...,):
        return isinstance(value, tuple) and all(_is(v, get_args(hint)[0]) for v in value)
    if hint is NoneType:
        return value is None
    if hint in (int, float) and isinstance(value, bool):
        return False
    if hint is float:
        return isinstance(value, (int, float))
    if isinstance(hint, type) and get_origin(hint) is None:
        return isinstance(value, hint)
    msg = f"a stage field of type {hint} cannot be checked: give it one of a class, X | None or tuple[X, ...]"
    raise TypeError(msg)


def _type_name(hint: object) -> str:
    return hint.__name__ if isinstance(hint, type) and get_origin(hint) is None else str(hint)


def _wrong_type(name: str, expected: str, value: object) -> TypeError:
    """A setting read as a type its table row does not give: a programming error (user input was checked when it
    was resolved)."""
    return TypeError(f"setting {name}: expected {expected}, got {value!r} ({type(value).__name__})")


# --- resolution --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Resolved:
    name: str
    value: object
    source: str  # "--flag", "ENV_VAR", "matrix.yaml:LINE: key" or "default"

    def __bool__(self) -> bool:
        return self.value is not None


class MatrixSource(Protocol):
    """What the settings read of a loaded matrix.yaml (gpuforge.plan.matrix.Matrix, which this floor module cannot
    import): its checked spec, its path and its positioned document."""

    @property
    def spec(self) -> object: ...
    @property
    def path(self) -> Path: ...
    @property
    def doc(self) -> Any: ...


def _checked(s: Setting, value: Any, source: str, command: str | None = None) -> Resolved:
    if s.action == "append":
        value = tuple(value)
        for v in value:
            _checked(Setting(name=s.name, help="", check=s.check), v, source)
        return Resolved(s.name, value, source)
    choices = s.choices_of(command)
    if choices and value not in choices:
        msg = (f"{source}: {value!r} is not {s.what} (allowed: {', '.join(choices)})"
               f"{grammar.nearest(value, choices)}")
        raise ConfigError(msg)
    try:
        value = s.check(value) if s.check and not (s.action == "store_true" and value is True) else value
    except ValueError as e:
        msg = f"{source}: {e}"
        raise ConfigError(msg) from None
    return Resolved(s.name, value, source)


def resolve_one(s: Setting, *, cli: object = None, environ: Mapping[str, str] | None = None,
                matrix: MatrixSource | None = None,
                command: str | None = None) -> Resolved:
    """The first value given among the setting's sources (see Setting.sources), checked; the default is the
    command's own where it has one."""
    env = os.environ if environ is None else environ
    if cli not in (None, "", False, (), []):
        return _checked(s, cli, s.flag or s.name, command)
    if s.env and env.get(s.env):
        return _checked(s, env[s.env], s.env, command)
    if matrix is not None and s.key and getattr(matrix.spec, s.key, None) not in (None, ""):
        value = str(getattr(matrix.spec, s.key))
        if s.is_path and not Path(value).is_absolute():
            value = str((matrix.path.parent / value).resolve())
        return _checked(s, value, f"{matrix.doc.where((s.key,))}: {s.key}", command)
    for name in s.fallback_env:
        if env.get(name):
            return _checked(s, env[name], name, command)
    return Resolved(s.name, s.default_of(command), "default")


@dataclass(frozen=True)
class Options:
    """Every setting of one command, resolved; `opts.value("driver")` is the value, `opts.source("driver")` its
    origin, `opts.stage(BuildSettings)` the typed settings of one stage, `opts.flag("json")`, `opts.text("digest")`,
    ... a command's own flag, typed."""

    command: str | None
    resolved: Mapping[str, Resolved]
    matrix_read: bool = False
    args_id: int | None = None  # the argparse Namespace these came from
    _flags: Mapping[str, object] = field(default_factory=dict, repr=False)

    def value(self, name: str) -> object:
        """The value of a setting this command takes (KeyError for one it does not: a typo is not a None)."""
        return self.resolved[name].value

    def _of(self, name: str, kind: type[_T]) -> _T:
        value = self.value(name)
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):  # a bool is no number
            raise _wrong_type(name, kind.__name__, value)
        return value

    def flag(self, name: str) -> bool:
        """A switch of this command (a store_true flag, or a variable read as 1 or 0)."""
        return self._of(name, bool)

    def text(self, name: str) -> str | None:
        """A text setting of this command, None when it was not given and has no default."""
        value = self.value(name)
        return None if value is None else self._of(name, str)

    def required_text(self, name: str) -> str:
        """A text setting that always has a value for this command (a default, or a flag argparse requires)."""
        return self._of(name, str)

    def number(self, name: str) -> int | None:
        """A whole-number setting of this command, None when it was not given and has no default."""
        value = self.value(name)
        return None if value is None else self._of(name, int)

    def texts(self, name: str) -> tuple[str, ...]:
        """A repeatable text flag of this command (action append), in the order given."""
        value = self.value(name)
        if not isinstance(value, tuple) or not all(isinstance(v, str) for v in value):
            raise _wrong_type(name, "tuple[str, ...]", value)
        return value

    def stage(self, cls: type[_Stage]) -> _Stage:
        """`cls` (one of STAGES) filled from this command: each field is the setting of its name; one this command
        does not take keeps the table's default. A value not of its field's type is a TypeError naming the setting."""
        hints = get_type_hints(cls)
        values = {f.name: self.value(f.name) for f in fields(cls) if f.name in self.resolved}
        for name, value in values.items():
            if not _is(value, hints[name]):
                raise _wrong_type(name, f"{_type_name(hints[name])} ({cls.__name__}.{name})", value)
        # Each value was checked against its field's type above, at run time; mypy cannot check a mapping's values
        # key by key, so the class is called with unchecked arguments.
        make: Callable[..., _Stage] = cls
        return make(**values)

    def source(self, name: str) -> str:
        return self.resolved[name].source

    def get(self, name: str) -> Resolved:
        return self.resolved[name]

    def with_matrix(self, matrix: MatrixSource) -> Options:
        """The settings that matrix.yaml may give, re-resolved with it (flags and variables still come first)."""
        out = dict(self.resolved)
        for s in TABLE:
            if s.key and s.name in out:
                out[s.name] = resolve_one(s, cli=self._flags.get(s.name), matrix=matrix, command=self.command)
        return Options(self.command, MappingProxyType(out), True, self.args_id, self._flags)

    def lines(self) -> list[str]:
        """`name = value (from source)` for every setting, in table order; secrets are shown as set or not."""
        out = []
        for name, r in self.resolved.items():
            shown = ("(set)" if r.value is not None else None) if SETTINGS[name].secret else r.value
            if isinstance(shown, tuple):
                shown = list(shown)
            out.append(f"{name} = {shown!r} (from {r.source})")
        return out


def _applies(s: Setting, command: str | None) -> bool:
    return not s.commands or command in s.commands


def resolve(args: argparse.Namespace | None = None, command: str | None = None,
            environ: Mapping[str, str] | None = None, matrix: MatrixSource | None = None) -> Options:
    """Every setting of `command` (the global and environment-only ones too) from parsed flags, the
    environment and matrix.yaml. Raises ConfigError naming the source of the first bad value."""
    command = command or getattr(args, "cmd", None)
    flags = {s.name: getattr(args, s.name, None) for s in TABLE if s.flag and _applies(s, command)} if args else {}
    out = {s.name: resolve_one(s, cli=flags.get(s.name), environ=environ, matrix=matrix, command=command)
           for s in TABLE if _applies(s, command)}
    return Options(command, MappingProxyType(out), matrix is not None, id(args) if args else None,
                   MappingProxyType(flags))


def add_arguments(parser: argparse.ArgumentParser, command: str | None) -> None:
    """The table's flags for `command` (None: the global ones). Defaults stay None here: a value argparse
    filled in could not be told from one the user gave, and the environment comes after the flag."""
    for s in TABLE:
        if not s.flag or (s.commands if command is None else command not in s.commands):
            continue
        names = [n for n in (s.short, s.flag, *(old for c, old in s.aliases if c == command)) if n]
        kw: dict[str, Any] = {"dest": s.name, "help": _help(s)}
        if s.action:
            kw["action"] = s.action
            kw["default"] = [] if s.action == "append" else False
        else:
            kw["default"] = None
            if s.choices_of(command):
                kw["metavar"] = "{" + ",".join(s.choices_of(command)) + "}"
        if command in s.required_for:
            kw["required"] = True
        parser.add_argument(*names, **kw)
    for (cmd, flag), hint in RETIRED.items():
        if cmd == command:
            parser.add_argument(flag, action=Retired, hint=hint, help=argparse.SUPPRESS)


class Retired(argparse.Action):
    """An old spelling that meant something else here: refused at parse time with a one-line hint (exit 2)."""

    def __init__(self, option_strings: Sequence[str], dest: str, hint: str, **kw: Any) -> None:
        super().__init__(option_strings, dest=argparse.SUPPRESS, nargs="?", default=argparse.SUPPRESS, **kw)
        self.hint = hint

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        parser.error(f"{option_string} is no longer accepted here: {self.hint}")


def _help(s: Setting) -> str:
    tail = [f"env {s.env}"] if s.env else []
    if s.key:
        tail.append(f"matrix.yaml {s.key}")
    if s.default not in (None, False, (), ""):
        tail.append(f"default {s.default}")
    tail += [f"{cmd}: default {d}" for cmd, d in s.default_for]
    return f"{s.help} ({'; '.join(tail)})" if tail else s.help


def gpu_request(cli: str | None, matrix: MatrixSource | None = None) -> Resolved:
    """How containers ask for GPUs: --gpu-request, GPUFORGE_GPU_REQUEST, matrix.yaml's gpu_request, nvidia."""
    return resolve_one(SETTINGS["gpu_request"], cli=cli, matrix=matrix)


def markdown_table() -> str:
    """The table as docs/options.md shows it (tests keep the page in step with TABLE)."""
    rows = ["| setting | flag | commands | environment | matrix.yaml | then | default |", "|---|---|---|---|---|---|---|"]
    for s in TABLE:
        flag = " / ".join(f"`{n}`" for n in (s.short, s.flag) if n)
        cmds = ", ".join(s.commands) if s.commands else ("all" if s.flag else "")
        default = "" if s.default in (None, (), "") else f"`{s.default}`"
        default += "".join(f" ({cmd}: `{d}`)" for cmd, d in s.default_for)
        if s.choices:
            default += f" (one of {', '.join(s.choices)})"
        default += "".join(f" ({cmd}: one of {', '.join(c)})" for cmd, c in s.choices_for)
        rows.append(f"| {s.name} | {flag} | {cmds} | {f'`{s.env}`' if s.env else ''} | {f'`{s.key}`' if s.key else ''} "
                    f"| {', '.join(f'`{e}`' for e in s.fallback_env)} | {default.strip()} |")
    return "\n".join(rows) + "\n"
