"""A second engine's data root leaves at once and is unlinked in a process nobody waits for (tools/second_engine.py):
its worker's next module starts without the 18-46 s of I/O wait, and no later engine mistakes it for a live one."""

from __future__ import annotations

import time

from second_engine import remove_later


def test_the_folder_is_gone_at_once_and_removed_behind(tmp_path):
    d = tmp_path / "gf21-abc"
    (d / "snapshots" / "1" / "fs").mkdir(parents=True)
    for i in range(200):
        (d / "snapshots" / "1" / "fs" / f"f{i}").write_bytes(b"x" * 100)
    remove_later(d)
    assert not d.exists()  # renamed before anything is unlinked
    gone = tmp_path / "gf21-abc.removing"
    deadline = time.monotonic() + 30
    while gone.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not gone.exists() and list(tmp_path.iterdir()) == []


def test_a_folder_that_cannot_be_renamed_is_removed_in_place(tmp_path, monkeypatch):
    from pathlib import Path

    d = tmp_path / "gf13-abc"
    (d / "x").mkdir(parents=True)

    def refuse(self, target):
        msg = "cross-device link"
        raise OSError(msg)

    monkeypatch.setattr(Path, "rename", refuse)
    remove_later(d)
    assert not d.exists() and list(tmp_path.iterdir()) == []
