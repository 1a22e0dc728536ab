"""Every `gpuforge ...` command line that gpuforge's own messages tell a user to run parses with today's CLI and is
not a refused command (prod's refusal once said `gpuforge attest --gpu`, which the CLI refuses)."""

from __future__ import annotations

import re
import shlex

import pytest

from gpuforge import cli, options, paths

HINT = re.compile(r"`gpuforge ([a-z][a-z-]*(?: [^`]*)?)`")
REFUSED = {"attest"}  # kept only to say what to run instead


def hints() -> list[tuple[str, str]]:
    root = paths.project_root() / "gpuforge"
    out = []
    for f in sorted(root.rglob("*.py")):
        for m in HINT.finditer(f.read_text()):
            out.append((f"{f.relative_to(root)}: {m.group(1)}", m.group(1)))
    return out


def test_the_messages_name_commands():
    assert len(hints()) >= 5


def _subcommands() -> dict:
    import argparse

    p = cli.parser()
    [sub] = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
    return sub.choices


@pytest.mark.parametrize(("where", "line"), hints(), ids=[h[0] for h in hints()])
def test_each_hinted_command_exists_with_its_flags(where, line):
    """The command is one the CLI runs, and every --flag the hint names is one of that command's flags."""
    argv = shlex.split(line.replace("…", "X").replace("...", "X").replace("[", " ").replace("]", " ").replace("|", " "))
    subs = _subcommands()
    assert argv[0] in subs, f"{where}: `gpuforge {argv[0]}` is no command (known: {', '.join(sorted(subs))})"
    assert argv[0] not in REFUSED, f"{where}: tells the user to run a refused command"
    known = {f for f, a in subs[argv[0]]._option_string_actions.items() if not isinstance(a, options.Retired)}
    bad = [a.split("=")[0] for a in argv[1:] if a.startswith("--") and a.split("=")[0] not in known]
    assert not bad, f"{where}: `gpuforge {line}`: {argv[0]} has no {', '.join(bad)}"
