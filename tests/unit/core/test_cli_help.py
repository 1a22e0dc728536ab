"""The CLI documents itself: every option of every subcommand has help, `--version` answers, and the exit
codes in every --help (from gpuforge/errors.py) are the ones README.md lists."""

from __future__ import annotations

import argparse
import re

from conftest import ROOT, gpuforge
from gpuforge import __version__, cli
from gpuforge.errors import exit_codes


def _walk(ap: argparse.ArgumentParser, path: str = "gpuforge"):
    for action in ap._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _walk(sub, f"{path} {name}")
        else:
            yield path, action


def test_every_option_and_argument_has_help():
    missing = [f"{path} {'/'.join(a.option_strings) or a.dest}" for path, a in _walk(cli.parser())
               if not (a.help and a.help.strip()) and a.help != argparse.SUPPRESS]
    assert missing == [], f"options without help: {missing}"


def test_the_walk_sees_every_subcommand():
    paths = {p for p, _ in _walk(cli.parser())}
    for cmd in ("plan", "build", "validate", "smoke", "push", "attest", "promote", "clean"):
        assert f"gpuforge {cmd}" in paths


def test_version():
    r = gpuforge("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"gpuforge {__version__}"


def test_top_level_help_is_for_users():
    r = gpuforge("--help")
    assert r.returncode == 0
    assert "FatalError" not in r.stdout and "caught once" not in r.stdout
    assert "gpuforge build" in r.stdout and "gpuforge promote --env dev" in r.stdout


def test_exit_codes_are_in_every_help_and_in_the_readme():
    codes = exit_codes()
    assert [c for c, _ in codes] == [0, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 130], codes  # no kind is exit 1
    readme = (ROOT / "README.md").read_text()
    listed = dict(re.findall(r"^- (\d+): (.+)$", readme, re.M))
    for code, what in codes:
        assert listed.get(str(code)) == what, f"README's exit codes must list {code}: {what}"
    for args in (["--help"], ["build", "--help"], ["clean", "--help"], ["smoke", "--help"]):
        out = " ".join(gpuforge(*args).stdout.split())
        for code, what in codes:
            assert f"{code} {what}" in out, (args, code)


def test_the_consumer_verify_command_is_one_text_and_skips_the_log_it_was_not_written_to():
    """gpuforge signs with a key without Rekor (--tlog-upload=false): cosign 2.x refuses that signature unless the
    command says --insecure-ignore-tlog=true. Run verbatim against a real signed image in
    tests/integration/publish/test_registry.py::test_the_documented_consumer_command_works_verbatim."""
    doc = (ROOT / "docs" / "promotion.md").read_text()
    block = doc.split("<!-- consumer-verify:", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    assert "cosign verify-attestation --key cosign.pub --insecure-ignore-tlog=true" in block
    assert block in (ROOT / "README.md").read_text()
    from gpuforge.registry import attest

    assert f"--type {attest.VALIDATION_TYPE}" in block
