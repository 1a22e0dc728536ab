"""Readiness level r2's speed figures: is each GPU as fast as its model should be?

Per GPU: HBM device-to-device copy (TB/s, bytes read and written), 8192^3 bf16 and TF32 matrix products on random
data (TFLOP/s), pinned host->device and device->host copies (GB/s). Each figure is the best of `trials` timed trials
(CUDA events around back-to-back calls, after a warm-up long enough for the clocks to ramp), with the trials'
coefficient of variation: a node whose figures wander (another job on the GPU, thermal or power limits) shows it.
Run by gpu_smoke.py --level r2; the floors live on the host (compat data's `readiness.r2`), never here.
"""

from __future__ import annotations

import statistics
import time

COPY_BYTES = 2 << 30  # per buffer: well past any cache (H200: 60 MB of L2)
GEMM_N = 8192
HOST_BYTES = 1 << 30


def timed_trials(fn, *, trials: int, inner: int, warm_s: float = 0.3, warm_calls: int = 0) -> list[float]:
    """Milliseconds per fn() call in each trial: `inner` back-to-back calls between two CUDA events (back to back, the
    GPU stays busy while Python launches the next: the kernels' throughput, not the host's launch overhead). Warm-up:
    `warm_calls` calls, then calls for `warm_s` seconds."""
    import torch

    for _ in range(warm_calls):
        fn()
    if warm_calls:
        torch.cuda.synchronize()
    t_end = time.perf_counter() + warm_s  # clocks ramp from idle in ~100 ms; a GEMM at idle clocks is 5x slower
    while time.perf_counter() < t_end:
        fn()
        torch.cuda.synchronize()
    out = []
    for _ in range(trials):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(inner):
            fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) / inner)
    return out


def _row(ms: list[float], work: float, unit: str, scale: float, what: str) -> dict:
    """A figure from per-call milliseconds: `work` units of work per call, shown in `unit` (work/s / scale)."""
    rates = [work / (m / 1e3) / scale for m in ms]
    mean = statistics.fmean(rates)
    return {"best": round(max(rates), 3), "mean": round(mean, 3), "cv": round(statistics.pstdev(rates) / mean, 4),
            "unit": unit, "trials": [round(r, 3) for r in rates], "what": what}


def guarded(fn) -> dict:
    """fn()'s dict, or {"error": what it raised}."""
    try:
        return fn()
    except Exception as e:  # one part that cannot be measured is its own failure, never the others'
        return {"error": f"{type(e).__name__}: {e}"[-1500:]}


def copy_hbm(dev, trials: int) -> dict:
    import torch

    n = COPY_BYTES // 4
    src, dst = torch.empty(n, device=dev).uniform_(), torch.empty(n, device=dev)
    ms = timed_trials(lambda: dst.copy_(src), trials=trials, inner=10)
    return _row(ms, 2 * COPY_BYTES, "TB/s", 1e12, f"device-to-device copy of {COPY_BYTES >> 30} GiB, bytes read + written")


def gemm(dev, trials: int, dtype: str) -> dict:
    import torch

    n = GEMM_N
    if dtype == "bf16":
        a, b = (torch.randn(n, n, device=dev, dtype=torch.bfloat16) for _ in range(2))
        fn = lambda: a @ b  # noqa: E731
    else:  # fp32 tensors, TF32 tensor-core math: what torch.set_float32_matmul_precision("high") gives
        a, b = (torch.randn(n, n, device=dev) for _ in range(2))
        old = torch.backends.cuda.matmul.allow_tf32

        def fn():
            torch.backends.cuda.matmul.allow_tf32 = True
            try:
                return a @ b
            finally:
                torch.backends.cuda.matmul.allow_tf32 = old
    ms = timed_trials(fn, trials=trials, inner=10 if dtype == "bf16" else 5)
    return _row(ms, 2 * n ** 3, "TFLOP/s", 1e12, f"{n}^3 {dtype} matrix product on random data")


def host_copy(dev, trials: int, way: str) -> dict:
    import torch

    host = torch.empty(HOST_BYTES // 4, pin_memory=True)
    gpu = torch.empty(HOST_BYTES // 4, device=dev)
    if way == "h2d":
        fn = lambda: gpu.copy_(host, non_blocking=True)  # noqa: E731
    else:
        fn = lambda: host.copy_(gpu, non_blocking=True)  # noqa: E731
    ms = timed_trials(fn, trials=trials, inner=4)
    return _row(ms, HOST_BYTES, "GB/s", 1e9, f"{HOST_BYTES >> 30} GiB {'to the GPU from' if way == 'h2d' else 'from the GPU to'} "
                "pinned host memory")


def measure(index: int, trials: int) -> dict:
    """Every r2 figure of GPU `index` (CUDA's numbering), each {best, mean, cv, unit, trials} or {error}."""
    import torch

    dev = torch.device("cuda", index)
    torch.cuda.set_device(dev)
    t0 = time.perf_counter()
    props = torch.cuda.get_device_properties(index)
    out = {"index": index, "name": props.name, "uuid": str(getattr(props, "uuid", "") or "")}
    out["hbm_copy"] = guarded(lambda: copy_hbm(dev, trials))
    out["gemm_bf16"] = guarded(lambda: gemm(dev, trials, "bf16"))
    out["gemm_tf32"] = guarded(lambda: gemm(dev, trials, "tf32"))
    out["h2d"] = guarded(lambda: host_copy(dev, trials, "h2d"))
    out["d2h"] = guarded(lambda: host_copy(dev, trials, "d2h"))
    torch.cuda.empty_cache()
    out["seconds"] = round(time.perf_counter() - t0, 2)
    return out
