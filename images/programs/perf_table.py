"""Eager vs torch.compile performance table: ResNet-50 inference (batch 1 and 64) and a ResNet-18
training step (batch 64). Milliseconds (best of N trials, with the coefficient of variation over the
trials), kernel launches, peak memory and compile seconds; eager and compiled are built first, then timed
in alternating trials (eager, compiled, compiled, eager, ...) so a clock or neighbour drift hits both alike.
The seeds' claims are columns of their own, each with a verdict. Printed as Markdown and JSON.

Warm start: time to the first compiled ResNet-50 bs1 inference in two fresh processes, each with its own
empty Inductor cache, going through warm_start.py exactly as the entrypoint does, for each way a start can
be made warm: compile-cache artifacts (GPUFORGE_CACHE_ARTIFACTS) and an AOTInductor package
(GPUFORGE_AOT_PACKAGE); the cold one makes the file, the warm one (a second container with the file on a
volume) uses it.

  python perf_table.py [--json FILE] [--md FILE] [--no-warm-start] [--trials N]
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
from gpu_smoke import count_kernels, fused

# What the project's seeds claimed, each judged against this run's figures (a ratio is judged as a ratio:
# the A10's absolute milliseconds are not this GPU's).
CLAIMS = [
    {"id": "resnet18_train_speedup", "claim": "ResNet-18 training: compiled 1.50x eager", "workload": "resnet18 train step bs64",
     "metric": "speedup", "want": 1.50, "better": "higher"},
    {"id": "resnet18_train_peak_mem", "claim": "ResNet-18 training: peak memory -23.5 %", "workload": "resnet18 train step bs64",
     "metric": "peak_mem_cut", "want": 0.235, "better": "higher"},
    {"id": "resnet50_infer_bs1", "claim": "ResNet-50 inference 18 -> 9 ms on an A10 (2.0x), at bs1",
     "workload": "resnet50 inference bs1", "metric": "speedup", "want": 2.0, "better": "higher"},
    {"id": "resnet50_infer_bs64", "claim": "ResNet-50 inference 18 -> 9 ms on an A10 (2.0x), at bs64",
     "workload": "resnet50 inference bs64", "metric": "speedup", "want": 2.0, "better": "higher"},
    {"id": "fusion_kernels", "claim": "relu(x+1)*0.5: 3 kernels -> 1", "workload": "fusion relu(x+1)*0.5",
     "metric": "kernels", "want": [3, 1], "better": "equal"},
]


def spread(samples: list[float]) -> dict:
    """Best (minimum), median and coefficient of variation (population stdev / mean) of trial timings."""
    if not samples:
        msg = "no samples"
        raise ValueError(msg)
    mean = statistics.fmean(samples)
    cv = statistics.pstdev(samples) / mean if mean else 0.0
    return {"best": min(samples), "median": statistics.median(samples), "cv": cv, "n": len(samples)}


def interleaved_order(trials: int) -> list[tuple[str, str]]:
    """ABBA order over trials: (eager, compiled), (compiled, eager), ... so neither always goes first."""
    return [("eager", "compiled") if t % 2 == 0 else ("compiled", "eager") for t in range(trials)]


def judge(claim: dict, measured) -> str:
    if measured is None:
        return "not measured"
    if claim["better"] == "equal":
        return "holds" if measured == claim["want"] else "does not hold"
    return "holds" if measured >= claim["want"] else "does not hold"


def claims_table(rows: list[dict], fusion: dict | None) -> list[dict]:
    by = {}
    for r in rows:
        by.setdefault(r["workload"], {})[r["mode"]] = r
    out = []
    for c in CLAIMS:
        measured, detail = None, ""
        pair = by.get(c["workload"], {})
        if c["metric"] == "speedup" and "compiled" in pair:
            measured = pair["compiled"]["speedup"]
            detail = (f"{pair['eager']['ms']} -> {pair['compiled']['ms']} ms (CV {pair['eager']['cv']:.1%} / "
                      f"{pair['compiled']['cv']:.1%})")
        elif c["metric"] == "peak_mem_cut" and "compiled" in pair:
            e, k = pair["eager"]["peak_mem_mib"], pair["compiled"]["peak_mem_mib"]
            measured = round(1 - k / e, 3) if e else None
            detail = f"{e} -> {k} MiB"
        elif c["metric"] == "kernels" and fusion:
            counts = [fusion["eager_kernels"], fusion["compiled_kernels"]]
            detail = f"{counts[0]} -> {counts[1]} kernels"
            # eager relu(x+1)*0.5 cannot run in no kernel: a zero is the profiler seeing nothing (torch 2.7.1 in a
            # process that profiled before, on the H200), not a measurement
            measured = counts if counts[0] > 0 else None
            detail += "" if counts[0] > 0 else " (the profiler saw no CUDA kernel: not counted)"
        out.append({**c, "measured": measured, "detail": detail, "verdict": judge(c, measured)})
    return out


def _ms(fn, iters: int) -> float:
    """Milliseconds per call: CUDA events around `iters` back-to-back calls (one trial of speed.timed_trials)."""
    import speed  # beside this program

    return speed.timed_trials(fn, trials=1, inner=iters, warm_s=0)[0]


def measure(name: str, make_step, iters: int, trials: int) -> list[dict]:
    import torch

    steps, rows = {}, {}
    for mode in ("eager", "compiled"):
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()  # the other mode's model stays alive: count only this one's
        step = make_step(compiled=mode == "compiled")
        t0 = time.perf_counter()
        step()  # first call: compiles when compiled
        torch.cuda.synchronize()
        first_s = time.perf_counter() - t0
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        # the steady-state peak of one step (weights, optimizer state and activations of this mode), not the
        # first call's: that one holds cuDNN's benchmark workspaces and, compiled, the compile's own tensors
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        rows[mode] = {"workload": name, "mode": mode, "kernels": count_kernels(step),
                      "peak_mem_mib": round((torch.cuda.max_memory_allocated() - base) / 2**20, 1),
                      "compile_s": round(first_s, 2) if mode == "compiled" else 0.0}
        steps[mode] = step
    samples: dict = {"eager": [], "compiled": []}
    for pair in interleaved_order(trials):
        for mode in pair:
            samples[mode].append(_ms(steps[mode], iters))
    for mode, row in rows.items():
        sp = spread(samples[mode])
        row.update(ms=round(sp["best"], 3), median_ms=round(sp["median"], 3), cv=round(sp["cv"], 4), trials=sp["n"],
                   iters=iters)
    rows["compiled"]["speedup"] = round(rows["eager"]["ms"] / rows["compiled"]["ms"], 2)
    return [rows["eager"], rows["compiled"]]


def fusion_counts() -> dict:
    import torch

    x = torch.randn(1 << 20, device="cuda")
    torch._dynamo.reset()
    cf = torch.compile(fused)
    cf(x)
    return {"eager_kernels": count_kernels(lambda: fused(x)), "compiled_kernels": count_kernels(lambda: cf(x))}


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


WARM_WAYS = {
    "artifacts": lambda d: {"GPUFORGE_WARMUP": "warm_start:resnet50_bs1",
                            "GPUFORGE_CACHE_ARTIFACTS": os.path.join(d, "artifacts.bin")},
    "aot_package": lambda d: {"GPUFORGE_AOT_MODEL": "warm_start:resnet50_bs1_model",
                              "GPUFORGE_AOT_PACKAGE": os.path.join(d, "resnet50.pt2")},
}


def warm_start(way: str) -> dict:
    """Cold vs warm time-to-first-compiled-inference, two fresh processes through warm_start.py."""
    here = os.path.dirname(os.path.abspath(__file__))
    out: dict = {}
    with tempfile.TemporaryDirectory(prefix="gpuforge-warm-") as d:
        for run in ("cold", "warm"):
            env = {**os.environ, **WARM_WAYS[way](d), "TORCHINDUCTOR_CACHE_DIR": os.path.join(d, f"inductor-{run}")}
            env.pop("TRITON_CACHE_DIR", None)
            t0 = time.perf_counter()
            r = subprocess.run([sys.executable, os.path.join(here, "warm_start.py")], env=env, capture_output=True,
                               text=True, timeout=900)
            wall = time.perf_counter() - t0
            if r.returncode != 0:
                return {"error": f"{way} {run}: exit {r.returncode}: {r.stderr[-2000:]}"}
            out[run] = {**json.loads(r.stdout.strip().splitlines()[-1]), "process_wall_s": round(wall, 2)}
    c, w = out["cold"], out["warm"]
    out["ratio_first_ready"] = round(c["first_ready_s"] / w["first_ready_s"], 2)
    out["ratio_process_wall"] = round(c["process_wall_s"] / w["process_wall_s"], 2)
    return out


def warm_markdown(all_ws: dict) -> str:
    out = ["", "#### warm start: time to first compiled inference, ResNet-50 bs1 (fresh process each, empty local cache)",
           "", "| way | run | import s | load s | compile / calls s | process start to ready s | process wall s | "
           "FX graph cache hit / miss | note |", "|---|---|---|---|---|---|---|---|---|"]
    for way, ws in all_ws.items():
        if "error" in ws:
            out.append(f"| {way} | FAILED | | | | | | | {ws['error'][-300:]!r} |")
            continue
        for n in ("cold", "warm"):
            r = ws[n]
            load = r.get("load_s", r.get("aot_load_s", ""))
            work = r.get("warmup_s", r.get("compile_calls_s", r.get("aot_calls_s", "")))
            note = r.get("aot", "") + (f"; package built in {r['aot_build_s']} s" if "aot_build_s" in r else "")
            out.append(f"| {way} | {n} | {r['import_s']} | {load} | {work} | {r['first_ready_s']} | {r['process_wall_s']} | "
                       f"{r['inductor_cache'].get('fxgraph_cache_hit', 0)} / {r['inductor_cache'].get('fxgraph_cache_miss', 0)} "
                       f"| {note} |")
        out.append(f"| {way} | **ratio** | | | | **{ws['ratio_first_ready']}x** | {ws['ratio_process_wall']}x | | |")
    return "\n".join(out) + "\n"


def markdown(rows: list[dict], claims: list[dict], device: str) -> str:
    out = [f"#### eager vs torch.compile on {device} (best of N trials, CV over the trials, eager/compiled alternating)",
           "", "| workload | mode | best ms | median ms | CV | trials x iters | kernels | peak MiB | compile s | speedup |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['workload']} | {r['mode']} | {r['ms']} | {r['median_ms']} | {r['cv']:.1%} | "
                   f"{r['trials']} x {r['iters']} | {r['kernels']} | {r['peak_mem_mib']} | {r['compile_s'] or ''} | "
                   f"{r.get('speedup', '')} |")
    out += ["", "#### the seeds' claims", "", "| claim | measured here | detail | verdict |", "|---|---|---|---|"]
    for c in claims:
        m = c["measured"]
        shown = f"{m:.1%}" if c["metric"] == "peak_mem_cut" and m is not None else (
            f"{m}x" if c["metric"] == "speedup" and m is not None else str(m))
        out.append(f"| {c['claim']} | {shown} | {c['detail']} | **{c['verdict']}** |")
    return "\n".join(out) + "\n"


def main() -> int:
    import torch

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json")
    ap.add_argument("--md")
    ap.add_argument("--no-warm-start", action="store_true")
    ap.add_argument("--trials", type=int, default=7)
    args = ap.parse_args()
    if not 2 <= args.trials <= 100:
        print("perf_table: error: --trials must be 2..100", file=sys.stderr)
        return 64
    # first: their own processes, an idle GPU
    ws = None if args.no_warm_start else {way: warm_start(way) for way in WARM_WAYS}
    torch.backends.cudnn.benchmark = True
    n = args.trials
    rows = (measure("resnet50 inference bs1", inference(1), 50, n) + measure("resnet50 inference bs64", inference(64), 10, n)
            + measure("resnet18 train step bs64", training(64), 10, n))
    fusion = fusion_counts()
    claims = claims_table(rows, fusion)
    device = torch.cuda.get_device_name(0)
    md = markdown(rows, claims, f"{device}, torch {torch.__version__}") + (warm_markdown(ws) if ws else "")
    rep = {"device": device, "torch": torch.__version__, "rows": rows, "claims": claims, "fusion": fusion, "warm_start": ws}
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
