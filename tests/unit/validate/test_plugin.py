"""The validator plugin stands on testinfra's own `--hosts`: a host given there is the host the checks talk to
(once `--gpuforge-host` existed beside it and `--hosts ssh://...` was silently ignored). The real pytest and
testinfra, on local:// and on an ssh:// that refuses (no engine needed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from gpuforge import paths
from gpuforge.validate import plugins

ROOT = paths.project_root()


def _validators(tmp_path, *args: str, file: str = "test_versions.py") -> tuple[subprocess.CompletedProcess, dict | None]:
    out = tmp_path / "report.json"
    r = subprocess.run([sys.executable, "-m", "pytest", f"validators/{file}", *plugins.PLUGIN_ARGS, "-q",
                        "--rootdir", "validators", "--gpuforge-report", str(out), *args],
                       cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
                       env={**os.environ, **plugins.PLUGIN_ENV})
    return r, (json.loads(out.read_text()) if out.exists() else None)


def _host_python() -> str:
    return subprocess.run(["python3", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                          capture_output=True, text=True, check=True).stdout.strip()


def test_hosts_local_is_the_host_checked(tmp_path):
    want = _host_python()
    r, rep = _validators(tmp_path, "--hosts", "local://", "--gpuforge-expect", f"python={want}", "-k", "test_python")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert rep["host"] == "local://"
    assert rep["facts"]["versions"]["python"] == want
    assert [c["outcome"] for c in rep["checks"] if c["name"] == "test_python"] == ["passed"]


def test_a_wrong_expectation_on_local_fails(tmp_path):
    r, rep = _validators(tmp_path, "--hosts", "local://", "--gpuforge-expect", "python=2.7", "-k", "test_python")
    assert r.returncode == 1
    assert [c["outcome"] for c in rep["checks"] if c["name"] == "test_python"] == ["failed"]


def test_hosts_ssh_is_used_not_ignored(tmp_path):
    """An ssh:// host that refuses connections: the checks fail talking to it (a plugin ignoring --hosts
    would run them on this machine and pass)."""
    r, rep = _validators(tmp_path, "--hosts", "ssh://nobody@127.0.0.1:1", "--gpuforge-expect", f"python={_host_python()}",
                         "--ssh-config", "/dev/null", "-k", "test_python")
    assert r.returncode == 1, r.stdout[-3000:]
    assert rep["host"] == "ssh://nobody@127.0.0.1:1"
    check = next(c for c in rep["checks"] if c["name"] == "test_python")
    assert check["outcome"] == "failed"
    assert "versions" not in rep["facts"]


def test_the_old_host_option_is_gone(tmp_path):
    r, rep = _validators(tmp_path, "--gpuforge-host", "local://", "--gpuforge-expect", "python=3.11")
    assert r.returncode == 4 and "unrecognized arguments: --gpuforge-host" in r.stderr
    assert rep is None


def test_image_and_hosts_together_are_refused(tmp_path):
    r, _ = _validators(tmp_path, "--gpuforge-image", "x", "--hosts", "local://", "--gpuforge-expect", "python=3.11")
    assert r.returncode == 4 and "give either --gpuforge-image" in r.stderr


def test_a_target_json_of_another_shape_is_one_usage_line(tmp_path):
    bad = tmp_path / "target.json"
    bad.write_text('{"torch": 2.7}')
    r, _ = _validators(tmp_path, "--hosts", "local://", "--gpuforge-target", str(bad))
    assert r.returncode == 4
    assert f"{bad}: torch=2.7 is not a version or name" in r.stderr and "Traceback" not in r.stderr


def _plugins(plugin_args: tuple[str, ...], env: dict) -> str:
    """The plugins pytest registers for the validators (its --trace-config lines), collecting only."""
    r = subprocess.run([sys.executable, "-m", "pytest", "validators/test_versions.py", *plugin_args, "-q",
                        "--rootdir", "validators", "--co", "--trace-config"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300, check=False, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    return "\n".join(x for x in r.stdout.splitlines() if x.startswith("PLUGIN registered"))


def test_a_validator_run_loads_testinfra_and_no_other_installed_plugin():
    """hypothesis's pytest plugin is installed beside gpuforge here (the dev lock): a validator run does not load it
    (nor would it a pytest-randomly that reorders checks), yet loads testinfra, whose --hosts the checks stand on."""
    ours = _plugins(plugins.PLUGIN_ARGS, {**os.environ, **plugins.PLUGIN_ENV})
    assert "testinfra" in ours and "pytest_timeout" in ours and "hypothesis" not in ours, ours
    autoloaded = _plugins(("-p", "no:cacheprovider"), dict(os.environ))
    assert "hypothesis" in autoloaded, "hypothesis is not installed here: this test proves nothing"


# --- validators chosen by the image's kind ---------------------------------------------------------

DEVEL_ONLY = {"test_devel.py::test_cuda_home_holds_the_toolkit", "test_devel.py::test_toolkit_wheels_at_their_pins",
              "test_devel.py::test_cuda_extension_builds_and_compiles_its_kernel",
              "test_devel.py::test_aoti_cpp_loader_builds_and_links",
              "test_devel.py::test_cuda_base_devel_nvcc_is_the_target_cuda"}


def test_a_devel_check_is_not_collected_for_a_runtime_target(tmp_path):
    """A runtime target's run never collects a devel check: deselected at collection as not applicable, not a skip,
    and not a narrowing of the run (which would make it partial)."""
    r, rep = _validators(tmp_path, "--hosts", "local://", "--gpuforge-expect", "flavor=runtime",
                         "--gpuforge-expect", "source=wheels", "--collect-only", file="test_devel.py")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert [x for x in r.stdout.splitlines() if "::" in x] == ["test_devel.py::test_runtime_has_no_cuda_compiler"]
    sel = rep["selection"]
    assert {n["id"] for n in sel["not_applicable"]} == DEVEL_ONLY
    assert {n["why"] for n in sel["not_applicable"]} == {"devel images only: this image is runtime"}
    assert not sel["narrowed"] and sel["deselected"] == []
    assert sel["kind"] == {"flavor": "runtime", "source": "wheels", "gpu": False}


def test_a_cuda_base_devel_target_collects_its_nvcc_check_and_not_the_wheels_toolkit(tmp_path):
    r, rep = _validators(tmp_path, "--hosts", "local://", "--gpuforge-expect", "flavor=devel",
                         "--gpuforge-expect", "source=cuda-base", "--collect-only", file="test_devel.py")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert [x for x in r.stdout.splitlines() if "::" in x] == ["test_devel.py::test_cuda_base_devel_nvcc_is_the_target_cuda"]
    assert {n["why"] for n in rep["selection"]["not_applicable"]} == {
        "runtime images only: this image is devel", "images built from wheels only: this image is built from cuda-base"}


def test_gpu_checks_are_not_collected_without_gpus(tmp_path):
    r, rep = _validators(tmp_path, "--hosts", "local://", "--gpuforge-expect", "flavor=runtime", "--collect-only",
                         file="test_gpu_smoke.py")
    assert r.returncode == 5, r.stdout[-3000:] + r.stderr[-2000:]  # pytest's "no tests collected"
    assert rep["selection"]["not_applicable"] and not rep["selection"]["narrowed"]
    assert all(n["why"].startswith("GPU runs only") for n in rep["selection"]["not_applicable"])


TYPED = """
import pytest

from gpuforge.validate.selection import EnvSkip
from vutil import EnvSkipped


def test_typed():
    raise EnvSkipped(EnvSkip.NO_BUILD_CA, "none given")


def test_worded():
    pytest.skip("no build CA: the build was given no extra CA bundle")
"""


def test_only_a_typed_skip_of_a_chosen_check_is_evidence(tmp_path):
    """The plugin records the typed reason a validator raises (vutil.EnvSkipped); a skip with the same words and no
    type makes the evidence refuse the report."""
    from gpuforge.validate import evidence

    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "conftest.py").write_text('pytest_plugins = ["plugin"]\n')
    (suite / "test_typed.py").write_text(TYPED)
    out = tmp_path / "report.json"
    r = subprocess.run([sys.executable, "-m", "pytest", str(suite), *plugins.PLUGIN_ARGS, "-q", "--rootdir", str(suite),
                        "--hosts", "local://", "--gpuforge-expect", "python=3", "--gpuforge-report", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
                       env={**os.environ, **plugins.PLUGIN_ENV, "PYTHONPATH": str(ROOT / "validators")})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    rep = json.loads(out.read_text())
    by_name = {c["name"]: c for c in rep["checks"]}
    assert by_name["test_typed"]["skip"] == "no-build-ca" and "skip" not in by_name["test_worded"]
    rep["evidence"] = evidence.stamp(rep, required=tuple(c["id"] for c in rep["checks"]), gpu=False)
    assert [p for p in evidence.problems(rep) if "skipped" in p] == [
        "required check test_worded skipped (no build CA: the build was given no extra CA bundle; "
        "a chosen check may skip only for a typed environmental reason)"]
