"""warm_start.py's input checks (GPUFORGE_WARMUP is untrusted env): refused before torch is imported."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gpuforge import paths

PROG = paths.project_root() / "images" / "programs" / "warm_start.py"


@pytest.mark.parametrize("spec", ["os.system('id')", "mod", "mod:", ":fn", "a b:c", "mod:fn;rm", "../x:y", "mod:fn()"])
def test_bad_warmup_spec_is_refused(spec):
    r = subprocess.run([sys.executable, str(PROG), "--warmup", spec], capture_output=True, text=True, timeout=60)
    assert r.returncode == 64 and "use module:function" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("spec", ["myapp.serve:warmup", "warm_start:resnet50_bs1", "a_b.c2:_f"])
def test_good_warmup_specs(spec):
    sys.path.insert(0, str(PROG.parent))
    import warm_start

    assert warm_start.SPEC.match(spec)


# --- the AOTInductor package's key (pure logic: no torch here) ------------------------------------------------

FACTS = {"torch": "2.11.0+cu130", "cuda": "13.0", "gpu": "NVIDIA H200", "capability": "9.0",
         "model": "warm_start:resnet50_bs1_model", "inputs": [[[1, 3, 224, 224], "torch.float32"]], "weights": "ab12"}


@pytest.fixture()
def ws():
    sys.path.insert(0, str(PROG.parent))
    import warm_start

    return warm_start


def test_key_is_stable_and_covers_every_fact(ws):
    assert ws.package_key(FACTS) == ws.package_key(dict(reversed(list(FACTS.items()))))
    for k in FACTS:
        changed = {**FACTS, k: "other"}
        assert ws.package_key(changed) != ws.package_key(FACTS), k


def _built(tmp_path, content=b"PT2 package bytes"):
    built = tmp_path / "build.pt2"
    built.write_bytes(content)
    return str(built)


def test_a_published_package_is_usable_for_the_same_facts_only(ws, tmp_path):
    pkg = str(tmp_path / "model.pt2")
    assert ws.package_usable(pkg, FACTS) == (False, "no package yet")
    ws.publish_package(pkg, _built(tmp_path), FACTS)
    assert ws.package_usable(pkg, FACTS) == (True, "")
    assert not (tmp_path / "build.pt2").exists()  # moved into place, not copied
    ok, why = ws.package_usable(pkg, {**FACTS, "torch": "2.12.0", "capability": "10.0"})
    assert not ok and why == "stale: made for other capability, torch"
    ok, why = ws.package_usable(pkg, {**FACTS, "inputs": [[[8, 3, 224, 224], "torch.float32"]]})
    assert not ok and "inputs" in why


def test_a_package_that_is_not_the_file_its_key_names_is_rebuilt(ws, tmp_path):
    pkg = str(tmp_path / "model.pt2")
    ws.publish_package(pkg, _built(tmp_path), FACTS)
    (tmp_path / "model.pt2").write_bytes(b"another container's package")  # e.g. written by a different GPU
    ok, why = ws.package_usable(pkg, FACTS)
    assert not ok and "sha256 differs" in why
    (tmp_path / "model.pt2").unlink()
    assert ws.package_usable(pkg, FACTS) == (False, f"{pkg} is missing")


@pytest.mark.parametrize("text", ["{not json", "[]", '{"key": "x"}', '{"key": "x", "facts": [], "sha256": "y"}'])
def test_an_unreadable_key_file_means_rebuild(ws, tmp_path, text):
    pkg = str(tmp_path / "model.pt2")
    ws.publish_package(pkg, _built(tmp_path), FACTS)
    (tmp_path / "model.pt2.key.json").write_text(text)
    ok, why = ws.package_usable(pkg, FACTS)
    assert not ok and "unreadable" in why


def test_a_forged_key_with_other_facts_is_stale(ws, tmp_path):
    """A key file whose key does not hash its own facts (edited by hand) is not trusted."""
    pkg = str(tmp_path / "model.pt2")
    ws.publish_package(pkg, _built(tmp_path), {**FACTS, "torch": "2.10.0"})
    side = json.loads((tmp_path / "model.pt2.key.json").read_text())
    side["key"] = ws.package_key(FACTS)  # claims to be for this torch, facts still say 2.10
    (tmp_path / "model.pt2.key.json").write_text(json.dumps(side))
    ok, why = ws.package_usable(pkg, FACTS)
    assert not ok and why == "stale: made for other torch"


def test_a_new_key_format_rebuilds_every_package(ws, tmp_path, monkeypatch):
    pkg = str(tmp_path / "model.pt2")
    ws.publish_package(pkg, _built(tmp_path), FACTS)
    monkeypatch.setattr(ws, "AOT_FORMAT", ws.AOT_FORMAT + 1)
    assert ws.package_usable(pkg, FACTS) == (False, "stale: made for other key format")


def test_concurrent_publishers_leave_a_consistent_pair(ws, tmp_path):
    """Two starts building at once (two GPUs of different kinds sharing a volume): whichever pair lands
    last is whole; the other's facts are refused, never loaded with the wrong bytes."""
    import multiprocessing

    pkg = str(tmp_path / "model.pt2")
    other = {**FACTS, "gpu": "NVIDIA A10", "capability": "8.6"}
    ctx = multiprocessing.get_context("fork")
    procs = []
    for i, facts in enumerate([FACTS, other] * 4):
        built = tmp_path / f"b{i}.pt2"
        built.write_bytes(f"package for {facts['gpu']} #{i}".encode() * 1000)
        procs.append(ctx.Process(target=ws.publish_package, args=(pkg, str(built), facts)))
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    usable = [ws.package_usable(pkg, f)[0] for f in (FACTS, other)]
    assert usable.count(True) == 1  # exactly one kind of GPU gets the package; the other rebuilds


@pytest.mark.parametrize("env,msg", [
    ({"GPUFORGE_AOT_PACKAGE": "/tmp/x.pt2"}, "GPUFORGE_AOT_MODEL"),
    ({"GPUFORGE_AOT_PACKAGE": "/tmp/x.pt2", "GPUFORGE_AOT_MODEL": "os.system('id')"}, "GPUFORGE_AOT_MODEL"),
    ({"GPUFORGE_AOT_PACKAGE": "/nonexistent/dir/x.pt2", "GPUFORGE_AOT_MODEL": "m:f"}, "writable folder"),
    ({"GPUFORGE_AOT_PACKAGE": "/tmp", "GPUFORGE_AOT_MODEL": "m:f"}, "writable folder"),
])
def test_bad_aot_settings_are_refused_before_torch(env, msg):
    import os

    r = subprocess.run([sys.executable, str(PROG)], capture_output=True, text=True, timeout=60,
                       env={**os.environ, **env})
    assert r.returncode == 64 and msg in r.stderr and "Traceback" not in r.stderr


# --- declared weights: a start checks the key without building the model ------------------------------------

def test_declared_weights_come_from_the_named_files_or_the_function(ws, tmp_path, monkeypatch):
    ckpt = tmp_path / "model.safetensors"
    ckpt.write_bytes(b"weights v1")
    monkeypatch.setenv("GPUFORGE_AOT_WEIGHTS", str(ckpt))
    first = ws.declared_weights(lambda: None)
    assert first.startswith("files model.safetensors=")
    ckpt.write_bytes(b"weights v2")  # a new checkpoint under the same name is another package
    assert ws.declared_weights(lambda: None) != first
    monkeypatch.delenv("GPUFORGE_AOT_WEIGHTS")

    def make():
        return None
    assert ws.declared_weights(make) is None  # nothing declared: the weights are fingerprinted
    make.aot_weights = lambda: "seed 0"
    assert ws.declared_weights(make) == "declared seed 0"


def test_the_builtin_model_declares_its_weights_without_torchvision(ws, monkeypatch):
    from importlib import metadata

    monkeypatch.setattr(metadata, "version", lambda name: {"torchvision": "0.22.1"}[name])
    got = ws.declared_weights(ws.resnet50_bs1_model)
    assert got.startswith("declared torchvision==0.22.1 ") and "manual_seed(0)" in got


def test_the_model_functions_source_is_in_the_key(ws, tmp_path, monkeypatch):
    mod = tmp_path / "mymodel.py"
    mod.write_text("def make():\n    return 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib

    m = importlib.import_module("mymodel")
    before = ws.source_sha256(m.make)
    mod.write_text("def make():\n    return 2\n")
    assert ws.source_sha256(m.make) != before and len(before) == 64
    assert ws.source_sha256(len) == "unknown"  # a builtin has no file: the key says so rather than guess


@pytest.mark.parametrize("side,want", [
    ({"inputs": [[[1, 3, 224, 224], "torch.float32"]]}, [[[1, 3, 224, 224], "torch.float32"]]),
    ({}, []),
    ({"inputs": [[[1, -3], "torch.float32"]]}, []),
    ({"inputs": [[[1, 3], "float32; import os"]]}, []),
    ({"inputs": "[[1]]"}, []),
])
def test_built_inputs_are_read_from_the_key_file_or_not_at_all(ws, tmp_path, side, want):
    pkg = str(tmp_path / "model.pt2")
    ws.publish_package(pkg, _built(tmp_path), FACTS, side.get("inputs"))
    if not side:
        assert "inputs" not in json.loads((tmp_path / "model.pt2.key.json").read_text())
    assert ws.built_inputs(pkg) == want
    assert ws.package_usable(pkg, FACTS) == (True, "")  # the inputs beside the key never change what it covers
