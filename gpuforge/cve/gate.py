"""The CVE gate: a scanner's JSON (Trivy, Grype, pip-audit) + an allowlist with expiring exceptions -> a verdict
that is signed onto the image digest (predicate CVE_TYPE) and that prod promotion requires green.

What counts (docs/cve.md): only FIXABLE findings at or above a severity floor (default HIGH), not on the allowlist.
What fails besides counted findings, because each is a way to pass without having been checked:
  - an allowlist entry whose `review_by` date has passed (an exception is reviewed, not forgotten);
  - a package the scanner did not audit: pip-audit's "not found on PyPI and could not be audited" (it then prints
    "No known vulnerabilities found" and exits 0 — the false pass), Trivy's end-of-life OS (no advisories any
    more), or an SBOM component missing from a scan that lists its packages;
  - a vulnerability database older than a bound, or of unknown age (Trivy: `trivy version -f json` ->
    VulnerabilityDB.UpdatedAt; Grype: descriptor.db.built, or descriptor.db.status.built in schema v6).
Each counted finding prints a ready-to-paste allowlist entry. Beside the verdict goes the same judgement as an
OpenVEX document (gpuforge.cve.openvex), signed onto the digest with it, for scanners run downstream.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gpuforge import grammar, options
from gpuforge.cve import openvex
from gpuforge.errors import ConfigError, CveGateRed
from gpuforge.plan.yamlpos import Positioned, error_loc, load
from gpuforge.state import files

if TYPE_CHECKING:
    from gpuforge.plan.target import Target
    from gpuforge.registry.attest import Signer, Verifier
    from gpuforge.state.records import Records

CVE_TYPE = "https://gpuforge.dev/attestations/cve/v1"
CYCLONEDX_TYPE = "https://cyclonedx.org/bom"  # the predicateType cosign gives `attest --type cyclonedx`
SEVERITIES = options.CVE_SEVERITIES  # ascending; the cve_severity setting's choices
DEFAULT_SEVERITY = "HIGH"
DEFAULT_MAX_DB_AGE_HOURS = 72
MAX_REVIEW_DAYS = 366  # an exception reviewed less than yearly is not reviewed
SUGGEST_REVIEW_DAYS = 30
VULN_ID = r"[A-Z][A-Z0-9]*(?:-[A-Za-z0-9._]+)+"  # CVE-2024-1234, GHSA-xxxx-xxxx-xxxx, PYSEC-2024-1, DSA-5555-1
_VULN_RE = re.compile(rf"(?:{VULN_ID})\Z")


# --- the allowlist ---------------------------------------------------------------------------------

def _vuln_id(v: str) -> str:
    if len(v) > 64 or not _VULN_RE.match(v):
        msg = f"{v!r} is not a vulnerability id (e.g. CVE-2024-1234, GHSA-..., PYSEC-..., DSA-...)"
        raise ValueError(msg)
    return v


def _reason(v: str) -> str:
    why = grammar.printable(v)
    if why or len(v.strip()) < 10:
        msg = f"a reason says why the finding is acceptable, in at least 10 printable characters ({why or 'too short'})"
        raise ValueError(msg)
    return v


class Entry(BaseModel):
    """One exception: a vulnerability id (optionally of one package), why it is acceptable, and when to look again.
    With a `justification` (an OpenVEX label) it also claims the image is not affected, and the OpenVEX document says
    so to downstream scanners; without one it accepts the risk until review_by, and the document says affected."""

    model_config = ConfigDict(extra="forbid")
    id: Annotated[str, Field(strict=True)]
    package: Annotated[str, Field(strict=True, max_length=200)] | None = None
    reason: Annotated[str, Field(strict=True, max_length=2000)]
    review_by: dt.date
    justification: openvex.Justification | None = None

    _id = field_validator("id")(lambda cls, v: _vuln_id(v))
    _why = field_validator("reason")(lambda cls, v: _reason(v))

    @field_validator("review_by")
    @classmethod
    def _horizon(cls, v: dt.date) -> dt.date:
        if v > dt.date.today() + dt.timedelta(days=MAX_REVIEW_DAYS):
            msg = f"review_by {v} is more than {MAX_REVIEW_DAYS} days away (review exceptions at least yearly)"
            raise ValueError(msg)
        return v

    def covers(self, f: Finding) -> bool:
        return self.id == f.id and (self.package is None or self.package == f.package)


class Allowlist(BaseModel):
    model_config = ConfigDict(extra="forbid")
    globals_: list[Entry] = Field([], alias="global")
    targets: dict[str, list[Entry]] = {}

    def for_target(self, target: str | None) -> list[tuple[str, Entry]]:
        own = self.targets.get(target, []) if target else []
        return [("global", e) for e in self.globals_] + [(f"targets.{target}", e) for e in own]


def load_allowlist(path: Path) -> Allowlist:
    """The allowlist file, schema-checked: one file:line per problem (exit 2)."""
    doc: Positioned = load(Path(path))
    if doc.data is None:
        return Allowlist()
    if not isinstance(doc.data, dict):
        msg = f"{path}:1: an allowlist is a mapping with `global:` and/or `targets:` lists of entries"
        raise ConfigError(msg)
    try:
        return Allowlist.model_validate(doc.data)
    except ValidationError as e:
        lines = []
        for err in e.errors():
            loc = error_loc(doc.data, err)
            what = ("unknown key (allowed: id, package, reason, review_by, justification; at the top: global, targets)"
                    if err["type"] == "extra_forbidden" else err["msg"].removeprefix("Value error, "))
            lines.append(f"{doc.where(loc)}: {'.'.join(map(str, loc)) or '(top level)'}: {what}")
        raise ConfigError("\n".join(dict.fromkeys(lines))) from None


# --- scanner output ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Finding:
    id: str
    package: str
    version: str
    severity: str
    fixed: str | None  # the version that fixes it; None: no fix published
    purl: str = ""

    @property
    def fixable(self) -> bool:
        return bool(self.fixed)


@dataclass
class Scan:
    scanner: str
    version: str
    findings: list[Finding] = field(default_factory=list)
    unaudited: list[str] = field(default_factory=list)  # "package version: why"
    db_built: dt.datetime | None = None
    db_from: str = ""  # where db_built was read
    packages: set[str] | None = None  # purls the scan lists (Trivy --list-all-pkgs), None: not listed
    live: bool = False  # queried a live service at scan time (pip-audit): no database to age


def _severity(s: str | None) -> str:
    """The scanner's severity as one of SEVERITIES; UNKNOWN when it gives none or another."""
    s = (s or "UNKNOWN").upper()
    return s if s in SEVERITIES else "UNKNOWN"


def _when(text: str | None, what: str) -> dt.datetime | None:
    if not text:
        return None
    t = re.sub(r"(\.\d{6})\d+", r"\1", str(text).strip()).replace(" UTC", "").replace("Z", "+00:00")
    t = re.sub(r" \+0000$", "+00:00", t)
    try:
        d = dt.datetime.fromisoformat(t)
    except ValueError:
        msg = f"{what}: {text!r} is not a timestamp"
        raise ConfigError(msg) from None
    return d if d.tzinfo else d.replace(tzinfo=dt.UTC)


def _trivy(doc: dict[str, Any], scan: Scan) -> None:
    """Trivy's JSON (SchemaVersion 2): Results[].Vulnerabilities[], Packages[] with --list-all-pkgs."""
    scan.version = str(doc.get("Trivy", {}).get("Version", "")) if isinstance(doc.get("Trivy"), dict) else ""
    os_ = (doc.get("Metadata") or {}).get("OS") or {}
    listed: set[str] = set()
    any_listed = False
    for res in doc.get("Results") or []:
        for p in res.get("Packages") or []:
            any_listed = True
            listed.add((p.get("Identifier") or {}).get("PURL", ""))
        for v in res.get("Vulnerabilities") or []:
            fixed = v.get("FixedVersion") or (None if v.get("Status") not in ("fixed",) else "(fixed; version not given)")
            scan.findings.append(Finding(id=v["VulnerabilityID"], package=v.get("PkgName", ""),
                                         version=v.get("InstalledVersion", ""), severity=_severity(v.get("Severity")),
                                         fixed=fixed, purl=(v.get("PkgIdentifier") or {}).get("PURL", "")))
        if os_.get("EOSL") and res.get("Class") == "os-pkgs":
            scan.unaudited.append(f"every {os_.get('Family')} {os_.get('Name')} package: the OS is end of life "
                                  "(Metadata.OS.EOSL), its advisories are no longer published")
    scan.packages = listed if any_listed else None


def _grype(doc: dict[str, Any], scan: Scan) -> None:
    """Grype's JSON: matches[].vulnerability/.artifact; the DB's build time in descriptor.db."""
    d = doc.get("descriptor") or {}
    scan.version = str(d.get("version", ""))
    db = d.get("db") or {}
    built = db.get("built") or (db.get("status") or {}).get("built")
    scan.db_built, scan.db_from = _when(built, "grype descriptor.db built"), "descriptor.db built" if built else ""
    for m in doc.get("matches") or []:
        v, a = m.get("vulnerability") or {}, m.get("artifact") or {}
        fix = v.get("fix") or {}
        fixed = ", ".join(fix.get("versions") or []) if fix.get("state") == "fixed" else None
        scan.findings.append(Finding(id=v.get("id", ""), package=a.get("name", ""), version=a.get("version", ""),
                                     severity=_severity(v.get("severity")), fixed=fixed or None, purl=a.get("purl", "")))


def _pip_audit(doc: dict[str, Any], scan: Scan) -> None:
    """pip-audit's JSON (-f json): dependencies[] with vulns[] or a skip_reason (not audited)."""
    scan.live = True
    for dep in doc.get("dependencies") or []:
        if dep.get("skip_reason"):
            scan.unaudited.append(f"{dep.get('name')}: {dep['skip_reason']}")
            continue
        for v in dep.get("vulns") or []:
            fixes = v.get("fix_versions") or []
            # pip-audit gives no severity: every fixable finding is counted as UNKNOWN and never dropped by the floor
            scan.findings.append(Finding(id=v.get("id", ""), package=dep.get("name", ""), version=dep.get("version", ""),
                                         severity="UNKNOWN", fixed=", ".join(fixes) or None,
                                         purl=f"pkg:pypi/{dep.get('name')}@{dep.get('version')}"))


def read_scan(path: Path, *, db_metadata: Path | None = None) -> Scan:
    """A scanner's JSON report, its format recognised by its shape (exit 2 for anything else)."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        msg = f"{path}: not a readable JSON scanner report ({e})"
        raise ConfigError(msg) from None
    if isinstance(doc, dict) and "SchemaVersion" in doc and "Results" in doc:
        scan = Scan("trivy", "")
        _trivy(doc, scan)
    elif isinstance(doc, dict) and "matches" in doc and "descriptor" in doc:
        scan = Scan("grype", "")
        _grype(doc, scan)
    elif isinstance(doc, dict) and isinstance(doc.get("dependencies"), list):
        scan = Scan("pip-audit", "")
        _pip_audit(doc, scan)
    else:
        msg = f"{path}: not a Trivy (-f json), Grype (-o json) or pip-audit (-f json) report"
        raise ConfigError(msg)
    if db_metadata:
        try:
            meta = json.loads(Path(db_metadata).read_text())
        except (OSError, json.JSONDecodeError) as e:
            msg = f"{db_metadata}: not readable JSON DB metadata ({e})"
            raise ConfigError(msg) from None
        vdb = meta.get("VulnerabilityDB", meta) if isinstance(meta, dict) else {}
        scan.db_built = _when(vdb.get("UpdatedAt"), f"{db_metadata} UpdatedAt")
        scan.db_from = f"{db_metadata} UpdatedAt"
        if isinstance(meta, dict) and meta.get("Version") and "VulnerabilityDB" in meta:
            scan.version = scan.version or str(meta["Version"])
    return scan


def sbom_purls(path: Path) -> set[str]:
    doc = json.loads(Path(path).read_text())
    return {c["purl"] for c in doc.get("components", []) if c.get("purl")}


def _purl_key(purl: str) -> str:
    """A purl without qualifiers (scanners add or drop arch/distro): type/namespace/name@version."""
    return purl.split("?", 1)[0].lower()


# --- the verdict ------------------------------------------------------------------------------------

def judge(scans: list[Scan], allowlist: Allowlist, *, target: str | None = None, severity: str = DEFAULT_SEVERITY,
          max_db_age_hours: float = DEFAULT_MAX_DB_AGE_HOURS, sbom: Path | None = None,
          now: dt.datetime | None = None, subject: dict[str, Any] | None = None) -> dict[str, Any]:
    """The verdict object (the predicate of CVE_TYPE): what was counted, allowed, expired, unaudited, and why red."""
    now = now or dt.datetime.now(dt.UTC)
    floor = SEVERITIES.index(_severity(severity))
    entries = allowlist.for_target(target)
    counted, allowed, used = _sorted_findings(scans, entries, floor)
    problems = [f"{f['severity']} {f['id']} in {f['package']} {f['version']} is fixable ({f['fixed']}) [{f['scanner']}]"
                for f in counted]
    expired = [{"id": e.id, "package": e.package, "review_by": e.review_by.isoformat(), "in": where}
               for where, e in entries if e.review_by < now.date()]
    for e in expired:
        problems.append(f"allowlist entry {e['id']} ({e['in']}) expired on {e['review_by']}: fix it, or review "
                        "the exception and set a new review_by")
    unaudited = [f"[{s.scanner}] {u}" for s in scans for u in s.unaudited]
    if unaudited:
        problems.append(f"{len(unaudited)} package(s) not audited, e.g. {unaudited[0]} (a scan that skipped packages "
                        "passes without checking them)")
    if sbom:
        unaudited += _sbom_gaps(sbom, scans, problems)
    dbs = _db_ages(scans, now, max_db_age_hours, problems)
    if not scans:
        problems.append("no scanner report given")
    return {
        "target": target,
        "subject": subject or {},
        "sbom_sha256": hashlib.sha256(Path(sbom).read_bytes()).hexdigest() if sbom else None,
        "scanners": [{"name": s.scanner, "version": s.version} for s in scans],
        "severity_floor": SEVERITIES[floor],
        "max_db_age_hours": max_db_age_hours,
        "db": dbs,
        "counted": counted,
        "allowed": allowed,
        "expired": expired,
        "unaudited": unaudited,
        "unused_entries": [e.id for _, e in entries if id(e) not in used and e.review_by >= now.date()],
        "problems": problems,
        "ok": not problems,
        "judged_at": now.isoformat(timespec="seconds"),
    }


def _sorted_findings(scans: list[Scan], entries: list[Any], floor: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]], set[int]]:
    """(counted, allowed, ids of the allowlist entries used): fixable findings at or above the floor (UNKNOWN
    always counts), each either covered by an allowlist entry or counted."""
    counted, allowed, used = [], [], set()
    for scan in scans:
        for f in scan.findings:
            if not f.fixable or (SEVERITIES.index(f.severity) < floor and f.severity != "UNKNOWN"):
                continue
            hit = next(((where, e) for where, e in entries if e.covers(f)), None)
            if hit:
                used.add(id(hit[1]))
                allowed.append({**asdict(f), "allowed_by": hit[0], "review_by": hit[1].review_by.isoformat(),
                                "reason": hit[1].reason, "justification": hit[1].justification})
            else:
                counted.append({**asdict(f), "scanner": scan.scanner})
    return counted, allowed, used


def _sbom_gaps(sbom: Path, scans: list[Scan], problems: list[str]) -> list[str]:
    """SBOM components that a scan listing its packages did not cover (unaudited; one problem per scan)."""
    want = {_purl_key(p): p for p in sbom_purls(sbom)}
    gaps = []
    for s in scans:
        if s.packages is not None:
            missing = sorted(want[k] for k in want.keys() - {_purl_key(p) for p in s.packages})
            if missing:
                gaps += [f"[{s.scanner}] {p}: in the SBOM, not in the scan" for p in missing]
                problems.append(f"{len(missing)} SBOM component(s) are not in the {s.scanner} scan, e.g. {missing[0]}")
    return gaps


def _db_ages(scans: list[Scan], now: dt.datetime, max_db_age_hours: float, problems: list[str]) -> list[dict[str, Any]]:
    """Each offline scanner's database age; an unknown or too old one is a problem (a stale database passes anything)."""
    dbs: list[dict[str, Any]] = []
    for s in scans:
        if s.live:
            continue
        if s.db_built is None:
            problems.append(f"the {s.scanner} database's age is unknown (Trivy: pass --db-metadata from "
                            "`trivy version -f json`; Grype: descriptor.db.built): a stale database passes anything")
            dbs.append({"scanner": s.scanner, "built": None})
            continue
        age = (now - s.db_built).total_seconds() / 3600
        dbs.append({"scanner": s.scanner, "built": s.db_built.isoformat(), "age_hours": round(age, 1), "from": s.db_from})
        if age > max_db_age_hours:
            problems.append(f"the {s.scanner} database was built {s.db_built:%Y-%m-%d %H:%M} UTC, {age:.0f} h ago "
                            f"(at most {max_db_age_hours:g} h): update it and re-scan")
    return dbs


def suggestions(verdict: dict[str, Any], *, today: dt.date | None = None) -> str:
    """Ready-to-paste allowlist entries (YAML, under `global:` or `targets.<id>:`) for every counted finding."""
    today = today or dt.date.today()
    review = today + dt.timedelta(days=SUGGEST_REVIEW_DAYS)
    out = []
    for f in verdict["counted"]:
        reason = f"accepted until rebuilt: {f['package']} {f['version']} -> {f['fixed']} ({f['severity']})"
        out.append(f"  - id: {f['id']}\n    package: {json.dumps(f['package'])}\n    reason: {json.dumps(reason)}\n"
                   f"    review_by: {review.isoformat()}\n"
                   "    # justification: only if the image is not affected (an OpenVEX label, docs/cve.md)")
    return "\n".join(out) + ("\n" if out else "")


def cve_ok(predicates: list[dict[str, Any]], *, digest: str, built_at: str | None = None,
           max_verdict_age_hours: float | None = None, now: dt.datetime | None = None) -> list[str]:
    """Why the signed CVE verdicts on `digest` do not let it into prod ([] when the newest is green).

    `predicates` are verified CVE_TYPE predicates (gpuforge.registry.attest.verified_predicates); the newest by
    judged_at decides, and it must be about this digest, judged after the build, and (optionally) recent."""
    now = now or dt.datetime.now(dt.UTC)
    mine = [p for p in predicates if isinstance(p, dict) and (p.get("subject") or {}).get("digest") == digest]
    if not mine:
        return [f"no signed CVE verdict for {digest} (run `gpuforge cve-gate ... --attest`)"]
    newest = max(mine, key=lambda p: str(p.get("judged_at", "")))
    when = _when(newest.get("judged_at"), "CVE verdict judged_at")
    out = []
    if not newest.get("ok") or newest.get("problems"):
        out.append(f"the newest CVE verdict ({newest.get('judged_at')}) is red: {'; '.join(newest.get('problems') or ['not ok'])}")
    built = _when(built_at, "built_at") if built_at and when else None
    if when and built and when < built:
        out.append(f"the newest CVE verdict ({newest.get('judged_at')}) is older than the build ({built_at})")
    if max_verdict_age_hours is not None and when and (now - when).total_seconds() / 3600 > max_verdict_age_hours:
        out.append(f"the newest CVE verdict ({newest.get('judged_at')}) is older than {max_verdict_age_hours:g} h: re-scan")
    return out


def gate(scans: list[Path], *, allowlist: Path | None, target: Target | None = None, severity: str = DEFAULT_SEVERITY,
         max_db_age_hours: float = DEFAULT_MAX_DB_AGE_HOURS, db_metadata: Path | None = None, sbom: Path | None = None,
         output: Path | None = None, signer: Signer | None = None, sign: bool = False, digest: str | None = None,
         records: Records | None = None, vex_author: str = openvex.DEFAULT_AUTHOR) -> dict[str, Any]:
    """`gpuforge cve-gate`: judge, print the verdict (and ready-to-paste entries), write it and its OpenVEX document,
    sign both with `signer` (an attest.Signer) when asked. `records` (state.records.Records) gives the target's pushed
    digest. `severity` and `max_db_age_hours` are the cve_severity and cve_max_db_age_hours settings, which the CLI
    checked (gpuforge.options). Raises CveGateRed (exit 9) when red — after writing and signing, so a red verdict is
    evidence too."""
    allow = load_allowlist(allowlist) if allowlist else Allowlist()
    read = [read_scan(p, db_metadata=db_metadata if i == 0 else None) for i, p in enumerate(scans)]
    if digest is not None and not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
        msg = f"--digest: {digest[:80]!r} is not a digest (sha256:<64 hex>)"
        raise ConfigError(msg)
    subject: dict[str, str | None] = {}
    rec = records.build(target.id) if target and records else None
    if digest:  # a re-scan of a digest this machine did not build (a prod digest, from its signed SBOM)
        subject = {"digest": digest}
    elif rec and rec.digest:
        subject = {"digest": rec.digest, "image_id": rec.image_id, "ref": rec.pushed_ref}
    verdict = judge(read, allow, target=target.id if target else None, severity=severity,
                    max_db_age_hours=max_db_age_hours, sbom=sbom, subject=subject)
    vex = _write(verdict, output, target, vex_author)
    for line in verdict["problems"]:
        print(f"gpuforge: cve-gate: {line}")
    if verdict["counted"]:
        where = f"targets:\n  {target.id}:" if target else "global:"
        print(f"gpuforge: cve-gate: to accept a finding, paste its entry under `{where}` in the allowlist "
              "(and say why in `reason`):\n" + suggestions(verdict), end="")
    if sign:
        assert signer is not None  # the CLI makes a Signer whenever --attest is given (keyless without a key)
        _sign(target, output, signer, subject.get("digest"), vex=vex)
    state = "GREEN" if verdict["ok"] else "RED"
    print(f"gpuforge: cve-gate: {state}: {len(verdict['counted'])} counted, {len(verdict['allowed'])} allowed, "
          f"{len(verdict['expired'])} expired, {len(verdict['unaudited'])} unaudited (floor {verdict['severity_floor']})")
    if not verdict["ok"]:
        msg = f"CVE gate is red ({len(verdict['problems'])} problem(s)){f'; verdict in {output}' if output else ''}"
        raise CveGateRed(msg)
    return verdict


def _write(verdict: dict[str, Any], output: Path | None, target: Target | None, author: str) -> Path | None:
    """The verdict at `output` and, beside it, its OpenVEX document (written together); the document's path, or
    None when there is none: no digest to name, or nothing to state (a stale one from an earlier run is removed)."""
    if not output:
        return None
    out = {Path(output).name: json.dumps(verdict, indent=2, sort_keys=True) + "\n"}
    vex_path = openvex.path_beside(Path(output))
    doc, left_out = (openvex.document(verdict, registry=target.ref.registry, repository=target.ref.repository,
                                      author=author) if target else (None, 0))
    if doc:
        out[vex_path.name] = json.dumps(doc, indent=2) + "\n"
    files.write_outputs(Path(output).parent, out)
    if left_out:
        print(f"gpuforge: cve-gate: {left_out} allowed finding(s) carry no package URL: left out of the OpenVEX "
              "document (a not_affected statement without its package would cover the whole image)")
    if doc:
        kinds = [s["status"] for s in doc["statements"]]
        print(f"gpuforge: cve-gate: wrote {vex_path} (OpenVEX: {kinds.count('not_affected')} not_affected, "
              f"{kinds.count('affected')} affected)")
        return vex_path
    why = ("no --target (its repository names the image)" if not target else
           "no pushed digest to name the image by (push the target, or give --digest)"
           if not (verdict.get("subject") or {}).get("digest") else "no finding to state")
    print(f"gpuforge: cve-gate: no OpenVEX document: {why}")
    if vex_path.is_file() and not vex_path.is_symlink():
        vex_path.unlink()  # an earlier run's statements are not this verdict's
    return None


def _sign(target: Target | None, verdict_path: Path | None, signer: Signer, digest: str | None, *,
          vex: Path | None = None) -> None:
    from gpuforge.registry import attest

    if target is None or verdict_path is None:
        msg = "--attest needs --target and --output (the verdict is signed onto the target's pushed digest)"
        raise ConfigError(msg)
    if not digest:
        msg = (f"{target.id}: nothing to attest the CVE verdict onto: it was never pushed (run `gpuforge push "
               f"{target.id}`, or give --digest)")
        raise ConfigError(msg)
    ref = str(target.ref.pinned(digest))
    attest.attest(ref, verdict_path, CVE_TYPE, signer=signer)
    print(f"gpuforge: cve-gate: signed the verdict onto {ref} ({CVE_TYPE})")
    if vex:
        attest.attest(ref, vex, openvex.OPENVEX_TYPE, signer=signer)
        print(f"gpuforge: cve-gate: signed the OpenVEX document onto {ref} ({openvex.OPENVEX_TYPE}, cosign's "
              "--type openvex)")


def write_prod_sboms(targets: Sequence[Target], *, verifier: Verifier, out: Path) -> list[tuple[str, str]]:
    """For a re-scan without pulling: each prod digest's signed CycloneDX SBOM (verified) as out/<id>/sbom.cdx.json,
    and its digest as out/<id>/digest. Returns (target id, digest) for each written."""
    from gpuforge.registry import attest
    from gpuforge.registry.client import Registry

    done = []
    for t in targets:
        ref = t.ref
        m = Registry(verifier.auth).manifest(ref.with_tag(f"{ref.tag}-prod"))
        if m is None:
            continue
        boms = attest.verified_predicates(str(ref.pinned(m.digest)), CYCLONEDX_TYPE, verifier)
        if not boms:
            print(f"gpuforge: {t.id}: prod {m.digest[:19]} carries no signed CycloneDX SBOM; not re-scanned")
            continue
        # one set: a digest file never names another SBOM than the one beside it
        d = files.write_outputs(out, {"sbom.cdx.json": json.dumps(boms[-1], indent=2) + "\n",
                                      "digest": m.digest + "\n"}, below=(t.id,))
        done.append((t.id, m.digest))
        print(f"gpuforge: wrote {d / 'sbom.cdx.json'} (prod {m.digest})")
    return done
