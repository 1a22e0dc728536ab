"""Run the validators (pytest + testinfra, under validators/) against built targets or a host.

Each run gets a run id; every container it starts carries it, and whatever is left when pytest ends
(normally, by failure or by Ctrl-C) is removed; a run killed outright leaves them to the next run's reaping.

Only the run that owns a report writes it: the pytest child writes its raw report and JUnit XML into a
private temp folder, and this process (the parent) writes the finished set (report.json, .xml, .md,
target.json, SBOMs) into reports/<id>/ as one atomic set under the folder's lock. The child dies with the
parent (PR_SET_PDEATHSIG), and even a child that outlived it could write nothing but its own temp folder.
"""

from __future__ import annotations

import ctypes
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import docker.errors

from gpuforge import paths, provenance
from gpuforge.engine import client as engine
from gpuforge.engine import containers as run
from gpuforge.engine import progress as engine_progress
from gpuforge.errors import ConfigError, EngineError, NodeNotFit, ValidationFailed
from gpuforge.image import readiness
from gpuforge.image.expected import Expected, ExpectedError
from gpuforge.plan.matrix import Matrix, load_matrix
from gpuforge.plan.target import Target
from gpuforge.state import files
from gpuforge.state.records import Records
from gpuforge.validate import evidence, preflight, progress, report, selection
from gpuforge.validate import sbom as cyclonedx
from gpuforge.validate.plugins import PLUGIN_ARGS, PLUGIN_ENV
from gpuforge.validate.report_model import Report


def report_path(reports: Path, target_id: str, gpu: bool) -> Path:
    return reports / target_id / ("report-gpu.json" if gpu else "report.json")


def _pytest(args: list[str], run_id: str, files: list[str] | None = None, *, containers: bool = True,
            label: str = "", progress_mode: str = "auto") -> int:
    vdir = paths.validators()
    argv = [sys.executable, "-m", "pytest", *[str(vdir / f) for f in files or ["."]], *PLUGIN_ARGS, "-q", "-rs",
            "--rootdir", str(vdir), *args]
    engine.echo_cmd(argv)
    env = {**os.environ, **PLUGIN_ENV, "GPUFORGE_RUN_ID": run_id, "PYTHONUNBUFFERED": "1"}
    # the child dies with this process (SIGKILL included); the reader thread starts after the fork
    watch = progress.Watch(argv, env, label=label or run_id, plain=engine_progress.plain(progress_mode),
                           preexec_fn=die_with_parent(os.getpid()))
    proc = watch.proc
    try:
        rc = watch.wait()
        if rc != 0 and containers and not engine.alive():  # every check failed because the engine went away
            containers = False
            msg = f"validation ({label or run_id})"
            raise engine.lost(msg)
        return rc
    except KeyboardInterrupt:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        raise
    finally:
        removed = run.clean(run_id) if containers else 0  # local:// and ssh:// runs start no containers
        if removed:
            print(f"gpuforge: removed {removed} container(s) left by validator run {run_id}", file=sys.stderr)


PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(parent: int) -> Callable[[], None]:
    """Popen preexec_fn: the child gets SIGKILL when its parent dies (SIGKILL included), and exits at once
    if the parent is already gone (died between fork and prctl): no orphaned pytest runs on."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None  # looked up before fork

    def preexec() -> None:
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)
    return preexec


def _raw_report(path: Path) -> dict[str, Any] | None:
    """The child's report from its private temp folder (None: it wrote none, or a torn one)."""
    try:
        rep = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return rep if isinstance(rep, dict) else None


def rendered_target_json(t: Target) -> Path:
    """The target.json rendering wrote (images/dist/<id>/, the file the image carries): the one copy validators
    read. Missing, of another shape or stale: one line saying to run `gpuforge generate`."""
    p = paths.dist() / t.id / "target.json"
    try:
        current = Expected.load(p)
    except ExpectedError as e:
        raise ConfigError(str(e)) from None
    if current != t.expected():
        msg = f"{p} is stale (it is not what matrix.yaml now says for {t.id}); run `gpuforge generate`"
        raise ConfigError(msg)
    return p


def gpu_args(gpu_request: str, gpus: str | None = None) -> list[str]:
    """Validator options for the GPU request mode and the GPUs asked for, as the CLI's settings checked them
    (gpu_request, gpus in gpuforge.options)."""
    out = ["--gpuforge-gpu-request", gpu_request]
    if gpus is not None:
        out += ["--gpuforge-gpus", gpus]
    return out


def validate_targets(targets: list[Target], *, reports: Path, records: Records, pytest_args: str = "", gpu: bool = False,
                     gpu_request: str = "nvidia", progress_mode: str = "auto",
                     on_report: Callable[[Target, Report, dict[str, Any] | None], None] | None = None,
                     images: dict[str, str] | None = None) -> int:
    """Validate each target. `on_report(target, report, inventory)` gets the finished report as this process
    holds it, before any copy reaches reports/ (the pytest child writes it into a private folder this process
    made): what `validate --attest` signs is what the run observed, not a file someone can edit first. A run
    whose node readiness found unfit (`node_at_fault`) gets no `on_report`: signed, its red result would block an
    image the node never judged (`validate` exits 10, and a bundle is not written).
    `images` (target id -> image id): validate those images instead of the recorded builds (a canary's pull of
    what an environment holds); the build records are then neither read nor changed."""
    c = engine.client()
    preflight.require_own_options(pytest_args)  # validators pointed elsewhere: said before anything else
    builds = {t.id: (images[t.id], None) if images else _recorded(records, t.id) for t in targets}
    _preflight(targets, builds, gpu=gpu, gpu_request=gpu_request)
    failed: list[str] = []
    unfit: list[str] = []  # failed only where an unfit node fails: exit 10 when every failed target is one
    revision = provenance.git_revision()  # the checkout that ran the validators
    for t in targets:
        image_id, extra_ca = builds[t.id]
        # the validators that apply to this target's kind, collected before any user argument applies
        chosen_for = selection.Kind.of(t.expected(), gpu)
        required = evidence.required_checks(chosen_for)
        try:
            image = c.images.get(image_id)
        except docker.errors.ImageNotFound:
            msg = (f"{t.id}: image {image_id[:19]} was removed from the engine before it was validated" if images else
                   f"{t.id}: image {image_id[:19]} recorded by the last build is gone; run `gpuforge build {t.id}`")
            raise EngineError(msg) from None
        rpath = report_path(reports, t.id, gpu)
        # opened (symlinks refused, writability known) before a minutes-long run, written only after it
        with files.Folder(reports.parent, reports.name, t.id) as out, \
                tempfile.TemporaryDirectory(prefix=f"gpuforge-validate-{t.id[:40]}-") as tmp:
            own = Path(tmp)
            tj = rendered_target_json(t)
            # what the run proves, as content: what its evidence is reused by (gpuforge.evidence.reuse)
            content = evidence.content(image, inputs=evidence.run_inputs(tj, extra_ca))
            args = ["--gpuforge-image", image_id, "--gpuforge-target", str(tj),
                    "--gpuforge-report", str(own / "report.json"), "--junitxml", str(own / "report.xml"),
                    "-o", f"junit_suite_name={t.id}"]
            if gpu:
                args += ["--gpuforge-gpu", *gpu_args(gpu_request)]
            if extra_ca:
                args += ["--gpuforge-ca", extra_ca]
            print(f"gpuforge: validating {t.id} ({image_id[:19]})", flush=True)
            rc = _pytest(args + shlex.split(pytest_args), f"{run.run_id()}-{t.id}"[:60], label=t.id,
                         progress_mode=progress_mode)
            raw = _raw_report(own / "report.json")
            if raw is None:
                failed.append(t.id)
                print(f"gpuforge: {t.id}: pytest exited {rc} without a report", file=sys.stderr)
                continue
            rep = report.finish(raw, required=required, gpu=gpu, revision=revision, content=content, kind=chosen_for)
            md = report.markdown(rep)
            outputs, inventory = _report_set(t, image_id, rep, md, rpath, tj, own)
            kind = "gpu_report" if gpu else "report"
            try:
                typed = Report.of(rep, f"{t.id}: this run's report")  # what is signed and judged: the report's shape
                node = hand_over(t, typed, inventory, on_report)
            finally:  # a refusal to sign still leaves the reports for reading
                with out.locked():  # the set and its recorded digest change together
                    out.write_set(outputs)
                    if not images:  # the report's digest: `status` says whether the file still holds what this run wrote
                        records.update_build(t.id, **{kind: str(rpath), f"{kind}_digest": evidence.digest_of(rep)})
        print(md)
        report.summarize(md)
        if not _passed(t, rc, rep):
            failed.append(t.id)
            if node:
                unfit.append(f"{t.id}: {node}")
    if unfit and len(unfit) == len(failed):
        msg = f"validation could not prove the images on this node: {'; '.join(unfit)} (reports under {reports})"
        raise NodeNotFit(msg)
    if failed:
        msg = f"validation failed for {', '.join(failed)} (reports under {reports})"
        raise ValidationFailed(msg)
    return 0


GPU_MODULES = frozenset({"test_readiness", "test_gpu_smoke", "test_driver"})
# readiness's exits that are the node's, not the image's: not fit, or not shown fit (an unknown the bars make block)
NODE_EXITS = (readiness.HOST_EXIT, readiness.UNKNOWN_EXIT)


def hand_over(t: Target, rep: Report, inventory: dict[str, Any] | None,
              on_report: Callable[[Target, Report, dict[str, Any] | None], None] | None) -> str | None:
    """Give the finished report to `on_report` (validate --attest, --bundle, canary: they sign it) unless readiness
    found the node unfit; then return its verdict and sign nothing: the node's fault (speed, XID, limits) says nothing
    about the image, and a red statement signed about it would block the image until a green run."""
    node = node_at_fault(rep)
    if node and on_report:
        print(f"gpuforge: {t.id}: this node is not fit ({node}); nothing is signed about the image", flush=True)
    elif on_report:  # signs the report as this process holds it, before any copy
        on_report(t, rep, inventory)
    return node


def node_at_fault(rep: Report) -> str | None:
    """Readiness's verdict when it blames the node and every failed check is a GPU check (an unfit node fails those
    too); None when the image failed a check of its own, or readiness found the node fit."""
    ready = rep.facts.get("readiness") or {}
    failed = {c.module for c in rep.checks if c.outcome == "failed"}
    if ready.get("exit") in NODE_EXITS and failed <= GPU_MODULES:
        verdict: str | None = ready["verdict"]  # readiness's one-line verdict
        return verdict
    return None


def _recorded(records: Records, target_id: str) -> tuple[str, str | None]:
    """(image id, extra CA) of the target's recorded build."""
    rec = records.require_build(target_id)
    return rec.image_id, rec.extra_ca


def _preflight(targets: list[Target], builds: dict[str, tuple[str, str | None]], *, gpu: bool, gpu_request: str) -> None:
    """One line, before any check runs: an image gpuforge did not build for the target, no way to give a container
    a GPU."""
    for t in targets:
        preflight.require_gpuforge_image(t.id, builds[t.id][0])
    if gpu:
        preflight.require_engine_gpu(builds[targets[0].id][0], gpu_request)


def _report_set(t: Target, image_id: str, rep: dict[str, Any], md: str, rpath: Path, tj: Path,
                own: Path) -> tuple[dict[str, bytes], dict[str, Any] | None]:
    """(the files of the report set, the image's inventory): report JSON and Markdown, target.json, the JUnit XML
    the child wrote, and the image's package manifest (bound to the image id like the report) when it gave one."""
    outputs = {rpath.name: report.to_json(rep).encode(), rpath.with_suffix(".md").name: md.encode(),
               "target.json": tj.read_bytes()}
    if (own / "report.xml").exists():
        outputs[rpath.with_suffix(".xml").name] = (own / "report.xml").read_bytes()
    sbom = rep.get("facts", {}).get("sbom")
    if not sbom:
        return outputs, None
    outputs["sbom.json"] = (json.dumps({"target": t.id, "image_id": image_id, **sbom}, indent=2,
                                       sort_keys=True) + "\n").encode()
    outputs["sbom.cdx.json"] = cyclonedx.to_json(cyclonedx.bom(
        target_id=t.id, image_id=image_id, os_name=t.os, inventory=sbom)).encode()
    return outputs, {"target": t.id, "image_id": image_id, **sbom}


def _passed(t: Target, rc: int, rep: dict[str, Any]) -> bool:
    """Whether the run counts as passed; a partial run passes (for debugging, never promotable: said), a run whose
    checks all passed yet is not evidence (e.g. a chosen check's skip without a typed reason) fails, saying why."""
    if rc == 0 and rep["evidence"]["partial"]:
        print(f"gpuforge: {t.id}: partial run ({len(rep['evidence']['missing'])} required check(s) not run): "
              "fine for debugging, never promotable", file=sys.stderr)
    elif rc == 0 and not rep["green"]:
        print(f"gpuforge: {t.id}: not evidence: {'; '.join(rep['problems'])}", file=sys.stderr)
        return False
    return rc == 0


def smoke(host: str | None, *, reports: Path, expect: list[str], target_json: str | None, matrix: Path,
          selectors: list[str], pytest_args: str = "", image: str | None = None, gpu_request: str = "nvidia",
          gpus: str | None = None, progress_mode: str = "auto", level: str | None = None) -> int:
    """Driver + GPU smoke validators against docker://, local:// or ssh:// (a GPU runner's host), or inside a
    container gpuforge starts from `image` with every GPU, asked for as `gpu_request` says (nvidia or cdi).
    `level` r1 or r2: the node's readiness alone (validators/test_readiness.py); a failure blamed on the host is
    NodeNotFit (exit 10), not a failed validation."""
    if bool(host) == bool(image):
        msg = "smoke: give either HOST (docker://, local://, ssh://) or --image IMAGE"
        raise ConfigError(msg)
    args: list[str] = gpu_args(gpu_request, gpus)
    with tempfile.TemporaryDirectory(prefix="gpuforge-smoke-") as tmp:
        own = Path(tmp)
        if target_json:
            try:  # the same schema the plugin reads it with: a bad file is one line here, not a pytest traceback
                tid = Expected.load(target_json).id or "host"
            except ExpectedError as e:
                raise ConfigError(str(e)) from None
            args += ["--gpuforge-target", target_json]
        else:
            m: Matrix = load_matrix(matrix)
            t = m.select(selectors)[0]
            args += ["--gpuforge-target", str(rendered_target_json(t))]
            tid = t.id
        # input first (exit 2), then the host: no GPU, no NVIDIA runtime or CDI is one line (exit 3)
        if image:  # no GPU, no NVIDIA runtime or CDI: one line (exit 3), not every check failing for it
            preflight.require_engine_gpu(image, gpu_request)
        elif host and host.startswith("local://"):  # no image: host is given (checked above)
            preflight.require_local_gpu()
        for want in expect:
            args += ["--gpuforge-expect", want]
        rpath = reports / "smoke" / f"{tid}{'-' + level if level else ''}.json"
        if level:
            args += ["--gpuforge-level", level]
        args += [*(["--gpuforge-image", image] if image else ["--hosts", host]), "--gpuforge-gpu",
                 "--gpuforge-report", str(own / "report.json"), "--junitxml", str(own / "report.xml")]
        with files.Folder(reports.parent, reports.name, "smoke") as out:
            rc = _pytest(args + shlex.split(pytest_args), f"{run.run_id()}-smoke",
                         files=["test_readiness.py"] if level else ["test_driver.py", "test_gpu_smoke.py"],
                         containers=bool(image) or (host or "").startswith("docker://"),
                         label=f"smoke {host or image}", progress_mode=progress_mode)
            raw = _raw_report(own / "report.json")
            if raw is not None:
                rep = report.finish(raw, revision=provenance.git_revision())
                md = report.markdown(rep)
                outputs = {rpath.name: report.to_json(rep).encode(), rpath.with_suffix(".md").name: md.encode()}
                if (own / "report.xml").exists():
                    outputs[rpath.with_suffix(".xml").name] = (own / "report.xml").read_bytes()
                with out.locked():
                    out.write_set(outputs)
                print(md)
                report.summarize(md)
    ready = ((raw or {}).get("facts") or {}).get("readiness") if level else None
    if rc != 0 and ready and ready.get("exit") in NODE_EXITS:
        msg = f"{host or image}: {ready['verdict']} (report: {rpath})"
        raise NodeNotFit(msg)
    if rc != 0:
        msg = f"GPU smoke failed on {host or image} (report: {rpath})"
        raise ValidationFailed(msg)
    return 0
