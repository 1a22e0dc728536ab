"""A recorded build run again with another exporter (push's zstd copy), through the build stage's API: the caller
hands over the record and typed values; only builder/ reads or edits a build's argv (no engine needed)."""

from __future__ import annotations

import ast
import json
import subprocess
from pathlib import Path

import pytest

from gpuforge import paths
from gpuforge.builder import export
from gpuforge.engine import retry
from gpuforge.errors import RegistryError
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


# A stand-in for the recorded build (a real process): each run appends to a count; the runs numbered in FAIL_AT
# print the line BuildKit printed on CI (stop 39) and exit 1, the others write the metadata file and exit 0.
PUSHER = r"""
n=$(( $(cat "$COUNT" 2>/dev/null || echo 0) + 1 )); echo "$n" > "$COUNT"
case " $FAIL_AT " in *" $n "*)
  echo "ERROR: unexpected status from HEAD request to http://127.0.0.1:5101/v2/r/manifests/t-zstd: $STATUS"; exit 1;;
esac
while [ "$1" != --metadata-file ]; do shift; done
printf '{"containerimage.digest": "sha256:%064d"}' "$n" > "$2"
"""


def _pusher_rec(tmp_path: Path) -> BuildRecord:
    script = tmp_path / "pusher.sh"
    script.write_text(PUSHER)
    return REC.model_copy(update={"argv": ["sh", str(script), "--load", "--metadata-file", "/old/meta"]})


@pytest.mark.parametrize(("fail_at", "status", "runs", "rc"), [
    ("1", "500 Internal Server Error", 2, 0),         # the registry's passing trouble: pushed again, green
    ("1 2", "503 Service Unavailable", 3, 0),         # twice, then green on the last attempt
    ("1 2 3", "502 Bad Gateway", 3, 1),               # never more than ATTEMPTS runs
    ("1", "401 Unauthorized", 1, 1),                  # the registry's answer, not its trouble: never again
])
def test_a_push_the_registry_answers_with_a_5xx_runs_again(tmp_path, monkeypatch, capsys, fail_at, status, runs, rc):
    monkeypatch.setattr(retry, "PAUSE_S", 0.0)
    monkeypatch.setenv("COUNT", str(tmp_path / "count"))
    monkeypatch.setenv("FAIL_AT", fail_at)
    monkeypatch.setenv("STATUS", status)
    log = tmp_path / "t-zstd.log"
    got_rc, digest = export.push_copy(_pusher_rec(tmp_path), ref="reg/x:1-zstd", compression="zstd", log=log)
    assert int((tmp_path / "count").read_text()) == runs
    assert got_rc == rc and digest == (f"sha256:{runs:064d}" if rc == 0 else None)
    text = log.read_text()
    assert text.count("+ sh ") == runs and text.count(status) == min(runs, len(fail_at.split()))  # every attempt kept
    said = capsys.readouterr().err
    retried = runs - 1
    assert said.count(f"the registry answered {status} to the zstd push of reg/x:1-zstd") == retried
    if retried:
        assert f"(attempt {retried} of {retry.ATTEMPTS}); pushing again" in said


def test_what_counts_as_the_registrys_passing_trouble():
    assert retry.transient("failed: received unexpected HTTP status: 500 Internal Server Error") == "500 Internal Server Error"
    assert retry.transient("unknown: 504 Gateway Timeout") == "504 Gateway Timeout"
    for answer in ("401 Unauthorized", "denied: requested access to the resource is denied", "404 Not Found",
                   "manifest invalid", "no space left on device"):
        assert retry.transient(answer) is None, answer


def test_an_engine_push_the_registry_answers_with_a_5xx_is_called_again(monkeypatch, capsys):
    """The gzip push (the engine's push stream) goes through retry.pushed: a 5xx again, anything else at once."""
    monkeypatch.setattr(retry, "PAUSE_S", 0.0)
    calls = []

    def push(errors):
        def once():
            calls.append(1)
            if len(calls) <= len(errors):
                msg = f"push of reg/x:1 failed: {errors[len(calls) - 1]}"
                raise RegistryError(msg)
            return "sha256:" + "c" * 64
        return once

    e500 = "received unexpected HTTP status: 500 Internal Server Error"
    assert retry.pushed(push([e500, e500]), "push of reg/x:1") == "sha256:" + "c" * 64 and len(calls) == 3
    assert capsys.readouterr().err.count("the registry answered 500 Internal Server Error to the push of reg/x:1") == 2
    calls.clear()
    with pytest.raises(RegistryError, match="500 Internal"):
        retry.pushed(push([e500] * 3), "push of reg/x:1")
    assert len(calls) == retry.ATTEMPTS
    calls.clear()
    with pytest.raises(RegistryError, match="denied"):
        retry.pushed(push(["denied: requested access to the resource is denied"]), "push of reg/x:1")
    assert len(calls) == 1
    assert "retry.pushed(" in (PKG / "publish" / "promote.py").read_text()  # the gzip push's one home for it
