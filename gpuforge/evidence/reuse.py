"""Evidence reused by content: a pushed image whose layers another signed, green, complete validation already
proved, with the same validator set, is not validated again; `validate --attest` signs a statement of its own
onto it that names the one it reuses (`run.reused_from`).

The key is what the checks can see: the image's `rootfs.diff_ids` (digests of the uncompressed layers, so a zstd
copy, a registry mirror and a `skopeo copy` share it with the original); a digest of what no layer carries (the
runtime config as the engine reports it, the platform, the history's commands); a digest of what the run checked
it against (the target.json and the build's CA bundle); the validator set's digest; and the kind of run (an image
run; a GPU run adds its host's GPU models and driver). The three content facts are stamped into every report by
the validating run (gpuforge.validate.evidence.content), so a signed statement names what it proved.

Where candidates come from: the statements this state dir signed (evidence-index.json: a hint, never a
decision) and `--reuse-from REF@DIGEST`. The decision reads the candidate's signed statements on the registry
and verifies them with the public key; any doubt (no key, unreachable, unverifiable, another shape, red,
partial, another key) means "run". The reused statement keeps the source's signing time as its age, so reuse
never makes evidence younger than the run that made it.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from gpuforge.errors import PromotionRefused, RegistryError, StateError
from gpuforge.evidence import age
from gpuforge.plan.target import ImageRef
from gpuforge.registry import attest
from gpuforge.state import store
from gpuforge.validate import evidence
from gpuforge.validate.report_model import Report, ReusedFrom, Run

INDEX = "evidence-index.json"
FIX = "delete it (it only says where this state dir signed evidence; nothing is decided from it)"


def content_key(*, diff_ids: list[str], config: str, inputs: str, validator_set: str, gpu: dict[str, Any] | None = None) -> str:
    """sha256 over the canonical JSON of what the checks' verdict depends on (see the module doc)."""
    facts = {"diff_ids": list(diff_ids), "config": config, "inputs": inputs, "validator_set": validator_set,
             "run": "gpu" if gpu is not None else "image", **({"gpu": gpu} if gpu is not None else {})}
    return "sha256:" + hashlib.sha256(json.dumps(facts, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def key_of(rep: Report) -> str | None:
    """The content key a report proves (None: it names no layers or config, so it proves no content)."""
    ev = rep.evidence
    if ev is None or not ev.diff_ids or not ev.config or not ev.inputs or not ev.validator_set:
        return None
    gpu = None
    if rep.gpu_run():
        host = rep.host_of()
        gpu = {"models": host.gpu_models, "driver": host.driver}
    return content_key(diff_ids=ev.diff_ids, config=ev.config, inputs=ev.inputs, validator_set=ev.validator_set, gpu=gpu)


class Entry(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    ref: str
    key: str


class IndexFile(BaseModel):
    """evidence-index.json: where this state dir's runs signed green evidence, by content key."""

    model_config = ConfigDict(extra="forbid", strict=True)
    schema_version: Literal[1] = 1
    signed: list[Entry] = []


def remember(state_dir: Path, ref: str, key: str) -> None:
    """Add (ref, key) to the index, under the state dir's lock (the newest last, at most one row per ref). Called
    after a statement is signed: an index that cannot be written is a warning, never the run's failure."""
    def change(doc: IndexFile) -> None:
        doc.signed = [*[e for e in doc.signed if e.ref != ref][-199:], Entry(ref=ref, key=key)]
    try:
        store.update(state_dir, INDEX, IndexFile, change, fix=FIX)
    except StateError as e:
        print(f"gpuforge: warning: the evidence index was not updated ({e}); later copies of this image are "
              "validated rather than reused", file=sys.stderr)


def pinned(ref: str) -> str | None:
    """REGISTRY/REPO@DIGEST of a reference that names a registry and a digest (any tag dropped); else None."""
    try:
        r = ImageRef.parse(ref)
    except ValueError:
        return None
    return str(r.pinned(r.digest)) if r.registry and r.digest else None


def hinted(state_dir: Path, key: str) -> list[str]:
    """The refs the index says carry evidence for `key`, newest first; [] when the index is unreadable."""
    try:
        doc = store.load(state_dir, INDEX, IndexFile, fix=FIX)
    except StateError:
        return []
    return [p for p in (pinned(e.ref) for e in reversed(doc.signed) if e.key == key) if p]


@dataclass(frozen=True)
class Found:
    source: str  # host/repo@digest whose statement is reused
    report: Report  # that statement, verified, and one `_unusable` passed: it has a run with a signing time
    key: str

    @property
    def run(self) -> Run:
        """The statement's run block (when and how it was signed)."""
        assert self.report.run is not None  # _unusable passes no statement without one
        return self.report.run


def find(key: str, candidates: list[str], verifier: attest.Verifier | None, *,
         skip: str = "") -> tuple[Found | None, list[str]]:
    """The first candidate whose newest signed statement of an image run is green, complete, signed in its run, not
    itself a reuse, and proves the image key `key`; else None. Also the reason each candidate was passed over."""
    why: list[str] = []
    if verifier is None:
        return None, ["no public key to verify candidates with (--key or GPUFORGE_COSIGN_PUBLIC_KEY)"]
    own = pinned(skip)
    for ref in dict.fromkeys(p for p in map(pinned, candidates) if p):
        if ref == own:
            continue
        try:
            rep = _newest(ref, verifier, gpu=False)  # image keys: GPU runs come along after (gpu_runs)
        except (RegistryError, PromotionRefused, StateError, ValueError) as e:
            why.append(f"{ref}: {e}")
            continue
        if rep is None:
            why.append(f"{ref}: no signed validation statement")
            continue
        problem = _unusable(rep, key)
        if problem:
            why.append(f"{ref}: {problem}")
            continue
        return Found(source=ref, report=rep, key=key), why
    return None, why


def gpu_runs(source: str, copy: str, facts: dict[str, Any], verifier: attest.Verifier) -> tuple[list[Found], list[str]]:
    """The source's GPU evidence that these bytes (`facts`: evidence.content of the copy) reuse: for each GPU host
    the source was validated on (its GPU models and driver), that host's newest verified GPU statement, when it is
    a green run's own of these very layers, config and inputs by this validator set. Also why each was passed over.
    A host's newest red run, on the source or on the copy itself, is not papered over by an older green one; another
    host's green still counts."""
    try:
        ours, theirs = _gpu_newest(copy, verifier), _gpu_newest(source, verifier)
    except (RegistryError, PromotionRefused, StateError, ValueError) as e:
        return [], [f"{source}: the GPU statements could not be read ({e})"]  # any doubt means run
    found, why = [], []
    for (models, driver), rep in theirs.items():
        key = content_key(**facts, validator_set=evidence.validator_set_hash(), gpu={"models": list(models), "driver": driver})
        own = ours.get((models, driver))
        problem = ("the copy's own newest GPU run on this host is not green" if own and evidence.problems(own)
                   else _unusable(rep, key))
        if problem:
            why.append(f"{source} (GPU {', '.join(models) or '?'}, driver {driver}): {problem}")
        else:
            found.append(Found(source=source, report=rep, key=key))
    return found, why


def _gpu_newest(ref: str, verifier: attest.Verifier) -> dict[tuple[Any, ...], Report]:
    """(GPU models, driver) -> that GPU host's newest verified GPU statement on ref."""
    newest: dict[tuple[Any, ...], Report] = {}  # in the order the hosts first signed (the copy's statements keep it)
    for rep in reversed(list(_newest_first(ref, verifier))):
        if rep.gpu_run():
            host = rep.host_of()
            newest[(tuple(host.gpu_models), host.driver)] = rep
    return newest


def _newest(ref: str, verifier: attest.Verifier, *, gpu: bool | None = None) -> Report | None:
    """The newest verified validation statement on ref (None: none); `gpu` False or True: the newest image run's or
    GPU run's (a GPU run signed after the image run does not hide the image run's statement from its own key)."""
    return next((rep for rep in _newest_first(ref, verifier) if gpu is None or rep.gpu_run() == gpu), None)


def _newest_first(ref: str, verifier: attest.Verifier) -> Iterator[Report]:
    """ref's verified validation statements, newest first (registry order), each read against the report's shape
    only when it is reached."""
    for s in reversed(attest.verified_statements(ref, attest.VALIDATION_TYPE, verifier)):
        yield Report.of(s.predicate, f"{ref}: signed validation statement")


def own_newest_is_red(ref: str, verifier: attest.Verifier | None) -> str:
    """Why this digest's own newest signed statement forbids reuse ("" when it does not): a red or partial run of
    these very bytes is not papered over by an older green one elsewhere; the validators run again."""
    if verifier is None:
        return ""
    try:
        rep = _newest(ref, verifier)
    except (RegistryError, PromotionRefused, StateError, ValueError) as e:
        return f"its own statements could not be read ({e})"
    if rep is not None and evidence.problems(rep):
        return "its own newest signed statement is not green"
    return ""


def _unusable(rep: Report, key: str) -> str:
    if not (rep.run and age.signed_time(rep.run.signed_at)):
        return "its newest statement has no signing time (its age is unknown)"
    if not rep.run.signed_in_run:
        return "its newest statement was not signed in its run"
    if rep.run.reused_from is not None:
        return "its newest statement is itself a reuse (only a run's own statement is reused)"
    problems = evidence.problems(rep)
    if problems:
        return f"its newest statement is not evidence ({'; '.join(problems)[:200]})"
    if rep.evidence and rep.evidence.validator_set != evidence.validator_set_hash():
        return "made by another validator set"
    if key_of(rep) != key:
        return "its layers, config or run kind differ (another content key)"
    return ""


def statement(found: Found, *, image_id: str) -> Report:
    """The report this run signs for the copy: the source's checks, this image's id, and where they came from.
    signed_run.statement adds who signed it, when, and the subject."""
    rep = found.report
    assert rep.evidence is not None  # _unusable passes no statement without one (evidence.problems)
    source = ReusedFrom(source=found.source, signed_at=found.run.signed_at, key=found.key)
    kept = found.run.model_dump(exclude_unset=True, exclude={"signed_in_run", "subject", "signed_at"})
    run = Run.model_validate({**kept, "reused_from": source.model_dump()})
    copied = rep.model_copy(update={
        "facts": {**rep.facts, "image_id": image_id, "repo_digests": []},
        "evidence": rep.evidence.model_copy(update={"image_id": image_id, "repo_digests": []}),
        "run": run})
    return Report.of(copied.dump(), "the reused statement")


def inventory(source: str, verifier: attest.Verifier, *, target_id: str, image_id: str) -> dict[str, Any] | None:
    """The source's newest signed inventory (the packages its run read from the image), for this image id: the
    same layers hold the same packages. None when it has none that verifies (the copy is then signed without)."""
    try:
        got = attest.verified_predicates(source, attest.INVENTORY_TYPE, verifier)
    except (RegistryError, PromotionRefused):
        return None
    if not got or not isinstance(got[-1], dict) or not isinstance(got[-1].get("target"), str):
        return None
    return {**got[-1], "target": target_id, "image_id": image_id}
