"""The validators against real containers: the full suite is green on the default image, a validate's errors are
clear, and no container survives an interrupted or killed run. Each validator failing on a broken image for its
stated reason: test_broken_images.py."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid

import pytest

from conftest import ROOT, ctrl_c_able, dead_runs_window, gpuforge, reaping_validate
from gpuforge.engine import containers as run
from gpuforge.errors import EngineError
from gpuforge.plan.matrix import load_matrix
from gpuforge.validate import plugins, report
from gpuforge.validate.pytest_run import GPU_MODULES

pytestmark = pytest.mark.docker
sys.path.insert(0, str(ROOT / "validators"))


def test_wrong_expected_torch_fails_versions(default_build, tmp_path):
    t, rec = default_build
    r = gpuforge("validate", "--reports", str(tmp_path), "--pytest-args", "-k test_torch --gpuforge-expect torch=2.7.0+cu126")
    assert r.returncode == 5, r.stdout[-2000:]
    rep = report.load(tmp_path / t.id / "report.json")
    assert [c["name"] for c in rep["checks"] if c["outcome"] == "failed"] == ["test_torch"]


def test_complete_run_with_unlisted_skips_fails_validate(default_build, tmp_path):
    """Every required check ran (none deselected), but they skipped for a reason off the reviewed list:
    not partial, not evidence, and `gpuforge validate` exits 5 naming why."""
    from state_here import records

    t, _ = default_build
    before = records.require_build(t.id)
    path = f"{ROOT / 'tests' / 'integration' / 'validate'}:{os.environ.get('PYTHONPATH', '')}"
    try:
        r = gpuforge("validate", "--reports", str(tmp_path), "--pytest-args", "-p skip_everything", env={"PYTHONPATH": path})
    finally:
        records.restore_build(t.id, before)
    assert r.returncode == 5, r.stderr[-2000:]
    assert "not evidence: required check" in r.stderr and "a chosen check may skip only for a typed" in r.stderr
    rep = report.load(tmp_path / t.id / "report.json")
    assert not rep["evidence"]["partial"] and not rep["green"]
    assert "RED" in (tmp_path / t.id / "report.md").read_text()


# These runs each get a run id of their own (GPUFORGE_RUN_ID) and look only at their own containers: other test
# modules may validate on the same engine at the same time (`nox -s tests` runs modules side by side).

def _validate(tmp_path, run_id: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "gpuforge", "validate", "--reports", str(tmp_path)], cwd=ROOT,
                            env={**os.environ, "GPUFORGE_RUN_ID": run_id}, start_new_session=True,
                            preexec_fn=ctrl_c_able, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _ours(run_id: str) -> list[str]:
    """Ids of the containers of the validator run that `gpuforge validate` started under run_id (its pytest child's
    run id is `<run_id>-<target>`); the low-level list, so another run's removals never race an inspect."""
    from gpuforge.engine import client as engine

    t = load_matrix().select(None)[0]
    child = f"{run_id}-{t.id}"[:60]
    return [c["Id"] for c in engine.client().api.containers(all=True, filters={"label": f"{run.RUN_LABEL}={child}"})]


def _wait_for(run_id: str, n: int = 1, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while len(_ours(run_id)) < n and time.monotonic() < deadline:
        time.sleep(0.2)


def test_interrupted_validate_leaves_no_container(default_build, tmp_path):
    rid = f"int-{uuid.uuid4().hex[:8]}"
    proc = _validate(tmp_path, rid)
    try:
        _wait_for(rid)
        assert _ours(rid), "validate started no container within 120 s"
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C sends to the foreground group
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode != 0
    assert _ours(rid) == [], "containers left after Ctrl-C"


def test_clean_removes_what_a_crashed_run_left(default_build, tmp_path):
    rid = f"crash-{uuid.uuid4().hex[:8]}"
    proc = _validate(tmp_path, rid)
    _wait_for(rid)
    with dead_runs_window(leaves_them=True):  # its containers stay on the shared engine until this clean
        os.killpg(proc.pid, signal.SIGKILL)  # a crash: nobody gets to clean up
        proc.wait(timeout=60)
        assert _ours(rid), "expected leftovers after a crash"
        r = gpuforge("clean")
        assert r.returncode == 0 and "removed" in r.stdout
        assert _ours(rid) == []


def test_next_run_reaps_what_a_killed_run_left(default_build, tmp_path):
    """SIGKILL leaves containers behind; the next gpuforge run that uses the engine removes them (their
    owning process is gone), without `gpuforge clean` and without touching live runs' containers."""
    _, rec = default_build
    rid = f"reap-{uuid.uuid4().hex[:8]}"
    with run.container(rec["image_id"], ["sleep", "infinity"]) as alive:
        proc = _validate(tmp_path, rid)
        _wait_for(rid, 1)
        with dead_runs_window(leaves_them=True):  # its containers stay on the shared engine until the next run
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
            left = _ours(rid)
            assert left, "expected containers left by the killed run"
            r = reaping_validate(tmp_path)
            # (another run on a shared engine may reap them first: what counts is that none is left, and the live
            # one is)
            assert "left by gpuforge runs that died" in r.stderr or not _ours(rid), r.stderr
            assert not set(_ours(rid)) & set(left), "containers of the killed run survived the next run"
        assert alive.id in {c.id for c in run.leftovers(run.run_id())}, "reaping removed the container of a live run"


def test_build_compares_compat_arch_list_with_the_wheel(default_build):
    """Every build reads the installed wheel's arch flags; the default image's agree with the compat data
    (the build would have failed otherwise), and a compat list off by one architecture is caught."""
    import dataclasses

    from gpuforge.builder import archcheck

    t, rec = default_build
    flags = archcheck.wheel_arch_flags(rec["image_id"])
    assert archcheck.mismatch(t.variant, flags) is None
    wrong = dataclasses.replace(t.variant, arch_list=(*t.variant.arch_list, "sm_120"))
    assert "missing from the wheel: ['sm_120']" in archcheck.mismatch(wrong, flags)


def test_hung_command_fails_with_a_clear_message(default_build):
    import testinfra

    from vutil import sh

    _, rec = default_build
    with run.container(rec["image_id"], ["sleep", "infinity"]) as c:
        host = testinfra.get_host(f"docker://{c.id}")
        t0 = time.monotonic()
        with pytest.raises(pytest.fail.Exception, match="timed out after 2s: sleep 60"):
            sh(host, "sleep 60", timeout=2)
        assert time.monotonic() - t0 < 20


def test_port_already_taken_is_a_clear_error(default_build):
    _, rec = default_build
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(EngineError, match=f"port already taken \\(127.0.0.1:{port}\\)"):
            with run.container(rec["image_id"], ["sleep", "infinity"], ports={22: port}):
                pass
    assert run.leftovers(run.run_id()) == []  # this process's own containers: other modules may run beside it


def test_validate_errors_are_clear(default_build):
    r = gpuforge("validate", "cuda=12.8", "flavor=runtime")
    assert r.returncode == 8 and "has not been built" in r.stderr and "gpuforge build" in r.stderr  # a state file
    r = gpuforge("validate", "nope-*")
    assert r.returncode == 2 and "matches no target id" in r.stderr
    r = gpuforge("validate", env={"DOCKER_HOST": "unix:///nonexistent.sock"})
    assert r.returncode == 3 and "cannot reach the Docker engine" in r.stderr


def test_entrypoint_preflight_warns_once_without_gpu(default_build, docker_engine):
    _, rec = default_build
    out = docker_engine.containers.run(rec["image_id"], ["true"], remove=True, stdout=True, stderr=True).decode()
    assert out.count("gpuforge: warning: no NVIDIA driver visible") == 1, out


def test_validators_run_over_ssh(default_build, tmp_path):
    """The same checklist modules against ssh:// (testinfra's OpenSSH backend), into the image's ssh mode."""
    import paramiko

    t, rec = default_build
    key = paramiko.RSAKey.generate(2048)
    key.write_private_key_file(str(tmp_path / "id_rsa"))
    pub = f"{key.get_name()} {key.get_base64()}"
    target = tmp_path / "target.json"
    target.write_text(t.expected_json())
    out = tmp_path / "report.json"
    with run.container(rec["image_id"], ["ssh"], user="root", env={"SSH_AUTHORIZED_KEYS": pub}, ports={22: None}) as c:
        c.wait_for_log("Server listening on", timeout=60)
        # each container has a fresh host key: trust it for this run only (testinfra reads an ssh_config)
        cfg = tmp_path / "ssh_config"
        cfg.write_text("Host *\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n")
        spec = f"ssh://{t.settings.user}@127.0.0.1:{c.port(22)}"
        # testinfra's own options: --hosts and its connection options reach the checks' `host`
        r = subprocess.run([sys.executable, "-m", "pytest", "validators/test_versions.py", *plugins.PLUGIN_ARGS, "-q",
                            "--rootdir", "validators", "--hosts", spec, "--ssh-identity-file", str(tmp_path / "id_rsa"),
                            "--ssh-config", str(cfg), "--gpuforge-target", str(target),
                            "--gpuforge-report", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300,
                           env={**os.environ, **plugins.PLUGIN_ENV})
    rep = json.loads(out.read_text())
    assert r.returncode == 0, r.stdout[-3000:]
    assert rep["host"].startswith("ssh://") and rep["facts"]["versions"]["torch"] == t.expected().torch
    passed = {c["name"] for c in rep["checks"] if c["outcome"] == "passed"}
    assert {"test_torch", "test_cuda", "test_cudnn", "test_nccl", "test_triton", "test_python"} <= passed


# Last in the module: `validated` (the run's push and signed validation, ~6 min on test_registry's worker) is ready by
# then, wherever this module starts (tests/conftest.py LONGEST_FIRST gives it to a worker after its first module).
def test_full_suite_is_green_with_reports(validated):
    t = validated["target"]
    d = validated["reports"] / t.id
    rep = report.load(d / "report.json")
    assert rep["green"] and report.is_green(rep)
    assert rep["facts"]["image_id"] == validated["record"]["image_id"]
    assert rep["facts"]["versions"]["torch"] == t.expected().torch
    names = {c["module"] for c in rep["checks"]}
    assert {"test_metadata", "test_versions", "test_security", "test_ssh", "test_jupyter", "test_inductor_cpu",
            "test_inventory", "test_journeys", "test_metrics", "test_devel"} <= names
    # chosen by the image's kind (a runtime image, no GPU): the devel promises and the GPU checks are never run nor
    # skipped, but listed as not applicable; a chosen check skips only for a typed environmental reason
    assert not names & (GPU_MODULES - {"test_driver"})  # the driver checks run: a container without GPUs sees no driver
    devel = {c["name"] for c in rep["checks"] if c["module"] == "test_devel"}
    assert devel == {"test_runtime_has_no_cuda_compiler"}, devel
    na = {n["id"]: n["why"] for n in rep["selection"]["not_applicable"]}
    assert "test_devel.py::test_cuda_home_holds_the_toolkit" in na and "test_gpu_smoke.py::test_cuda_available" in na
    assert {m.split("::")[0].removesuffix(".py") for m in na} >= (GPU_MODULES - {"test_driver"}) | {"test_devel"}
    assert not rep["selection"]["narrowed"]
    skipped = [c for c in rep["checks"] if c["outcome"] == "skipped"]
    assert all(c.get("skip") for c in skipped), skipped
    md = (d / "report.md").read_text()
    assert "#### Not applicable to this image (runtime/wheels, no GPU)" in md and "devel images only" in md
    ev = rep["evidence"]
    assert not ev["partial"] and ev["missing"] == [] and set(ev["required"]) == {c["id"] for c in rep["checks"]}
    assert ev["kind"] == {"flavor": "runtime", "source": "wheels", "gpu": False}
    assert ev["validator_set"].startswith("sha256:") and ev["gpuforge_version"] and ev["image_id"] == rep["facts"]["image_id"]
    assert rep["facts"]["ssh_audit_fail"] == 0
    assert (d / "report.xml").read_text().count("<testcase") == len(rep["checks"])
    assert "GREEN" in (d / "report.md").read_text()
    assert "GREEN" in validated["summary"].read_text()
    sbom = json.loads((d / "sbom.json").read_text())
    assert sbom["image_id"] == rep["facts"]["image_id"] and sbom["python"]["torch"].startswith("2.7.1")
