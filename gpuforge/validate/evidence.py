"""What a validation report must hold to count as evidence: the required checks of the image's kind, the typed
reasons a chosen check may skip for, the validator set's hash, and the one verdict function that validate, attest and
promote use.

Which validators apply to an image is decided before the run (gpuforge.validate.selection): the required set is the
validators, collected host-side with no user arguments, whose markers apply to the target's kind (flavor, source, GPU
or not). `-k`, `--deselect` or `--ignore` can shrink a run but never the set it is judged against. A report is green
only when every required check passed, or skipped with a typed environmental reason (selection.EnvSkip) that its kind
of run can meet; a skip for any other reason, whatever its wording, is not evidence.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from gpuforge import __version__, paths
from gpuforge.errors import ValidationFailed
from gpuforge.image import compat
from gpuforge.validate import selection
from gpuforge.validate.plugins import PLUGIN_ARGS, PLUGIN_ENV
from gpuforge.validate.report_model import Check, Report


def validator_set_hash() -> str:
    """sha256 over every validator file and the selection rules with the skip reasons (gpuforge.validate.selection):
    a report made by other checks, or chosen by other rules, is not evidence."""
    h = hashlib.sha256()
    vdir = paths.validators()
    for f in sorted(p for p in vdir.rglob("*.py") if "__pycache__" not in p.parts):
        h.update(str(f.relative_to(vdir)).encode() + b"\0" + f.read_bytes() + b"\0")
    h.update(Path(selection.__file__).read_bytes())
    return "sha256:" + h.hexdigest()


@functools.cache
def collected() -> dict[str, dict[str, tuple[str, ...]]]:
    """Every validator's node id and its selection markers, collected with no user arguments."""
    vdir = paths.validators()
    with tempfile.TemporaryDirectory(prefix="gpuforge-collect-") as tmp:
        out = Path(tmp) / "checks.json"
        argv = [sys.executable, "-m", "pytest", str(vdir), "--collect-only", "-q", *PLUGIN_ARGS,
                "--rootdir", str(vdir), "--gpuforge-image", "collect-only", "--gpuforge-list-checks", str(out)]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=300,
                           env={**os.environ, **PLUGIN_ENV, "PYTHONDONTWRITEBYTECODE": "1"})
        try:
            marked = json.loads(out.read_text())
        except (OSError, ValueError):
            marked = {}
    if r.returncode != 0 or not marked:
        msg = f"cannot collect the validators under {vdir} (pytest exit {r.returncode}): {(r.stderr or r.stdout)[-500:]}"
        raise ValidationFailed(msg)
    return {i: {k: tuple(v) for k, v in m.items()} for i, m in marked.items()}


def required_checks(kind: selection.Kind) -> tuple[str, ...]:
    """The node ids of every validator that applies to an image of this kind: what its run must report."""
    ids = selection.applying(collected(), kind)
    if not ids:
        msg = f"no validator applies to a {kind.label()} image (validators under {paths.validators()})"
        raise ValidationFailed(msg)
    return ids


def content(image: Any, *, inputs: list[bytes]) -> dict[str, Any]:  # image: a docker-py Image (untyped)
    """What an image is, as its checks see it, from the engine (a docker SDK Image): the layers' uncompressed digests
    (rootfs.diff_ids); a digest of what no layer carries (the runtime config: ENV, USER, ENTRYPOINT, labels; the
    platform; the history's commands, which the secrets check reads); and a digest of what the run was given to
    check it against (`inputs`: the target.json the validators read, the build's CA bundle)."""
    attrs = image.attrs
    seen = {"config": attrs.get("Config") or {}, "platform": [attrs.get(k) for k in ("Os", "Architecture", "Variant")],
            "history": [[h.get("CreatedBy"), h.get("Comment")] for h in image.history()]}
    h = hashlib.sha256()
    for blob in inputs:
        h.update(hashlib.sha256(blob).digest())
    return {"diff_ids": list(attrs.get("RootFS", {}).get("Layers") or []),
            "config": "sha256:" + hashlib.sha256(json.dumps(seen, sort_keys=True, separators=(",", ":")).encode()).hexdigest(),
            "inputs": "sha256:" + h.hexdigest()}


def run_inputs(target_json: Path, extra_ca: str | None) -> list[bytes]:
    """What a run checks an image against, as bytes: the target.json, and the CA bundle the build was given."""
    ca = b""
    if extra_ca:
        try:
            ca = Path(extra_ca).read_bytes()
        except OSError:
            ca = extra_ca.encode()  # named but unreadable: the name still tells runs apart
    return [target_json.read_bytes(), ca]


def stamp(rep: dict[str, Any] | Report, *, required: tuple[str, ...], gpu: bool, content: dict[str, Any] | None = None,
          kind: selection.Kind | None = None) -> dict[str, Any]:
    """The evidence block validate adds to a report (host-side facts, not the plugin's); `kind`: what `required`
    was chosen for."""
    rep = data(rep)
    ran = {c["id"] for c in rep.get("checks", [])}
    return {
        "required": list(required),
        **({"kind": kind.as_dict()} if kind else {}),
        "missing": sorted(set(required) - ran),
        "partial": bool(set(required) - ran) or bool(rep.get("selection", {}).get("narrowed")),
        "gpu_required": gpu,
        "validator_set": validator_set_hash(),
        "gpuforge_version": __version__,
        "image_id": rep.get("facts", {}).get("image_id"),
        "repo_digests": rep.get("facts", {}).get("repo_digests", []),
        **({"gpu_host": gpu_host(rep)} if gpu else {}),
        **(content or {}),
    }


def gpu_host(rep: dict[str, Any] | Report) -> dict[str, Any]:
    """The GPU host a GPU run saw (from the driver facts the validators gather): what prod's per-pool check
    matches a fleet pool against (gpuforge.publish.prod.pools_missing). The runner is the CI runner's name."""
    drv = data(rep).get("facts", {}).get("driver") or {}
    gpus = drv.get("gpus") or []
    names = sorted({str(g.get("name", "")) for g in gpus})
    return {
        "gpu_names": names,
        "gpu_models": sorted({compat.gpu_model_of(n) or "" for n in names}),
        "capabilities": sorted({str(g.get("capability", "")) for g in gpus}),
        "driver": drv.get("driver"),
        "count": len(gpus),
        "runner": os.environ.get("RUNNER_NAME") or socket.gethostname(),
    }


def data(rep: dict[str, Any] | Report) -> dict[str, Any]:
    """A report as its JSON data: the verdict and the digest are of what was written (and signed), key for key."""
    return rep.dump() if isinstance(rep, Report) else rep


def skip_reason(check: dict[str, Any] | Check) -> str:
    message = check.message if isinstance(check, Check) else check.get("message")
    return (message or "").strip().removeprefix("Skipped: ").removeprefix("EnvSkipped: ")


def skip_allowed(check: dict[str, Any], gpu_run: bool) -> bool:
    """A skipped check with a typed environmental reason (selection.EnvSkip) this kind of run can meet; its words
    never count."""
    return selection.env_skip_allowed(check.get("skip"), gpu_run)


def problems(rep: dict[str, Any] | Report, *, require_gpu: bool = False) -> list[str]:
    """Why a report is not evidence (empty: it is green). Judged from the content, never its `green` field."""
    rep = data(rep)
    ev = rep.get("evidence")
    if not ev:
        return ["it has no evidence block (not written by `gpuforge validate`)"]
    out: list[str] = []
    if rep.get("exit_status") != 0:
        out.append(f"pytest exited {rep.get('exit_status')}")
    by_id = {c["id"]: c for c in rep.get("checks", [])}
    required = ev.get("required") or []
    if not required:
        out.append("it names no required checks")
    missing = [i for i in required if i not in by_id]
    if missing or ev.get("partial"):
        out.append(f"it is partial: {len(missing)} required check(s) did not run"
                   f"{' (' + ', '.join(missing[:3]) + (', ...' if len(missing) > 3 else '') + ')' if missing else ''}"
                   " — a subset run (-k, --deselect) is for debugging and never promotes")
    failed = [c["name"] for c in by_id.values() if c["outcome"] == "failed"]
    if failed:
        out.append(f"failed: {', '.join(failed)}")
    gpu_run = bool(rep.get("gpu")) and bool(ev.get("gpu_required"))
    for i in required:
        c = by_id.get(i)
        if c and c["outcome"] == "skipped" and not skip_allowed(c, gpu_run):
            why = f"{c['skip']} is not an allowed skip in this run" if c.get("skip") else \
                "a chosen check may skip only for a typed environmental reason"
            out.append(f"required check {c['name']} skipped ({skip_reason(c)[:120]}; {why})")
    ran_for = (rep.get("selection") or {}).get("kind")
    if ev.get("kind") and ran_for and ran_for != ev["kind"]:
        out.append(f"the validators were chosen for {ran_for}, the required set is for {ev['kind']}")
    if required and not any(by_id.get(i, {}).get("outcome") == "passed" for i in required):
        out.append("no required check passed")
    if require_gpu and not gpu_run:
        out.append("it is not a GPU report (run `gpuforge validate --gpu` on a GPU runner)")
    return out


def _canon(v: object) -> object:
    """Numbers as a JSON round trip through Go (cosign's predicate) leaves them: 2.0 and 2 are one value."""
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, dict):
        return {k: _canon(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_canon(x) for x in v]
    return v


def digest_of(rep: dict[str, Any] | Report) -> str:
    """sha256 of a report's canonical JSON: recorded at validation, so `status` can say whether a report file still
    holds what the run wrote (promotion judges only signed statements; compare also with
    the signed predicate on the registry)."""
    text = json.dumps(_canon(data(rep)), sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()
