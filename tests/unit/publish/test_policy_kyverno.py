"""`gpuforge policy --format kyverno` (#28): the Kyverno ClusterPolicy's shape, its conditions on the Test Result
fields gpuforge signs, and its signer. Kyverno itself does not run here (no cluster); the CUE form is evaluated by
cosign in tests/integration/publish/test_admission_policy.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gpuforge.errors import ConfigError
from gpuforge.publish import policy, statements

PUB = "-----BEGIN PUBLIC KEY-----\nMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE\n-----END PUBLIC KEY-----\n"


@pytest.fixture
def pub(tmp_path):
    p = tmp_path / "cosign.pub"
    p.write_text(PUB)
    return p


def _doc(pub, **kw) -> dict:
    args = {"env": "prod", "pool": "h200", "max_age_days": 30, "repository": "r.example/x", "key": str(pub),
            "identity": None, "issuer": None, "tlog": False, **kw}
    return json.loads(policy.kyverno(**args))


def test_a_pool_policy_verifies_the_test_result_of_that_pool_by_digest(pub):
    doc = _doc(pub)
    assert (doc["apiVersion"], doc["kind"], doc["metadata"]["name"]) == ("kyverno.io/v1", "ClusterPolicy", "gpuforge-prod-h200")
    assert doc["spec"]["validationFailureAction"] == "Enforce" and doc["spec"]["background"] is False
    [rule] = doc["spec"]["rules"]
    assert rule["match"] == {"any": [{"resources": {"kinds": ["Pod"]}}]}
    # only Pods that select the pool's nodes: the H200 pool's evidence is not asked of an A100 Pod
    [pre] = rule["preconditions"]["all"]
    assert pre["value"] == "h200" and f'nodeSelector."{policy.POOL_LABEL}"' in pre["key"]
    [vi] = rule["verifyImages"]
    assert vi["imageReferences"] == ["r.example/x", "r.example/x:*", "r.example/x@*"]
    assert vi["mutateDigest"] and vi["verifyDigest"] and vi["required"]  # the Pod runs the digest that was verified
    [att] = vi["attestations"]
    assert att["type"] == statements.TEST_RESULT_TYPE
    [attestor] = att["attestors"]
    assert attestor["entries"] == [{"keys": {"publicKeys": PUB, "rekor": {"ignoreTlog": True}, "ctlog": {"ignoreSCT": True}}}]
    [[scope, result, failed, age]] = [c["all"] for c in att["conditions"]]
    assert scope["value"] == statements.POOL_PREFIX + "h200" and "configuration[?name=='gpuforge.dev/pool/h200']" in scope["key"]
    assert result == {"key": "{{ result }}", "operator": "AnyIn", "value": ["PASSED", "WARNED"],
                      "message": "the Test Result is not PASSED"}
    assert failed["key"] == "{{ length(failedTests || `[]`) }}" and failed["value"] == 0
    assert age["operator"] == "DurationLessThanOrEquals" and age["value"] == "720h"
    assert f"configuration[?name=='{statements.RUN}'].annotations.signedAt" in age["key"] and "time_since(" in age["key"]


def test_the_non_gpu_policy_applies_to_every_pod_and_reads_the_image_scope(pub):
    doc = _doc(pub, pool=None, max_age_days=1.5)
    [rule] = doc["spec"]["rules"]
    assert "preconditions" not in rule and doc["metadata"]["name"] == "gpuforge-prod"
    [[scope, _, _, age]] = [c["all"] for c in rule["verifyImages"][0]["attestations"][0]["conditions"]]
    assert scope["value"] == statements.IMAGE and age["value"] == "36h"


def test_keyless_and_kms_signers_and_the_transparency_log(pub):
    keyless = _doc(pub, key=None, identity="https://github.com/o/r/.github/workflows/images.yml@refs/heads/main",
                   issuer="https://token.actions.githubusercontent.com", tlog=True)
    [entry] = keyless["spec"]["rules"][0]["verifyImages"][0]["attestations"][0]["attestors"][0]["entries"]
    assert entry == {"keyless": {"subject": "https://github.com/o/r/.github/workflows/images.yml@refs/heads/main",
                                 "issuer": "https://token.actions.githubusercontent.com",
                                 "rekor": {"url": "https://rekor.sigstore.dev"}}}
    kms = _doc(pub, key="awskms:///alias/gpuforge")
    [entry] = kms["spec"]["rules"][0]["verifyImages"][0]["attestations"][0]["attestors"][0]["entries"]
    assert entry["keys"]["kms"] == "awskms:///alias/gpuforge"


def test_no_signer_or_a_private_key_is_refused(tmp_path, pub):
    with pytest.raises(ConfigError, match="the policy names who signed the evidence"):
        _doc(pub, key=None)
    priv = tmp_path / "cosign.key"
    priv.write_text("-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----\nx\n-----END ENCRYPTED SIGSTORE PRIVATE KEY-----\n")
    with pytest.raises(ConfigError, match="not a PEM public key"):
        _doc(pub, key=str(priv))


def test_the_cli_writes_it_and_refuses_an_unknown_format(tmp_path, pub):
    out = tmp_path / "prod.yaml"
    r = subprocess.run([sys.executable, "-m", "gpuforge", "policy", "--env", "prod", "--format", "kyverno", "--key", str(pub),
                        "--output", str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(out.read_text())["kind"] == "ClusterPolicy"
    r = subprocess.run([sys.executable, "-m", "gpuforge", "policy", "--env", "prod", "--format", "rego", "--key", str(pub)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "kyverno" in r.stderr and r.stderr.count("\n") == 1, r.stderr
