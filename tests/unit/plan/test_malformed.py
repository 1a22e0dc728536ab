"""Malformed and impossible matrix files: each gives one clear line naming file:line and field, exit 2,
and never a traceback (run through the real CLI entry point)."""

from __future__ import annotations

import pytest

from conftest import BASE_MATRIX
from gpuforge.cli import main

M = BASE_MATRIX


def _swap(old: str, new: str) -> str:
    assert old in M, old
    return M.replace(old, new)


CASES = [
    # (id, text, expected substrings)
    ("not-a-mapping", "- just\n- a list\n", [":1:", "must be a mapping"]),
    ("bad-yaml", "matrix: [unclosed\n", ["not valid YAML"]),
    ("unknown-top-key", M + "regsitry: x\n", [":14:", "regsitry", "perhaps you meant 'registry'"]),
    ("unknown-axis-key", _swap("  flavor: [runtime, devel]", "  flavour: [runtime, devel]"),
     [":11:", "matrix.flavour", "perhaps you meant 'flavor'"]),
    ("float-cuda", _swap('cuda: ["12.6", "12.8"]', "cuda: [12.6, 12.8]"), [":8:", "matrix.cuda.0", 'quote version numbers, e.g. "12.6"']),
    ("axis-not-list", _swap('torch: ["2.7.1"]', 'torch: "2.7.1"'), [":7:", "matrix.torch", "valid list"]),
    ("bad-flavor", _swap("flavor: [runtime, devel]", "flavor: [runtime, debug]"), [":11:", "matrix.flavor.1", "'debug' is not allowed", "runtime"]),
    ("bad-source", _swap("source: [cuda-base]", "source: [conda]"), [":12:", "matrix.source.0", "'conda'"]),
    ("missing-matrix", "default: [x]\n", ["matrix: required field is missing"]),
    ("missing-default", M.replace('default: ["cuda=12.6 flavor=runtime"]\n', ""), ["default: required field is missing"]),
    ("default-matches-nothing", _swap('default: ["cuda=12.6 flavor=runtime"]', 'default: ["cuda=12.4"]'),
     [":13:", "default", "cuda=12.4 matches no target"]),
    ("cuda-not-published", _swap('cuda: ["12.6", "12.8"]', 'cuda: ["12.4"]'),
     ["torch 2.7.1 publishes no CUDA 12.4 variant (allowed: 11.8, 12.6, 12.8)"]),
    ("unknown-torch", _swap('torch: ["2.7.1"]', 'torch: ["2.6.9"]'), ["torch 2.6.9 is not a known release (allowed: 2.7.0, 2.7.1)"]),
    ("python-os-mismatch", _swap('python: ["3.12"]', 'python: ["3.11"]'), ["ubuntu24.04 ships python 3.12, not 3.11"]),
    ("python-unsupported-by-torch", _swap('python: ["3.12"]', 'python: ["3.8"]'), ["torch 2.7.1 does not support python 3.8"]),
    ("cuda-base-tag-missing", _swap("os: [ubuntu24.04]", "os: [debian12]").replace('python: ["3.12"]', 'python: ["3.11"]'),
     ["nvidia/cuda:12.6.3-cudnn-runtime-debian12 does not exist", "use source: wheels for debian12"]),
    ("unknown-os", _swap("os: [ubuntu24.04]", "os: [centos7]"), ["unknown os 'centos7'"]),
    ("duplicate-target", _swap('cuda: ["12.6", "12.8"]', 'cuda: ["12.6", "12.6"]'), [":8:", "matrix.cuda.1", '"12.6" is listed twice']),
    ("duplicate-key", M + "registry: again\n", [":14:", "duplicate key 'registry'"]),
    ("include-unknown-key", M.replace("default:", "  include:\n    - {cudaa: \"12.6\"}\ndefault:"),
     [":14:", "matrix.include.0.cudaa", "unknown key 'cudaa'"]),
    ("include-incomplete", M.replace("default:", "  include:\n    - {torch: \"2.7.1\", cuda: \"12.6\", os: debian12}\ndefault:"),
     ["has no python, flavor, source"]),
    ("exclude-nothing", M.replace("default:", "  exclude:\n    - {cuda: \"12.9\"}\ndefault:"), [":14:", "excludes nothing"]),
    ("include-float", M.replace("default:", "  include:\n    - {cuda: 12.6, size_budget_gb: 3}\ndefault:"),
     [":14:", "matrix.include.0.cuda", "quote version numbers"]),
    ("bad-user", M + "defaults: {user: Root!}\n", [":14:", "defaults.user", "'Root!' is not a user name"]),
    ("low-uid", M + "defaults: {uid: 0}\n", [":14:", "defaults.uid", "greater than or equal to 1000"]),
    ("base-both", _swap("    bootstrap: {suite: bookworm}", "    bootstrap: {suite: bookworm}\n    image: debian:12"),
     ["exactly one of `image:`"]),
    ("bootstrap-unknown-key", _swap("bootstrap: {suite: bookworm}", "bootstrap: {suite: bookworm, mirrror: x}"),
     [":5:", "bases.debian12.bootstrap.mirrror", "perhaps you meant 'mirror'"]),
    ("base-unknown-os", _swap("  debian12:\n", "  debian13:\n"), [":4:", "bases.debian13: unknown os"]),
    ("override-bad-selector", M + 'overrides:\n  - {select: "gpu=h100", size_budget_gb: 9}\n', [":15:", "overrides.0.select", "unknown key 'gpu'"]),
    ("tag-template-placeholder", _swap("repository: gpuforge/pytorch", "repository: gpuforge/pytorch\ntag_template: \"{torch}-{arch}\""),
     [":3:", "unknown placeholder {arch}"]),
    ("bad-repository", _swap("repository: gpuforge/pytorch", "repository: GPUForge/PyTorch"), [":2:", "repository", "is not a repository name"]),
]


@pytest.mark.parametrize(("text", "wants"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_malformed_matrix_gives_one_clear_error(write_matrix, capsys, text, wants):
    path = write_matrix(text)
    rc = main(["--matrix", str(path), "plan"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "Traceback" not in err
    assert err.startswith(f"gpuforge: error: {path}") or "gpuforge: error:" in err
    assert str(path) in err, f"the message does not name the file: {err}"
    for w in wants:
        assert w in err, f"{w!r} not in: {err}"


def test_missing_file(capsys):
    assert main(["--matrix", "/nonexistent/matrix.yaml", "plan"]) == 2
    assert "file not found" in capsys.readouterr().err


def test_at_least_twenty_cases():
    assert len(CASES) >= 20
