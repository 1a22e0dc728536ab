"""The admission policy's cases, one table for every engine that decides them: cosign itself on the CUE policy, OPA
and regorus on the Rego policy (tests/integration/publish/test_admission_policy.py signs each case onto an image of its
own and feeds the engines the statements cosign verified; tests/unit/publish/test_policy.py feeds them the same
statements made in-process).

Each case is a report of a real run (tests/fleet_reports.py) turned into gpuforge's Test Result, optionally changed
(`edit`: a statement gpuforge never signs, signed with the trusted key all the same: what a policy must refuse when
a signing key is misused), signed by a key, some days ago. The policy under test is the prod policy of pool h200.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass

import opa_bindings
import regorus
from fleet_reports import base_from_h200_run, gpu_report, non_gpu

from gpuforge.evidence import statements
from gpuforge.validate.report_model import Report

POOL = "h200"


def green() -> dict:
    """The H200 run: WARNED (one GPU: the multi-GPU checks skip for a reason on the reviewed list)."""
    return gpu_report(base_from_h200_run())


def _passed() -> dict:
    rep = copy.deepcopy(green())
    for c in rep["checks"]:
        if c["outcome"] == "skipped":
            c.update(outcome="passed", message="")
    return rep


def _failed() -> dict:
    rep = copy.deepcopy(green())
    next(c for c in rep["checks"] if c["outcome"] == "passed")["outcome"] = "failed"
    return rep


def _skipped_required() -> dict:
    rep = copy.deepcopy(green())
    c = next(c for c in rep["checks"] if c["outcome"] == "passed" and c["id"] in rep["evidence"]["required"])
    c.update(outcome="skipped", message="Skipped: not today")
    return rep


def _non_gpu() -> dict:
    return non_gpu(green())


def _node(pred: dict, path: tuple):
    for p in path:
        pred = pred[p]
    return pred


def _drop(*path) -> Callable[[dict], None]:
    """Remove predicate[path...]: a field gpuforge always writes and the decision reads."""
    return lambda pred: _node(pred, path[:-1]).pop(path[-1])


def _set(*path, value) -> Callable[[dict], None]:
    return lambda pred: _node(pred, path[:-1]).__setitem__(path[-1], value)


@dataclass(frozen=True, kw_only=True)
class Case:
    report: Callable[[], dict] = green
    admitted: bool = False
    key: str = "ours"  # "other": a key pair the policy does not name
    days: float = 0  # signed this many days ago
    edit: Callable[[dict], None] | None = None
    also: Callable[[], dict] | None = None  # a second statement on the same digest (cosign holds every one to the policy)
    other_subject: bool = False  # the statement is about another image's digest, attached to this one
    cue_says: str = ""  # in cosign's one-line refusal under the CUE policy
    # policy-controller's rule, one verified statement that passes: differs from cosign's (every one) only where a
    # passing statement sits beside one that does not
    one_passes: bool | None = None

    @property
    def admitted_by_one(self) -> bool:
        return self.admitted if self.one_passes is None else self.one_passes

    @property
    def verified(self) -> bool:
        """cosign verifies its statements (signer, subject): only then does a policy see them."""
        return self.key == "ours" and not self.other_subject


RUN = ("configuration", 2)
CASES: dict[str, Case] = {
    "good": Case(admitted=True),
    "good-passed": Case(report=_passed, admitted=True),
    "another-pool": Case(report=lambda: gpu_report(base_from_h200_run(), model="A100", driver="570.133.20"),
                         cue_says='configuration.0.name: conflicting values "gpuforge.dev/pool/a100" and '
                                  '"gpuforge.dev/pool/h200"'),
    "non-gpu-scope": Case(report=_non_gpu, cue_says='"gpuforge.dev/scope/image"'),
    "failed-test": Case(report=_failed, cue_says='predicate.result: invalid value "FAILED"'),
    "skipped-required": Case(report=_skipped_required, cue_says='predicate.result: invalid value "FAILED"'),
    "expired": Case(days=40, cue_says="configuration.2.annotations.signedAt: invalid value"),
    "mixed": Case(also=_failed, cue_says='predicate.result: invalid value "FAILED"', one_passes=True),
    # what every digest the pipeline promoted carries: the non-GPU run's statement beside the pool's
    "beside-non-gpu": Case(also=_non_gpu, cue_says='"gpuforge.dev/scope/image"', one_passes=True),
    "another-signer": Case(key="other", cue_says="no matching attestations"),
    "another-digest": Case(other_subject=True, cue_says="no matching subject digest"),
    "passed-with-failed-tests": Case(report=_failed, edit=_set("result", value="PASSED"),
                                    cue_says="predicate.failedTests: incompatible list lengths"),
    "signed-at-not-a-string": Case(edit=_set(*RUN, "annotations", "signedAt", value=["9999"]),
                                   cue_says="configuration.2.annotations.signedAt: "),
    "missing-result": Case(edit=_drop("result"), cue_says="predicate.result: field is required but not present"),
    "missing-failedTests": Case(edit=_drop("failedTests"),
                                cue_says="predicate.failedTests: field is required but not present"),
    "missing-configuration": Case(edit=_drop("configuration"),
                                  cue_says="predicate.configuration: field is required but not present"),
    "missing-scope-name": Case(edit=_drop("configuration", 0, "name"),
                               cue_says="configuration.0.name: field is required but not present"),
    "missing-validators-name": Case(edit=_drop("configuration", 1, "name"),
                                    cue_says="configuration.1.name: field is required but not present"),
    "missing-run-name": Case(edit=_drop(*RUN, "name"), cue_says="configuration.2.name: field is required but not present"),
    "missing-annotations": Case(edit=_drop(*RUN, "annotations"),
                                cue_says="configuration.2.annotations: field is required but not present"),
    "missing-signedAt": Case(edit=_drop(*RUN, "annotations", "signedAt"),
                             cue_says="configuration.2.annotations.signedAt: field is required but not present"),
}


def predicates(case: Case, *, ref: str, target, signed_at) -> list[dict]:
    """The Test Result predicates the case signs onto `ref`, in order (gpuforge.evidence.statements, then `edit`)."""
    out = []
    for make in (case.report, *([case.also] if case.also else [])):
        [pred, *_] = statements.test_results(Report.of(make()), ref=ref, target=target, signed_at=signed_at)
        if case.edit:
            case.edit(pred)
        out.append(pred)
    return out


def statement(pred: dict, ref: str) -> dict:
    """The in-toto statement `cosign attest --type <Test Result>` makes of a predicate about host/repo@sha256:..."""
    name, _, digest = ref.partition("@")
    return {"_type": "https://in-toto.io/Statement/v0.1", "predicateType": statements.TEST_RESULT_TYPE,
            "subject": [{"name": name, "digest": {"sha256": digest.removeprefix("sha256:")}}], "predicate": pred}


ENGINES = ("opa", "regorus-v0", "regorus-v1")


def rego_allow(policy_text: str, statement: dict) -> dict[str, object]:
    """The value of `data.signature.allow` for one statement in each engine (None: undefined): OPA's Go engine
    (opa-golib-python-bindings; it parses Rego v1), regorus in Rego v0 mode (how cosign parses a --policy file) and
    in v1 mode. cosign admits on `true` only (rs.Allowed())."""
    out: dict[str, object] = {}
    with opa_bindings.OpaEngine() as opa:
        opa.add_policy("policy.rego", policy_text)
        try:
            out["opa"] = opa.eval_document("signature.allow", statement)
        except opa_bindings.OpaUndefinedError:
            out["opa"] = None
    for mode in ("v0", "v1"):
        r = regorus.Engine()
        r.set_rego_v0(mode == "v0")
        r.add_policy("policy.rego", policy_text)
        r.set_input_json(json.dumps(statement))
        out[f"regorus-{mode}"] = r.eval_rule("data.signature.allow")
    return out
