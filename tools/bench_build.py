"""Build benchmark, measured side by side in one run (nox -s bench [-- --cold]):

Warm (default): gpuforge's build of the default target vs a plain `docker build` of the same generated
Dockerfile (all layers cached), and the warm rebuild after an entrypoint-only change.
Goals: ratio <= 1.05, warm entrypoint rebuild <= 15 s.

--cold: three cold builds of the default target, same base, same CA secret, same driver, interleaved:
  1. gpuforge today: the generated Dockerfile (a pinned uv installs the wheels, --compile-bytecode);
  2. gpuforge before uv: the same Dockerfile with pip doing the installs;
  3. a naive Dockerfile: apt + `pip install --no-cache-dir` of the same pins, no cache mounts.
Cold without touching anyone's cache: `--no-cache` and cache mounts with ids unique to the run, so
every layer is rebuilt and every wheel downloaded. Goal: 1 <= 0.75 x 2. A cold run leaves ~18 GB of
build cache (its own unshared records) and needs a quiet machine: other builds on the same cores skew it.

--registry-cache: the build cache shared across runners through a registry. Runner A (this engine) builds
the default target with `--cache-to type=inline` and pushes it to a loopback registry; then, each on a
fresh, empty second engine (another runner: tools/second_engine.py), `gpuforge build` (a) with no cache
source and (b) with `--cache-from type=registry,ref=<A's ref>`. Prints both times, the time saved, the
ratio and how many RUN steps (b) took from the cache. Needs root (dockerd, a bridge, NAT for the second
engine's cold downloads), docker-registry and ~15 GB free under /var/tmp; removes all of it on exit,
also after a failure or Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import second_engine as runners  # tools/ is this script's directory, so on sys.path

from gpuforge import options, paths
from gpuforge.builder import runner as build
from gpuforge.engine import client as engine
from gpuforge.plan.matrix import load_matrix
from gpuforge.render import dockerfile as render
from gpuforge.render import packages
from gpuforge.state.records import Records

REGISTRY_PORTS = range(5300, 5400)
REPOSITORY = "gpuforge-test-13b/cache"


def install_step_seconds(log: str) -> float | None:
    """How long the step that installs torch took, from BuildKit's plain progress (`#N DONE 85.7s`)."""
    for num, head in re.findall(r"^(#\d+) \[[^\]]*\] (RUN .*)$", log, re.M):
        if "pip install" in head and "torch==" in head:
            m = re.search(rf"^{num} DONE ([0-9.]+)s$", log, re.M)
            return float(m.group(1)) if m else None
    return None


def plain_build(driver: engine.Driver, root: Path, dockerfile: Path, ca: str | None, tag: str,
                no_cache: bool = False, steps: list | None = None) -> float:
    argv = [*driver.command(builder=None, cache_from=(), cache_to=None, provenance=None, metadata=None),
            "--progress=plain", "-t", tag, "-f", str(dockerfile), *(["--no-cache"] if no_cache else [])]
    if ca:
        argv += ["--secret", f"id=ca,src={ca}"]
    t0 = time.monotonic()
    p = subprocess.run([*argv, str(root)], capture_output=True, text=True, env={**os.environ, "DOCKER_BUILDKIT": "1"})
    if p.returncode != 0:
        sys.__stderr__.write(p.stdout[-3000:] + p.stderr[-3000:])
        p.check_returncode()
    if steps is not None:
        steps.append(install_step_seconds(p.stdout + p.stderr))
    return time.monotonic() - t0


def gpuforge_build(t, ctx_root: Path | None, ca: str | None, logs: Path) -> float:
    t0 = time.monotonic()
    records = Records(Path(options.resolve_one(options.SETTINGS["state_dir"]).value))  # gpuforge's own resolution
    build.build_targets([t], build.BuildOptions(context_root=ctx_root, extra_ca=ca, progress="plain", log_dir=logs,
                                                records=records))
    return time.monotonic() - t0


def fresh_cache_mounts(dockerfile: str) -> str:
    """The same Dockerfile with cache mounts no other build has used: a cold build that prunes nothing."""
    run = uuid.uuid4().hex[:12]
    return re.sub(r"--mount=type=cache,target=(\S+?)(,|\s)",
                  lambda m: f"--mount=type=cache,id=bench-{run}{m.group(1)},target={m.group(1)}{m.group(2)}", dockerfile)


def pip_variant(dockerfile: str) -> str:
    """gpuforge's Dockerfile as it was before uv: pip does both installs."""
    out = re.sub(r'    && /opt/venv/bin/pip install --index-url "\$\{PYPI_URL\}" uv==\S+ \\\n', "", dockerfile)
    out = out.replace("/opt/venv/bin/uv pip install --compile-bytecode", "/opt/venv/bin/pip install")
    assert "/opt/venv/bin/uv" not in out, "the pip variant still runs uv"
    return out


def naive_dockerfile(t) -> str:
    """What a user writes by hand: same base, apt packages and pins; no cache mounts, no constraints."""
    spec = packages.image_spec()
    apt = " ".join(sorted(spec["apt"]["common"]))
    v = t.variant
    pkgs = " ".join([f"torch=={v.torch}", f"torchvision=={v.torchvision}", f"torchaudio=={v.torchaudio}",
                     f"triton=={v.triton}", *packages.pip_tools(t)])
    return (f"FROM {t.base_image}\n"
            f"RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends {apt} "
            "&& rm -rf /var/lib/apt/lists/*\n"
            "RUN --mount=type=secret,id=ca python3 -m venv /opt/venv "
            "&& if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi "
            f"&& /opt/venv/bin/pip install --no-cache-dir {pkgs}\n")


def cold(t, driver: engine.Driver, ca: str | None, rounds: int) -> None:
    root = paths.project_root()
    generated = (root / "images" / "dist" / t.id / "Dockerfile").read_text()
    sides = {"gpuforge (uv)": lambda: fresh_cache_mounts(generated),
             "gpuforge before uv (pip)": lambda: fresh_cache_mounts(pip_variant(generated)),
             "naive pip Dockerfile": lambda: naive_dockerfile(t)}
    times: dict[str, list[float]] = {k: [] for k in sides}
    steps: dict[str, list] = {k: [] for k in sides}
    with tempfile.TemporaryDirectory(prefix="gpuforge-bench-") as tmp:
        try:
            _cold_rounds(sides, times, steps, driver, root, ca, rounds, Path(tmp))
        finally:  # also after a failed build (e.g. no space left): the bench's images never outlive it
            for i in range(len(sides)):
                subprocess.run([driver.client, "rmi", f"gpuforge-bench/cold-{i}:latest"], capture_output=True)
    _cold_report(t, driver, times, steps, rounds)


def _cold_rounds(sides, times, steps, driver, root, ca, rounds, tmp: Path) -> None:
    for r in range(rounds):
        for i, (name, make) in enumerate(sides.items()):
            df = tmp / f"Dockerfile.{i}"
            df.write_text(make())
            times[name].append(plain_build(driver, root, df, ca, f"gpuforge-bench/cold-{i}:latest", no_cache=True,
                                           steps=steps[name]))
            print(f"  round {r + 1}: {name}: {times[name][-1]:.1f} s (torch install step {steps[name][-1]} s)",
                  file=sys.__stdout__, flush=True)


def _cold_report(t, driver, times, steps, rounds) -> None:
    med = {k: statistics.median(v) for k, v in times.items()}
    base = med["gpuforge before uv (pip)"]
    print(f"cold builds of {t.id} ({driver.describe()}), {rounds} round(s), interleaved, no cache, fresh cache mounts:")
    step = {k: statistics.median(v) if None not in v else None for k, v in steps.items()}
    for k, v in times.items():
        st = f"torch install step {step[k]:6.1f} s (ratio {step[k] / step['gpuforge before uv (pip)']:.2f})" if all(
            step.values()) else ""
        print(f"  {k:26s} median {med[k]:7.1f} s  runs {[round(x, 1) for x in v]}  ratio to pip {med[k] / base:.2f}  {st}")
    ratio = med["gpuforge (uv)"] / base
    print(f"  gpuforge (uv) / gpuforge before uv (pip): {ratio:.2f}  (goal <= 0.75: {'met' if ratio <= 0.75 else 'NOT met'}); "
          f"uv / naive: {med['gpuforge (uv)'] / med['naive pip Dockerfile']:.2f}")


def slowest_steps(log: str, n: int = 3) -> str:
    """The n longest BuildKit steps of a plain-progress log, 'header (seconds)': where a build's time went.
    A step's time is its `DONE Xs`, or for a CACHED step whose layers were pulled, its longest layer timer
    (`#9 sha256:... 2.5GB / 2.5GB 45.3s done`, `#9 extracting sha256:... 30.1s done`)."""
    heads: dict[str, str] = {}
    secs: dict[str, float] = {}
    for num, rest in re.findall(r"^(#\d+) (\S.*)$", log, re.M):
        heads.setdefault(num, rest)
        m = re.search(r"(?:^DONE | )([0-9]+\.[0-9]+)s(?: done)?$", rest)
        if m:
            secs[num] = max(secs.get(num, 0.0), float(m.group(1)))
    top = sorted(((sec, heads[num]) for num, sec in secs.items()), reverse=True)[:n]
    return "; ".join(f"{head[:60]} ({sec:.1f} s)" for sec, head in top)


def _cli_build(matrix: Path, snap: Path, state: Path, ca: str | None, *extra: str, docker_host: str | None = None
               ) -> tuple[float, dict]:
    """`gpuforge build` of the default target, as a user runs it: wall time and its build record."""
    env = {**os.environ, "GPUFORGE_ROOT": str(snap), "GPUFORGE_STATE_DIR": str(state), "GPUFORGE_LOG_DIR": str(state / "logs")}
    if docker_host:
        env["DOCKER_HOST"] = docker_host
    argv = [sys.executable, "-m", "gpuforge", "--matrix", str(matrix), "build", "--progress", "plain",
            *(["--extra-ca", ca] if ca else []), *extra]
    t0 = time.monotonic()
    lines: list[tuple[float, str]] = []  # (seconds since start, line): BuildKit's log has no timer for unpacking
    with subprocess.Popen(argv, cwd=snap, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          errors="replace") as p:
        try:
            for line in p.stdout:
                lines.append((time.monotonic() - t0, line))
        except BaseException:  # Ctrl-C/SIGTERM: let gpuforge stop its build (it tags nothing), then unwind
            p.send_signal(signal.SIGINT)
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
            raise
    took = time.monotonic() - t0
    if p.returncode != 0:
        sys.stderr.write("".join(x for _, x in lines[-60:]))
        raise subprocess.CalledProcessError(p.returncode, argv)
    rec = next(iter(json.loads((state / "builds.json").read_text())["builds"].values()))  # gpuforge.state.models.BuildsFile
    pulls = [t for t, x in lines if re.search(r"\] #\d+ pulling sha256:", x)]
    rec["pull_s"] = took - pulls[0] if pulls else 0.0  # from the first cached-layer pull to the end
    return took, rec


def registry_cache(t, ca: str | None) -> None:
    root = paths.project_root()
    with contextlib.ExitStack() as stack:  # unwinds in reverse: engines, tags, registry, temp dir
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="gpuforge-bench-", dir="/var/tmp")))
        reg = runners.Registry(tmp / "registry", runners.free_port(REGISTRY_PORTS))
        stack.callback(reg.stop)
        snap = runners.checkout_snapshot(root, tmp / "checkout")
        m = runners.matrix_copy(root, tmp / "matrix.yaml", reg.host, REPOSITORY)
        ref = load_matrix(m).select(None)[0].tags[0]
        stack.callback(subprocess.run, [runners.DOCKER, "rmi", ref], capture_output=True)
        print(f"registry cache across runners: default target {t.id}, registry {reg.host}", flush=True)

        a_s, rec_a = _cli_build(m, snap, tmp / "a", ca, "--cache-to", "type=inline")
        t0 = time.monotonic()
        subprocess.run([runners.DOCKER, "push", "-q", ref], check=True, capture_output=True)
        push_s = time.monotonic() - t0
        print(f"  runner A (this engine, {rec_a['driver']}): build --cache-to type=inline {a_s:.1f} s, "
              f"push {push_s:.1f} s", flush=True)

        sides = {"(a) no cache source (cold)": (), "(b) --cache-from the registry": (
            "--cache-from", f"type=registry,ref={ref}")}
        times, recs = {}, {}
        for i, (name, extra) in enumerate(sides.items()):
            eng = runners.SecondEngine(outbound=True, prefix="gf13b-")  # empty each time: no cache of (a) for (b)
            stack.callback(eng.stop)
            eng.load(t.base_image)  # a bootstrapped base exists only locally; both sides start from it
            times[name], recs[name] = _cli_build(m, snap, tmp / f"b{i}", ca, *extra, docker_host=eng.host)
            print(f"  runner B, empty engine, {name}: {times[name]:.1f} s ({recs[name]['driver']})", flush=True)
            eng.stop()  # frees its data root before the next side (stop is idempotent)
        cold_s, cached_s = times.values()
        steps = runners.run_steps(Path(recs["(b) --cache-from the registry"]["log"]).read_text())
        cold_steps = runners.run_steps(Path(recs["(a) no cache source (cold)"]["log"]).read_text())
        slowest = {k: slowest_steps(Path(r["log"]).read_text()) for k, r in recs.items()}
    print(f"registry cache across runners, {t.id} ({recs['(a) no cache source (cold)']['driver']}):")
    print(f"  (a) runner B cold, no cache source        {cold_s:7.1f} s  (RUN steps CACHED: "
          f"{sum(cold_steps.values())} of {len(cold_steps)})")
    print(f"  (b) runner B --cache-from <A's inline ref> {cached_s:7.1f} s  (RUN steps CACHED: "
          f"{sum(steps.values())} of {len(steps)})")
    for k, v in slowest.items():
        print(f"  slowest steps {k[:3]}: {v}")
    print(f"  (b) from its first cached-layer pull to the end (pull + unpack of A's layers): "
          f"{recs['(b) --cache-from the registry']['pull_s']:.1f} s")
    print(f"  time saved {cold_s - cached_s:.1f} s, ratio (b)/(a) {cached_s / cold_s:.2f}; "
          f"runner A paid build {a_s:.1f} s + push {push_s:.1f} s once")


def _interrupted(signum, frame):
    raise SystemExit(128 + signum)  # SIGTERM unwinds like Ctrl-C: the bench's cleanup runs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cold", action="store_true", help="cold builds: uv vs pip vs a naive Dockerfile (slow: real downloads)")
    ap.add_argument("--registry-cache", action="store_true",
                    help="a second, empty engine builds cold vs --cache-from a registry ref pushed by this one (slow)")
    ap.add_argument("--rounds", type=int, default=None, help="rounds per side (default: 3 warm, 1 cold)")
    ap.add_argument("--extra-ca", help="CA bundle passed as the build secret (default: GPUFORGE_EXTRA_CA, "
                    "then the host's pip trust, as `gpuforge build` does)")
    args = ap.parse_args()
    # --extra-ca, else gpuforge's own resolution (GPUFORGE_EXTRA_CA, then the host's pip trust; PEM-checked)
    ca = options.resolve_one(options.SETTINGS["extra_ca"], cli=args.extra_ca).value
    t = load_matrix().select(None)[0]
    driver = engine.choose_driver()
    if args.cold:
        cold(t, driver, ca, args.rounds or 1)
        return 0
    if args.registry_cache:
        signal.signal(signal.SIGTERM, _interrupted)
        signal.signal(signal.SIGINT, signal.default_int_handler)  # also when started in the background (`&`)
        try:
            registry_cache(t, ca)
        except KeyboardInterrupt:
            print("bench: interrupted; second engine, registry, tags and temp dir removed", file=sys.stderr)
            return 130
        return 0
    rounds = args.rounds or 3
    bench_t = dataclasses.replace(t, tags=("gpuforge-bench/gpuforge:latest",))
    logs = Path(tempfile.mkdtemp(prefix="gpuforge-bench-"))
    sys.stdout = open(os.devnull, "w")  # quiet the builds; the figures are printed after stdout is restored
    gpuforge_build(bench_t, None, ca, logs)  # the cache state both sides start from
    ours, plain = [], []
    dockerfile = paths.project_root() / "images" / "dist" / t.id / "Dockerfile"
    for _ in range(rounds):
        ours.append(gpuforge_build(bench_t, None, ca, logs))
        plain.append(plain_build(driver, paths.project_root(), dockerfile, ca, "gpuforge-bench/plain:latest"))
    with tempfile.TemporaryDirectory() as tmp:
        ctx = render.copy_context(Path(tmp))
        render.write(t, ctx / "images" / "dist")
        with (ctx / "images" / "context" / "entrypoint.sh").open("a") as f:
            f.write(f"# bench {time.time()}\n")
        rebuild = gpuforge_build(bench_t, ctx, ca, logs)
    sys.stdout = sys.__stdout__
    mo, mp = statistics.median(ours), statistics.median(plain)
    print(f"driver: {driver.describe()}")
    print(f"default target {t.id}, warm (all layers cached), {rounds} rounds each, interleaved")
    print(f"  gpuforge build     median {mo:7.2f} s  runs {[round(x, 2) for x in ours]}")
    print(f"  plain docker build median {mp:7.2f} s  runs {[round(x, 2) for x in plain]}")
    print(f"  ratio gpuforge/plain: {mo / mp:.3f}  (goal <= 1.05; overhead {mo - mp:+.2f} s)")
    print(f"  warm rebuild after an entrypoint-only change: {rebuild:.2f} s  (goal <= 15 s)")
    for tag in ("gpuforge-bench/gpuforge:latest", "gpuforge-bench/plain:latest"):
        subprocess.run([driver.client, "rmi", tag], capture_output=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
