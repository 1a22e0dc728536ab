"""matrix.yaml is untrusted input: each malformed or hostile file in hostile_cases.CASES ends in exit 2
with one line per distinct problem naming file:line and what is allowed, never a traceback (run through
the real CLI entry point). tools/bench_matrix.py times the same table."""

from __future__ import annotations

import pytest
from hostile_cases import BASE, CASES

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


def test_at_least_forty_cases_with_unique_ids():
    assert len(CASES) >= 40
    assert len({c.id for c in CASES}) == len(CASES)
