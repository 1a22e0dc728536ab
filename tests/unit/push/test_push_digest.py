"""The pushed digest as each engine reports it: 20.10 in an aux event, 26.1 with the containerd store
only in the status line (seen: {'status': 'default: digest: sha256:1fcd... size: 855'})."""

from __future__ import annotations

from gpuforge.push.pusher import pushed_digest

D = "sha256:" + "1f" * 32


def test_status_line_of_this_tag_gives_the_digest():
    assert pushed_digest(f"default: digest: {D} size: 855", "default") == D


def test_other_tags_and_other_lines_give_none():
    assert pushed_digest(f"other: digest: {D} size: 855", "default") is None
    assert pushed_digest("The push refers to repository [127.0.0.1:5100/x]", "default") is None
    assert pushed_digest(f"default: digest: {D[:-1]} size: 855", "default") is None
