"""gpuforge outdated against real parts: a local docker-registry whose base tag is re-pushed (the digest moves),
and `apt-get -s upgrade` against the security pocket inside the real default image, which its build brought up to
date."""

from __future__ import annotations

import io
import json
import subprocess
import tarfile
import uuid
from pathlib import Path

import pytest
from registries import LocalRegistry

from gpuforge.builder import aptstate
from gpuforge.cli import main
from gpuforge.engine import client as engine
from gpuforge.fleet import outdated

pytestmark = pytest.mark.docker


def _tiny(ref: str, content: bytes) -> None:
    """A one-file image made with `docker import` (no registry needed), tagged `ref`."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("etc/fleet-base")
        info.size = len(content)
        tar.addfile(info, io.BytesIO(content))
    subprocess.run(["docker", "import", "-", ref], input=buf.getvalue(), check=True, capture_output=True)


@pytest.fixture
def base_registry(tmp_path, docker_engine):
    (tmp_path / "reg").mkdir()
    reg = LocalRegistry(tmp_path / "reg", None)
    refs: list[str] = []
    yield reg.host, refs
    for r in refs:
        subprocess.run(["docker", "rmi", "-f", r], capture_output=True, check=False)
    reg.stop()


def test_a_base_whose_tag_is_re_pushed_is_reported_as_moved(tmp_path, base_registry, capsys):
    host, refs = base_registry
    ref = f"{host}/fleet-{uuid.uuid4().hex[:8]}/ubuntu:24.04"
    refs.append(ref)
    (tmp_path / "matrix.yaml").write_text(f"""\
bases:
  ubuntu24.04: {{image: "{ref}"}}
matrix:
  include:
    - {{torch: "2.7.1", cuda: "12.6", python: "3.12", os: ubuntu24.04, flavor: runtime, source: wheels}}
default: ["os=ubuntu24.04"]
""")
    m = ["--matrix", str(tmp_path / "matrix.yaml")]
    _tiny(ref, b"first\n")
    subprocess.run(["docker", "push", ref], check=True, capture_output=True)
    assert main([*m, "outdated", "--json"]) == 0
    def base_findings() -> list[str]:
        return [f["detail"] for f in json.loads(capsys.readouterr().out)["findings"] if f["kind"] == "base"]

    assert [d[:31] for d in base_findings()] == ["not pinned in bases.lock (now s"]
    assert main([*m, "outdated", "--write-base-lock"]) == 0
    lock = json.loads((tmp_path / "bases.lock").read_text())
    first = lock[ref]
    capsys.readouterr()
    assert main([*m, "outdated", "--json"]) == 0
    assert base_findings() == []
    _tiny(ref, b"second\n")  # someone re-pushes the tag
    subprocess.run(["docker", "push", ref], check=True, capture_output=True)
    assert main([*m, "outdated"]) == 0
    out = capsys.readouterr().out
    now = outdated.current_digest(ref)
    assert now != first
    assert f"base: {ref}: the tag moved: {first} (locked) -> {now}" in out


def test_the_built_default_image_has_no_pending_security_updates(default_build, capsys):
    """The system layer applies the OS's updates (its base's sources: bookworm, -updates, -security), so `outdated
    --images` finds no security update pending in the image the run built; the layer's key (GPUFORGE_APT_STATE) is in
    the recorded build command and, with where it came from, in the build's log."""
    t, rec = default_build
    [arg] = [a for a in rec["argv"] if a.startswith(f"{aptstate.BUILD_ARG}=")]
    assert rec["argv"][rec["argv"].index(arg) - 1] == "--build-arg"
    assert f"gpuforge: apt state of {t.os}: {arg} (" in Path(rec["log"]).read_text(errors="replace")
    assert main(["outdated", "--images", "--json", t.id]) == 0
    found = json.loads(capsys.readouterr().out)["findings"]
    assert not [f for f in found if f["kind"] == "unchecked" and f["subject"] == t.id], found
    pending = [f["detail"] for f in found if f["kind"] == "security" and f["subject"] == t.id]
    # the suites as they are now, read as a build reads them: the mirror answers (no date fallback)
    now = aptstate.resolve(aptstate.sources(t, aptstate.debian_arch(engine.engine_info().arch)))
    assert not now.fallback, now.source
    moved = "" if now.value == arg.split("=", 1)[1] else f"; the suites moved since (now {now.value}): an update published during the run"
    assert not pending, f"{len(pending)} security update(s) pending in {rec['image_id'][:19]} built with {arg}{moved}: {pending[:5]}"
