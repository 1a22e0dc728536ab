"""gpuforge GPU smoke suite: one program, one JSON report (validators/test_gpu_smoke.py asserts on it).

Baked into every image (`docker run --gpus all --shm-size 2g IMAGE selftest`) and run on GPU runners
through testinfra's local:// backend. Each check records its figures and `ok`; a check that raises
is recorded with its error, so one broken part never hides the others.

  python gpu_smoke.py [--out FILE] [--only a,b] [--multi-gpu] [--thresholds JSON] [--serial] [--isolate a,b]
  python gpu_smoke.py --level r1|r2 [--strict] [--gpus N] [--bars JSON] [--cuda X.Y] [--out FILE]

--level is the node's readiness (gpuforge.image.readiness), run as a probe whose exit code always agrees with its
verdict: the measuring work in a child process of this program, the verdict printed here, last, and only when the
child exited cleanly with the code its report names; a child that crashed, even after its verdict, is exit 5
(gpuforge.image.supervise).

Schedule (the whole suite in well under a minute on one GPU): the compile-heavy checks named by --isolate run
each in a fresh process of their own (their own empty Inductor cache), concurrently with the rest, which run
here one by one. A check whose figures are timings (fusion's bandwidth, the compile cache's cold/warm
compile) does its set-up in that first phase, then `yield QUIET`; its timed part resumes only once every
other check and process has finished, one at a time, so nothing concurrent perturbs its bar. --serial runs
everything here, in order (the isolated children run so). Seconds are printed per check.

The bars (error limits, ratios, speedups) come from the caller: the validator passes the host toolkit's
values with --thresholds, so an image cannot lower its own bar; a bare `selftest` uses the compat data's.
Each check's `ok` is decided by gpuforge.image.smoke_verdicts, the functions the validator re-applies.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

# gpuforge.image sits beside the programs: /opt/gpuforge/lib in an image, the checkout's root on a GPU host.
_HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(p) for p in (_HERE.parent / "lib", _HERE.parent.parent) if (p / "gpuforge" / "image").is_dir()]
from gpuforge.image import readiness, smoke_verdicts, supervise  # noqa: E402 - after the path above
from gpuforge.image.expected import Expected, ExpectedError  # noqa: E402

TARGET_JSON = "/opt/gpuforge/target.json"  # what the image was built to contain (rendering writes it)

# NVLink multicast stays off on shared machines (see the multi-GPU part); CUDA numbers GPUs as NVML does (PCI bus
# order), so readiness's "GPU 1" is one board in r1 and r2; set before torch loads.
for _k, _v in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1"),
               ("CUDA_DEVICE_ORDER", "PCI_BUS_ID")):
    os.environ.setdefault(_k, _v)

MIN_SHM = 1 << 30
TH: dict = {}  # the bars of this run (main): --thresholds, else the compat data's


def _time_cuda(fn, iters: int = 20, warmup: int = 3, inner: int = 10) -> float:
    """Median milliseconds per fn() call over `iters` trials of `inner` back-to-back calls (speed.timed_trials)."""
    import speed  # beside this program

    return statistics.median(speed.timed_trials(fn, trials=iters, inner=inner, warm_s=0, warm_calls=warmup))


def count_kernels(fn) -> int:
    """CUDA kernels launched by one call of fn(), counted with torch.profiler."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
               and not e.name.startswith(("Memcpy", "Memset")))


def _rel_err(a, b) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def _triton_version() -> str | None:
    try:
        import triton
    except ImportError:
        return None
    return triton.__version__


def check_device() -> dict:
    import torch

    if not torch.cuda.is_available():
        return {"ok": False, "error": "torch.cuda.is_available() is False (no GPU passed in, or driver too old)"}
    p = torch.cuda.get_device_properties(0)
    return {"ok": True, "name": p.name, "capability": f"{p.major}.{p.minor}", "memory_gib": round(p.total_memory / 2**30, 1),
            "count": torch.cuda.device_count(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(), "arch_list": torch.cuda.get_arch_list(), "triton": _triton_version(),
            "names": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
            "env": {k: os.environ.get(k) for k in ("NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")}}


def check_matmul() -> dict:
    import torch

    torch.manual_seed(0)
    n = 2048
    a, b = torch.randn(n, n, device="cuda"), torch.randn(n, n, device="cuda")
    ref = (a.double() @ b.double())
    out = {}
    limits = TH["matmul_rel_err"]
    old = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        out["fp32_rel_err"] = _rel_err(a @ b, ref)
        torch.backends.cuda.matmul.allow_tf32 = True
        out["tf32_rel_err"] = _rel_err(a @ b, ref)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old
    out["bf16_rel_err"] = _rel_err(a.bfloat16() @ b.bfloat16(), ref)
    out["limits"] = limits
    # TF32 keeps 10 mantissa bits: if it really ran, its error is orders of magnitude above strict fp32's.
    out["tf32_err_ratio"] = out["tf32_rel_err"] / max(out["fp32_rel_err"], 1e-30)
    return out


def check_cudnn_conv() -> dict:
    import torch

    torch.manual_seed(0)
    torch.backends.cudnn.allow_tf32 = False
    x = torch.randn(8, 16, 32, 32, device="cuda", requires_grad=True)
    conv = torch.nn.Conv2d(16, 32, 3, padding=1).cuda()
    y = conv(x)
    y.square().mean().backward()
    xc = x.detach().cpu().double().requires_grad_()
    convc = torch.nn.Conv2d(16, 32, 3, padding=1).double()
    convc.load_state_dict({k: v.detach().cpu().double() for k, v in conv.state_dict().items()})
    yc = convc(xc)
    yc.square().mean().backward()
    fwd, bwd = _rel_err(y.detach().cpu(), yc.detach()), _rel_err(x.grad.cpu(), xc.grad)
    # bf16 convolution (cuDNN's bf16 kernels), forward, against the same fp64 reference
    with torch.no_grad():
        yb = torch.nn.functional.conv2d(x.detach().bfloat16(), conv.weight.bfloat16(), conv.bias.bfloat16(), padding=1)
    bf16 = _rel_err(yb.float().cpu(), yc.detach())
    lim = TH["conv_rel_err"]
    return {"ok": torch.backends.cudnn.is_available(), "forward_rel_err": fwd, "backward_rel_err": bwd,
            "bf16_forward_rel_err": bf16, "limits": lim,
            "cudnn_version": torch.backends.cudnn.version()}


def check_triton_kernel() -> dict:
    import torch
    import triton
    from smoke_kernels import BLOCK, axpy  # its own module: see there why the kernel cannot live in this one

    n = 1_000_003
    x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    out = torch.empty_like(x)
    t0 = time.perf_counter()
    axpy[(triton.cdiv(n, BLOCK),)](x, y, out, 2.0, n, BLOCK=BLOCK)
    torch.cuda.synchronize()
    return {"ok": bool(torch.allclose(out, 2.0 * x + y)), "first_launch_s": round(time.perf_counter() - t0, 3),
            "max_abs_err": float((out - (2.0 * x + y)).abs().max()), "triton": triton.__version__}


def fused(x):
    import torch

    return torch.relu(x + 1) * 0.5


def check_fusion():
    """relu(x + 1) * 0.5: eager 3 kernels, compiled exactly 1, equal results, near copy bandwidth."""
    import torch

    n = 64 * 2**20
    x = torch.randn(n, device="cuda")
    t0 = time.perf_counter()
    cf = torch.compile(fused)
    got = cf(x)
    torch.cuda.synchronize()
    compile_s = time.perf_counter() - t0
    eager_k, compiled_k = count_kernels(lambda: fused(x)), count_kernels(lambda: cf(x))
    yield QUIET  # the bandwidth bar: timed only on an otherwise idle GPU
    y = torch.empty_like(x)
    copy_ms = _time_cuda(lambda: y.copy_(x), iters=30)
    eager_ms = _time_cuda(lambda: fused(x), iters=30)
    comp_ms = _time_cuda(lambda: cf(x), iters=30)
    bytes_moved = 2 * n * 4  # read x, write the result
    copy_gbs, comp_gbs = bytes_moved / copy_ms / 1e6, bytes_moved / comp_ms / 1e6
    ratio = comp_gbs / copy_gbs
    return {"eager_kernels": eager_k, "compiled_kernels": compiled_k, "equal": bool(torch.equal(got, fused(x))),
            "eager_ms": round(eager_ms, 4), "compiled_ms": round(comp_ms, 4), "copy_ms": round(copy_ms, 4),
            "compiled_gbs": round(comp_gbs, 1), "copy_gbs": round(copy_gbs, 1), "ratio_to_copy": round(ratio, 3),
            "min_ratio": TH["fusion_min_ratio"], "compile_s": round(compile_s, 2)}


def _mm_bias_gelu(a, w, b):
    import torch

    return torch.nn.functional.gelu(a @ w + b)


COMPILE_MODES = smoke_verdicts.COMPILE_MODES
COMPILE_MODE_SIZE = 64  # M = N = K of the GEMM + bias + GELU each mode compiles
# Set by --compile-mode (this process compiles that mode only) or --compile-modes-apart (each mode in a child
# process of its own, all at once: max-autotune's GEMM tuning is most of the check, and reduce-overhead no longer
# waits behind it). A plain or --serial run compiles them here, one after another.
_MODES: dict = {"only": None, "apart": False}


def _compile_one_mode(mode: str, a, w, b, ref) -> dict:
    import torch

    torch._dynamo.reset()
    t0 = time.perf_counter()
    f = torch.compile(_mm_bias_gelu, mode=mode)
    for _ in range(3):  # reduce-overhead records its CUDA graph on a later call
        got = f(a, w, b).clone()
    torch.cuda.synchronize()
    err = _rel_err(got, ref)
    return {"rel_err": err, "compile_s": round(time.perf_counter() - t0, 2), "ok": err < smoke_verdicts.COMPILE_MODE_REL_ERR}


def _start_child(args: list[str], env: dict):
    """This program in a fresh process. Output goes to files, not pipes: a chatty child (autotune tables) never blocks
    on a full pipe while another is waited on. Returns finish(timeout) -> (exit code, stdout, stderr); a child still
    running at its timeout is killed, never left on the GPU past its parent."""
    out, err = tempfile.TemporaryFile(mode="w+"), tempfile.TemporaryFile(mode="w+")
    p = subprocess.Popen([sys.executable, os.path.abspath(__file__), *args], env=env, stdout=out, stderr=err, text=True)

    def finish(timeout: float) -> tuple[int, str, str]:
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        out.seek(0)
        err.seek(0)
        text, errs = out.read(), err.read()
        out.close()
        err.close()
        return p.returncode, text, errs
    return finish


def _start_modes(modes, thresholds: dict):
    """Each mode in a fresh process of this program (--compile-mode M, its own empty Inductor cache), all at once.
    Returns finish(timeout) -> {mode: result}: the processes share that one deadline; one still running is killed."""
    started = {mode: _start_child(["--serial", "--only", "compile_modes", "--compile-mode", mode, "--thresholds",
                                   json.dumps(thresholds)],
                                  {**os.environ, "TORCHINDUCTOR_CACHE_DIR": tempfile.mkdtemp(prefix="gpuforge-smoke-mode-")})
               for mode in modes}

    def finish(timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        got: dict = {}
        for mode, done in started.items():
            rc, text, errs = done(max(0.1, deadline - time.monotonic()))
            try:
                got[mode] = json.loads(text.strip().splitlines()[-1])["checks"]["compile_modes"][mode]
            except (IndexError, KeyError, TypeError, json.JSONDecodeError):
                got[mode] = {"ok": False, "error": f"mode process exit {rc}: {(errs + text)[-2000:]}"}
        got["ok"] = all(v.get("ok") for v in got.values() if isinstance(v, dict))
        return got
    return finish


def _compile_modes_apart(modes, timeout: float = 1500) -> dict:
    """--compile-modes-apart: the modes' processes started from this one, their results merged."""
    return _start_modes(modes, TH)(timeout)


def check_compile_modes() -> dict:
    modes = (_MODES["only"],) if _MODES["only"] else COMPILE_MODES
    if _MODES["apart"] and len(modes) > 1:
        out = _compile_modes_apart(modes)
    else:
        import torch

        torch.manual_seed(0)
        # A small GEMM: max-autotune clips its candidate tile configs to the problem and drops the duplicates, so it
        # tunes a handful, not the ~20 of a 512x1024x1024 one (31.7 s of tuning there, the smoke's longest path).
        n = COMPILE_MODE_SIZE
        a, w, b = torch.randn(n, n, device="cuda"), torch.randn(n, n, device="cuda"), torch.randn(n, device="cuda")
        torch.backends.cuda.matmul.allow_tf32 = False
        ref = _mm_bias_gelu(a, w, b)
        out = {mode: _compile_one_mode(mode, a, w, b, ref) for mode in modes}
    out["ok"] = all(v.get("ok") for v in out.values() if isinstance(v, dict))
    return out


def check_amp_training() -> dict:
    """One bf16-autocast training step of a small ResNet: finite loss and gradients, weights move."""
    import torch
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 3, 64, 64, device="cuda"), torch.randint(0, 10, (16,), device="cuda")
    before = model.fc.weight.detach().clone()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    finite = all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    opt.step()
    moved = not torch.equal(before, model.fc.weight)
    return {"ok": bool(torch.isfinite(loss)) and bool(finite) and moved, "loss": float(loss), "grads_finite": bool(finite)}


# One fresh process of the compile-cache check. A first, untimed compile pays for the imports, the compile
# workers and Triton's start-up, which otherwise dominate and hide whether the cache works; the timed one is
# a block with several distinct kernels (norm, softmax, matmul epilogue, reductions). Inductor's own counters
# say whether the FX graph cache was hit.
_COMPILE_CHILD = """
import json, time, torch
from torch._dynamo.utils import counters
import sys
torch.compile(lambda t: t * 3 - 1)(torch.randn(64, device="cuda")); torch.cuda.synchronize()
sys.stdin.readline()  # the parent says when: the timed compile runs on an otherwise idle machine
def block(x, w, b):
    h = torch.nn.functional.layer_norm(x, (x.shape[-1],))
    a = torch.softmax(h @ h.transpose(-1, -2) / 32.0, dim=-1) @ h
    y = torch.nn.functional.gelu(a @ w + b)
    z = torch.nn.functional.silu(y).cumsum(dim=-1)
    return (z - z.mean(dim=-1, keepdim=True)) / (z.std(dim=-1, keepdim=True) + 1e-5) + torch.tanh(x).amax(dim=0)
x, w, b = torch.randn(256, 1024, device="cuda"), torch.randn(1024, 1024, device="cuda"), torch.randn(1024, device="cuda")
before = dict(counters["inductor"])
t0 = time.perf_counter(); torch.compile(block)(x, w, b); torch.cuda.synchronize(); s = time.perf_counter() - t0
delta = {k: v - before.get(k, 0) for k, v in counters["inductor"].items() if "cache" in k and v - before.get(k, 0)}
print(json.dumps({"s": s, "inductor": delta, "aot": {k: v for k, v in counters["aot_autograd"].items() if "cache" in k}}))
"""


def check_compile_cache():
    """Two fresh processes sharing a fresh TORCHINDUCTOR_CACHE_DIR: the warm one must hit the FX graph cache and
    compile the block at least `compile_cache_min_speedup` times faster than the cold one.

    Both start at once and pay their start-up (imports, CUDA, compile workers) concurrently with other checks;
    each then waits on stdin. In the quiet phase the cold one compiles the block into the empty cache, and only
    after it has exited does the warm one compile it."""
    with tempfile.TemporaryDirectory(prefix="gpuforge-cache-") as cache:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
        env.pop("TRITON_CACHE_DIR", None)
        procs = [subprocess.Popen([sys.executable, "-c", _COMPILE_CHILD], env=env, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
        try:
            yield QUIET
            runs = []
            for p in procs:
                out, err = p.communicate("go\n", timeout=600)
                if p.returncode != 0:
                    return {"ok": False, "error": err[-2000:]}
                runs.append(json.loads(out.strip().splitlines()[-1]))
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
    cold, warm = runs
    speedup = cold["s"] / max(warm["s"], 1e-9)
    hits, misses = warm["inductor"].get("fxgraph_cache_hit", 0), warm["inductor"].get("fxgraph_cache_miss", 0)
    return {"cold_s": round(cold["s"], 3), "warm_s": round(warm["s"], 3), "speedup": round(speedup, 2),
            "min_speedup": TH["compile_cache_min_speedup"], "cold_counters": cold["inductor"],
            "warm_counters": warm["inductor"], "warm_fxgraph_cache_hit": hits, "warm_fxgraph_cache_miss": misses,
            "warm_aot_counters": warm["aot"]}


def check_sdpa() -> dict:
    """Scaled-dot-product attention through each fused backend (bf16) vs the math backend in fp32."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 8, 512, 64, device="cuda") for _ in range(3))
    with sdpa_kernel(SDPBackend.MATH):
        ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    out: dict = {"backends": {}}
    names = ["FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION"]
    for name in names:
        be = getattr(SDPBackend, name, None)
        if be is None:
            out["backends"][name] = {"ran": False, "why": "not in this torch"}
            continue
        try:
            with sdpa_kernel(be):
                got = torch.nn.functional.scaled_dot_product_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), is_causal=True)
            torch.cuda.synchronize()
            err = _rel_err(got.float(), ref)
            out["backends"][name] = {"ran": True, "rel_err": err}
        except RuntimeError as e:
            out["backends"][name] = {"ran": False, "why": str(e).splitlines()[0][:300]}
    p = torch.cuda.get_device_properties(0)
    # flash and memory-efficient attention ship for every GPU from sm_80 on; cuDNN's is optional
    required = ["FLASH_ATTENTION", "EFFICIENT_ATTENTION"] if p.major >= 8 else ["EFFICIENT_ATTENTION"]
    out["required"] = required
    out["limit"] = TH["sdpa_rel_err"]
    return out


def check_cufft() -> dict:
    import torch

    torch.manual_seed(0)
    x = torch.randn(64, 4096, device="cuda")
    got = torch.fft.irfft(torch.fft.rfft(x) * 2.0, n=4096)
    ref = torch.fft.rfft(x.cpu().double())
    err = _rel_err(torch.fft.rfft(x).cpu(), ref)
    rt = _rel_err(got.cpu(), 2.0 * x.cpu())
    return {"rfft_rel_err": err, "roundtrip_rel_err": rt,
            "limit": TH["fft_rel_err"]}


def _curand_lib():
    import ctypes
    import glob

    try:
        return ctypes.CDLL("libcurand.so.10")  # already loaded by libtorch_cuda: found by its soname
    except OSError:
        import torch

        roots = [os.path.dirname(os.path.dirname(torch.__file__))]
        for pat in ("nvidia/curand/lib/libcurand.so*", "nvidia/cu*/lib/libcurand.so*"):
            for f in sorted(glob.glob(os.path.join(roots[0], pat))):
                return ctypes.CDLL(f)
        raise


def check_curand() -> dict:
    """cuRAND's host API (libcurand, called directly): 16 Mi normals on torch's stream; mean 0 and std 1."""
    import ctypes

    import torch

    lib = _curand_lib()
    n = 16 << 20
    out = torch.empty(n, device="cuda")
    gen = ctypes.c_void_p()
    codes = [lib.curandCreateGenerator(ctypes.byref(gen), 100)]  # CURAND_RNG_PSEUDO_DEFAULT
    codes.append(lib.curandSetPseudoRandomGeneratorSeed(gen, ctypes.c_ulonglong(1234)))
    codes.append(lib.curandSetStream(gen, ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)))
    codes.append(lib.curandGenerateNormal(gen, ctypes.c_void_p(out.data_ptr()), ctypes.c_size_t(n),
                                          ctypes.c_float(0.0), ctypes.c_float(1.0)))
    torch.cuda.synchronize()
    codes.append(lib.curandDestroyGenerator(gen))
    mean, std = float(out.mean()), float(out.std())
    tol = TH["rand_moment_tol"]
    ver = ctypes.c_int()
    lib.curandGetVersion(ctypes.byref(ver))
    return {"status_codes": codes,
            "mean": mean, "std": std, "tol": tol, "curand_version": ver.value,
            "torch_randn_std": float(torch.randn(n, device="cuda").std())}


def check_cusolver() -> dict:
    """cuSOLVER in fp64 (so the figures measure the library, not fp32 rounding): LU solve, Cholesky, eigvalsh
    against LAPACK on the CPU."""
    import torch

    torch.backends.cuda.preferred_linalg_library("cusolver")
    torch.manual_seed(0)
    n = 512
    a = torch.randn(n, n, device="cuda", dtype=torch.float64)
    spd = a @ a.T + n * torch.eye(n, device="cuda", dtype=torch.float64)
    b = torch.randn(n, 4, device="cuda", dtype=torch.float64)
    x = torch.linalg.solve(a, b)
    solve_res = float((a @ x - b).norm() / b.norm())
    chol = torch.linalg.cholesky(spd)
    chol_res = float((chol @ chol.T - spd).norm() / spd.norm())
    w = torch.linalg.eigvalsh(spd)
    eig_err = float((w.cpu() - torch.linalg.eigvalsh(spd.cpu())).abs().max() / w.abs().max())
    lim = TH["solver_residual"]
    return {"solve_residual": solve_res,
            "cholesky_residual": chol_res, "eigvalsh_rel_err": eig_err, "limit": lim,
            "linalg_library": str(torch.backends.cuda.preferred_linalg_library())}


def check_nvrtc() -> dict:
    """An elementwise kernel compiled at run time by NVRTC (torch's jiterator) against eager."""
    import torch

    code = "template <typename T> T fma_gelu(T x, T y, T alpha) { return alpha * x * y + x / (T(1) + exp(-T(1.702) * y)); }"
    fn = torch.cuda.jiterator._create_jit_fn(code, alpha=0.5)
    torch.manual_seed(0)
    x, y = torch.randn(1 << 20, device="cuda"), torch.randn(1 << 20, device="cuda")
    t0 = time.perf_counter()
    got = fn(x, y, alpha=0.5)
    torch.cuda.synchronize()
    ref = 0.5 * x.double() * y.double() + x.double() * torch.sigmoid(1.702 * y.double())
    err = _rel_err(got, ref)
    return {"rel_err": err, "limit": TH["jiterator_rel_err"],
            "first_call_s": round(time.perf_counter() - t0, 3)}


_AOTI_CHILD = """
import json, sys, time
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
torch.empty(1, device="cuda")
# What aoti_load_package does first in a new process, whatever the package: torch._inductor's import and, from
# torch 2.8 or so, its device facts (a CPU vector-ISA probe: g++ builds plus Python starts, seconds each under
# load; torch 2.7 has no such step). Done while the parent still compiles; the package is seen only after READY.
import torch._inductor.package
from torch._inductor import codecache
if hasattr(codecache, "get_device_information"):
    codecache.get_device_information("cuda")
t2 = time.perf_counter()
print("READY", flush=True)
pkg, data = json.loads(sys.stdin.readline())
data = torch.load(data)
t3 = time.perf_counter()
runner = torch._inductor.aoti_load_package(pkg)
t4 = time.perf_counter()
with torch.no_grad():
    got = runner(data["x"].cuda())
got = got[0] if isinstance(got, (list, tuple)) else got
torch.cuda.synchronize()
err = float((got.double().cpu() - data["ref"].double()).norm() / data["ref"].double().norm())
print(json.dumps({"rel_err": err, "shape": list(got.shape), "import_s": round(t1 - t0, 2),
                  "prestart_s": round(t2 - t0, 2), "load_s": round(t4 - t3, 2), "run_s": round(time.perf_counter() - t4, 2)}))
"""

# What makes a one-off package build slow without changing what is built: AOTInductor precompiles its common
# headers into a PCH (worth it only when the same cache builds many packages; every cold compile here starts
# from an empty cache), and builds the wrapper at -O1. A package must hold its compiled .so: one with only
# the .cpp and .o is compiled again by every aoti_load_package (AOTIModelPackageLoader's compile_so), which
# would make a load as slow as a build. Applied where this torch has the setting.
AOTI_FAST_BUILD = {"aot_inductor.precompile_headers": False, "aot_inductor.compile_wrapper_opt_level": "O0",
                   "aot_inductor.package_cpp_only": False}


def package_contents(path: str) -> dict:
    """How many files of each kind an AOTInductor package (.pt2, a zip) holds: {"so": 1, "cpp": 1, ...}."""
    import zipfile

    kinds: dict = {}
    try:
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
    except (OSError, zipfile.BadZipFile) as e:  # a record only: never the reason a build or check fails
        return {"error": f"{type(e).__name__}: {e}"}
    for name in names:
        ext = os.path.splitext(name)[1].lstrip(".") or "(none)"
        kinds[ext] = kinds.get(ext, 0) + 1
    return dict(sorted(kinds.items()))


def aoti_build_configs(settings: dict = AOTI_FAST_BUILD) -> dict:
    from torch._inductor import config

    out = {}
    for key, value in settings.items():
        section, _, name = key.partition(".")
        if hasattr(getattr(config, section, None), name):
            out[key] = value
    return out


def check_aoti() -> dict:
    """AOTInductor: export + aoti_compile_and_package a small MLP (two GEMMs and a fused bias + GELU kernel)
    in this process, load the package in a fresh process with aoti_load_package, and compare with eager.
    The loader process is started first and readies torch while the package compiles (it learns the
    package's path only when it is built): a fresh process all the same, never having seen the package."""
    import torch

    with tempfile.TemporaryFile(mode="w+") as errs:  # a file: warnings must never fill a pipe nobody reads yet
        loader = subprocess.Popen([sys.executable, "-X", "faulthandler", "-c", _AOTI_CHILD], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=errs, text=True)
        try:
            return _aoti_round_trip(torch, loader, errs)
        finally:
            if loader.poll() is None:
                loader.kill()
            loader.wait()


def _aoti_round_trip(torch, loader, errs) -> dict:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 10)).cuda().eval()
    x = torch.randn(8, 64, device="cuda")
    with torch.no_grad():
        ref = model(x)
    configs = aoti_build_configs()
    with tempfile.TemporaryDirectory(prefix="gpuforge-aoti-") as d:
        pkg, data = os.path.join(d, "model.pt2"), os.path.join(d, "data.pt")
        t0 = time.perf_counter()
        ep = torch.export.export(model, (x,))
        export_s = time.perf_counter() - t0
        path = torch._inductor.aoti_compile_and_package(ep, package_path=pkg, inductor_configs=configs)
        compile_s = time.perf_counter() - t0
        torch.save({"x": x.cpu(), "ref": ref.cpu()}, data)
        t0 = time.perf_counter()
        import select

        ready = loader.stdout.readline().strip() if select.select([loader.stdout], [], [], 600)[0] else "(no READY in 600 s)"
        wait_s = time.perf_counter() - t0  # > 0 only when the loader's start outlasted the compile
        try:
            out, _ = loader.communicate(json.dumps([path, data]) + "\n" if ready == "READY" else "", timeout=600)
        except subprocess.TimeoutExpired:
            loader.kill()
            out, _ = loader.communicate()
        errs.seek(0)
        err = errs.read()
        try:
            child = json.loads(out.strip().splitlines()[-1])
        except (IndexError, json.JSONDecodeError):
            return {"ok": False, "error": f"loader process exit {loader.returncode}: {(ready + err + out)[-2000:]}",
                    "compile_s": round(compile_s, 2)}
        child["exit"] = loader.returncode  # a crash at interpreter exit after the result is recorded, not hidden
        child["wait_s"] = round(wait_s, 2)
        size = os.path.getsize(path)
        contents = package_contents(path)
    return {"rel_err": child["rel_err"], "limit": TH["aoti_rel_err"], "vec_isa_ok": os.environ.get("TORCHINDUCTOR_VEC_ISA_OK"),
            "package_contents": contents, "loader_exit": child["exit"], "export_s": round(export_s, 2), "build_configs": configs,
            "compile_s": round(compile_s, 2), "load_run_s": round(time.perf_counter() - t0, 2), "package_bytes": size,
            "loader": {k: child[k] for k in ("import_s", "prestart_s", "wait_s", "load_s", "run_s")}}


_AOTI_CPP = r"""
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <torch/torch.h>
#include <cstdio>
int main(int argc, char** argv) {
  torch::inductor::AOTIModelPackageLoader loader(argv[1]);
  auto x = (torch::arange(4 * 3 * 32 * 32, torch::kFloat) / 4096.0 - 1.5).reshape({4, 3, 32, 32}).to(torch::kCUDA);
  auto out = loader.run({x})[0].to(torch::kCPU).to(torch::kDouble).contiguous();
  for (int64_t i = 0; i < out.numel(); ++i) std::printf("%.9g\n", out.data_ptr<double>()[i]);
  return 0;
}
"""


def build_aoti_loader(d: str) -> dict:
    """The C++ loader program, built in folder d with the image's C++ compiler against the wheel's libtorch:
    {"exe": path, "build_s": s} or {"ok": False, "error": why}. Needs no GPU (the CPU validators build it too)."""
    import shutil

    import torch

    cxx = shutil.which("c++") or shutil.which("g++")
    if not cxx:
        return {"ok": False, "error": "no C++ compiler (c++/g++) on PATH"}
    root = os.path.dirname(torch.__file__)
    src, exe = os.path.join(d, "loader.cpp"), os.path.join(d, "loader")
    with open(src, "w") as f:
        f.write(_AOTI_CPP)
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    cmd = [cxx, "-std=c++17", "-O1", src, "-o", exe, f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
           f"-I{root}/include", f"-I{root}/include/torch/csrc/api/include", f"-L{root}/lib",
           "-ltorch", "-ltorch_cpu", "-ltorch_cuda", "-lc10", "-lc10_cuda", f"-Wl,-rpath,{root}/lib"]
    t0 = time.perf_counter()
    b = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    build_s = round(time.perf_counter() - t0, 1)
    if b.returncode != 0:
        return {"ok": False, "error": f"building the C++ loader failed: {b.stderr[-2000:]}", "build_s": build_s}
    return {"exe": exe, "build_s": build_s}


def check_aoti_cpp() -> dict:
    """Python-free deployment: an AOTInductor package run by a C++ program built against the wheel's libtorch
    (devel images: needs g++ and the CUDA headers the package build used)."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(4),
                                torch.nn.Flatten(), torch.nn.Linear(256, 10)).cuda().eval()
    x = ((torch.arange(4 * 3 * 32 * 32, dtype=torch.float32) / 4096.0 - 1.5).reshape(4, 3, 32, 32)).cuda()
    with torch.no_grad():
        ref = model(x).double().cpu().flatten()
    with tempfile.TemporaryDirectory(prefix="gpuforge-aoti-cpp-") as d:
        pkg = torch._inductor.aoti_compile_and_package(torch.export.export(model, (x,)), package_path=os.path.join(d, "m.pt2"))
        built = build_aoti_loader(d)
        if "exe" not in built:
            return built
        r = subprocess.run([built["exe"], pkg], capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        return {"ok": False, "error": f"C++ loader exit {r.returncode}: {(r.stderr + r.stdout)[-2000:]}"}
    got = torch.tensor([float(v) for v in r.stdout.split()], dtype=torch.float64)
    err = float((got - ref).norm() / ref.norm()) if got.numel() == ref.numel() else float("inf")
    return {"rel_err": err, "limit": TH["aoti_rel_err"], "build_s": built["build_s"],
            "values": int(got.numel())}


def check_cuda_extension() -> dict:
    """A load_inline extension (g++, libtorch, CUDA_HOME's headers and libraries) whose bias + GELU kernel NVRTC
    compiles for this GPU, launched on torch's stream, against fp64 eager (devel images: images/programs/cuda_extension.py)."""
    import cuda_extension

    res = cuda_extension.run(compile_only=False)
    if "rel_err" in res:
        res["limit"] = TH["extension_rel_err"]
    return res if res.get("ok", True) else {**res, "error": f"{res.get('stage')}: {res.get('error')}"}


def check_shm() -> dict:
    st = os.statvfs("/dev/shm")
    size = st.f_blocks * st.f_frsize
    return {"ok": size >= MIN_SHM, "bytes": size, "gib": round(size / 2**30, 2), "min_gib": MIN_SHM / 2**30,
            "hint": "" if size >= MIN_SHM else "start the container with --shm-size=2g or --ipc=host"}


def check_multi_gpu() -> dict:
    import torch

    n = torch.cuda.device_count()
    if n < 2:  # an all-reduce over one GPU is a local copy and DDP equals the reference: nothing to prove
        return {"ok": True, "skipped": f"world size {n}: one GPU visible, no collective to check", "world_size": n}
    here = os.path.dirname(os.path.abspath(__file__))
    r = subprocess.run([sys.executable, os.path.join(here, "multi_gpu.py")], capture_output=True, text=True, timeout=900)
    try:
        return json.loads(r.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"ok": False, "error": (r.stderr or r.stdout)[-3000:]}


CHECKS = {
    "device": check_device, "shm": check_shm, "matmul": check_matmul, "cudnn_conv": check_cudnn_conv,
    "triton_kernel": check_triton_kernel, "fusion": check_fusion, "compile_modes": check_compile_modes,
    "amp_training": check_amp_training, "sdpa": check_sdpa, "cufft": check_cufft, "curand": check_curand,
    "cusolver": check_cusolver, "nvrtc": check_nvrtc, "aoti": check_aoti, "compile_cache": check_compile_cache,
}
# Run with --only or --devel (devel images: a C++ toolchain and CUDA headers are part of the promise).
EXTRA = {"aoti_cpp": check_aoti_cpp, "cuda_extension": check_cuda_extension}
# Compile-heavy and CPU-bound (Inductor, g++): each in a fresh process of its own, all at once.
ISOLATED = ("aoti", "aoti_cpp", "compile_modes", "cuda_extension")
# Run first here (the isolated checks' processes are already starting up by then).
FIRST = ("device", "compile_cache", "fusion")


class _Quiet:
    def __repr__(self) -> str:
        return "QUIET"


QUIET = _Quiet()  # yielded by a check: "resume my timed part when nothing else runs"


def _failure(e: BaseException) -> dict:
    return {"ok": False, "error": f"{type(e).__name__}: {e}"[-3000:], "traceback": traceback.format_exc()[-3000:]}


def _step(gen, elapsed: float) -> tuple[dict | None, float]:
    """Run a check's generator to its next QUIET (None: suspended) or to its end (its result)."""
    t0 = time.perf_counter()
    try:
        got = next(gen)
    except StopIteration as stop:
        res = stop.value if isinstance(stop.value, dict) else {"ok": False, "error": "the check returned no result"}
    except Exception as e:
        res = _failure(e)
    else:
        res = None if got is QUIET else {"ok": False, "error": f"the check yielded {got!r}, not QUIET"}
    return res, elapsed + time.perf_counter() - t0


def _as_gen(fn):
    import inspect

    return fn() if inspect.isgeneratorfunction(fn) else _plain(fn)


def _plain(fn):
    return fn()
    yield  # makes this a generator: the plain check runs in full at its first step


ISOLATED_DEADLINE_S = 1500  # from its start: under the validator's 1800 s for the whole program, so a hung check
# is killed and reported as its own failure, never the whole report lost to the outer timeout


def spawn_isolated(name: str, thresholds: dict):
    """A check in fresh processes of this program with their own empty Inductor caches: compile_modes as one process
    per mode, started from here (no process in between whose own start would come first), any other as
    `--serial --only NAME`. Returns result(timeout=None) -> its result; a process still running at its deadline
    (ISOLATED_DEADLINE_S from its start, or `timeout` from the call) is killed."""
    t0 = time.perf_counter()

    def left(timeout: float | None) -> float:
        return timeout if timeout is not None else max(0.1, ISOLATED_DEADLINE_S - (time.perf_counter() - t0))

    if name == "compile_modes":
        modes = _start_modes(COMPILE_MODES, thresholds)

        def merged(timeout: float | None = None) -> dict:
            res = modes(left(timeout))
            res["process_s"] = round(time.perf_counter() - t0, 2)  # the slowest mode's process, start to exit
            return res
        return merged
    cache = tempfile.mkdtemp(prefix=f"gpuforge-smoke-{name}-")
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
    env.pop("TRITON_CACHE_DIR", None)
    finish = _start_child(["--serial", "--only", name, "--thresholds", json.dumps(thresholds)], env)

    def result(timeout: float | None = None) -> dict:
        rc, text, errs = finish(left(timeout))
        wall = round(time.perf_counter() - t0, 2)
        try:
            res = json.loads(text.strip().splitlines()[-1])["checks"][name]
        except (IndexError, KeyError, json.JSONDecodeError):
            return {"ok": False, "error": f"isolated process exit {rc}: {(errs + text)[-2000:]}",
                    "process_s": wall}
        res["process_s"] = wall  # its own seconds plus the process's start (imports, CUDA) and exit
        return res
    return result


def run_checks(names: list[str], checks: dict, *, serial: bool, isolated=ISOLATED, spawn=None,
               judge=lambda name, res: res, log=lambda line: None) -> dict:
    """Run the named checks; return {name: result} in the order of `names`, each with its `seconds`.

    Serial: each check runs here to its end, in order (a QUIET yield is resumed at once). Otherwise: every isolated
    check is spawned first (their processes start up while `device` runs here), then `device` (nothing else runs
    without a GPU: if it fails, the spawned processes are killed and nothing else runs), then the rest here, each
    up to its QUIET; once every isolated process has finished, the suspended checks resume one at a time.
    """
    order = list(names) if serial else [n for n in FIRST if n in names] + [n for n in names if n not in FIRST]
    results: dict = {}
    waiting: dict = {} if serial else {n: spawn(n) for n in order if n in isolated}
    quiet: list = []

    def done(name: str, res: dict, seconds: float) -> None:
        res = judge(name, res)  # the verdict the validator re-applies (gpuforge.image.smoke_verdicts)
        res.setdefault("seconds", round(seconds, 2))
        results[name] = res
        log(f"gpuforge selftest: {name}: {'ok' if res.get('ok') else 'FAILED'} ({res['seconds']} s)")

    for name in order:
        if name in waiting:
            continue
        gen = _as_gen(checks[name])
        res, spent = _step(gen, 0.0)
        while res is None and serial:
            res, spent = _step(gen, spent)
        if res is None:
            quiet.append((name, gen, spent))
            continue
        done(name, res, spent)
        if name == "device" and not res.get("ok"):
            for result in waiting.values():
                result(0.1)  # killed: their checks did not run
            return {n: results[n] for n in names if n in results}
    for name, result in waiting.items():
        res = result()
        done(name, res, res.get("process_s", 0.0))
    for name, gen, spent in quiet:
        res, spent = _step(gen, spent)
        if res is None:
            res = {"ok": False, "error": "the check yielded QUIET twice"}
            gen.close()
        done(name, res, spent)
    return {n: results[n] for n in names if n in results}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="also write the JSON report here")
    ap.add_argument("--multi-gpu", action="store_true", help="add the NCCL all-reduce + DDP part")
    ap.add_argument("--only", help="comma-separated checks to run")
    ap.add_argument("--devel", action="store_true", help="also the devel-image checks (C++ AOTInductor loader)")
    ap.add_argument("--thresholds", help="JSON object of bars (the host toolkit's smoke_thresholds); default: the compat data's")
    ap.add_argument("--serial", action="store_true", help="every check here, one after another (no child processes)")
    ap.add_argument("--isolate", default=",".join(ISOLATED), help="checks run each in a fresh process, concurrently")
    ap.add_argument("--compile-mode", choices=COMPILE_MODES, help="compile_modes: only this mode")
    ap.add_argument("--compile-modes-apart", action="store_true",
                    help="compile_modes: each mode in a process of its own, concurrently")
    ap.add_argument("--level", choices=list(readiness.LEVELS), help="only the node's readiness: r1 NVML health, driver, "
                    "limits (about a second); r2 r1 and each GPU's speed against its model's floors (about 10 s a GPU); "
                    "exit 0 ready, 10 the node is not fit, 5 the image is at fault (a probe that crashes included), "
                    "12 not shown fit (--strict: a check could not look)")
    ap.add_argument("--strict", action="store_true", help="--level: a check that could not look (the kernel log "
                    "closed to the container) blocks, exit 12; without it, it passes, named in the verdict")
    ap.add_argument("--probe-child", action="store_true", help=argparse.SUPPRESS)  # --level's measuring process
    ap.add_argument("--gpus", type=int, help="--level: the GPUs asked for (default: all the node has)")
    ap.add_argument("--bars", help="--level: JSON object of bars (the host toolkit's readiness.bars()); default: the "
                    "compat data's")
    ap.add_argument("--cuda", help="--level: the image's CUDA (default: /opt/gpuforge/target.json's)")
    args = ap.parse_args(argv)
    if args.level and args.probe_child:
        ready_child(args)  # never returns
    if args.level:
        ready_supervised(args, sys.argv[1:] if argv is None else list(argv))  # never returns
    _MODES.update(only=args.compile_mode, apart=args.compile_modes_apart)
    TH.clear()
    TH.update(json.loads(args.thresholds) if args.thresholds else smoke_verdicts.default_thresholds())
    every = {**CHECKS, **EXTRA}
    names = args.only.split(",") if args.only else list(CHECKS) + (list(EXTRA) if args.devel else [])
    unknown = [n for n in names + args.isolate.split(",") if n and n not in every]
    if unknown:
        print(f"gpuforge selftest: error: unknown check(s) {', '.join(unknown)}; known: {', '.join(every)}",
              file=sys.stderr)
        return 64
    # A fresh Inductor cache for this run, so first-compile figures are real compiles (not earlier runs' hits).
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="gpuforge-smoke-inductor-"))
    t_all = time.perf_counter()
    checks = run_checks(names, every, serial=args.serial, isolated=tuple(n for n in args.isolate.split(",") if n),
                        spawn=lambda n: spawn_isolated(n, TH),
                        # one mode's process gives its figures to the parent, which judges both modes together
                        judge=(lambda n, res: res) if args.compile_mode else lambda n, res: smoke_verdicts.judge(n, res, TH),
                        log=lambda line: print(line, file=sys.stderr))
    report: dict = {"checks": checks, "thresholds": TH,
                    "schedule": {"serial": args.serial, "isolated": [] if args.serial else
                                 [n for n in names if n in args.isolate.split(",")]}}
    if args.multi_gpu and report["checks"].get("device", {}).get("ok"):
        report["checks"]["multi_gpu"] = check_multi_gpu()
    report["seconds"] = round(time.perf_counter() - t_all, 2)
    report["ok"] = all(c.get("ok") for c in report["checks"].values())
    text = json.dumps(report, default=str)
    if args.out:
        with open(args.out, "w") as f:
            f.write(json.dumps(report, indent=2, default=str) + "\n")
    print(text)
    return 0 if report["ok"] else 1


def ready_supervised(args, argv: list[str]):
    """A readiness level as a probe a node can trust (gpuforge.image.supervise): the measuring work in a child process
    of this program (`--probe-child`), its verdict printed here, last, only when the child exited cleanly with the
    exit code its report names; a child that crashed, even after its verdict, is exit 5. The report as JSON on
    stdout, the verdict line on stderr. Never returns."""
    supervise.probe([sys.executable, os.path.abspath(__file__), *argv, "--probe-child"], level=args.level,
                    label=f"gpuforge selftest {args.level}", out=args.out,
                    extra_s=lambda rep: (rep.get("facts") or {}).get("seconds"))


def ready_report(args) -> dict:
    """A readiness level's report (gpuforge.image.readiness), each finding printed on stderr as it is judged."""
    t0 = time.perf_counter()
    cuda = args.cuda or _image_cuda()
    bars = json.loads(args.bars) if args.bars else readiness.bars()
    if args.strict:
        bars["unknown_blocks"] = True
    facts = readiness.collect()
    facts["level"] = args.level
    facts["r1_seconds"] = round(time.perf_counter() - t0, 2)  # r1's facts collected
    if args.level == "r2":
        facts["speed"] = measure_r2(bars)
    findings = readiness.judge_level(facts, args.level, request=args.gpus, image_cuda=cuda, bars=bars)
    facts["seconds"] = round(time.perf_counter() - t0, 2)
    for f in findings:
        state = "ok" if f.ok and not f.unknown else "not known" if f.ok else f"FAILED ({f.blame})"
        print(f"gpuforge selftest {args.level}: {f.check}: {state}: {f.figure}", file=sys.stderr)
    return readiness.report(facts, findings, args.level)


def ready_child(args):
    """`--level ... --probe-child`: the measuring process. Its report is its last line on stdout, and it ends with
    os._exit(the report's exit code): no interpreter teardown (NVML, CUDA, Inductor's compile workers, timing threads)
    runs after its verdict is decided. Never returns."""
    try:
        report = ready_report(args)
        text, code = json.dumps(report, default=str), report["exit"]
    except BaseException:  # the parent says the probe crashed before its verdict; the traceback says where
        traceback.print_exc()
        text, code = "", supervise.CRASH_EXIT
    try:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def measure_r2(bars: dict) -> dict:
    """r2's figures: speed.measure() on every GPU CUDA sees, the fused kernel's ratio, NCCL's all-reduce over two or
    more GPUs; {"error": ...} where torch or CUDA cannot even start."""
    try:
        import speed  # beside this program
        import torch

        n = torch.cuda.device_count()
        if not n:
            return {"error": "CUDA sees no GPU (torch.cuda.device_count() is 0)"}
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"[-1500:]}
    out: dict = {"gpus": [_measure_one(speed, i, int(bars["r2"]["trials"])) for i in range(n)]}
    torch.cuda.set_device(0)
    TH["fusion_min_ratio"] = bars["fusion_min_ratio"]
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="gpuforge-r2-inductor-"))
    gen = _as_gen(check_fusion)
    res, spent = None, 0.0
    while res is None:  # nothing else runs here: its quiet part resumes at once
        res, spent = _step(gen, spent)
    out["fusion"] = res if "error" not in res else {"error": res["error"]}
    if n > 1:  # its own timeout included: a hung collective is the node's finding, not a lost report
        ar = speed.guarded(check_multi_gpu)
        ar.setdefault("names", [g["name"] for g in out["gpus"]])
        out["allreduce"] = ar
    return out


def _measure_one(speed, index: int, trials: int) -> dict:
    """speed.measure() of one GPU; a GPU that cannot even be selected gets every figure's failure, the others go on."""
    got = speed.guarded(lambda: speed.measure(index, trials))
    return {"index": index, "name": "unknown", **{c: got for c in readiness.SPEED}} if "error" in got else got


def _image_cuda() -> str:
    """The CUDA the image carries, from its target.json through the one reader of that file ("" where there is none,
    or it is malformed: r1's driver check then fails, saying the CUDA cannot be judged)."""
    try:
        return Expected.load(TARGET_JSON).cuda or ""
    except ExpectedError:
        return ""


if __name__ == "__main__":
    sys.exit(main())
