"""Warm starts as a user waits for them: `docker run` of the image to its first correct compiled inference.

Both ways side by side in one run, each on a fresh volume (ResNet-50, batch 1, on the GPU):
  aot        GPUFORGE_AOT_PACKAGE (+ GPUFORGE_AOT_MODEL=warm_start:resnet50_bs1_model): the first start is served by
             torch.compile and builds the package in the background; the next ones load it
  artifacts  GPUFORGE_CACHE_ARTIFACTS (+ GPUFORGE_WARMUP=warm_start:resnet50_bs1): the first start compiles and saves
             the compile cache's artifacts; the next ones load them and compile from the cache
and, for the aot way, the same model with no package at all (GPUFORGE_WARMUP alone): what "the first start's mode is
ready as fast as with no package" is held to.

Each start is timed from just before `docker run` (this process's clock; the container shares it) to:
  first_correct_s  the first compiled output, checked against eager inside the start (warm_start.py's
                   first_correct_unix; a start whose output is off fails there, and here)
  mode_ready_s     the mode's first instruction (the mode prints its clock)
  run_s            `docker run` returning (the first aot start waits for its background build)
The ratio is cold (the way's first start) over the median of the warm starts; best, median and spread are printed.

  python3 tools/warm_bench.py --image IMAGE [--warm 5] [--baselines 2] [--ways aot,artifacts] [--overlap-ab]
                              [--json F] [--md F]

--overlap-ab: the aot way's warm starts alternate with ones run with GPUFORGE_WARM_OVERLAP=0 (no CUDA context or
hashing while torch is imported), so the overlap's gain is a ratio measured side by side.

--compile-mode max-autotune-no-cudagraphs [--model resnet50-bs64-bf16] [--cap S]: max-autotune paid once: every start
gets GPUFORGE_COMPILE_MODE, the cold one tunes (the aot way: serves by torch.compile in the mode, then builds the
package with the tuned kernels in the background), the warm ones load what it left on the volume. A start still
running after --cap seconds (600 by default) is stopped and reported as not finished in that time.

Runs where Docker and a GPU are (the GPU machine, through tools/gpu_carry.py measure warm). Bad input: exit 64.
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

MODE = ["sh", "-c", "echo MODE_READY $(date +%s.%N)"]
WAYS = {
    "aot": {"GPUFORGE_AOT_PACKAGE": "/cache/resnet50.pt2", "GPUFORGE_AOT_MODEL": "warm_start:resnet50_bs1_model"},
    "artifacts": {"GPUFORGE_CACHE_ARTIFACTS": "/cache/artifacts.bin", "GPUFORGE_WARMUP": "warm_start:resnet50_bs1"},
    "none": {"GPUFORGE_WARMUP": "warm_start:resnet50_bs1"},  # the aot way's baseline: compiled, no package
}


MODELS = {  # --model: the built-in model each way starts (warm_start.py's)
    "resnet50-bs1": {"aot": "warm_start:resnet50_bs1_model", "warmup": "warm_start:resnet50_bs1"},
    "resnet50-bs64-bf16": {"aot": "warm_start:resnet50_bs64_bf16_model", "warmup": "warm_start:resnet50_bs64_bf16"},
}
CAP = {"s": 600}  # a start's deadline (--cap)


def ways_for(model: str, compile_mode: str | None) -> dict:
    """WAYS with the model's built-ins and, when given, GPUFORGE_COMPILE_MODE in every start."""
    m = MODELS[model]
    mode = {"GPUFORGE_COMPILE_MODE": compile_mode} if compile_mode else {}
    return {"aot": {**WAYS["aot"], "GPUFORGE_AOT_MODEL": m["aot"], **mode},
            "artifacts": {**WAYS["artifacts"], "GPUFORGE_WARMUP": m["warmup"], **mode},
            "none": {"GPUFORGE_WARMUP": m["warmup"], **mode}}


def start(image: str, env: dict, volume: str, gpu: list[str]) -> dict:
    """One container start, timed from here; its warm-start report and the mode's clock read from its output. A start
    past the deadline is removed (killing `docker run` alone would leave the container running on the GPU)."""
    name = f"warm-bench-{os.getpid()}-{time.monotonic_ns()}"
    cmd = ["docker", "run", "--rm", "--name", name, "--network", "none", *gpu, "--shm-size", "2g", "-v", f"{volume}:/cache"]
    for k, v in env.items():
        cmd += ["-e", f"{k}={v}"]
    t0 = time.time()
    try:
        r = subprocess.run([*cmd, image, *MODE], capture_output=True, text=True, timeout=CAP["s"], check=False)
    except subprocess.TimeoutExpired:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, check=False)
        return {"rc": None, "run_s": round(time.time() - t0, 2), "mode_ready_s": None, "first_correct_s": None,
                "error": f"did not finish in {CAP['s']} s", "did_not_finish_s": CAP["s"]}
    run_s = time.time() - t0
    rep = next((json.loads(line) for line in r.stderr.splitlines() if line.startswith("{")), {})
    ready = next((float(line.split()[1]) for line in r.stdout.splitlines() if line.startswith("MODE_READY")), None)
    notes = [line for line in r.stderr.splitlines() if line.startswith("gpuforge:")]
    out = {"rc": r.returncode, "run_s": round(run_s, 2), "mode_ready_s": round(ready - t0, 2) if ready else None,
           "first_correct_s": round(rep["first_correct_unix"] - t0, 2) if rep.get("first_correct_unix") else None,
           "rel_err": rep.get("rel_err"), "aot": rep.get("aot"), "loaded": rep.get("loaded"), "notes": notes[-4:],
           "compile_mode": rep.get("compile_mode"), "report": {k: v for k, v in rep.items() if k.endswith("_s")}}
    built = next((ln for ln in notes if "built in the background in" in ln), None)
    if built:  # the background build's own line: "... built in the background in 212.3 s (...)"
        out["aot_build_s"] = float(built.split("built in the background in ")[1].split(" s")[0])
    if r.returncode != 0 or out["first_correct_s"] is None:
        out["error"] = (r.stderr or r.stdout)[-1500:]
    return out


def stats(xs: list[float]) -> dict:
    return {"best": min(xs), "median": round(statistics.median(xs), 2), "max": max(xs),
            "spread": round(max(xs) - min(xs), 2), "n": len(xs)}


def first_starts(image: str, n: int, gpu: list[str]) -> dict:
    """The first-start bar, side by side: n interleaved pairs, each in a fresh volume, of a start with no package
    configured and a first start with the package configured but not built yet (it serves by torch.compile and
    builds the package in the background). The mode's readiness of each: medians, spread, and their ratio."""
    none, first = [], []
    for _ in range(n):
        for runs, env in ((none, WAYS["none"]), (first, WAYS["aot"])):
            with tempfile.TemporaryDirectory(prefix="warm-first-") as vol:
                os.chmod(vol, 0o777)
                runs.append(start(image, env, vol, gpu))
    bad = [x["error"] for x in none + first if "error" in x]
    if bad:
        return {"error": bad[0], "no_package": none, "with_package": first}
    a, b = stats([x["mode_ready_s"] for x in first]), stats([x["mode_ready_s"] for x in none])
    return {"with_package_s": a, "no_package_s": b, "ratio_median": round(a["median"] / b["median"], 3),
            "no_package": none, "with_package": first}


def way(image: str, name: str, warm: int, gpu: list[str], overlap_ab: bool = False) -> dict:
    """The way's cold start, then its warm starts (none after a cold start that failed); with overlap_ab (aot), each
    warm start is followed by one with GPUFORGE_WARM_OVERLAP=0, interleaved so both see the same machine, and both
    medians are given."""
    ways = WAYS
    off: list = []
    with tempfile.TemporaryDirectory(prefix=f"warm-{name}-") as vol:
        os.chmod(vol, 0o777)  # the image's user (uid 1000) writes the package or artifacts there
        cold = start(image, ways[name], vol, gpu)
        warms = []
        for _ in range(warm if "error" not in cold else 0):
            warms.append(start(image, ways[name], vol, gpu))
            if overlap_ab:
                off.append(start(image, {**ways[name], "GPUFORGE_WARM_OVERLAP": "0"}, vol, gpu))
        files = sorted(os.listdir(vol))
    ok = [w for w in warms + off if "error" not in w]
    res = {"cold": cold, "warm": warms, "volume_files": files}
    if off:
        res["warm_overlap_off"] = off
    warms = warms + off  # every warm start must load and be correct; the ratio is the default's (overlap on)
    if "error" in cold or len(ok) != len(warms):
        res["error"] = cold.get("error") or next(w["error"] for w in warms if "error" in w)
        return res
    if name == "aot" and not all(w["aot"] == "loaded" for w in warms):
        res["error"] = f"a warm start did not load the package: {[w['aot'] for w in warms]}"
        return res
    warms = res["warm"]
    ws = stats([w["first_correct_s"] for w in warms])
    if off:
        wo = stats([w["first_correct_s"] for w in off])
        res.update(warm_overlap_off_first_correct=wo, overlap_gain_median=round(wo["median"] / ws["median"], 3))
    res.update(warm_first_correct=ws, warm_run=stats([w["run_s"] for w in warms]),
               ratio_median=round(cold["first_correct_s"] / ws["median"], 2),
               ratio_best=round(cold["first_correct_s"] / ws["best"], 2))
    return res


def cold_compile_s(cold: dict) -> float | None:
    """The cold start's compile (and its three checked calls): the warm-up's, or a package start's torch.compile."""
    rep = cold.get("report") or {}
    return rep.get("warmup_s", rep.get("compile_calls_s"))


def markdown(r: dict) -> str:
    lines = ["| way | start | first correct inference (s) | mode ready (s) | docker run (s) | rel err | warm start |",
             "|---|---|---|---|---|---|---|"]
    for name, w in r["ways"].items():
        rows = [("cold", w["cold"])] + [(f"warm {i + 1}", x) for i, x in enumerate(w.get("warm", []))] + \
            [(f"warm {i + 1}, overlap off", x) for i, x in enumerate(w.get("warm_overlap_off", []))]
        for label, x in rows:
            err = f"{x['rel_err']:.1e}" if isinstance(x.get("rel_err"), float) else ""
            lines.append(f"| {name} | {label} | {x['first_correct_s']} | {x['mode_ready_s']} | {x['run_s']} | {err} | "
                         f"{x.get('aot') or ('loaded' if x.get('loaded') else 'compiled')} |")
        if "warm_first_correct" in w:
            s = w["warm_first_correct"]
            lines.append(f"| {name} | **cold / warm** | **{w['ratio_median']}x** median ({w['ratio_best']}x best); warm "
                         f"median {s['median']} s, best {s['best']}, max {s['max']}, spread {s['spread']} (n={s['n']}) | | | | |")
        if "warm_overlap_off_first_correct" in w:
            s = w["warm_overlap_off_first_correct"]
            lines.append(f"| {name} | **overlap off** | warm median {s['median']} s, best {s['best']}, spread "
                         f"{s['spread']} (n={s['n']}): the overlap thread saves **{w['overlap_gain_median']}x** "
                         f"(median off / median on) | | | | |")
    if "first_start" in r:
        f = r["first_start"]
        lines.append(f"\nFirst start's mode ready: {f['with_package_s']} s with the package built in the background, "
                     f"{f['no_package_s']} s with no package (best of {f['baselines']}): {f['ratio']}x.")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--image", required=True)
    ap.add_argument("--warm", type=int, default=5, help="warm starts per way (>= 5 for a median)")
    ap.add_argument("--baselines", type=int, default=2, help="starts with no package (the aot way's first-start bar)")
    ap.add_argument("--ways", default="aot,artifacts")
    ap.add_argument("--gpu", default="nvidia.com/gpu=all", help="the CDI device to give")
    ap.add_argument("--overlap-ab", action="store_true",
                    help="aot: each warm start is also run with GPUFORGE_WARM_OVERLAP=0, interleaved")
    ap.add_argument("--first-starts", type=int, default=0,
                    help="only the first-start bar: this many interleaved pairs (no package / package built after)")
    ap.add_argument("--compile-mode", choices=["default", "max-autotune-no-cudagraphs"],
                    help="GPUFORGE_COMPILE_MODE for every start")
    ap.add_argument("--model", choices=list(MODELS), default="resnet50-bs1", help="the built-in model each way starts")
    ap.add_argument("--cap", type=int, default=600, help="seconds a start may take before it is stopped")
    ap.add_argument("--json")
    ap.add_argument("--md")
    args = ap.parse_args(argv)
    ways = args.ways.split(",")
    if not set(ways) <= {"aot", "artifacts"} or not 1 <= args.warm <= 20 or not 0 <= args.baselines <= 5 \
            or not 0 <= args.first_starts <= 9 or not 30 <= args.cap <= 3600:
        print("warm_bench: error: --ways from aot,artifacts; --warm 1..20; --baselines 0..5; --first-starts 0..9; "
              "--cap 30..3600", file=sys.stderr)
        return 64
    CAP["s"] = args.cap
    WAYS.update(ways_for(args.model, args.compile_mode))
    gpu = ["--device", args.gpu]
    if args.first_starts:
        r = {"image": args.image, "first_starts": first_starts(args.image, args.first_starts, gpu)}
        f = r["first_starts"]
        text = json.dumps({k: v for k, v in f.items() if k not in ("no_package", "with_package")}) if "error" not in f \
            else f"error: {f['error']}"
        print(f"warm_bench: first starts: {text}", flush=True)
        if args.json:
            with open(args.json, "w") as fh:
                json.dump(r, fh, indent=1)
        return 1 if "error" in f else 0
    r: dict = {"image": args.image, "ways": {}, "model": args.model, "compile_mode": args.compile_mode or "default",
               "cap_s": args.cap}
    if "aot" in ways and args.baselines:
        with tempfile.TemporaryDirectory(prefix="warm-none-") as vol:
            os.chmod(vol, 0o777)
            r["no_package"] = [start(args.image, WAYS["none"], vol, gpu) for _ in range(args.baselines)]
    for name in ways:
        r["ways"][name] = way(args.image, name, args.warm, gpu, overlap_ab=args.overlap_ab and name == "aot")
        print(f"warm_bench: {name}: {json.dumps({k: v for k, v in r['ways'][name].items() if k not in ('cold', 'warm')})}",
              flush=True)
    base = [b["mode_ready_s"] for b in r.get("no_package", []) if b.get("mode_ready_s")]
    first = r["ways"].get("aot", {}).get("cold", {}).get("mode_ready_s")
    if base and first:
        r["first_start"] = {"with_package_s": first, "no_package_s": min(base), "baselines": len(base),
                            "ratio": round(first / min(base), 3)}
    r["summary"] = {n: {k: w.get(k) for k in ("ratio_median", "ratio_best", "warm_first_correct", "overlap_gain_median",
                                              "error")}
                    | {"cold_first_correct_s": w["cold"].get("first_correct_s"), "cold_compile_s": cold_compile_s(w["cold"]),
                       "cold_aot_build_s": w["cold"].get("aot_build_s"), "cold_rel_err": w["cold"].get("rel_err"),
                       "warm_rel_err": [x.get("rel_err") for x in w.get("warm", [])]}
                    for n, w in r["ways"].items()} | {"first_start": r.get("first_start")}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(r, f, indent=1)
    md = markdown(r)
    if args.md:
        with open(args.md, "w") as f:
            f.write(md)
    print(md)
    return 0 if all("error" not in w for w in r["ways"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
