"""`gpuforge validate --attest`: validate pushed targets and sign each run's result onto the pushed digest
in the same process, from the report as this run holds it (gpuforge.validate.pytest_run's `on_report`),
before any copy of it reaches reports/. Green, red and partial runs are all signed: the newest signed
statement on a digest decides promotion, so a red run after a green one blocks it.

The run must know the digest it proves, so it validates after `gpuforge push` (it refuses otherwise) and
checks first that the registry's manifest at that digest is the very image it is about to validate.

One path builds what is signed (`to_sign`, through `sign_report`); it goes onto the registry as it is signed, or, on a
GPU runner with no registry (`validate --gpu --bundle FILE`), into a bundle file signed offline, which `gpuforge
attach` checks and attaches on a machine that reaches the registry (gpuforge.evidence.bundle, gpuforge.evidence.attach).
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import docker.errors

from gpuforge.engine import client as engine
from gpuforge.errors import PromotionRefused, RegistryError
from gpuforge.evidence import age, bundle, reuse, runinfo, statements
from gpuforge.plan.target import Target
from gpuforge.registry import attest
from gpuforge.registry.client import Registry
from gpuforge.state import files
from gpuforge.state.records import Records
from gpuforge.validate import evidence, pytest_run, report
from gpuforge.validate import sbom as cyclonedx
from gpuforge.validate.report_model import Report


def _pushed_digest(t: Target, records: Records, how: str) -> str:
    """The digest the target's build record says it was pushed as; refused when it was never pushed."""
    rec = records.require_build(t.id)
    if not rec.digest:
        msg = (f"{t.id}: {how} signs about the pushed digest, and {t.id} was never pushed: run "
               f"`gpuforge push {t.id}` first")
        raise PromotionRefused(msg)
    return rec.digest


def recorded_ref(t: Target, records: Records, *, how: str = "validate --attest") -> str:
    """host/repo@digest of the target's pushed image as its build record names it (no registry is asked)."""
    return str(t.ref.pinned(_pushed_digest(t, records, how)))


def pushed_ref(t: Target, records: Records, signer: attest.Signer) -> str:
    """host/repo@digest of the target's pushed image, checked against the registry before anything runs."""
    digest = _pushed_digest(t, records, "validate --attest")
    rec = records.require_build(t.id)
    pushed = t.ref
    m = Registry(signer.auth).manifest(pushed.pinned(digest))
    if m is None or not m.holds(rec.image_id):  # config digest (graphdriver) or the digest itself (containerd)
        msg = (f"{t.id}: the registry's {digest} is {'missing' if m is None else 'another image'}, not the "
               f"built image {rec.image_id[:19]}; push it again")
        raise RegistryError(msg)
    return str(pushed.pinned(digest))


def statement(rep: Report, ref: str, *, offline: bool = False) -> Report:
    """The validation predicate: the run's report plus who signed it, and that it was signed in the run (checked
    against the report's shape before it is signed, so promotion can read what was signed). `offline`: signed into a
    bundle, to be attached later (`run.signed_offline`)."""
    info = runinfo.current().model_dump(mode="json")
    run = {**(rep.run.model_dump(exclude_unset=True) if rep.run else {}), **info, "signed_in_run": True,
           "subject": ref, "signed_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
           **({"signed_offline": True} if offline else {})}
    return Report.of({**rep.dump(), "run": run}, "the statement to sign")


@dataclass(frozen=True)
class ToSign:
    """One statement a run signs about its digest: the predicate type and the predicate."""

    type_uri: str
    predicate: dict[str, Any]


class Delivery(Protocol):
    """Where signed statements go: onto the registry (`onto_registry`), or into a bundle file
    (gpuforge.evidence.bundle.Collector), to be attached on a machine that reaches the registry."""

    def __call__(self, ref: str, item: ToSign) -> None: ...


def onto_registry(signer: attest.Signer) -> Delivery:
    """Sign each statement onto `ref` with cosign attest, as it comes."""
    def deliver(ref: str, item: ToSign) -> None:
        attest.attest_data(ref, item.predicate, item.type_uri, signer=signer)
    return deliver


def to_sign(ref: str, rep: Report, *, target: Target, inventory: dict[str, Any] | None = None, os_name: str = "",
            offline: bool = False) -> list[ToSign]:
    """What one run's report makes about `ref`, each checked before anything is signed, in the order they are signed:
    gpuforge's predicate, an in-toto Test Result per fleet pool of `target` the run's GPU host is a node of, and the
    image's inventory with its CycloneDX SBOM. The one place that builds the statements evidence is signed as."""
    stmt = statement(rep, ref, offline=offline)
    # when the checks ran: a reuse's statements carry its source's time, so an admission policy's cut-off sees
    # the evidence's real age (Report.validated_at)
    at = age.signed_time(stmt.validated_at())
    out = [ToSign(type_uri=attest.VALIDATION_TYPE, predicate=stmt.dump())]
    out += [ToSign(type_uri=statements.TEST_RESULT_TYPE, predicate=r)
            for r in statements.test_results(stmt, ref=ref, target=target, signed_at=at)]
    if inventory:
        out.append(ToSign(type_uri=attest.INVENTORY_TYPE, predicate=inventory))
        bom = cyclonedx.bom(target_id=inventory["target"], image_id=inventory["image_id"], os_name=os_name,
                            inventory={k: v for k, v in inventory.items() if k not in ("target", "image_id")})
        out.append(ToSign(type_uri="cyclonedx", predicate=json.loads(cyclonedx.to_json(bom))))
    return out


def sign_report(ref: str, rep: Report, *, signer: attest.Signer, target: Target, inventory: dict[str, Any] | None = None,
                os_name: str = "", deliver: Delivery | None = None) -> list[ToSign]:
    """Sign one run's report onto `ref` (to_sign's statements), or, with `deliver`, hand them there (a bundle). The only
    signing path for evidence. Returns what was signed."""
    items = to_sign(ref, rep, target=target, inventory=inventory, os_name=os_name, offline=deliver is not None)
    send = deliver or onto_registry(signer)
    for item in items:
        send(ref, item)
    return items


def validate_and_attest(targets: list[Target], *, reports: Path, signer: attest.Signer, records: Records,
                        pytest_args: str = "", gpu: bool = False, gpu_request: str = "nvidia", progress_mode: str = "auto",
                        verifier: attest.Verifier | None = None, reuse_evidence: bool = True,
                        reuse_from: tuple[str, ...] = ()) -> int:
    refs = {t.id: pushed_ref(t, records, signer) for t in targets}  # every refusal before the first check runs
    # reuse by content: an image run with no narrowing arguments; it carries the source's GPU runs too (a --gpu run
    # on a GPU runner always runs: its host is the one being proven)
    may_reuse = reuse_evidence and not gpu and not pytest_args.strip()
    left = [t for t in targets if not (may_reuse and _reused(t, refs[t.id], reports=reports, signer=signer,
                                                             records=records, verifier=verifier, reuse_from=reuse_from))]

    def sign(t: Target, rep: Report, inventory: dict[str, Any] | None) -> None:
        sign_report(refs[t.id], rep, signer=signer, target=t, inventory=inventory if not gpu else None, os_name=t.os)
        verdict = "green" if rep.green else "NOT green"
        print(f"gpuforge: signed this run's {'GPU ' if gpu else ''}validation ({verdict}) of {t.id} onto {refs[t.id]}",
              flush=True)
        key = reuse.key_of(rep)
        if rep.green and key:  # a hint for the next copy of these bytes; the decision reads the signature
            reuse.remember(records.state_dir, refs[t.id], key)

    if not left:
        return 0
    return pytest_run.validate_targets(left, reports=reports, records=records, pytest_args=pytest_args, gpu=gpu,
                                       gpu_request=gpu_request, progress_mode=progress_mode, on_report=sign)


def validate_into_bundle(t: Target, *, out: Path, reports: Path, signer: attest.Signer, records: Records,
                         pytest_args: str = "", gpu_request: str = "nvidia", progress_mode: str = "auto") -> int:
    """`validate --gpu --bundle OUT` on a GPU runner that cannot reach the registry: the GPU validators run on the image
    the build record names (by image id, already in the engine: `docker load` of the pushed image), and this run's
    statements, the same `validate --gpu --attest` signs, are signed offline about the record's pushed digest into the
    bundle file OUT (gpuforge.evidence.bundle), green or not. No registry is asked; `gpuforge attach OUT` attaches them
    where one is."""
    ref = recorded_ref(t, records, how="validate --bundle")  # refusals before the first check runs
    bundle.preflight(out, ref=ref, signer=signer)

    def sign(t: Target, rep: Report, inventory: dict[str, Any] | None) -> None:
        contents = sign_into_bundle(ref, rep, signer=signer, target=t, out=out)
        print(f"gpuforge: signed this run's GPU validation ({'green' if contents.green else 'NOT green'}) of {t.id} "
              f"about {ref} offline into {out} ({len(contents.statements)} statement(s), GPU "
              f"{', '.join(contents.gpu_host.gpu_names) or 'unknown'}, driver {contents.gpu_host.driver}); carry it "
              f"to a machine that reaches the registry and run `gpuforge attach {out.name} {t.id}`", flush=True)

    return pytest_run.validate_targets([t], reports=reports, records=records, pytest_args=pytest_args, gpu=True,
                                       gpu_request=gpu_request, progress_mode=progress_mode, on_report=sign)


def sign_into_bundle(ref: str, rep: Report, *, signer: attest.Signer, target: Target,
                     out: Path) -> bundle.Contents:
    """One GPU run's statements (sign_report's, delivered into a bundle), signed offline and written to `out`."""
    collected = bundle.Collector(signer)
    items = sign_report(ref, rep, signer=signer, target=target, deliver=collected)
    signed = Report.of(items[0].predicate, "the signed validation statement")  # the predicate as signed
    return bundle.write(out, ref=ref, target_id=target.id, report=signed, collected=collected)


def _reused(t: Target, ref: str, *, reports: Path, signer: attest.Signer, records: Records,
            verifier: attest.Verifier | None, reuse_from: tuple[str, ...]) -> bool:
    """Sign a statement that reuses another digest's signed checks of the same content onto `ref`, and write it
    as this target's report; False (the target is validated) when no candidate proves this content."""
    rec = records.require_build(t.id)
    try:
        image = engine.client().images.get(rec.image_id)
    except docker.errors.ImageNotFound:
        return False  # validate_targets says it in one line
    tj = pytest_run.rendered_target_json(t)
    facts = evidence.content(image, inputs=evidence.run_inputs(tj, rec.extra_ca))
    key = reuse.content_key(**facts, validator_set=evidence.validator_set_hash())
    candidates = [*reuse_from, *reuse.hinted(records.state_dir, key)]
    if not candidates:
        return False
    found, passed_over = reuse.find(key, candidates, verifier, skip=ref)
    red = reuse.own_newest_is_red(ref, verifier) if found else ""
    for why in [*passed_over, *([f"{ref}: {red}"] if red else [])]:
        print(f"gpuforge: not reused: {why}", flush=True)
    if found is None or red:
        return False
    assert verifier is not None  # reuse.find finds nothing without a key to verify candidates with
    stmt = statement(reuse.statement(found, image_id=rec.image_id), ref)
    inventory = reuse.inventory(found.source, verifier, target_id=t.id, image_id=rec.image_id)
    sign_report(ref, stmt, signer=signer, target=t, os_name=t.os, inventory=inventory)
    _write_reused(t, stmt, reports=reports, records=records, target_json=tj)
    print(f"gpuforge: reused: the image checks ({len(stmt.checks)}) signed {found.run.signed_at} on "
          f"{found.source} for content {key[:19]}; signed onto {ref} (no validator ran)", flush=True)
    # the same bytes' GPU runs, one per GPU host (models and driver): a zstd copy or a mirror needs no new GPU run
    gpu, gpu_passed_over = reuse.gpu_runs(found.source, ref, facts, verifier)
    for why in gpu_passed_over:
        print(f"gpuforge: not reused: {why}", flush=True)
    for g in gpu:
        sign_report(ref, statement(reuse.statement(g, image_id=rec.image_id), ref), signer=signer, target=t)
        host = g.report.host_of()
        print(f"gpuforge: reused: the GPU checks ({len(g.report.checks)}) of {', '.join(host.gpu_models)} on driver "
              f"{host.driver} signed {g.run.signed_at} on {found.source}; signed onto {ref} (no validator ran)",
              flush=True)
    return True


def _write_reused(t: Target, stmt: Report, *, reports: Path, records: Records, target_json: Path) -> None:
    """The reused statement as this target's report set (the JSON, its Markdown, the target.json it was checked
    against), as one set under the folder's lock with its recorded digest, as a run writes its own."""
    rpath = pytest_run.report_path(reports, t.id, False)
    data = stmt.dump()  # the files are the report's JSON data
    md = report.markdown(data)
    with files.Folder(reports.parent, reports.name, t.id) as out, out.locked():
        out.write_set({rpath.name: report.to_json(data).encode(), rpath.with_suffix(".md").name: md.encode(),
                       "target.json": target_json.read_bytes()})
        records.update_build(t.id, report=str(rpath), report_digest=evidence.digest_of(stmt))
    report.summarize(md)
