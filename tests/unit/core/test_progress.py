"""Progress of push and validate: the push stream's layer states and bytes (events as Docker 20.10's push
stream sent them to the SDK, recorded from a real push to a loopback registry), and the validator run's
checks done of total from the pytest plugin, in plain mode (what a CI log shows)."""

from __future__ import annotations

import os
import sys

from gpuforge.engine import progress
from gpuforge.validate.progress import Watch

FIRST_PUSH = [
    {"status": "The push refers to repository [127.0.0.1:5931/cli/tiny]"},
    {"status": "Preparing", "progressDetail": {}, "id": "4676484bf736"},
    {"status": "Preparing", "progressDetail": {}, "id": "9a0b1c2d3e4f"},
    {"status": "Pushing", "progressDetail": {"current": 33792, "total": 3000000}, "id": "4676484bf736"},
    {"status": "Pushing", "progressDetail": {"current": 3010560, "total": 3000000}, "id": "4676484bf736"},
    {"status": "Pushed", "progressDetail": {}, "id": "4676484bf736"},
    {"status": "Layer already exists", "progressDetail": {}, "id": "9a0b1c2d3e4f"},
    {"status": "1: digest: sha256:8677bf09d6429e2ac0dba8332fb64b8f38c64d7de3f3f105bb0f8817cda26b6d size: 527"},
    {"progressDetail": {}, "aux": {"Tag": "1", "Digest": "sha256:8677bf09d6429e2ac0dba8332fb64b8f38c64d7de3f3f105bb0f8817cda26b6d",
                                   "Size": 527}},
]


def test_push_state_counts_layers_and_bytes():
    st = progress.PushState()
    finished = [st.feed(ev) for ev in FIRST_PUSH[:5]]
    assert finished == [None] * 5 and st.done == 0 and len(st.layers) == 2
    assert st.sent == 3000000 == st.total  # the engine's overshoot is not counted
    assert st.feed(FIRST_PUSH[5]) == "4676484bf736"
    assert st.feed(FIRST_PUSH[6]) == "9a0b1c2d3e4f"
    assert [st.feed(ev) for ev in FIRST_PUSH[7:]] == [None, None]  # the tag line and aux are not layers
    assert st.line() == "2/2 layers done, 3.0 MB of 3.0 MB sent"


def test_plain_push_progress_passes_every_event_and_prints_each_layer(capsys):
    shown = progress.PushProgress("127.0.0.1:5931/cli/tiny:1", "plain")
    assert list(shown.feed(iter(FIRST_PUSH))) == FIRST_PUSH  # the caller still sees the digest and any error
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["gpuforge: push 127.0.0.1:5931/cli/tiny:1: layer 4676484bf736 pushed; 1/2 layers done, "
                     "3.0 MB of 3.0 MB sent",
                     "gpuforge: push 127.0.0.1:5931/cli/tiny:1: layer 9a0b1c2d3e4f already in the registry; 2/2 layers done, "
                     "3.0 MB of 3.0 MB sent"]


def test_validate_progress_counts_checks_done_of_total(tmp_path, capsys):
    (tmp_path / "test_x.py").write_text(
        "import pytest\n"
        "def test_a(): pass\n"
        "def test_b(): assert 0\n"
        "@pytest.mark.skip(reason='not here')\n"
        "def test_c(): pass\n"
        "@pytest.fixture\n"
        "def broken(): raise RuntimeError\n"
        "def test_d(broken): pass\n")
    w = Watch([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path),
               str(tmp_path / "test_x.py")],
              dict(os.environ), label="demo", plain=True)
    assert w.wait() == 1
    assert (w.total, w.done) == (4, 4)
    assert w.outcomes == {"passed": 1, "failed": 2, "skipped": 1}
    out = capsys.readouterr().out
    assert "gpuforge: validate demo: 4 check(s) collected" in out
    assert "[4/4] failed test_x.py::test_d" in out
    assert "1 failed, 1 passed, 1 skipped, 1 error" in out  # pytest's own summary still comes through
