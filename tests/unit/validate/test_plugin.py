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
