"""A promotion as a transaction: a signed `intent` record (the planned tags and the digest each held) is
attached to the digest before the first tag moves, a `done` record after the last. When the copies stop
half way (registry gone, Ctrl-C, a crash), the error names exactly the tags that moved, the intent stays in
the registry for `status` to show, and the next promote or rollback of that target and environment
completes it (after judging its evidence again) before doing anything else.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuforge.errors import FatalError, PromotionRefused, RegistryError
from gpuforge.evidence import runinfo, statements
from gpuforge.plan.target import ImageRef
from gpuforge.publish.history import Entry, History
from gpuforge.registry import attest
from gpuforge.registry.client import Registry
from gpuforge.state import files
from gpuforge.state.promotions import Evidence, PromotionRecord


@dataclass
class Move:
    """What one promotion (or rollback) will do: point `tags` of `env` at `digest`."""

    target: str
    env: str
    reg: Registry
    repo: ImageRef  # the repository (no tag, no digest)
    digest: str
    tags: list[str]
    kind: str = "promote"
    replaced: list[str] = field(default_factory=list)
    allow_no_gpu: bool = False
    evidence: Evidence = field(default_factory=Evidence)
    rollback_to_seq: int | None = None
    version: str | None = None  # the version tag of the build promoted (or restored), when known


def now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def digest_at(reg: Registry, repo: ImageRef, tag: str) -> str | None:
    m = reg.manifest(repo.with_tag(tag))
    return m.digest if m else None


def _sign(repo: ImageRef, rec: PromotionRecord, signer: attest.Signer) -> None:
    attest.attest_data(str(repo.pinned(rec.digest)), rec.dump(), attest.PROMOTION_TYPE, signer=signer)


def _summarize(repo: ImageRef, rec: PromotionRecord, signer: attest.Signer) -> None:
    """The promotion as a SLSA Verification Summary (gpuforge.evidence.statements), signed after its done record: the
    record decides; a summary that cannot be signed is one warning line, never an undone promotion."""
    ref = str(repo.pinned(rec.digest))
    ev = rec.evidence
    requirements = {"env": rec.env, "kind": rec.kind, "gpu_evidence": not rec.allow_no_gpu and rec.env == "prod",
                    "validator_set": ev.validator_set if ev else None}
    inputs = [d for d in ((ev.validation, ev.gpu) if ev else ()) if d]
    try:
        attest.attest_data(ref, statements.vsa(ref, env=rec.env, requirements=requirements, inputs=inputs),
                           statements.VSA_TYPE, signer=signer)
    except (FatalError, statements.NotStandard) as e:
        print(f"gpuforge: warning: {rec.target} -> {rec.env}: promoted, but its SLSA verification summary was not "
              f"signed: {e}", file=sys.stderr, flush=True)


def _copy(reg: Registry, repo: ImageRef, digest: str, tag: str) -> None:
    reg.copy(repo.pinned(digest), tag)
    got = digest_at(reg, repo, tag)
    if got != digest:
        msg = f"{repo.repository}:{tag}: registry holds {got or 'nothing'}, expected {digest}"
        raise RegistryError(msg)


def _interrupted(rec: PromotionRecord, moved: list[str], rest: list[str], why: str) -> RegistryError:
    verb = "rollback" if rec.kind == "rollback" else "promote"
    msg = (f"{rec.target} -> {rec.env}: {rec.kind} {rec.id[:12]} interrupted: moved {', '.join(moved) or 'no tag'} "
           f"to {rec.digest[:19]}, not moved {', '.join(rest)}; the next `gpuforge {verb}` of {rec.target} "
           f"completes it (`gpuforge status` shows it): {why}")
    return RegistryError(msg)


def _was(prior: dict[str, str | None], tags: list[str]) -> str:
    return ", ".join(f"{t}={(prior.get(t) or 'none')[:19]}" for t in tags) or "none"


def _local_copy(reports: Path | None, rec: PromotionRecord) -> None:
    """The done record beside the reports too, written atomically (convenience; the registry's is the record)."""
    if reports is None:
        return
    # the reports folder's own writer: unique temp file, fsync, rename, under its lock, no symlink followed
    files.write_text(reports / rec.target / f"promotion-{rec.env}.json",
                     json.dumps(rec.dump(), indent=2, sort_keys=True) + "\n", root=reports.parent)


def execute(mv: Move, hist: History, *, signer: attest.Signer, reports: Path | None = None) -> dict[str, Any]:
    prior = {tag: digest_at(mv.reg, mv.repo, tag) for tag in mv.tags}
    to_move = [t for t in mv.tags if prior[t] != mv.digest]
    unchanged = [t for t in mv.tags if t not in to_move]
    result = {"target": mv.target, "env": mv.env, "kind": mv.kind, "digest": mv.digest,
              "repository": mv.repo.name, "moved": [], "unchanged": unchanged,
              "prior": prior, "replaced": mv.replaced, "allow_no_gpu": mv.allow_no_gpu}
    if not to_move:
        print(f"gpuforge: {mv.target} -> {mv.env}: every tag already points at {mv.digest}; nothing to do")
        return result
    last = hist.last()
    intent = PromotionRecord(id=uuid.uuid4().hex, phase="intent", kind=mv.kind, target=mv.target, env=mv.env,
                             repository=mv.repo.name, digest=mv.digest, tags=to_move, prior=prior,
                             replaced=mv.replaced, allow_no_gpu=mv.allow_no_gpu, evidence=mv.evidence,
                             rollback_to_seq=mv.rollback_to_seq, version=mv.version, seq=hist.next_seq(),
                             prev=last.ref() if last else None, at=now(), run=runinfo.current())
    _sign(mv.repo, intent, signer)  # before any tag moves: a crash from here on is visible
    moved: list[str] = []
    for tag in to_move:
        try:
            _copy(mv.reg, mv.repo, mv.digest, tag)
        except (FatalError, KeyboardInterrupt) as e:
            rest = [t for t in to_move if t not in moved]
            why = "interrupted (Ctrl-C)" if isinstance(e, KeyboardInterrupt) else str(e)
            raise _interrupted(intent, moved, rest, why) from None
        moved.append(tag)
    done = intent.model_copy(update={"phase": "done", "moved": moved, "seq": intent.seq + 1, "prev": intent.ref(),
                                     "at": now()})
    try:
        _sign(mv.repo, done, signer)
    except FatalError as e:
        raise _interrupted(intent, moved, [], f"every tag moved, but the done record was not written: {e}") from None
    _summarize(mv.repo, done, signer)
    _local_copy(reports, done)
    print(f"gpuforge: {mv.target} -> {mv.env}: {mv.digest}: moved {', '.join(moved)} "
          f"(from {_was(prior, moved)}), unchanged {', '.join(unchanged) or 'none'}"
          f"{'; replaced version tag(s) ' + ', '.join(mv.replaced) if mv.replaced else ''}", flush=True)
    return {**result, "moved": moved, "id": done.id, "seq": done.seq, "at": done.at}


def complete_interrupted(hist: History, reg: Registry, repo: ImageRef, *, signer: attest.Signer,
                         judge: Callable[[PromotionRecord], None], reports: Path | None = None) -> PromotionRecord | None:
    """Finish the interrupted intent at the head of `hist`, if any: judge its evidence again (`judge` raises
    PromotionRefused), move the tags it had not moved, sign its done record. Returns the done record."""
    rec = hist.interrupted()
    if rec is None:
        return None
    half = [t for t in rec.tags if digest_at(reg, repo, t) == rec.digest]
    print(f"gpuforge: {rec.target} -> {rec.env}: completing the interrupted {rec.kind} {rec.id[:12]} of {rec.at} "
          f"({rec.digest[:19]}; already moved: {', '.join(half) or 'none'})", file=sys.stderr, flush=True)
    try:
        judge(rec)
    except PromotionRefused as e:
        msg = (f"{e}; the interrupted {rec.kind} {rec.id[:12]} moved {', '.join(half) or 'no tag'} "
               f"(before: {_was(rec.prior, half)}); `gpuforge rollback` puts them back")
        raise PromotionRefused(msg) from None
    moved = list(half)
    for tag in rec.tags:
        if tag in half:
            continue
        try:
            _copy(reg, repo, rec.digest, tag)
        except FatalError as e:
            raise _interrupted(rec, moved, [t for t in rec.tags if t not in moved], str(e)) from None
        moved.append(tag)
    last = hist.last()
    done = rec.model_copy(update={"phase": "done", "moved": [t for t in rec.tags if t in moved], "resumed": True,
                                  "seq": last.seq + 1 if last else rec.seq + 1, "prev": last.ref() if last else None,
                                  "at": now(), "run": runinfo.current()})
    _sign(repo, done, signer)
    _summarize(repo, done, signer)
    _local_copy(reports, done)
    hist.entries.append(Entry(done, layer=""))  # callers continue from the completed history
    print(f"gpuforge: {rec.target} -> {rec.env}: completed {rec.kind} {rec.id[:12]}: {', '.join(done.moved)} "
          f"now at {rec.digest[:19]}", flush=True)
    return done
