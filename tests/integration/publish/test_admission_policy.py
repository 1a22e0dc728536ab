"""The admission policy (#28), evaluated for real: `gpuforge policy --env prod --pool h200 --format cue` is handed to
`cosign verify-attestation --policy` against a local registry (Debian's docker-registry), on one good image and the
hostile ones, each refused with a one-line reason: evidence for another pool, a failed test, a skipped required check,
evidence older than the time to live, another signer, and a statement whose subject is another digest.

Each image is a small image of its own (one file; `docker import`), carrying the in-toto Test Result that gpuforge's
own code makes (gpuforge.publish.statements, from the real H200 run's report: tests/fleet_reports.py) and signs
(gpuforge.registry.attest). cosign requires every Test Result on a digest to pass its --policy, so each carries one.
"""

from __future__ import annotations

import copy
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
from fleet_reports import BASE, FLEET, base_from_h200_run, gpu_report
from registries import LocalRegistry

from conftest import need
from gpuforge.cli import main
from gpuforge.plan.matrix import load_matrix
from gpuforge.publish import policy, statements
from gpuforge.registry import attest
from gpuforge.validate.report_model import Report

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
    repo = f"{setup['reg'].host}/gpuforge-admission/{name}"
    setup["docker"].api.import_image_from_data(buf.getvalue(), repository=repo, tag="v1")
    pushed = setup["docker"].images.push(repo, tag="v1")
    assert "error" not in pushed.lower(), pushed
    digest = setup["docker"].images.get_registry_data(f"{repo}:v1").id
    return f"{repo}@{digest}"


def _sign(ref: str, rep: dict, setup, *, key: str = "ours", at: dt.datetime | None = None) -> None:
    """What `validate --attest` signs as the Test Result of this report (its statement for the first scope)."""
    [pred, *_] = statements.test_results(Report.of(rep), ref=ref, target=setup["t"], signed_at=at)
    attest.attest_data(ref, pred, statements.TEST_RESULT_TYPE, signer=state_here.signer(str(setup["d"] / f"{key}.key")))


def _verify(ref: str, policy_file, setup) -> tuple[int, str, float]:
    t0 = time.monotonic()
    r = subprocess.run(["cosign", "verify-attestation", "--allow-http-registry", "--allow-insecure-registry",
                        "--insecure-ignore-tlog=true", "--key", str(setup["d"] / "ours.pub"), "--type",
                        statements.TEST_RESULT_TYPE, "--policy", str(policy_file), ref],
                       capture_output=True, text=True, timeout=60, env={**os.environ})
    reason = [ln.strip("- ").strip() for ln in r.stderr.splitlines()
              if ln.strip() and not ln.startswith(("WARNING", "will be validating", "There are", "Error:", "error during"))]
    return r.returncode, (reason[0] if reason else r.stderr.strip().splitlines()[-1]), time.monotonic() - t0


@pytest.fixture(scope="module")
def pool_policy(setup):
    out = setup["d"] / "prod-h200.cue"
    assert main(["--matrix", str(setup["d"] / "matrix.yaml"), "policy", "--env", "prod", "--pool", "h200", "--format",
                 "cue", "--max-age-days", "30", "--output", str(out)]) == 0
    return out


def _green_h200() -> dict:
    return gpu_report(base_from_h200_run())


def _failed() -> dict:
    rep = copy.deepcopy(_green_h200())
    next(c for c in rep["checks"] if c["outcome"] == "passed")["outcome"] = "failed"
    return rep


def _skipped_required() -> dict:
    rep = copy.deepcopy(_green_h200())
    c = next(c for c in rep["checks"] if c["outcome"] == "passed" and c["id"] in rep["evidence"]["required"])
    c.update(outcome="skipped", message="Skipped: not today")
    return rep


CASES = {  # case -> (report, signing key, signed days ago, the refusal's reason)
    "another-pool": (lambda: gpu_report(base_from_h200_run(), model="A100", driver="570.133.20"), "ours", 0,
                     'configuration.0.name: conflicting values "gpuforge.dev/pool/a100" and "gpuforge.dev/pool/h200"'),
    "failed-test": (_failed, "ours", 0, 'predicate.result: invalid value "FAILED"'),
    "skipped-required": (_skipped_required, "ours", 0, 'predicate.result: invalid value "FAILED"'),
    "expired": (_green_h200, "ours", 40, "configuration.2.annotations.signedAt: invalid value"),
    "another-signer": (_green_h200, "other", 0, "no matching attestations"),
}


def test_the_good_image_is_admitted_to_its_pool(setup, pool_policy):
    ref = _image(setup, "good")
    _sign(ref, _green_h200(), setup)
    rc, reason, seconds = _verify(ref, pool_policy, setup)
    assert rc == 0, reason
    assert seconds <= 5, f"verification took {seconds:.1f} s"
    print(f"\nadmitted {ref} to pool h200 in {seconds:.2f} s")


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_hostile_image_is_refused_in_one_line(setup, pool_policy, case):
    make, key, days, why = CASES[case]
    ref = _image(setup, case)
    _sign(ref, make(), setup, key=key, at=dt.datetime.now(dt.UTC) - dt.timedelta(days=days))
    rc, reason, seconds = _verify(ref, pool_policy, setup)
    assert rc != 0, f"{case}: admitted"
    assert why in reason, f"{case}: {reason}"
    assert "\n" not in reason and seconds <= 5
    print(f"\n{case}: refused in {seconds:.2f} s: {reason}")


def test_a_statement_about_another_digest_is_refused(setup, pool_policy):
    """A valid statement for image B, signed with our key, attached to image A: its subject is not A's digest."""
    a, b = _image(setup, "subject-a"), _image(setup, "subject-b")
    [pred, *_] = statements.test_results(Report.of(_green_h200()), ref=b, target=setup["t"])
    p = setup["d"] / "b-pred.json"
    p.write_text(json.dumps(pred))
    env = subprocess.run(["cosign", "attest", "--allow-http-registry", "--allow-insecure-registry", "--yes", "--no-upload",
                          "--tlog-upload=false", "--type", statements.TEST_RESULT_TYPE, "--predicate", str(p), "--key",
                          str(setup["d"] / "ours.key"), b], capture_output=True, text=True, check=True).stdout
    (setup["d"] / "b-envelope.json").write_text(env)
    subprocess.run(["cosign", "attach", "attestation", "--allow-http-registry", "--allow-insecure-registry",
                    "--attestation", str(setup["d"] / "b-envelope.json"), a], capture_output=True, check=True)
    rc, reason, seconds = _verify(a, pool_policy, setup)
    assert rc != 0 and "no matching subject digest" in reason, reason
    assert _verify(b, pool_policy, setup)[0] != 0  # nothing was attached to B itself


def test_the_non_gpu_policy_admits_the_non_gpu_statement_and_not_a_pool_one(setup):
    out = setup["d"] / "dev.cue"
    assert main(["--matrix", str(setup["d"] / "matrix.yaml"), "policy", "--env", "dev", "--output", str(out)]) == 0
    rep = copy.deepcopy(_green_h200())
    rep["gpu"] = False
    rep["evidence"]["gpu_required"] = False
    ref = _image(setup, "non-gpu")
    _sign(ref, rep, setup)
    assert _verify(ref, out, setup)[0] == 0
    gpu = _image(setup, "gpu-only")
    _sign(gpu, _green_h200(), setup)
    rc, reason, _ = _verify(gpu, out, setup)
    assert rc != 0 and "gpuforge.dev/scope/image" in reason, reason


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
