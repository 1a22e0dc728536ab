"""One workload of the perf table (perf_table.py), in a fresh process of its own.

  python perf_worker.py KEY --modes eager,default,... --trials N   every mode built, its kernels counted, all timed
  python perf_worker.py KEY --compile-only MODE                    one mode's cold compile: its first three calls

Each mode gets its own model (same seed), so one mode's optimizer steps or CUDA graph pool never touch another's.
Per mode: the first three calls' seconds (the compile, and reduce-overhead's graph recording on a later call), the
peak memory of one steady step above what was held before the mode was built (its weights, optimizer state,
activations, graph pool), the kernels of one call (torch.profiler: a priming session, then several, settled by
perf_table.settle_kernels), then every mode timed in alternating order. A mode that fails is its row's error; the
others go on. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from perf_table import MODES, WORKLOADS, Workload, interleaved_order, settle_kernels, spread  # noqa: E402

FIRST_CALLS = 3  # reduce-overhead records its CUDA graph on a later call than the first
KERNEL_CALLS, KERNEL_SESSIONS = 3, 3


def fused(x):
    import torch

    return torch.relu(x + 1) * 0.5


def _compiler(mode: str):
    import torch

    if mode == "eager":
        return lambda f: f
    if mode == "default":
        return torch.compile
    return lambda f: torch.compile(f, mode=mode)


def make_step(w: Workload, mode: str):
    """One call of the workload as users write it, in `mode`: inference under no_grad, or a whole training step
    (forward, loss, backward, SGD step), or the fused elementwise function."""
    import torch

    compile_ = _compiler(mode)
    graphs = mode == "reduce-overhead"  # each call a new step for the CUDA graph trees: nothing held across calls
    mark = torch.compiler.cudagraph_mark_step_begin if graphs else (lambda: None)
    if w.task == "fusion":
        x = torch.randn(64, 512, device="cuda")
        f = compile_(fused)

        def fusion_step():
            mark()
            f(x)
        return fusion_step
    import torchvision

    torch.manual_seed(0)
    model = getattr(torchvision.models, w.model)().cuda()
    x = torch.randn(w.batch, 3, 224, 224, device="cuda")
    if w.dtype == "bf16":
        model, x = model.to(torch.bfloat16), x.to(torch.bfloat16)
    if w.channels_last:
        model, x = model.to(memory_format=torch.channels_last), x.contiguous(memory_format=torch.channels_last)
    if w.task == "infer":
        f = compile_(model.eval())

        def infer_step():
            with torch.no_grad():
                mark()
                f(x)
        return infer_step
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    y = torch.randint(0, 1000, (w.batch,), device="cuda")
    f = compile_(model)
    autocast = w.dtype == "bf16-autocast"

    def train_step():
        mark()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            loss = torch.nn.functional.cross_entropy(f(x), y)
        loss.backward()
        opt.step()
    return train_step


def first_calls(step) -> float:
    import torch

    t0 = time.perf_counter()
    for _ in range(FIRST_CALLS):
        step()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def kernels_per_call(step) -> dict:
    """CUDA kernels one call launches (copies and memsets left out): a priming profiler session, then
    KERNEL_SESSIONS sessions of KERNEL_CALLS calls each, settled. CPU activity is recorded too: with CUDA alone,
    Kineto may fail to relate its events and hand back none. A CUDA graph's replay counts as the kernels it holds."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    def session() -> int:
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(KERNEL_CALLS):
                step()
            torch.cuda.synchronize()
        return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
                   and not e.name.startswith(("Memcpy", "Memset")))

    session()
    return settle_kernels([session() for _ in range(KERNEL_SESSIONS)], KERNEL_CALLS)


def ms_per_call(step, iters: int) -> float:
    import speed  # beside this program

    # each trial warms the GPU first (speed's default): a trial that follows a pause, such as a capped compile's
    # process being killed, otherwise times clocks still ramping up and spreads the mode's trials
    return speed.timed_trials(step, trials=1, inner=iters)[0]


def _error(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"[-1500:]


def run_modes(key: str, modes: list[str], trials: int) -> list[dict]:
    import torch

    w = WORKLOADS[key]
    torch.backends.cudnn.benchmark = w.cudnn_benchmark
    rows: dict[str, dict] = {}
    steps = {}
    for mode in modes:
        row = rows[mode] = {"workload": key, "label": w.label, "settings": w.settings(), "mode": mode}
        try:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            base = torch.cuda.memory_allocated()
            step = make_step(w, mode)
            first = first_calls(step)
            for _ in range(2):
                step()
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            step()
            torch.cuda.synchronize()
            row.update(peak_mem_mib=round((torch.cuda.max_memory_allocated() - base) / 2**20, 1),
                       first_calls_s=round(first, 2), compile_s=None if mode == "eager" else round(first, 2))
            steps[mode] = step
        except Exception as e:  # one mode that cannot compile or run is its own row's failure
            row["error"] = _error(e)
    for mode, step in steps.items():
        try:
            got = kernels_per_call(step)
        except Exception as e:
            got = {"error": _error(e)}
        rows[mode].update(kernels=got.get("kernels"), kernel_count=got)
        if "error" in got:
            rows[mode]["kernel_error"] = got["error"]
    samples: dict[str, list[float]] = {m: [] for m in steps}
    for order in interleaved_order(trials, list(steps)):
        for mode in order:
            samples[mode].append(ms_per_call(steps[mode], w.iters))
    for mode, ms in samples.items():
        sp = spread(ms)
        rows[mode].update(ms=round(sp["best"], 4), median_ms=round(sp["median"], 4), cv=round(sp["cv"], 4),
                          trials=sp["n"], iters=w.iters)
    return list(rows.values())


def inductor_settings() -> dict:
    """What max-autotune tunes here: the backends and search space Inductor's config holds (the mode itself turns
    max_autotune and coordinate_descent_tuning on)."""
    from torch._inductor import config

    keys = ("max_autotune_gemm_backends", "max_autotune_conv_backends", "max_autotune_gemm_search_space",
            "coordinate_descent_tuning", "autotune_local_cache")
    return {k: getattr(config, k, None) for k in keys}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("workload", choices=list(WORKLOADS))
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--trials", type=int, default=7)
    ap.add_argument("--compile-only", choices=MODES[1:])
    args = ap.parse_args(argv)
    import torch

    if args.compile_only:
        w = WORKLOADS[args.workload]
        torch.backends.cudnn.benchmark = w.cudnn_benchmark
        seconds = first_calls(make_step(w, args.compile_only))
        print(json.dumps({"mode": args.compile_only, "compile_s": round(seconds, 2)}))
        return 0
    modes = args.modes.split(",")
    rows = run_modes(args.workload, modes, args.trials)
    print(json.dumps({"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
                      "inductor": inductor_settings(), "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
