"""`gpuforge canary --env ENV`: prove again what an environment holds. A driver upgrade, a base image that moved
or a validator that learned a new check can turn yesterday's evidence stale while prod still runs the digest.

For each target: the digest the environment's tag (`<tag>-<env>`) names in the registry is pulled by digest, the
validators run on it (`--gpu`: the GPU set, on a GPU runner; never reused by content: re-running is the point), and
the result is signed onto that digest in the run like any validation, marked `run.canary = ENV` (reports under
REPORTS/canary-ENV/). A run whose failures are the node's (readiness blames the host) signs nothing. The checks
expect what this checkout's matrix and validators expect: a digest that no longer matches them is what a canary is
for. Being the digest's newest signed statement, a red canary blocks every further promotion of that digest until a
green run is signed after it, and `status` shows it. The build records of this checkout are neither read nor changed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import docker.errors

from gpuforge.engine import client as engine
from gpuforge.errors import RegistryError
from gpuforge.evidence import signed_run
from gpuforge.plan.target import ImageRef, Target
from gpuforge.registry import attest
from gpuforge.registry.client import Registry, RegistryAuth, credentials
from gpuforge.state.records import Records
from gpuforge.validate import pytest_run
from gpuforge.validate.report_model import Report


def held(t: Target, env: str, reg: Registry) -> ImageRef | None:
    """host/repo@digest that the environment's tag names, or None when the target was never promoted there."""
    m = reg.manifest(t.ref.with_tag(f"{t.tag}-{env}"))
    return t.ref.pinned(m.digest) if m else None


def pull(ref: ImageRef, auth: RegistryAuth) -> str:
    """The engine's image id of `ref`, pulled by its digest (the engine picks its platform's image of an index)."""
    creds = credentials(ref.registry, auth)
    try:
        img = engine.client().images.pull(str(ref), auth_config={"username": creds[0], "password": creds[1]} if creds else None)
    except docker.errors.APIError as e:
        msg = f"pulling {ref}: {e.explanation or e}"
        raise RegistryError(msg) from None
    if isinstance(img, list):  # the SDK returns a list when it pulled several tags; a digest names one image
        img = img[0]
    iid: str = img.id  # docker-py is untyped: its values are Any
    return iid


def run(targets: list[Target], *, env: str, reports: Path, signer: attest.Signer, records: Records, gpu: bool = False,
        gpu_request: str = "nvidia", progress_mode: str = "auto") -> int:
    reg = Registry(signer.auth)
    plan = []
    for t in targets:
        ref = held(t, env, reg)
        if ref is None:
            print(f"gpuforge: canary: {t.id}: {env} holds no digest ({t.tag}-{env} is not in the registry): nothing to "
                  "prove", flush=True)
        else:
            plan.append((t, ref))
    if not plan:
        return 0
    images = {}
    for t, ref in plan:
        print(f"gpuforge: canary: {t.id}: {env} holds {ref.digest}; pulling it", flush=True)
        images[t.id] = pull(ref, signer.auth)
    refs = {t.id: str(ref) for t, ref in plan}

    def sign(t: Target, rep: Report, inventory: dict[str, Any] | None) -> None:
        # called only for a run whose node is fit (pytest_run signs nothing about the image of an unfit node's run)
        run = {**(rep.run.model_dump(exclude_unset=True) if rep.run else {}), "canary": env}
        marked = Report.of({**rep.dump(), "run": run}, "the canary's report")
        signed_run.sign_report(refs[t.id], marked, signer=signer, target=t, os_name=t.os)
        verdict = "green" if marked.green else "RED: this digest is not promoted again until a green run"
        print(f"gpuforge: canary: signed this run's {'GPU ' if gpu else ''}validation ({verdict}) of what {env} holds "
              f"for {t.id}, {refs[t.id]}", flush=True)

    # reports of their own: a canary never takes the place of the build's validation report
    return pytest_run.validate_targets([t for t, _ in plan], reports=reports / f"canary-{env}", records=records, gpu=gpu,
                                       gpu_request=gpu_request, progress_mode=progress_mode, on_report=sign, images=images)
