"""Standard statements beside gpuforge's own predicate: what admission controllers and other tools read.

- An in-toto **Test Result** (https://in-toto.io/attestation/test-result/v0.1) per validating run and GPU pool,
  signed in the run onto the image digest: `result` PASSED | WARNED | FAILED, `passedTests` / `warnedTests` /
  `failedTests` (a required check skipped without a typed environmental reason, or that never ran, is a failed
  test), and `configuration`: first the scope (`gpuforge.dev/pool/P`: a GPU run on a node of fleet pool P; a run on
  a node of two pools signs two statements), then the validator set, the run (when it was signed: what a time to
  live reads), the matrix row, and a GPU run's host facts. An admission policy for pool P admits an image by a
  statement whose scope is P (gpuforge.publish.policy).
- A **SLSA Verification Summary** (https://slsa.dev/verification_summary/v1) for every promotion: the digest, the
  environment's requirements by digest, the statements it was decided from, PASSED.

Each is checked against the in-toto attestation framework's own message types (the `in-toto-attestation` package)
before it is signed: a field that is not in the standard is refused here, never published.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from typing import TYPE_CHECKING, Any

from google.protobuf import json_format
from in_toto_attestation.predicates.test_result.v0 import test_result_pb2
from in_toto_attestation.predicates.vsa.v1 import vsa_pb2
from in_toto_attestation.v1.resource_descriptor import ResourceDescriptor
from in_toto_attestation.v1.statement import Statement

from gpuforge.plan.target import ImageRef
from gpuforge.validate import evidence
from gpuforge.validate.report_model import GpuHost, Report

if TYPE_CHECKING:
    from gpuforge.plan.fleet import Pool
    from gpuforge.plan.target import Target

TEST_RESULT_TYPE = "https://in-toto.io/attestation/test-result/v0.1"
VSA_TYPE = "https://slsa.dev/verification_summary/v1"
VERIFIER_ID = "https://gpuforge.dev/promote"
# configuration entries' names (what the generated policies match on)
VALIDATORS, RUN, HOST = "gpuforge.dev/validators", "gpuforge.dev/run", "gpuforge.dev/host"
TARGET_PREFIX, POOL_PREFIX = "gpuforge.dev/target/", "gpuforge.dev/pool/"
IMAGE, GPU_UNPOOLED = "gpuforge.dev/scope/image", "gpuforge.dev/scope/gpu-unpooled"  # scopes of non-pool statements
_MESSAGES = {TEST_RESULT_TYPE: test_result_pb2.TestResult, VSA_TYPE: vsa_pb2.VerificationSummary}


class NotStandard(ValueError):
    """A statement gpuforge was about to sign does not fit the standard's message type (a bug here, never input)."""


def _sha256(data: object) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _entry(name: str, facts: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """A ResourceDescriptor for a fact: named, its canonical JSON's digest, the facts as annotations."""
    return {"name": name, "digest": {"sha256": _sha256(facts)}, "annotations": facts, **extra}


def host_matches(pool: Pool, host: GpuHost) -> str | None:
    """None when the GPU host a run saw is a node of `pool` (model, one of its drivers, at least its GPU count);
    else why not."""
    if host.gpu_models != [pool.model]:
        return f"ran on {', '.join(host.gpu_names or ['unknown GPUs'])}, not {pool.model}"
    if host.driver not in pool.drivers:
        return f"driver {host.driver}, not one of the pool's {', '.join(pool.drivers)}"
    if host.count < pool.gpus:
        return f"{host.count} GPU(s), the pool gives {pool.gpus}"
    return None


def _outcomes(rep: Report) -> tuple[list[str], list[str], list[str]]:
    """(passed, warned, failed) check ids: a required check that did not run, or skipped without a typed
    environmental reason (gpuforge.validate.selection.EnvSkip), is failed; any other skip is warned; a report that
    is not evidence for another reason (narrowed, pytest's own exit) names that reason as a failed entry, so FAILED
    never comes with an empty failedTests."""
    ev = rep.evidence
    required = set(ev.required if ev else [])
    gpu_run = rep.gpu_run()
    passed, warned, failed = [], [], []
    for c in rep.checks:
        if c.outcome == "passed":
            passed.append(c.id)
        elif c.outcome == "skipped" and (c.id not in required or evidence.skip_allowed(c.model_dump(), gpu_run)):
            warned.append(c.id)
        else:
            failed.append(c.id)
    ran = {c.id for c in rep.checks}
    failed += sorted(i for i in required if i not in ran)
    problems = evidence.problems(rep)
    if problems and not failed:
        failed.append(f"gpuforge.dev/evidence: {problems[0]}")
    return passed, warned, failed


def test_results(rep: Report, *, ref: str, target: Target, signed_at: dt.datetime | None = None) -> list[dict[str, Any]]:
    """The Test Result predicates of one validating run of `target` (a gpuforge.plan.target.Target) about `ref`: one
    per fleet pool the run's GPU host is a node of (a GPU run on no pool's node: one, scope GPU_UNPOOLED), one for a
    non-GPU run (scope IMAGE). Their configuration has a fixed order, which policies read by position (cosign checks
    a CUE policy as a schema: it cannot search a list): [scope, validators, run, target, host (GPU runs)]."""
    passed, warned, failed = _outcomes(rep)
    ev = rep.evidence
    when = (signed_at or dt.datetime.now(dt.UTC)).isoformat(timespec="seconds")
    run = rep.run.model_dump(exclude_none=True) if rep.run else {}
    common = [
        {"name": VALIDATORS, "digest": {"sha256": str(ev.validator_set if ev else "").removeprefix("sha256:")}},
        _entry(RUN, {"signedAt": when, "subject": ref, "gpu": rep.gpu_run(),
                     **{k: str(v) for k, v in run.items() if k in ("id", "git_revision", "gpuforge_version", "host")}}),
        _entry(TARGET_PREFIX + target.id, target.expected().as_dict()),
    ]
    if rep.gpu_run():
        host = rep.host_of()
        common.append(_entry(HOST, {k: v for k, v in host.model_dump().items() if v not in (None, [], "")}))
        scopes = [_entry(POOL_PREFIX + p.name, p.as_dict()) for p in target.pools if host_matches(p, host) is None]
        scopes = scopes or [_entry(GPU_UNPOOLED, {"pools": [p.name for p in target.pools]})]
    else:
        scopes = [_entry(IMAGE, {"checks": "non-GPU"})]
    result = "FAILED" if failed else "WARNED" if warned else "PASSED"
    out = []
    for scope in scopes:
        pred = {"result": result, "configuration": [scope, *common], "passedTests": passed, "warnedTests": warned,
                "failedTests": failed}
        check(TEST_RESULT_TYPE, pred, ref)
        out.append(pred)
    return out


def vsa(ref: str, *, env: str, requirements: dict[str, Any], inputs: list[str], verified_at: dt.datetime | None = None) -> dict[str, Any]:
    """The Verification Summary of one promotion of `ref` to `env`: `requirements` (what the environment asked
    for: gates, pools) by digest, `inputs` the sha256 of each signed statement it was decided from."""
    pred = {"verifier": {"id": VERIFIER_ID},
            "timeVerified": (verified_at or dt.datetime.now(dt.UTC)).isoformat(timespec="seconds").replace("+00:00", "Z"),
            "resourceUri": ref,
            "policy": {"uri": f"https://gpuforge.dev/policy/promote/{env}", "digest": {"sha256": _sha256(requirements)}},
            "inputAttestations": [{"digest": {"sha256": d.removeprefix("sha256:")}} for d in inputs],
            "verificationResult": "PASSED",
            "verifiedLevels": [f"GPUFORGE_PROMOTED_{env.upper()}"]}
    check(VSA_TYPE, pred, ref)
    return pred


def check(type_uri: str, predicate: dict[str, Any], ref: str) -> None:
    """The predicate and its statement about `ref` against the in-toto message types; NotStandard when not."""
    try:
        body = dict(predicate)
        if type_uri == VSA_TYPE:
            # The spec's verifiedLevels is an array of strings; the pinned package's VSA v1 message still declares one
            # string, so that field is checked here and the rest against the message.
            levels = body.pop("verifiedLevels", None)
            if not (isinstance(levels, list) and levels and all(isinstance(x, str) for x in levels)):
                msg = f"verifiedLevels must be a non-empty array of strings, not {levels!r}"
                raise ValueError(msg)
        json_format.ParseDict(body, _MESSAGES[type_uri](), ignore_unknown_fields=False)
        image = ImageRef.parse(ref)
        algo, _, hexdigest = str(image.digest).partition(":")
        subject = ResourceDescriptor(name=str(image.bare()), digest={algo: hexdigest}).pb
        Statement([subject], type_uri, predicate).validate()
        for rd in predicate.get("configuration", []):
            d = json_format.ParseDict(rd, ResourceDescriptor(name="").pb)
            ResourceDescriptor.copy_from_pb(d).validate()
    except (json_format.ParseError, ValueError, KeyError, TypeError) as e:
        msg = f"the {type_uri} statement about {ref} does not fit the standard: {e}"
        raise NotStandard(msg) from None
