"""The option table (gpuforge/options.py): each setting declared once, resolved once in the order flag,
environment, matrix.yaml, fallback variables, default; every source goes through the same check, and a bad value
is one line naming its source, exit 2, before any work."""

from __future__ import annotations

import dataclasses
import re

import pytest
from state_here import records

from conftest import BASE_MATRIX
from gpuforge import cli, options
from gpuforge.builder import runner as build
from gpuforge.errors import ConfigError
from gpuforge.push import pusher

PEM = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
EXTRA_CA_ENVS = ("GPUFORGE_EXTRA_CA", *build.HOST_TRUST_ENV)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for s in options.TABLE:
        for name in (s.env, *s.fallback_env):
            if name and name not in ("GPUFORGE_STATE_DIR", "GPUFORGE_LOG_DIR"):
                monkeypatch.delenv(name, raising=False)


@pytest.fixture
def no_build(monkeypatch):
    """A tripwire: option errors must stop `build` before the engine."""
    def tripped(*a, **k):
        pytest.fail("reached the build with a bad option")
    monkeypatch.setattr(build, "build_targets", tripped)
    monkeypatch.setattr(cli, "_reap", lambda: None)


def test_one_declaration_per_variable_and_per_flag_of_a_command():
    envs = [n for s in options.TABLE for n in (s.env, *s.fallback_env) if n]
    assert len(envs) == len(set(envs))
    assert all(e.startswith("GPUFORGE_") for s in options.TABLE if (e := s.env))
    for cmd in ("plan", "generate", "schema", "build", "validate", "smoke", "push", "promote", "attest", "clean", None):
        flags = [s.flag for s in options.TABLE if s.flag and (cmd in s.commands if cmd else not s.commands)]
        assert len(flags) == len(set(flags)), cmd


def test_the_help_names_each_variable():
    text = cli.parser()._subparsers._group_actions[0].choices["build"].format_help()
    for env in ("GPUFORGE_EXTRA_CA", "GPUFORGE_DRIVER", "GPUFORGE_INDEX_URL", "GPUFORGE_CACHE_TO"):
        assert env in text


def _extra_ca(tmp_path, write_matrix, monkeypatch, *, flag=False, env=False, matrix=False, host=False):
    files = {}
    for name in ("flag", "env", "matrix", "host"):
        files[name] = tmp_path / f"{name}.pem"
        files[name].write_text(PEM)
    if env:
        monkeypatch.setenv("GPUFORGE_EXTRA_CA", str(files["env"]))
    if host:
        monkeypatch.setenv("SSL_CERT_FILE", str(files["host"]))
    m = write_matrix(BASE_MATRIX + (f"extra_ca: {files['matrix'].name}\n" if matrix else ""))
    args = cli.parser().parse_args(["--matrix", str(m), "build", *(["--extra-ca", str(files["flag"])] if flag else [])])
    from gpuforge.plan.matrix import load_matrix

    o = options.resolve(args).with_matrix(load_matrix(m))
    return o.value("extra_ca"), o.source("extra_ca"), files, m


@pytest.mark.parametrize(("given", "winner", "source"), [
    ({"flag": True, "env": True, "matrix": True, "host": True}, "flag", "--extra-ca"),
    ({"env": True, "matrix": True, "host": True}, "env", "GPUFORGE_EXTRA_CA"),
    ({"matrix": True, "host": True}, "matrix", "M"),
    ({"host": True}, "host", "SSL_CERT_FILE"),
    ({}, None, "default"),
])
def test_extra_ca_source_order(tmp_path, write_matrix, monkeypatch, given, winner, source):
    value, src, files, m = _extra_ca(tmp_path, write_matrix, monkeypatch, **given)
    assert value == (str(files[winner].resolve() if winner == "matrix" else files[winner]) if winner else None)
    assert src == (f"{m}:{len(BASE_MATRIX.splitlines()) + 1}: extra_ca" if source == "M" else source)


@pytest.mark.parametrize("where", ["flag", "env", "host"])
def test_a_non_pem_extra_ca_is_refused_when_options_are_read(tmp_path, write_matrix, monkeypatch, capsys, no_build, where):
    bad = tmp_path / "notes.txt"
    bad.write_text("not a certificate\n")
    argv = ["--matrix", str(write_matrix(BASE_MATRIX)), "build"]
    if where == "flag":
        argv += ["--extra-ca", str(bad)]
    else:
        monkeypatch.setenv("GPUFORGE_EXTRA_CA" if where == "env" else "PIP_CERT", str(bad))
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    name = {"flag": "--extra-ca", "env": "GPUFORGE_EXTRA_CA", "host": "PIP_CERT"}[where]
    assert err == (f"gpuforge: error: {name}: {bad}: not a PEM bundle (no -----BEGIN CERTIFICATE----- line) "
                   "(give a PEM CA bundle; it reaches the build only as a secret)\n")


def test_a_non_pem_extra_ca_in_the_matrix_is_refused_at_plan_time(tmp_path, write_matrix, capsys):
    (tmp_path / "ca.txt").write_text("hello\n")
    m = write_matrix(BASE_MATRIX + "extra_ca: ca.txt\n")
    assert cli.main(["--matrix", str(m), "plan"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gpuforge: error: {m}:{len(BASE_MATRIX.splitlines()) + 1}: extra_ca: ") and "not a PEM bundle" in err


@pytest.mark.parametrize(("env", "value", "line"), [
    ("GPUFORGE_DRIVER", "kaniko", "GPUFORGE_DRIVER: 'kaniko' is not a build driver (allowed: auto, buildx, classic)"),
    ("GPUFORGE_INDEX_URL", "https://u:p@mirror/simple", "GPUFORGE_INDEX_URL: a package index URL may not contain credentials"),
    ("GPUFORGE_LOG_DIR", "logs\nx", "GPUFORGE_LOG_DIR: 'logs\\nx' may not contain control characters"),
    ("GPUFORGE_RUN_ID", "a b", "GPUFORGE_RUN_ID: 'a b' is not a run id"),
])
def test_a_bad_variable_is_one_line_naming_it(write_matrix, monkeypatch, capsys, no_build, env, value, line):
    monkeypatch.setenv(env, value)
    assert cli.main(["--matrix", str(write_matrix(BASE_MATRIX)), "build"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gpuforge: error: {line}") and err.count("\n") == 1, err


@pytest.mark.parametrize(("argv", "line"), [
    (["build", "--driver", "kaniko"], "--driver: 'kaniko' is not a build driver"),
    (["build", "-j", "0"], "--jobs: '0' is not a number of parallel builds"),
    (["build", "--progress", "fancy"], "--progress: 'fancy' is not a progress style"),
    (["promote", "--env", "staging"], "--env: 'staging' is not a promotion environment (allowed: dev, prod)"),
    (["push", "--registry", "https://ghcr.io"], "--registry: 'https://ghcr.io': a registry is HOST[:PORT] without a scheme"),
])
def test_a_bad_flag_goes_through_the_same_check(write_matrix, capsys, no_build, argv, line):
    assert cli.main(["--matrix", str(write_matrix(BASE_MATRIX)), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gpuforge: error: {line}") and err.count("\n") == 1, err


@pytest.mark.parametrize("value", ["maybe", "2"])
def test_a_switch_takes_only_yes_or_no(monkeypatch, value):
    monkeypatch.setenv("GPUFORGE_COSIGN_TLOG", value)
    with pytest.raises(ConfigError, match=rf"^GPUFORGE_COSIGN_TLOG: '{value}' is not a switch"):
        options.resolve_one(options.SETTINGS["cosign_tlog"])
    monkeypatch.setenv("GPUFORGE_COSIGN_TLOG", "1")
    assert options.resolve(command="promote").stage(options.SigningSettings).cosign_tlog is True


def test_verbose_prints_each_option_with_its_source(write_matrix, monkeypatch, capsys):
    m = write_matrix(BASE_MATRIX + "gpu_request: cdi\n")
    monkeypatch.setenv("GPUFORGE_REGISTRY", "127.0.0.1:5999")
    monkeypatch.setenv("GPUFORGE_REGISTRY_PASSWORD", "hunter2")
    seen = {}
    monkeypatch.setattr(pusher, "push_targets", lambda targets, **_: seen.update(registry=targets[0].registry))
    assert cli.main(["-v", "--matrix", str(m), "push"]) == 0
    err = capsys.readouterr().err
    assert f"gpuforge: option matrix = '{m}' (from --matrix)\n" in err
    assert "gpuforge: option registry = '127.0.0.1:5999' (from GPUFORGE_REGISTRY)\n" in err
    assert "gpuforge: option registry_password = '(set)' (from GPUFORGE_REGISTRY_PASSWORD)\n" in err
    assert "gpuforge: option state_dir = " in err
    assert "hunter2" not in err
    assert seen == {"registry": "127.0.0.1:5999"}


def test_verbose_shows_the_matrix_as_a_source(write_matrix, capsys, monkeypatch):
    m = write_matrix(BASE_MATRIX + "gpu_request: cdi\n")
    from gpuforge.validate import pytest_run as validate

    monkeypatch.setattr(validate, "validate_targets", lambda *a, **k: 0)
    monkeypatch.setattr(cli, "_reap", lambda: None)
    assert cli.main(["--verbose", "--matrix", str(m), "validate"]) == 0
    line = len(BASE_MATRIX.splitlines()) + 1
    assert f"gpuforge: option gpu_request = 'cdi' (from {m}:{line}: gpu_request)\n" in capsys.readouterr().err


def test_library_use_reads_the_environment_at_the_call(monkeypatch, tmp_path):
    """Without a CLI command (tests, the validator plugin's pytest child) a setting is read when asked."""
    monkeypatch.setenv("GPUFORGE_STATE_DIR", str(tmp_path / "a"))
    assert records.state_dir() == tmp_path / "a"
    monkeypatch.setenv("GPUFORGE_STATE_DIR", str(tmp_path / "b"))
    assert records.state_dir() == tmp_path / "b"


def test_a_command_reads_its_options_once(write_matrix, monkeypatch):
    """Under main(), the options are resolved once and handed down: a variable changed during the command changes
    neither the targets nor the settings the stage was given."""
    monkeypatch.setenv("GPUFORGE_REGISTRY", "127.0.0.1:5001")
    monkeypatch.setenv("GPUFORGE_REGISTRY_USER", "ci")
    got = []

    def push(targets, *, auth, **_):  # the registry was applied to the targets when they were loaded
        monkeypatch.setenv("GPUFORGE_REGISTRY", "127.0.0.1:5002")
        monkeypatch.setenv("GPUFORGE_REGISTRY_USER", "other")
        got.append((targets[0].registry, auth.user))
    monkeypatch.setattr(pusher, "push_targets", push)
    assert cli.main(["--matrix", str(write_matrix(BASE_MATRIX)), "push"]) == 0
    assert got == [("127.0.0.1:5001", "ci")]


@pytest.mark.parametrize("stage", options.STAGES)
def test_each_stage_field_is_a_setting_with_its_default(stage):
    """The typed stage settings are checked against the table: a field names a setting and keeps its default."""
    for f in dataclasses.fields(stage):
        assert f.name in options.SETTINGS, f"{stage.__name__}.{f.name} is no setting of gpuforge.options.TABLE"
        assert f.default == options.SETTINGS[f.name].default, f"{stage.__name__}.{f.name}: not the table's default"


def test_a_stage_is_filled_from_the_command_and_frozen(monkeypatch):
    monkeypatch.setenv("GPUFORGE_DRIVER", "classic")
    b = options.resolve(command="build").stage(options.BuildSettings)
    assert (b.driver, b.jobs, b.cache_from) == ("classic", 1, ())
    with pytest.raises(dataclasses.FrozenInstanceError):
        b.driver = "buildx"  # type: ignore[misc]
    v = options.resolve(command="push").stage(options.ValidateSettings)  # push takes none of them: the defaults
    assert v == options.ValidateSettings()


def _with(o: options.Options, **values: object) -> options.Options:
    """`o` with some values replaced, as a wrong row of the table would give them."""
    out = dict(o.resolved)
    out.update({name: options.Resolved(name, value, "default") for name, value in values.items()})
    return dataclasses.replace(o, resolved=out)


@pytest.mark.parametrize("command", sorted({c for s in options.TABLE for c in s.commands}))
def test_every_command_fills_every_stage_with_its_defaults(command):
    """The table's defaults (and each command's own) are of their stage fields' types."""
    o = options.resolve(command=command, environ={})
    for stage in options.STAGES:
        o.stage(stage)


@pytest.mark.parametrize(("name", "value", "expected"), [
    ("jobs", "2", "int"), ("jobs", True, "int"), ("no_cache", 1, "bool"), ("cache_from", ["a"], "tuple[str, ...]"),
    ("cache_from", ("a", 2), "tuple[str, ...]"), ("driver", None, "str"), ("extra_ca", 3, "str | None"),
])
def test_a_stage_field_of_another_type_is_refused_naming_the_setting(name, value, expected):
    o = _with(options.resolve(command="build", environ={}), **{name: value})
    with pytest.raises(TypeError, match=rf"^setting {name}: expected {re.escape(expected)} \(BuildSettings\.{name}\), "
                                        rf"got {re.escape(repr(value))} "):
        o.stage(options.BuildSettings)


def test_a_stage_takes_its_own_types():
    p = _with(options.resolve(command="promote", environ={}), evidence_ttl=options.Ttl(dev=2, prod=1))
    assert p.stage(options.PromoteSettings).evidence_ttl == options.Ttl(dev=2, prod=1)
    with pytest.raises(TypeError, match=r"^setting evidence_ttl: expected Ttl \(PromoteSettings\.evidence_ttl\), got '30' "):
        _with(p, evidence_ttl="30").stage(options.PromoteSettings)
    c = _with(options.resolve(command="cve-gate", environ={}), cve_max_db_age_hours=24)  # an int is a float
    assert c.stage(options.CveGateSettings).cve_max_db_age_hours == 24


def test_a_flag_of_another_type_is_refused_naming_the_setting():
    o = options.resolve(command="rollback", environ={})
    run = cli._make_run(o, None)
    assert (run.text("digest"), run.number("steps")) == (None, None)
    run = cli._make_run(_with(o, digest="sha256:ab", steps=2), None)
    assert (run.text("digest"), run.number("steps")) == ("sha256:ab", 2)
    for read, name, value, expected in [(cli.Run.text, "digest", 3, "str"), (cli.Run.number, "steps", "2", "int"),
                                        (cli.Run.number, "steps", True, "int")]:
        with pytest.raises(TypeError, match=rf"^setting {name}: expected {expected}, got {re.escape(repr(value))} "):
            read(cli._make_run(_with(o, **{name: value}), None), name)
    o = options.resolve(command="outdated", environ={})
    assert cli._make_run(o, None).flag("prod") is False
    for value in ("1", 1, None):
        with pytest.raises(TypeError, match=rf"^setting prod: expected bool, got {re.escape(repr(value))} "):
            cli._make_run(_with(o, prod=value), None).flag("prod")
    s = options.resolve(command="smoke", environ={})
    assert cli._make_run(_with(s, expect=("a", "b")), None).texts("expect") == ("a", "b")
    with pytest.raises(TypeError, match=r"^setting expect: expected tuple\[str, \.\.\.\], got \['a'\] "):
        cli._make_run(_with(s, expect=["a"]), None).texts("expect")
    with pytest.raises(TypeError, match=r"^setting matrix: expected str, got None "):
        _with(s, matrix=None).required_text("matrix")


def test_no_settings_live_in_module_state():
    """The options are resolved per command and handed down: no global to activate, look up or complete."""
    gone = {"_active", "activate", "current", "for_args", "use_matrix", "setting"}
    assert not gone & set(vars(options)), sorted(gone & set(vars(options)))
    assert "__getattr__" not in vars(options.Options)
    with pytest.raises(AttributeError):
        options.resolve(command="build").driver  # noqa: B018  # values are read with value(name) or a stage


def test_options_are_frozen():
    o = options.resolve(command="build")
    with pytest.raises(AttributeError):
        o.driver = "classic"
    with pytest.raises(TypeError):
        o.resolved["driver"] = None


def test_the_docs_page_shows_the_table():
    from gpuforge import paths

    page = (paths.project_root() / "docs" / "options.md").read_text()
    assert options.markdown_table() in page, (
        "docs/options.md is stale: paste `python -c \"from gpuforge import options; print(options.markdown_table())\"`")
