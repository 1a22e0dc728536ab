"""matrix.schema.json carries the string grammars the loader enforces (gpuforge.grammar's regexes, one home),
so editors and check-jsonschema refuse what `gpuforge plan` refuses: the committed matrix passes the real
check-jsonschema, hostile values from the hostile-matrix table fail it at their field, and everything the
loader accepts also matches the schema's pattern (ECMAScript, as editors and check-jsonschema read it)."""

from __future__ import annotations

import functools
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import regress
from hostile_cases import BASE, CASES
from hypothesis import given, settings
from hypothesis import strategies as st
from test_grammar import BAD, GOOD

from conftest import ROOT
from gpuforge import grammar
from gpuforge.plan.schema import TAG_FIELDS, json_schema

CHECK_JSONSCHEMA = str(Path(sys.executable).with_name("check-jsonschema"))
SCHEMA = ROOT / "matrix.schema.json"

# Hostile-table cases the schema refuses too, and the JSON path of the value it names (refusals of a value
# inside an optional object are reported at that object).
REFUSED = {
    "apt-shell-injection": "$.defaults.apt_packages[0]",
    "apt-newline-instruction": "$.defaults.apt_packages[0]",
    "apt-option": "$.defaults.apt_packages[0]",
    "apt-bad-version": "$.defaults.apt_packages[0]",
    "pip-shell-injection": "$.defaults.pip_packages[0]",
    "pip-option": "$.defaults.pip_packages[0]",
    "pip-backtracking-bomb": "$.defaults.pip_packages[0]",
    "pip-replaces-torch": "$.defaults.pip_packages[0]",
    "pip-replaces-triton": "$.defaults.pip_packages[0]",
    "pip-direct-url": "$.defaults.pip_packages[0]",
    "pypi-url-newline": "$.defaults.pypi_url",
    "pypi-url-credentials": "$.defaults.pypi_url",
    "pypi-url-no-scheme": "$.defaults.pypi_url",
    "pypi-url-ftp": "$.defaults.pypi_url",
    "index-url-extra-option": "$.defaults.index_url",
    "registry-with-scheme": "$.registry",
    "registry-with-space": "$.registry",
    "tag-with-plus": "$.tag_template",
    "tag-with-slash": "$.tag_template",
    "tag-leading-dot": "$.tag_template",
    "tag-format-spec-bomb": "$.tag_template",
    "tag-attribute-access": "$.tag_template",
    "tag-placeholder-typo": "$.tag_template",
    "version-without-build": "$.version_template",
    "build-in-tag-template": "$.tag_template",
    "version-placeholder-typo": "$.version_template",
    "alias-invalid-tag": "$.overrides[0].aliases.prod[0]",
    "user-root": "$.defaults.user",
    "user-system-account": "$.defaults.user",
    "user-bad-grammar": "$.defaults.user",
    "include-user": "$.matrix.include[0].user",
    "include-aliases": "$.matrix.include[0].aliases.prod[0]",
    "size-negative": "$.defaults.size_budget_gb",
    "size-zero": "$.defaults.size_budget_gb",
    "suite-not-the-os": "$.bases.debian12.bootstrap.suite",
    "mirror-no-scheme": "$.bases.debian12.bootstrap",
    "mirror-credentials": "$.bases.debian12.bootstrap",
    "base-image-not-a-reference": "$.bases['ubuntu22.04'].image",
    "base-image-unpinned": "$.bases['ubuntu22.04'].image",
    "cuda-base-without-cuda-version": "$.cuda_base_image",
    "cuda-base-unknown-placeholder": "$.cuda_base_image",
    "override-sets-nothing": "$.overrides[1]",
    "os-typo-grouped": "$.matrix.os[0]",
    "exclude-empty": "$.matrix.exclude[0]",
    "repository-too-long": "$.repository",
    "fleet-unknown-gpu": "$.fleet.h300.gpu.model",
    "fleet-runner-label-expression": "$.fleet.h200.runs_on[1]",
    "fleet-pool-name": "$.fleet",
    "fleet-driver-grammar": "$.fleet.h200.drivers[0]",
    "fleet-gpus-zero": "$.fleet.h200.gpus",
    "fleet-key-typo": "$.fleet.h200",
    # the small base's cases
    "registry-empty": "$.registry",
    "registry-bare-name": "$.registry",
    "not-a-mapping": "$",
    "unknown-top-key": "$",
    "unknown-axis-key": "$.matrix",
    "float-cuda": "$.matrix.cuda[0]",
    "axis-not-list": "$.matrix.torch",
    "bad-flavor": "$.matrix.flavor[1]",
    "bad-source": "$.matrix.source[0]",
    "missing-matrix": "$",
    "missing-default": "$",
    "unknown-os": "$.matrix.os[0]",
    "include-unknown-key": "$.matrix.include[0]",
    "include-float": "$.matrix.include[0].cuda",
    "bad-user": "$.defaults.user",
    "low-uid": "$.defaults.uid",
    "bootstrap-unknown-key": "$.bases.debian12.bootstrap",
    "base-unknown-os": "$.bases",
    "tag-template-placeholder": "$.tag_template",
    "bad-repository": "$.repository",
}
# Beyond a schema (YAML-level, cross-field or compat-data checks): only the loader refuses these.
LOADER_ONLY = {
    "pip-moves-a-cuda-pin", "tag-too-long", "version-too-long", "version-collision", "alias-collision", "size-nan", "size-inf", "base-image-wrong-version",
    "base-image-wrong-family", "cuda-base-renders-invalid", "override-matches-nothing", "extra-ca-missing",
    "extra-ca-not-pem", "python-mismatch-grouped", "include-missing-axes", "alias-env-typo", "include-uid",
    "cuda-unquoted-12.10", "os-norway-no", "flavor-typo", "alias-bomb", "alias-recursive", "deep-nesting",
    "ten-megabytes", "axes-product-explosion", "selector-brace-bomb", "non-utf8-bytes", "control-character",
    "python-object-tag", "empty-int-tag", "bool-tag-not-a-word", "boolean-key", "duplicate-key", "two-documents", "bad-timestamp",
    # compat-data facts: the arch list and driver floor of each target, the capability of each GPU model
    "fleet-cu126-on-sm120", "fleet-driver-too-old", "fleet-capability-not-the-models", "fleet-exclude-nothing",
    "default-matches-nothing", "cuda-not-published", "unknown-torch", "python-os-mismatch",
    "python-unsupported-by-torch", "cuda-base-tag-missing", "duplicate-target", "include-incomplete", "exclude-nothing",
    "base-both", "override-bad-selector", "bad-yaml", "small-duplicate-key",
}


def check_jsonschema(files: list[Path], schema: Path = SCHEMA) -> dict:
    """Run the real check-jsonschema (ECMAScript regexes, as editors use) once over `files`: {file stem: [paths]}."""
    p = subprocess.run([CHECK_JSONSCHEMA, "--schemafile", str(schema), "-o", "json", *map(str, files)],
                       capture_output=True, text=True, timeout=120, check=False)
    out = json.loads(p.stdout)
    assert not out.get("parse_errors"), out["parse_errors"]
    assert (p.returncode == 0) == (out["status"] == "ok"), p.stderr
    found: dict[str, list[str]] = {}
    for e in out.get("errors", []):
        found.setdefault(Path(e["filename"]).stem, []).append(e["path"])
    return found


def test_the_committed_matrix_and_the_hostile_base_pass_check_jsonschema(tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text(BASE)
    assert check_jsonschema([ROOT / "matrix.yaml", base]) == {}


def test_the_committed_schema_is_valid_json_schema():
    p = subprocess.run([CHECK_JSONSCHEMA, "--check-metaschema", str(SCHEMA)], capture_output=True, text=True,
                       timeout=120, check=False)
    assert p.returncode == 0, p.stdout + p.stderr


def test_every_hostile_case_is_classified():
    ids = {c.id for c in CASES}
    assert set(REFUSED) | LOADER_ONLY == ids and not set(REFUSED) & LOADER_ONLY, ids ^ (set(REFUSED) | LOADER_ONLY)
    assert len(REFUSED) >= 30


def test_hostile_values_are_refused_by_the_schema_at_their_field(tmp_path):
    cases = [c for c in CASES if c.id in REFUSED]
    files = []
    for c in cases:
        files.append(tmp_path / f"{c.id}.yaml")
        files[-1].write_text(c.text)
    found = check_jsonschema(files)
    for c in cases:
        assert REFUSED[c.id] in found.get(c.id, []), f"{c.id}: the schema did not refuse it at {REFUSED[c.id]}: {found.get(c.id)}"


def test_a_refusal_is_the_pattern_not_something_else(tmp_path):
    """The schema refuses the hostile value itself: the same file with a good value at that line passes."""
    good = tmp_path / "good.yaml"
    good.write_text(BASE.replace("  apt_packages: [vim]", '  apt_packages: ["vim=2:9.0.1378-2", "g++"]'))
    bad = tmp_path / "bad.yaml"
    bad.write_text(BASE.replace("  apt_packages: [vim]", '  apt_packages: ["vim", "vim;id"]'))
    assert check_jsonschema([good, bad]) == {"bad": ["$.defaults.apt_packages[1]"]}


# (loader check, the regex the schema carries for it)
CHECKS = [
    (grammar.apt_package, grammar.APT_PACKAGE),
    (grammar.pip_requirement, grammar.PIP_REQUIREMENT),
    (grammar.url, grammar.URL),
    (grammar.registry, grammar.REGISTRY),
    (grammar.repository, grammar.REPOSITORY),
    (grammar.tag, grammar.TAG),
    (grammar.user_name, grammar.USER_NAME),
    (grammar.image_reference, grammar.IMAGE_REFERENCE),
    (lambda v: grammar.image_reference(v, pinned=True), grammar.PINNED_REFERENCE),
]


@functools.cache
def ecma(pattern: str) -> regress.Regex:
    return regress.Regex(grammar.json_pattern(pattern), flags="u")  # as check-jsonschema compiles `pattern`


def accepts(check, value: str) -> bool:
    try:
        check(value)
    except ValueError:
        return False
    return True


def test_the_schema_carries_grammar_regexes_verbatim():
    text = json.dumps(json_schema())
    for pattern in (grammar.APT_PACKAGE, grammar.PIP_REQUIREMENT, grammar.URL, grammar.REGISTRY, grammar.REPOSITORY,
                    grammar.USER_NAME, grammar.PINNED_REFERENCE, grammar.template(TAG_FIELDS),
                    grammar.template((*TAG_FIELDS, "env"))):
        assert json.dumps(grammar.json_pattern(pattern))[1:-1] in text, pattern


@pytest.mark.parametrize(("check", "value"), [(c, v) for c, vs in GOOD for v in vs])
def test_what_the_loader_accepts_the_schema_pattern_accepts(check, value):
    pattern = dict(CHECKS)[check]
    assert ecma(pattern).find(value), (value, pattern)
    assert re.fullmatch(pattern, value)  # and Python reads the regex the same way


_BAD_FOR_THE_SCHEMA = {  # test_grammar's refusals that the pattern alone does not see
    grammar.image_reference: {"a" * 300},  # the name's length (NAME_MAX), a loader check
    grammar.pip_requirement: {"rich; curl x"},  # a marker's grammar: packaging parses it at load
    grammar.url: {"https://x:99999/"},  # a port's range: urlsplit at load
    grammar.user_name: {"root", "nobody", "sshd", "www-data"},  # the schema's `not: enum` (see user-root above)
}


@pytest.mark.parametrize(("check", "value"), [(c, v) for c, vs in BAD for v in vs])
def test_what_the_loader_refuses_the_schema_pattern_mostly_refuses(check, value):
    if value in _BAD_FOR_THE_SCHEMA.get(check, ()):
        assert not accepts(check, value)
        return
    assert not ecma(dict(CHECKS)[check]).find(value), value


_ALPHABET = "aAzZ09_.-:/@[]+ =~;'\"|$&<>!*(),%?#{}\\\n\t\x7f\u00e9bcstuvwxyhpflmnor"


@settings(max_examples=3000, deadline=None, database=None)
@given(value=st.text(alphabet=_ALPHABET, max_size=24), which=st.integers(0, len(CHECKS) - 1))
def test_the_schema_never_refuses_what_the_loader_accepts(value, which):
    """Editors must not flag a valid matrix: loader-accepted implies pattern-matched. The loader matches the same
    regex text with Python's re; this holds the ECMAScript reading of it to the same answer."""
    check, pattern = CHECKS[which]
    if accepts(check, value):
        assert ecma(pattern).find(value), (value, pattern)


_MATCHING = st.one_of(*(st.tuples(st.just(p), st.from_regex(re.compile(p, re.ASCII), fullmatch=True)) for p in (
    grammar.APT_PACKAGE, grammar.URL, grammar.REGISTRY, grammar.REPOSITORY, grammar.TAG, grammar.USER_NAME,
    grammar.IMAGE_REFERENCE)))


@settings(max_examples=200, deadline=None, database=None)
@given(case=_MATCHING)
def test_python_and_ecmascript_read_each_regex_alike(case):
    pattern, value = case  # a string Python's re full-matches
    assert ecma(pattern).find(value), (value, pattern)


@pytest.mark.parametrize(("value", "ok"), [
    ("ubuntu:24.04", True), ("ubuntu@sha256:" + "a" * 64, True), ("ubuntu:latest@sha256:" + "a" * 64, True),
    ("ubuntu:latest", False), ("ubuntu", False), ("localhost:5000/ubuntu", False), ("ubuntu:latest2", True),
])
def test_pinned_means_a_version_tag_or_a_digest_in_both(value, ok):
    assert accepts(lambda v: grammar.image_reference(v, pinned=True), value) is ok
    assert bool(ecma(grammar.PINNED_REFERENCE).find(value)) is ok


@pytest.mark.parametrize(("value", "ok"), [
    ('numpy; python_version >= "3.11"', True), ("rich[jupyter]~=15.0", True), ("torch-geometric", True),
    ("torchmetrics>=1", True), ("TorchVision", False), ("torch [x]", False), (' rich', True),
    ("rich; platform_release == 'a|b'", True), ("rich|x", False), ("rich @ https://x/r.whl", False),
    ("rich===a|b", False),  # packaging takes it (arbitrary equality); the loader holds it to the pattern
])
def test_the_pip_pattern_knows_the_torch_family_and_quoted_markers(value, ok):
    assert accepts(grammar.pip_requirement, value) is ok
    assert bool(ecma(grammar.PIP_REQUIREMENT).find(value)) is ok


@pytest.mark.parametrize(("value", "ok"), [
    ("https://pypi.org/simple", True), ("http://[::1]:8080/simple", True), ("https://x/a@b", True),
    ("HTTPS://pypi.org/simple", False),  # urlsplit folds the scheme; the loader holds it to the pattern
    ("https://u@x/", False), ("https://x y/", False), ("https:/x/", False),
])
def test_the_url_pattern_and_the_loader_agree(value, ok):
    assert accepts(grammar.url, value) is ok
    assert bool(ecma(grammar.URL).find(value)) is ok
