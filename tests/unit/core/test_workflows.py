"""The workflow lint of `nox -s lint` (check-jsonschema's GitHub schema + zizmor --offline): the shipped
workflows are clean, a fixture with nine planted bugs reports each of them, a malformed one fails the schema."""

from __future__ import annotations

import re

import yaml

import workflows
from conftest import ROOT

FIXTURE = ROOT / "tests" / "unit" / "fixtures" / "planted-workflow.yml"
PLANTED = {"dangerous-triggers", "excessive-permissions", "insecure-commands", "hardcoded-container-credentials",
           "unpinned-uses", "artipacked", "template-injection", "github-env", "secrets-inherit"}


def test_shipped_workflows_are_clean():
    files = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
    assert {f.name for f in files} >= {"ci.yml", "images.yml"}
    assert workflows.problems(files) == []


def test_shipped_actions_are_pinned_to_commits_without_persisted_credentials():
    for f in (ROOT / ".github" / "workflows").glob("*.yml"):
        text = f.read_text()
        uses = re.findall(r"uses: (\S+)", text)
        assert uses and all(re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}", u) for u in uses), uses
        assert text.count("persist-credentials: false") == text.count("actions/checkout@"), f.name


def test_nine_planted_bugs_are_each_reported():
    found = workflows.problems([FIXTURE])
    rules = {line.split(": zizmor: ")[1].split(":")[0] for line in found if ": zizmor: " in line}
    assert PLANTED <= rules, f"missed: {PLANTED - rules}"
    lines = {int(line.split(":")[1]) for line in found if ": template-injection:" in line}
    assert lines == {18}, found  # the `${{ github.event.pull_request.title }}` line


def test_malformed_workflow_fails_the_schema(tmp_path):
    f = tmp_path / "bad.yml"
    f.write_text("name: bad\non: push\njobs:\n  a:\n    steps:\n      - run: echo hi\n")
    assert workflows.problems([f]) == [f"{f}: schema: $.jobs.a: 'runs-on' is a required property"]


def test_images_workflow_runs_on_gpu_runners_and_guards_prod():
    text = (ROOT / ".github" / "workflows" / "images.yml").read_text()
    assert "runs-on: [self-hosted, linux, x64, gpu]" in text
    assert "environment: prod" in text and "--gpu" in text and "nox -s matrix -- --json" in text
    assert "if: always()" in text and "nox -s clean" in text
    assert "${{ inputs.selectors }}" not in text.split("SELECTORS: ")[0]  # only ever through the environment


def _build_step() -> dict:
    doc = yaml.safe_load((ROOT / ".github" / "workflows" / "images.yml").read_text())
    steps = [s for s in doc["jobs"]["image"]["steps"] if "nox -s build" in s.get("run", "")]
    assert len(steps) == 1, steps
    return steps[0]


def test_images_build_step_takes_no_layers_from_a_movable_registry_tag():
    """A --cache-from a registry tag would let whoever can push that tag put layers into a build this workflow
    then validates, signs and promotes: the self-hosted build uses only the runner's own build cache."""
    step = _build_step()
    assert "${{" not in step["run"]
    assert "--cache-from" not in step["run"] and "cache-from" not in str(step.get("with", ""))
