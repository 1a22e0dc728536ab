"""A recorded build run again with another exporter (push's zstd copy), through the build stage's API: the caller
hands over the record and typed values; only builder/ reads or edits a build's argv (no engine needed)."""

from __future__ import annotations

import ast
import json
import subprocess
from pathlib import Path

from gpuforge import paths
from gpuforge.builder import export
from gpuforge.state.models import BuildRecord

PKG = paths.project_root() / "gpuforge"
ARGV = ["docker", "buildx", "build", "--load", "--iidfile", "/old/iid", "--metadata-file", "/old/meta",
        "--build-arg", "PIP_INDEX_URL=https://user:tok@mirror/simple", "."]
REC = BuildRecord(image_id="sha256:" + "a" * 64, driver="buildx", argv=ARGV)


def test_push_copy_runs_the_recorded_build_with_the_exporter(tmp_path, monkeypatch):
    seen = {}

    def fake_run(argv, *, stdout, env, **_):
        seen.update(argv=argv, env=env)
        tmp = Path(argv[argv.index("--metadata-file") + 1])
        tmp.write_text(json.dumps({"containerimage.digest": "sha256:" + "b" * 64}))
        stdout.write("built\n")
        return subprocess.CompletedProcess(argv, 0)

    monkeypatch.setattr(export.subprocess, "run", fake_run)
    log = tmp_path / "t-zstd.log"
    rc, digest = export.push_copy(REC, ref="reg/x:1-zstd", compression="zstd", log=log, docker_config=tmp_path / "cfg")
    assert (rc, digest) == (0, "sha256:" + "b" * 64)
    argv = seen["argv"]
    assert "--load" not in argv
    assert argv[argv.index("--output") + 1] == ("type=image,name=reg/x:1-zstd,push=true,compression=zstd,"
                                                "force-compression=true,oci-mediatypes=true")
    assert "/old/iid" not in argv and "/old/meta" not in argv
    assert seen["env"]["DOCKER_CONFIG"] == str(tmp_path / "cfg") and seen["env"]["DOCKER_BUILDKIT"] == "1"
    first = log.read_text().splitlines()[0]
    assert first.startswith("+ docker buildx build --output") and "tok@" not in first and "//***@mirror" in first


def test_push_copy_without_metadata_reports_no_digest(tmp_path, monkeypatch):
    monkeypatch.setattr(export.subprocess, "run", lambda argv, **_: subprocess.CompletedProcess(argv, 1))
    assert export.push_copy(REC, ref="reg/x:1-zstd", compression="zstd", log=tmp_path / "l.log") == (1, None)


def test_what_the_record_says_about_exporting():
    assert export.exports(REC) and export.recorded(REC) and not export.named_builder(REC)
    classic = BuildRecord(image_id=REC.image_id, driver="classic")
    assert not export.exports(classic) and not export.recorded(classic)
    assert export.named_builder(REC.model_copy(update={"argv": [*ARGV[:-1], "--builder", "remote", "."]}))


def test_only_the_build_stage_reads_a_build_argv():
    """A record's `argv` (and the export argv) is the build stage's: no other stage reads, assembles or edits it."""
    bad = []
    for py in sorted(PKG.rglob("*.py")):
        rel = py.relative_to(PKG)
        if rel.parts[0] == "builder" or rel == Path("state/models.py"):
            continue
        for n in ast.walk(ast.parse(py.read_text(), str(py))):
            if (isinstance(n, ast.Attribute) and n.attr in ("argv", "export_argv", "build_argv")
                    and ast.unparse(n.value) != "sys"):
                bad.append(f"gpuforge/{rel}:{n.lineno}: {ast.unparse(n)}")
    assert not bad, "\n".join(bad) + "\n(ask gpuforge.builder.export for what you need from the recorded build)"
