"""The workflow check used by `nox -s lint`: shipped workflows pass, broken ones are caught."""

from __future__ import annotations

import workflows
from conftest import ROOT


def test_shipped_workflows_are_clean():
    files = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
    assert {f.name for f in files} >= {"ci.yml", "images.yml"}
    for f in files:
        assert workflows.problems(f) == [], f


def test_images_workflow_runs_on_gpu_runners_and_guards_prod():
    text = (ROOT / ".github" / "workflows" / "images.yml").read_text()
    assert "runs-on: [self-hosted, linux, x64, gpu]" in text
    assert "environment: prod" in text and "--gpu" in text and "nox -s matrix -- --json" in text
    assert "if: always()" in text and "nox -s clean" in text


def test_broken_workflow_is_caught(tmp_path):
    f = tmp_path / "bad.yml"
    f.write_text("name: bad\non: push\njobs:\n  a:\n    needs: [nope]\n    steps:\n      - run: echo ${{ github.sha }\n"
                 "      - name: both\n        run: x\n        uses: y\n")
    probs = "\n".join(workflows.problems(f))
    assert "no runs-on" in probs and "needs unknown job 'nope'" in probs
    assert "unbalanced" in probs and "exactly one of `uses` or `run`" in probs
