"""A push the registry answers with a 5xx is pushed again (gpuforge.engine.retry): BuildKit's zstd copy (a real
process stands in for the recorded build) and the engine's gzip push (its event stream as the engine sends it)."""

from __future__ import annotations

from pathlib import Path

import docker.errors
import pytest

from gpuforge.builder import export
from gpuforge.engine import retry
from gpuforge.errors import RegistryError
from gpuforge.plan.target import ImageRef
from gpuforge.push import pusher
from gpuforge.registry.client import ANONYMOUS
from gpuforge.state.models import BuildRecord

# Each run counts itself; run n prints $STATUS_n as BuildKit did on CI and exits 1, or, with STATUS_n
# empty, succeeds. A run writes the metadata file (the digest it pushed) unless it succeeds with NO_META set, and a
# failing one writes it too with META_ON_FAIL set: no digest may come from either.
PUSHER = r"""
n=$(( $(cat "$COUNT" 2>/dev/null || echo 0) + 1 )); echo "$n" > "$COUNT"
eval "status=\${STATUS_$n:-}"
while [ "$1" != --metadata-file ]; do shift; done
if [ -n "$status" ]; then
  [ -n "${META_ON_FAIL:-}" ] && printf '{"containerimage.digest": "sha256:%064d"}' "$n" > "$2"
  echo "ERROR: unexpected status from HEAD request to http://127.0.0.1:5101/v2/r/manifests/t-zstd: $status"; exit 1
fi
[ -z "${NO_META:-}" ] && printf '{"containerimage.digest": "sha256:%064d"}' "$n" > "$2"
exit 0
"""
E500, E503, E502, E401 = "500 Internal Server Error", "503 Service Unavailable", "502 Bad Gateway", "401 Unauthorized"


@pytest.fixture
def pauses(monkeypatch) -> list[float]:
    waited: list[float] = []
    monkeypatch.setattr(retry.time, "sleep", waited.append)
    return waited


def _push(tmp_path: Path, monkeypatch, statuses: list[str], **flags: str) -> tuple[int, str | None, int, str]:
    script = tmp_path / "pusher.sh"
    script.write_text(PUSHER)
    rec = BuildRecord(image_id="sha256:" + "a" * 64, driver="buildx",
                      argv=["sh", str(script), "--load", "--metadata-file", "/old/meta"])
    monkeypatch.setenv("COUNT", str(tmp_path / "count"))
    for i, status in enumerate(statuses, 1):
        monkeypatch.setenv(f"STATUS_{i}", status)
    for k, v in flags.items():
        monkeypatch.setenv(k, v)
    log = tmp_path / "t-zstd.log"
    rc, digest = export.push_copy(rec, ref="reg/x:1-zstd", compression="zstd", log=log)
    return rc, digest, int((tmp_path / "count").read_text()), log.read_text()


@pytest.mark.parametrize(("statuses", "runs", "rc"), [
    ([E500, ""], 2, 0),          # the registry's passing trouble: pushed again, green
    ([E503, E503, ""], 3, 0),    # twice, then green on the last attempt
    ([E502, E502, E502], 3, 1),  # never more than ATTEMPTS runs
    ([E401], 1, 1),              # the registry's answer, not its trouble: never again
    ([E500, E401], 2, 1),        # each attempt judged by what it printed, not by an earlier attempt's line
])
def test_a_zstd_push_the_registry_answers_with_a_5xx_runs_again(tmp_path, monkeypatch, capsys, pauses, statuses, runs, rc):
    got_rc, digest, ran, log = _push(tmp_path, monkeypatch, statuses)
    assert (ran, got_rc) == (runs, rc)
    assert digest == (f"sha256:{runs:064d}" if rc == 0 else None)
    assert log.count("+ sh ") == runs  # every attempt kept in the one log, and why it ran again
    assert log.count("# gpuforge: the registry answered") == runs - 1
    said = capsys.readouterr().err
    for attempt, status in enumerate(statuses[:runs - 1], 1):
        assert f"the registry answered {status} to the zstd push of reg/x:1-zstd (attempt {attempt} of 3)" in said
    assert pauses == [2.0, 4.0][:runs - 1]


def test_no_digest_comes_from_a_failed_attempt(tmp_path, monkeypatch, pauses):
    assert _push(tmp_path, monkeypatch, [E401], META_ON_FAIL="1")[:3] == (1, None, 1)


def test_no_digest_comes_from_an_earlier_attempt(tmp_path, monkeypatch, pauses):
    """The 1st attempt wrote a digest and failed with a 500; the 2nd succeeded and wrote none: none is reported."""
    assert _push(tmp_path, monkeypatch, [E500, ""], META_ON_FAIL="1", NO_META="1")[:3] == (0, None, 2)


def test_what_counts_as_the_registrys_passing_trouble():
    assert retry.transient("received unexpected HTTP status: 500 Internal Server Error") == E500
    assert retry.transient("unknown: 504 Gateway Timeout") == "504 Gateway Timeout"
    for answer in (E401, "denied: requested access to the resource is denied", "404 Not Found", "manifest invalid",
                   "no space left on device"):
        assert retry.transient(answer) is None, answer


class _Engine:
    """The engine's push event stream as 20.10 sends it: each push yields the next script's events. It holds no image
    under the pushed reference before the push (a build's version tag is put on for the push), and notes removals."""

    def __init__(self, scripts: list[list[dict]]):
        self.scripts, self.pushes, self.removed = scripts, 0, []
        self.images = self

    def push(self, name, tag, **_):
        self.pushes += 1
        return iter(self.scripts[self.pushes - 1])

    def get(self, name):
        raise docker.errors.ImageNotFound(name)

    def remove(self, name, **_):
        self.removed.append(name)


class _Image:
    def tag(self, *_):
        return True


class _Registry:
    """What the registry holds after the push: the image pushed, at the digest the engine reported."""

    def __init__(self, _auth):
        pass

    def manifest(self, ref):
        return type("M", (), {"holds": staticmethod(lambda image_id: True)})()


DIGEST = "sha256:" + "d" * 64
FAIL_500 = [{"status": "Preparing"}, {"error": "received unexpected HTTP status: 500 Internal Server Error"}]
OK = [{"status": "Pushed"}, {"aux": {"Tag": "1", "Digest": DIGEST, "Size": 1}}]


@pytest.mark.parametrize(("scripts", "pushes", "refused"), [
    ([FAIL_500, OK], 2, None),
    ([FAIL_500, FAIL_500, OK], 3, None),
    ([FAIL_500, FAIL_500, FAIL_500], 3, "500 Internal Server Error"),
    ([[{"error": "denied: requested access to the resource is denied"}], OK], 1, "denied"),
])
def test_the_engines_push_the_registry_answers_with_a_5xx_is_pushed_again(monkeypatch, capsys, pauses, scripts,
                                                                          pushes, refused):
    monkeypatch.setattr(pusher, "Registry", _Registry)
    c = _Engine(scripts)
    rec = BuildRecord(image_id="sha256:" + "a" * 64, driver="buildx")
    ref = ImageRef.parse("127.0.0.1:5000/gpuforge/pytorch:1")
    if refused:
        with pytest.raises(RegistryError, match=refused):
            pusher._push_gzip(c, _Image(), ref, rec, ANONYMOUS, "plain")
    else:
        assert pusher._push_gzip(c, _Image(), ref, rec, ANONYMOUS, "plain") == DIGEST
    assert c.pushes == pushes
    assert c.removed == [str(ref)]  # the version tag is the engine's for the push only, refused or not
    assert capsys.readouterr().err.count(f"the registry answered 500 Internal Server Error to the push of {ref}") == (
        pushes - 1)
