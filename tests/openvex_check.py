"""The OpenVEX checks the tests pin: the JSON schema openvex/spec publishes for v0.2.0, with its formats enforced, and
the per-status rules of openvex/go-vex's Statement.Validate (the library Trivy and Grype read OpenVEX with).

The schema is tests/unit/fixtures/cve/openvex_json_schema_0.2.0.json, a verbatim copy of openvex_json_schema.json
from github.com/openvex/spec at commit d29fab0c81cfea04159436d54c3edc32947039ac (the file last changed in a68ccd19;
CC0-1.0; sha256 below). jsonschema checks no `date-time`, `uri` or `iri` format without optional packages, so the
three are checked here: RFC 3339 date-times, and absolute IRIs (a scheme, no spaces).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
from pathlib import Path

import jsonschema

SCHEMA_PATH = Path(__file__).parent / "unit" / "fixtures" / "cve" / "openvex_json_schema_0.2.0.json"
SCHEMA_SHA256 = "9373597734ed1d3ea5161a8b46d3866c4a8cfe76fd632fdd16aef01fb34b3238"
_FORMATS = jsonschema.FormatChecker()
_RFC3339 = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)\Z")
_IRI = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:\S+\Z")


@_FORMATS.checks("date-time", raises=ValueError)
def _date_time(value: object) -> bool:
    if not isinstance(value, str) or not _RFC3339.match(value):
        return False
    dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    return True


@_FORMATS.checks("iri", raises=())
@_FORMATS.checks("uri", raises=())
def _iri(value: object) -> bool:
    return not isinstance(value, str) or bool(_IRI.match(value))


def schema() -> dict:
    data = SCHEMA_PATH.read_bytes()
    assert hashlib.sha256(data).hexdigest() == SCHEMA_SHA256, f"{SCHEMA_PATH} is not the pinned copy"
    return json.loads(data)


# go-vex pkg/vex/statement.go, Statement.Validate: the fields a status may not carry.
_NOT_WITH = {"not_affected": ("action_statement",), "affected": ("justification", "impact_statement"),
             "under_investigation": ("justification", "impact_statement", "action_statement"),
             "fixed": ("justification", "impact_statement", "action_statement")}


def problems(doc: dict) -> list[str]:
    """Why `doc` is not a valid OpenVEX v0.2.0 document ([] when it is)."""
    v = jsonschema.Draft202012Validator(schema(), format_checker=_FORMATS)
    out = [f"{'/'.join(map(str, e.absolute_path)) or '(document)'}: {e.message}" for e in v.iter_errors(doc)]
    for i, s in enumerate(doc.get("statements") or []):
        out += [f"statements/{i}: {f} with status {s.get('status')}" for f in _NOT_WITH.get(s.get("status"), ()) if f in s]
    return out
