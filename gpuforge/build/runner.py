"""Build targets into images: bases first, then BuildKit builds in parallel, tag only on success.

A build writes its image id to an --iidfile; tags are applied from that id afterwards, so a failed
or interrupted build never creates or moves a tag.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.live import Live
from rich.table import Table

from gpuforge import paths
from gpuforge.build import archcheck
from gpuforge.build import bases
from gpuforge.engine import client as engine
from gpuforge.state import records
from gpuforge.render import dockerfile as render
from gpuforge.errors import BuildError, ConfigError, EngineError
from gpuforge.plan.matrix import Target

LOG_DIR = Path(os.environ.get("GPUFORGE_LOG_DIR", "reports/build-logs"))
_CREDS = re.compile(r"(//)[^/@\s]+@")


def redact(text: str) -> str:
    """Hide credentials embedded in URLs (https://user:token@mirror/...)."""
    return _CREDS.sub(r"\1***@", text)


# Where a host's clients find the CA bundle they trust (a TLS-intercepting proxy's CA lives there),
# in the order pip itself reads them.
HOST_TRUST_ENV = ("PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE")


def host_trust():
    """The host's pip trust as an options.Resolved (None when unset): the build's CA secret by default."""
    from gpuforge import options

    for env in HOST_TRUST_ENV:
        value = os.environ.get(env)
        if value:
            return options.existing_file(options.Resolved("extra_ca", value, env),
                                         "the host's CA bundle, passed to the build as a secret; fix or unset it")
    return None


@dataclass(kw_only=True)
class BuildOptions:
    jobs: int = 1
    keep_going: bool = False
    extra_ca: str | None = None
    builder: str | None = None
    cache_from: list[str] = field(default_factory=list)
    cache_to: str | None = None
    client: str | None = None
    driver: str = "auto"  # auto | buildx | classic
    no_cache: bool = False  # rebuild every step (cache mounts stay): a second, independent build of one commit
    index_url: str | None = None
    pypi_url: str | None = None
    progress: str = "auto"  # auto | tty | plain
    log_dir: Path = LOG_DIR
    context_root: Path | None = None  # another copy of the project context (tests, benchmarks): render.copy_context


@dataclass(kw_only=True)
class Result:
    target: Target
    ok: bool = False
    state: str = "queued"  # queued | building | built | failed | skipped
    seconds: float = 0.0
    image_id: str = ""
    size: int = 0
    log: Path | None = None
    error: str = ""
    last_line: str = ""
    engine_lost: bool = False  # the build failed because the engine went away (exit 3, not 4)


def git_revision() -> str:
    root = paths.project_root()
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                             timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True,
                               timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (rev or "unknown") + ("-dirty" if dirty else "")


def build_argv(driver: engine.Driver, t: Target, root: Path, iidfile: Path, opts: BuildOptions, recipe: str,
               revision: str) -> list[str]:
    if driver.name == "buildx":
        argv = [driver.client, "buildx", "build", "--load"]
        if opts.builder:
            argv += ["--builder", opts.builder]
        for c in opts.cache_from:
            argv += ["--cache-from", c]
        if opts.cache_to:
            argv += ["--cache-to", opts.cache_to]
    else:
        argv = [driver.client, "build"]
    if opts.no_cache:
        argv.append("--no-cache")
    argv += ["--progress=plain", "--iidfile", str(iidfile), "-f", str(root / "images" / "dist" / t.id / "Dockerfile"),
             "--label", f"org.opencontainers.image.revision={revision}",
             "--label", f"io.gpuforge.recipe={recipe}"]
    if opts.extra_ca:
        argv += ["--secret", f"id=ca,src={opts.extra_ca}"]
    if opts.index_url:
        argv += ["--build-arg", f"TORCH_INDEX_URL={opts.index_url}"]
    if opts.pypi_url:
        argv += ["--build-arg", f"PYPI_URL={opts.pypi_url}"]
    return [*argv, str(root)]  # one context for every target: the project root, whitelisted by .dockerignore


# Common build failures, recognised in the log, as (pattern, what it means and how to fix it); the
# first match is named in the error line instead of the log's last line.
DIAGNOSES: tuple[tuple[re.Pattern, str], ...] = tuple((re.compile(p, re.I), why) for p, why in (
    (r"CERTIFICATE_VERIFY_FAILED|certificate verify failed|invalid peer certificate|UnknownIssuer|"
     r"self[- ]signed certificate in certificate chain",
     "TLS certificate verification failed (a TLS-intercepting proxy?): pass its CA bundle with --extra-ca FILE "
     "or GPUFORGE_EXTRA_CA (by default gpuforge passes the host's PIP_CERT/SSL_CERT_FILE/REQUESTS_CA_BUNDLE)"),
    (r"no space left on device",
     "no space left on device: free disk for the engine (docker image prune; docker builder prune) or move its data-root"),
    (r"pull access denied|failed to resolve source metadata for|manifest unknown|failed to do request: Head .*/manifests/|"
     r"repository does not exist|(?:base|FROM) image .* not found",
     "the base image cannot be pulled: check the name/tag, `docker login`, or mirror it and point matrix.yaml's "
     "bases / cuda_base_image at the mirror"),
    (r"No matching distribution found for|Because there is no version of|no version of \S+ (?:==|matching)|"
     r"Could not find a version that satisfies the requirement|unsatisfiable",
     "a pinned Python package version is not on the index: check the pin (gpuforge/image/data/compat.yaml, "
     "data/image.yaml) or point --index-url / --pypi-url at an index that has it"),
    (r"Failed to fetch|Temporary failure in name resolution|Could not resolve host|Connection refused|"
     r"Network is unreachable|ConnectTimeout|Max retries exceeded|error sending request for url|dns error|"
     r"Failed to download|timed out",
     "a package index or mirror is unreachable from the build: check the network/proxy, or use --index-url / "
     "--pypi-url (and matrix.yaml's mirrors) to reach one that is"),
))


def diagnose(log_text: str) -> str | None:
    """What a failed build's log says went wrong, as an actionable sentence (None when unrecognised)."""
    for pattern, why in DIAGNOSES:
        if pattern.search(log_text):
            return why
    return None


class _Runner:
    """Runs builds, tracks child processes so Ctrl-C or a failure (without --keep-going) stops them."""

    def __init__(self, driver: engine.Driver, opts: BuildOptions, results: dict[str, Result], plain: bool):
        self.driver, self.opts, self.results, self.plain = driver, opts, results, plain
        self.revision = git_revision()  # one value for every target of this run
        self.stop = threading.Event()
        self.procs: set[subprocess.Popen] = set()
        self.lock = threading.Lock()

    def kill_all(self) -> None:
        self.stop.set()
        with self.lock:
            for p in self.procs:
                p.terminate()

    def build(self, t: Target) -> Result:
        r = self.results[t.id]
        if self.stop.is_set():
            r.state, r.error = "skipped", "not started: an earlier target failed (use --keep-going)"
            return r
        root = self.opts.context_root or paths.project_root()
        self.opts.log_dir.mkdir(parents=True, exist_ok=True)
        r.log = self.opts.log_dir / f"{t.id}.log"
        recipe = render.recipe_hash(t, root)
        r.state = "building"
        start = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="gpuforge-build-") as tmp:
            iid = Path(tmp) / "iid"
            argv = build_argv(self.driver, t, root, iid, self.opts, recipe, self.revision)
            with r.log.open("w", buffering=1) as log:  # line-buffered: the log can be tailed live
                shown = redact("+ " + " ".join(argv))
                log.write(shown + "\n")
                if self.plain:
                    print(f"[{t.id}] {shown}", flush=True)
                proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                        errors="replace", env={**os.environ, "DOCKER_BUILDKIT": "1"})
                with self.lock:
                    self.procs.add(proc)
                try:
                    for line in proc.stdout:
                        line = redact(line.rstrip("\n"))
                        log.write(line + "\n")
                        r.last_line = line[-120:]
                        if self.plain:
                            print(f"[{t.id}] {line}", flush=True)
                    rc = proc.wait()
                finally:
                    with self.lock:
                        self.procs.discard(proc)
            r.seconds = time.monotonic() - start
            if rc != 0 or not iid.exists():
                r.state = "failed"
                if not self.stop.is_set() and not engine.alive():  # not the build's fault: say so (exit 3)
                    r.engine_lost, r.error = True, "the engine stopped answering"
                    self.kill_all()
                    return r
                why = "interrupted" if self.stop.is_set() else f"exit {rc}"
                cause = None if self.stop.is_set() else diagnose(r.log.read_text(errors="replace"))
                r.error = (f"build failed ({why}): {cause}; log: {r.log}" if cause else
                           f"build failed ({why}); log: {r.log}; last line: {r.last_line}")
                if not self.opts.keep_going:
                    self.kill_all()
                return r
            image_id = iid.read_text().strip()
        try:  # the compat data's arch list must be the installed wheel's (#11): a mismatch is a failed build
            problem = archcheck.mismatch(t.variant, archcheck.wheel_arch_flags(image_id))
        except EngineError as e:
            problem = str(e)
        if problem:
            r.state, r.error = "failed", f"build check failed: {problem}"
            if not self.opts.keep_going:
                self.kill_all()
            return r
        self._tag(t, image_id, r, recipe)
        return r

    def _tag(self, t: Target, image_id: str, r: Result, recipe: str) -> None:
        img = engine.client().images.get(image_id)
        for ref in t.tags:
            repo, tag = ref.rsplit(":", 1)
            img.tag(repo, tag)
        r.ok, r.state, r.image_id, r.size = True, "built", image_id, int(img.attrs.get("Size", 0))
        records.update(t.id, image_id=image_id, tags=list(t.tags), size=r.size, seconds=round(r.seconds, 1),
                       driver=self.driver.name, client=self.driver.client, log=str(r.log), recipe=recipe,
                       extra_ca=self.opts.extra_ca, revision=self.revision, built_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"))


def _table(results: dict[str, Result]) -> Table:
    table = Table(title="gpuforge build")
    for col in ("target", "result", "duration", "size", "image id", ""):
        table.add_column(col)
    for r in results.values():
        size = f"{r.size / 1e9:.2f} GB" if r.size else ""
        dur = f"{r.seconds:.0f} s" if r.seconds else ""
        note = r.error if r.state in ("failed", "skipped") else (r.last_line if r.state == "building" else "")
        table.add_row(r.target.id, r.state, dur, size, r.image_id[7:19], note[:100])
    return table


def build_targets(targets: list[Target], opts: BuildOptions) -> list[Result]:
    if opts.extra_ca and not Path(opts.extra_ca).is_file():  # the CLI checks first, naming where the path came from
        msg = f"extra CA {opts.extra_ca}: no such file (give a PEM bundle; it reaches the build only as a secret)"
        raise ConfigError(msg)
    if opts.context_root is None:
        render.check(targets, all_targets=False)
    driver = engine.choose_driver(opts.client, opts.driver)
    if (opts.cache_from or opts.cache_to) and driver.name != "buildx":  # classic `docker build` has no such flags
        msg = (f"--cache-from/--cache-to need buildx, but the build driver is {driver.name} ({driver.client}): "
               "install docker-buildx (tools/start-engine.sh) or leave them out")
        raise ConfigError(msg)
    engine.client()
    print(driver.describe(), flush=True)
    if opts.builder and driver.name != "buildx":
        msg = f"--builder {opts.builder} needs buildx, but {driver.client} has no buildx plugin"
        raise ConfigError(msg)
    seen: set[str] = set()
    for t in targets:
        if t.base_image not in seen:
            seen.add(t.base_image)
            bases.ensure_base(t)
    plain = opts.progress == "plain" or (opts.progress == "auto" and not sys.stdout.isatty())
    results = {t.id: Result(target=t) for t in targets}
    runner = _Runner(driver, opts, results, plain)
    pool = ThreadPoolExecutor(max_workers=max(1, opts.jobs))
    try:
        futures = [pool.submit(runner.build, t) for t in targets]
        if plain:
            for f in as_completed(futures):
                f.result()
        else:
            with Live(_table(results), refresh_per_second=2, console=Console()) as live:
                while not all(f.done() for f in futures):
                    live.update(_table(results))
                    time.sleep(0.5)
                live.update(_table(results))
                for f in futures:
                    f.result()
    except KeyboardInterrupt:
        runner.kill_all()
        pool.shutdown(wait=True, cancel_futures=True)
        print("gpuforge: build interrupted; no tag was created or moved", file=sys.stderr)
        raise
    finally:
        pool.shutdown(wait=True)
    if plain:
        Console(width=200).print(_table(results))
    if any(r.engine_lost for r in results.values()):
        raise engine.lost(f"the build of {', '.join(r.target.id for r in results.values() if r.engine_lost)}")
    failed = [r for r in results.values() if not r.ok]
    for r in failed:
        print(f"gpuforge: {r.target.id}: {r.error}", file=sys.stderr)
    if failed:
        msg = f"{len(failed)} of {len(results)} target(s) did not build: {', '.join(r.target.id for r in failed)}"
        raise BuildError(msg)
    return list(results.values())
