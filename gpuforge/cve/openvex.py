"""The CVE gate's judgement as an OpenVEX document (spec v0.2.0: openvex/spec OPENVEX-SPEC.md), so that scanners run
downstream (`trivy image --vex`, `grype --vex`) honour the allowlist, signed onto the digest as cosign's
`--type openvex` attestation (docs/cve.md).

Only what the gate judged is stated: each finding it counted or allowed (fixable, at or above the floor), about the
pushed digest.
  - allowed by a live exception that carries a `justification`: not_affected, with that justification and the
    exception's reason and review date as the impact statement;
  - allowed by a live exception without one: affected. Such an exception accepts a risk for a while ("fixed in the
    next rebuild"); it does not claim that the vulnerability cannot be exploited, which is what not_affected says to
    every scanner that reads it;
  - counted, or allowed by an expired exception (the gate fails on both): affected, with what fixes it.
An allowed finding without a usable package URL is left out rather than stated not_affected for the whole image.

The product is the image by digest, as the purl `pkg:oci/<name>@sha256:<hex>?repository_url=<registry>/<repository>`
(what Trivy and Grype derive from a scanned image) with the digest as a sha-256 hash (Grype also matches by that). The
finding's package is the subcomponent, a purl without version or qualifiers: the digest already pins the version, and
scanners disagree on qualifiers (distro=debian-12 here, debian-12.8 there), while a VEX purl without them matches all.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
from pathlib import Path
from typing import Any, Literal, get_args

# The predicateType cosign gives `attest --type openvex`, and the one `verify-attestation --type openvex` asks for
# (cosign's attestation.OpenVexNamespace); the document itself names the spec version in its @context.
OPENVEX_TYPE = "https://openvex.dev/ns"
CONTEXT = "https://openvex.dev/ns/v0.2.0"
# The spec's status justifications (OPENVEX-SPEC.md, "Status Justifications"): the allowlist's `justification` values.
Justification = Literal["component_not_present", "vulnerable_code_not_present", "vulnerable_code_not_in_execute_path",
                        "vulnerable_code_cannot_be_controlled_by_adversary", "inline_mitigations_already_exist"]
JUSTIFICATIONS: tuple[Justification, ...] = get_args(Justification)
DEFAULT_AUTHOR = "gpuforge cve-gate"
ID_PREFIX = "https://openvex.dev/docs/public/vex-"  # the spec's shared namespace, named by a hash of the content
# A package URL as scanners write it (scanner JSON is not trusted to be one): pkg:TYPE/NAME..., no spaces.
_PURL = re.compile(r"pkg:[A-Za-z][A-Za-z0-9.+-]*/[^\s?#@/][^\s?#]*(?:\?[^\s#]*)?(?:#\S*)?\Z")


def path_beside(verdict: Path) -> Path:
    """Where the document goes: beside the verdict, cve-verdict.json -> cve-verdict.openvex.json."""
    return Path(verdict).with_suffix(".openvex.json")


def image_purl(registry: str, repository: str, digest: str) -> str:
    """The image by digest, as Trivy and Grype name a scanned image.

    >>> image_purl("reg.example:5000", "ml/pytorch", "sha256:" + "a" * 64).replace("a" * 64, "…")
    'pkg:oci/pytorch@sha256:…?repository_url=reg.example:5000/ml/pytorch'
    """
    name = repository.rsplit("/", 1)[-1].lower()
    where = f"{registry}/{repository}" if registry else repository
    return f"pkg:oci/{name}@{digest}?repository_url={where}"


def package_purl(purl: str | None) -> str | None:
    """The package of a finding's purl, without version, qualifiers or subpath; None when it is not a purl.

    >>> package_purl("pkg:deb/debian/libssl3@3.0.15-1~deb12u1?arch=amd64&distro=debian-12")
    'pkg:deb/debian/libssl3'
    >>> package_purl("pkg:pypi/Jinja2@3.1.4")
    'pkg:pypi/jinja2'
    """
    if not purl or len(purl) > 1000 or not _PURL.match(purl):
        return None
    path = purl.split("?", 1)[0].split("#", 1)[0]
    head, _, name = path.rpartition("/")
    name = name.split("@", 1)[0]
    if head == "pkg:pypi":  # purl-spec: PyPI names are lowercased, '_' read as '-'
        name = name.lower().replace("_", "-")
    return f"{head}/{name}" if name else None


def document(verdict: dict[str, Any], *, registry: str, repository: str, author: str = DEFAULT_AUTHOR) -> tuple[dict[str, Any] | None, int]:
    """(the OpenVEX document of `verdict` about its subject digest, allowed findings left out for want of a purl).
    The document is None when the verdict names no digest or states nothing (the spec asks for one statement at least)."""
    digest = (verdict.get("subject") or {}).get("digest")
    if not digest:
        return None, 0
    product = {"@id": image_purl(registry, repository, digest), "hashes": {"sha-256": digest.split(":", 1)[1]}}
    statements, left_out = _statements(verdict, product)
    if not statements:
        return None, left_out
    scanners = ", ".join(f"{s['name']} {s['version']}".strip() for s in verdict.get("scanners", []))
    body = {"@context": CONTEXT, "author": author, "timestamp": verdict["judged_at"], "version": 1,
            "tooling": f"gpuforge cve-gate{f' ({scanners})' if scanners else ''}", "statements": statements}
    doc_id = ID_PREFIX + hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
    return {"@context": CONTEXT, "@id": doc_id, **body}, left_out


def _statements(verdict: dict[str, Any], product: dict[str, Any]) -> tuple[list[dict[str, Any]], int]:
    """One statement per (vulnerability, status, wording); its packages are the subcomponents. An affected
    statement about a finding with no usable purl names the image alone (saying more is affected hides nothing)."""
    today = dt.datetime.fromisoformat(verdict["judged_at"]).date()
    groups: dict[tuple[Any, ...], set[str] | None] = {}
    left_out = 0

    def add(key: tuple[Any, ...], sub: str | None) -> None:
        if key in groups and groups[key] is None:
            return
        groups[key] = None if sub is None else {*(groups.get(key) or set()), sub}

    for f in verdict.get("allowed", []):
        sub, where = package_purl(f.get("purl")), f"CVE allowlist, {f['allowed_by']}"
        fix = f"{f['package']} {f['version']} -> {f['fixed']}"
        if dt.date.fromisoformat(f["review_by"]) < today:
            add((f["id"], "affected", ("action_statement", f"The exception ({where}) expired on {f['review_by']}: "
                                       f"update {fix} and rebuild, or review the exception.")), sub)
        elif f.get("justification"):
            if sub is None:
                left_out += 1
                continue
            add((f["id"], "not_affected", ("justification", f["justification"]),
                 ("impact_statement", f"{f['reason']} ({where}; review by {f['review_by']})")), sub)
        else:
            add((f["id"], "affected", ("action_statement", f"Accepted until {f['review_by']} ({where}): "
                                       f"{f['reason'].rstrip('. ')}. Fix: {fix}.")), sub)
    for f in verdict.get("counted", []):
        add((f["id"], "affected", ("action_statement", f"Update {f['package']} {f['version']} -> {f['fixed']} and "
                                   "rebuild the image.")), package_purl(f.get("purl")))
    out = []
    for key in sorted(groups, key=repr):
        vuln, status, *fields = key
        subs = groups[key]
        prod = {**product, **({"subcomponents": [{"@id": s} for s in sorted(subs)]} if subs else {})}
        out.append({"vulnerability": {"name": vuln}, "products": [prod], "status": status, **dict(fields)})
    return out, left_out
