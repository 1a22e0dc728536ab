"""`validate --gpu` exits 10 (the node is not fit) only when readiness blames the node and nothing but GPU checks
failed: an image that also failed a check of its own is the image's failure (exit 5), whatever the node is."""

from __future__ import annotations

import pytest

from gpuforge.validate.pytest_run import hand_over, node_at_fault
from gpuforge.validate.report_model import Report

UNFIT = {"level": "r2", "verdict": "NODE NOT FIT (host): shm: /dev/shm is 64 MiB", "exit": 10}


def rep(failed_modules: list[str], readiness: dict | None = UNFIT) -> Report:
    checks = [{"id": f"{m}::t", "module": m, "name": "t", "outcome": "failed"} for m in failed_modules]
    checks.append({"id": "test_metadata::t", "module": "test_metadata", "name": "t", "outcome": "passed"})
    return Report.of({"exit_status": 1, "gpu": True, "facts": {"readiness": readiness} if readiness else {},
                      "checks": checks})


@pytest.mark.parametrize("failed", [["test_readiness"], ["test_readiness", "test_gpu_smoke", "test_driver"]])
def test_only_gpu_checks_failed_and_readiness_blames_the_node(failed):
    assert node_at_fault(rep(failed)) == UNFIT["verdict"]


@pytest.mark.parametrize(("failed", "readiness"), [
    (["test_readiness", "test_security"], UNFIT),  # the image failed one of its own too
    (["test_readiness"], {**UNFIT, "exit": 5, "verdict": "IMAGE AT FAULT: require_cuda: ..."}),
    (["test_gpu_smoke"], {**UNFIT, "exit": 0, "verdict": "READY r2: 21 checks passed"}),
    (["test_gpu_smoke"], None),  # no readiness ran
])
def test_anything_else_is_not_the_nodes_fault(failed, readiness):
    assert node_at_fault(rep(failed, readiness)) is None


def test_an_unknown_the_bars_make_block_is_the_nodes_never_the_images():
    """unknown_blocks: true and the kernel log closed: readiness's exit 12 is the node's to answer for (exit 10 here),
    not a failed image."""
    blocked = {"level": "r2", "verdict": "NOT SHOWN FIT (unknown; unknowns block here): xid: ...", "exit": 12}
    assert node_at_fault(rep(["test_readiness"], blocked)) == blocked["verdict"]


class Target:
    id = "pt271-cu126-py311-debian12-runtime-wheels"


def test_an_unfit_nodes_run_is_handed_to_no_signer(capsys):
    """A healthy image validated on a node readiness found unfit: `validate --attest`, `--bundle` and the canary get
    nothing to sign (a red statement would block the image until a green run), and the line says why."""
    signed = []
    node = hand_over(Target(), rep(["test_readiness"]), None, lambda *a: signed.append(a))
    assert node == UNFIT["verdict"] and signed == []
    assert f"this node is not fit ({UNFIT['verdict']}); nothing is signed about the image" in capsys.readouterr().out


@pytest.mark.parametrize("failed", [[], ["test_readiness", "test_security"]])
def test_a_fit_nodes_run_is_signed_green_or_red(failed):
    """The node fit (or the image failed a check of its own): the report goes to the signer, red included."""
    signed = []
    r = rep(failed, {**UNFIT, "exit": 0, "verdict": "READY r2: 21 checks passed"} if not failed else UNFIT)
    assert hand_over(Target(), r, None, lambda *a: signed.append(a)) is None
    assert len(signed) == 1 and signed[0][1] is r
