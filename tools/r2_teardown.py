"""Reproduce and locate the readiness probe's crash after its verdict, on a GPU node, inside the shipped image.

`selftest --level r2` has printed `READY r2: ...` and then died with a glibc heap abort (exit 134) on a healthy H100.
This runs the image's own probe (/opt/gpuforge/programs/gpu_smoke.py --level r2) N times in fresh processes of one
container, P at a time, each with Python's faulthandler on (a SIGABRT then prints every thread's Python stack and
whether the interpreter was finalizing), under variants that each take one suspect away:

  shipped       the probe as the entrypoint runs it (a supervised image: its supervisor and child)
  in-process    the measuring work in one process, then the interpreter's own teardown
  exit-now      the same work, then os._exit right after the verdict (no interpreter teardown)
  one-thread    in-process with TORCHINDUCTOR_COMPILE_THREADS=1 (no compile worker pool to tear down)

Run in a container of the image (a diagnosis aid, not a validator):
  docker run --rm --device nvidia.com/gpu=all -v $PWD/tools:/diag:ro -v OUT:/out IMAGE \
      /opt/venv/bin/python /diag/r2_teardown.py --runs 24 --parallel 4 --out /out
Writes OUT/r2-teardown.json (each run's exit, verdict line and last stderr lines) and prints one line per variant.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import time

PROBE = "/opt/gpuforge/programs/gpu_smoke.py"
# The measuring work in this process, then the interpreter's own exit: where the crash was seen. A supervised probe
# (gpu_smoke.ready_report) measures in a child that leaves with os._exit, so it is called directly; an older image's
# gpu_smoke.main measured in-process.
IN_PROCESS = (
    "import argparse, os, sys; sys.path.insert(0, os.path.dirname({probe!r})); import gpu_smoke\n"
    "if hasattr(gpu_smoke, 'ready_report'):\n"
    "    r = gpu_smoke.ready_report(argparse.Namespace(level='r2', cuda=None, bars=None, strict=False, gpus=None))\n"
    "    print('gpuforge selftest r2: ' + r['verdict'], file=sys.stderr); code = r['exit']\n"
    "else:\n"
    "    code = gpu_smoke.main(['--level', 'r2'])\n"
    "sys.stdout.flush(); sys.stderr.flush()\n"
)
VARIANTS = {
    "shipped": ([sys.executable, "-X", "faulthandler", PROBE, "--level", "r2"], {}),
    "in-process": ([sys.executable, "-X", "faulthandler", "-c", IN_PROCESS.format(probe=PROBE) + "sys.exit(code)"], {}),
    "exit-now": ([sys.executable, "-X", "faulthandler", "-c", IN_PROCESS.format(probe=PROBE) + "os._exit(code)"], {}),
    "one-thread": ([sys.executable, "-X", "faulthandler", "-c", IN_PROCESS.format(probe=PROBE) + "sys.exit(code)"],
                   {"TORCHINDUCTOR_COMPILE_THREADS": "1"}),
}


def one(variant: str, i: int) -> dict:
    argv, extra = VARIANTS[variant]
    t0 = time.perf_counter()
    r = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, **extra}, timeout=600, check=False)
    lines = r.stderr.splitlines()
    verdict = next((ln for ln in reversed(lines) if ln.startswith("gpuforge selftest r2: ") and ": ok:" not in ln
                    and "FAILED (" not in ln), "")
    crashed = r.returncode < 0 or r.returncode == 134
    return {"variant": variant, "run": i, "exit": r.returncode, "verdict": verdict, "crashed": crashed,
            "seconds": round(time.perf_counter() - t0, 1),
            "tail": lines[-60:] if crashed else lines[-3:]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=24)
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--variants", default="shipped,in-process,exit-now,one-thread")
    ap.add_argument("--out", default="/out")
    a = ap.parse_args()
    results = []
    for v in a.variants.split(","):
        with concurrent.futures.ThreadPoolExecutor(a.parallel) as pool:
            got = list(pool.map(lambda i, v=v: one(v, i), range(a.runs)))
        results += got
        crashes = [g for g in got if g["crashed"]]
        print(f"r2_teardown {v}: {len(crashes)} of {len(got)} crashed; exits {sorted({g['exit'] for g in got})}; "
              f"verdicts {sorted({g['verdict'][:60] for g in got})}", flush=True)
        with open(os.path.join(a.out, "r2-teardown.json"), "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
