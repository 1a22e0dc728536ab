"""How containers ask for GPUs (nvidia runtime or CDI): --gpu-request, then GPUFORGE_GPU_REQUEST, then
matrix.yaml's `gpu_request`, then nvidia. A bad value from any source is one error line naming that source
and the allowed values, exit 2, before anything talks to the engine."""

from __future__ import annotations

import pytest

from conftest import BASE_MATRIX
from gpuforge import cli, options
from gpuforge.engine import client as engine
from gpuforge.engine import containers as run
from gpuforge.errors import ConfigError
from gpuforge.grammar import GPU_REQUESTS
from gpuforge.plan.matrix import load_matrix
from gpuforge.plan.schema import json_schema
from gpuforge.validate import pytest_run as validate

ENV = "GPUFORGE_GPU_REQUEST"
LINE = len(BASE_MATRIX.splitlines()) + 1  # the line of an appended key


@pytest.fixture(autouse=True)
def no_env(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)


@pytest.fixture
def no_engine(monkeypatch):
    """A tripwire: these commands must stop before the engine or the validators are reached."""
    def tripped(*a, **k):
        pytest.fail("reached the engine / validators with a bad GPU request")
    monkeypatch.setattr(engine, "client", tripped)
    monkeypatch.setattr(validate, "_pytest", tripped)


def _matrix(write_matrix, value: str | None):
    return write_matrix(BASE_MATRIX + (f"gpu_request: {value}\n" if value is not None else ""))


# (flag, env, matrix value, expected value, expected source; "M" stands for "<matrix path>:LINE: gpu_request")
PRECEDENCE = [
    (None, None, None, "nvidia", "default"),
    (None, None, "cdi", "cdi", "M"),
    (None, "nvidia", "cdi", "nvidia", ENV),
    ("cdi", "nvidia", "nvidia", "cdi", "--gpu-request"),
    ("cdi", None, None, "cdi", "--gpu-request"),
    (None, "", "cdi", "cdi", "M"),  # an empty env var is unset
    (None, None, "null", "nvidia", "default"),  # `gpu_request: null` leaves the default
]


@pytest.mark.parametrize(("flag", "env", "in_matrix", "value", "source"), PRECEDENCE)
def test_flag_then_env_then_matrix_then_default(write_matrix, monkeypatch, flag, env, in_matrix, value, source):
    path = _matrix(write_matrix, in_matrix)
    if env is not None:
        monkeypatch.setenv(ENV, env)
    got = options.gpu_request(flag, load_matrix(path))
    assert got.value == value
    assert got.source == (f"{path}:{LINE}: gpu_request" if source == "M" else source)


def test_without_a_matrix_the_matrix_is_not_a_source(monkeypatch):
    assert options.gpu_request(None).source == "default"
    monkeypatch.setenv(ENV, "cdi")
    assert (options.gpu_request(None).value, options.gpu_request(None).source) == ("cdi", ENV)


@pytest.mark.parametrize(("flag", "env", "line"), [
    ("amd", None, "--gpu-request: 'amd' is not a GPU request mode (allowed: nvidia, cdi)"),
    (None, "cid", "GPUFORGE_GPU_REQUEST: 'cid' is not a GPU request mode (allowed: nvidia, cdi); perhaps you meant 'cdi'?"),
    (None, "nvidia; rm -rf /", "GPUFORGE_GPU_REQUEST: 'nvidia; rm -rf /' is not a GPU request mode (allowed: nvidia, cdi)"),
    ("nvida", "cdi", "--gpu-request: 'nvida' is not a GPU request mode (allowed: nvidia, cdi); perhaps you meant 'nvidia'?"),
])
def test_a_bad_flag_or_env_names_its_source(monkeypatch, flag, env, line):
    if env is not None:
        monkeypatch.setenv(ENV, env)
    with pytest.raises(ConfigError) as e:
        options.gpu_request(flag)
    assert str(e.value) == line
    assert e.value.return_code == 2


def test_the_matrix_value_is_checked_at_load_at_its_line(write_matrix, capsys):
    path = _matrix(write_matrix, "amd")
    assert cli.main(["--matrix", str(path), "plan"]) == 2
    err = capsys.readouterr().err
    assert err == f"gpuforge: error: {path}:{LINE}: gpu_request: 'amd' is not allowed (allowed: nvidia, cdi)\n"


def test_a_matrix_value_that_slipped_past_the_load_is_refused_at_its_line(write_matrix):
    m = load_matrix(_matrix(write_matrix, "cdi"))
    object.__setattr__(m.spec, "gpu_request", "amd")  # as if the model had let it through
    with pytest.raises(ConfigError, match=rf"^{m.path}:{LINE}: gpu_request: 'amd' is not a GPU request mode \(allowed: nvidia, cdi\)$"):
        options.gpu_request(None, m)


@pytest.mark.parametrize(("argv", "env", "in_matrix", "where"), [
    (["smoke", "--image", "img", "--gpu-request", "amd"], None, None, "--gpu-request: 'amd'"),
    (["smoke", "--image", "img"], "rocm", "cdi", "GPUFORGE_GPU_REQUEST: 'rocm'"),
    (["smoke", "--image", "img"], None, "amd", "{path}:{line}: gpu_request: 'amd'"),
    (["smoke", "local://", "--gpu-request", "amd"], None, None, "--gpu-request: 'amd'"),
    (["validate", "--gpu", "--gpu-request", "amd"], None, None, "--gpu-request: 'amd'"),
    (["validate", "--gpu"], "amd", None, "GPUFORGE_GPU_REQUEST: 'amd'"),
    (["validate", "--gpu"], None, "amd", "{path}:{line}: gpu_request: 'amd'"),
])
def test_the_cli_stops_with_one_line_before_the_engine(write_matrix, monkeypatch, capsys, no_engine, argv, env, in_matrix, where):
    path = _matrix(write_matrix, in_matrix)
    if env is not None:
        monkeypatch.setenv(ENV, env)
    monkeypatch.setattr(run, "reap", lambda: 0)  # main() reaps dead runs' containers before validate
    rc = cli.main(["--matrix", str(path), *argv])
    out, err = capsys.readouterr()
    assert rc == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("gpuforge: error: " + where.format(path=path, line=LINE)), err
    assert "nvidia, cdi" in err


@pytest.mark.parametrize(("argv", "env", "in_matrix", "value", "source"), [
    (["smoke", "--image", "img"], None, "cdi", "cdi", "{path}:{line}: gpu_request"),
    (["smoke", "--image", "img"], "nvidia", "cdi", "nvidia", ENV),
    (["smoke", "--image", "img", "--gpu-request", "cdi"], "nvidia", None, "cdi", "--gpu-request"),
    (["smoke", "--image", "img"], None, None, "nvidia", "default"),
    (["validate", "--gpu"], None, "cdi", "cdi", "{path}:{line}: gpu_request"),
    (["validate", "--gpu", "--gpu-request", "nvidia"], "cdi", "cdi", "nvidia", "--gpu-request"),
])
def test_validate_and_smoke_start_containers_with_the_resolved_mode(write_matrix, monkeypatch, capsys, argv, env, in_matrix,
                                                                     value, source):
    path = _matrix(write_matrix, in_matrix)
    if env is not None:
        monkeypatch.setenv(ENV, env)
    seen = {}
    monkeypatch.setattr(validate, "smoke", lambda *a, **k: seen.update(k) or 0)
    monkeypatch.setattr(validate, "validate_targets", lambda *a, **k: seen.update(k) or 0)
    monkeypatch.setattr(cli, "_reap", lambda: None)  # main() reaps dead runs' containers before validate
    assert cli.main(["--matrix", str(path), *argv]) == 0
    assert seen["gpu_request"] == value
    said = f"gpuforge: GPU request {value} (from {source.format(path=path, line=LINE)})\n"
    assert said in capsys.readouterr().out


def test_smoke_with_only_a_target_json_needs_no_matrix(tmp_path, monkeypatch):
    seen = {}
    monkeypatch.setattr(validate, "smoke", lambda *a, **k: seen.update(k) or 0)
    assert cli.main(["--matrix", str(tmp_path / "absent.yaml"), "smoke", "local://",
                     "--target-json", str(tmp_path / "target.json")]) == 0
    assert seen["gpu_request"] == "nvidia"



def test_smoke_with_a_target_json_is_not_stopped_by_a_broken_matrix_beside_it(tmp_path, monkeypatch, capsys):
    """The versions come from --target-json; a stale matrix.yaml on the runner only loses its gpu_request (said)."""
    seen = {}
    monkeypatch.setattr(validate, "smoke", lambda *a, **k: seen.update(k) or 0)
    bad = tmp_path / "matrix.yaml"
    bad.write_text("registry: [\n")
    assert cli.main(["--matrix", str(bad), "smoke", "local://", "--target-json", str(tmp_path / "t.json")]) == 0
    assert seen["gpu_request"] == "nvidia"
    assert f"{bad} not read for gpu_request" in capsys.readouterr().err
    assert cli.main(["--matrix", str(bad), "smoke", "local://"]) == ConfigError.return_code  # no target.json: needed
    assert capsys.readouterr().err.startswith("gpuforge: error: ")

def test_one_home_for_the_modes():
    assert run.GPU_REQUESTS is GPU_REQUESTS
    assert json_schema()["properties"]["gpu_request"]["anyOf"][0]["enum"] == list(GPU_REQUESTS)
    for mode in GPU_REQUESTS:  # every mode the settings accept is one the engine request knows
        assert run.gpu_device_request(mode)
    assert GPU_REQUESTS[0] == options.gpu_request(None).value == "nvidia"
