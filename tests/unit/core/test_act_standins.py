"""The artifact stand-ins (tests/act/) keep the rules of actions/upload-artifact and download-artifact v4 that a
workflow meets: a name used twice in a run fails unless `overwrite`, hidden files stay out unless asked, paths that
match nothing warn, fail or pass as `if-no-files-found` says, and a download of an absent name fails."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parents[2] / "act" / "artifacts.py"


def _run(tmp_path: Path, verb: str, **env: str) -> subprocess.CompletedProcess:
    store = tmp_path / "store"
    store.mkdir(exist_ok=True)
    out = tmp_path / "github_output"
    full = {**os.environ, "GPUFORGE_ACT_ARTIFACTS": str(store), "GITHUB_WORKSPACE": str(tmp_path / "ws"),
            "GITHUB_OUTPUT": str(out), **env}
    return subprocess.run([sys.executable, str(SCRIPT), verb], env=full, capture_output=True, text=True, timeout=30)


def _workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    (ws / "reports" / "state").mkdir(parents=True)
    (ws / "reports" / "state" / "builds.json").write_text("{}")
    (ws / "reports" / ".hidden").write_text("secret")
    (ws / "reports" / "report.md").write_text("# report")
    return ws


def test_upload_keeps_the_layout_below_the_path_and_leaves_hidden_files_out(tmp_path):
    _workspace(tmp_path)
    r = _run(tmp_path, "upload", NAME="reports-x", PATHS="reports/")
    assert r.returncode == 0, r.stdout + r.stderr
    stored = sorted(p.relative_to(tmp_path / "store" / "reports-x").as_posix()
                    for p in (tmp_path / "store" / "reports-x").rglob("*") if p.is_file())
    assert stored == ["report.md", "state/builds.json"]
    hidden = _run(tmp_path, "upload", NAME="with-hidden", PATHS="reports/", HIDDEN="true")
    assert hidden.returncode == 0 and (tmp_path / "store" / "with-hidden" / ".hidden").exists()


def test_a_name_used_twice_fails_unless_overwrite(tmp_path):
    _workspace(tmp_path)
    assert _run(tmp_path, "upload", NAME="a", PATHS="reports/").returncode == 0
    again = _run(tmp_path, "upload", NAME="a", PATHS="reports/")
    assert again.returncode != 0 and "(409) Conflict" in again.stdout + again.stderr
    assert _run(tmp_path, "upload", NAME="a", PATHS="reports/", OVERWRITE="true").returncode == 0


def test_if_no_files_found_warns_fails_or_passes(tmp_path):
    _workspace(tmp_path)
    warn = _run(tmp_path, "upload", NAME="w", PATHS="nothing/")
    assert warn.returncode == 0 and "::warning::No files were found" in warn.stdout
    error = _run(tmp_path, "upload", NAME="e", PATHS="nothing/", IF_NONE="error")
    assert error.returncode != 0 and "No files were found" in error.stdout + error.stderr
    ignore = _run(tmp_path, "upload", NAME="i", PATHS="nothing/", IF_NONE="ignore")
    assert ignore.returncode == 0 and "::warning::" not in ignore.stdout
    assert not (tmp_path / "store" / "w").exists()


def test_download_by_name_into_path_and_an_absent_name_fails(tmp_path):
    _workspace(tmp_path)
    assert _run(tmp_path, "upload", NAME="reports-x", PATHS="reports/").returncode == 0
    got = _run(tmp_path, "download", NAME="reports-x", DEST="back")
    assert got.returncode == 0, got.stdout + got.stderr
    assert (tmp_path / "ws" / "back" / "state" / "builds.json").read_text() == "{}"
    missing = _run(tmp_path, "download", NAME="reports-y", DEST="back")
    assert missing.returncode != 0 and "Artifact not found for name: reports-y" in missing.stdout + missing.stderr
