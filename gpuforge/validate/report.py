"""Validation reports: the JSON the validators write, judged green or red, rendered as Markdown
(next to it, and into $GITHUB_STEP_SUMMARY when set)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from gpuforge.errors import StateError
from gpuforge.validate import evidence


def load(path: Path) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        msg = f"no validation report at {path}; run `gpuforge validate` first"
        raise StateError(msg) from None
    except json.JSONDecodeError as e:
        msg = f"{path}: report is not valid JSON ({e.msg}); re-run validation"
        raise StateError(msg) from None


def is_green(rep: dict, *, require_gpu: bool = False) -> bool:
    """Green: complete evidence (gpuforge.validate.evidence.problems finds nothing), judged from the content."""
    return not evidence.problems(rep, require_gpu=require_gpu)


def markdown(rep: dict) -> str:
    checks = rep.get("checks", [])
    count = {k: sum(c["outcome"] == k for c in checks) for k in ("passed", "failed", "skipped")}
    probs = evidence.problems(rep) if rep.get("evidence") else []
    if rep.get("evidence"):
        verdict = "GREEN" if not probs else ("PARTIAL (never promotes)" if rep["evidence"].get("partial") else "RED")
    else:  # a host smoke run: no required set, so never evidence for promotion
        verdict = "PASSED (host check, not evidence)" if _plain_pass(rep) else "FAILED"
    lines = [
        f"### gpuforge validation: {rep.get('target')} — {verdict}",
        "",
        f"image `{(rep.get('facts', {}).get('image_id') or rep.get('host') or '')[:19]}` on {rep.get('host')}"
        f"{' (GPU)' if rep.get('gpu') else ''}: {count['passed']} passed, {count['failed']} failed, "
        f"{count['skipped']} skipped in {rep.get('seconds', 0):.1f} s",
        "",
        *([f"- {p}" for p in probs] + [""] if probs else []),
        "| check | result | seconds | note |",
        "|---|---|---|---|",
    ]
    for c in checks:
        note = (c.get("message") or "").replace("\n", " ").replace("|", "\\|")[:160]
        lines.append(f"| {c['module']}::{c['name']} | {c['outcome']} | {c['seconds']:.2f} | {note} |")
    versions = rep.get("facts", {}).get("versions")
    if versions:
        lines += ["", "versions: " + ", ".join(f"{k} {v}" for k, v in sorted(versions.items()))]
    return "\n".join(lines) + "\n"


def _plain_pass(rep: dict) -> bool:
    outcomes = [c["outcome"] for c in rep.get("checks", [])]
    return rep.get("exit_status") == 0 and "failed" not in outcomes and "passed" in outcomes


def finish(path: Path, *, required: tuple[str, ...] | None = None, gpu: bool = False) -> str:
    """Add the evidence block (when `required` is given), mark the report green/red, write its
    Markdown beside it and to the step summary."""
    rep = load(path)
    if required is not None:
        rep["evidence"] = evidence.stamp(rep, required=required, gpu=gpu)
        rep["problems"] = evidence.problems(rep)
        rep["green"] = not rep["problems"]
    else:
        rep["green"] = False  # no required set: not evidence
    Path(path).write_text(json.dumps(rep, indent=2, sort_keys=True) + "\n")
    md = markdown(rep)
    Path(path).with_suffix(".md").write_text(md)
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        with open(summary, "a") as f:
            f.write(md + "\n")
    return md
