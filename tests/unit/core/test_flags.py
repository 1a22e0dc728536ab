"""One flag name, one meaning: every flag of every command comes from gpuforge/options.py's table, so a name has one
destination and one help text wherever it appears; the environment is --env on every command; old spellings that
meant something else are refused with a one-line hint (exit 2)."""

from __future__ import annotations

import argparse
import collections

import pytest

from gpuforge import cli, options


def _commands(ap: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in ap._actions if isinstance(a, argparse._SubParsersAction))
    return {None: ap, **sub.choices}


def meanings(ap: argparse.ArgumentParser) -> dict[str, set[tuple[str, str]]]:
    """flag -> the (dest, help) pairs it has across the top level and every command (refusals of old spellings and
    -h/--help aside)."""
    out: dict[str, set[tuple[str, str]]] = collections.defaultdict(set)
    for p in _commands(ap).values():
        for a in p._actions:
            if isinstance(a, argparse._HelpAction | options.Retired | argparse._SubParsersAction):
                continue
            for flag in a.option_strings:
                out[flag].add((a.dest, a.help))
    return out


def test_no_flag_has_two_meanings():
    twice = {flag: sorted(m) for flag, m in meanings(cli.parser()).items() if len(m) > 1}
    assert not twice, "\n".join(f"{flag}: {m}" for flag, m in twice.items())


def test_the_walker_finds_a_flag_with_two_meanings():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd")
    sub.add_parser("a").add_argument("--key", dest="public_key", help="the public key")
    sub.add_parser("b").add_argument("--key", dest="private_key", help="the private key")
    assert len(meanings(ap)["--key"]) == 2


def test_every_flag_comes_from_the_table():
    table = {n for s in options.TABLE for n in (s.flag, s.short, *(old for _, old in s.aliases)) if n}
    assert set(meanings(cli.parser())) - table == {"--version"}


def test_the_environment_is_one_word_on_every_command():
    cmds = _commands(cli.parser())
    for name in ("promote", "status", "history", "rollback"):
        env = [a for a in cmds[name]._actions if "--env" in a.option_strings]
        assert env and env[0].dest == "env" and tuple(env[0].choices or options.ENVIRONMENTS) == options.ENVIRONMENTS


def test_promote_keeps_to_because_it_meant_the_environment(monkeypatch):
    args = cli.parser().parse_args(["promote", "--to", "dev"])
    assert args.env == "dev"


def test_a_private_key_given_as_key_is_refused_naming_sign_key(tmp_path, capsys):
    """`validate --key` once named the signing key; now --key is the public key everywhere (validate reads it to
    verify evidence it may reuse), and a private key given there is refused in one line."""
    key = tmp_path / "cosign.key"
    key.write_text("-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----\nAAAA\n-----END ENCRYPTED SIGSTORE PRIVATE KEY-----\n")
    for argv in (["validate", "--attest", "--key", str(key)], ["promote", "--env", "dev", "--key", str(key)]):
        rc = cli.main(argv)
        err = capsys.readouterr().err
        assert rc == 2 and "is a private key: --key is the public key that verifies; sign with --sign-key KEY" \
            in err and err.count("\n") == 1, err


@pytest.mark.parametrize(("argv", "hint"), [
    (["cve-gate", "scan.json", "--key", "cosign.key"], "sign with --sign-key KEY"),
    (["rollback", "t", "--env", "prod", "--to", "sha256:abc"], "give --digest DIGEST (the environment is --env)"),
    (["prod-sboms", "--output", "out"], "give the folder as --output-dir DIR"),
    (["release-notes", "--output", "out"], "give the folder as --output-dir DIR"),
])
def test_an_old_spelling_with_another_meaning_is_refused_in_one_line(argv, hint, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and hint in err and err.count("\n") == 1, err
