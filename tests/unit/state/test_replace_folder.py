"""A folder of generated files (images/dist/<id>/) is replaced as one, by files.replace_folder: a failure at any
step leaves the old folder whole and nothing beside it, with the kernel's rename exchange and without it."""

from __future__ import annotations

import os

import pytest

from gpuforge.errors import StateError
from gpuforge.state import files

OLD = {"Dockerfile": b"FROM old\n", "target.json": b"{}\n", "stale.txt": b"x\n"}
NEW = {"Dockerfile": b"FROM new\n", "target.json": b'{"new": 1}\n'}


def _tree(d) -> dict[str, bytes]:
    return {f.name: f.read_bytes() for f in d.iterdir()}


def _old(tmp_path):
    d = tmp_path / "dist" / "t"
    d.mkdir(parents=True)
    for name, data in OLD.items():
        (d / name).write_bytes(data)
    return d


@pytest.mark.parametrize("exchange", [True, False], ids=["exchange", "two renames"])
def test_the_new_folder_replaces_the_old_whole(tmp_path, monkeypatch, exchange):
    if not exchange:
        monkeypatch.setattr(files, "_exchange", lambda *a: False)
    d = _old(tmp_path)
    assert files.replace_folder(d, NEW) == d
    assert _tree(d) == NEW  # the old folder's extra file went with it
    assert [p.name for p in d.parent.iterdir()] == ["t"]
    assert oct(d.stat().st_mode & 0o777) == oct(0o777 & ~_umask())


@pytest.mark.parametrize("exchange", [True, False], ids=["exchange", "two renames"])
def test_a_failed_swap_leaves_the_old_folder_whole(tmp_path, monkeypatch, exchange):
    if exchange:
        def refuse(*a):
            raise OSError(28, "No space left on device")
        monkeypatch.setattr(files, "_exchange", refuse)
    else:
        monkeypatch.setattr(files, "_exchange", lambda *a: False)
        real, calls = os.rename, []

        def second_fails(src, dst, **kw):  # the new folder's rename into place fails
            calls.append(src)
            if len(calls) == 2:
                raise OSError(28, "No space left on device")
            return real(src, dst, **kw)
        monkeypatch.setattr(files.os, "rename", second_fails)
    d = _old(tmp_path)
    with pytest.raises(StateError, match="no space left on device"):
        files.replace_folder(d, NEW)
    monkeypatch.undo()
    assert _tree(d) == OLD
    assert [p.name for p in d.parent.iterdir()] == ["t"]


def test_a_first_write_creates_the_folder(tmp_path):
    d = tmp_path / "dist" / "t"
    files.replace_folder(d, NEW)
    assert _tree(d) == NEW and [p.name for p in d.parent.iterdir()] == ["t"]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
