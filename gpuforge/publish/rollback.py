"""`gpuforge rollback --env ENV TARGET [--digest DIGEST | --steps N]`: point the environment's tags back at a
digest that was itself promoted there (the registry's history says so), after verifying its signed evidence
again. Manifests are copied by digest within the repository: no rebuild, no layer pulled or pushed. Only the
environment's moving tags (`<tag>-<env>`, the aliases) move: version tags never do, and the build restored has its
own `<version>-<env>` from its promotion. The rollback is a promotion record of its own (kind rollback), so history
shows it."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any, NoReturn

from gpuforge.errors import ConfigError, PromotionRefused
from gpuforge.plan.target import Target
from gpuforge.publish import history, promote, transaction
from gpuforge.registry import attest
from gpuforge.registry.client import Registry
from gpuforge.state.promotions import PromotionRecord


def _refuse(t: Target, why: str) -> NoReturn:
    msg = f"{t.id}: rollback refused: {why}; no tag was changed"
    raise PromotionRefused(msg)


def choose(t: Target, done: list[PromotionRecord], current: str | None, *, to: str | None, steps: int | None) -> PromotionRecord:
    """The promotion whose digest the rollback restores."""
    if to is not None:
        if not re.fullmatch(r"sha256:[0-9a-f]{12,64}", to):
            msg = f"--digest {to!r}: not a digest (sha256: and at least 12 hex digits)"
            raise ConfigError(msg)
        hits = [r for r in done if r.digest.startswith(to)]
        if not hits:
            _refuse(t, f"{to} was never promoted to {done[0].env if done else 'this environment'} (see `gpuforge history`)")
        if len({r.digest for r in hits}) > 1:
            msg = f"--digest {to}: matches more than one promoted digest; give more digits"
            raise ConfigError(msg)
        return hits[-1]
    n = 1 if steps is None else steps
    if n < 1:
        msg = f"--steps {n}: must be 1 or more"
        raise ConfigError(msg)
    runs: list[PromotionRecord] = []  # one entry per change of digest, oldest first
    for r in done:
        if not runs or runs[-1].digest != r.digest:
            runs.append(r)
    if runs and current and runs[-1].digest != current:
        _refuse(t, f"the environment's tag points at {current[:19]}, which its last promotion record does not name "
                   f"(moved outside gpuforge?); give --digest DIGEST")
    if len(runs) <= n:
        _refuse(t, f"history has {len(runs)} promoted digest(s); nothing {n} step(s) back")
    return runs[-1 - n]


def rollback(t: Target, *, env: str, to: str | None, steps: int | None,
             verifier: attest.Verifier | None, signer: attest.Signer, allow_no_gpu: bool = False,
             reports: Path | None = None) -> dict[str, Any]:
    if to is not None and steps is not None:
        msg = "give --digest DIGEST or --steps N, not both"
        raise ConfigError(msg)
    t0 = time.monotonic()
    if verifier is None:
        _refuse(t, "no way to verify the signed evidence: pass --key cosign.pub or set GPUFORGE_COSIGN_PUBLIC_KEY")
    promote.resume(t, env=env, verifier=verifier, signer=signer, reports=reports)
    pushed = t.ref
    repo, reg = pushed.bare(), Registry(verifier.auth)
    hist = history.load(reg, repo, verifier, target=t.id, env=env)
    tags = promote.env_tags(t, env)  # the moving ones: a rollback moves no version tag
    current = transaction.digest_at(reg, repo, tags.moving[0])
    target_rec = choose(t, hist.done(), current, to=to, steps=steps)
    digest = target_rec.digest
    m = reg.manifest(repo.pinned(digest))
    if m is None:
        _refuse(t, f"the registry no longer holds {digest}")
    require_gpu = env == "prod" and not allow_no_gpu
    ev = promote.judge(str(pushed.pinned(digest)), m, verifier, require_gpu=require_gpu,
                       check_validator_set=False, who=t.id)  # evidence made by the validators of its time
    mv = transaction.Move(target=t.id, env=env, reg=reg, repo=repo, digest=digest, tags=tags.all(), kind="rollback",
                          allow_no_gpu=not require_gpu and env == "prod",
                          evidence=ev, rollback_to_seq=target_rec.seq, version=target_rec.version)
    res = transaction.execute(mv, hist, signer=signer, reports=reports)
    res["seconds"] = round(time.monotonic() - t0, 2)
    build = f"version {target_rec.version}, " if target_rec.version else ""
    print(f"gpuforge: rolled {t.id} [{env}] back to {digest} ({build}promotion #{target_rec.seq} of {target_rec.at}) "
          f"in {res['seconds']:.1f} s", flush=True)
    return res
