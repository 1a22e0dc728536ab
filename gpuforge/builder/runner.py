"""Build targets into images: bases first, then BuildKit builds in parallel, tag only on success.

A build writes its image id to an --iidfile; tags are applied from that id afterwards, so a failed
or interrupted build never creates or moves a tag.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker.errors
from rich.console import Console
from rich.live import Live
from rich.table import Table

from gpuforge import options, paths
from gpuforge.builder import aptstate, archcheck, bases, diagnosis, sizecheck
from gpuforge.engine import client as engine
from gpuforge.errors import BuildError, ConfigError, EngineError, StateError
from gpuforge.plan.target import ImageRef, Target
from gpuforge.plan.version import BuildId
from gpuforge.provenance import created_time, git_revision, redact, source_url
from gpuforge.render import dockerfile as render
from gpuforge.render.labels import build_labels
from gpuforge.state import files, records
from gpuforge.state.models import BuildRecord
from gpuforge.state.records import Records

# Where a host's clients find the CA bundle they trust (a TLS-intercepting proxy's CA lives there), in the
# order pip itself reads them: the build's CA secret when none is given (gpuforge.options' extra_ca).
HOST_TRUST_ENV = options.SETTINGS["extra_ca"].fallback_env


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
    records: Records  # where the build is recorded (the CLI's state_dir)
    log_dir: Path  # one log per target (the CLI's log_dir: GPUFORGE_LOG_DIR)
    context_root: Path | None = None  # another copy of the project context (tests, benchmarks): render.copy_context
    provenance: str | None = None  # buildx --provenance (None: BuildKit's default; "false": none)
    gzip_level: int | None = None  # the exported layers' gzip level (None: BuildKit's); a containerd store keeps them
    apt_state: aptstate.AptState | None = None  # the system layer's key for every target (None: resolved per os)


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


def build_argv(driver: engine.Driver, t: Target, root: Path, iidfile: Path, opts: BuildOptions,
               labels: dict[str, str], metadata: Path | None = None, *, apt: aptstate.AptState | None = None) -> list[str]:
    argv = driver.command(builder=opts.builder, cache_from=opts.cache_from, cache_to=opts.cache_to,
                          provenance=opts.provenance, metadata=str(metadata) if metadata else None,
                          gzip_level=opts.gzip_level)
    if opts.no_cache:
        argv.append("--no-cache")
    argv += ["--progress=plain", "--iidfile", str(iidfile), "-f", str(root / "images" / "dist" / t.id / "Dockerfile")]
    for k, v in labels.items():
        argv += ["--label", f"{k}={v}"]
    if opts.extra_ca:
        argv += ["--secret", f"id=ca,src={opts.extra_ca}"]
    if opts.index_url:
        argv += ["--build-arg", f"TORCH_INDEX_URL={opts.index_url}"]
    if opts.pypi_url:
        argv += ["--build-arg", f"PYPI_URL={opts.pypi_url}"]
    if apt:  # the system layer's key (aptstate): rebuilt when the image's apt suites publish other packages
        argv += ["--build-arg", f"{aptstate.BUILD_ARG}={apt.value}"]
    return [*argv, str(root)]  # one context for every target: the project root, whitelisted by .dockerignore


class _Runner:
    """Runs builds, tracks child processes so Ctrl-C or a failure (without --keep-going) stops them."""

    def __init__(self, driver: engine.Driver, opts: BuildOptions, results: dict[str, Result], plain: bool,
                 info: engine.EngineInfo, apt: dict[str, aptstate.AptState]):
        self.driver, self.opts, self.results, self.plain = driver, opts, results, plain
        self.apt = apt  # target id -> the system layer's key, resolved once for this run
        # one value each for every target of this run
        self.revision, self.created, self.source = git_revision(), created_time(), source_url()
        self.engine = info
        self.stop = threading.Event()
        self.procs: set[subprocess.Popen[str]] = set()
        self.lock = threading.Lock()
        # Ctrl-C and tagging exclude each other: once stop is set no tag moves, and a tag move under way ends first
        # (re-entrant: a failed tag stops the other targets from within)
        self.tagging = threading.RLock()
        self.state_errors: list[StateError] = []  # a build made but not recorded: exit 8, not 4

    def kill_all(self) -> None:
        with self.tagging:
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
        r.log = self.opts.log_dir / f"{t.id}.log"
        recipe = render.recipe_hash(t, root)
        r.state = "building"
        start = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="gpuforge-build-") as tmp:
            iid, meta = Path(tmp) / "iid", Path(tmp) / "metadata.json"
            labels = build_labels(revision=self.revision, created=self.created, source=self.source, recipe=recipe)
            argv = build_argv(self.driver, t, root, iid, self.opts, labels,
                              meta if self.driver.writes_metadata else None, apt=self.apt[t.id])
            rc = self._stream(t, argv, r, note=self.apt[t.id].line(t.os))
            r.seconds = time.monotonic() - start
            if rc != 0 or not iid.exists():
                r.state = "failed"
                if not self.stop.is_set() and not engine.alive():  # not the build's fault: say so (exit 3)
                    r.engine_lost, r.error = True, "the engine stopped answering"
                    self.kill_all()
                    return r
                why = "interrupted" if self.stop.is_set() else f"exit {rc}"
                cause = None if self.stop.is_set() else diagnosis.diagnose(r.log.read_text(errors="replace"))
                return self._failed(r, f"build failed ({why}): {cause}; log: {r.log}" if cause else
                                    f"build failed ({why}); log: {r.log}; last line: {r.last_line}")
            metadata = json.loads(meta.read_text()) if meta.exists() else None
            image_id = engine.built_image_id(iid.read_text(), metadata)
            kind = str(((metadata or {}).get("containerimage.descriptor") or {}).get("mediaType", ""))
        try:  # the compat data's arch list must be the installed wheel's: a mismatch is a failed build
            problem = archcheck.mismatch(t.variant, archcheck.wheel_arch_flags(image_id))
        except EngineError as e:
            problem = str(e)
        if problem:
            return self._failed(r, f"build check failed: {problem}")
        img = engine.client().images.get(image_id)
        size = int(img.attrs.get("Size", 0))
        print(f"gpuforge: {t.id}: {sizecheck.note(t.id, size, self.engine.store)}", flush=True)
        problem = sizecheck.problem(t.id, size, self.engine.store)
        if problem:
            return self._failed(r, f"build check failed: {problem}")
        self._tag_unless_stopped(t, img, r, recipe, size, index="index" in kind, argv=argv)
        return r

    def _tag_unless_stopped(self, t: Target, img: Any, r: Result, recipe: str, size: int, *, index: bool,
                            argv: list[str]) -> None:
        """BuildKit may finish just before a Ctrl-C lands: its image is then left untagged, as the interrupt says."""
        with self.tagging:
            if self.stop.is_set():
                r.state, r.error = "failed", f"built {img.id[:19]} but stopped before its tags moved"
                return
            self._tag(t, img, r, recipe, size, index=index, argv=argv)

    def _failed(self, r: Result, error: str) -> Result:
        """This target failed: the others stop too, unless --keep-going."""
        r.state, r.error = "failed", error
        if not self.opts.keep_going:
            self.kill_all()
        return r

    def _stream(self, t: Target, argv: list[str], r: Result, note: str = "") -> int:
        """Run BuildKit, each output line redacted into the log (line-buffered: tail it live) and, plain, on stdout;
        `note` first, in the log only (what the build arguments stand for)."""
        assert r.log is not None  # build() names the log before it streams
        with files.open_log(r.log) as log:
            if note:
                log.write(redact(note) + "\n")
            shown = redact("+ " + " ".join(argv))
            log.write(shown + "\n")
            if self.plain:
                print(f"[{t.id}] {shown}", flush=True)
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                    errors="replace", env={**os.environ, "DOCKER_BUILDKIT": "1"})
            with self.lock:
                self.procs.add(proc)
            assert proc.stdout is not None  # stdout=PIPE: always set
            try:
                for line in proc.stdout:
                    line = redact(line.rstrip("\n"))
                    log.write(line + "\n")
                    r.last_line = line[-120:]
                    if self.plain:
                        print(f"[{t.id}] {line}", flush=True)
                return proc.wait()
            finally:
                with self.lock:
                    self.procs.discard(proc)

    def _tag(self, t: Target, img: Any, r: Result, recipe: str, size: int, *, index: bool, argv: list[str]) -> None:
        """Record the build, then move its tags: a tag never points at an image its record does not name.
        A failed record moves no tag; a failed tag puts the record and the tags already moved back."""
        c = engine.client()
        image_id = img.id
        try:
            before = self.opts.records.build(t.id)
            # another image has no report or push yet: the old one's must not carry over (the same image keeps them)
            stale = {} if before and before.image_id == image_id else dict.fromkeys(records.IMAGE_FACTS)
            now = dt.datetime.now(dt.UTC)
            build = build_id(before, image_id, now)
            self.opts.records.update_build(
                t.id, image_id=image_id, tags=list(t.tags), size=size, seconds=round(r.seconds, 1),
                driver=self.driver.name, client=self.driver.client, log=str(r.log), recipe=recipe,
                extra_ca=self.opts.extra_ca, revision=self.revision, engine=self.engine.version,
                image_store=self.engine.store, image_index=index, argv=argv,
                built_at=now.isoformat(timespec="seconds"), build=str(build), version=t.version(build), **stale)
        except StateError as e:
            r.state, r.error = "failed", f"built {image_id[:19]} but could not record it, so no tag moved: {e}"
            self.state_errors.append(e)
            if not self.opts.keep_going:
                self.kill_all()
            return
        moved: list[tuple[str, str | None]] = []  # (ref, image id it pointed at before)
        ref = ""
        try:
            for ref in t.tags:
                old = _image_of(c, ref)
                parsed = ImageRef.parse(ref)
                img.tag(parsed.name, parsed.tag)
                moved.append((ref, old))
        except docker.errors.APIError as e:  # e.g. the engine went away mid-way: put back what moved
            for back, old in reversed(moved):
                parsed = ImageRef.parse(back)
                with contextlib.suppress(docker.errors.APIError):
                    if old:
                        c.images.get(old).tag(parsed.name, parsed.tag)
                    else:
                        c.images.remove(back, noprune=True)
            self.opts.records.restore_build(t.id, before)
            r.state = "failed"
            r.error = (f"built {image_id[:19]} but could not tag it {ref} ({e.explanation or e}); "
                       "its tags and record were put back")
            if not self.opts.keep_going:
                self.kill_all()
            return
        r.ok, r.state, r.image_id, r.size = True, "built", image_id, size
        # which engine and store made it, and whether BuildKit's index (with attestations) is the image
        print(f"gpuforge: built {t.id} = {image_id} on {self.engine.describe()}"
              f"{', an image index (provenance attestation attached)' if index else ''}; version {t.version(build)} "
              f"(what `gpuforge push` pushes)", flush=True)


def build_id(before: BuildRecord | None, image_id: str, now: dt.datetime) -> BuildId:
    """The identifier of the build just made: the one its record already has when the build made the same image again
    (its version tag names these very bytes, maybe pushed and validated already), else `now`'s: another image, another
    version tag, so a pipeline pushes every build without moving one."""
    if before and before.image_id == image_id and before.build:
        return BuildId.parse(before.build)
    return BuildId.at_time(now)


def _image_of(c: Any, ref: str) -> str | None:  # c: a docker-py client (untyped)
    try:
        iid: str = c.images.get(ref).id
        return iid
    except docker.errors.ImageNotFound:
        return None


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


def _prepare(targets: list[Target], opts: BuildOptions, info: engine.EngineInfo) -> dict[str, aptstate.AptState]:
    """Each base in the engine, then each target's system-layer key (aptstate.for_targets): target id -> state."""
    seen: set[str] = set()
    for t in targets:
        if t.base_image not in seen:
            seen.add(t.base_image)
            bases.ensure_base(t)
    return aptstate.for_targets(targets, aptstate.debian_arch(info.arch), pinned=opts.apt_state)


def build_targets(targets: list[Target], opts: BuildOptions) -> list[Result]:
    if opts.context_root is None:
        render.check(targets, all_targets=False)
    driver = engine.choose_driver(opts.client, opts.driver)
    why = driver.cannot(builder=None, cache_from=opts.cache_from, cache_to=opts.cache_to, gzip_level=opts.gzip_level)
    if why:  # refused before the engine is touched, never silently dropped
        raise ConfigError(why)
    engine.client()
    print(driver.describe(), flush=True)
    info = engine.engine_info()
    if opts.gzip_level is not None and not info.containerd_store:
        # a graphdriver store keeps layers uncompressed: its push compresses them, at the engine's own level
        msg = (f"--compression-level {opts.gzip_level} needs an engine with the containerd image store, which keeps the "
               f"layers the build exports; this is {info.describe()}, whose push compresses at its own level")
        raise ConfigError(msg)
    why = driver.cannot(builder=opts.builder, cache_from=(), cache_to=None)
    if why:
        raise ConfigError(why)
    apt = _prepare(targets, opts, info)
    plain = opts.progress == "plain" or (opts.progress == "auto" and not sys.stdout.isatty())
    results = {t.id: Result(target=t) for t in targets}
    runner = _Runner(driver, opts, results, plain, info, apt)
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
        tagged = [r.target.id for r in results.values() if r.ok]  # finished and tagged before the Ctrl-C landed
        done = f"{', '.join(tagged)} finished and tagged before it; no other tag was created or moved" if tagged else \
            "no tag was created or moved"
        print(f"gpuforge: build interrupted; {done}", file=sys.stderr)
        raise
    finally:
        pool.shutdown(wait=True)
    if plain:
        Console(width=200).print(_table(results))
    if any(r.engine_lost for r in results.values()):
        during = f"the build of {', '.join(r.target.id for r in results.values() if r.engine_lost)}"
        raise engine.lost(during)
    failed = [r for r in results.values() if not r.ok]
    for r in failed:
        print(f"gpuforge: {r.target.id}: {r.error}", file=sys.stderr)
    if runner.state_errors:
        raise runner.state_errors[0]
    if failed:
        msg = f"{len(failed)} of {len(results)} target(s) did not build: {', '.join(r.target.id for r in failed)}"
        raise BuildError(msg)
    return list(results.values())

