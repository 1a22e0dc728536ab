"""Validation reports: the JSON the validators write, judged green or red by gpuforge.validate.evidence,
and report.md, written for a person: the verdict, what image on what host, what was proven (by concern,
in words), what skipped and why, what was not checked.

The concern of each validator module is its docstring's first line, and a check's sentence is its
docstring's first sentence or else its name in words: the validators are the one home of what they prove.
"""

from __future__ import annotations

import ast
import collections
import datetime as dt
import functools
import json
import os
import re
import socket
from pathlib import Path
from typing import Any

from gpuforge import __version__, paths
from gpuforge.errors import FatalError, StateError
from gpuforge.state import files
from gpuforge.validate import evidence, selection
from gpuforge.validate.report_model import Report

# The headlines report.md opens with (one of these, after "**Verdict:** ").
GREEN, RED, PARTIAL, NO_GPU = "GREEN", "RED", "PARTIAL", "not promotable to prod: no GPU check"


def read(path: Path) -> Report:
    """A report file (never followed through a symlink) through the report's shape, or one error line naming it."""
    text = files.read_text(path)
    if text is None:
        msg = f"no validation report at {path}; run `gpuforge validate` first"
        raise StateError(msg)
    return Report.from_json(text, str(path))


def load(path: Path) -> dict[str, Any]:
    """A report file as its JSON data, checked through the report's shape (read) on the way: what the test suites
    and report.md read key by key."""
    return read(path).dump()


def is_green(rep: dict[str, Any], *, require_gpu: bool = False) -> bool:
    """Green: complete evidence (gpuforge.validate.evidence.problems finds nothing), judged from the content."""
    return not evidence.problems(rep, require_gpu=require_gpu)


def finish(rep: dict[str, Any], *, required: tuple[str, ...] | None = None, gpu: bool = False, revision: str = "unknown",
           content: dict[str, Any] | None = None, kind: selection.Kind | None = None) -> dict[str, Any]:
    """The report with the host-side facts added: the evidence block (when `required` is given, chosen for `kind`;
    else a host check, never evidence), the verdict, and who made it when (gpuforge version, git revision, machine)."""
    rep = dict(rep)
    if required is not None:
        rep["evidence"] = evidence.stamp(rep, required=required, gpu=gpu, content=content, kind=kind)
        rep["problems"] = evidence.problems(rep)
        rep["green"] = not rep["problems"]
    else:
        rep["green"] = False  # no required set: not evidence
    rep["run"] = {"gpuforge_version": __version__, "revision": revision, "machine": socket.gethostname(),
                  "finished": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")}
    return rep


def to_json(rep: dict[str, Any]) -> str:
    return json.dumps(rep, indent=2, sort_keys=True, default=str) + "\n"


def summarize(md: str) -> None:
    """Append Markdown (report.md, a support table, release notes) to $GITHUB_STEP_SUMMARY when set (an append-only
    file GitHub owns); a file that cannot be written is one StateError line (exit 8), never a traceback."""
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        try:
            with open(summary, "a") as f:
                f.write(md + "\n")
        except OSError as e:
            raise files.error(summary, e) from None


# --- report.md -------------------------------------------------------------------------------------

def verdict(rep: dict[str, Any]) -> str:
    """The headline: GREEN, RED, PARTIAL, or GREEN yet not promotable to prod without a GPU check; a readiness run
    that failed says whom it blames (the node or the image) after it."""
    ready = (rep.get("facts") or {}).get("readiness") or {}
    line = _verdict(rep)
    return f"{line}: {ready['verdict']}" if ready.get("exit") else line


def _verdict(rep: dict[str, Any]) -> str:
    if not rep.get("evidence"):  # a host smoke run: no required set, so never evidence for promotion
        return "PASSED (host check, not evidence)" if _plain_pass(rep) else RED
    probs = evidence.problems(rep)
    if probs:
        return f"{PARTIAL} (never promotes)" if rep["evidence"].get("partial") else RED
    if evidence.problems(rep, require_gpu=True):
        return f"{GREEN} for dev; {NO_GPU}"
    return GREEN


def _plain_pass(rep: dict[str, Any]) -> bool:
    outcomes = [c["outcome"] for c in rep.get("checks", [])]
    return rep.get("exit_status") == 0 and "failed" not in outcomes and "passed" in outcomes


# A docstring's pointer into the issue tracker (a "#" and a number in parentheses, or several): meaningless to the
# person who reads report.md, so the report leaves it out of the words it takes from the validators.
_TRACKER_REF = re.compile(r"\s*\(#\d+(?:\s*[,–-]\s*#?\d+)*\)")


def _words(doc: str) -> str:
    return _TRACKER_REF.sub("", " ".join(doc.split()))


@functools.cache
def _docs() -> dict[str, tuple[str, dict[str, str]]]:
    """module -> (its concern, {check name: sentence}) from the validators' own docstrings."""
    out: dict[str, tuple[str, dict[str, str]]] = {}
    try:
        vdir = paths.validators()
    except FatalError:
        return out
    for f in sorted(vdir.glob("test_*.py")):
        try:
            tree = ast.parse(f.read_text())
        except (OSError, SyntaxError, ValueError):
            continue
        concern = _words((ast.get_docstring(tree) or "").split("\n\n")[0])
        checks = {}
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test_"):
                doc = _words(ast.get_docstring(node) or "")
                checks[node.name] = doc.split(". ")[0].rstrip(".") if doc else ""
        out[f.stem] = (concern, checks)
    return out


def concern(module: str) -> str:
    return _docs().get(module, ("", {}))[0] or module.removeprefix("test_").replace("_", " ")


def sentence(module: str, name: str) -> str:
    base = name.split("[", 1)[0]
    said = _docs().get(module, ("", {}))[1].get(base)
    words = said or base.removeprefix("test_").replace("_", " ")
    return words + (f" ({name[len(base) + 1:-1]})" if "[" in name else "")


def _host(rep: dict[str, Any]) -> str:
    facts = rep.get("facts", {})
    drv = facts.get("driver") or {}
    names = [g.get("name") for g in drv.get("gpus") or [] if g.get("name")] or (facts.get("gpu_count") or {}).get("names") or []
    machine = (rep.get("run") or {}).get("machine") or "?"
    where = f"{rep.get('host') or '?'} on {machine}"
    if not names:
        return f"no GPU ({where})"
    counted = ", ".join(f"{n} x{k}" for n, k in collections.Counter(names).items())
    return f"{counted}, driver {drv.get('driver') or '?'} ({where})"


def _date(rep: dict[str, Any]) -> str:
    finished: str | None = (rep.get("run") or {}).get("finished")  # an ISO time in a report's run
    if finished:
        return finished
    started = rep.get("started")
    if isinstance(started, int | float):
        return dt.datetime.fromtimestamp(started, dt.UTC).isoformat(timespec="seconds")
    return "unknown"


def markdown(rep: dict[str, Any]) -> str:
    """report.md, for a person: the verdict and the run's facts, then what was proven, what failed, what skipped
    and why, what was not checked, and every check in a collapsed table."""
    checks = rep.get("checks", [])
    ev = rep.get("evidence") or {}
    lines = _head(rep)
    probs = rep.get("problems") if ev else None
    if probs:
        lines += ["**Why it is not evidence:**", *[f"- {p}" for p in probs], ""]
    lines += _proven(checks) + _failed(checks) + _skipped(checks) + _not_applicable(rep) + _not_checked(rep)
    lines += ["", "<details><summary>Every check</summary>", "", "| check | result | seconds | note |", "|---|---|---|---|"]
    for c in checks:
        note = (c.get("message") or "").replace("\n", " ").replace("|", "\\|")[:160]
        lines.append(f"| {c['module']}::{c['name']} | {c['outcome']} | {c.get('seconds', 0):.2f} | {note} |")
    lines += ["", "</details>"]
    versions = (rep.get("facts") or {}).get("versions")
    if versions:
        lines += ["", "versions: " + ", ".join(f"{k} {v}" for k, v in sorted(versions.items()))]
    return "\n".join(lines) + "\n"


def _head(rep: dict[str, Any]) -> list[str]:
    """The title, the verdict, and the run's facts: target, image, gpuforge, date, host, counts."""
    checks = rep.get("checks", [])
    count = collections.Counter(c["outcome"] for c in checks)
    facts, ev, run = rep.get("facts", {}), rep.get("evidence") or {}, rep.get("run") or {}
    image = facts.get("image_id") or rep.get("image") or "none (a host was checked)"
    digests = ", ".join(facts.get("repo_digests") or []) or "not pushed yet"
    required = f" ({len(ev.get('required') or [])} required)" if ev else ""
    return [
        f"### gpuforge validation: {rep.get('target')}",
        "",
        f"**Verdict:** {verdict(rep)}",
        "",
        f"- **Target:** {rep.get('target')}",
        f"- **Image:** `{image}` (registry digests: {digests})",
        f"- **gpuforge:** {run.get('gpuforge_version') or ev.get('gpuforge_version') or '?'}, "
        f"git revision {run.get('revision') or 'unknown'}",
        f"- **Date:** {_date(rep)}",
        f"- **Host:** {_host(rep)}",
        f"- **Checks:** {count['passed']} passed, {count['failed']} failed, {count['skipped']} skipped "
        f"of {len(checks)}{required} in {rep.get('seconds', 0):.1f} s",
        "",
    ]


def _proven(checks: list[dict[str, Any]]) -> list[str]:
    """What passed, grouped by concern (a validator module's docstring), one sentence per check."""
    by_module: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for c in checks:
        by_module[c["module"]].append(c)
    lines = ["#### What was proven", ""]
    proven = [(m, cs) for m, cs in by_module.items() if any(c["outcome"] == "passed" for c in cs)]
    for m, cs in proven:
        passed = [c for c in cs if c["outcome"] == "passed"]
        lines.append(f"- **{concern(m)}** ({len(passed)} of {len(cs)} passed)")
        lines += [f"  - {sentence(m, c['name'])}" for c in passed]
    if not proven:
        lines.append("- nothing: no check passed")
    return lines


def _failed(checks: list[dict[str, Any]]) -> list[str]:
    failed = [c for c in checks if c["outcome"] == "failed"]
    if not failed:
        return []
    return ["", "#### What failed", "", *[f"- {concern(c['module'])}: {sentence(c['module'], c['name'])}: "
                                         f"{' '.join((c.get('message') or '').split())[:200]}" for c in failed]]


def _skipped(checks: list[dict[str, Any]]) -> list[str]:
    """What skipped, counted per reason, with the modules each reason skipped in."""
    skipped = collections.Counter(evidence.skip_reason(c) or "no reason given" for c in checks if c["outcome"] == "skipped")
    lines = ["", "#### What was skipped, and why", ""]
    for why, n in skipped.most_common():
        mods = sorted({c["module"] for c in checks if c["outcome"] == "skipped"
                       and (evidence.skip_reason(c) or "no reason given") == why})
        lines.append(f"- {n} x {why} ({', '.join(mods)})")
    return lines if skipped else [*lines, "- nothing skipped"]


def _not_applicable(rep: dict[str, Any]) -> list[str]:
    """The validators this image's kind does not call for (never run, never skipped): one line per reason, with
    their modules."""
    sel = rep.get("selection") or {}
    na = sel.get("not_applicable") or []
    if not na:
        return []
    kind = sel.get("kind") or {}
    label = selection.Kind(kind.get("flavor"), kind.get("source"), bool(kind.get("gpu"))).label() if kind else "?"
    groups: dict[str, list[str]] = collections.defaultdict(list)
    for n in na:
        groups[n["why"]].append(n["id"].split("::", 1)[0].removesuffix(".py"))
    lines = ["", f"#### Not applicable to this image ({label})", ""]
    for why, mods in sorted(groups.items(), key=lambda g: (-len(g[1]), g[0])):
        lines.append(f"- {len(mods)} x {why} ({', '.join(sorted(set(mods)))})")
    return lines


def _not_checked(rep: dict[str, Any]) -> list[str]:
    """What the run did not prove: the GPU, required checks not run, deselected ones, or (a host) the image at all."""
    checks, ev = rep.get("checks", []), rep.get("evidence") or {}
    out = []
    if ev and evidence.problems(rep, require_gpu=True) and not any(
            c["outcome"] == "passed" and c["module"] == "test_gpu_smoke" for c in checks):
        out.append("the GPU: no GPU check ran (`gpuforge validate --gpu` on a GPU runner); prod needs one")
    if ev.get("missing"):
        out.append(f"{len(ev['missing'])} required check(s) not run: " + ", ".join(ev["missing"][:10])
                   + (", ..." if len(ev["missing"]) > 10 else ""))
    deselected = (rep.get("selection") or {}).get("deselected") or []
    if deselected:
        out.append(f"{len(deselected)} check(s) deselected by the run's arguments")
    if not ev:
        out.append("the image as evidence: a host check has no required set and never promotes")
    return ["", "#### What was not checked", "", *([f"- {n}" for n in out] or ["- nothing: every required check ran"])]
