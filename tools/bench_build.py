"""Build benchmark, measured side by side in one run (nox -s bench [-- --cold]):

1. gpuforge's build of the default target vs a plain `docker build` of the same generated Dockerfile,
   from the same cache state (warm: everything cached; --cold: `docker builder prune -af` before each).
2. The warm rebuild after an entrypoint-only change.
Goals: ratio <= 1.05 (cold), warm entrypoint rebuild <= 15 s.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpuforge import build, engine, paths, render
from gpuforge.matrix import load_matrix


def plain_build(driver: engine.Driver, root: Path, target_id: str, ca: str | None) -> float:
    argv = [driver.client, *(["buildx", "build", "--load"] if driver.name == "buildx" else ["build"]),
            "--progress=plain", "-t", "gpuforge-bench/plain:latest", "-f", str(root / "images" / "dist" / target_id / "Dockerfile")]
    if ca:
        argv += ["--secret", f"id=ca,src={ca}"]
    t0 = time.monotonic()
    subprocess.run([*argv, str(root)], check=True, capture_output=True, env={**os.environ, "DOCKER_BUILDKIT": "1"})
    return time.monotonic() - t0


def gpuforge_build(t, ctx_root: Path | None, ca: str | None, logs: Path) -> float:
    t0 = time.monotonic()
    build.build_targets([t], build.BuildOptions(context_root=ctx_root, extra_ca=ca, progress="plain", log_dir=logs))
    return time.monotonic() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--cold", action="store_true", help="prune the build cache before every build (slow: real downloads)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--extra-ca", default=os.environ.get("GPUFORGE_EXTRA_CA", "/etc/ssl/certs/ca-certificates.crt"))
    args = ap.parse_args()
    ca = args.extra_ca if Path(args.extra_ca).is_file() else None
    t = load_matrix().select(None)[0]
    bench_t = dataclasses.replace(t, tags=("gpuforge-bench/gpuforge:latest",))
    driver = engine.choose_driver()
    logs = Path(tempfile.mkdtemp(prefix="gpuforge-bench-"))
    sys.stdout = open(os.devnull, "w")  # quiet the builds; the figures are printed after stdout is restored
    gpuforge_build(bench_t, None, ca, logs)  # the cache state both sides start from
    ours, plain = [], []
    for _ in range(args.rounds):
        for side, fn in (("gpuforge", lambda: gpuforge_build(bench_t, None, ca, logs)),
                         ("plain", lambda: plain_build(driver, paths.project_root(), t.id, ca))):
            if args.cold:
                subprocess.run([driver.client, "builder", "prune", "-af"], check=True, capture_output=True)
            (ours if side == "gpuforge" else plain).append(fn())
    with tempfile.TemporaryDirectory() as tmp:
        ctx = render.copy_context(Path(tmp))
        render.write(t, ctx / "images" / "dist")
        with (ctx / "images" / "context" / "entrypoint.sh").open("a") as f:
            f.write(f"# bench {time.time()}\n")
        rebuild = gpuforge_build(bench_t, ctx, ca, logs)
    sys.stdout = sys.__stdout__
    mo, mp = statistics.median(ours), statistics.median(plain)
    state = "cold (cache pruned before each)" if args.cold else "warm (all layers cached)"
    print(f"driver: {driver.describe()}")
    print(f"default target {t.id}, {state}, {args.rounds} rounds each, interleaved")
    print(f"  gpuforge build     median {mo:7.2f} s  runs {[round(x, 2) for x in ours]}")
    print(f"  plain docker build median {mp:7.2f} s  runs {[round(x, 2) for x in plain]}")
    print(f"  ratio gpuforge/plain: {mo / mp:.3f}  (goal <= 1.05; overhead {mo - mp:+.2f} s)")
    print(f"  warm rebuild after an entrypoint-only change: {rebuild:.2f} s  (goal <= 15 s)")
    for tag in ("gpuforge-bench/gpuforge:latest", "gpuforge-bench/plain:latest"):
        subprocess.run([driver.client, "rmi", tag], capture_output=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
