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


def test_images_workflow_validates_once_per_fleet_pool_on_its_runners():
    doc = yaml.safe_load((ROOT / ".github" / "workflows" / "images.yml").read_text())
    gpu = doc["jobs"]["gpu"]
    assert gpu["runs-on"] == "${{ matrix.runs_on }}" and gpu["strategy"]["matrix"] == "${{ fromJson(needs.plan.outputs.pools) }}"
    assert any("--gpu" in s.get("run", "") and "validate" in s.get("run", "") for s in gpu["steps"])
    assert any("attest" in s.get("run", "") and "--gpu" in s.get("run", "") for s in gpu["steps"])
    assert "gpu" in doc["jobs"]["prod"]["needs"]
    plan_run = next(s["run"] for s in doc["jobs"]["plan"]["steps"] if s.get("id") == "plan")
    assert "--json --pools $SELECTORS" in plan_run


def test_watch_workflow_is_scheduled_pinned_and_opens_one_pr_per_set_of_findings():
    text = (ROOT / ".github" / "workflows" / "watch.yml").read_text()
    doc = yaml.safe_load(text)
    assert doc[True]["schedule"]  # `on:` is YAML's boolean key
    uses = [s["uses"] for j in doc["jobs"].values() for s in j["steps"] if "uses" in s]
    assert uses and all(re.search(r"@[0-9a-f]{40}$", u) for u in uses)
    run = "\n".join(s.get("run", "") for s in doc["jobs"]["outdated"]["steps"])
    assert "outdated --images --prod --json" in run
    assert 'branch="watch/outdated-$(sha256sum' in run and "gh pr list --state all --head" in run
