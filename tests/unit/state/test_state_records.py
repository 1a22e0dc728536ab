"""The state files read with a schema check: each malformed shape is one StateError line naming the file
and what to do (exit 8, through the real CLI as well), never a traceback; symlinks are never followed."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from state_here import records

from gpuforge import cli
from gpuforge.errors import StateError
from gpuforge.state import files
from gpuforge.state.models import BuildRecord

IMG = "sha256:" + "a" * 64
OTHER = "sha256:" + "b" * 64


@pytest.fixture
def state(tmp_path, monkeypatch):
    d = tmp_path / "state"
    monkeypatch.setenv("GPUFORGE_STATE_DIR", str(d))
    return d


def _one_line(e: StateError, path) -> str:
    msg = str(e)
    assert "\n" not in msg and msg.startswith(str(path)), msg
    assert e.return_code == 8
    return msg


# (name, what is put at builds.json, words the error must hold)
MALFORMED = [
    ("a-list", lambda p: p.write_text('[{"image_id": "x"}]'), "top level is a JSON list, not an object"),
    ("a-string", lambda p: p.write_text('"builds"'), "top level is a JSON str, not an object"),
    ("a-string-record", lambda p: p.write_text('{"pt271": "sha256:abc"}'), "builds.pt271"),
    ("a-string-record-v1", lambda p: p.write_text('{"schema_version": 1, "builds": {"pt271": "x"}}'), "builds.pt271"),
    ("random-bytes", lambda p: p.write_bytes(os.urandom(64) + b"\xff\xfe"), "not UTF-8 text"),
    ("a-directory", lambda p: p.mkdir(), "is a directory"),
    ("truncated", lambda p: p.write_text('{"schema_version": 1, "builds": {"pt271": {"image_id": "sha'), "not valid JSON"),
    ("empty", lambda p: p.write_text(""), "empty"),
    ("unknown-field", lambda p: p.write_text(json.dumps({"schema_version": 1, "builds": {"t": {"image_id": IMG, "colour": 1}}})),
     "builds.t.colour: Extra inputs are not permitted"),
    ("bad-image-id", lambda p: p.write_text(json.dumps({"builds": {"t": {"image_id": "latest"}}, "schema_version": 1})),
     "builds.t.image_id"),
    ("newer-schema", lambda p: p.write_text('{"schema_version": 99, "builds": {}}'), "schema_version 99 is not one this gpuforge reads"),
    ("a-symlink", lambda p: p.symlink_to(p.parent / "elsewhere.json"), "is a symlink"),
]


@pytest.mark.parametrize(("make", "words"), [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED])
def test_malformed_builds_json_is_one_line(state, make, words):
    state.mkdir()
    (state / "elsewhere.json").write_text(json.dumps({"t": {"image_id": IMG}}))
    make(state / "builds.json")
    for call in (lambda: records.build("t"), lambda: records.update_build("t", image_id=IMG)):
        with pytest.raises(StateError) as e:
            call()
        msg = _one_line(e.value, state / "builds.json")
        assert words in msg, msg
        assert "delete it" in msg or "gpuforge that wrote it" in msg or "symlink" in msg or "directory" in msg
    assert json.loads((state / "elsewhere.json").read_text()) == {"t": {"image_id": IMG}}  # never written through


@pytest.mark.parametrize(("make", "words"), [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED])
def test_the_cli_says_it_in_one_line_with_exit_8(state, capsys, monkeypatch, make, words):
    """Through cli.main, the one place errors are printed (a truncated record was exit 1, a code not listed)."""
    from gpuforge.push import pusher

    state.mkdir()
    make(state / "builds.json")
    monkeypatch.setattr(pusher, "push_targets", lambda targets, **_: records.require_build(targets[0].id))
    rc = cli.main(["push"])
    err = capsys.readouterr().err
    assert rc == 8 and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"gpuforge: error: {state / 'builds.json'}: ") and words in err, err


def test_unversioned_records_of_earlier_releases_are_read_and_rewritten_versioned(state):
    state.mkdir()
    (state / "builds.json").write_text(json.dumps({"t": {"image_id": IMG, "tags": ["r:t"], "report_digest": "sha256:1"}}))
    assert records.require_build("t").report_digest == "sha256:1"
    records.update_build("t", digest="sha256:" + "c" * 64)
    doc = json.loads((state / "builds.json").read_text())
    assert doc["schema_version"] == 1 and doc["builds"]["t"]["tags"] == ["r:t"] and doc["builds"]["t"]["digest"]


def test_update_merges_and_refuses_unknown_fields_and_bad_values(state):
    records.update_build("t", image_id=IMG, tags=["a:1"])
    assert records.update_build("t", report_digest="sha256:1") == records.require_build("t")
    assert records.require_build("t") == BuildRecord(image_id=IMG, tags=["a:1"], report_digest="sha256:1")
    with pytest.raises(TypeError, match="colour"):
        records.update_build("t", colour="red")
    with pytest.raises(StateError, match="image_id"):
        records.update_build("u", report="r.json")  # a record starts with a build
    with pytest.raises(StateError, match="size"):
        records.update_build("t", size="big")
    records.restore_build("t", None)
    assert records.build("t") is None


def test_symlinked_state_dir_is_refused(tmp_path, monkeypatch):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    monkeypatch.setenv("GPUFORGE_STATE_DIR", str(tmp_path / "link"))
    with pytest.raises(StateError) as e:
        records.update_build("t", image_id=IMG)
    assert "is a symlink" in _one_line(e.value, tmp_path / "link")
    assert list(real.iterdir()) == []


def test_symlinked_report_file_is_replaced_not_followed(tmp_path):
    """A link planted at reports/<id>/report.json: the write replaces the link; its target keeps its bytes."""
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    d = tmp_path / "reports" / "t"
    d.mkdir(parents=True)
    (d / "report.json").symlink_to(victim)
    with pytest.raises(StateError, match="is a symlink"):
        files.read_text(d / "report.json")
    files.write_text(d / "report.json", "{}\n", root=tmp_path / "reports")
    assert victim.read_text() == "precious\n"
    assert not (d / "report.json").is_symlink() and (d / "report.json").read_text() == "{}\n"


def test_symlinked_report_folder_is_refused(tmp_path):
    elsewhere = tmp_path / "etc"
    elsewhere.mkdir()
    (tmp_path / "reports").mkdir()
    (tmp_path / "reports" / "t").symlink_to(elsewhere)
    with pytest.raises(StateError) as e:
        files.Folder(tmp_path, "reports", "t")
    assert "is a symlink" in _one_line(e.value, tmp_path / "reports" / "t")
    assert list(elsewhere.iterdir()) == []


@pytest.fixture
def mountpoint(tmp_path):
    """A folder we may mount a tmpfs on (root in a container that allows it), unmounted afterwards."""
    d = tmp_path / "mnt"
    d.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=56k", "tmpfs", str(d)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip()}): needs root and mount permission")
    yield d
    subprocess.run(["umount", "-l", str(d)], check=False)


def test_read_only_state_dir_is_one_line_and_still_readable(mountpoint, monkeypatch, capsys):
    monkeypatch.setenv("GPUFORGE_STATE_DIR", str(mountpoint / "state"))
    records.update_build("t", image_id=IMG)
    subprocess.run(["mount", "-o", "remount,ro", str(mountpoint)], check=True)
    assert records.require_build("t").image_id == IMG  # readers need no write access
    with pytest.raises(StateError) as e:
        records.update_build("t", image_id=OTHER)
    assert "read-only file system" in _one_line(e.value, mountpoint / "state")
    from gpuforge.push import pusher

    monkeypatch.setattr(pusher, "push_targets", lambda targets, **_: records.update_build(targets[0].id, image_id=OTHER))
    assert cli.main(["push"]) == 8
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"gpuforge: error: {mountpoint / 'state'}") and "read-only" in err, err


def test_full_disk_leaves_the_previous_report_set_whole(mountpoint):
    """A 56 KiB tmpfs: the previous report.json/.md stay byte for byte, no temp file is left, one line (exit 8)."""
    with files.Folder(mountpoint, "reports", "t") as d:
        d.write_set({"report.json": b'{"green": true}\n', "report.md": b"GREEN\n"})
        (mountpoint / "filler").write_bytes(b"x" * 40 * 1024)
        with pytest.raises(StateError) as e:
            d.write_set({"report.md": b"RED\n" * 500, "report.json": b'{"green": false, "pad": "' + b"y" * 20000 + b'"}\n'})
    msg = _one_line(e.value, mountpoint / "reports" / "t")
    assert "no space left on device" in msg
    assert (mountpoint / "reports" / "t" / "report.json").read_bytes() == b'{"green": true}\n'
    assert (mountpoint / "reports" / "t" / "report.md").read_bytes() == b"GREEN\n"
    assert sorted(p.name for p in (mountpoint / "reports" / "t").iterdir()) == ["report.json", "report.md"]
