"""The admission policy, evaluated for real against a local registry (Debian's docker-registry): every case of
tests/admission_cases.py is an image of its own carrying the in-toto Test Result that gpuforge's own code makes
(gpuforge.evidence.statements, from the real H200 run's report: tests/fleet_reports.py) and signs
(gpuforge.registry.attest). `gpuforge policy --env prod --pool h200 --format cue` is handed to
`cosign verify-attestation --policy`: the good images are admitted, each hostile one refused with a one-line reason.
`--format rego` is handed to OPA and regorus with the statements `cosign verify-attestation` verified and printed
(without a policy: what it hands a --policy), and both decide every case as cosign decided it under the CUE.
"""

from __future__ import annotations

import base64
import datetime as dt
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time

import pytest
import state_here
from admission_cases import CASES, ENGINES, POOL, Case, predicates, rego_allow
from fleet_reports import BASE, FLEET
from registries import LocalRegistry

from conftest import need
from gpuforge.cli import main
from gpuforge.evidence import statements
from gpuforge.plan.matrix import load_matrix
from gpuforge.publish import policy
from gpuforge.registry import attest

pytestmark = pytest.mark.docker
PASSWORD = "admission-test-key-pass"


@pytest.fixture(scope="module")
def setup(docker_engine, tmp_path_factory):
    if not shutil.which("cosign"):
        need("needs cosign (Debian trixie's; tools/start-engine.sh installs it)")
    d = tmp_path_factory.mktemp("admission")
    (d / "reg").mkdir()
    reg = LocalRegistry(d / "reg", None)
    mp = pytest.MonkeyPatch()
    mp.setenv("COSIGN_PASSWORD", PASSWORD)
    for who in ("ours", "other"):
        subprocess.run(["cosign", "generate-key-pair", "--output-key-prefix", str(d / who)], check=True,
                       capture_output=True)
    (d / "matrix.yaml").write_text(BASE + FLEET + f"registry: {reg.host}\n")
    t = load_matrix(d / "matrix.yaml").select(None)[0]
    yield {"d": d, "reg": reg, "t": t, "docker": docker_engine}
    mp.undo()
    reg.stop()
    for img in docker_engine.images.list(name=f"{reg.host}/gpuforge-admission/*"):
        docker_engine.images.remove(img.id, force=True)


def _image(setup, name: str) -> str:
    """A one-file image of its own pushed to the local registry: host/repo@digest."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = f"admission case {name}\n".encode()
        info = tarfile.TarInfo("case.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    repo = f"{setup['reg'].host}/gpuforge-admission/{name.lower()}"  # repository names are lowercase
    setup["docker"].api.import_image_from_data(buf.getvalue(), repository=repo, tag="v1")
    pushed = setup["docker"].images.push(repo, tag="v1")
    assert "error" not in pushed.lower(), pushed
    digest = setup["docker"].images.get_registry_data(f"{repo}:v1").id
    return f"{repo}@{digest}"


def _envelope(ref: str, pred: dict, setup) -> str:
    p = setup["d"] / "pred.json"
    p.write_text(json.dumps(pred))
    return subprocess.run(["cosign", "attest", "--allow-http-registry", "--allow-insecure-registry", "--yes", "--no-upload",
                           "--tlog-upload=false", "--type", statements.TEST_RESULT_TYPE, "--predicate", str(p), "--key",
                           str(setup["d"] / "ours.key"), ref], capture_output=True, text=True, check=True).stdout


def _sign(ref: str, case: Case, setup, name: str) -> list[dict]:
    """What `validate --attest` signs for the case (its predicates, edited where the case says) onto `ref`; a statement
    about another image is signed for that image and attached to `ref`. Returns the predicates signed."""
    at = dt.datetime.now(dt.UTC) - dt.timedelta(days=case.days)
    if case.other_subject:
        other = _image(setup, f"{name}-subject")
        [pred] = predicates(case, ref=other, target=setup["t"], signed_at=at)
        (setup["d"] / "envelope.json").write_text(_envelope(other, pred, setup))
        subprocess.run(["cosign", "attach", "attestation", "--allow-http-registry", "--allow-insecure-registry",
                        "--attestation", str(setup["d"] / "envelope.json"), ref], capture_output=True, check=True)
        assert not _verified_statements(other, setup)  # nothing was attached to the other image itself
        return [pred]
    preds = predicates(case, ref=ref, target=setup["t"], signed_at=at)
    for pred in preds:
        attest.attest_data(ref, pred, statements.TEST_RESULT_TYPE,
                           signer=state_here.signer(str(setup["d"] / f"{case.key}.key")))
    return preds


def _cosign_verify(ref: str, setup, policy_file=None) -> subprocess.CompletedProcess:
    policy_args = ["--policy", str(policy_file)] if policy_file else []
    return subprocess.run(["cosign", "verify-attestation", "--allow-http-registry", "--allow-insecure-registry",
                           "--insecure-ignore-tlog=true", "--key", str(setup["d"] / "ours.pub"), "--type",
                           statements.TEST_RESULT_TYPE, *policy_args, ref], capture_output=True, text=True, timeout=60,
                          env={**os.environ})


def _verify(ref: str, policy_file, setup) -> tuple[int, str, float]:
    """cosign's decision under the policy: (exit code, the first line of its reason, seconds)."""
    t0 = time.monotonic()
    r = _cosign_verify(ref, setup, policy_file)
    reason = [ln.strip("- ").strip() for ln in r.stderr.splitlines()
              if ln.strip() and not ln.startswith(("WARNING", "will be validating", "There are", "Error:", "error during"))]
    return r.returncode, (reason[0] if reason else r.stderr.strip().splitlines()[-1]), time.monotonic() - t0


def _verified_statements(ref: str, setup) -> list[dict]:
    """The statements `cosign verify-attestation` (no policy) verified and printed, decoded from their envelopes:
    the input a --policy file gets; none when cosign verifies none (another signer, another subject)."""
    r = _cosign_verify(ref, setup)
    if r.returncode != 0:
        return []
    envelopes = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    return [json.loads(base64.b64decode(e["payload"])) for e in envelopes]


def _engines(rego_file, found: list[dict]) -> dict[str, bool]:
    """Each engine's decision for the digest, as cosign makes one of a --policy: every statement it verified admitted
    (and at least one)."""
    text = rego_file.read_text()
    allows = [rego_allow(text, s) for s in found]
    return {e: bool(allows) and all(a[e] is True for a in allows) for e in ENGINES}


@pytest.fixture(scope="module")
def pool_policies(setup):
    out = {}
    for fmt in ("cue", "rego"):
        out[fmt] = setup["d"] / f"prod-{POOL}.{fmt}"
        assert main(["--matrix", str(setup["d"] / "matrix.yaml"), "policy", "--env", "prod", "--pool", POOL, "--format",
                     fmt, "--max-age-days", "30", "--output", str(out[fmt])]) == 0
    return out


@pytest.mark.parametrize("name", sorted(CASES))
def test_cosign_opa_and_regorus_decide_each_case_alike(setup, pool_policies, name):
    case = CASES[name]
    ref = _image(setup, name)
    signed = _sign(ref, case, setup, name)
    rc, reason, seconds = _verify(ref, pool_policies["cue"], setup)
    assert (rc == 0) is case.admitted, f"{name}: cosign {'refused' if rc else 'admitted'} it: {reason}"
    assert seconds <= 5, f"verification took {seconds:.1f} s"
    if not case.admitted:
        assert case.cue_says in reason and "\n" not in reason, f"{name}: {reason}"
    found = _verified_statements(ref, setup)
    if case.verified:  # the engines judge exactly what was signed
        assert sorted(json.dumps(s["predicate"], sort_keys=True) for s in found) == \
            sorted(json.dumps(p, sort_keys=True) for p in signed)
        assert all(s["predicateType"] == statements.TEST_RESULT_TYPE for s in found)
    else:  # cosign's own checks (signer, subject): nothing reaches a policy
        assert found == []
    decisions = _engines(pool_policies["rego"], found)
    assert decisions == dict.fromkeys(ENGINES, case.admitted), f"{name}: cosign (CUE) {'admitted' if rc == 0 else 'refused'}, " \
        f"Rego: {decisions}"
    verdict = "admitted" if rc == 0 else f"refused: {reason}"
    print(f"\n{name}: {verdict} in {seconds:.2f} s; OPA and regorus agree on {len(found)} verified statement(s)")


def test_the_non_gpu_policy_admits_the_non_gpu_statement_and_not_a_pool_one(setup):
    out = {}
    for fmt in ("cue", "rego"):
        out[fmt] = setup["d"] / f"dev.{fmt}"
        assert main(["--matrix", str(setup["d"] / "matrix.yaml"), "policy", "--env", "dev", "--format", fmt,
                     "--output", str(out[fmt])]) == 0
    ref = _image(setup, "non-gpu")
    _sign(ref, CASES["non-gpu-scope"], setup, "non-gpu")
    assert _verify(ref, out["cue"], setup)[0] == 0
    assert _engines(out["rego"], _verified_statements(ref, setup)) == dict.fromkeys(ENGINES, True)
    gpu = _image(setup, "gpu-only")
    _sign(gpu, CASES["good"], setup, "gpu-only")
    rc, reason, _ = _verify(gpu, out["cue"], setup)
    assert rc != 0 and "gpuforge.dev/scope/image" in reason, reason
    assert _engines(out["rego"], _verified_statements(gpu, setup)) == dict.fromkeys(ENGINES, False)


def test_policy_controller_document_carries_the_same_cue_and_the_key(setup):
    now = dt.datetime(2026, 12, 4, 12, tzinfo=dt.UTC)
    pub = setup["d"] / "ours.pub"
    doc = json.loads(policy.policy_controller(env="prod", pool="h200", max_age_days=30, repository="r.example/x",
                                              key=str(pub), identity=None, issuer=None, tlog=False, now=now))
    assert doc["spec"]["images"] == [{"glob": "r.example/x"}, {"glob": "r.example/x:*"}, {"glob": "r.example/x@*"}]
    assert doc["apiVersion"] == "policy.sigstore.dev/v1beta1" and doc["kind"] == "ClusterImagePolicy"
    [auth] = doc["spec"]["authorities"]
    assert auth["key"]["data"] == pub.read_text()
    [att] = auth["attestations"]
    assert att["predicateType"] == statements.TEST_RESULT_TYPE and att["policy"]["type"] == "cue"
    assert att["policy"]["data"] == policy.cue(env="prod", pool="h200", max_age_days=30, now=now)
    for bad in (setup["d"] / "ours.key", setup["d"] / "matrix.yaml"):  # a private key never goes into the document
        r = subprocess.run([sys.executable, "-m", "gpuforge", "--matrix", str(setup["d"] / "matrix.yaml"), "policy",
                            "--env", "prod", "--format", "policy-controller", "--key", str(bad)],
                           capture_output=True, text=True, timeout=120)
        # the private key is refused by the option's own check (every --key), the matrix file by the policy's
        why = "is a private key: --key is the public key" if bad.suffix == ".key" else "not a PEM public key"
        assert r.returncode == 2 and why in r.stderr and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
