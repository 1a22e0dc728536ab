"""A build's version tag: the build identifier's grammar (UTC, sortable, fixed length) and how matrix.yaml's
version_template renders each target's version tag beside its shared tag."""

from __future__ import annotations

import datetime as dt

import pytest

from conftest import BASE_MATRIX
from gpuforge import grammar
from gpuforge.errors import ConfigError
from gpuforge.plan.matrix import load_matrix
from gpuforge.plan.version import SAMPLE, BuildId

AT = dt.datetime(2026, 12, 6, 20, 30, 15, 987654, tzinfo=dt.UTC)


def test_a_build_identifier_is_the_utc_second_in_iso_basic_format():
    b = BuildId.at_time(AT)
    assert str(b) == "20261206T203015Z" and b.iso() == "2026-12-06T20:30:15+00:00"
    assert BuildId.parse(str(b)) == b
    # another zone is the same instant, written in UTC
    cet = dt.datetime(2026, 12, 6, 21, 30, 15, tzinfo=dt.timezone(dt.timedelta(hours=1)))
    assert str(BuildId.at_time(cet)) == "20261206T203015Z"
    with pytest.raises(ValueError, match="aware time"):
        BuildId.at_time(AT.replace(tzinfo=None))


def test_identifiers_sort_as_time_and_have_one_length():
    times = [AT + dt.timedelta(seconds=s) for s in (0, 1, 59, 3600, 86400 * 40, 86400 * 400)]
    ids = [str(BuildId.at_time(t)) for t in times]
    assert sorted(ids) == ids and len(set(ids)) == len(ids)
    assert {len(i) for i in ids} == {len(str(SAMPLE))} == {grammar.BUILD_ID_LEN}


@pytest.mark.parametrize("text", ["20261206T203015", "2026-12-06T20:30:15Z", "20261306T203015Z", "20261206T253015Z",
                                  "20261206t203015z", " 20261206T203015Z", "20261206T203015Z\n", ""])
def test_what_is_not_a_build_identifier(text):
    with pytest.raises(ValueError, match="not a build identifier"):
        BuildId.parse(text)


def test_the_version_tag_is_the_targets_tag_and_the_build_by_default(write_matrix):
    m = load_matrix(write_matrix(BASE_MATRIX))
    b = BuildId.at_time(AT)
    for t in m.targets:
        assert t.version(b) == f"{t.tag}-20261206T203015Z"
        assert t.version_ref(t.version(b)) == t.ref.with_tag(f"{t.tag}-20261206T203015Z")
        grammar.tag(t.version(b), room=len("-prod"))
    t = m.select(None)[0]
    moved = t.on("registry.example.com:5443")
    assert str(moved.version_ref(t.version(b))) == f"registry.example.com:5443/gpuforge/pytorch:{t.tag}-20261206T203015Z"


def test_a_version_template_of_ones_own(write_matrix):
    text = BASE_MATRIX.replace("repository: gpuforge/pytorch",
                               'repository: gpuforge/pytorch\nversion_template: "{torch}-{cuda_tag}-{flavor}.{build}"')
    t = load_matrix(write_matrix(text)).select(None)[0]
    assert t.tag == "pt271-cu126-py312-ubuntu2404-runtime-cudabase"  # the target's tag is untouched
    assert t.version(BuildId.at_time(AT)) == "2.7.1-cu126-runtime.20261206T203015Z"


def test_the_tag_leaves_room_for_the_build_and_an_environment(write_matrix):
    """tag_template's own limit is 123 (128 less `-prod`); the default version_template adds 17 more."""
    long = "x" * (123 - len("pt271-cu126-py312-ubuntu2404-runtime-cudabase") - 1)
    text = BASE_MATRIX.replace("repository: gpuforge/pytorch", f'repository: gpuforge/pytorch\ntag_template: "{{id}}-{long}"')
    with pytest.raises(ConfigError, match=r"version_template: renders .* tags may have at most 123"):
        load_matrix(write_matrix(text))
    short = long[: -len("-20261206T203015Z")]
    text = BASE_MATRIX.replace("repository: gpuforge/pytorch", f'repository: gpuforge/pytorch\ntag_template: "{{id}}-{short}"')
    load_matrix(write_matrix(text))  # version tag 123 characters: room for -prod and -zstd
