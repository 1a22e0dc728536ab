"""Pull benchmark, side by side in one run: the default image with gzip layers vs zstd layers,
each pulled into a FRESH engine (a second dockerd with an empty data root: trixie's 26.1.5, which pulls
zstd; 20.10 cannot), timing the pull and then the first `import torch` in a container of it.

    nox -s bench -- --pull [--rounds N]          (or: python tools/bench_pull.py --rounds N)

Steps: a loopback registry and a builder engine (26.1.5, containerd image store) start; `gpuforge build`
builds the default target there (cold: that engine has no cache) and `gpuforge push --compression both`
pushes `<tag>` (gzip) and `<tag>-zstd` (zstd, same layers' content, checked by the push). Then N rounds,
gzip and zstd interleaved, each on a new empty engine: `docker pull`, then `docker run --rm IMAGE python
-c 'import torch'`. Prints best of N with the spread (max - min) per side and the gzip/zstd ratio.
Needs root (dockerd, a bridge, NAT for the builder's downloads), docker-registry, ~25 GB under /var/tmp;
removes everything on exit, also after a failure or Ctrl-C. The pulls go over loopback, so the
times are decompression + unpack bound (as on a fast datacenter link), not network bound.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import second_engine as runners  # tools/ is this script's directory, so on sys.path

from gpuforge import paths
from gpuforge.builder import runner as build
from gpuforge.plan.matrix import load_matrix

REGISTRY_PORTS = range(5400, 5500)
REPOSITORY = "gpuforge-bench-21/pytorch"
DOCKER = runners.DOCKER


def _cli(state: Path, docker_host: str, matrix: Path, *args: str) -> str:
    env = {**os.environ, "DOCKER_HOST": docker_host, "GPUFORGE_STATE_DIR": str(state),
           "GPUFORGE_LOG_DIR": str(state / "logs"), "GPUFORGE_MATRIX": str(matrix)}
    argv = [sys.executable, "-m", "gpuforge", *args]
    print("+ " + " ".join(argv[2:]), flush=True)
    r = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=paths.project_root())
    if r.returncode != 0:
        sys.exit(f"bench_pull: gpuforge {' '.join(args)} failed:\n{r.stdout[-3000:]}\n{r.stderr[-2000:]}")
    return r.stdout


def _timed(argv: list[str]) -> float:
    t0 = time.monotonic()
    r = subprocess.run(argv, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"bench_pull: {' '.join(argv)} failed: {(r.stderr or r.stdout)[-1500:]}")
    return time.monotonic() - t0


def one_pull(ref: str, engine_root: Path) -> tuple[float, float, str]:
    """(pull seconds, first import seconds, engine description) on a new empty engine."""
    eng = runners.SecondEngine(prefix="gf21p-", binaries=engine_root, containerd_store=True)
    try:
        pull = _timed([DOCKER, "-H", eng.host, "pull", "-q", ref])
        imp = _timed([DOCKER, "-H", eng.host, "run", "--rm", "--network", "none", "--entrypoint", "/opt/venv/bin/python",
                      ref, "-c", "import torch"])
        return pull, imp, eng.describe()
    finally:
        eng.stop()


def stats(xs: list[float]) -> str:
    return f"{min(xs):7.1f} s (spread {max(xs) - min(xs):5.1f} s, n={len(xs)})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2, help="pulls per compression (best of N)")
    ap.add_argument("--pull", action="store_true", help="accepted for `nox -s bench -- --pull`")
    args = ap.parse_args()
    if args.rounds < 1:
        sys.exit("bench_pull: --rounds must be at least 1")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(130))
    root = runners.trixie_engine()
    t = load_matrix().select(None)[0]
    ca = build.host_trust()
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="gf21-bench-", dir="/var/tmp")))
        reg = runners.Registry(tmp / "registry", runners.free_port(REGISTRY_PORTS))
        stack.callback(reg.stop)
        matrix = runners.matrix_copy(paths.project_root(), tmp / "matrix.yaml", reg.host, REPOSITORY)
        builder = runners.SecondEngine(outbound=True, prefix="gf21b-", binaries=root, containerd_store=True)
        stack.callback(builder.stop)
        print(f"bench_pull: builder {builder.describe()}", flush=True)
        state = tmp / "state"
        t0 = time.monotonic()
        _cli(state, builder.host, matrix, "build", "--progress", "plain", *(["--extra-ca", ca.value] if ca else []))
        print(f"bench_pull: cold build on the builder: {time.monotonic() - t0:.0f} s", flush=True)
        t0 = time.monotonic()
        _cli(state, builder.host, matrix, "push", "--compression", "both")
        print(f"bench_pull: push gzip + zstd: {time.monotonic() - t0:.0f} s", flush=True)
        rec = json.loads((state / "builds.json").read_text())[t.id]
        refs = {"gzip": rec["pushed_ref"], "zstd": rec["pushed_ref_zstd"]}
        sizes = {k: _compressed_size(reg.host, ref) for k, ref in refs.items()}
        builder.stop()  # frees its cores and disk for the pulls
        times: dict[str, dict[str, list[float]]] = {k: {"pull": [], "import": []} for k in refs}
        desc = ""
        for n in range(args.rounds):
            for kind, ref in (refs.items() if n % 2 == 0 else reversed(refs.items())):  # interleaved, order alternating
                pull, imp, desc = one_pull(ref, root)
                times[kind]["pull"].append(pull)
                times[kind]["import"].append(imp)
                print(f"bench_pull: round {n + 1} {kind}: pull {pull:.1f} s, first import torch {imp:.1f} s", flush=True)
    print(f"\n{t.id}, pulled over loopback into a fresh {desc}")
    print(f"{'':6} {'compressed':>11}  {'pull':>36}  {'first import torch':>36}  {'pull + import':>12}")
    best = {}
    for kind, tt in times.items():
        total = min(p + i for p, i in zip(tt["pull"], tt["import"], strict=True))
        best[kind] = (min(tt["pull"]), total)
        print(f"{kind:6} {sizes[kind] / 1e9:9.2f} GB  {stats(tt['pull']):>36}  {stats(tt['import']):>36}  {total:10.1f} s")
    print(f"ratio gzip/zstd: pull {best['gzip'][0] / best['zstd'][0]:.2f}x, pull + first import "
          f"{best['gzip'][1] / best['zstd'][1]:.2f}x, compressed size {sizes['gzip'] / sizes['zstd']:.2f}x")
    return 0


def _compressed_size(host: str, ref: str) -> int:
    """Sum of the layer sizes of the image manifest (an index's linux manifest) of `ref`."""
    r = subprocess.run(["skopeo", "inspect", "--tls-verify=false", "--raw", f"docker://{ref}"], capture_output=True,
                       text=True, check=True)
    doc = json.loads(r.stdout)
    if "manifests" in doc:
        digest = next(d["digest"] for d in doc["manifests"] if d.get("platform", {}).get("os") == "linux")
        name = ref.rsplit(":", 1)[0]
        r = subprocess.run(["skopeo", "inspect", "--tls-verify=false", "--raw", f"docker://{name}@{digest}"],
                           capture_output=True, text=True, check=True)
        doc = json.loads(r.stdout)
    return sum(layer["size"] for layer in doc["layers"])


if __name__ == "__main__":
    sys.exit(main())
