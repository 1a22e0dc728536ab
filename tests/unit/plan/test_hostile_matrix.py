"""matrix.yaml is untrusted input: each malformed or hostile file in hostile_cases.CASES ends in exit 2
with one line per distinct problem naming file:line and what is allowed, never a traceback (run through
the real CLI entry point). tools/bench_matrix.py times the same table."""

from __future__ import annotations

import pytest
from hostile_cases import BASE, CASES, SMALL
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import BASE_MATRIX, examples
from gpuforge.cli import main


def _write(tmp_path, case):
    path = tmp_path / "matrix.yaml"
    if isinstance(case.text, bytes):
        path.write_bytes(case.text)
    else:
        path.write_text(case.text)
    for name, text in case.files.items():
        (tmp_path / name).write_text(text)
    return path


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_matrix_is_refused_with_one_precise_error(tmp_path, capsys, case):
    path = _write(tmp_path, case)
    rc = main(["--matrix", str(path), "plan"])
    out, err = capsys.readouterr()
    assert rc == 2, err
    assert "Traceback" not in err and not out
    lines = err.rstrip("\n").split("\n")
    assert lines[0].startswith(f"gpuforge: error: {path}:{case.line}: "), err
    assert len(lines) == case.lines, f"expected {case.lines} error line(s):\n{err}"
    assert all(line.startswith((f"gpuforge: error: {path}:", f"{path}:")) for line in lines), err
    for w in case.wants:
        assert w in err, f"{w!r} not in: {err}"


def test_the_base_of_the_table_is_valid(tmp_path, capsys):
    (tmp_path / "matrix.yaml").write_text(BASE)
    assert main(["--matrix", str(tmp_path / "matrix.yaml"), "plan"]) == 0, capsys.readouterr().err


def test_missing_file(capsys):
    assert main(["--matrix", "/nonexistent/matrix.yaml", "plan"]) == 2
    assert "file not found" in capsys.readouterr().err


def test_the_small_base_is_the_shared_one():
    assert SMALL == BASE_MATRIX


def test_at_least_forty_cases_with_unique_ids():
    assert len(CASES) >= 40
    assert len({c.id for c in CASES}) == len(CASES)


# Edits a careless hand or a broken script makes: YAML syntax, anchors, tags, odd scalars, bad bytes.
_TOKENS = ["{", "}", "[", "]", ":", "- ", "&a ", "*a", "<<: ", "!!str ", "!!int ", "!!bool ", "!!float ", "!!timestamp ", "'", '"', "\n", "  ", "null", "no",
           "1e400", ".nan", "{id}", "%", "? ", "|", "#", "\t", "~", "12.10", "@", "`", ",", "\x00", "\udcff", "é"]


@settings(max_examples=examples(300), suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edits=st.lists(st.tuples(st.integers(0, len(BASE)), st.integers(0, 4), st.sampled_from(_TOKENS)), min_size=1, max_size=4))
def test_random_edits_end_in_a_plan_or_an_error_line_never_a_traceback(tmp_path, capsys, edits):
    text = BASE
    for pos, cut, token in edits:
        text = text[:pos] + token + text[pos + cut:]
    path = tmp_path / "matrix.yaml"
    path.write_bytes(text.encode("utf-8", "surrogateescape"))
    rc = main(["--matrix", str(path), "plan"])
    err = capsys.readouterr().err
    assert rc in (0, 2), err
    assert rc == 0 or err.startswith(f"gpuforge: error: {path}"), err
