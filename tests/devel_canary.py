"""The devel image's one full validation is a canary's (one full validation fewer per run).

A canary re-runs every validator on what an environment holds and never reuses evidence by content; the devel image
needs a full validation of its own anyway. So one run proves both: the devel image is pushed to the run's registry,
given a FIXTURE signed statement (the run's default report with the devel image's content facts, labelled inside)
that `validate --attest` shows it would reuse, promoted to dev on that statement, and then `gpuforge canary --env dev`
runs every validator on the digest dev holds. test_registry.py asserts the canary's claims on that run (it did not
reuse what it could have), test_devel_target.py the devel image's (green, the devel checks ran and passed).

Also the helpers test_registry.py signs its other fixtures with (one home for them).
"""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import pytest
import state_here
import steps
from second_engine import matrix_copy

from conftest import KEY_PASSWORD, ROOT, gpuforge
from gpuforge.evidence import reuse, signed_run
from gpuforge.publish import promote
from gpuforge.push import pusher
from gpuforge.validate import evidence, pytest_run
from gpuforge.validate.report_model import Report

DEVEL = ["flavor=devel", "source=wheels"]
REPO = "gpuforge/canary"  # the canary's repository in the run's registry (the devel image and its statements)
SOURCE = "gpuforge/canary-source"  # the same digest again, holding the FIXTURE statement that could be reused


def on_registry(t, registry: str, repo: str):
    """The target as a matrix pointed at `registry`/`repo` loads it."""
    return dataclasses.replace(t, tags=(f"{registry}/{repo}:{t.tag}",), registry=registry, repository=repo)


def set_env(mp: pytest.MonkeyPatch, cosign_keys: dict, user: str, password: str) -> None:
    """The environment a library caller of push, sign and promote has in these tests."""
    mp.setenv("GPUFORGE_REGISTRY_USER", user)
    mp.setenv("GPUFORGE_REGISTRY_PASSWORD", password)
    mp.setenv("GPUFORGE_COSIGN_PUBLIC_KEY", cosign_keys["pub"])
    mp.setenv("COSIGN_PASSWORD", KEY_PASSWORD)
    mp.delenv("GPUFORGE_PROD_REQUIRE_GPU", raising=False)  # prod needs GPU evidence without it


def fixture_rep(base: dict, note: str, image_id: str | None = None, *, origin: str) -> dict:
    """`base` (a run's report) marked as a FIXTURE made by `origin`, optionally for another image id."""
    rep = copy.deepcopy(base)
    rep["facts"]["fixture"] = f"FIXTURE ({origin}): {note}; not a run of this image"
    if image_id:
        rep["facts"]["image_id"] = rep["evidence"]["image_id"] = image_id
    return rep


def sign(t, digest: str, rep: dict, cosign_keys: dict, user: str, password: str) -> None:
    """The one signing path validate --attest uses, for a fixture report."""
    mp = pytest.MonkeyPatch()
    set_env(mp, cosign_keys, user, password)
    try:
        signed_run.sign_report(f"{t.registry}/{t.repository}@{digest}", Report.of(rep),
                               signer=state_here.signer(cosign_keys["key"]), target=t)
    finally:
        mp.undo()


def _reusable_fixture(t, rec: dict, base: dict) -> dict:
    """The run's default report with the devel image's content facts: green, complete, and keyed to the devel image's
    content, so `validate --attest` of the devel image would reuse it (FIXTURE: no validator ran for it)."""
    import docker

    image = docker.from_env().images.get(rec["image_id"])
    facts = evidence.content(image, inputs=evidence.run_inputs(pytest_run.rendered_target_json(t), rec.get("extra_ca")))
    rep = fixture_rep(base, "the default image's checks with the devel image's content facts, so that validate --attest "
                      "would reuse them and the canary must not", rec["image_id"], origin="tests/devel_canary.py")
    rep.update(target=t.id, image=rec["image_id"])
    rep["facts"]["target_id"] = t.id
    rep["evidence"].update(facts)
    rep.pop("run", None)
    assert not evidence.problems(rep), evidence.problems(rep)
    return rep


def run(devel, rec: dict, validated: dict, cosign_keys: dict, here: Path, user: str, password: str) -> dict:
    """Push, FIXTURE-sign, show reusable, promote to dev, then `canary --env dev`: what both modules assert on."""
    host = validated["registry"]
    t = on_registry(devel, host, REPO)
    matrix = matrix_copy(ROOT, here / "matrix-canary.yaml", host, REPO)
    env = {"GPUFORGE_REGISTRY_USER": user, "GPUFORGE_REGISTRY_PASSWORD": password, "COSIGN_PASSWORD": KEY_PASSWORD}
    mp = pytest.MonkeyPatch()
    set_env(mp, cosign_keys, user, password)
    try:
        # the FIXTURE on a copy of these bytes (reuse is of another digest or repository holding the same content)
        source = on_registry(devel, host, SOURCE)
        with steps.step("the devel image pushed for the canary"):
            [first] = pusher.push_targets([source], **state_here.push_kw())
            [pushed] = pusher.push_targets([t], **state_here.push_kw())  # its layers are there: mounted
        digest = pushed["digest"]
        assert first["digest"] == digest, (first, pushed)
        ref = f"{host}/{REPO}@{digest}"
        base = json.loads((validated["reports"] / validated["target"].id / "report.json").read_text())
        fixture = _reusable_fixture(t, rec, base)
        sign(source, digest, fixture, cosign_keys, user, password)
        reuse.remember(state_here.records.state_dir(), f"{host}/{SOURCE}@{digest}", reuse.key_of(Report.of(fixture)))
        # reusable indeed: validate --attest reuses it (and signs the reuse onto the digest, which promotion reads)
        attest = gpuforge("--matrix", str(matrix), "validate", *DEVEL, "--attest", "--registry", host, "--sign-key",
                          cosign_keys["key"], "--key", cosign_keys["pub"], "--reports", str(here / "reuse"), env=env)
        assert attest.returncode == 0 and "gpuforge: reused: the image checks" in attest.stdout, (
            attest.stdout[-3000:] + attest.stderr[-2000:])  # else it validated: the FIXTURE proves nothing to reuse
        [promoted] = promote.promote_targets([t], env="dev", **state_here.promote_kw(cosign_keys["key"]))
        assert promoted["digest"] == digest, promoted
    finally:
        mp.undo()
    # as a CI job runs it: every target of the matrix (only the devel image is in dev), the public key in reach
    with steps.step("the canary's validation of the devel image (its one full validation)"):
        r = gpuforge("--matrix", str(matrix), "canary", "--env", "dev", "--sign-key", cosign_keys["key"],
                     "--reports", str(here / "canary"), env={**env, "GPUFORGE_COSIGN_PUBLIC_KEY": cosign_keys["pub"]})
    return {"target": t.id, "digest": digest, "ref": ref, "matrix": str(matrix), "rc": r.returncode,
            "stdout": r.stdout, "stderr": r.stderr, "attest_stdout": attest.stdout,
            "report": str(here / "canary" / "canary-dev" / t.id / "report.json")}
