"""Run the validators (pytest + testinfra, under validators/) against built targets or a host.

Each run gets a run id; every container it starts carries it, and whatever is left when pytest ends
(normally, by failure or by Ctrl-C) is removed.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import docker.errors

from gpuforge import paths
from gpuforge.engine import client as engine
from gpuforge.engine import containers as run
from gpuforge.engine import progress as engine_progress
from gpuforge.errors import ConfigError, EngineError, ValidationFailed
from gpuforge.plan.matrix import Matrix, Target, load_matrix
from gpuforge.state import records
from gpuforge.validate import evidence, preflight, progress, report
from gpuforge.validate import sbom as cyclonedx


def report_path(reports: Path, target_id: str, gpu: bool) -> Path:
    return reports / target_id / ("report-gpu.json" if gpu else "report.json")


def _pytest(args: list[str], run_id: str, files: list[str] | None = None, *, containers: bool = True,
            label: str = "", progress_mode: str = "auto") -> int:
    vdir = paths.validators()
    argv = [sys.executable, "-m", "pytest", *[str(vdir / f) for f in files or ["."]], "-p", "no:cacheprovider", "-q", "-rs",
            "--rootdir", str(vdir), *args]
    engine.echo_cmd(argv)
    env = {**os.environ, "GPUFORGE_RUN_ID": run_id, "PYTHONUNBUFFERED": "1"}
    watch = progress.Watch(argv, env, label=label or run_id, plain=engine_progress.plain(progress_mode))
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


def gpu_args(gpu_request: str, gpus: str | None = None) -> list[str]:
    """Validator options for the GPU request mode and the GPUs asked for, grammar-checked (CLI/env input)."""
    if gpu_request not in run.GPU_REQUESTS:
        msg = f"--gpu-request / GPUFORGE_GPU_REQUEST: {gpu_request!r} is not one of {', '.join(run.GPU_REQUESTS)}"
        raise ConfigError(msg)
    out = ["--gpuforge-gpu-request", gpu_request]
    if gpus is not None:
        if not (gpus == "all" or (gpus.isdigit() and len(gpus) < 4)):
            msg = f"--gpus: {gpus!r} is not a GPU count or 'all'"
            raise ConfigError(msg)
        out += ["--gpuforge-gpus", gpus]
    return out


def validate_targets(targets: list[Target], *, reports: Path, pytest_args: str = "", gpu: bool = False,
                     gpu_request: str = "nvidia", progress_mode: str = "auto") -> int:
    c = engine.client()
    # one line, before any check runs: validators pointed elsewhere, an image gpuforge did not build for the
    # target, no way to give a container a GPU
    preflight.require_own_options(pytest_args)
    for t in targets:
        preflight.require_gpuforge_image(t.id, records.require(t.id)["image_id"])
    if gpu:
        gpu_args(gpu_request)
        preflight.require_engine_gpu(records.require(targets[0].id)["image_id"], gpu_request)
    failed: list[str] = []
    required = evidence.required_checks(gpu)  # from the validators alone, before any user argument applies
    for t in targets:
        rec = records.require(t.id)
        try:
            c.images.get(rec["image_id"])
        except docker.errors.ImageNotFound:
            msg = f"{t.id}: image {rec['image_id'][:19]} recorded by the last build is gone; run `gpuforge build {t.id}`"
            raise EngineError(msg) from None
        out = reports / t.id
        out.mkdir(parents=True, exist_ok=True)
        (out / "target.json").write_text(t.expected_json())
        rpath = report_path(reports, t.id, gpu)
        args = ["--gpuforge-image", rec["image_id"], "--gpuforge-target", str(out / "target.json"),
                "--gpuforge-report", str(rpath), "--junitxml", str(rpath.with_suffix(".xml")),
                "-o", f"junit_suite_name={t.id}"]
        if gpu:
            args += ["--gpuforge-gpu", *gpu_args(gpu_request)]
        if rec.get("extra_ca"):
            args += ["--gpuforge-ca", rec["extra_ca"]]
        print(f"gpuforge: validating {t.id} ({rec['image_id'][:19]})", flush=True)
        rc = _pytest(args + shlex.split(pytest_args), f"{run.RUN_ID}-{t.id}"[:60], label=t.id, progress_mode=progress_mode)
        if not rpath.exists():
            failed.append(t.id)
            print(f"gpuforge: {t.id}: pytest exited {rc} without a report", file=sys.stderr)
            continue
        md = report.finish(rpath, required=required, gpu=gpu)
        rep = report.load(rpath)
        sbom = rep.get("facts", {}).get("sbom")
        if sbom:  # the image's package manifest, bound to the image id like the report
            (out / "sbom.json").write_text(json.dumps({"target": t.id, "image_id": rec["image_id"], **sbom},
                                                      indent=2, sort_keys=True) + "\n")
            cyclonedx.write(out / "sbom.cdx.json", target_id=t.id, image_id=rec["image_id"], os_name=t.os, inventory=sbom)
        print(md)
        # the report's digest: promote refuses a report file changed after this point
        kind = "gpu_report" if gpu else "report"
        records.update(t.id, **{kind: str(rpath), f"{kind}_digest": evidence.digest_of(rep)})
        if rc == 0 and rep["evidence"]["partial"]:
            print(f"gpuforge: {t.id}: partial run ({len(rep['evidence']['missing'])} required check(s) not run): "
                  "fine for debugging, never promotable", file=sys.stderr)
        elif rc == 0 and not rep["green"]:  # every check ran, yet not evidence (e.g. a skip off the reviewed list)
            print(f"gpuforge: {t.id}: not evidence: {'; '.join(rep['problems'])}", file=sys.stderr)
            failed.append(t.id)
        if rc != 0:
            failed.append(t.id)
    if failed:
        msg = f"validation failed for {', '.join(failed)} (reports under {reports})"
        raise ValidationFailed(msg)
    return 0


def smoke(host: str | None, *, reports: Path, expect: list[str], target_json: str | None, matrix: Path,
          selectors: list[str], pytest_args: str = "", image: str | None = None, gpu_request: str = "nvidia",
          gpus: str | None = None, progress_mode: str = "auto") -> int:
    """Driver + GPU smoke validators against docker://, local:// or ssh:// (a GPU runner's host), or inside a
    container gpuforge starts from `image` with every GPU, asked for as `gpu_request` says (nvidia or cdi)."""
    if bool(host) == bool(image):
        msg = "smoke: give either HOST (docker://, local://, ssh://) or --image IMAGE"
        raise ConfigError(msg)
    args: list[str] = gpu_args(gpu_request, gpus)
    if image:  # no GPU, no NVIDIA runtime or CDI: one line (exit 3), not every check failing for it
        preflight.require_engine_gpu(image, gpu_request)
    elif host.startswith("local://"):
        preflight.require_local_gpu()
    if target_json:
        args += ["--gpuforge-target", target_json]
        tid = json.loads(Path(target_json).read_text()).get("id", "host")
    else:
        m: Matrix = load_matrix(matrix)
        t = m.select(selectors)[0]
        reports.mkdir(parents=True, exist_ok=True)
        tj = reports / f"{t.id}.target.json"
        tj.write_text(t.expected_json())
        args += ["--gpuforge-target", str(tj)]
        tid = t.id
    for e in expect:
        args += ["--gpuforge-expect", e]
    rpath = reports / "smoke" / f"{tid}.json"
    args += [*(["--gpuforge-image", image] if image else ["--gpuforge-host", host]), "--gpuforge-gpu",
             "--gpuforge-report", str(rpath), "--junitxml", str(rpath.with_suffix(".xml"))]
    rc = _pytest(args + shlex.split(pytest_args), f"{run.RUN_ID}-smoke",
                 files=["test_driver.py", "test_gpu_smoke.py"], containers=bool(image) or host.startswith("docker://"),
                 label=f"smoke {host or image}", progress_mode=progress_mode)
    if rpath.exists():
        print(report.finish(rpath))
    if rc != 0:
        msg = f"GPU smoke failed on {host or image} (report: {rpath})"
        raise ValidationFailed(msg)
    return 0
