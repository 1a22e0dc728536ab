"""Reads report.md the way a person does: the verdict, the labelled fields, the sections' bullets."""

from __future__ import annotations

import re


def parse(md: str) -> dict:
    """{verdict, target, image, gpuforge, date, host, checks, <section>: [bullets], <section> (items): [sub-bullets]}."""
    out = {"verdict": re.search(r"^\*\*Verdict:\*\* (.+)$", md, re.M)[1]}
    for key in ("Target", "Image", "gpuforge", "Date", "Host", "Checks"):
        out[key.lower()] = re.search(rf"^- \*\*{key}:\*\* (.+)$", md, re.M)[1]
    for section in re.split(r"^#### ", md, flags=re.M)[1:]:
        title, _, body = section.partition("\n")
        out[title.strip()] = [line[2:] for line in body.splitlines() if line.startswith("- ")]
        out[title.strip() + " (items)"] = [line[4:] for line in body.splitlines() if line.startswith("  - ")]
    return out
