"""Warm starts: run by the entrypoint before any mode when the user asks for it.

  GPUFORGE_CACHE_ARTIFACTS=FILE   load torch.compile cache artifacts (torch.compiler.load_cache_artifacts) from FILE
                                  if it exists; after the warm-up, save them there if it does not (a volume file,
                                  so the next container's first compiled call is a cache hit)
  GPUFORGE_WARMUP=module:function run that function (it compiles and runs a few synced iterations) before serving
  GPUFORGE_COMPILE_CACHE=DIR      (set by the entrypoint) Inductor's and Triton's cache dir, on a volume

Prints one JSON line with the timings and Inductor's cache counters. Bad input: a one-line error, exit 64.
Also the perf table's time-to-first-compiled-inference probe (`--probe resnet50`).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import sys
import time

T_START = time.perf_counter()
SPEC = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$")


def fail(msg: str, code: int = 64) -> int:
    print(f"gpuforge: error: {msg}", file=sys.stderr)
    return code


def resnet50_bs1() -> None:
    """The built-in warm-up and the perf table's probe: ResNet-50, batch 1, compiled, 3 synced calls."""
    import torch
    import torchvision

    model = torchvision.models.resnet50().cuda().eval()
    x = torch.randn(1, 3, 224, 224, device="cuda")
    f = torch.compile(model)
    with torch.no_grad():
        for _ in range(3):
            f(x)
            torch.cuda.synchronize()


def _counters() -> dict:
    from torch._dynamo.utils import counters

    return {k: v for k, v in counters["inductor"].items() if "cache" in k}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--warmup", default=os.environ.get("GPUFORGE_WARMUP"), help="module:function")
    ap.add_argument("--artifacts", default=os.environ.get("GPUFORGE_CACHE_ARTIFACTS"), help="cache artifacts file")
    args = ap.parse_args(argv)
    if args.warmup and not SPEC.match(args.warmup):
        return fail(f"GPUFORGE_WARMUP={args.warmup!r}: use module:function (e.g. myapp.serve:warmup)")
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)  # the built-in warm-ups (warm_start:resnet50_bs1)
    sys.path.insert(0, os.getcwd())
    rep: dict = {"warmup": args.warmup, "artifacts": args.artifacts}
    import torch

    rep["import_s"] = round(time.perf_counter() - T_START, 3)
    if args.artifacts and os.path.exists(args.artifacts):
        t0 = time.perf_counter()
        try:
            with open(args.artifacts, "rb") as f:
                info = torch.compiler.load_cache_artifacts(f.read())
        except Exception as e:  # a stale or foreign file must not stop the container: warn, compile cold
            print(f"gpuforge: warning: could not load compile cache artifacts {args.artifacts}: {e}", file=sys.stderr)
        else:
            rep["loaded"] = True
            rep["load_s"] = round(time.perf_counter() - t0, 3)
            rep["loaded_info"] = str(info)[:300]
    fn = None
    if args.warmup:
        mod, _, name = args.warmup.partition(":")
        try:
            fn = getattr(importlib.import_module(mod), name)
        except (ImportError, AttributeError) as e:
            return fail(f"GPUFORGE_WARMUP={args.warmup}: {type(e).__name__}: {e}")
    if fn is not None:
        t0 = time.perf_counter()
        try:
            fn()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
        except Exception as e:
            return fail(f"warm-up {args.warmup} failed: {type(e).__name__}: {e}", 1)
        rep["warmup_s"] = round(time.perf_counter() - t0, 3)
        rep["first_ready_s"] = round(time.perf_counter() - T_START, 3)  # process start to warmed up
        if args.artifacts and not os.path.exists(args.artifacts):
            saved = torch.compiler.save_cache_artifacts()
            if saved:
                tmp = f"{args.artifacts}.tmp{os.getpid()}"
                with open(tmp, "wb") as f:
                    f.write(saved[0])
                os.replace(tmp, args.artifacts)  # never a half-written file for the next container
                rep["saved_bytes"] = len(saved[0])
    rep["inductor_cache"] = _counters()
    print(json.dumps(rep))
    print(f"gpuforge: warm start done ({json.dumps({k: rep[k] for k in rep if k.endswith('_s')})})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
