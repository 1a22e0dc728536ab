"""Files written where a flag says (cve-gate --output, release-notes --output, prod-sboms --output, outdated
--write-base-lock, schema --output) go through gpuforge.state.files: whole or not at all, a symlink at the
path refused (its target untouched), and a folder that cannot be written is one line with exit 8."""

from __future__ import annotations

import datetime as dt
import errno
import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpuforge.cli import main
from gpuforge.cve import gate as cve
from gpuforge.errors import StateError
from gpuforge.fleet import outdated, support
from gpuforge.plan.target import ImageRef
from gpuforge.registry import attest
from gpuforge.registry import client as registry
from gpuforge.state import files

F = Path(__file__).parents[1] / "fixtures" / "cve"
TARGET = "pt271-cu126-py311-debian12-runtime-wheels"
DIGEST = "sha256:" + "d" * 64


@pytest.fixture
def victim(tmp_path):
    v = tmp_path / "victim"
    v.write_text("precious\n")
    return v


def _one_line(err: str, path) -> str:
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"gpuforge: error: {path}: "), err
    return err


def _fail_fsync_of(name: str, monkeypatch):
    """Every fsync of a temp file of `name` fails as a full disk does."""
    real = os.fsync

    def fsync(fd):
        if f".{name}." in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd)
    monkeypatch.setattr(os, "fsync", fsync)


# --- the writer ------------------------------------------------------------------------------------------

def test_a_symlink_at_an_output_is_refused_and_its_target_kept(tmp_path, victim):
    (tmp_path / "out.json").symlink_to(victim)
    with pytest.raises(StateError, match="is a symlink") as e:
        files.write_output(tmp_path / "out.json", "{}\n")
    assert str(e.value).startswith(f"{tmp_path / 'out.json'}: ") and e.value.return_code == 8
    assert victim.read_text() == "precious\n" and (tmp_path / "out.json").is_symlink()


def test_a_set_is_all_or_nothing(tmp_path, monkeypatch):
    files.write_outputs(tmp_path, {"a": "old a\n", "b": "old b\n"}, below=("t",))
    _fail_fsync_of("b", monkeypatch)
    with pytest.raises(StateError, match="no space left"):
        files.write_outputs(tmp_path, {"a": "new a\n", "b": "new b\n"}, below=("t",))
    d = tmp_path / "t"
    assert (d / "a").read_text() == "old a\n" and (d / "b").read_text() == "old b\n"
    assert sorted(p.name for p in d.iterdir()) == ["a", "b"]  # no temp file left, no lock file made
    (d / "b").unlink()
    (d / "b").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(StateError, match="is a symlink"):  # refused before anything is written
        files.write_outputs(tmp_path, {"a": "new a\n", "b": "new b\n"}, below=("t",))
    assert (d / "a").read_text() == "old a\n" and not (tmp_path / "elsewhere").exists()


def test_a_symlinked_folder_below_the_named_one_is_refused(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "t").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(StateError, match="is a symlink"):
        files.write_outputs(tmp_path / "out", {"a": "x"}, below=("t",))
    assert list((tmp_path / "elsewhere").iterdir()) == []


# --- each output -------------------------------------------------------------------------------------------

def _gate_args(tmp_path, out) -> list[str]:
    meta = tmp_path / "trivy-version.json"
    fresh = (dt.datetime.now(dt.UTC) - dt.timedelta(hours=2)).isoformat()
    meta.write_text(json.dumps({"Version": "0.58.1", "VulnerabilityDB": {"Version": 2, "UpdatedAt": fresh}}))
    return ["cve-gate", str(F / "trivy-default.json"), "--db-metadata", str(meta), "--sbom",
            str(F / "sbom-default.cdx.json"), "--target", TARGET, "--output", str(out)]


def test_cve_gate_output_symlink_is_exit_8_and_not_written_through(tmp_path, victim, capsys, monkeypatch):
    monkeypatch.setenv("GPUFORGE_STATE_DIR", str(tmp_path / "state"))
    out = tmp_path / "verdict.json"
    out.symlink_to(victim)
    assert main(_gate_args(tmp_path, out)) == 8
    assert "is a symlink" in _one_line(capsys.readouterr().err, out)
    assert victim.read_text() == "precious\n"


def test_cve_gate_output_in_a_folder_that_cannot_be_made_is_exit_8(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("GPUFORGE_STATE_DIR", str(tmp_path / "state"))
    (tmp_path / "afile").write_text("")
    assert main(_gate_args(tmp_path, tmp_path / "afile" / "verdict.json")) == 8
    _one_line(capsys.readouterr().err, tmp_path / "afile")


def test_cve_gate_output_on_a_full_disk_keeps_the_previous_verdict(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("GPUFORGE_STATE_DIR", str(tmp_path / "state"))
    out = tmp_path / "verdict.json"
    assert main(_gate_args(tmp_path, out)) == 9  # red, but written
    before = out.read_text()
    assert json.loads(before)["ok"] is False
    capsys.readouterr()
    _fail_fsync_of("verdict.json", monkeypatch)
    assert main(_gate_args(tmp_path, out)) == 8
    assert "no space left" in _one_line(capsys.readouterr().err, out)
    assert out.read_text() == before and [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_base_lock_is_written_whole_and_a_symlink_refused(tmp_path, victim, monkeypatch):
    monkeypatch.setattr(outdated, "pulled_bases", lambda targets: ["ubuntu:24.04", "nvidia/cuda:12.6"])
    monkeypatch.setattr(outdated, "current_digest", lambda ref, auth=None: DIGEST)
    path = tmp_path / outdated.LOCK_NAME
    assert outdated.write_lock([], path) == {"ubuntu:24.04": DIGEST, "nvidia/cuda:12.6": DIGEST}
    assert json.loads(path.read_text()) == {"ubuntu:24.04": DIGEST, "nvidia/cuda:12.6": DIGEST}
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([outdated.LOCK_NAME, "victim"])  # no .tmp left
    path.unlink()
    path.symlink_to(victim)
    with pytest.raises(StateError, match="is a symlink"):
        outdated.write_lock([], path)
    assert victim.read_text() == "precious\n"


def _target():
    return SimpleNamespace(id=TARGET, ref=ImageRef("127.0.0.1:5000", "gpuforge/pytorch", "pt271"))


def test_prod_sboms_write_sbom_and_digest_as_one_set(tmp_path, monkeypatch):
    asked = []

    class Reg:
        def __init__(self, auth):
            pass

        def manifest(self, ref):
            asked.append((ref.registry, ref.repository, ref.tag))
            return SimpleNamespace(digest=DIGEST)

    def verified(ref, type_uri, verifier):
        asked.append(ref)
        return [{"bomFormat": "CycloneDX", "n": 1}]

    monkeypatch.setattr(registry, "Registry", Reg)
    monkeypatch.setattr(attest, "verified_predicates", verified)
    out = tmp_path / "sboms"
    assert cve.write_prod_sboms([_target()], verifier=attest.Verifier(), out=out) == [(TARGET, DIGEST)]
    assert asked == [("127.0.0.1:5000", "gpuforge/pytorch", "pt271-prod"), f"127.0.0.1:5000/gpuforge/pytorch@{DIGEST}"]
    d = out / TARGET
    assert json.loads((d / "sbom.cdx.json").read_text())["n"] == 1 and (d / "digest").read_text() == DIGEST + "\n"
    (d / "digest").unlink()
    (d / "digest").symlink_to(tmp_path / "elsewhere")
    monkeypatch.setattr(attest, "verified_predicates", lambda *a: [{"bomFormat": "CycloneDX", "n": 2}])
    with pytest.raises(StateError, match="is a symlink"):
        cve.write_prod_sboms([_target()], verifier=attest.Verifier(), out=out)
    assert json.loads((d / "sbom.cdx.json").read_text())["n"] == 1  # not an SBOM beside another's digest
    assert not (tmp_path / "elsewhere").exists()


def test_release_notes_are_written_as_one_set_and_a_symlink_refused(tmp_path, victim, monkeypatch):
    monkeypatch.setattr("gpuforge.plan.fleet.pools_of", lambda m: {})
    monkeypatch.setattr(support, "collect", lambda t, **kw: support.Evidence(target=t, digest=DIGEST))
    monkeypatch.setattr(support, "release_notes", lambda ev, pools, previous: {"digest": ev.digest})
    monkeypatch.setattr(support, "render_notes", lambda n: f"# notes of {n['digest']}\n")
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)

    def notes():
        return support.notes_cli(None, [_target()], fmt="json", verifier=None, records=None,
                                 digest=None, previous=None, output=str(tmp_path / "notes"))
    notes()
    d = tmp_path / "notes" / TARGET
    assert json.loads((d / "release-notes.json").read_text()) == {"digest": DIGEST}
    assert (d / "release-notes.md").read_text() == f"# notes of {DIGEST}\n"
    (d / "release-notes.md").unlink()
    (d / "release-notes.md").symlink_to(victim)
    with pytest.raises(StateError, match="is a symlink"):
        notes()
    assert victim.read_text() == "precious\n"


def test_schema_output_symlink_is_exit_8(tmp_path, victim, capsys):
    out = tmp_path / "matrix.schema.json"
    out.symlink_to(victim)
    assert main(["schema", "--output", str(out)]) == 8
    assert "is a symlink" in _one_line(capsys.readouterr().err, out)
    assert victim.read_text() == "precious\n"


def test_a_live_log_refuses_a_symlink_and_makes_its_folder(tmp_path, victim):
    with files.open_log(tmp_path / "logs" / "t.log") as f:
        f.write("+ docker build\n")
        assert (tmp_path / "logs" / "t.log").read_text() == "+ docker build\n"  # line-buffered: tailable
    (tmp_path / "logs" / "u.log").symlink_to(victim)
    with pytest.raises(StateError, match="is a symlink"):
        files.open_log(tmp_path / "logs" / "u.log")
    assert victim.read_text() == "precious\n"
