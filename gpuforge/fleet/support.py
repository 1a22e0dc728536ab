"""`gpuforge support` (prod digests x fleet pools -> evidence) and release notes per promoted digest, both made
from signed statements on the registry (cosign verify-attestation) and the compat data, never from local files.

The pure parts (rows, notes, renderers) take verified predicates; `collect` reads them for a target.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpuforge.evidence import coverage
from gpuforge.image import compat
from gpuforge.state import files
from gpuforge.validate import evidence
from gpuforge.validate.report import summarize
from gpuforge.validate.report_model import Report

if TYPE_CHECKING:
    from pathlib import Path

    from gpuforge.plan.fleet import Pool
    from gpuforge.plan.matrix import Matrix
    from gpuforge.plan.target import Target
    from gpuforge.registry.attest import Signer, Verifier
    from gpuforge.state.records import Records

NOTES_TYPE = "https://gpuforge.dev/attestations/release-notes/v1"


@dataclass
class Evidence:
    """What the registry holds, verified, about one digest of one target."""

    target: Target
    digest: str | None  # the prod tag's digest; None: never promoted
    validation: list[Report] = field(default_factory=list)  # non-GPU and GPU validation predicates
    cve: list[dict[str, Any]] = field(default_factory=list)
    inventory: list[dict[str, Any]] = field(default_factory=list)
    built_at: str | None = None

    def __post_init__(self) -> None:
        # the predicates through the report's shape (dicts as verified): one of another shape is one line, exit 8
        self.validation = [Report.of(p, "signed validation statement") for p in self.validation]

    @property
    def gpu(self) -> list[Report]:
        return [p for p in self.validation if p.gpu]

    @property
    def image(self) -> Report | None:
        """The newest green non-GPU validation predicate (versions, size, skips)."""
        ok = [p for p in self.validation if not p.gpu and not evidence.problems(p)]
        return max(ok, key=lambda p: p.started or 0) if ok else None


def _date(epoch: str | float | None) -> str:
    return dt.datetime.fromtimestamp(float(epoch), dt.UTC).strftime("%Y-%m-%d %H:%M UTC") if epoch else "?"


def pool_cell(pool: Pool, ev: Evidence) -> dict[str, Any]:
    """This pool's evidence for this digest: the newest covering GPU attestation, else the newest red one from a
    host of the pool's model, else not validated (or excluded by the matrix)."""
    if pool.name in getattr(ev.target, "excluded_from", {}):
        return {"result": "excluded", "by": ev.target.excluded_from[pool.name]}
    if ev.digest is None:
        return {"result": "not promoted"}
    kw: dict[str, Any] = {"built_at": ev.built_at}
    green = [p for p in ev.gpu if coverage.covers(pool, p, **kw) is None]
    if green:
        best = max(green, key=lambda p: p.started or 0)
        host = best.host_of()
        return {"result": "green", "date": _date(best.started), "driver": host.driver,
                "runner": host.runner, "gpus": host.count}
    mine = [p for p in ev.gpu if p.host_of().gpu_models == [pool.model]]
    if mine:
        last = max(mine, key=lambda p: p.started or 0)
        return {"result": "red", "date": _date(last.started), "why": coverage.covers(pool, last, **kw)}
    return {"result": "not validated"}


def support_rows(evs: list[Evidence], fleet: Sequence[Pool]) -> list[dict[str, Any]]:
    return [{"target": ev.target.id, "digest": ev.digest,
             "pools": {p.name: {"gpu": p.model, "drivers": list(p.drivers), **pool_cell(p, ev)} for p in fleet}}
            for ev in evs]


def _cell_text(c: dict[str, Any]) -> str:
    r: str = c["result"]
    if r == "green":
        return f"green {c['date']} (driver {c['driver']})"
    if r == "red":
        return f"RED {c['date']}"
    if r == "excluded":
        return f"excluded ({c['by']})"
    return r


def render_support(rows: list[dict[str, Any]], fleet: Sequence[Pool], fmt: str) -> str:
    if fmt == "json":
        return json.dumps({"pools": [p.as_dict() for p in fleet], "rows": rows}, indent=2, sort_keys=True) + "\n"
    head = ["target", "prod digest", *(f"{p.name} ({p.model}, {'/'.join(p.drivers)})" for p in fleet)]
    body = [[r["target"], (r["digest"] or "-")[:19], *(_cell_text(r["pools"][p.name]) for p in fleet)] for r in rows]
    if fmt == "markdown":
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in body]
        return "### gpuforge support: prod digests x GPU pools\n\n" + "\n".join(lines) + "\n"
    widths = [max(len(x[i]) for x in [head, *body]) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
                     for row in [head, ["-" * w for w in widths], *body]) + "\n"


# --- release notes -----------------------------------------------------------------------------------------

def _skips(preds: list[Report]) -> list[dict[str, Any]]:
    seen: dict[tuple[Any, ...], dict[str, Any]] = {}
    for p in preds:
        for c in p.checks:
            if c.outcome == "skipped":
                key = (c.module, c.name, evidence.skip_reason(c))
                seen.setdefault(key, {"check": f"{c.module}::{c.name}", "reason": evidence.skip_reason(c),
                                      "gpu": p.gpu})
    return list(seen.values())


def release_notes(ev: Evidence, fleet: Sequence[Pool], *, previous: Evidence | None = None) -> dict[str, Any]:
    """The notes of one promoted digest: versions read from inside the image, driver floor, GPU models validated,
    known issues (skips and reasons), the CVE verdict, size and its change from the previous prod digest."""
    t = ev.target
    facts = ev.image.facts if ev.image else {}
    size = facts.get("size_gb")
    prev_size = previous.image.facts.get("size_gb") if previous and previous.image else None
    cells = {p.name: pool_cell(p, ev) for p in fleet}
    validated = sorted({(n, h.driver, h.count) for p in ev.gpu if not evidence.problems(p, require_gpu=True)
                        for h in [p.host_of()] for n in h.gpu_names})
    cve_newest = max((c for c in ev.cve if (c.get("subject") or {}).get("digest") == ev.digest),
                     key=lambda c: str(c.get("judged_at", "")), default=None)
    return {
        "target": t.id,
        "digest": ev.digest,
        "versions": facts.get("versions", {}),
        "os": t.os,
        "driver_floor": {"full": compat.min_driver(t.cuda),
                         "minor_version_compat": compat.data()["minor_version_compat"].get(t.cuda.split(".")[0], {})
                         .get("min_driver")},
        "arch_list": list(t.variant.arch_list),
        "gpus_validated": [{"gpu": n, "driver": d, "count": c} for n, d, c in validated],
        "pools": cells,
        "known_issues": _skips(ev.validation),
        "cve": ({"ok": cve_newest.get("ok"), "judged_at": cve_newest.get("judged_at"),
                 "counted": len(cve_newest.get("counted", [])), "allowed": len(cve_newest.get("allowed", [])),
                 "problems": cve_newest.get("problems", [])} if cve_newest else None),
        "size_gb": size,
        "previous": {"digest": previous.digest, "size_gb": prev_size} if previous else None,
        "size_change_gb": round(size - prev_size, 3) if size is not None and prev_size is not None else None,
        "packages": sum(len(i.get("python", {})) + len(i.get("debian", {})) for i in ev.inventory[-1:]),
    }


def render_notes(n: dict[str, Any]) -> str:
    v = n["versions"]
    cve = n["cve"]
    change = n["size_change_gb"]
    lines = [
        f"## {n['target']} — release notes for `{(n['digest'] or '')[:19]}`", "",
        "**Contents** (read from inside the image): " + ", ".join(f"{k} {val}" for k, val in sorted(v.items())), "",
        f"**Driver**: >= {n['driver_floor']['full']} for full CUDA support; >= "
        f"{n['driver_floor']['minor_version_compat']} through minor-version compatibility. "
        f"GPU architectures: {', '.join(n['arch_list'])}.", "",
        "**GPU models validated**: " + (", ".join(f"{g['gpu']} x{g['count']} (driver {g['driver']})"
                                               for g in n["gpus_validated"]) or "none"), "",
        "| pool | evidence |", "|---|---|",
        *(f"| {name} | {_cell_text(c)} |" for name, c in n["pools"].items()), "",
        "**Known issues** (checks skipped, and why):",
        *([f"- {k['check']}{' (GPU run)' if k['gpu'] else ''}: {k['reason']}" for k in n["known_issues"]] or ["- none"]),
        "",
        "**CVE verdict**: " + ("none signed" if not cve else
                               f"{'green' if cve['ok'] else 'RED'} ({cve['judged_at']}: {cve['counted']} counted, "
                               f"{cve['allowed']} allowed by the allowlist)"),
        "",
        f"**Size**: {n['size_gb']} GB" + (f" ({change:+.3f} GB from `{n['previous']['digest'][:19]}`)"
                                           if change is not None else " (no previous prod digest)"),
        f"; {n['packages']} packages in the signed inventory.",
    ]
    return "\n".join(lines) + "\n"


# --- reading the registry ----------------------------------------------------------------------------------

def collect(t: Target, *, verifier: Verifier, records: Records, digest: str | None = None) -> Evidence:
    """The verified statements about `t`'s prod digest (or `digest`); `records` (state.records.Records) gives the
    build time of a digest pushed from this checkout."""
    from gpuforge.cve import gate as cve
    from gpuforge.registry import attest
    from gpuforge.registry.client import Registry

    pushed = t.ref
    if digest is None:
        m = Registry(verifier.auth).manifest(pushed.with_tag(f"{pushed.tag}-prod"))
        digest = m.digest if m else None
    rec = records.build(t.id) if records else None
    ev = Evidence(target=t, digest=digest, built_at=rec.built_at if rec and rec.digest == digest else None)
    if digest:
        ref = str(pushed.pinned(digest))
        ev.validation = [Report.of(p, "signed validation statement")  # typed, as __post_init__ types them
                         for p in attest.verified_predicates(ref, attest.VALIDATION_TYPE, verifier)]
        ev.cve = attest.verified_predicates(ref, cve.CVE_TYPE, verifier)
        ev.inventory = attest.verified_predicates(ref, attest.INVENTORY_TYPE, verifier)
    return ev


def support_cli(m: Matrix, targets: Sequence[Target], *, fmt: str, verifier: Verifier, records: Records) -> str:
    from gpuforge.plan import fleet

    pools = fleet.pools_of(m)
    text = render_support(support_rows([collect(t, verifier=verifier, records=records) for t in targets], pools),
                          pools, fmt)
    if fmt == "markdown":
        summarize(text)
    return text


def notes_cli(m: Matrix, targets: Sequence[Target], *, fmt: str, verifier: Verifier, records: Records,
              digest: str | None, previous: str | None, output: str | Path | None, signer: Signer | None = None,
              sign: bool = False) -> str:
    """Release notes of each target's prod digest (or --digest), against --previous; written under `output`
    (notes.json + notes.md per target), to the step summary, and signed onto the digest with --attest."""
    from pathlib import Path

    from gpuforge.errors import ConfigError
    from gpuforge.plan import fleet
    from gpuforge.registry import attest

    for flag, value in (("--digest", digest), ("--previous", previous)):
        if value is not None and not re.fullmatch(r"sha256:[0-9a-f]{64}", value):
            msg = f"{flag}: {value[:80]!r} is not a digest (sha256:<64 hex>)"
            raise ConfigError(msg)
    pools = fleet.pools_of(m)
    out = []
    for t in targets:
        ev = collect(t, verifier=verifier, records=records, digest=digest)
        if ev.digest is None:
            msg = f"{t.id}: no prod digest to write release notes for (promote it, or pass --digest)"
            raise ConfigError(msg)
        prev = collect(t, verifier=verifier, records=records, digest=previous) if previous else None
        n = release_notes(ev, pools, previous=prev)
        md = render_notes(n)
        if output:
            d = files.write_outputs(Path(output), {"release-notes.json": json.dumps(n, indent=2, sort_keys=True) + "\n",
                                                   "release-notes.md": md}, below=(t.id,))
            if sign:
                if signer is None:  # the CLI gives one with --attest
                    msg = "--attest needs a signer (the signing key, or keyless signing); none was given"
                    raise ConfigError(msg)
                attest.attest(str(t.ref.pinned(ev.digest)), d / "release-notes.json", NOTES_TYPE,
                              signer=signer)
        elif sign:
            msg = "--attest needs --output-dir (the notes file is what is signed)"
            raise ConfigError(msg)
        summarize(md)
        out.append(json.dumps(n, indent=2, sort_keys=True) + "\n" if fmt == "json" else md)
    return "".join(out)
