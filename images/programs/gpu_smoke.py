"""gpuforge GPU smoke suite: one program, one JSON report (validators/test_gpu_smoke.py asserts on it).

Baked into every image (`docker run --gpus all --shm-size 2g IMAGE selftest`) and run on GPU runners
through testinfra's local:// backend. Each check records its figures and `ok`; a check that raises
is recorded with its error, so one broken part never hides the others.

  python gpu_smoke.py [--out FILE] [--quick] [--multi-gpu]
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

# NVLink multicast stays off on shared machines (see the multi-GPU part); set before torch loads.
for _k, _v in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ.setdefault(_k, _v)

MIN_SHM = 1 << 30
FUSION_MIN_RATIO = 0.85


def _time_cuda(fn, iters: int = 20, warmup: int = 3, inner: int = 10) -> float:
    """Median milliseconds per fn() call, by CUDA events around `inner` back-to-back calls.

    Back-to-back calls keep the GPU busy while Python launches the next one, so this measures the
    kernels' throughput rather than the host's per-call launch overhead (dynamo guards included).
    """
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(inner):
            fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / inner)
    return statistics.median(times)


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


def check_device() -> dict:
    import torch

    if not torch.cuda.is_available():
        return {"ok": False, "error": "torch.cuda.is_available() is False (no GPU passed in, or driver too old)"}
    p = torch.cuda.get_device_properties(0)
    return {"ok": True, "name": p.name, "capability": f"{p.major}.{p.minor}", "memory_gib": round(p.total_memory / 2**30, 1),
            "count": torch.cuda.device_count(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(), "arch_list": torch.cuda.get_arch_list()}


def check_matmul() -> dict:
    import torch

    torch.manual_seed(0)
    n = 2048
    a, b = torch.randn(n, n, device="cuda"), torch.randn(n, n, device="cuda")
    ref = (a.double() @ b.double())
    out = {}
    limits = {"fp32": 1e-5, "tf32": 5e-3, "bf16": 2e-2}
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
    out["ok"] = all(out[f"{k}_rel_err"] < v for k, v in limits.items())
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
    return {"ok": fwd < 1e-4 and bwd < 1e-4 and torch.backends.cudnn.is_available(),
            "forward_rel_err": fwd, "backward_rel_err": bwd, "cudnn_version": torch.backends.cudnn.version()}


def check_triton_kernel() -> dict:
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def axpy(x_ptr, y_ptr, out_ptr, a, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(out_ptr + offs, a * tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)

    n = 1_000_003
    x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    out = torch.empty_like(x)
    t0 = time.perf_counter()
    axpy[(triton.cdiv(n, 1024),)](x, y, out, 2.0, n, BLOCK=1024)
    torch.cuda.synchronize()
    return {"ok": bool(torch.allclose(out, 2.0 * x + y)), "first_launch_s": round(time.perf_counter() - t0, 3),
            "triton": triton.__version__}


def fused(x):
    import torch

    return torch.relu(x + 1) * 0.5


def check_fusion() -> dict:
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
    y = torch.empty_like(x)
    copy_ms = _time_cuda(lambda: y.copy_(x), iters=30)
    eager_ms = _time_cuda(lambda: fused(x), iters=30)
    comp_ms = _time_cuda(lambda: cf(x), iters=30)
    bytes_moved = 2 * n * 4  # read x, write the result
    copy_gbs, comp_gbs = bytes_moved / copy_ms / 1e6, bytes_moved / comp_ms / 1e6
    ratio = comp_gbs / copy_gbs
    return {"ok": eager_k == 3 and compiled_k == 1 and bool(torch.equal(got, fused(x))) and ratio >= FUSION_MIN_RATIO,
            "eager_kernels": eager_k, "compiled_kernels": compiled_k, "equal": bool(torch.equal(got, fused(x))),
            "eager_ms": round(eager_ms, 4), "compiled_ms": round(comp_ms, 4), "copy_ms": round(copy_ms, 4),
            "compiled_gbs": round(comp_gbs, 1), "copy_gbs": round(copy_gbs, 1), "ratio_to_copy": round(ratio, 3),
            "min_ratio": FUSION_MIN_RATIO, "compile_s": round(compile_s, 2)}


def _mm_bias_gelu(a, w, b):
    import torch

    return torch.nn.functional.gelu(a @ w + b)


def check_compile_modes() -> dict:
    import torch

    torch.manual_seed(0)
    a, w, b = (torch.randn(512, 1024, device="cuda"), torch.randn(1024, 1024, device="cuda"), torch.randn(1024, device="cuda"))
    torch.backends.cuda.matmul.allow_tf32 = False
    ref = _mm_bias_gelu(a, w, b)
    out = {}
    for mode in ("reduce-overhead", "max-autotune-no-cudagraphs"):
        torch._dynamo.reset()
        t0 = time.perf_counter()
        f = torch.compile(_mm_bias_gelu, mode=mode)
        for _ in range(3):  # reduce-overhead records its CUDA graph on a later call
            got = f(a, w, b).clone()
        torch.cuda.synchronize()
        err = _rel_err(got, ref)
        out[mode] = {"rel_err": err, "compile_s": round(time.perf_counter() - t0, 2), "ok": err < 1e-3}
    out["ok"] = all(v["ok"] for v in out.values() if isinstance(v, dict))
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


_COMPILE_CHILD = """
import time, torch
def f(x):
    return torch.nn.functional.silu(x * 2 + 1).sum(dim=-1)
x = torch.randn(4096, 1024, device="cuda")
t0 = time.perf_counter(); torch.compile(f)(x); torch.cuda.synchronize()
print(time.perf_counter() - t0)
"""


def check_compile_cache() -> dict:
    """Two fresh processes sharing TORCHINDUCTOR_CACHE_DIR: the second (warm) compiles faster."""
    with tempfile.TemporaryDirectory(prefix="gpuforge-cache-") as cache:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
        times = []
        for _ in range(2):
            r = subprocess.run([sys.executable, "-c", _COMPILE_CHILD], env=env, capture_output=True, text=True, timeout=600)
            if r.returncode != 0:
                return {"ok": False, "error": r.stderr[-2000:]}
            times.append(float(r.stdout.strip().splitlines()[-1]))
    return {"ok": times[1] < times[0], "cold_s": round(times[0], 3), "warm_s": round(times[1], 3),
            "speedup": round(times[0] / times[1], 2)}


def check_shm() -> dict:
    st = os.statvfs("/dev/shm")
    size = st.f_blocks * st.f_frsize
    return {"ok": size >= MIN_SHM, "bytes": size, "gib": round(size / 2**30, 2), "min_gib": MIN_SHM / 2**30,
            "hint": "" if size >= MIN_SHM else "start the container with --shm-size=2g or --ipc=host"}


def check_multi_gpu() -> dict:
    here = os.path.dirname(os.path.abspath(__file__))
    r = subprocess.run([sys.executable, os.path.join(here, "multi_gpu.py")], capture_output=True, text=True, timeout=900)
    try:
        return json.loads(r.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"ok": False, "error": (r.stderr or r.stdout)[-3000:]}


CHECKS = {
    "device": check_device, "shm": check_shm, "matmul": check_matmul, "cudnn_conv": check_cudnn_conv,
    "triton_kernel": check_triton_kernel, "fusion": check_fusion, "compile_modes": check_compile_modes,
    "amp_training": check_amp_training, "compile_cache": check_compile_cache,
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="also write the JSON report here")
    ap.add_argument("--multi-gpu", action="store_true", help="add the NCCL all-reduce + DDP part")
    ap.add_argument("--only", help="comma-separated checks to run")
    args = ap.parse_args(argv)
    names = args.only.split(",") if args.only else list(CHECKS)
    report: dict = {"checks": {}}
    t_all = time.perf_counter()
    for name in names:
        t0 = time.perf_counter()
        try:
            res = CHECKS[name]()
        except Exception as e:
            res = {"ok": False, "error": f"{type(e).__name__}: {e}"[-3000:], "traceback": traceback.format_exc()[-3000:]}
        res["seconds"] = round(time.perf_counter() - t0, 2)
        report["checks"][name] = res
        print(f"gpuforge selftest: {name}: {'ok' if res.get('ok') else 'FAILED'} ({res['seconds']} s)", file=sys.stderr)
        if name == "device" and not res["ok"]:
            break  # nothing else can run without a GPU
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


if __name__ == "__main__":
    sys.exit(main())
