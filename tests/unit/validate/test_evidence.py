"""The evidence rules (gpuforge.validate.evidence): what a report must hold before it may promote. Pure logic on
report dicts shaped like the plugin writes them; the required set is really collected from validators/."""

from __future__ import annotations

import copy
import json

import pytest

from gpuforge.validate import evidence, report

REQUIRED = evidence.required_checks(gpu=False)


def _check(node_id: str, outcome: str = "passed", message: str = "") -> dict:
    module, name = node_id.split("::", 1)
    return {"id": node_id, "module": module.removesuffix(".py"), "name": name, "outcome": outcome, "seconds": 0.1,
            "message": message}


def _report(gpu: bool = False, **overrides) -> dict:
    checks = []
    for i in REQUIRED:
        if not gpu and i.startswith(("test_driver.py", "test_gpu_smoke.py")):
            checks.append(_check(i, "skipped", "Skipped: GPU checks not requested (pass --gpu / --gpuforge-gpu on a GPU runner)"))
        elif i.endswith("test_build_ca_nowhere_in_filesystem"):
            checks.append(_check(i, "skipped", "Skipped: no --gpuforge-ca given: the build used no extra CA bundle"))
        else:
            checks.append(_check(i))
    rep = {"exit_status": 0, "gpu": gpu, "checks": checks, "facts": {"image_id": "sha256:" + "a" * 64},
           "selection": {"narrowed": False}, "started": 1.0}
    rep.update(overrides)
    rep["evidence"] = evidence.stamp(rep, required=REQUIRED, gpu=gpu)
    return rep


def test_required_set_is_collected_from_the_validators():
    modules = {i.split("::")[0] for i in REQUIRED}
    assert {"test_metadata.py", "test_versions.py", "test_security.py", "test_ssh.py", "test_jupyter.py",
            "test_inventory.py", "test_inductor_cpu.py", "test_driver.py", "test_gpu_smoke.py"} <= modules
    assert "test_versions.py::test_torchaudio" in REQUIRED and len(REQUIRED) >= 60


def test_a_complete_green_report_has_no_problems():
    rep = _report()
    assert evidence.problems(rep) == [] and report.is_green(rep)
    assert rep["evidence"]["validator_set"] == evidence.validator_set_hash()
    assert rep["evidence"]["image_id"] == rep["facts"]["image_id"]


def test_a_subset_run_is_partial():
    rep = _report()
    rep["checks"] = [c for c in rep["checks"] if c["name"] == "test_torch"]
    rep["evidence"] = evidence.stamp(rep, required=REQUIRED, gpu=False)
    assert rep["evidence"]["partial"]
    [why] = evidence.problems(rep)
    assert "it is partial" in why and "never promotes" in why


def test_a_narrowed_selection_is_partial_even_if_nothing_is_missing():
    rep = _report(selection={"narrowed": True, "keyword": "torch or not torch"})
    assert any("partial" in p for p in evidence.problems(rep))


def test_a_required_check_skipped_for_an_unlisted_reason_is_not_green():
    rep = _report()
    c = next(c for c in rep["checks"] if c["name"] == "test_root_login_refused")
    c.update(outcome="skipped", message="Skipped: sshd did not start")
    assert evidence.problems(rep) == [
        "required check test_root_login_refused skipped (sshd did not start; reason not on the reviewed list)"]


def test_no_gpu_skips_never_count_under_gpu():
    rep = _report(gpu=True)
    assert evidence.problems(rep) == []
    c = next(c for c in rep["checks"] if c["id"].startswith("test_gpu_smoke.py"))
    c.update(outcome="skipped", message="Skipped: GPU checks not requested")
    assert any("not an allowed skip in a GPU run" in p for p in evidence.problems(rep))


def test_a_non_gpu_report_does_not_satisfy_require_gpu():
    rep = _report()
    assert evidence.problems(rep, require_gpu=True) == [
        "it is not a GPU report (run `gpuforge validate --gpu` on a GPU runner)"]
    rep["gpu"] = True  # a hand-edited flag: the evidence block still says the run did not require GPU checks
    assert evidence.problems(rep, require_gpu=True)


@pytest.mark.parametrize(("change", "words"), [
    (lambda r: r.update(exit_status=1), "pytest exited 1"),
    (lambda r: r["checks"][0].update(outcome="failed"), "failed: "),
    (lambda r: r.pop("evidence"), "no evidence block"),
    (lambda r: r["evidence"].update(required=[]), "names no required checks"),
])
def test_red_reports(change, words):
    rep = _report()
    change(rep)
    assert any(words in p for p in evidence.problems(rep)), evidence.problems(rep)
    assert not report.is_green(rep)


def test_the_green_field_is_never_trusted():
    rep = _report()
    rep["checks"][0]["outcome"] = "failed"
    rep["green"] = True
    assert not report.is_green(rep)


def test_report_digest_changes_with_any_edit():
    rep = _report()
    edited = copy.deepcopy(rep)
    edited["facts"]["versions"] = {"torch": "2.7.1+cu999"}
    assert evidence.digest_of(rep) == evidence.digest_of(copy.deepcopy(rep))
    assert evidence.digest_of(rep) != evidence.digest_of(edited)


def test_a_one_gpu_runner_may_skip_the_collectives_only():
    rep = _report(gpu=True)
    multi = [c for c in rep["checks"] if c["name"].startswith("test_multi_gpu_")]
    assert multi, "the smoke suite has multi-GPU checks"
    for c in multi:
        c.update(outcome="skipped", message="Skipped: world size 1: one GPU visible, no collective to check")
    assert evidence.problems(rep) == []
    single = next(c for c in rep["checks"] if c["name"] == "test_cuda_available")
    single.update(outcome="skipped", message="Skipped: world size 1: one GPU visible, no collective to check")
    assert evidence.problems(rep)


def test_report_digest_survives_a_go_json_round_trip():
    """cosign re-serialises the predicate in Go: integral floats come back as integers."""
    rep = _report()
    rep["checks"][0]["seconds"] = 0.0
    rep["seconds"] = 12.0
    back = json.loads(json.dumps(rep).replace("0.0,", "0,").replace("12.0", "12"))
    assert evidence.digest_of(back) == evidence.digest_of(rep)
