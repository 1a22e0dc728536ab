"""target.json has one typed shape (gpuforge.image.expected): written by rendering, read with a schema check by the
plugin, the preflight and `gpuforge smoke --target-json`; a file of another shape is one line naming it, exit 2."""

from __future__ import annotations

import json

import pytest

from gpuforge import cli, paths
from gpuforge.image.expected import FIELDS, Expected, ExpectedError
from gpuforge.plan.matrix import load_matrix
from gpuforge.validate import pytest_run as validate


def test_every_target_round_trips_and_matches_what_rendering_wrote():
    m = load_matrix(paths.project_root() / "matrix.yaml")
    for t in m.targets:
        e = t.expected()
        assert Expected.from_dict(json.loads(e.to_json()), "x") == e
        # a target gives every field; the toolkit only a devel image built from wheels
        assert set(e.as_dict()) == set(FIELDS) - (set() if t.toolkit_wheels else {"toolkit"})
        assert Expected.load(paths.dist() / t.id / "target.json") == e


@pytest.mark.parametrize(("raw", "words"), [
    ([], "not a target.json (a JSON object of expected versions, got list)"),
    ("x", "got str"),
    ({"torch": "2.7.1", "cuda_version": "12.6"}, "unknown key(s) cuda_version"),
    ({"torch": 2.7}, "torch=2.7 is not a version or name"),
    ({"torch": "2.7; rm -rf /"}, "is not a version or name"),
    ({"uid": "1000"}, "uid='1000' is not a user id"),
    ({"uid": True}, "uid=True is not a user id"),
    ({"arch_list": "sm_90"}, "is not a list of CUDA architectures"),
    ({"arch_list": ["sm_90", "x86"]}, "is not a list of CUDA architectures"),
    ({"size_budget_gb": -1}, "is not a size in GB"),
    ({"toolkit": "nvidia-cuda-nvcc-cu12==12.6.77"}, "is not a list of pinned wheels (name==version)"),
    ({"toolkit": ["nvidia-cuda-nvcc-cu12>=12"]}, "is not a list of pinned wheels"),
    ({"toolkit": ["x==1; rm -rf /"]}, "is not a list of pinned wheels"),
])
def test_another_shape_is_refused_naming_the_field(raw, words):
    with pytest.raises(ExpectedError) as e:
        Expected.from_dict(raw, "t.json")
    assert str(e.value).startswith("t.json: ") and words in str(e.value)
    assert "gpuforge generate" in str(e.value)  # what to do


def test_expect_overrides_are_text_and_checked():
    e = Expected(torch="2.7.1", uid=1000).merged({"uid": "1001", "arch_list": "sm_80,sm_90", "size_budget_gb": "14"}, "--expect")
    assert (e.uid, e.arch_list, e.size_budget_gb, e.torch) == (1001, ("sm_80", "sm_90"), 14, "2.7.1")
    with pytest.raises(ExpectedError, match=r"^--expect: uid='x'"):
        Expected().merged({"uid": "x"}, "--expect")


def _smoke_target_json(tmp_path, monkeypatch, capsys, content: bytes | None, *, directory: bool = False) -> tuple[int, str]:
    monkeypatch.setattr(validate, "_pytest", lambda *a, **k: pytest.fail("reached pytest with a bad --target-json"))
    p = tmp_path / "target.json"
    if directory:
        p.mkdir()
    elif content is not None:
        p.write_bytes(content)
    rc = cli.main(["--matrix", str(tmp_path / "absent.yaml"), "smoke", "local://", "--target-json", str(p)])
    return rc, capsys.readouterr().err


@pytest.mark.parametrize(("content", "directory", "words"), [
    (None, False, "no such target.json"),
    (b"", False, "not valid JSON at line 1"),
    (b'{"torch": "2.7.1"', False, "not valid JSON"),
    (b"\xff\xfe\x00", False, "not valid JSON (UnicodeDecodeError)"),
    (b"[1, 2]", False, "not a target.json"),
    (b'{"torch": ["2.7.1"]}', False, "torch=['2.7.1'] is not a version or name"),
    (None, True, "cannot read the target.json"),
])
def test_smoke_refuses_a_bad_target_json_in_one_line(tmp_path, monkeypatch, capsys, content, directory, words):
    rc, err = _smoke_target_json(tmp_path, monkeypatch, capsys, content, directory=directory)
    assert rc == 2
    assert err.startswith(f"gpuforge: error: {tmp_path / 'target.json'}: ") and words in err, err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_validate_reads_the_rendered_target_json_and_refuses_a_stale_one(tmp_path, monkeypatch):
    t = load_matrix(paths.project_root() / "matrix.yaml").select(None)[0]
    assert validate.rendered_target_json(t) == paths.dist() / t.id / "target.json"
    root = tmp_path / "root"
    (root / "images" / "context").mkdir(parents=True)
    (root / "validators").mkdir()
    (root / "images" / "dist" / t.id).mkdir(parents=True)
    stale = root / "images" / "dist" / t.id / "target.json"
    stale.write_text(json.dumps({**t.expected().as_dict(), "torch": "2.6.0+cu126"}))
    paths.use_root(root)  # as the CLI names GPUFORGE_ROOT's checkout (tests/conftest.py names none again after)
    with pytest.raises(Exception, match=r"is stale .*run `gpuforge generate`") as e:
        validate.rendered_target_json(t)
    assert e.value.return_code == 2
