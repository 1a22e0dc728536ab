"""A target's promotions in one environment, read from the registry: every verified promotion record
(gpuforge.state.promotions) attached to any digest of the repository, ordered by the record's seq and
checked as a chain (each names the one before it). Nothing local is read, so a second checkout or runner
sees the same history.
"""

from __future__ import annotations

import itertools
import json
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from gpuforge.plan.target import ImageRef
from gpuforge.registry import attest
from gpuforge.registry.client import Registry
from gpuforge.state import promotions
from gpuforge.state.promotions import PromotionRecord

_ATT = re.compile(r"^sha256-([0-9a-f]{64})\.att$")


@dataclass(frozen=True)
class Entry:
    record: PromotionRecord
    layer: str  # the statement's layer digest in the .att manifest


@dataclass
class History:
    target: str
    env: str
    entries: list[Entry] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def records(self) -> list[PromotionRecord]:
        return [e.record for e in self.entries]

    def last(self) -> PromotionRecord | None:
        return self.entries[-1].record if self.entries else None

    def next_seq(self) -> int:
        return self.entries[-1].record.seq + 1 if self.entries else 0

    def done(self) -> list[PromotionRecord]:
        return [r for r in self.records if r.phase == "done"]

    def interrupted(self) -> PromotionRecord | None:
        """The last record, when it is an intent that no done record completes: tags may be half moved."""
        last = self.last()
        if last is None or last.phase != "intent":
            return None
        return None if any(r.phase == "done" and r.id == last.id for r in self.records) else last


def _promotion_digests(reg: Registry, repo: ImageRef) -> list[str]:
    """Digests whose attestation manifest holds a promotion statement (the layer annotation cosign writes),
    read cheaply before any signature is verified."""
    out = []
    for tag in reg.tags(repo):
        m = _ATT.match(tag)
        if not m:
            continue
        man = reg.manifest(repo.with_tag(tag))
        layers = json.loads(man.body).get("layers", []) if man else []
        if any((layer.get("annotations") or {}).get("predicateType") == attest.PROMOTION_TYPE for layer in layers):
            out.append("sha256:" + m[1])
    return out


def all_records(reg: Registry, repo: ImageRef, verifier: attest.Verifier) -> tuple[list[Entry], list[str]]:
    """Every verified promotion record in the repository `repo` (any target, any environment)."""
    digests = _promotion_digests(reg, repo)
    with ThreadPoolExecutor(max_workers=8) as pool:
        found = list(pool.map(lambda d: (d, attest.verified_statements(str(repo.pinned(d)),
                                                                        attest.PROMOTION_TYPE, verifier)), digests))
    entries, warnings = [], []
    for digest, statements in found:
        for s in statements:
            rec = promotions.parse(s.predicate)
            if rec is None:
                warnings.append(f"a signed promotion statement on {digest[:19]} is not a {promotions.SCHEMA} record; ignored")
            elif rec.digest != digest:
                warnings.append(f"promotion record {rec.id[:12]} names {rec.digest[:19]} but is attached to {digest[:19]}; ignored")
            elif rec.repository != repo.name:
                continue  # copied here with the digest's attestations: another repository's history
            else:
                entries.append(Entry(rec, s.layer))
    return entries, warnings


def load(reg: Registry, repo: ImageRef, verifier: attest.Verifier, *, target: str, env: str,
         found: tuple[list[Entry], list[str]] | None = None) -> History:
    """`found`: all_records() already read (status reads a repository once for every target and environment)."""
    entries, warnings = found if found is not None else all_records(reg, repo, verifier)
    warnings = list(warnings)
    mine = sorted((e for e in entries if e.record.target == target and e.record.env == env),
                  key=lambda e: (e.record.seq, e.record.phase == "done"))
    h = History(target=target, env=env, entries=mine, warnings=warnings)
    if mine and mine[0].record.prev is not None:
        h.warnings.append(f"history of {target} in {env} starts at seq {mine[0].record.seq}, after {mine[0].record.prev}, "
                          "which the registry no longer holds")
    for a, b in itertools.pairwise(mine):
        if b.record.prev != a.record.ref():
            h.warnings.append(f"history of {target} in {env}: record seq {b.record.seq} follows {b.record.prev}, "
                              f"but the registry's previous record is {a.record.ref()} (a record was removed, or two "
                              "promotions ran at once)")
    return h
