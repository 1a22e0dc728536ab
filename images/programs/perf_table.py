"""Eager vs torch.compile as users run it: each workload with the settings stated in its row (dtype, memory format,
cudnn.benchmark), in eager and the three compile modes users reach for:

  default                      torch.compile(model)
  reduce-overhead              CUDA graphs: the launch overhead of small batches goes
  max-autotune-no-cudagraphs   GEMM and convolution kernels chosen by benchmarking on this GPU; its compile is capped:
                               it runs first, in a process of its own, killed after --cap seconds ("did not finish in
                               N s"); the timed process then loads it from that process's Inductor cache

Each workload runs in a fresh process of its own (images/programs/perf_worker.py): every mode is built, its kernels
counted with torch.profiler (several sessions; a session can lose the kernels at its start, so a count is the
largest whole number per call, never a zero taken for a figure), then all modes are timed in alternating order
(A B C D, D C B A, ...: a clock or neighbour drift hits every mode alike), best of N trials with their coefficient of
variation. Per workload, the fastest mode is the recommendation, with its compile seconds and peak memory. Each seed
claim is judged under the settings the seed itself states (CLAIMS); a claim that does not hold under them says so.

Warm start (unless --no-warm-start): time to the first compiled ResNet-50 bs1 inference in two fresh processes
through warm_start.py, as the entrypoint runs it, for both ways (compile-cache artifacts, an AOTInductor package).

  python perf_table.py [--workloads K,K] [--modes M,M] [--cap S] [--trials N] [--json F] [--md F] [--no-warm-start]
  python perf_table.py --merge A.json B.json [--json F] [--md F]   (no GPU: the rows of several runs, judged again)

This process imports no torch: it starts the workers, kills a capped one with its compile workers, and judges.
Bad input: one line, exit 64.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
MODES = ("eager", "default", "reduce-overhead", "max-autotune-no-cudagraphs")
CAPPED = "max-autotune-no-cudagraphs"  # its compile alone may take many minutes: a process of its own, capped


@dataclass(frozen=True, kw_only=True)
class Workload:
    label: str
    task: str  # infer | train | fusion
    model: str = ""  # a torchvision model name
    batch: int = 1
    dtype: str = "fp32"  # fp32 | bf16 (weights and inputs) | bf16-autocast (fp32 weights, bf16 autocast)
    channels_last: bool = False
    cudnn_benchmark: bool = True
    iters: int = 10  # calls per timed trial

    def settings(self) -> str:
        shape = f"bs{self.batch}" if self.task != "fusion" else "64x512"
        fmt = "channels_last" if self.channels_last else "contiguous (NCHW)" if self.task != "fusion" else "contiguous"
        return (f"{shape}, {self.dtype}, {fmt}, cudnn.benchmark {'on' if self.cudnn_benchmark else 'off'}, "
                "TF32: convolutions on, matmul off (torch's defaults)")


WORKLOADS = {
    "resnet50-infer-bs1": Workload(label="ResNet-50 inference bs1", task="infer", model="resnet50", batch=1, iters=50),
    "resnet50-infer-bs64-bf16": Workload(label="ResNet-50 inference bs64 bf16", task="infer", model="resnet50",
                                         batch=64, dtype="bf16"),
    "resnet18-train-bs64": Workload(label="ResNet-18 train step bs64", task="train", model="resnet18", batch=64),
    "resnet18-train-bs64-bf16-cl": Workload(label="ResNet-18 train step bs64 bf16 autocast, channels_last",
                                            task="train", model="resnet18", batch=64, dtype="bf16-autocast",
                                            channels_last=True),
    "fusion": Workload(label="relu(x+1)*0.5", task="fusion", iters=200),
}

# What the project's seeds claimed, each judged under the settings the seed itself states (its workload and compile
# mode): a ratio is judged as a ratio (an A10's milliseconds are not this GPU's). "about" widens a stated cost.
CLAIMS = [
    {"id": "resnet18_train_speedup", "claim": "ResNet-18 training: compiled 1.50x eager",
     "workload": "resnet18-train-bs64", "mode": "default", "metric": "speedup", "want": 1.50},
    {"id": "resnet18_train_peak_mem", "claim": "ResNet-18 training: peak memory -23.5 %",
     "workload": "resnet18-train-bs64", "mode": "default", "metric": "peak_mem_cut", "want": 0.235},
    {"id": "resnet50_infer_bs1", "claim": 'ResNet-50 inference 18 -> 9 ms on an A10 (2.0x), mode="reduce-overhead"',
     "workload": "resnet50-infer-bs1", "mode": "reduce-overhead", "metric": "speedup", "want": 2.0},
    {"id": "max_autotune", "claim": "max-autotune: about 15 s more compile, then 12 % faster",
     "workload": "resnet50-infer-bs64-bf16", "mode": CAPPED, "metric": "autotune",
     "want": {"extra_compile_s": 15.0, "faster": 0.12, "about": 1.5}},
    {"id": "fusion_kernels", "claim": "relu(x+1)*0.5: 3 kernels -> 1", "workload": "fusion", "mode": "default",
     "metric": "kernels", "want": [3, 1]},
]


# --- pure parts (unit-tested without a GPU) -------------------------------------------------------------------

def spread(samples: list[float]) -> dict:
    """Best (minimum), median and coefficient of variation (population stdev / mean) of trial timings."""
    if not samples:
        msg = "no samples"
        raise ValueError(msg)
    mean = statistics.fmean(samples)
    cv = statistics.pstdev(samples) / mean if mean else 0.0
    return {"best": min(samples), "median": statistics.median(samples), "cv": cv, "n": len(samples)}


def interleaved_order(trials: int, modes=("eager", "compiled")) -> list[tuple[str, ...]]:
    """ABBA order over trials, for any number of modes: (A, B, C), (C, B, A), ... so none always goes first."""
    modes = tuple(modes)
    return [modes if t % 2 == 0 else modes[::-1] for t in range(trials)]


def settle_kernels(totals: list[int], calls: int) -> dict:
    """Kernels per call from profiler sessions of `calls` calls each. A session can lose the kernels at its start
    (CUPTI's buffers, more so after the GPU idled) but never adds any, so the count is the largest whole number per
    call a session gave; a session that saw none, or a total that is no whole multiple of the calls, is set aside."""
    per = [t // calls for t in totals if t > 0 and t % calls == 0]
    if not per:
        return {"error": f"the profiler saw {totals} kernels in {len(totals)} sessions of {calls} calls: no whole "
                         "count per call", "sessions": totals, "calls": calls}
    n = max(per)
    return {"kernels": n, "sessions": totals, "calls": calls, "agreeing": per.count(n)}


def recommend(rows: list[dict]) -> dict:
    """The fastest mode of one workload's rows (best ms), with what it costs: compile seconds and peak memory."""
    timed = [r for r in rows if r.get("ms") is not None]
    if not timed:
        return {"workload": rows[0]["workload"] if rows else "", "error": "no mode was timed"}
    best = min(timed, key=lambda r: r["ms"])
    eager = next((r for r in timed if r["mode"] == "eager"), None)
    out = {"workload": best["workload"], "label": best.get("label", ""), "mode": best["mode"], "ms": best["ms"],
           "speedup": round(eager["ms"] / best["ms"], 2) if eager else None, "compile_s": best.get("compile_s"),
           "peak_mem_mib": best.get("peak_mem_mib"), "kernels": best.get("kernels")}
    capped = [r for r in rows if r.get("did_not_finish_s")]
    if capped:
        out["note"] = ", ".join(f"{r['mode']} did not finish compiling in {r['did_not_finish_s']} s" for r in capped)
    return out


def _row(rows: list[dict], workload: str, mode: str) -> dict | None:
    return next((r for r in rows if r["workload"] == workload and r["mode"] == mode), None)


def judge_claim(c: dict, rows: list[dict]) -> dict:
    """A seed's claim under the seed's own settings: {measured, detail, verdict} (holds | does not hold | not
    measured); a mode that did not finish compiling under the cap does not hold, saying so."""
    row, eager = _row(rows, c["workload"], c["mode"]), _row(rows, c["workload"], "eager")
    under = f"{WORKLOADS[c['workload']].label if c['workload'] in WORKLOADS else c['workload']}, mode {c['mode']}"
    out = {**c, "judged_under": under, "measured": None, "detail": ""}
    if row is None or eager is None:
        return {**out, "verdict": "not measured", "detail": f"this run has no {under} row"}
    if row.get("did_not_finish_s"):
        return {**out, "verdict": "does not hold", "detail": f"{c['mode']} did not finish compiling in "
                f"{row['did_not_finish_s']} s"}
    if row.get("error") or eager.get("error"):
        return {**out, "verdict": "not measured", "detail": row.get("error") or eager.get("error")}
    m = c["metric"]
    if m == "speedup":
        got = round(eager["ms"] / row["ms"], 2)
        detail = f"{eager['ms']} -> {row['ms']} ms (CV {eager['cv']:.1%} / {row['cv']:.1%})"
        ok = got >= c["want"]
    elif m == "peak_mem_cut":
        got = round(1 - row["peak_mem_mib"] / eager["peak_mem_mib"], 3) if eager["peak_mem_mib"] else None
        detail, ok = f"{eager['peak_mem_mib']} -> {row['peak_mem_mib']} MiB", got is not None and got >= c["want"]
    elif m == "kernels":
        got = [eager.get("kernels"), row.get("kernels")]
        if None in got:
            return {**out, "verdict": "not measured", "detail": row.get("kernel_error") or eager.get("kernel_error")}
        detail, ok = f"{got[0]} -> {got[1]} kernels per call", got == c["want"]
    elif m == "autotune":
        default = _row(rows, c["workload"], "default")
        if default is None or default.get("ms") is None:
            return {**out, "verdict": "not measured", "detail": "no default-mode row to hold it to"}
        w = c["want"]
        extra, faster = round(row["compile_s"] - default["compile_s"], 1), round(1 - row["ms"] / default["ms"], 3)
        got = {"extra_compile_s": extra, "faster": faster}
        detail = (f"compile {default['compile_s']} -> {row['compile_s']} s (+{extra} s), {default['ms']} -> "
                  f"{row['ms']} ms ({faster:+.1%} vs default)")
        ok = extra <= w["extra_compile_s"] * w["about"] and faster >= w["faster"]
    else:
        msg = f"unknown metric {m!r}"
        raise ValueError(msg)
    return {**out, "measured": got, "detail": detail, "verdict": "holds" if ok else "does not hold"}


def claims_table(rows: list[dict]) -> list[dict]:
    return [judge_claim(c, rows) for c in CLAIMS]


def capped_run(argv: list[str], cap: float, env: dict | None = None) -> dict:
    """Run a worker with a deadline: its last stdout line (JSON), or {"did_not_finish_s": cap} when it ran past it,
    or {"error": ...}. It gets a session of its own, so at the deadline its whole group goes, Inductor's compile
    workers and autotuning processes included; output goes to files (a chatty compile never blocks on a pipe)."""
    with tempfile.TemporaryFile(mode="w+") as out, tempfile.TemporaryFile(mode="w+") as err:
        p = subprocess.Popen(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        try:
            p.wait(timeout=cap)
        except subprocess.TimeoutExpired:
            _kill_group(p)
            return {"did_not_finish_s": cap}
        finally:
            _kill_group(p)  # a finished worker's leftovers (compile workers) go too
        out.seek(0)
        err.seek(0)
        text, errs = out.read(), err.read()
    lines = text.strip().splitlines()
    try:
        got = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        got = None
    if p.returncode != 0 or not isinstance(got, dict):
        return {"error": f"exit {p.returncode}: {(errs + text)[-1500:]}"}
    return got


def _kill_group(p: subprocess.Popen) -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    p.wait()


# --- the run ----------------------------------------------------------------------------------------------------

def measure(key: str, modes: list[str], *, trials: int, cap: float, worker_cap: float) -> dict:
    """One workload: the capped mode's cold compile in a process of its own (when asked for), then every mode built,
    counted and timed in one fresh process. Returns {"rows": [...], "device", "torch", "inductor"} or {"error"}."""
    worker = [sys.executable, os.path.join(HERE, "perf_worker.py"), key]
    with tempfile.TemporaryDirectory(prefix=f"gpuforge-perf-{key}-") as d:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": os.path.join(d, "inductor"),
               "TRITON_CACHE_DIR": os.path.join(d, "triton")}
        capped = None
        if CAPPED in modes:
            t0 = time.perf_counter()
            capped = capped_run([*worker, "--compile-only", CAPPED], cap, env)
            capped["process_s"] = round(time.perf_counter() - t0, 1)
            print(f"perf_table: {key}: {CAPPED} cold compile: {json.dumps(capped)[:300]}", file=sys.stderr, flush=True)
        run = [m for m in modes if m != CAPPED or (capped and "compile_s" in capped)]
        got = capped_run([*worker, "--modes", ",".join(run), "--trials", str(trials)], worker_cap, env)
    if "did_not_finish_s" in got:
        got = {"error": f"the workload's process did not finish in {worker_cap} s"}
    if "error" in got:
        return {"error": got["error"], "rows": [{"workload": key, "label": WORKLOADS[key].label, "mode": m,
                                                 "settings": WORKLOADS[key].settings(), "error": got["error"]}
                                                for m in modes]}
    rows = got["rows"]
    if capped is not None:
        row = _row(rows, key, CAPPED)
        if row is not None:  # its compile is the cold one; the timed process loaded it from that one's cache
            row["warm_load_s"] = row.get("compile_s")
            row["compile_s"] = capped["compile_s"]
        else:
            rows.append({"workload": key, "label": WORKLOADS[key].label, "mode": CAPPED,
                         "settings": WORKLOADS[key].settings(), **({"did_not_finish_s": cap} if "did_not_finish_s"
                                                                    in capped else {"error": capped.get("error")})})
    eager = _row(rows, key, "eager")
    for r in rows:
        if eager and r.get("ms") and eager.get("ms"):
            r["speedup"] = round(eager["ms"] / r["ms"], 2)
    rows.sort(key=lambda r: MODES.index(r["mode"]))
    return {**got, "rows": rows}


WARM_WAYS = {
    "artifacts": lambda d: {"GPUFORGE_WARMUP": "warm_start:resnet50_bs1",
                            "GPUFORGE_CACHE_ARTIFACTS": os.path.join(d, "artifacts.bin")},
    "aot_package": lambda d: {"GPUFORGE_AOT_MODEL": "warm_start:resnet50_bs1_model",
                              "GPUFORGE_AOT_PACKAGE": os.path.join(d, "resnet50.pt2")},
}


def warm_start(way: str) -> dict:
    """Cold vs warm time-to-first-compiled-inference, two fresh processes through warm_start.py."""
    out: dict = {}
    with tempfile.TemporaryDirectory(prefix="gpuforge-warm-") as d:
        for run in ("cold", "warm"):
            env = {**os.environ, **WARM_WAYS[way](d), "TORCHINDUCTOR_CACHE_DIR": os.path.join(d, f"inductor-{run}")}
            env.pop("TRITON_CACHE_DIR", None)
            t0 = time.perf_counter()
            r = subprocess.run([sys.executable, os.path.join(HERE, "warm_start.py")], env=env, capture_output=True,
                               text=True, timeout=900)
            wall = time.perf_counter() - t0
            if r.returncode != 0:
                return {"error": f"{way} {run}: exit {r.returncode}: {r.stderr[-2000:]}"}
            out[run] = {**json.loads(r.stdout.strip().splitlines()[-1]), "process_wall_s": round(wall, 2)}
    c, w = out["cold"], out["warm"]
    out["ratio_first_ready"] = round(c["first_ready_s"] / w["first_ready_s"], 2)
    out["ratio_process_wall"] = round(c["process_wall_s"] / w["process_wall_s"], 2)
    return out


# --- the table ----------------------------------------------------------------------------------------------------

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


def _cell(r: dict) -> str:
    if r.get("did_not_finish_s"):
        return f"did not finish compiling in {r['did_not_finish_s']} s | | | | | | |"
    if r.get("error"):
        return f"FAILED: {str(r['error'])[-200:]!r} | | | | | | |"
    kernels = r.get("kernels") if r.get("kernels") is not None else f"FAILED: {r.get('kernel_error', '')[:80]}"
    compile_s = r.get("compile_s")
    shown = "" if compile_s is None else f"{compile_s}" + (f" (warm {r['warm_load_s']})" if "warm_load_s" in r else "")
    return (f"{r['ms']} | {r['median_ms']} | {r['cv']:.1%} | {r['trials']} x {r['iters']} | {kernels} | "
            f"{r['peak_mem_mib']} | {shown}")


def markdown(rows: list[dict], recs: list[dict], claims: list[dict], device: str, inductor: dict | None = None) -> str:
    tuned = ("" if not inductor else f"{CAPPED} tunes here: GEMM backends {inductor.get('max_autotune_gemm_backends')}, "
             f"convolution backends {inductor.get('max_autotune_conv_backends')}, search space "
             f"{inductor.get('max_autotune_gemm_search_space')}, coordinate descent on (the mode turns it on); its "
             "compile s is its cold compile in a process of its own (warm: loaded from that one's cache).")
    out = [f"#### eager vs torch.compile on {device} (best of N trials, CV over the trials, every mode of a workload "
           "timed in alternating order)", "", *([tuned, ""] if tuned else []),
           "| workload | settings | mode | best ms | median ms | CV | trials x iters | kernels per call | peak MiB | "
           "compile s | speedup |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r.get('label', r['workload'])} | {r.get('settings', '')} | {r['mode']} | {_cell(r)} | "
                   f"{r.get('speedup', '')} |")
    out += ["", "#### the recommendation per workload (the fastest mode)", "",
            "| workload | mode | ms | vs eager | compile s | peak MiB | kernels | note |", "|---|---|---|---|---|---|---|---|"]
    for c in recs:
        if "error" in c:
            out.append(f"| {c['workload']} | {c['error']} | | | | | | |")
            continue
        out.append(f"| {c['label'] or c['workload']} | **{c['mode']}** | {c['ms']} | {c['speedup']}x | "
                   f"{c['compile_s'] if c['compile_s'] is not None else ''} | {c['peak_mem_mib']} | {c['kernels']} | "
                   f"{c.get('note', '')} |")
    out += ["", "#### the seeds' claims, each under the settings the seed states", "",
            "| claim | judged under | measured | detail | verdict |", "|---|---|---|---|---|"]
    for c in claims:
        m = c["measured"]
        shown = ("" if m is None else f"{m:.1%}" if c["metric"] == "peak_mem_cut" else
                 f"{m}x" if c["metric"] == "speedup" else json.dumps(m))
        out.append(f"| {c['claim']} | {c['judged_under']} | {shown} | {c['detail']} | **{c['verdict']}** |")
    return "\n".join(out) + "\n"


def table(parts: list[dict]) -> dict:
    """One report from workload results (or earlier reports, --merge): rows, recommendations, claims."""
    rows: list[dict] = []
    for p in parts:
        keys = {r["workload"] for r in p["rows"]}
        rows = [r for r in rows if r["workload"] not in keys] + p["rows"]  # a later run of a workload wins
    order = list(WORKLOADS)
    rows.sort(key=lambda r: (order.index(r["workload"]) if r["workload"] in order else len(order),
                             MODES.index(r["mode"]) if r["mode"] in MODES else len(MODES)))
    recs = [recommend([r for r in rows if r["workload"] == k]) for k in dict.fromkeys(r["workload"] for r in rows)]
    meta = next((p for p in parts if p.get("device")), {})
    return {"device": meta.get("device"), "torch": meta.get("torch"), "inductor": meta.get("inductor"), "rows": rows,
            "recommendations": recs, "claims": claims_table(rows)}


def _load(path: str) -> dict:
    with open(path) as f:
        rep = json.load(f)
    if not isinstance(rep, dict) or not isinstance(rep["rows"], list):
        msg = f"{path} is not a perf table report"
        raise ValueError(msg)
    return rep


def _write(rep: dict, md: str, args) -> None:
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rep, f, indent=2)
    if args.md:
        with open(args.md, "w") as f:
            f.write(md)
    print(md)
    print(json.dumps(rep))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json")
    ap.add_argument("--md")
    ap.add_argument("--no-warm-start", action="store_true")
    ap.add_argument("--trials", type=int, default=7)
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help=f"from {', '.join(WORKLOADS)}")
    ap.add_argument("--modes", default=",".join(MODES), help=f"from {', '.join(MODES)} (eager always runs)")
    ap.add_argument("--cap", type=float, default=300, help=f"seconds {CAPPED}'s cold compile may take (default 300)")
    ap.add_argument("--worker-cap", type=float, default=900, help="seconds a workload's timed process may take")
    ap.add_argument("--merge", nargs="+", metavar="REPORT", help="earlier --json reports: one table, claims judged again")
    args = ap.parse_args(argv)
    if args.merge:
        try:
            parts = [_load(p) for p in args.merge]
        except (OSError, ValueError, KeyError) as e:
            print(f"perf_table: error: --merge: {e}", file=sys.stderr)
            return 64
        devices = {p.get("device") for p in parts}
        if len(devices) != 1:
            print(f"perf_table: error: --merge: the reports are of different GPUs ({', '.join(map(str, devices))})",
                  file=sys.stderr)
            return 64
        rep = table(parts)
        rep["merged"] = args.merge
        _write(rep, markdown(rep["rows"], rep["recommendations"], rep["claims"], f"{rep['device']}, torch {rep['torch']}",
                             rep.get("inductor")), args)
        return 0
    keys, modes = args.workloads.split(","), ["eager", *(m for m in args.modes.split(",") if m != "eager")]
    bad = [k for k in keys if k not in WORKLOADS] + [m for m in modes if m not in MODES]
    if bad or not 2 <= args.trials <= 100 or not 1 <= args.cap <= 3600:
        print(f"perf_table: error: {'unknown ' + ', '.join(bad) if bad else '--trials 2..100, --cap 1..3600'}; "
              f"workloads {', '.join(WORKLOADS)}; modes {', '.join(MODES)}", file=sys.stderr)
        return 64
    # first: their own processes, an idle GPU
    ws = None if args.no_warm_start else {way: warm_start(way) for way in WARM_WAYS}
    parts = []
    for key in keys:
        t0 = time.perf_counter()
        parts.append(measure(key, modes, trials=args.trials, cap=args.cap, worker_cap=args.worker_cap))
        print(f"perf_table: {key}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    rep = table(parts)
    rep.update(warm_start=ws, workloads={k: {**asdict(WORKLOADS[k]), "settings": WORKLOADS[k].settings()} for k in keys},
               cap_s=args.cap)
    md = markdown(rep["rows"], rep["recommendations"], rep["claims"], f"{rep['device']}, torch {rep['torch']}",
                  rep.get("inductor"))
    _write(rep, md + (warm_markdown(ws) if ws else ""), args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
