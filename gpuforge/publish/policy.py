"""`gpuforge policy`: the admission policy that admits an image to an environment (and a GPU pool) only by a signed
in-toto Test Result (gpuforge.evidence.statements) that is for that scope, PASSED or WARNED, with no failed test
(a skipped required check is a failed test), signed within the environment's time to live, by the configured key or
keyless identity, about the image's own digest.

Formats:
- `cue`: for `cosign verify-attestation --type <Test Result> --policy FILE` and for policy-controller. cosign checks
  a CUE policy as a schema against each statement (no search in lists, no clock): the scope and the signing time
  are read by position (the statement's configuration order is fixed), and the time to live is a cut-off written
  when the policy is generated: regenerate it at least daily (docs/promotion.md). Every field the decision reads is
  a required field (`name!:`): a schema alone admits a statement that lacks a field it constrains.
- `rego`: the same decision on the same fields, in cosign's Rego contract (`package signature`, a boolean `allow`,
  what `cosign verify-attestation --policy FILE.rego` queries as `data.signature.allow`) and conftest's (a `deny`
  set of reasons, `--namespace signature`). `import rego.v1` makes one text parse as Rego v0 (cosign's parser) and v1.
- `policy-controller`: a Sigstore policy-controller ClusterImagePolicy for the target's repository, the same CUE
  policy under the configured key (or keyless identity). policy-controller admits by any one statement that passes;
  `cosign verify-attestation` requires every Test Result on the digest to pass.

What it does not hold an image to (promotion does): the newest statement deciding (an older PASSED Test Result within
the time to live still admits after a newer FAILED one), the validator set, the CVE verdict, the promotion itself.

The signatures (key, identity, subject digest) are cosign's and policy-controller's own checks: a Rego or CUE policy
judges one statement that cosign has verified.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

from gpuforge import __version__
from gpuforge.errors import ConfigError
from gpuforge.evidence import statements
from gpuforge.state import files

FORMATS = ("cue", "rego", "policy-controller")


def scope_of(pool: str | None) -> str:
    """The configuration[0] name a statement must carry: the pool's, or the non-GPU checks' (no pool)."""
    return statements.POOL_PREFIX + pool if pool else statements.IMAGE


def cutoff(max_age_days: float, now: dt.datetime | None = None) -> str:
    """The oldest signing time admitted, in the statements' own format (UTC ISO 8601: compared as text)."""
    t = (now or dt.datetime.now(dt.UTC)) - dt.timedelta(days=max_age_days)
    return t.astimezone(dt.UTC).isoformat(timespec="seconds")


def _header(env: str, pool: str | None, max_age_days: float, now: dt.datetime | None, comment: str) -> str:
    made = (now or dt.datetime.now(dt.UTC)).isoformat(timespec="seconds")
    where = f"environment {env}" + (f", GPU pool {pool}" if pool else " (the non-GPU checks)")
    return (f"{comment} gpuforge {__version__} admission policy for {where}; generated {made}.\n"
            f"{comment} Admits a digest by a signed in-toto Test Result for scope {scope_of(pool)}: PASSED or WARNED, no "
            f"failed test, signed\n{comment} at or after {cutoff(max_age_days, now)} (time to live {max_age_days:g} days). "
            f"The cut-off is fixed here: regenerate at least daily.\n")


def cue(*, env: str, pool: str | None, max_age_days: float, now: dt.datetime | None = None) -> str:
    # `!` marks a required field: cosign validates the statement against the schema without asking for concrete
    # values, so a constrained field that is absent would pass
    oldest = cutoff(max_age_days, now)
    return _header(env, pool, max_age_days, now, "//") + f"""predicateType!: "{statements.TEST_RESULT_TYPE}"
predicate!: {{
\tresult!:      =~"^(PASSED|WARNED)$"
\tfailedTests!: []
\tconfiguration!: [
\t\t{{name!: "{scope_of(pool)}", ...}},
\t\t{{name!: "{statements.VALIDATORS}", ...}},
\t\t{{name!: "{statements.RUN}", annotations!: {{signedAt!: >="{oldest}", ...}}, ...}},
\t\t...,
\t]
\t...
}}
"""


def rego(*, env: str, pool: str | None, max_age_days: float, now: dt.datetime | None = None) -> str:
    """cosign's Rego contract (`data.signature.allow` on one verified statement) plus conftest's `deny` reasons.

    Each requirement is a rule of its own, and `deny` holds the reason of each one that does not hold (`not rule`):
    an absent field leaves its rule undefined, so it denies as a wrong value does. A negated rule, never a negated
    built-in call (`in` is one): with an absent argument, OPA leaves `not f(x)` undefined where regorus makes it true.
    The signing time is compared only as a string: Rego orders any array or object above every string."""
    oldest = cutoff(max_age_days, now)
    scope, conf = scope_of(pool), "input.predicate.configuration"
    reasons = {"test_result": f"predicateType is not {statements.TEST_RESULT_TYPE}",
               "passed_or_warned": "predicate.result is not PASSED or WARNED",
               "no_failed_test": "predicate.failedTests is not an empty list",
               "in_scope": f"predicate.configuration[0] is not scope {scope}",
               "validators_named": f"predicate.configuration[1] is not {statements.VALIDATORS}",
               "run_named": f"predicate.configuration[2] is not {statements.RUN}",
               "signed_in_time": f"predicate.configuration[2].annotations.signedAt is not at or after {oldest}"}
    denies = "".join(f'deny contains "{why}" if not {rule}\n' for rule, why in reasons.items())
    return _header(env, pool, max_age_days, now, "#") + f"""\
# cosign verify-attestation --policy reads allow; conftest reads deny (--namespace signature).
package signature

import rego.v1

default allow := false

allow if count(deny) == 0

{denies}
test_result if input.predicateType == "{statements.TEST_RESULT_TYPE}"

passed_or_warned if input.predicate.result in {{"PASSED", "WARNED"}}

no_failed_test if input.predicate.failedTests == []

in_scope if {conf}[0].name == "{scope}"

validators_named if {conf}[1].name == "{statements.VALIDATORS}"

run_named if {conf}[2].name == "{statements.RUN}"

signed_in_time if {{
\tis_string({conf}[2].annotations.signedAt)
\t{conf}[2].annotations.signedAt >= "{oldest}"
}}
"""


def _authority(*, key: str | None, identity: str | None, issuer: str | None, tlog: bool) -> dict[str, Any]:
    if key and "://" in key:  # a KMS key (awskms://, gcpkms://, hashivault://, k8s://): policy-controller reads it
        auth: dict[str, Any] = {"key": {"kms": key}}
    elif key:
        try:
            pem = Path(key).read_text()
        except (OSError, UnicodeDecodeError) as e:
            msg = f"--key {key}: {getattr(e, 'strerror', None) or 'not a PEM text file'}"
            raise ConfigError(msg) from None
        if "-----BEGIN PUBLIC KEY-----" not in pem or "PRIVATE KEY" in pem:
            # a private key would be copied into a document applied to a cluster
            msg = f"--key {key}: not a PEM public key (the policy carries the key that verifies: cosign.pub)"
            raise ConfigError(msg)
        auth = {"key": {"data": pem}}
    elif identity and issuer:
        auth = {"keyless": {"identities": [{"issuer": issuer, "subject": identity}]}}
    else:
        msg = ("the policy names who signed the evidence: give --key cosign.pub (or GPUFORGE_COSIGN_PUBLIC_KEY), or "
               "GPUFORGE_COSIGN_IDENTITY and GPUFORGE_COSIGN_ISSUER")
        raise ConfigError(msg)
    if tlog:  # statements in the Rekor log (keyless, or a key pair with GPUFORGE_COSIGN_TLOG=1): policy-controller
        # checks their entries there
        auth["ctlog"] = {"url": "https://rekor.sigstore.dev"}
    return auth


def image_globs(repository: str) -> list[str]:
    """The repository's own references only (its tags and digests), never a sibling whose name starts alike."""
    return [repository, f"{repository}:*", f"{repository}@*"]


def policy_controller(*, env: str, pool: str | None, max_age_days: float, repository: str, key: str | None,
                      identity: str | None, issuer: str | None, tlog: bool, now: dt.datetime | None = None) -> str:
    """A ClusterImagePolicy (policy.sigstore.dev/v1beta1) as YAML-compatible JSON (valid YAML, no extra dependency)."""
    auth = _authority(key=key, identity=identity, issuer=issuer, tlog=tlog)
    doc = {"apiVersion": "policy.sigstore.dev/v1beta1", "kind": "ClusterImagePolicy",
           "metadata": {"name": f"gpuforge-{env}" + (f"-{pool}" if pool else "")},
           "spec": {"images": [{"glob": g} for g in image_globs(repository)],
                    "authorities": [{"name": "gpuforge-test-result", **auth,
                                     "attestations": [{"name": "test-result",
                                                       "predicateType": statements.TEST_RESULT_TYPE,
                                                       "policy": {"type": "cue",
                                                                  "data": cue(env=env, pool=pool,
                                                                              max_age_days=max_age_days, now=now)}}]}]}}
    return json.dumps(doc, indent=2) + "\n"


def write(*, fmt: str, env: str, pool: str | None, pools: tuple[Any, ...], max_age_days: float, repository: str,
          output: Path | None, key: str | None = None, identity: str | None = None, issuer: str | None = None,
          tlog: bool = False) -> str:
    """The policy text for `fmt`, written to `output` atomically when given; an unknown pool is a ConfigError."""
    if pool is not None and pool not in pools:
        msg = f"--pool {pool}: not a pool of matrix.yaml's fleet ({', '.join(pools) or 'it has none'})"
        raise ConfigError(msg)
    if fmt == "cue":
        text = cue(env=env, pool=pool, max_age_days=max_age_days)
    elif fmt == "rego":
        text = rego(env=env, pool=pool, max_age_days=max_age_days)
    else:
        text = policy_controller(env=env, pool=pool, max_age_days=max_age_days, repository=repository, key=key,
                                 identity=identity, issuer=issuer, tlog=tlog)
    if output is not None:
        files.write_output(output, text)  # atomic: a reader never sees half a policy
    return text
