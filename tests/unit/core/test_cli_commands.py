"""cli.py's command functions: each returns its exit code, no code sits after a return, and a
promotion or rollback that could not sign its record is refused at once (exit 2), before any registry or tag work."""

from __future__ import annotations

import ast
import inspect

import pytest

from gpuforge import cli


def _functions():
    tree = ast.parse(inspect.getsource(cli))
    return [n for n in tree.body if isinstance(n, ast.FunctionDef)]


@pytest.mark.parametrize("fn", [f for f in _functions() if f.name.startswith("cmd_")], ids=lambda f: f.name)
def test_each_command_ends_in_its_exit_code(fn):
    assert isinstance(fn.body[-1], ast.Return | ast.Raise), f"{fn.name} falls off its end (returns None, not an exit code)"


@pytest.mark.parametrize("fn", _functions(), ids=lambda f: f.name)
def test_no_statement_after_a_return(fn):
    for node in ast.walk(fn):
        body = getattr(node, "body", None)
        if isinstance(body, list):
            ends = [i for i, s in enumerate(body) if isinstance(s, ast.Return | ast.Raise)]
            assert not ends or ends[0] == len(body) - 1, f"{fn.name}: unreachable code after line {body[ends[0]].lineno}"


TOKENS = ("SIGSTORE_ID_TOKEN", "ACTIONS_ID_TOKEN_REQUEST_URL", "ACTIONS_ID_TOKEN_REQUEST_TOKEN", "GPUFORGE_COSIGN_KEY")


@pytest.mark.parametrize("argv", [["promote", "--env", "dev"], ["rollback", "TARGET", "--env", "prod", "--steps", "1"]])
def test_unsignable_records_are_refused_before_any_work(argv, monkeypatch, capsys, tmp_path):
    for k in TOKENS:
        monkeypatch.delenv(k, raising=False)
    # a registry nobody answers on and a matrix that is not there: the refusal must come before either is read
    rc = cli.main(["--matrix", str(tmp_path / "absent.yaml"), *argv, "--registry", "127.0.0.1:9"])
    err = capsys.readouterr().err
    assert rc == 2 and "promotion records are signed: give --sign-key KEY" in err and err.count("\n") == 1, err


def test_an_oidc_token_in_the_environment_counts_as_a_signer():
    from gpuforge.registry import attest

    assert attest.oidc_token_available({"SIGSTORE_ID_TOKEN": "eyJ..."})
    assert attest.oidc_token_available({"ACTIONS_ID_TOKEN_REQUEST_URL": "https://x", "ACTIONS_ID_TOKEN_REQUEST_TOKEN": "t"})
    assert not attest.oidc_token_available({"ACTIONS_ID_TOKEN_REQUEST_URL": "https://x"})  # no `id-token: write`
    assert not attest.oidc_token_available({})


def test_the_refused_attest_command_carries_no_option_rows():
    from gpuforge import options

    assert [s.name for s in options.TABLE if "attest" in s.commands] == []


def test_attest_with_anything_is_refused_with_what_to_run(capsys):
    assert cli.main(["attest", "--gpu", "--key", "cosign.key", "some-target"]) == 7
    err = capsys.readouterr().err
    assert "run `gpuforge validate --attest --sign-key KEY" in err and err.count("\n") == 1


def test_other_commands_still_refuse_unknown_flags(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["plan", "--bogus"])
    assert e.value.code == 2 and "unrecognized arguments: --bogus" in capsys.readouterr().err
