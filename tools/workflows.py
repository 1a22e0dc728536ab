"""A structural check of GitHub Actions workflow files (no actionlint wheel is available here).

Catches what breaks a workflow at load time: missing `on`/`jobs`, jobs without `runs-on`, steps with
neither or both of `uses`/`run`, `needs` naming no job, unbalanced `${{ }}` expressions, unknown keys.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

JOB_KEYS = {"name", "runs-on", "needs", "if", "steps", "env", "environment", "concurrency", "timeout-minutes",
            "strategy", "outputs", "permissions", "defaults", "continue-on-error", "container", "services", "uses",
            "with", "secrets"}
STEP_KEYS = {"name", "id", "if", "uses", "run", "with", "env", "shell", "working-directory", "continue-on-error",
             "timeout-minutes"}
TOP_KEYS = {"name", "on", "jobs", "env", "concurrency", "permissions", "defaults", "run-name"}


def problems(path: Path) -> list[str]:
    text = path.read_text()
    try:
        wf = yaml.safe_load(text)
    except yaml.YAMLError as e:
        return [f"{path}: not valid YAML: {e}"]
    out: list[str] = []
    if not isinstance(wf, dict):
        return [f"{path}: a workflow must be a mapping"]
    if True in wf:  # PyYAML reads the bare key `on` as boolean True
        wf["on"] = wf.pop(True)
    out += [f"{path}: unknown top-level key {k!r}" for k in wf if k not in TOP_KEYS]
    if "on" not in wf:
        out.append(f"{path}: no `on:` trigger")
    jobs = wf.get("jobs") or {}
    if not jobs:
        out.append(f"{path}: no jobs")
    for name, job in jobs.items():
        where = f"{path}: jobs.{name}"
        out += [f"{where}: unknown key {k!r}" for k in job if k not in JOB_KEYS]
        if "uses" not in job and "runs-on" not in job:
            out.append(f"{where}: no runs-on")
        needs = job.get("needs", [])
        for n in [needs] if isinstance(needs, str) else needs:
            if n not in jobs:
                out.append(f"{where}: needs unknown job {n!r}")
        for i, step in enumerate(job.get("steps", [])):
            s = f"{where}.steps[{i}]"
            out += [f"{s}: unknown key {k!r}" for k in step if k not in STEP_KEYS]
            if ("uses" in step) == ("run" in step):
                out.append(f"{s}: needs exactly one of `uses` or `run`")
    for n, line in enumerate(text.splitlines(), 1):
        if line.count("${{") != line.count("}}"):
            out.append(f"{path}:{n}: unbalanced ${{{{ }}}} expression")
        for expr in re.findall(r"\$\{\{(.*?)\}\}", line):
            if not expr.strip():
                out.append(f"{path}:{n}: empty expression")
    return out
