"""One git-revision helper with one dirty rule: the image's revision label and the signed run block of every
statement read the same (commit, dirty), untracked files included."""

from __future__ import annotations

import subprocess

from gpuforge import paths, provenance
from gpuforge.evidence import runinfo


def _repo(tmp_path):
    for d in ("images/context", "validators"):
        (tmp_path / d).mkdir(parents=True)
    (tmp_path / "images/context/entrypoint.sh").write_text("#!/bin/sh\n")
    for args in (["init", "-q"], ["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one"]):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True).stdout.strip()


def test_the_label_and_the_run_block_share_one_rule(tmp_path, monkeypatch):
    head = _repo(tmp_path)
    paths.use_root(tmp_path)  # as the CLI names GPUFORGE_ROOT's checkout (tests/conftest.py names none again after)
    runinfo._git.cache_clear()
    assert paths.checkout_revision() == (head, False) and provenance.git_revision() == head and runinfo._git() == (head, False)
    (tmp_path / "images/context/new_program.py").write_text("print('untracked, yet in the build context')\n")
    runinfo._git.cache_clear()
    assert paths.checkout_revision() == (head, True)
    assert provenance.git_revision() == f"{head}-dirty" and runinfo._git() == (head, True)
    runinfo._git.cache_clear()


def test_outside_git_there_is_no_revision(tmp_path):
    assert paths.checkout_revision(tmp_path) == (None, None)
