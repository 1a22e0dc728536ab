"""Crash safety on the real engine: SIGKILL of gpuforge alone during `validate` takes its pytest child with
it and writes no report afterwards; a full --reports disk leaves the previous report whole (one line,
exit 8); a state dir that cannot be written moves no build tag."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid

import docker.errors
import pytest
import state_here

from conftest import REQUIRE, ROOT, dead_runs_window, gpuforge, reaping_validate
from gpuforge.engine import containers as run
from gpuforge.errors import StateError

pytestmark = pytest.mark.docker


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def _ours(child_run: str) -> list[str]:
    """Ids of the containers of one validator run (the low-level list: no inspect that races other runs'
    removals on a shared engine)."""
    from gpuforge.engine import client as engine

    return [c["Id"] for c in engine.client().api.containers(all=True, filters={"label": f"{run.RUN_LABEL}={child_run}"})]


def _pinned(docker_engine, t, rec, tag: str) -> str:
    """Tag the recorded image (or, when a concurrent run replaced it, the default tag's) with our own tag."""
    try:
        img = docker_engine.images.get(rec["image_id"])
    except docker.errors.ImageNotFound:
        img = docker_engine.images.get(t.tags[0])
    img.tag(*tag.split(":"))
    return img.id


@pytest.fixture
def tmpfs(tmp_path):
    """Mount a 56 KiB tmpfs (root with mount permission); skipped saying why where it cannot be mounted."""
    mounted = []

    def mount(name: str, options: str = "size=56k"):
        d = tmp_path / name
        d.mkdir()
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(d)], capture_output=True, text=True)
        if r.returncode != 0:
            msg = f"cannot mount a tmpfs ({r.stderr.strip()}): needs root with mount permission"
            pytest.fail(f"GPUFORGE_REQUIRE_DOCKER=1 but {msg}") if REQUIRE else pytest.skip(msg)
        mounted.append(d)
        return d

    yield mount
    for d in reversed(mounted):
        subprocess.run(["umount", "-l", str(d)], check=False)


def test_sigkill_of_gpuforge_alone_mid_validate_writes_no_report(default_build, tmp_path):
    t, _ = default_build
    reports = tmp_path / "reports"
    (reports / t.id).mkdir(parents=True)
    before = {"report.json": '{"green": true, "note": "the previous, green report"}\n', "report.md": "GREEN\n"}
    for name, text in before.items():
        (reports / t.id / name).write_text(text)
    run_id = f"kill-{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen([sys.executable, "-m", "gpuforge", "validate", "--reports", str(reports)], cwd=ROOT,
                            env={**os.environ, "GPUFORGE_RUN_ID": run_id}, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    child_run = f"{run_id}-{t.id}"[:60]
    # its containers stay on the shared engine from the kill until the next run reaps them (held from its start: the
    # try below is the one that ends the run whatever fails)
    with dead_runs_window(leaves_them=True):
        try:
            deadline = time.monotonic() + 180
            while not _ours(child_run) and time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.2)
            assert _ours(child_run), "validate started no container within 180 s"
            [child] = _children(proc.pid)
            os.kill(proc.pid, signal.SIGKILL)  # gpuforge alone, not its process group
            proc.wait(timeout=30)
            deadline = time.monotonic() + 15
            while _alive(child) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert not _alive(child), "the pytest child outlived its killed parent"
            time.sleep(5)  # the old orphan wrote its report about 60 s later; a dead child writes nothing
            assert {p.name: p.read_text() for p in (reports / t.id).iterdir()} == before
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        r = reaping_validate(tmp_path)
        # (on a shared engine another run may have reaped them first: what counts is that none is left)
        assert _ours(child_run) == [], r.stderr


def test_full_reports_disk_leaves_the_previous_report_whole(default_build, tmpfs):
    t, _ = default_build
    reports = tmpfs("reports")
    args = ("validate", "--reports", str(reports), "--pytest-args", "-k test_python")  # a quick partial run
    r = gpuforge(*args)
    assert r.returncode == 0, r.stderr[-2000:]
    d = reports / t.id
    before = {p.name: p.read_bytes() for p in d.iterdir()}
    assert {"report.json", "report.md", "report.xml", "target.json"} <= set(before)
    free = os.statvfs(reports).f_bavail * os.statvfs(reports).f_frsize
    (reports / "filler").write_bytes(b"x" * max(0, free - 2048))  # ~2 KiB left: less than one report
    r = gpuforge(*args)
    errors = [line for line in r.stderr.splitlines() if line.startswith("gpuforge: error:")]
    assert r.returncode == 8 and len(errors) == 1, r.stderr[-3000:]
    assert "no space left on device" in errors[0] and str(d) in errors[0], errors
    assert "Traceback" not in r.stderr
    assert {p.name: p.read_bytes() for p in d.iterdir()} == before  # whole, and nothing half-written beside it
    json.loads(before["report.json"])


def test_unwritable_state_dir_moves_no_build_tag(default_build, docker_engine, tmp_path, test_ca, tmpfs, monkeypatch,
                                                 capsys):
    """An entrypoint-only rebuild (a new image id in seconds) into a read-only state dir: the build's tag
    stays on the old image and the record names it, both as before, and the error is the state dir's."""
    from state_here import records

    from gpuforge.builder import runner as build
    from gpuforge.render import dockerfile as render

    t, rec = default_build
    state = tmpfs("state", "size=1m")
    monkeypatch.setenv("GPUFORGE_STATE_DIR", str(state))
    tag = f"gpuforge-test/state-{uuid.uuid4().hex[:8]}:record-first"
    t2 = dataclasses.replace(t, tags=(tag,))
    rec = {**rec, "image_id": _pinned(docker_engine, t, rec, tag)}
    records.update_build(t.id, **{k: v for k, v in rec.items() if k in records.BuildRecord.model_fields})
    ctx = render.copy_context(tmp_path / "ctx")
    render.write(t2, ctx / "images" / "dist")
    with (ctx / "images" / "context" / "entrypoint.sh").open("a") as f:
        f.write(f"# {uuid.uuid4().hex}\n")  # a new image, built mostly from cache
    subprocess.run(["mount", "-o", "remount,ro", str(state)], check=True)
    new = None
    try:
        with pytest.raises(StateError) as e:
            build.build_targets([t2], build.BuildOptions(**state_here.build_kw(log_dir=tmp_path / "logs"), context_root=ctx, extra_ca=str(test_ca["bundle"]), progress="plain"))
        assert e.value.return_code == 8 and "read-only file system" in str(e.value) and str(state) in str(e.value)
        new = re.search(r"built (sha256:[0-9a-f]{12}) but could not record it, so no tag moved", capsys.readouterr().err)
        assert new, "the build did not say what it built and why no tag moved"
        assert docker_engine.images.get(tag).id == rec["image_id"], "the tag moved without its record"
        assert records.require_build(t.id).image_id == rec["image_id"]
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(state)], check=False)
        docker_engine.images.remove(tag)
        if new:
            with contextlib.suppress(docker.errors.APIError):  # another run may hold it
                docker_engine.images.remove(new[1])


def test_a_tag_that_cannot_move_puts_the_tags_and_the_record_back(default_build, docker_engine, tmp_path, test_ca,
                                                                  monkeypatch, capsys):
    """The second of two tags is refused by the engine: the first goes back to its old image, the record
    to what it was, and the target fails naming the tag (exit 4), with no tag pointing at an unrecorded image."""
    from state_here import records

    from gpuforge.builder import runner as build
    from gpuforge.errors import BuildError
    from gpuforge.render import dockerfile as render

    t, rec = default_build
    monkeypatch.setenv("GPUFORGE_STATE_DIR", str(tmp_path / "state"))
    tag = f"gpuforge-test/state-{uuid.uuid4().hex[:8]}:put-back"
    rec = {**rec, "image_id": _pinned(docker_engine, t, rec, tag)}
    records.update_build(t.id, **{k: v for k, v in rec.items() if k in records.BuildRecord.model_fields})
    t2 = dataclasses.replace(t, tags=(tag, "gpuforge-test/NOT_A_VALID_REPO:x"))  # the engine refuses upper case
    ctx = render.copy_context(tmp_path / "ctx")
    render.write(t2, ctx / "images" / "dist")
    with (ctx / "images" / "context" / "entrypoint.sh").open("a") as f:
        f.write(f"# {uuid.uuid4().hex}\n")
    new = None
    try:
        with pytest.raises(BuildError):
            build.build_targets([t2], build.BuildOptions(**state_here.build_kw(log_dir=tmp_path / "logs"), context_root=ctx, extra_ca=str(test_ca["bundle"]), progress="plain"))
        err = capsys.readouterr().err
        new = re.search(r"built (sha256:[0-9a-f]{12}) but could not tag it gpuforge-test/NOT_A_VALID_REPO:x", err)
        assert new and "its tags and record were put back" in err, err[-2000:]
        assert docker_engine.images.get(tag).id == rec["image_id"], "the first tag stayed on the unrecorded image"
        assert records.require_build(t.id) == records.BuildRecord(**{k: v for k, v in rec.items()
                                                                      if k in records.BuildRecord.model_fields})
    finally:
        docker_engine.images.remove(tag)
        if new:
            with contextlib.suppress(docker.errors.APIError):
                docker_engine.images.remove(new[1])
