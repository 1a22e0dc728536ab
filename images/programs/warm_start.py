"""Warm starts: run by the entrypoint before any mode when the user asks for it.

  GPUFORGE_CACHE_ARTIFACTS=FILE   load torch.compile cache artifacts (torch.compiler.load_cache_artifacts) from FILE
                                  if it exists; after the warm-up, save them there if it does not (a volume file,
                                  so the next container's first compiled call is a cache hit)
  GPUFORGE_WARMUP=module:function run that function (it compiles and runs a few synced iterations) before serving
  GPUFORGE_COMPILE_CACHE=DIR      (set by the entrypoint) Inductor's and Triton's cache dir, on a volume
  GPUFORGE_AOT_PACKAGE=FILE       an AOTInductor package (.pt2) on a volume, with its key beside it (FILE.key.json)
  GPUFORGE_AOT_MODEL=module:function  returns (model, example_inputs): the model the package is made of

  GPUFORGE_AOT_WEIGHTS=FILE[:FILE]  the checkpoint file(s) the model's weights come from: their sha256 stands in
                                  for the weights, so a start can check the key without building the model
  GPUFORGE_WARM_OVERLAP=1|0       a package start with no GPUFORGE_WARMUP: while torch is imported, a thread
                                  retains the GPU's primary CUDA context and hashes the package and its
                                  reference (1, the default); 0 does neither
  GPUFORGE_COMPILE_MODE=MODE      default, or max-autotune-no-cudagraphs: the built-in warm-ups, a start served by
                                  torch.compile and the package's build compile in that mode (a package's key and
                                  an artifacts file's key name it); the entrypoint limits what max-autotune tunes
                                  (TORCHINDUCTOR_MAX_AUTOTUNE_CONV_BACKENDS=ATEN, docs/images.md)

Compile-cache artifacts carry a key beside them (FILE.key.json: torch, CUDA, the GPU model, the compile mode): an
artifacts file made for another GPU model or mode is not loaded, and this start's are saved in its place (Inductor's
caches are per GPU model: another model's entries never hit).

With GPUFORGE_AOT_PACKAGE: a package whose key matches (torch and CUDA versions, GPU name and capability, the
model function and a sha256 of its source file, the weights) and whose bytes match the key's sha256 is loaded
(the C++ AOTIModelPackageLoader) and run three times: no tracing, no compile. Its first output is checked against the
eager output saved when it was built (FILE.ref.pt, on seeded inputs; its sha256 is in the key): a package whose
output is off is stale. Otherwise (none yet, stale, torn) the start is served by torch.compile as before, and the
package is built after the start is ready: the entrypoint runs `warm_start.py --build-only` in the background
while the mode runs (and the container waits for it before it ends); run directly, this program builds it last.
Written atomically, under a lock, for the next start.

Every start records `first_correct_unix`: the wall-clock time its first compiled output was checked against eager
(the built-in warm-up compares it too), so a benchmark can time a start from `docker run` to a correct inference.

The weights, two ways. Declared (no model is built to check the key): GPUFORGE_AOT_WEIGHTS names the files they
are read from, or the model function carries `aot_weights()`, a string that names them (the built-in
ResNet-50 is seeded: torchvision's version and the seed name it). Otherwise fingerprinted: the model is built
and its state dict summed, and the example inputs' shapes and dtypes join the key. A declared start runs its
3 calls on inputs of the shapes and dtypes the package was built for (kept in the key file).
A program loads it the same way: `warm_start.load_package(FILE, model_spec="myapp:make_model")` (declared) or
`warm_start.load_package(FILE, model, example_inputs, "myapp:make_model")` — None when stale.

Prints one JSON line with the timings and Inductor's cache counters. Bad input: a one-line error, exit 64.
Also the perf table's time-to-first-compiled-inference probe (`--probe resnet50`).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib
import json
import os
import platform
import re
import stat
import sys
import tempfile
import time

T_START = time.perf_counter()
SPEC = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$")
AOT_FORMAT = 4  # bump when what the key covers changes: every older package is then rebuilt (4: the eager reference)
# a one-off build: a header PCH only costs time; the .so goes into the package (else every load compiles it)
AOT_BUILD = {"aot_inductor.precompile_headers": False, "aot_inductor.package_cpp_only": False}
AOT_CALLS = 3
DTYPE = re.compile(r"^torch\.[a-z][a-z0-9]*$")
DEVICE = "cuda"  # where a declared start's example inputs are made (the unit tests run on the CPU)
REF_SEED = 0  # the seed of the inputs a package's output is checked on, at build time and at every start


def fail(msg: str, code: int = 64) -> int:
    print(f"gpuforge: error: {msg}", file=sys.stderr)
    return code


COMPILE_MODES = ("default", "max-autotune-no-cudagraphs")  # GPUFORGE_COMPILE_MODE: no CUDA graphs in a package


def compile_mode(env=None) -> str | None:
    """GPUFORGE_COMPILE_MODE: unset -> default; one of COMPILE_MODES; anything else -> None (bad input)."""
    value = (os.environ if env is None else env).get("GPUFORGE_COMPILE_MODE") or "default"
    return value if value in COMPILE_MODES else None


def compile_kwargs() -> dict:
    """torch.compile's arguments for this start's mode ({} for default: torch.compile(model) as before)."""
    mode = compile_mode()
    return {} if mode in (None, "default") else {"mode": mode}


def mode_configs() -> dict:
    """Inductor's settings of this start's mode, for an AOTInductor build (which takes settings, not a mode)."""
    mode = compile_mode()
    if mode in (None, "default"):
        return {}
    from torch._inductor import list_mode_options

    return dict(list_mode_options(mode))


def _checked_warmup(make_model) -> dict:
    """Compile the model in this start's mode, run it 3 times (synced), its first output checked against eager: a
    start that serves wrong answers is not ready."""
    import torch

    model, (x,) = make_model()
    f = torch.compile(model, **compile_kwargs())
    with torch.no_grad():
        want = model(x)
        err = rel_err(f(x), want)
        torch.cuda.synchronize()
        first = time.time()
        for _ in range(2):
            f(x)
            torch.cuda.synchronize()
    limit = warm_start_limit(bf16=x.dtype == torch.bfloat16)
    if not err < limit:
        msg = f"the compiled model's output is off eager by {err:.2e} (>= {limit})"
        raise RuntimeError(msg)
    return {"rel_err": err, "rel_err_limit": limit, "first_correct_unix": first,
            "compile_mode": compile_mode() or "default"}


def resnet50_bs1() -> dict:
    """The built-in warm-up and the perf table's probe: ResNet-50, batch 1, compiled, checked against eager."""
    return _checked_warmup(resnet50_bs1_model)


def resnet50_bs64_bf16() -> dict:
    """The built-in max-autotune warm-up: ResNet-50, batch 64, bf16 (the GEMMs and convolutions max-autotune
    tunes), compiled, checked against eager."""
    return _checked_warmup(resnet50_bs64_bf16_model)


def resnet50_bs1_model():
    """The built-in GPUFORGE_AOT_MODEL: ResNet-50 (fixed seed, so the weights' fingerprint is stable), batch 1."""
    import torch
    import torchvision

    torch.manual_seed(0)
    with torch.device("cuda"):  # initialised on the GPU: the CPU init of 25 M weights costs a second a start
        model = torchvision.models.resnet50().eval()
        x = torch.randn(1, 3, 224, 224)
    return model, (x,)


def resnet50_bs64_bf16_model():
    """ResNet-50 as resnet50_bs1_model, in bf16 (weights and inputs), batch 64."""
    import torch
    import torchvision

    torch.manual_seed(0)
    with torch.device("cuda"):
        model = torchvision.models.resnet50().eval().to(torch.bfloat16)
        x = torch.randn(64, 3, 224, 224, dtype=torch.bfloat16)
    return model, (x,)


def _resnet50_weights() -> str:
    """The built-in model's weights, declared: seeded random init, so torchvision's version and the seed name
    them (torch's version and the GPU are in every key). Read from the package metadata: no torchvision import."""
    from importlib.metadata import version

    return f"torchvision=={version('torchvision')} torchvision.models.resnet50() after torch.manual_seed(0)"


resnet50_bs1_model.aot_weights = _resnet50_weights
resnet50_bs64_bf16_model.aot_weights = lambda: _resnet50_weights() + " in bf16"


# --- the package's key: pure functions over plain facts (unit-tested without torch) ---------------------------

def package_key(facts: dict) -> str:
    """sha256 over the canonical JSON of everything a package depends on (see package_facts)."""
    blob = json.dumps({"format": AOT_FORMAT, **facts}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


def key_path(package: str) -> str:
    return f"{package}.key.json"


def ref_path(package: str) -> str:
    return f"{package}.ref.pt"


def warm_start_limit(bf16: bool = False) -> float:
    """The bar a start's first output is held to against eager: the compat data's warm_start_rel_err (its _bf16
    one for a bf16 output)."""
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    from gpu_smoke import smoke_verdicts  # gpu_smoke puts gpuforge.image (the compat data) on the path

    return float(smoke_verdicts.default_thresholds()["warm_start_rel_err_bf16" if bf16 else "warm_start_rel_err"])


# --- the artifacts file's key: what Inductor's caches are valid for ---------------------------------------------

def artifacts_facts(torch_version: str, cuda: str | None, gpu: str) -> dict:
    """What compile-cache artifacts are good for: Inductor keys its entries by torch, CUDA and the GPU model, and
    the compile mode is in every graph's key; another model's or mode's entries load but never hit."""
    return {"torch": torch_version, "cuda": cuda, "gpu": gpu, "compile_mode": compile_mode() or "default"}


def artifacts_key(artifacts: str) -> dict | None:
    """The facts an artifacts file was saved for (FILE.key.json), or None (none, unreadable: made before keys)."""
    try:
        with open(key_path(artifacts)) as f:
            got = json.load(f)
    except (OSError, ValueError):
        return None
    return got if isinstance(got, dict) else None


def artifacts_stale(saved: dict | None, facts: dict, gpus: list[str] | None) -> str:
    """Why an artifacts file is not for this start ("" when it is, or cannot be told). Before any CUDA call the
    GPU is known by NVML's names (`gpus`, None when NVML is unreadable); after the warm-up, by facts["gpu"]."""
    if saved is None:
        return "it has no key (saved before keys)"
    other = sorted(k for k in ("torch", "cuda", "compile_mode") if saved.get(k) != facts.get(k))
    if gpus is not None and saved.get("gpu") not in gpus:
        other.append("gpu")
    if gpus is None and facts.get("gpu") and saved.get("gpu") != facts["gpu"]:
        other.append("gpu")
    return f"made for other {', '.join(other)} ({', '.join(f'{k} {saved.get(k)}' for k in other)})" if other else ""


def nvml_gpu_names() -> list[str] | None:
    """The GPU models this container sees, from NVML (no CUDA context made); None when NVML cannot say."""
    try:
        import pynvml as nv

        nv.nvmlInit()
        try:
            names = [nv.nvmlDeviceGetName(nv.nvmlDeviceGetHandleByIndex(i)) for i in range(nv.nvmlDeviceGetCount())]
        finally:
            nv.nvmlShutdown()
    except Exception:  # no NVML here: the GPU is checked after the warm-up instead
        return None
    return [n.decode() if isinstance(n, bytes) else str(n) for n in names]


def save_artifacts(artifacts: str, blob: bytes, facts: dict) -> None:
    """The artifacts and their key, each written whole (os.replace), the key last: never a half-written file or a
    key that names other bytes for the next container (mkstemp's 0600 widened: the next one may be another uid)."""
    folder = os.path.dirname(os.path.abspath(artifacts))
    for path, data in ((artifacts, blob), (key_path(artifacts), json.dumps(facts, sort_keys=True).encode())):
        fd, tmp = tempfile.mkstemp(prefix=".artifacts.", suffix=".tmp", dir=folder)
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)


def rel_err(got, want) -> float:
    """|got - want| / |want| over every tensor of two outputs of the same structure, in float64."""
    import torch
    from torch.utils import _pytree as pytree

    g, w = pytree.tree_leaves(got), pytree.tree_leaves(want)
    if len(g) != len(w):
        return float("inf")
    num = sum(float((a.double().cpu() - b.double().cpu()).norm() ** 2) for a, b in zip(g, w, strict=True)
              if isinstance(b, torch.Tensor))
    den = sum(float(b.double().cpu().norm() ** 2) for b in w if isinstance(b, torch.Tensor))
    return (num ** 0.5) / max(den ** 0.5, 1e-30)


def _stat_id(path: str) -> tuple | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


_HASHED: dict = {}  # path -> (stat id, sha256): what the overlap thread hashed while torch was imported


def file_sha256(path: str) -> str:
    """The file's sha256; the overlap thread's digest when the file is still the one it read (same device, inode,
    size and mtime: an os.replace'd package is a new inode, so it is hashed again)."""
    pre = _HASHED.get(path)
    if pre is not None and pre[0] == _stat_id(path):
        return pre[1]
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# --- overlap: what a warm start can do while `import torch` runs (1.6-2.1 s on the H200) -----------------------
# Both release the GIL: the driver's calls through ctypes and hashlib over 1 MiB chunks. GPUFORGE_WARM_OVERLAP=0
# turns it off (tools/warm_bench.py --overlap-ab measures both side by side).

def cuda_primary_context(device: int = 0) -> str:
    """Create (retain) the device's primary CUDA context through the driver, before torch is imported: the CUDA
    runtime torch uses adopts the primary context, so torch's first CUDA call no longer pays its creation.
    "" when retained, else why not (no driver, no GPU: the start goes on as before)."""
    import ctypes

    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        return f"no driver library ({e})"
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    for name, call in (("cuInit", lambda: cuda.cuInit(0)),
                       ("cuDeviceGet", lambda: cuda.cuDeviceGet(ctypes.byref(dev), device)),
                       ("cuDevicePrimaryCtxRetain", lambda: cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev))):
        rc = call()
        if rc != 0:
            return f"{name} returned CUDA error {rc}"
    return ""  # never released: torch uses this context for the life of the process


def overlap_enabled(env=os.environ) -> bool | None:
    """GPUFORGE_WARM_OVERLAP: unset or 1 -> on, 0 -> off, anything else -> None (bad input)."""
    value = env.get("GPUFORGE_WARM_OVERLAP", "1")
    return {"1": True, "0": False}.get(value)


def start_overlap(files: list[str]):
    """A thread that retains the CUDA context and hashes `files` (the package and its reference) while the main
    thread imports torch. Returns join() -> {"overlap_s", "cuda_context"}: call it before the first CUDA use."""
    import threading

    got: dict = {}

    def work() -> None:
        t0 = time.perf_counter()
        why = cuda_primary_context()
        got["cuda_context"] = "retained before import torch" if not why else f"not retained: {why}"
        for path in files:
            before = _stat_id(path)
            if before is None:
                continue
            try:
                h = hashlib.sha256()
                with open(path, "rb") as f:
                    for chunk in iter(lambda f=f: f.read(1 << 20), b""):
                        h.update(chunk)
            except OSError:
                continue
            if _stat_id(path) == before:  # replaced while read: leave it to the check, which hashes it again
                _HASHED[path] = (before, h.hexdigest())
        got["overlap_s"] = round(time.perf_counter() - t0, 3)

    t = threading.Thread(target=work, name="gpuforge-warm-overlap", daemon=True)
    t.start()

    def join() -> dict:
        t.join()
        return dict(got)
    return join


def package_usable(package: str, facts: dict) -> tuple[bool, str]:
    """(True, "") when the package was made for these facts and its bytes are the ones its key file names;
    else (False, why) — a missing, stale, torn or foreign package is rebuilt, never loaded."""
    kp = key_path(package)
    if not os.path.exists(kp):
        return False, "no package yet" if not os.path.exists(package) else f"{kp} is missing"
    try:
        with open(kp) as f:
            side = json.load(f)
        old_facts, old_key, digest = side["facts"], side["key"], side["sha256"]
        if not isinstance(old_facts, dict):
            msg = "facts is not an object"
            raise TypeError(msg)
    except (OSError, ValueError, KeyError, TypeError) as e:
        return False, f"{kp} is unreadable ({type(e).__name__}: {e})"
    if old_key != package_key(facts) or package_key(old_facts) != old_key:
        changed = sorted(k for k in set(facts) | set(old_facts) if facts.get(k) != old_facts.get(k))
        return False, f"stale: made for other {', '.join(changed) or 'key format'}"
    if not os.path.exists(package):
        return False, f"{package} is missing"
    if file_sha256(package) != digest:
        return False, f"{package} is not the file its key names (sha256 differs)"
    ref = ref_path(package)
    if not os.path.exists(ref) or file_sha256(ref) != side.get("ref_sha256"):
        return False, f"{ref} is missing or not the file its key names"
    return True, ""


@contextlib.contextmanager
def locked(package: str, exclusive: bool):
    """An inter-process lock beside the package: writers exclusive, readers shared."""
    import fcntl

    fd = os.open(f"{package}.lock", os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o666)
    with os.fdopen(fd, "a") as f:  # O_NOFOLLOW: a link planted at the lock's name is refused, not written through
        fcntl.flock(f, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def publish_package(package: str, built: str, facts: dict, ref: str) -> None:
    """Move a freshly built package and its eager reference into place with their key file: each written whole
    (os.replace), all under the lock, the key last, so a reader sees an old set, a new set, or a key that names
    other bytes. The key is a checksum, not a signature: whoever may write the volume may run code in the container."""
    digest, ref_digest = file_sha256(built), file_sha256(ref)
    fd, tmp = tempfile.mkstemp(prefix=".key.", suffix=".tmp", dir=os.path.dirname(os.path.abspath(package)))
    os.fchmod(fd, 0o644)  # mkstemp's 0600 would hide the key from the next container's other uid
    with os.fdopen(fd, "w") as f:
        json.dump({"key": package_key(facts), "facts": facts, "sha256": digest, "ref_sha256": ref_digest}, f, indent=1,
                  sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    with locked(package, exclusive=True):
        os.replace(built, package)
        os.replace(ref, ref_path(package))
        os.replace(tmp, key_path(package))


def built_inputs(package: str) -> list:
    """The [[shape, dtype], ...] a package was built for, from its key file's facts ([] when absent or malformed).
    Read under the lock with the key check: the facts, inputs included, are what the key hashes."""
    try:
        with open(key_path(package)) as f:
            got = json.load(f)["facts"]["inputs"]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    ok = isinstance(got, list) and all(isinstance(i, list) and len(i) == 2 and isinstance(i[0], list)
                                       and all(isinstance(n, int) and n >= 0 for n in i[0])
                                       and isinstance(i[1], str) and DTYPE.match(i[1]) for i in got)
    return got if ok else []


# The CPU features a package's host code may be built for (Inductor picks its vector ISA from these): a volume
# shared by an AVX-512 host and an AVX2 host must never hand one's .so to the other (SIGILL, not an exception).
CPU_FLAGS = ("avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni",
             "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8", "asimd", "sve", "vsx")


def cpu_facts(cpuinfo: str = "/proc/cpuinfo") -> dict:
    """The machine and its ISA-relevant CPU flags, from /proc/cpuinfo (no torch, no compiler)."""
    flags: set = set()
    try:
        with open(cpuinfo) as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    flags = set(value.split())
                    break
    except OSError:
        pass
    return {"machine": platform.machine(), "cpu_flags": " ".join(f for f in CPU_FLAGS if f in flags)}


def source_sha256(fn) -> str:
    """sha256 of the file that defines the model function: an edit there makes another package. Code it
    imports is not covered: with declared weights, the declaration must change when such code does."""
    import inspect

    try:
        path = inspect.getsourcefile(fn)
    except TypeError:
        path = None
    return file_sha256(path) if path and os.path.exists(path) else "unknown"


def weights_files_problem(value: str) -> str:
    """Why GPUFORGE_AOT_WEIGHTS is unusable ("" when fine): each entry a regular file (no FIFO, no folder)."""
    paths = value.split(os.pathsep)
    if not all(paths):
        return "an empty entry (separate files with ':')"
    for p in paths:
        try:
            st = os.stat(p)
        except OSError as e:
            return f"{p}: {e.strerror}"
        if not stat.S_ISREG(st.st_mode):
            return f"{p} is not a regular file"
    return ""


def declared_weights(make_model) -> str | None:
    """The weights' name without building the model: GPUFORGE_AOT_WEIGHTS' files by sha256, or the model
    function's own aot_weights(); None when neither is given (the weights are then fingerprinted)."""
    files = os.environ.get("GPUFORGE_AOT_WEIGHTS", "")
    if files:
        return "files " + " ".join(f"{os.path.basename(p)}={file_sha256(p)}" for p in files.split(os.pathsep) if p)
    declare = getattr(make_model, "aot_weights", None)
    return f"declared {declare()}" if callable(declare) else None


# --- with torch ------------------------------------------------------------------------------------------------

def weights_fingerprint(model) -> str:
    """sha256 over the state dict's names, shapes, dtypes and per-tensor float64 sums (one GPU sync)."""
    import torch

    sd = model.state_dict()
    sums = torch.stack([t.detach().double().sum() for t in sd.values()]).cpu().tolist() if sd else []
    meta = [[k, list(t.shape), str(t.dtype), repr(s)] for (k, t), s in zip(sd.items(), sums, strict=True)]
    return hashlib.sha256(json.dumps(meta).encode()).hexdigest()


def input_specs(inputs) -> list:
    return [[list(t.shape), str(t.dtype)] for t in inputs]


def base_facts(model_spec: str, make_model=None) -> dict:
    """What every key covers, none of it needing the model: versions, the GPU, the model function and its file."""
    import torch

    p = torch.cuda.get_device_properties(0)
    mode = compile_mode()  # only a mode other than default is named: default keys stay what they were
    return {"torch": torch.__version__, "cuda": torch.version.cuda, "gpu": p.name, "capability": f"{p.major}.{p.minor}",
            **cpu_facts(), "model": model_spec,
            "source": source_sha256(make_model) if make_model is not None else "unknown",
            **({"compile_mode": mode} if mode not in (None, "default") else {})}


def package_facts(model, inputs, model_spec: str, make_model=None) -> dict:
    """The fingerprinted key: the model is built, its weights summed, its inputs' shapes and dtypes added."""
    return {**base_facts(model_spec, make_model), "inputs": input_specs(inputs), "weights": weights_fingerprint(model)}


def open_package(package: str):
    """A callable runner of the package: the C++ AOTIModelPackageLoader directly, never aoti_load_package. On
    torch 2.7.1 that function's module import alone (torch._inductor.package) costs 0.9 s of a 3 s warm start; on
    torch 2.11 it first probes the CPU's vector ISAs (a g++ build plus a Python start each: 22 s in a fresh
    container on the H200, docs/measurements/gpu-21b.md) only to warn on a mismatch the key's facts already
    cover. The binding's arguments differ across torch: (path, name, single_threaded, runners, device) from 2.8,
    (path, name, single_threaded) in 2.7; aoti_load_package only where neither fits."""
    import torch
    from torch.utils import _pytree as pytree

    binding, loader = _direct_loader(torch, package)
    if loader is None:
        return _labelled(torch._inductor.aoti_load_package(package), "aoti_load_package")
    out_spec = pytree.treespec_loads(loader.get_call_spec()[1])

    def run(*args):  # what torch's AOTICompiledModel does: flatten the tensors, run, rebuild the outputs
        flat = [t for t in pytree.tree_leaves(args) if isinstance(t, torch.Tensor)]
        return pytree.tree_unflatten(loader.run(flat), out_spec)
    run.binding = binding  # the way it was loaded (the CPU validator holds the image to a direct one)
    return run


def _direct_loader(torch, package: str):
    """(binding, AOTIModelPackageLoader) of the first constructor this torch accepts, or ("", None)."""
    make = getattr(torch._C._aoti, "AOTIModelPackageLoader", None)
    if make is None:
        return "", None
    device = torch.cuda.current_device() if torch.cuda.is_available() else -1
    bindings = (
        ("direct (5 arguments)", (package, "model", False, 1, device)),  # torch 2.8 and later
        ("direct (3 arguments)", (package, "model", False)),  # torch 2.7
    )
    for binding, args in bindings:
        try:
            loader = make(*args)
        except TypeError as e:  # pybind11's "incompatible constructor arguments": try the other binding
            if "incompatible" not in str(e):
                raise
            continue
        if hasattr(loader, "run") and hasattr(loader, "get_call_spec"):
            return binding, loader
    return "", None


def _labelled(runner, binding: str):
    """A runner torch made (not ours to add attributes to), with the way it was loaded attached."""
    def run(*args):
        return runner(*args)
    run.binding = binding
    return run


def _runner_if_usable(package: str, facts: dict, stored_inputs: bool = False):
    """(runner or None, why not, seconds the load took, inputs), the check and the load under a shared lock.
    stored_inputs (a declared key): the inputs the package was built for join the facts, read in the same lock."""
    with locked(package, exclusive=False):
        inputs = built_inputs(package) if stored_inputs else []
        if stored_inputs:
            if not inputs:
                return None, "no package yet" if not os.path.exists(key_path(package)) else \
                    f"{key_path(package)} names no usable inputs", 0.0, []
            facts = {**facts, "inputs": inputs}
        ok, why = package_usable(package, facts)
        if not ok:
            return None, why, 0.0, []
        t0 = time.perf_counter()
        try:
            runner = open_package(package)
        except Exception as e:  # a package torch cannot load is stale, never the end of the start
            return None, f"the loader refused it ({type(e).__name__}: {str(e)[-200:]})", 0.0, []
        return runner, "", time.perf_counter() - t0, inputs


def load_package(package: str, model=None, inputs=None, model_spec: str = ""):
    """The runner of a package made for this model here, or None (with why, on stderr). With model and inputs:
    the fingerprinted key; without: the declared one (model_spec's function must declare its weights)."""
    make_model = resolve(model_spec) if model_spec else None
    if model is None:
        declared = declared_weights(make_model) if make_model is not None else None
        if declared is None:
            print(f"gpuforge: AOTInductor package {package}: give the model and inputs, or a model_spec whose "
                  "weights are declared (GPUFORGE_AOT_WEIGHTS or aot_weights())", file=sys.stderr)
            return None
        runner, why, _, _ = _runner_if_usable(package, {**base_facts(model_spec, make_model), "weights": declared},
                                              stored_inputs=True)
    else:
        runner, why, _, _ = _runner_if_usable(package, package_facts(model, inputs, model_spec, make_model))
    if runner is None:
        print(f"gpuforge: AOTInductor package {package}: {why}", file=sys.stderr)
    return runner


def example_inputs(specs: list) -> list:
    """Tensors of the shapes and dtypes a package was built for, on the GPU (for a declared start's calls)."""
    import torch

    torch.manual_seed(REF_SEED)  # the same inputs at build time and at every start: the reference's inputs
    out = []
    for shape, dtype in specs:
        dt = getattr(torch, dtype.removeprefix("torch."), None)
        if not isinstance(dt, torch.dtype):
            msg = f"{dtype!r} is not a torch dtype"
            raise ValueError(msg)
        out.append(torch.randn(shape, dtype=dt, device=DEVICE) if dt.is_floating_point
                   else torch.zeros(shape, dtype=dt, device=DEVICE))
    return out


def build_package(package: str, model, inputs, facts: dict) -> dict:
    import torch

    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    from gpu_smoke import aoti_build_configs, package_contents

    t0 = time.perf_counter()
    work = tempfile.mkdtemp(prefix=".build.", dir=os.path.dirname(os.path.abspath(package)))
    built = os.path.join(work, "package.pt2")
    try:
        with torch.no_grad():
            ep = torch.export.export(model, tuple(inputs))
        configs = {**aoti_build_configs(AOT_BUILD), **mode_configs()}  # max-autotune: its tuned kernels in the package
        torch._inductor.aoti_compile_and_package(ep, package_path=built, inductor_configs=configs)
        contents = package_contents(built)
        ref = os.path.join(work, "ref.pt")
        with torch.no_grad():  # the eager output every start's first call is checked against
            out = model(*example_inputs(input_specs(inputs)))
        torch.save({"output": [t.cpu() for t in pytree_leaves(out)]}, ref)
        publish_package(package, built, facts, ref)
    finally:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    return {"aot_build_s": round(time.perf_counter() - t0, 3), "aot_package_bytes": os.path.getsize(package),
            "aot_package_contents": contents}


def pytree_leaves(out) -> list:
    import torch
    from torch.utils import _pytree as pytree

    return [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]


def resolve(spec: str):
    mod, _, name = spec.partition(":")
    return getattr(importlib.import_module(mod), name)


def _serve(rep: dict, runner, package: str, specs: list, load_s: float) -> str:
    """Run a loaded package AOT_CALLS times (synced) on the reference's seeded inputs, its first output checked
    against the eager one saved at build time, and record the start in rep; "" when served, else why not: a
    package that will not run, or answers wrong, is stale — this start then compiles, and the package is rebuilt."""
    import torch

    t0 = time.perf_counter()
    try:
        inputs = example_inputs(specs)
        want = torch.load(ref_path(package), map_location="cpu", weights_only=True)["output"]
        with torch.no_grad():
            err = rel_err(pytree_leaves(runner(*inputs)), want)
            torch.cuda.synchronize()
            first = time.time()
            for _ in range(AOT_CALLS - 1):
                runner(*inputs)
                torch.cuda.synchronize()
    except Exception as e:
        return f"it failed to run ({type(e).__name__}: {str(e)[-200:]})"
    limit = warm_start_limit(bf16=any(dtype == "torch.bfloat16" for _, dtype in specs))
    if not err < limit:
        return f"its output is off the eager reference by {err:.2e} (>= {limit})"
    rep.update(aot="loaded", aot_binding=getattr(runner, "binding", "unknown"),
               aot_load_s=round(load_s, 3), aot_calls_s=round(time.perf_counter() - t0, 3),
               rel_err=err, rel_err_limit=limit, first_correct_unix=first,
               first_ready_s=round(time.perf_counter() - T_START, 3))
    return ""


def _facts_and_model(make_model, spec: str):
    """(facts, model, inputs) of the package this model needs: declared weights or fingerprinted."""
    model, inputs = make_model()
    declared = declared_weights(make_model)
    if declared is not None:
        return {**base_facts(spec, make_model), "weights": declared, "inputs": input_specs(inputs)}, model, inputs
    return package_facts(model, inputs, spec, make_model), model, inputs


def aot_start(package: str, make_model, spec: str, have_warmup: bool, job: str | None = None) -> dict:
    """Load and run the package when it fits, else serve this start by torch.compile and build it: with `job`
    (the entrypoint's), the build is left to `--build-only` in the background, after the start is ready.
    Declared weights: the key is checked and the package run without building the model at all."""
    import torch

    t0 = time.perf_counter()
    declared = declared_weights(make_model)
    rep: dict = {"aot_key": "declared" if declared is not None else "fingerprint"}
    if declared is not None:
        facts = {**base_facts(spec, make_model), "weights": declared}
        runner, why, load_s, specs = _runner_if_usable(package, facts, stored_inputs=True)
        rep["aot_key_s"] = round(time.perf_counter() - t0 - load_s, 3)
        if runner is not None:
            why = _serve(rep, runner, package, specs, load_s)
            if not why:
                return rep
    t1 = time.perf_counter()
    model, inputs = make_model()
    rep["aot_model_s"] = round(time.perf_counter() - t1, 3)
    if declared is None:
        facts = package_facts(model, inputs, spec, make_model)
        runner, why, load_s, _ = _runner_if_usable(package, facts)
        if runner is not None:
            why = _serve(rep, runner, package, input_specs(inputs), load_s)
            if not why:
                return rep
    else:
        facts["inputs"] = input_specs(inputs)
    t0 = time.perf_counter()
    if not have_warmup:  # this start is served the way it was before packages: torch.compile, checked
        f = torch.compile(model, **compile_kwargs())
        with torch.no_grad():
            want = model(*inputs)
            err = rel_err(f(*inputs), want)
            torch.cuda.synchronize()
            rep.update(rel_err=err, first_correct_unix=time.time())
            for _ in range(AOT_CALLS - 1):
                f(*inputs)
                torch.cuda.synchronize()
        rep["compile_calls_s"] = round(time.perf_counter() - t0, 3)
        rep["first_ready_s"] = round(time.perf_counter() - T_START, 3)
    if job:
        rep["aot"] = f"building in the background ({why})"
        with open(job, "w") as f:
            json.dump({"package": package, "why": why}, f)
        print(f"gpuforge: AOTInductor package {package}: {why}; this start is served by torch.compile, the package "
              "is built in the background while the mode runs (the next start loads it)", file=sys.stderr)
        return rep
    rep["aot"] = f"built ({why})"
    print(f"gpuforge: AOTInductor package {package}: {why}; building it after this start", file=sys.stderr)
    return {**rep, **_build_logged(package, model, inputs, facts)}


def _build_logged(package: str, model, inputs, facts: dict) -> dict:
    try:
        return build_package(package, model, inputs, facts)
    except Exception as e:  # the start is served; a package that cannot be built must not stop the container
        err = f"{type(e).__name__}: {str(e)[-500:]}"
        print(f"gpuforge: warning: could not build AOTInductor package {package}: {err}", file=sys.stderr)
        return {"aot_build_error": err}


def build_only(package: str, make_model, spec: str) -> int:
    """The background build (`--build-only`): one builder per package at a time (a second finds the build lock
    held and leaves it), the model made again here, the package built only if still needed. One line on stderr."""
    import fcntl

    fd = os.open(f"{package}.build.lock", os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o666)
    with os.fdopen(fd, "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"gpuforge: AOTInductor package {package}: another start is building it", file=sys.stderr)
            return 0
        t0 = time.perf_counter()
        facts, model, inputs = _facts_and_model(make_model, spec)
        with locked(package, exclusive=False):
            ok, _ = package_usable(package, facts)
        if ok:
            print(f"gpuforge: AOTInductor package {package}: already built by another start", file=sys.stderr)
            return 0
        rep = _build_logged(package, model, inputs, facts)
    if "aot_build_error" in rep:
        return 1
    print(f"gpuforge: AOTInductor package {package}: built in the background in {time.perf_counter() - t0:.1f} s "
          f"({rep['aot_package_bytes']} bytes); the next start loads it", file=sys.stderr)
    return 0


def _counters() -> dict:
    if "torch._dynamo" not in sys.modules:  # a loaded package never compiled: importing Dynamo costs 5 s
        return {}
    from torch._dynamo.utils import counters

    return {k: v for k, v in counters["inductor"].items() if "cache" in k}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--warmup", default=os.environ.get("GPUFORGE_WARMUP"), help="module:function")
    ap.add_argument("--artifacts", default=os.environ.get("GPUFORGE_CACHE_ARTIFACTS"), help="cache artifacts file")
    ap.add_argument("--aot-package", default=os.environ.get("GPUFORGE_AOT_PACKAGE"), help="AOTInductor package file")
    ap.add_argument("--aot-model", default=os.environ.get("GPUFORGE_AOT_MODEL"), help="module:function")
    ap.add_argument("--build-only", action="store_true", help="build the AOTInductor package if needed (background)")
    args = ap.parse_args(argv)
    job = os.environ.get("GPUFORGE_AOT_BUILD_JOB") or None  # set by the entrypoint: build in the background
    overlap = overlap_enabled()
    if overlap is None:
        return fail(f"GPUFORGE_WARM_OVERLAP={os.environ['GPUFORGE_WARM_OVERLAP']!r}: use 1 (the default) or 0")
    if args.warmup and not SPEC.match(args.warmup):
        return fail(f"GPUFORGE_WARMUP={args.warmup!r}: use module:function (e.g. myapp.serve:warmup)")
    if compile_mode() is None:
        return fail(f"GPUFORGE_COMPILE_MODE={os.environ['GPUFORGE_COMPILE_MODE']!r}: use {' or '.join(COMPILE_MODES)}")
    if args.aot_package:
        if not args.aot_model or not SPEC.match(args.aot_model):
            return fail(f"GPUFORGE_AOT_MODEL={args.aot_model!r}: with GPUFORGE_AOT_PACKAGE, name the model as "
                        "module:function returning (model, example_inputs), e.g. warm_start:resnet50_bs1_model")
        folder = os.path.dirname(os.path.abspath(args.aot_package))
        if os.path.isdir(args.aot_package) or not os.path.isdir(folder) or not os.access(folder, os.W_OK):
            return fail(f"GPUFORGE_AOT_PACKAGE={args.aot_package!r}: give a file path in a writable folder (a volume)")
        problem = weights_files_problem(os.environ["GPUFORGE_AOT_WEIGHTS"]) if os.environ.get("GPUFORGE_AOT_WEIGHTS") else ""
        if problem:
            return fail(f"GPUFORGE_AOT_WEIGHTS: {problem}; name the checkpoint file(s) the weights are read from")
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)  # the built-in warm-ups (warm_start:resnet50_bs1)
    sys.path.insert(0, os.getcwd())
    if args.build_only:
        if not args.aot_package:
            return fail("--build-only needs GPUFORGE_AOT_PACKAGE and GPUFORGE_AOT_MODEL")
        try:
            make_model = resolve(args.aot_model)
        except (ImportError, AttributeError) as e:
            return fail(f"{type(e).__name__}: {e} (GPUFORGE_AOT_MODEL={args.aot_model!r})")
        return build_only(args.aot_package, make_model, args.aot_model)
    rep: dict = {"warmup": args.warmup, "artifacts": args.artifacts, "aot_package": args.aot_package,
                 "compile_mode": compile_mode()}
    # Only for a package start with no user warm-up: the package's key check touches CUDA before any user code
    # runs, so an early context changes nothing for it; a user warm-up that forks workers before its first CUDA
    # call must not find the driver initialised in its parent.
    join = start_overlap([args.aot_package, ref_path(args.aot_package)]) if overlap and args.aot_package \
        and not args.warmup else None
    import torch

    rep["import_s"] = round(time.perf_counter() - T_START, 3)
    if join is not None:
        rep.update(join())
    stale = ""
    if args.artifacts and os.path.exists(args.artifacts):
        saved_for = artifacts_key(args.artifacts)
        if saved_for is not None:  # a file saved before keys is loaded as before, and saved again with its key
            stale = artifacts_stale(saved_for, artifacts_facts(torch.__version__, torch.version.cuda, ""),
                                    nvml_gpu_names())
        if stale:
            rep["artifacts_stale"] = stale
            print(f"gpuforge: compile cache artifacts {args.artifacts}: {stale}: not loaded; this start's are saved "
                  "in its place", file=sys.stderr)
    if args.artifacts and os.path.exists(args.artifacts) and not stale:
        t0 = time.perf_counter()
        # torch 2.7.1: load_cache_artifacts as the first touch of torch.compiler._cache is a circular import
        # (through torch._inductor.runtime.runtime_utils -> torch._dynamo.utils); Dynamo first breaks the cycle
        import torch._dynamo
        try:
            with open(args.artifacts, "rb") as f:
                info = torch.compiler.load_cache_artifacts(f.read())
        except Exception as e:  # a stale or foreign file must not stop the container: warn, compile cold
            print(f"gpuforge: warning: could not load compile cache artifacts {args.artifacts}: {e}", file=sys.stderr)
        else:
            rep["loaded"] = True
            rep["load_s"] = round(time.perf_counter() - t0, 3)
            rep["loaded_info"] = str(info)[:300]
    try:
        fn = resolve(args.warmup) if args.warmup else None
        make_model = resolve(args.aot_model) if args.aot_package else None
    except (ImportError, AttributeError) as e:
        return fail(f"{type(e).__name__}: {e} (GPUFORGE_WARMUP={args.warmup!r}, GPUFORGE_AOT_MODEL={args.aot_model!r})")
    if fn is not None:
        t0 = time.perf_counter()
        try:
            got = fn()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
        except Exception as e:
            return fail(f"warm-up {args.warmup} failed: {type(e).__name__}: {e}", 1)
        if isinstance(got, dict):  # what the warm-up measured (the built-in one: its check against eager)
            rep.update({k: v for k, v in got.items() if isinstance(v, int | float | str)})
        rep["warmup_s"] = round(time.perf_counter() - t0, 3)
        rep["first_ready_s"] = round(time.perf_counter() - T_START, 3)  # process start to warmed up
    if args.aot_package:
        try:
            aot = aot_start(args.aot_package, make_model, args.aot_model, have_warmup=fn is not None, job=job)
        except Exception as e:
            return fail(f"AOTInductor package {args.aot_package}: {type(e).__name__}: {str(e)[-500:]}", 1)
        if fn is not None:
            aot.pop("first_ready_s", None)  # the user's warm-up decided when this start was ready
        rep.update(aot)
    if (fn is not None or args.aot_package) and args.artifacts:
        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else ""
        facts = artifacts_facts(torch.__version__, torch.version.cuda, gpu)
        if not os.path.exists(args.artifacts) or artifacts_stale(artifacts_key(args.artifacts), facts, None):
            saved = torch.compiler.save_cache_artifacts()
            if saved:
                save_artifacts(args.artifacts, saved[0], facts)
                rep["saved_bytes"] = len(saved[0])
    rep["inductor_cache"] = _counters()
    rep["process_s"] = round(time.perf_counter() - T_START, 3)
    print(json.dumps(rep))
    print(f"gpuforge: warm start done ({json.dumps({k: rep[k] for k in rep if k.endswith('_s')})})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
