"""The evidence rules (gpuforge.validate.evidence): what a report must hold before it may promote. Pure logic on
report dicts shaped like the plugin writes them; the required set of each kind is really collected from validators/."""

from __future__ import annotations

import copy
import json

import pytest

from gpuforge.validate import evidence, report
from gpuforge.validate.selection import EnvSkip, Kind

RUNTIME = Kind("runtime", "wheels", gpu=False)
RUNTIME_GPU = Kind("runtime", "wheels", gpu=True)
DEVEL = Kind("devel", "wheels", gpu=False)
REQUIRED = evidence.required_checks(RUNTIME)


def _check(node_id: str, outcome: str = "passed", message: str = "", skip: str | None = None) -> dict:
    module, name = node_id.split("::", 1)
    return {"id": node_id, "module": module.removesuffix(".py"), "name": name, "outcome": outcome, "seconds": 0.1,
            "message": message, **({"skip": skip} if skip else {})}


def _report(kind: Kind = RUNTIME, **overrides) -> dict:
    """A report as the plugin writes it for an image of `kind`: every required check of that kind passed, but the
    CA check, which skips for its typed reason (no build CA given)."""
    required = evidence.required_checks(kind)
    checks = []
    for i in required:
        if i.endswith("test_build_ca_nowhere_in_filesystem"):
            checks.append(_check(i, "skipped", "Skipped: no build CA: the build was given no extra CA bundle",
                                 skip=EnvSkip.NO_BUILD_CA.value))
        else:
            checks.append(_check(i))
    rep = {"exit_status": 0, "gpu": kind.gpu, "checks": checks, "facts": {"image_id": "sha256:" + "a" * 64},
           "selection": {"narrowed": False, "kind": kind.as_dict()}, "started": 1.0}
    rep.update(overrides)
    rep["evidence"] = evidence.stamp(rep, required=required, gpu=kind.gpu, kind=kind)
    return rep


def test_required_set_is_collected_from_the_validators():
    modules = {i.split("::")[0] for i in REQUIRED}
    assert {"test_metadata.py", "test_versions.py", "test_security.py", "test_ssh.py", "test_jupyter.py",
            "test_inventory.py", "test_inductor_cpu.py"} <= modules
    assert "test_versions.py::test_torchaudio" in REQUIRED and len(REQUIRED) >= 60


def test_the_required_set_is_what_applies_to_the_kind():
    """A runtime image is never asked for a devel check, nor a run without GPUs for a GPU check, and the other way
    round: which checks apply is decided by the kind, before anything runs."""
    devel, gpu = evidence.required_checks(DEVEL), evidence.required_checks(RUNTIME_GPU)
    assert "test_devel.py::test_cuda_home_holds_the_toolkit" in devel
    assert "test_devel.py::test_cuda_home_holds_the_toolkit" not in REQUIRED
    assert "test_devel.py::test_runtime_has_no_cuda_compiler" in REQUIRED
    assert "test_devel.py::test_runtime_has_no_cuda_compiler" not in devel
    assert "test_devel.py::test_cuda_base_devel_nvcc_is_the_target_cuda" in evidence.required_checks(
        Kind("devel", "cuda-base", gpu=False))
    assert "test_devel.py::test_cuda_base_devel_nvcc_is_the_target_cuda" not in devel
    assert not [i for i in REQUIRED if i.startswith(("test_gpu_smoke.py", "test_readiness.py"))]
    assert "test_driver.py::test_driver_runs_the_image_cuda" in REQUIRED  # its no-driver skip is typed
    assert {"test_driver.py", "test_gpu_smoke.py", "test_readiness.py"} <= {i.split("::")[0] for i in gpu}
    assert "test_gpu_smoke.py::test_devel_cuda_extension_runs" not in gpu
    assert "test_gpu_smoke.py::test_devel_cuda_extension_runs" in evidence.required_checks(Kind("devel", "wheels", gpu=True))


def test_a_runtime_report_without_the_devel_checks_is_green():
    """The devel checks are not applicable to a runtime image: not required, so their absence is no gap."""
    rep = _report()
    assert not [c for c in rep["checks"] if c["module"] == "test_devel" and c["name"] != "test_runtime_has_no_cuda_compiler"]
    assert evidence.problems(rep) == []


def test_a_devel_report_judged_against_the_runtime_set_is_not_evidence():
    """A report chosen for one kind stamped with another's required set: said, never green."""
    rep = _report(DEVEL)
    rep["selection"]["kind"] = RUNTIME.as_dict()
    assert any("the validators were chosen for" in p for p in evidence.problems(rep))


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


def test_a_chosen_check_skipped_without_a_typed_reason_is_not_green():
    rep = _report()
    c = next(c for c in rep["checks"] if c["name"] == "test_root_login_refused")
    c.update(outcome="skipped", message="Skipped: sshd did not start")
    assert evidence.problems(rep) == [
        "required check test_root_login_refused skipped (sshd did not start; "
        "a chosen check may skip only for a typed environmental reason)"]


@pytest.mark.parametrize("message", [
    "Skipped: a runtime image promises no CUDA toolkit (test_runtime_has_no_cuda_compiler checks that)",
    "Skipped: GPU checks not requested (pass --gpu / --gpuforge-gpu on a GPU runner)",
    "Skipped: no build CA: the build was given no extra CA bundle",  # the typed reason's words, without the type
])
def test_a_skip_reason_s_wording_never_makes_it_allowed(message):
    """Words are not a reason: a chosen devel check of a devel image that skips, whatever it says, refuses."""
    rep = _report(DEVEL)
    c = next(c for c in rep["checks"] if c["name"] == "test_cuda_home_holds_the_toolkit")
    c.update(outcome="skipped", message=message)
    assert [p for p in evidence.problems(rep) if "test_cuda_home_holds_the_toolkit skipped" in p]
    assert not report.is_green(rep)


def test_an_unknown_or_misplaced_typed_reason_is_not_green():
    rep = _report()
    c = next(c for c in rep["checks"] if c["name"] == "test_root_login_refused")
    c.update(outcome="skipped", message="Skipped: whatever", skip="sshd-down")
    assert any("sshd-down is not an allowed skip" in p for p in evidence.problems(rep))
    c.update(skip=EnvSkip.ONE_GPU.value)  # only a GPU run can meet it
    assert any("one-gpu is not an allowed skip" in p for p in evidence.problems(rep))


def test_no_driver_is_allowed_without_gpus_only():
    rep = _report()
    for c in rep["checks"]:
        if c["module"] == "test_driver":
            c.update(outcome="skipped", message="Skipped: no NVIDIA driver visible in a run without GPUs (no libnvidia-ml)",
                     skip=EnvSkip.NO_DRIVER.value)
    assert evidence.problems(rep) == []
    gpu = _report(RUNTIME_GPU)
    c = next(c for c in gpu["checks"] if c["module"] == "test_driver")
    c.update(outcome="skipped", message="Skipped: no NVIDIA driver visible", skip=EnvSkip.NO_DRIVER.value)
    assert any("no-driver is not an allowed skip in this run" in p for p in evidence.problems(gpu))


def test_a_gpu_check_of_a_gpu_run_may_not_skip():
    rep = _report(RUNTIME_GPU)
    assert evidence.problems(rep) == []
    c = next(c for c in rep["checks"] if c["id"].startswith("test_gpu_smoke.py"))
    c.update(outcome="skipped", message="Skipped: GPU checks not requested")
    assert any("may skip only for a typed environmental reason" in p for p in evidence.problems(rep))


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


def test_a_one_gpu_runner_may_skip_the_collectives():
    rep = _report(RUNTIME_GPU)
    multi = [c for c in rep["checks"] if c["name"].startswith("test_multi_gpu_")]
    assert multi, "the smoke suite has multi-GPU checks"
    for c in multi:
        c.update(outcome="skipped", message="Skipped: one GPU: no collective to check (world size 1)",
                 skip=EnvSkip.ONE_GPU.value)
    assert evidence.problems(rep) == []
    multi[0].pop("skip")  # the same words without the type
    assert evidence.problems(rep)


def test_the_validator_set_hash_covers_the_selection_rules(monkeypatch, tmp_path):
    """Other rules for which checks apply (or other skip reasons) are another validator set."""
    from gpuforge.validate import selection

    before = evidence.validator_set_hash()
    changed = tmp_path / "selection.py"
    changed.write_bytes(open(selection.__file__, "rb").read() + b"\n# another rule\n")
    monkeypatch.setattr(selection, "__file__", str(changed))
    assert evidence.validator_set_hash() != before


def test_report_digest_survives_a_go_json_round_trip():
    """cosign re-serialises the predicate in Go: integral floats come back as integers."""
    rep = _report()
    rep["checks"][0]["seconds"] = 0.0
    rep["seconds"] = 12.0
    back = json.loads(json.dumps(rep).replace("0.0,", "0,").replace("12.0", "12"))
    assert evidence.digest_of(back) == evidence.digest_of(rep)
