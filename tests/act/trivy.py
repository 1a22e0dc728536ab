"""STAND-IN for the `trivy` command (tests/act/actions/setup-trivy): Trivy's release and vulnerability database
cannot be downloaded here. It answers the two calls gpuforge's workflows make, in Trivy's JSON shapes (as
tests/unit/fixtures/cve/make_fixtures.py writes them from Trivy's golden files):

  trivy sbom --format json --list-all-pkgs --output OUT SBOM   every component of the CycloneDX SBOM as a package
                                                              (deb purls: os-pkgs, the rest: lang-pkgs), no findings
  trivy version --format json                                 the version setup-trivy asked for; a database updated
                                                              an hour ago

Anything else exits 2, as a real Trivy refuses an unknown flag."""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
from pathlib import Path


def _sbom(args: list[str]) -> int:
    want = {"--format": "json", "--list-all-pkgs": None}
    out, rest, i = None, [], 0
    while i < len(args):
        a = args[i]
        if a == "--output":
            out, i = args[i + 1], i + 2
        elif a == "--format" and args[i + 1] == want["--format"]:
            i += 2
        elif a == "--list-all-pkgs":
            i += 1
        elif a.startswith("-"):
            print(f"trivy stand-in: unknown flag {a}", file=sys.stderr)
            return 2
        else:
            rest, i = [*rest, a], i + 1
    if out is None or len(rest) != 1:
        print("trivy stand-in: sbom needs --output FILE and one SBOM", file=sys.stderr)
        return 2
    doc = json.loads(Path(rest[0]).read_text())
    os_pkgs, lang_pkgs = [], []
    for c in doc.get("components", []):
        if not c.get("purl"):
            continue
        pkg = {"ID": f"{c['name']}@{c['version']}", "Name": c["name"], "Version": c["version"],
               "Identifier": {"PURL": c["purl"]}}
        (os_pkgs if c["purl"].startswith("pkg:deb/") else lang_pkgs).append(pkg)
    name = Path(rest[0]).name
    report = {"SchemaVersion": 2, "CreatedAt": dt.datetime.now(dt.UTC).isoformat(), "ArtifactName": name,
              "ArtifactType": "cyclonedx", "Metadata": {"OS": {"Family": "debian", "Name": "12"}},
              "Results": [{"Target": f"{name} (debian 12)", "Class": "os-pkgs", "Type": "debian", "Packages": os_pkgs},
                          {"Target": "Python", "Class": "lang-pkgs", "Type": "python-pkg", "Packages": lang_pkgs}]}
    Path(out).write_text(json.dumps(report, indent=1) + "\n")
    return 0


def _version(args: list[str]) -> int:
    if args != ["--format", "json"]:
        print(f"trivy stand-in: version takes --format json, got {args}", file=sys.stderr)
        return 2
    now = dt.datetime.now(dt.UTC)
    print(json.dumps({"Version": os.environ.get("TRIVY_STANDIN_VERSION", "0.57.0"),
                      "VulnerabilityDB": {"Version": 2, "UpdatedAt": (now - dt.timedelta(hours=1)).isoformat(),
                                          "NextUpdate": (now + dt.timedelta(hours=11)).isoformat(),
                                          "DownloadedAt": now.isoformat()}}))
    return 0


if __name__ == "__main__":
    cmd, *rest = sys.argv[1:] or [""]
    sys.exit({"sbom": _sbom, "version": _version}.get(cmd, lambda _: 2)(rest))
