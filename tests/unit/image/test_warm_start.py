"""warm_start.py's input checks (GPUFORGE_WARMUP is untrusted env): refused before torch is imported."""

from __future__ import annotations

import hashlib
import json
import os
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


def _ref(tmp_path, name="ref.pt", content=b"eager reference"):
    ref = tmp_path / name
    ref.write_bytes(content)
    return str(ref)


def test_a_published_package_is_usable_for_the_same_facts_only(ws, tmp_path):
    pkg = str(tmp_path / "model.pt2")
    assert ws.package_usable(pkg, FACTS) == (False, "no package yet")
    ws.publish_package(pkg, _built(tmp_path), FACTS, _ref(tmp_path))
    assert ws.package_usable(pkg, FACTS) == (True, "")
    assert not (tmp_path / "build.pt2").exists()  # moved into place, not copied
    ok, why = ws.package_usable(pkg, {**FACTS, "torch": "2.12.0", "capability": "10.0"})
    assert not ok and why == "stale: made for other capability, torch"
    ok, why = ws.package_usable(pkg, {**FACTS, "inputs": [[[8, 3, 224, 224], "torch.float32"]]})
    assert not ok and "inputs" in why


def test_a_package_that_is_not_the_file_its_key_names_is_rebuilt(ws, tmp_path):
    pkg = str(tmp_path / "model.pt2")
    ws.publish_package(pkg, _built(tmp_path), FACTS, _ref(tmp_path))
    (tmp_path / "model.pt2").write_bytes(b"another container's package")  # e.g. written by a different GPU
    ok, why = ws.package_usable(pkg, FACTS)
    assert not ok and "sha256 differs" in why
    (tmp_path / "model.pt2").unlink()
    assert ws.package_usable(pkg, FACTS) == (False, f"{pkg} is missing")


def test_a_package_whose_eager_reference_is_gone_or_swapped_is_rebuilt(ws, tmp_path):
    """The reference its first output is checked against is part of what the key names."""
    pkg = str(tmp_path / "model.pt2")
    ws.publish_package(pkg, _built(tmp_path), FACTS, _ref(tmp_path))
    assert ws.package_usable(pkg, FACTS) == (True, "")
    (tmp_path / "model.pt2.ref.pt").write_bytes(b"a reference that makes any output look right")
    ok, why = ws.package_usable(pkg, FACTS)
    assert not ok and "ref.pt is missing or not the file its key names" in why
    (tmp_path / "model.pt2.ref.pt").unlink()
    assert not ws.package_usable(pkg, FACTS)[0]


@pytest.mark.parametrize("text", ["{not json", "[]", '{"key": "x"}', '{"key": "x", "facts": [], "sha256": "y"}'])
def test_an_unreadable_key_file_means_rebuild(ws, tmp_path, text):
    pkg = str(tmp_path / "model.pt2")
    ws.publish_package(pkg, _built(tmp_path), FACTS, _ref(tmp_path))
    (tmp_path / "model.pt2.key.json").write_text(text)
    ok, why = ws.package_usable(pkg, FACTS)
    assert not ok and "unreadable" in why


def test_a_forged_key_with_other_facts_is_stale(ws, tmp_path):
    """A key file whose key does not hash its own facts (edited by hand) is not trusted."""
    pkg = str(tmp_path / "model.pt2")
    ws.publish_package(pkg, _built(tmp_path), {**FACTS, "torch": "2.10.0"}, _ref(tmp_path))
    side = json.loads((tmp_path / "model.pt2.key.json").read_text())
    side["key"] = ws.package_key(FACTS)  # claims to be for this torch, facts still say 2.10
    (tmp_path / "model.pt2.key.json").write_text(json.dumps(side))
    ok, why = ws.package_usable(pkg, FACTS)
    assert not ok and why == "stale: made for other torch"


def test_a_new_key_format_rebuilds_every_package(ws, tmp_path, monkeypatch):
    pkg = str(tmp_path / "model.pt2")
    ws.publish_package(pkg, _built(tmp_path), FACTS, _ref(tmp_path))
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
        ref = _ref(tmp_path, f"r{i}.pt", f"reference for {facts['gpu']} #{i}".encode())
        procs.append(ctx.Process(target=ws.publish_package, args=(pkg, str(built), facts, ref)))
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


@pytest.mark.parametrize("inputs,want", [
    ([[[1, 3, 224, 224], "torch.float32"]], [[[1, 3, 224, 224], "torch.float32"]]),
    (None, []),
    ([[[1, -3], "torch.float32"]], []),
    ([[[1, 3], "float32; import os"]], []),
    ([[[1, 3], "torch.__class__"]], []),
    ("[[1]]", []),
])
def test_built_inputs_come_from_the_hashed_facts_or_not_at_all(ws, tmp_path, inputs, want):
    pkg = str(tmp_path / "model.pt2")
    facts = {k: v for k, v in FACTS.items() if k != "inputs"} | ({"inputs": inputs} if inputs is not None else {})
    ws.publish_package(pkg, _built(tmp_path), facts, _ref(tmp_path))
    assert ws.built_inputs(pkg) == want


def test_edited_inputs_make_the_key_stale(ws, tmp_path):
    """The inputs a declared start runs are in the facts the key hashes: editing them by hand is refused."""
    pkg = str(tmp_path / "model.pt2")
    ws.publish_package(pkg, _built(tmp_path), FACTS, _ref(tmp_path))
    side = json.loads((tmp_path / "model.pt2.key.json").read_text())
    side["facts"]["inputs"] = [[[1 << 30, 3], "torch.float32"]]
    (tmp_path / "model.pt2.key.json").write_text(json.dumps(side))
    edited = {**FACTS, "inputs": ws.built_inputs(pkg)}
    ok, why = ws.package_usable(pkg, edited)
    assert not ok and why.startswith("stale")


def test_cpu_facts_name_the_isa_flags_only(ws, tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor: 0\nflags\t\t: fpu sse2 avx avx2 fma avx512f avx512bw amx_tile hypervisor\n")
    got = ws.cpu_facts(str(info))
    assert got["cpu_flags"] == "avx avx2 fma avx512f avx512bw amx_tile" and got["machine"]
    info.write_text("flags: fpu sse2 avx avx2 fma\n")  # an AVX2-only host sharing the volume: another package
    assert ws.cpu_facts(str(info))["cpu_flags"] == "avx avx2 fma"
    assert ws.cpu_facts(str(tmp_path / "absent"))["cpu_flags"] == ""


@pytest.mark.parametrize("value,msg", [(":", "empty entry"), ("{d}", "not a regular file"),
                                       ("{d}/missing.bin", "No such file"), ("{d}/fifo", "not a regular file")])
def test_bad_weights_files_are_refused_before_torch(tmp_path, value, msg):
    import os

    os.mkfifo(tmp_path / "fifo")
    env = {**os.environ, "GPUFORGE_AOT_PACKAGE": str(tmp_path / "m.pt2"), "GPUFORGE_AOT_MODEL": "m:f",
           "GPUFORGE_AOT_WEIGHTS": value.format(d=tmp_path)}
    r = subprocess.run([sys.executable, str(PROG)], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 64 and msg in r.stderr and "GPUFORGE_AOT_WEIGHTS" in r.stderr and "Traceback" not in r.stderr


# --- aot_start's branches, with torch's parts stood in for (no torch here) ---------------------------------

class _FakeTorch:
    """Just what aot_start touches: no_grad, cuda.synchronize, and torch.compile (the cold path)."""

    def __init__(self):
        import contextlib
        import types

        self.compiled = 0
        self.no_grad = contextlib.nullcontext
        self.cuda = types.SimpleNamespace(synchronize=lambda: None)

    def compile(self, model):
        self.compiled += 1
        return model

    def load(self, path, map_location=None, weights_only=False):
        assert weights_only and map_location == "cpu"  # a reference on a volume is never unpickled as code
        with open(path, "rb") as f:
            return {"output": f.read()}


@pytest.fixture()
def fake(ws, monkeypatch):
    t = _FakeTorch()
    monkeypatch.setitem(sys.modules, "torch", t)
    monkeypatch.setattr(ws, "base_facts", lambda spec, make_model=None: {"gpu": "X", "model": spec})
    monkeypatch.setattr(ws, "input_specs", lambda inputs: [[[2, 4], "torch.float32"]])
    monkeypatch.setattr(ws, "example_inputs", lambda specs: ["x"])
    monkeypatch.setattr(ws, "pytree_leaves", lambda out: out)
    monkeypatch.setattr(ws, "warm_start_limit", lambda bf16=False: 1e-2)
    t.errors = []  # what rel_err answers next (default 0.0: the package's output is the reference's)
    monkeypatch.setattr(ws, "rel_err", lambda got, want: t.errors.pop(0) if t.errors else 0.0)
    built = []

    def build(package, model, inputs, facts):
        pathlib_built = _built_dir(package)
        ref = os.path.join(os.path.dirname(package), "fresh.ref")
        with open(ref, "wb") as f:
            f.write(b"eager output")
        ws.publish_package(package, pathlib_built, facts, ref)
        built.append(facts)
        return {"aot_build_s": 0.0, "aot_package_bytes": 13}
    monkeypatch.setattr(ws, "build_package", build)
    t.built = built
    return t


def _built_dir(package):
    path = os.path.join(os.path.dirname(package), "fresh.pt2")
    with open(path, "wb") as f:
        f.write(b"package bytes")
    return path


def _make():
    _make.calls += 1
    return (lambda x: x), ("x",)


def test_a_declared_start_loads_without_building_the_model(ws, fake, tmp_path, monkeypatch):
    _make.calls = 0
    _make.aot_weights = lambda: "v1"
    pkg = str(tmp_path / "m.pt2")
    first = ws.aot_start(pkg, _make, "mod:make", have_warmup=False)
    assert first["aot"] == "built (no package yet)" and fake.compiled == 1 and _make.calls == 1
    assert fake.built[0]["inputs"] == [[[2, 4], "torch.float32"]]  # what the next start will run
    runs = []
    monkeypatch.setattr(ws, "open_package", lambda p: lambda *a: runs.append(a))
    second = ws.aot_start(pkg, _make, "mod:make", have_warmup=False)
    assert second["aot"] == "loaded" and _make.calls == 1 and len(runs) == ws.AOT_CALLS  # no model built


def test_a_package_that_fails_to_load_or_run_is_rebuilt_not_fatal(ws, fake, tmp_path, monkeypatch):
    _make.calls = 0
    _make.aot_weights = lambda: "v1"
    pkg = str(tmp_path / "m.pt2")
    ws.aot_start(pkg, _make, "mod:make", have_warmup=False)

    def broken(p):
        msg = "bad package"
        raise RuntimeError(msg)
    monkeypatch.setattr(ws, "open_package", broken)
    got = ws.aot_start(pkg, _make, "mod:make", have_warmup=False)
    assert got["aot"].startswith("built (the loader refused it (RuntimeError: bad package") and fake.compiled == 2

    def crashes_on_call(p):
        def run(*a):
            msg = "CUDA error: an illegal memory access"
            raise RuntimeError(msg)
        return run
    monkeypatch.setattr(ws, "open_package", crashes_on_call)
    got = ws.aot_start(pkg, _make, "mod:make", have_warmup=False)
    assert got["aot"].startswith("built (it failed to run (RuntimeError") and fake.compiled == 3


def test_changed_declared_weights_rebuild(ws, fake, tmp_path, monkeypatch):
    _make.calls = 0
    _make.aot_weights = lambda: "v1"
    pkg = str(tmp_path / "m.pt2")
    ws.aot_start(pkg, _make, "mod:make", have_warmup=False)
    monkeypatch.setattr(ws, "open_package", lambda p: lambda *a: None)
    _make.aot_weights = lambda: "v2"
    got = ws.aot_start(pkg, _make, "mod:make", have_warmup=False)
    assert got["aot"] == "built (stale: made for other weights)"


def test_the_key_file_is_readable_by_the_next_containers_user(ws, tmp_path):
    pkg = str(tmp_path / "model.pt2")
    ws.publish_package(pkg, _built(tmp_path), FACTS, _ref(tmp_path))
    assert (tmp_path / "model.pt2.key.json").stat().st_mode & 0o777 == 0o644
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".key.")]  # no temp left behind


def test_a_package_whose_output_is_off_eager_is_stale_and_rebuilt(ws, fake, tmp_path, monkeypatch):
    _make.calls = 0
    _make.aot_weights = lambda: "v1"
    pkg = str(tmp_path / "m.pt2")
    ws.aot_start(pkg, _make, "mod:make", have_warmup=False)
    monkeypatch.setattr(ws, "open_package", lambda p: lambda *a: "wrong answer")
    fake.errors = [0.9]  # the loaded package's first output, against the reference
    got = ws.aot_start(pkg, _make, "mod:make", have_warmup=False)
    assert got["aot"] == "built (its output is off the eager reference by 9.00e-01 (>= 0.01))" and fake.compiled == 2
    got = ws.aot_start(pkg, _make, "mod:make", have_warmup=False)  # rebuilt: the next start loads and checks it
    assert got["aot"] == "loaded" and got["rel_err"] == 0.0 and got["first_correct_unix"] > 0


def test_with_the_entrypoints_job_file_the_build_is_left_to_the_background(ws, fake, tmp_path, monkeypatch):
    _make.calls = 0
    _make.aot_weights = lambda: "v1"
    pkg, job = str(tmp_path / "m.pt2"), str(tmp_path / "job.json")
    got = ws.aot_start(pkg, _make, "mod:make", have_warmup=False, job=job)
    assert got["aot"] == "building in the background (no package yet)" and fake.built == []  # served, not built
    assert got["first_ready_s"] > 0 and json.loads(open(job).read()) == {"package": pkg, "why": "no package yet"}
    assert ws.build_only(pkg, _make, "mod:make") == 0 and len(fake.built) == 1  # what the entrypoint runs next
    assert ws.build_only(pkg, _make, "mod:make") == 0 and len(fake.built) == 1  # already built: not again
    monkeypatch.setattr(ws, "open_package", lambda p: lambda *a: "output")
    assert ws.aot_start(pkg, _make, "mod:make", have_warmup=False, job=job)["aot"] == "loaded"


# --- the overlap thread (GPUFORGE_WARM_OVERLAP): hashes ahead of the key check, never a stale digest ---------------

def test_overlap_hash_is_used_only_for_the_file_it_read(ws, tmp_path, monkeypatch):
    monkeypatch.setattr(ws, "_HASHED", {})
    monkeypatch.setattr(ws, "cuda_primary_context", lambda device=0: "no GPU here")
    pkg = tmp_path / "m.pt2"
    pkg.write_bytes(b"first package")
    got = ws.start_overlap([str(pkg), str(tmp_path / "absent.ref.pt")])()
    assert got["cuda_context"] == "not retained: no GPU here" and got["overlap_s"] >= 0
    assert set(ws._HASHED) == {str(pkg)}  # the absent file is left to the check
    assert ws.file_sha256(str(pkg)) == hashlib.sha256(b"first package").hexdigest()
    # a package replaced after the thread read it (publish_package's os.replace: a new inode) is hashed again
    new = tmp_path / "new.pt2"
    new.write_bytes(b"second package!")
    os.replace(new, pkg)
    assert ws.file_sha256(str(pkg)) == hashlib.sha256(b"second package!").hexdigest()


def test_overlap_digest_planted_for_other_bytes_is_not_trusted(ws, tmp_path, monkeypatch):
    pkg = tmp_path / "m.pt2"
    pkg.write_bytes(b"bytes")
    monkeypatch.setattr(ws, "_HASHED", {str(pkg): ((0, 0, 5, 0), "0" * 64)})  # another file's stat
    assert ws.file_sha256(str(pkg)) == hashlib.sha256(b"bytes").hexdigest()


def test_cuda_context_without_a_driver_says_why(ws, monkeypatch):
    import ctypes

    def no_lib(name, *a, **k):
        msg = f"{name}: cannot open shared object file"
        raise OSError(msg)
    monkeypatch.setattr(ctypes, "CDLL", no_lib)
    assert ws.cuda_primary_context().startswith("no driver library (libcuda.so.1")


@pytest.mark.parametrize(("value", "want"), [(None, True), ("1", True), ("0", False), ("yes", None), ("", None)])
def test_overlap_setting_grammar(ws, value, want):
    env = {} if value is None else {"GPUFORGE_WARM_OVERLAP": value}
    assert ws.overlap_enabled(env) is want


def test_bad_overlap_setting_is_one_line_exit_64():
    r = subprocess.run([sys.executable, str(PROG)], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "GPUFORGE_WARM_OVERLAP": "fast"})
    assert r.returncode == 64 and "GPUFORGE_WARM_OVERLAP='fast': use 1 (the default) or 0" in r.stderr
    assert "Traceback" not in r.stderr


# --- max-autotune through the warm start: GPUFORGE_COMPILE_MODE, and the artifacts file's key ----------------------

@pytest.mark.parametrize(("value", "want", "kwargs"), [
    (None, "default", {}), ("", "default", {}), ("default", "default", {}),
    ("max-autotune-no-cudagraphs", "max-autotune-no-cudagraphs", {"mode": "max-autotune-no-cudagraphs"}),
    ("max-autotune", None, {}), ("reduce-overhead", None, {}),  # CUDA graphs: nothing a package or a cache carries
])
def test_compile_mode_grammar(ws, monkeypatch, value, want, kwargs):
    env = {} if value is None else {"GPUFORGE_COMPILE_MODE": value}
    assert ws.compile_mode(env) == want
    monkeypatch.setattr(ws.os, "environ", env)
    assert ws.compile_kwargs() == kwargs  # default: torch.compile(model) exactly as before


def test_a_bad_compile_mode_is_one_line_exit_64_before_torch():
    r = subprocess.run([sys.executable, str(PROG)], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "GPUFORGE_COMPILE_MODE": "max-autotune"})
    assert r.returncode == 64 and "GPUFORGE_COMPILE_MODE='max-autotune': use default or max-autotune-no-cudagraphs" \
        in r.stderr and "Traceback" not in r.stderr


H100 = "NVIDIA H100 80GB HBM3"


def test_artifacts_for_another_gpu_model_or_mode_are_stale(ws, monkeypatch):
    """Autotune results are per GPU model: one model's artifacts on a shared volume never serve another's start."""
    monkeypatch.setattr(ws.os, "environ", {"GPUFORGE_COMPILE_MODE": "max-autotune-no-cudagraphs"})
    saved = ws.artifacts_facts("2.7.1+cu126", "12.6", H100)
    assert saved["compile_mode"] == "max-autotune-no-cudagraphs"
    here = {**saved, "gpu": ""}  # before the first CUDA call the GPU is known by NVML's names only
    assert ws.artifacts_stale(saved, here, [H100]) == ""
    assert ws.artifacts_stale(saved, here, None) == ""  # NVML unreadable: told after the warm-up instead
    assert ws.artifacts_stale(saved, here, ["NVIDIA H200"]) == f"made for other gpu (gpu {H100})"
    assert ws.artifacts_stale(saved, {**saved, "gpu": "NVIDIA H200"}, None) == f"made for other gpu (gpu {H100})"
    assert ws.artifacts_stale(saved, {**here, "compile_mode": "default"}, [H100]) == \
        "made for other compile_mode (compile_mode max-autotune-no-cudagraphs)"
    assert ws.artifacts_stale(None, here, [H100]) == "it has no key (saved before keys)"


def test_artifacts_are_saved_whole_with_their_key_for_the_next_containers_user(ws, tmp_path):
    path = str(tmp_path / "artifacts.bin")
    facts = {"torch": "2.7.1", "cuda": "12.6", "gpu": H100, "compile_mode": "default"}
    ws.save_artifacts(path, b"mega-cache", facts)
    assert (tmp_path / "artifacts.bin").read_bytes() == b"mega-cache" and ws.artifacts_key(path) == facts
    assert all(os.stat(p).st_mode & 0o777 == 0o644 for p in (path, ws.key_path(path)))
    assert sorted(os.listdir(tmp_path)) == ["artifacts.bin", "artifacts.bin.key.json"]  # no temporary left
    (tmp_path / "artifacts.bin.key.json").write_text("{not json")
    assert ws.artifacts_key(path) is None


def test_the_bf16_model_declares_its_weights_apart_from_the_fp32_one(ws, monkeypatch):
    import importlib.metadata

    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.22.1")
    assert ws.resnet50_bs64_bf16_model.aot_weights() == ws.resnet50_bs1_model.aot_weights() + " in bf16"
