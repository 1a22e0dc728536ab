"""Eager vs torch.compile performance table: ResNet-50 inference (batch 1 and 64) and a ResNet-18
training step (batch 64). Milliseconds, kernel launches, peak memory and compile seconds, measured
side by side in one run; printed as Markdown and JSON.

  python perf_table.py [--json FILE] [--md FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_smoke import count_kernels


def _ms(fn, iters: int) -> float:
    import torch

    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def measure(name: str, make_step, iters: int) -> list[dict]:
    import torch

    rows = []
    for mode in ("eager", "compiled"):
        torch._dynamo.reset()
        step = make_step(compiled=mode == "compiled")
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        step()  # first call: compiles when compiled
        torch.cuda.synchronize()
        first_s = time.perf_counter() - t0
        for _ in range(3):
            step()
        ms = _ms(step, iters)
        rows.append({"workload": name, "mode": mode, "ms": round(ms, 3), "kernels": count_kernels(step),
                     "peak_mem_mib": round(torch.cuda.max_memory_allocated() / 2**20, 1),
                     "compile_s": round(first_s, 2) if mode == "compiled" else 0.0})
    rows[1]["speedup"] = round(rows[0]["ms"] / rows[1]["ms"], 2)
    return rows


def inference(batch: int):
    import torch
    import torchvision

    def make(compiled: bool):
        model = torchvision.models.resnet50().cuda().eval()
        x = torch.randn(batch, 3, 224, 224, device="cuda")
        f = torch.compile(model) if compiled else model

        def step():
            with torch.no_grad():
                f(x)
        return step
    return make


def training(batch: int):
    import torch
    import torchvision

    def make(compiled: bool):
        torch.manual_seed(0)
        model = torchvision.models.resnet18().cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x, y = torch.randn(batch, 3, 224, 224, device="cuda"), torch.randint(0, 1000, (batch,), device="cuda")
        f = torch.compile(model) if compiled else model

        def step():
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(f(x), y).backward()
            opt.step()
        return step
    return make


def markdown(rows: list[dict], device: str) -> str:
    out = [f"#### eager vs torch.compile on {device}", "",
           "| workload | mode | ms | kernels | peak MiB | compile s | speedup |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['workload']} | {r['mode']} | {r['ms']} | {r['kernels']} | {r['peak_mem_mib']} | "
                   f"{r['compile_s'] or ''} | {r.get('speedup', '')} |")
    return "\n".join(out) + "\n"


def main() -> int:
    import torch

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json")
    ap.add_argument("--md")
    args = ap.parse_args()
    torch.backends.cudnn.benchmark = True
    rows = (measure("resnet50 inference bs1", inference(1), 50) + measure("resnet50 inference bs64", inference(64), 20)
            + measure("resnet18 train step bs64", training(64), 20))
    device = torch.cuda.get_device_name(0)
    md = markdown(rows, f"{device}, torch {torch.__version__}")
    rep = {"device": device, "torch": torch.__version__, "rows": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rep, f, indent=2)
    if args.md:
        with open(args.md, "w") as f:
            f.write(md)
    print(md)
    print(json.dumps(rep))
    return 0


if __name__ == "__main__":
    sys.exit(main())
