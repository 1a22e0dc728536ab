"""Each build is recorded with its build identifier and version tag: a new one for another image (the next commit,
the weekly security rebuild), the same one when a rebuild makes the same image (its version tag already names those
bytes, maybe pushed and validated). The record refuses what is not an identifier or a tag."""

from __future__ import annotations

import datetime as dt

import pytest

from gpuforge.builder.runner import build_id
from gpuforge.errors import StateError
from gpuforge.state.models import BuildRecord
from gpuforge.state.records import Records

IMG, OTHER = "sha256:" + "a" * 64, "sha256:" + "b" * 64
FIRST = dt.datetime(2026, 12, 6, 20, 30, 15, tzinfo=dt.UTC)
LATER = FIRST + dt.timedelta(days=7)


def test_a_first_build_and_another_image_get_the_time_of_their_build():
    assert str(build_id(None, IMG, FIRST)) == "20261206T203015Z"
    before = BuildRecord(image_id=IMG, build="20261206T203015Z", version="t-20261206T203015Z")
    assert str(build_id(before, OTHER, LATER)) == "20261213T203015Z"


def test_the_same_image_built_again_keeps_its_identifier():
    before = BuildRecord(image_id=IMG, build="20261206T203015Z", version="t-20261206T203015Z")
    assert str(build_id(before, IMG, LATER)) == "20261206T203015Z"
    # a record of before version tags has none to keep: the build gets one
    assert str(build_id(BuildRecord(image_id=IMG), IMG, LATER)) == "20261213T203015Z"


@pytest.mark.parametrize(("field", "value"), [("build", "2026-12-06T20:30:15Z"), ("build", "20261206T203015Z; id"),
                                              ("version", "t:20261206T203015Z"), ("version", "-t"),
                                              ("version", "t\nRUN id")])
def test_the_record_refuses_what_is_not_an_identifier_or_a_tag(tmp_path, field, value):
    records = Records(tmp_path)
    records.update_build("t", image_id=IMG, build="20261206T203015Z", version="t-20261206T203015Z")
    with pytest.raises(StateError, match=f"refusing to record t: {field}"):
        records.update_build("t", **{field: value})
    assert records.require_build("t").version == "t-20261206T203015Z"
