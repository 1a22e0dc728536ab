"""Eager vs torch.compile performance table: ResNet-50 inference (batch 1 and 64) and a ResNet-18
training step (batch 64). Milliseconds, kernel launches, peak memory and compile seconds, measured
side by side in one run; printed as Markdown and JSON.

Warm start: time to the first compiled ResNet-50 bs1 inference in two fresh processes, each with its own
empty Inductor cache, going through warm_start.py exactly as the entrypoint does: the cold one compiles and
saves the compile-cache artifacts, the warm one loads them first (a second container with the file on a volume).

  python perf_table.py [--json FILE] [--md FILE] [--no-warm-start]
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


def warm_start() -> dict:
    """Cold vs warm time-to-first-compiled-inference, two fresh processes through warm_start.py."""
    here = os.path.dirname(os.path.abspath(__file__))
    out: dict = {}
    with tempfile.TemporaryDirectory(prefix="gpuforge-warm-") as d:
        art = os.path.join(d, "artifacts.bin")
        for run in ("cold", "warm"):
            env = {**os.environ, "GPUFORGE_WARMUP": "warm_start:resnet50_bs1", "GPUFORGE_CACHE_ARTIFACTS": art,
                   "TORCHINDUCTOR_CACHE_DIR": os.path.join(d, f"inductor-{run}")}
            env.pop("TRITON_CACHE_DIR", None)
            t0 = time.perf_counter()
            r = subprocess.run([sys.executable, os.path.join(here, "warm_start.py")], env=env, capture_output=True,
                               text=True, timeout=900)
            wall = time.perf_counter() - t0
            if r.returncode != 0:
                return {"error": f"{run}: exit {r.returncode}: {r.stderr[-2000:]}"}
            out[run] = {**json.loads(r.stdout.strip().splitlines()[-1]), "process_wall_s": round(wall, 2)}
    c, w = out["cold"], out["warm"]
    out["ratio_first_ready"] = round(c["first_ready_s"] / w["first_ready_s"], 2)
    out["ratio_compile_and_first_call"] = round(c["warmup_s"] / (w["warmup_s"] + w.get("load_s", 0)), 2)
    return out


def warm_markdown(ws: dict) -> str:
    if "error" in ws:
        return f"\nwarm start: FAILED: {ws['error']}\n"
    c, w = ws["cold"], ws["warm"]
    return "\n".join([
        "", "#### warm start: time to first compiled inference, ResNet-50 bs1 (fresh process each, empty local cache)", "",
        "| run | import s | artifacts load s | compile + 3 calls s | process start to ready s | FX graph cache hit / miss |",
        "|---|---|---|---|---|---|",
        *(f"| {n} | {r['import_s']} | {r.get('load_s', '')} | {r['warmup_s']} | {r['first_ready_s']} | "
          f"{r['inductor_cache'].get('fxgraph_cache_hit', 0)} / {r['inductor_cache'].get('fxgraph_cache_miss', 0)} |"
          for n, r in (("cold (compiles, saves artifacts)", c), ("warm (loads artifacts)", w))),
        "", f"warm-start speedup: {ws['ratio_first_ready']}x process start to ready, "
        f"{ws['ratio_compile_and_first_call']}x compile + first calls (artifacts {c.get('saved_bytes', 0) / 2**20:.1f} MiB)", ""])


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
    ap.add_argument("--no-warm-start", action="store_true")
    args = ap.parse_args()
    ws = None if args.no_warm_start else warm_start()  # first: its own processes, an idle GPU
    torch.backends.cudnn.benchmark = True
    rows = (measure("resnet50 inference bs1", inference(1), 50) + measure("resnet50 inference bs64", inference(64), 20)
            + measure("resnet18 train step bs64", training(64), 20))
    device = torch.cuda.get_device_name(0)
    md = markdown(rows, f"{device}, torch {torch.__version__}") + (warm_markdown(ws) if ws else "")
    rep = {"device": device, "torch": torch.__version__, "rows": rows, "warm_start": ws}
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
