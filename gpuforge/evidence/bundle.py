"""The bundle: a GPU run's evidence signed offline, carried as one file from a GPU runner that cannot reach the
registry to a machine that can (`gpuforge validate --gpu --bundle FILE` there, `gpuforge attach FILE` here).

The file is JSON, `{"schema": "gpuforge.bundle/1", "envelopes": [ENVELOPE, ...]}`. Each ENVELOPE is a DSSE envelope
exactly as `cosign attest` pushes one (payloadType `application/vnd.in-toto+json`, the in-toto statement in base64
as payload, the signatures), made by `cosign attest --no-upload` with the key pair, about the digest the build record
names. The first is the bundle's own statement (BUNDLE_TYPE), its table of contents: the target, the subject, what ties
the evidence to the image by content (image id, diff_ids, config, validator set, GPU host, pools, content key) and the
sha256 of every other envelope's payload, in order. The others are what `validate --gpu --attest` would have signed
onto the digest (gpuforge.evidence.signed_run.to_sign). The wrapper is not signed and decides nothing: every fact a
reader judges is inside a signed payload, and a wrapper that adds, drops or reorders an envelope no longer matches the
signed table (gpuforge.evidence.attach).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpuforge.errors import StateError
from gpuforge.evidence import reuse, statements
from gpuforge.registry import attest
from gpuforge.state import files
from gpuforge.validate import evidence
from gpuforge.validate.report_model import GpuHost, Report

SCHEMA = "gpuforge.bundle/1"
BUNDLE_TYPE = "https://gpuforge.dev/attestations/bundle/v1"
PROBE_TYPE = "https://gpuforge.dev/attestations/probe/v1"  # signed before a run to try the key, never kept
MAX_BYTES = 64 << 20  # a GPU run's bundle is tens of kB
HEX64 = r"^[0-9a-f]{64}$"
_SHAPE = ConfigDict(extra="forbid", strict=True, frozen=True)


class Signature(BaseModel):
    model_config = _SHAPE
    keyid: str = ""
    sig: str


class Envelope(BaseModel):
    """A DSSE envelope, field for field as cosign writes one (and `cosign attach attestation` reads it)."""

    model_config = _SHAPE
    payloadType: Literal["application/vnd.in-toto+json"]  # DSSE's own field name
    payload: str = Field(min_length=1)
    signatures: list[Signature]  # an empty list is read, and refused as unsigned (attach), not as a malformed file

    def line(self) -> str:
        """The envelope as cosign marshals it: compact JSON, its fields in DSSE's order."""
        return json.dumps(self.model_dump(), separators=(",", ":"))


class BundleFile(BaseModel):
    model_config = _SHAPE
    schema_: Literal["gpuforge.bundle/1"] = Field(alias="schema")
    envelopes: list[Envelope] = Field(min_length=2, max_length=64)


class Subject(BaseModel):
    model_config = _SHAPE
    name: str
    digest: dict[str, str]


class Statement(BaseModel):
    """The in-toto statement inside an envelope (as cosign attest writes it)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, populate_by_name=True)
    type_: Literal["https://in-toto.io/Statement/v0.1"] = Field(alias="_type")
    predicateType: str  # in-toto's own field name
    subject: list[Subject] = Field(min_length=1, max_length=1)
    predicate: dict[str, Any]

    def digest(self) -> str:
        return "sha256:" + self.subject[0].digest.get("sha256", "")


class Listed(BaseModel):
    model_config = _SHAPE
    type: str
    sha256: str = Field(pattern=HEX64)  # of the envelope's payload: what its signature is over


class Contents(BaseModel):
    """The bundle's own statement: what the evidence is about, by content, and which envelopes it is made of."""

    model_config = _SHAPE
    target: str
    subject: str  # host/repo@sha256:... the statements are about (the build record's pushed digest)
    image_id: str
    diff_ids: list[str] = Field(min_length=1)
    config: str
    validator_set: str
    gpu_host: GpuHost
    pools: list[str]  # the fleet pools the run's GPU host is a node of (its Test Results' scopes); [] for none
    content_key: str  # gpuforge.evidence.reuse.content_key of the GPU run
    green: bool
    signed_at: str
    statements: list[Listed] = Field(min_length=1)


@dataclass(frozen=True)
class Sealed:
    """One envelope of a bundle, read: the envelope, the statement its payload holds, and that payload's sha256."""

    envelope: Envelope
    statement: Statement
    payload_sha256: str

    @property
    def type_uri(self) -> str:
        return self.statement.predicateType

    @property
    def predicate(self) -> dict[str, Any]:
        return self.statement.predicate


@dataclass(frozen=True)
class Bundle:
    path: Path
    head: Sealed  # the bundle's own statement (BUNDLE_TYPE)
    body: tuple[Sealed, ...]  # what is attached, in order

    def contents(self) -> Contents:
        """The signed table of contents, read against its shape (call after the signatures verified)."""
        try:
            return Contents.model_validate(self.head.predicate)
        except ValidationError as e:
            raise _shape_error(self.path, e, "its table of contents") from None


class _Statement(Protocol):
    """gpuforge.evidence.signed_run.ToSign, as a Collector reads it (signed_run imports this module)."""

    @property
    def type_uri(self) -> str: ...

    @property
    def predicate(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Collector:
    """A Delivery (gpuforge.evidence.signed_run) into a bundle: each statement signed offline as it comes."""

    signer: attest.Signer
    envelopes: list[str] = field(default_factory=list)

    def __call__(self, ref: str, item: _Statement) -> None:
        self.envelopes.append(attest.envelope(ref, item.predicate, item.type_uri, signer=self.signer))


def preflight(out: Path, *, ref: str, signer: attest.Signer) -> None:
    """Refused before a minutes-long run: a bundle path that is a folder or a symlink, or whose folder cannot be made;
    a key cosign cannot sign with (a wrong COSIGN_PASSWORD): a throwaway statement is signed, and dropped."""
    with files.Folder(out.parent, create=True):
        pass
    if out.is_symlink() or out.is_dir():
        msg = f"{out}: {'a symlink' if out.is_symlink() else 'a folder'}; give a file path for the bundle"
        raise StateError(msg)
    attest.envelope(ref, {"probe": "the signing key opens"}, PROBE_TYPE, signer=signer)


def write(out: Path, *, ref: str, target_id: str, report: Report, collected: Collector) -> Contents:
    """Write the bundle of one run's statements (`collected`, the first gpuforge's validation predicate `report`)
    about `ref`, headed by its signed table of contents, atomically (a reader sees the old file or the whole new one)."""
    body = [seal(json.loads(text), f"{out}: envelope {i + 1}") for i, text in enumerate(collected.envelopes)]
    contents = table(ref=ref, target_id=target_id, report=report, body=body)
    head = json.loads(attest.envelope(ref, contents.model_dump(), BUNDLE_TYPE, signer=collected.signer))
    doc = {"schema": SCHEMA, "envelopes": [head, *(s.envelope.model_dump() for s in body)]}
    files.write_output(out, json.dumps(doc, indent=1) + "\n")
    return contents


def table(*, ref: str, target_id: str, report: Report, body: list[Sealed]) -> Contents:
    """The table of contents of a bundle about `ref` whose validation predicate is `report`."""
    ev, key = report.evidence, reuse.key_of(report)
    if ev is None or key is None or not ev.image_id:
        msg = f"{target_id}: the run's report names no image layers or config, so no bundle can tie it to the image"
        raise StateError(msg)
    scopes = [s.predicate["configuration"][0]["name"] for s in body if s.type_uri == statements.TEST_RESULT_TYPE]
    return Contents(target=target_id, subject=ref, image_id=ev.image_id, diff_ids=list(ev.diff_ids),
                    config=str(ev.config), validator_set=str(ev.validator_set), gpu_host=report.host_of(),
                    pools=[s.removeprefix(statements.POOL_PREFIX) for s in scopes if s.startswith(statements.POOL_PREFIX)],
                    content_key=key, green=not evidence.problems(report, require_gpu=True),
                    signed_at=str(report.run.signed_at if report.run else ""),
                    statements=[Listed(type=s.type_uri, sha256=s.payload_sha256) for s in body])


def read(path: Path) -> Bundle:
    """The bundle at `path`, every envelope read against its shape; a file that is not one (absent, too big, not
    JSON, truncated, another shape, a payload that is no in-toto statement) is one StateError line naming it."""
    try:
        size = os.stat(path).st_size
    except OSError as e:
        raise files.error(path, e) from None
    if size > MAX_BYTES:
        msg = f"{path}: {size} bytes, more than a bundle holds ({MAX_BYTES >> 20} MiB); not a gpuforge bundle"
        raise StateError(msg)
    with files.Folder(path.parent, create=False) as d:  # no lock file: the bundle's folder may be read-only media
        raw = d.read_bytes(path.name)  # a symlink or a folder is refused
    try:
        data = json.loads(raw or b"")
    except json.JSONDecodeError as e:
        msg = f"{path}: not a bundle: not JSON ({e.msg}, line {e.lineno}; truncated?); carry the file again"
        raise StateError(msg) from None
    except UnicodeDecodeError:
        msg = f"{path}: not a bundle: not UTF-8 text; carry the file again"
        raise StateError(msg) from None
    try:
        doc = BundleFile.model_validate(data)
    except ValidationError as e:
        raise _shape_error(path, e, "not a gpuforge bundle") from None
    sealed = [seal(env, f"{path}: envelope {i + 1}") for i, env in enumerate(doc.envelopes)]
    if sealed[0].type_uri != BUNDLE_TYPE:
        msg = f"{path}: not a gpuforge bundle: its first envelope is a {sealed[0].type_uri} statement, not its table"
        raise StateError(msg)
    return Bundle(path=path, head=sealed[0], body=tuple(sealed[1:]))


def seal(env: Envelope | dict[str, Any], where: str) -> Sealed:
    """An envelope and the in-toto statement its payload holds; StateError when the payload is no such statement."""
    try:
        e = env if isinstance(env, Envelope) else Envelope.model_validate(env)
        raw = base64.b64decode(e.payload, validate=True)
        stmt = Statement.model_validate(json.loads(raw))
    except ValidationError as err:
        raise _shape_error(where, err, "not an in-toto envelope") from None
    except (binascii.Error, ValueError):  # not base64, not UTF-8, not JSON
        msg = f"{where}: its payload is not a base64 in-toto statement (truncated or edited?); carry the file again"
        raise StateError(msg) from None
    return Sealed(envelope=e, statement=stmt, payload_sha256=hashlib.sha256(raw).hexdigest())


def _shape_error(path: Path | str, e: ValidationError, what: str) -> StateError:
    err = e.errors()[0]
    loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
    return StateError(f"{path}: {what} ({loc}: {err['msg']}); carry the file again, or make it again with "
                      "`gpuforge validate --gpu --bundle`")
