"""`gpuforge status` and `gpuforge history`: what each environment holds, read from the registry (tags,
signed promotion records, signed validation statements), so any checkout or runner sees the same."""

from __future__ import annotations

import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any

from gpuforge.errors import ConfigError, StateError
from gpuforge.evidence import age
from gpuforge.options import Ttl
from gpuforge.plan.target import ImageRef, Target
from gpuforge.publish import history
from gpuforge.publish.promote import env_tags, signed_reports
from gpuforge.registry import attest
from gpuforge.registry.client import Registry
from gpuforge.state.models import BuildRecord
from gpuforge.state.promotions import PromotionRecord
from gpuforge.state.records import Records
from gpuforge.validate import evidence
from gpuforge.validate.report_model import Report, Run

ENVS = ("dev", "prod")


def _verifier(v: attest.Verifier | None) -> attest.Verifier:
    if v is None:
        msg = ("status and history read signed records: pass --key cosign.pub, set GPUFORGE_COSIGN_PUBLIC_KEY, "
               "or GPUFORGE_COSIGN_IDENTITY + GPUFORGE_COSIGN_ISSUER")
        raise ConfigError(msg)
    return v


SOON = 0.2  # evidence in the last fifth of its time to live is shown as expiring


def expiry(validated_at: str | None, ttl_days: float, now: dt.datetime | None = None) -> dict[str, Any]:
    """When evidence signed at `validated_at` leaves the time to live (the admission policy's --max-age-days):
    {"at", "in_days" (negative: ago), "state": fresh | expiring | EXPIRED | unknown}."""
    at = age.signed_time(validated_at)
    if at is None:
        return {"at": None, "in_days": None, "state": "unknown"}
    ends = at + dt.timedelta(days=ttl_days)
    left = (ends - (now or dt.datetime.now(dt.UTC))).total_seconds() / 86400
    state = "EXPIRED" if left <= 0 else "expiring" if left <= SOON * ttl_days else "fresh"
    return {"at": ends.isoformat(timespec="seconds"), "in_days": round(left, 1), "state": state}


def evidence_summary(ref: str, verifier: attest.Verifier, ttl_days: float = 30.0) -> dict[str, Any]:
    """The newest signed validation statement on `ref` (registry order), and the newest GPU one, each with when it
    leaves the time to live."""
    signed = attest.verified_statements(ref, attest.VALIDATION_TYPE, verifier)
    if not signed:
        return {"signed": 0, "green": False, "expires": None, "gpu": None}
    reports = signed_reports(ref, signed)
    newest = reports[signed[-1].index]
    gpu_runs = [reports[s.index] for s in signed if reports[s.index].gpu_run()]
    out = {"signed": len(signed), "green": not evidence.problems(newest), "validated_at": newest.validated_at(),
           "expires": expiry(newest.validated_at(), ttl_days), "run": newest.run.id if newest.run else None, "gpu": None,
           "canaries": canaries(signed, reports, newest)}
    if gpu_runs:
        model, driver = gpu_runs[-1].gpu_summary()
        out["gpu"] = {"green": not evidence.problems(gpu_runs[-1], require_gpu=True), "model": model, "driver": driver,
                      "validated_at": gpu_runs[-1].validated_at(),
                      "expires": expiry(gpu_runs[-1].validated_at(), ttl_days),
                      "signed_offline": bool(gpu_runs[-1].run and gpu_runs[-1].run.signed_offline)}
    return out


def canaries(signed: list[attest.Signed], reports: dict[int, Report], newest: Report) -> list[dict[str, Any]]:
    """The newest canary (gpuforge canary) per scope: the non-GPU checks, and each GPU host (models and driver, as a
    fleet pool sees it). What a red one blocks: the non-GPU one every promotion while it is the digest's newest
    statement; a GPU one prod for the pool of its host while it is that host's newest GPU statement."""
    last: dict[str, tuple[Report, Run, bool]] = {}
    newest_of_host: dict[str, Report] = {}
    for s in signed:
        rep = reports[s.index]
        gpu = rep.gpu_run()
        scope = " ".join(filter(None, rep.gpu_summary())) if gpu else "image"
        if gpu:
            newest_of_host[scope] = rep
        if rep.run and rep.run.canary:
            last[scope] = (rep, rep.run, gpu)
    out = []
    for scope, (c, run, gpu) in last.items():
        deciding = newest_of_host.get(scope) if gpu else newest
        out.append({"scope": scope, "env": run.canary, "gpu": gpu, "at": run.signed_at,
                    "green": not evidence.problems(c, require_gpu=gpu), "deciding": deciding is c})
    return out


def _expiry_text(e: dict[str, Any] | None) -> str:
    if not e or e["state"] == "unknown":
        return ""
    if e["state"] == "EXPIRED":
        return f", EXPIRED {abs(e['in_days']):g} d ago"
    return f", {'EXPIRES' if e['state'] == 'expiring' else 'expires'} in {e['in_days']:g} d"


def _record_json(r: PromotionRecord) -> dict[str, Any]:
    return {"seq": r.seq, "phase": r.phase, "kind": r.kind, "id": r.id, "digest": r.digest, "at": r.at,
            "moved": r.moved if r.phase == "done" else r.tags, "prior": r.prior, "replaced": r.replaced,
            "allow_no_gpu": r.allow_no_gpu, "resumed": r.resumed, "rollback_to_seq": r.rollback_to_seq,
            "version": r.version,
            "run": r.run.id, "git_revision": r.run.git_revision, "git_dirty": r.run.git_dirty, "host": r.run.host,
            "evidence": r.evidence.model_dump(mode="json")}


def collect(targets: list[Target], *, envs: tuple[str, ...], verifier: attest.Verifier | None,
            records: Records, ttl: Ttl = Ttl()) -> list[dict[str, Any]]:
    verifier = _verifier(verifier)
    found: dict[ImageRef, tuple[Any, ...]] = {}
    out = []
    for t in targets:
        pushed = t.ref
        repo, reg = pushed.bare(), Registry(verifier.auth)
        if repo not in found:
            found[repo] = history.all_records(reg, repo, verifier)
        rec = records.build(t.id)
        for env in envs:
            h = history.load(reg, repo, verifier, target=t.id, env=env, found=found[repo])
            moving = env_tags(t, env).moving
            at = _digest_at(reg, repo, moving[0])
            done = h.done()
            last = next((r for r in reversed(done) if r.digest == at), None)
            version = last.version if last else None  # the build the environment holds, as its promotion named it
            names = env_tags(t, env, version).all()
            tags = {tg: at if tg == moving[0] else _digest_at(reg, repo, tg) for tg in names}
            row = {"target": t.id, "env": env, "repository": pushed.name, "tags": tags, "digest": at, "version": version,
                   "promotion": _record_json(last) if last else None,
                   "interrupted": _record_json(i) if (i := h.interrupted()) else None,
                   "evidence": evidence_summary(str(pushed.pinned(at)), verifier, ttl.of(env)) if at else None,
                   "local": _local(rec, at),
                   "history_length": len(done), "warnings": h.warnings}
            out.append(row)
    return out


def _digest_at(reg: Registry, repo: ImageRef, tag: str) -> str | None:
    m = reg.manifest(repo.with_tag(tag))
    return m.digest if m else None


def _local(rec: BuildRecord | None, at: str | None) -> dict[str, Any] | None:
    """This checkout's build of the target: whether the environment holds another digest, what was built how and
    pushed where, and whether each report file validate wrote still holds what that run observed."""
    if rec is None:
        return None
    reports = {kind: {"path": path, "state": _report_state(Path(path), digest)}
               for kind, path, digest in (("report", rec.report, rec.report_digest),
                                          ("gpu_report", rec.gpu_report, rec.gpu_report_digest)) if path}
    return {"digest": rec.digest, "image_id": rec.image_id, "differs": bool(at) and rec.digest is not None and rec.digest != at,
            "reports": reports,
            "build": {"version": rec.version, "build": rec.build, "tags": rec.tags, "size": rec.size,
                      "seconds": rec.seconds, "built_at": rec.built_at,
                      "revision": rec.revision, "recipe": rec.recipe, "driver": rec.driver, "client": rec.client,
                      "engine": rec.engine, "image_store": rec.image_store, "image_index": rec.image_index,
                      "extra_ca": rec.extra_ca, "log": rec.log},
            "pushed": {"ref": rec.pushed_ref, "zstd_digest": rec.digest_zstd, "zstd_ref": rec.pushed_ref_zstd,
                       "soci_index": rec.soci_index, "replaced": rec.replaced or []}}


def _report_state(path: Path, digest: str | None) -> str:
    """'as validated' when the file still holds what the validating run wrote, else 'changed since validate',
    'missing' or 'unreadable'. Only signed statements decide promotion; this tells a reader whether the file beside
    them is the run's."""
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        return "missing"
    except (OSError, ValueError):
        return "unreadable"
    try:  # a file of another shape is not what the run wrote: said, not fatal (status reports, it does not judge)
        rep = Report.of(raw, str(path))
    except StateError:
        return "changed since validate"
    return "as validated" if evidence.digest_of(rep) == digest else "changed since validate"


def _short(d: str | None) -> str:
    return d[:19] if d else "none"


def _text(row: dict[str, Any]) -> list[str]:
    lines = [f"{row['target']} [{row['env']}] {row['repository']}"]
    if row["version"]:
        lines.append(f"  version: {row['version']}")
    lines.append("  tags: " + ", ".join(f"{tg} -> {_short(d)}" for tg, d in row["tags"].items()))
    p = row["promotion"]
    if p:
        rev = (p["git_revision"] or "unknown")[:12] + (" (dirty)" if p["git_dirty"] else "")
        lines.append(f"  promoted: {p['kind']} #{p['seq']} at {p['at']} by run {p['run']} (git {rev}) on {p['host']}"
                     f"{'; WITHOUT GPU evidence (--allow-no-gpu)' if p['allow_no_gpu'] else ''}"
                     f"{'; replaced ' + ', '.join(p['replaced']) if p['replaced'] else ''}")
    elif row["digest"]:
        lines.append("  promoted: no signed promotion record for this digest (moved outside gpuforge?)")
    ev = row["evidence"]
    if ev:
        gpu = ev["gpu"]
        gpu_s = (f"GPU {'green' if gpu['green'] else 'RED'} on {gpu['model'] or 'unknown GPU'}"
                 f"{' driver ' + gpu['driver'] if gpu['driver'] else ''} ({gpu['validated_at']}"
                 f"{_expiry_text(gpu.get('expires'))}"
                 f"{'; signed offline, attached from a bundle' if gpu.get('signed_offline') else ''})") if gpu else "no GPU evidence"
        lines.append(f"  evidence: {'GREEN' if ev['green'] else 'NOT GREEN'} (newest of {ev['signed']} signed run(s), "
                     f"{ev.get('validated_at')}{_expiry_text(ev.get('expires'))}); {gpu_s}")
        for c in ev.get("canaries") or ():
            blocks = ""
            if not c["green"] and c["deciding"]:
                blocks = ("; blocks prod for the pool of this GPU host until a green run there" if c["gpu"]
                          else "; blocks promotion of this digest until a green run")
            lines.append(f"  canary ({c['env']}, {c['scope']}): {'green' if c['green'] else 'RED'} at {c['at']}{blocks}")
    loc = row["local"]
    if loc is None:
        lines.append("  local build: none in this checkout")
    elif row["digest"]:
        differs = f"DIFFERS: {_short(loc['digest'])}{' (' + loc['build']['version'] + ')' if loc['build']['version'] else ''}"
        lines.append(f"  local build: {differs if loc['differs'] else 'same digest'}"
                     if loc["digest"] else "  local build: not pushed from this checkout")
    if loc:
        b, p = loc["build"], loc["pushed"]
        lines.append(f"  local record: {'version ' + b['version'] + ', ' if b['version'] else ''}image {loc['image_id'][:19]}"
                     f"{' (an index)' if b['image_index'] else ''}, "
                     f"{b['size'] / 1e9:.2f} GB, built {b['built_at'] or '?'} in {b['seconds']:.0f} s from git "
                     f"{(b['revision'] or 'unknown')[:12]} (recipe {b['recipe'] or '?'}) by {b['driver'] or '?'} "
                     f"({b['client'] or '?'}) on {b['engine'] or '?'} {b['image_store'] or ''}; log {b['log'] or 'none'}")
        if p["ref"]:
            moved = f"; --replace moved the version tag {len(p['replaced'])} time(s)" if p["replaced"] else ""
            zstd = f"; zstd copy {p['zstd_ref']}" if p["zstd_ref"] else ""
            lazy = f"; SOCI index {p['soci_index'][:19]}" if p["soci_index"] else ""
            lines.append(f"  local push: {p['ref']}{zstd}{lazy}{moved}")
        lines += [f"  local {kind.replace('_', ' ')}: {r['path']} ({r['state']})" for kind, r in loc["reports"].items()]
    i = row["interrupted"]
    if i:
        lines.append(f"  INTERRUPTED {i['kind']} {i['id'][:12]} at {i['at']}: planned {', '.join(i['moved'])} -> "
                     f"{_short(i['digest'])}; the next promote/rollback completes it")
    lines += [f"  warning: {w}" for w in row["warnings"]]
    return lines


def status(targets: list[Target], *, env: str | None, verifier: attest.Verifier | None,
           records: Records, as_json: bool, ttl: Ttl = Ttl()) -> int:
    """`ttl`: each environment's evidence time to live (GPUFORGE_EVIDENCE_TTL_DAYS, what promote and the admission
    policy hold evidence to): evidence in its last fifth is shown as EXPIRES, past it as EXPIRED."""
    rows = collect(targets, envs=(env,) if env else ENVS, verifier=verifier, records=records, ttl=ttl)
    if as_json:
        print(json.dumps(rows, indent=2, sort_keys=True))
    else:
        sys.stdout.write("\n".join(line for r in rows for line in _text(r)) + "\n")
    return 0


def _gpu_text(ev: dict[str, Any]) -> str:
    """The GPU run a promotion relied on, as history says it: model, driver, when, and whether it came from a bundle."""
    if not ev.get("gpu_model"):
        return "no GPU"
    return (f"{ev['gpu_model']}{' driver ' + ev['driver'] if ev.get('driver') else ''}"
            f"{' at ' + ev['gpu_validated_at'] if ev.get('gpu_validated_at') else ''}"
            f"{', signed offline, attached from a bundle' if ev.get('gpu_signed_offline') else ''}")


def show_history(t: Target, *, env: str, verifier: attest.Verifier | None, as_json: bool) -> int:
    verifier = _verifier(verifier)
    pushed = t.ref
    h = history.load(Registry(verifier.auth), pushed.bare(), verifier, target=t.id, env=env)
    rows = [_record_json(r) for r in h.records]
    if as_json:
        print(json.dumps({"target": t.id, "env": env, "records": rows, "warnings": h.warnings}, indent=2, sort_keys=True))
        return 0
    print(f"{t.id} [{env}] {pushed.name}: {len(h.done())} promotion(s)")
    for r in rows:
        if r["phase"] == "intent" and any(o["id"] == r["id"] and o["phase"] == "done" for o in rows):
            continue  # an intent completed by its done record: one line per promotion
        what = "INTERRUPTED " + r["kind"] if r["phase"] == "intent" else r["kind"]
        extra = [*(["WITHOUT GPU evidence"] if r["allow_no_gpu"] else []), *(["resumed"] if r["resumed"] else []),
                 *([f"replaced {', '.join(r['replaced'])}"] if r["replaced"] else []),
                 *([f"back to #{r['rollback_to_seq']}"] if r["rollback_to_seq"] is not None else [])]
        print(f"#{r['seq']:<3} {r['at']}  {what:<9} {r['digest'][:19]}  {', '.join(r['moved'])}  "
              f"(run {r['run']}, git {(r['git_revision'] or 'unknown')[:12]}, {_gpu_text(r['evidence'])})"
              f"{'  [' + '; '.join(extra) + ']' if extra else ''}")
    for w in h.warnings:
        print(f"warning: {w}", file=sys.stderr)
    return 0
