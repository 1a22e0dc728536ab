"""validators/sshaudit.py: ssh-audit 3.9.0's JSON read against its shape; a surprise is a named problem, never an
AttributeError, and a good report's fail items and CVEs are found."""

from __future__ import annotations

import json
import sys

import pytest

from gpuforge import paths

sys.path.insert(0, str(paths.project_root() / "validators"))
import sshaudit

GOOD = {"kex": [{"algorithm": "curve25519-sha256", "notes": {}},
                {"algorithm": "diffie-hellman-group1-sha1", "notes": {"fail": ["using broken SHA-1 hash algorithm"]}}],
        "key": [{"algorithm": "ssh-ed25519", "keysize": 256}], "enc": [], "mac": [], "cves": [{"name": "CVE-2023-48795"}]}


def test_a_good_report_gives_its_fail_items_and_cves():
    rep, problems = sshaudit.parse(json.dumps(GOOD))
    assert problems == [] and sshaudit.fail_items(rep) == [
        "kex diffie-hellman-group1-sha1: using broken SHA-1 hash algorithm", "CVE CVE-2023-48795"]


@pytest.mark.parametrize(("raw", "words"), [
    ("connection refused", "not JSON"),
    ('"a string"', "the top level is a str"),
    (json.dumps({**GOOD, "kex": ["curve25519-sha256"]}), "kex[0] is \"curve25519-sha256\", not an object"),
    (json.dumps({**GOOD, "mac": {"x": 1}}), "'mac' is a dict, not a list"),
    (json.dumps({**GOOD, "enc": [{"algorithm": "aes", "notes": "fail"}]}), "enc[0] (aes): notes are \"fail\""),
    (json.dumps({**GOOD, "cves": ["CVE-1"]}), "'cves' is [\"CVE-1\"]"),
])
def test_each_surprise_is_a_named_problem(raw, words):
    rep, problems = sshaudit.parse(raw)
    assert rep is None and any(words in p for p in problems), problems
