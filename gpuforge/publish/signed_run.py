"""`gpuforge validate --attest`: validate pushed targets and sign each run's result onto the pushed digest
in the same process, from the report as this run holds it (gpuforge.validate.pytest_run's `on_report`),
before any copy of it reaches reports/. Green, red and partial runs are all signed: the newest signed
statement on a digest decides promotion, so a red run after a green one blocks it.

The run must know the digest it proves, so it validates after `gpuforge push` (it refuses otherwise) and
checks first that the registry's manifest at that digest is the very image it is about to validate.
"""

from __future__ import annotations

import datetime as dt
import tempfile
from pathlib import Path

from gpuforge.errors import PromotionRefused, RegistryError
from gpuforge.plan.matrix import Target
from gpuforge.publish import runinfo, statements
from gpuforge.registry import attest
from gpuforge.registry.client import Registry
from gpuforge.state.records import Records
from gpuforge.validate import pytest_run
from gpuforge.validate import sbom as cyclonedx
from gpuforge.validate.report_model import Report


def pushed_ref(t: Target, records: Records, signer: attest.Signer) -> str:
    """host/repo@digest of the target's pushed image, checked against the registry before anything runs."""
    rec = records.require_build(t.id)
    if not rec.digest:
        msg = (f"{t.id}: validate --attest signs onto the pushed digest, and {t.id} was never pushed: run "
               f"`gpuforge push {t.id}` first")
        raise PromotionRefused(msg)
    pushed = t.ref
    m = Registry(signer.auth).manifest(pushed.pinned(rec.digest))
    if m is None or not m.holds(rec.image_id):  # config digest (graphdriver) or the digest itself (containerd)
        msg = (f"{t.id}: the registry's {rec.digest} is {'missing' if m is None else 'another image'}, not the "
               f"built image {rec.image_id[:19]}; push it again")
        raise RegistryError(msg)
    return str(pushed.pinned(rec.digest))


def statement(rep: dict | Report, ref: str) -> dict:
    """The validation predicate: the run's report plus who signed it, and that it was signed in the run (checked
    against the report's shape before it is signed, so promotion can read what was signed)."""
    report = Report.of(rep, "the report to sign")
    info = runinfo.current().model_dump(mode="json")
    run = {**(report.run.model_dump(exclude_unset=True) if report.run else {}), **info, "signed_in_run": True,
           "subject": ref, "signed_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")}
    return Report.of({**report.dump(), "run": run}, "the statement to sign").dump()


def sign_report(ref: str, rep: dict | Report, *, signer: attest.Signer, target: Target, inventory: dict | None = None,
                os_name: str = "") -> None:
    """Sign one run's report onto `ref`, as gpuforge's predicate and as an in-toto Test Result (naming the fleet pools
    of `target` the run's GPU host is a node of), and the image's inventory. The only signing path for evidence."""
    stmt = statement(rep, ref)
    signed = Report.of(stmt)
    at = dt.datetime.fromisoformat(str(signed.run.signed_at)) if signed.run and signed.run.signed_at else None
    results = statements.test_results(signed, ref=ref, target=target, signed_at=at)  # checked before anything is signed
    attest.attest_data(ref, stmt, attest.VALIDATION_TYPE, signer=signer)
    for result in results:
        attest.attest_data(ref, result, statements.TEST_RESULT_TYPE, signer=signer)
    if inventory:
        attest.attest_data(ref, inventory, attest.INVENTORY_TYPE, signer=signer)
        with tempfile.TemporaryDirectory(prefix="gpuforge-sign-") as d:
            cdx = cyclonedx.write(Path(d) / "sbom.cdx.json", target_id=inventory["target"],
                                  image_id=inventory["image_id"], os_name=os_name,
                                  inventory={k: v for k, v in inventory.items() if k not in ("target", "image_id")})
            attest.attest(ref, cdx, "cyclonedx", signer=signer)


def validate_and_attest(targets: list[Target], *, reports: Path, signer: attest.Signer, records: Records,
                        pytest_args: str = "", gpu: bool = False,
                        gpu_request: str = "nvidia", progress_mode: str = "auto") -> int:
    refs = {t.id: pushed_ref(t, records, signer) for t in targets}  # every refusal before the first check runs

    def sign(t: Target, rep: dict, inventory: dict | None) -> None:
        sign_report(refs[t.id], rep, signer=signer, target=t, inventory=inventory if not gpu else None, os_name=t.os)
        verdict = "green" if Report.of(rep).green else "NOT green"
        print(f"gpuforge: signed this run's {'GPU ' if gpu else ''}validation ({verdict}) of {t.id} onto {refs[t.id]}",
              flush=True)

    return pytest_run.validate_targets(targets, reports=reports, records=records, pytest_args=pytest_args, gpu=gpu,
                                       gpu_request=gpu_request, progress_mode=progress_mode, on_report=sign)
