"""Shared fixtures. Tests that need the engine use `docker_engine`: skipped (with the reason) when no
engine answers, FAILED instead when GPUFORGE_REQUIRE_DOCKER=1 (CI sets it)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))  # repo maintenance code (lint, workflow checks) is tested too
REQUIRE = os.environ.get("GPUFORGE_REQUIRE_DOCKER") == "1"

BASE_MATRIX = """\
registry: 127.0.0.1:5000
repository: gpuforge/pytorch
bases:
  debian12:
    bootstrap: {suite: bookworm}
matrix:
  torch: ["2.7.1"]
  cuda: ["12.6", "12.8"]
  python: ["3.12"]
  os: [ubuntu24.04]
  flavor: [runtime, devel]
  source: [cuda-base]
default: ["cuda=12.6 flavor=runtime"]
"""


@pytest.fixture
def write_matrix(tmp_path):
    """Write a matrix file (dedented) and return its path."""
    def _write(text: str, name: str = "matrix.yaml") -> Path:
        p = tmp_path / name
        p.write_text(textwrap.dedent(text))
        return p
    return _write


def ctrl_c_able() -> None:
    """Popen preexec_fn: SIGINT back to its default in the child. A run started in the background (`cmd &`,
    nohup) inherits SIGINT ignored, and Python then installs no KeyboardInterrupt: Ctrl-C tests would pass
    or fail by how their runner was started (they failed once so)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


import steps  # noqa: E402 - tests/, on the path as the conftest's folder (pytest's rootdir-relative import)

# Property tests: a fast profile by default, the thorough one in CI (.ci/run exports HYPOTHESIS_PROFILE=ci).
# Each test asks for its CI count through examples(); the dev profile runs a tenth of it.
from hypothesis import settings as _hypothesis  # noqa: E402 - after the sys.path set-up above

_hypothesis.register_profile("ci", max_examples=100, deadline=None, database=None, print_blob=True)
_hypothesis.register_profile("dev", max_examples=10, deadline=None, database=None)
_hypothesis.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


def examples(thorough: int) -> int:
    """`thorough` examples under the ci profile, scaled by the loaded one (dev: a tenth, at least 2)."""
    return max(2, thorough * _hypothesis.default.max_examples // 100)


def need(msg: str):
    """A resource the test needs is absent: skip saying why, or FAIL under GPUFORGE_REQUIRE_DOCKER=1 (CI)."""
    if REQUIRE:
        pytest.fail(f"GPUFORGE_REQUIRE_DOCKER=1 but {msg}")
    pytest.skip(msg)


def need_engine(what: str = "a Docker engine"):
    need(f"needs {what}: none answers (start one with `bash tools/start-engine.sh`)")


@pytest.fixture(scope="session")
def docker_engine():
    from gpuforge.engine import client as engine
    from gpuforge.errors import EngineError

    try:
        return engine.client()
    except EngineError:
        need_engine()


def gpuforge(*args: str, env: dict | None = None, cwd: Path = ROOT, timeout: int = 3600) -> subprocess.CompletedProcess:
    """Run the real CLI in a subprocess."""
    return subprocess.run([sys.executable, "-m", "gpuforge", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def pytest_configure(config):
    # the validators' selection markers: unit tests import validator modules, which carry them
    from gpuforge.validate import selection

    for line in selection.MARKER_HELP.values():
        config.addinivalue_line("markers", line)
    # Builds, records and reports of this test run live in one temporary state dir, shared with the
    # CLI subprocesses the tests start.
    if "GPUFORGE_STATE_DIR" not in os.environ:
        import tempfile

        os.environ["GPUFORGE_STATE_DIR"] = tempfile.mkdtemp(prefix="gpuforge-test-state-")
    os.environ.setdefault("GPUFORGE_LOG_DIR", os.path.join(os.environ["GPUFORGE_STATE_DIR"], "logs"))
    # the controller (or the only process), before any worker starts; not for a collection, help, or the unit tests
    unit_only = config.args and all(Path(a.split("::")[0]).resolve().is_relative_to(ROOT / "tests" / "unit")
                                    for a in config.args)
    if not (hasattr(config, "workerinput") or config.option.collectonly or config.option.help or unit_only):
        from registries import start_run_registry

        config._gpuforge_run_registry = start_run_registry()
        os.environ.setdefault("GPUFORGE_APT_STATE", _run_apt_state())


def _run_apt_state() -> str:
    """One system-layer key for every build of this run (`gpuforge build` reads GPUFORGE_APT_STATE), resolved once, as
    a build resolves it, from the default target's apt suites now: builds on several engines, in several workers and
    clones share BuildKit's cache and one image id even when a suite publishes packages during the run."""
    import platform

    from gpuforge.builder import aptstate
    from gpuforge.plan.matrix import load_matrix

    t = load_matrix().select(None)[0]
    return aptstate.resolve(aptstate.sources(t, aptstate.debian_arch(platform.machine()))).value


def pytest_unconfigure(config):
    if not hasattr(config, "workerinput"):
        from registries import drop_run_tags, stop_run_registry

        drop_run_tags()  # before the run's folder, which lists its registries, goes
        stop_run_registry(getattr(config, "_gpuforge_run_registry", None))


@pytest.fixture(autouse=True)
def _fresh_root():
    """A test that named a checkout (as the CLI does for GPUFORGE_ROOT) leaves none named for the next test."""
    yield
    from gpuforge import paths

    paths.use_root(None)


@pytest.fixture(scope="session")
def test_ca(tmp_path_factory):
    """An extra CA bundle for the build: the host's trust store (the TLS proxy's CA lives there) plus a
    freshly made CA whose bytes must then appear nowhere in the image. Once per run, as the default build that
    carries it: every worker then searches the image for the CA it was built with."""
    with once_per_run("test-ca") as (made, save):
        if made is None:
            d = tmp_path_factory.mktemp("ca")
            subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
                            "/CN=gpuforge test CA", "-keyout", str(d / "ca.key"), "-out", str(d / "ca.crt")],
                           check=True, capture_output=True)
            cert = (d / "ca.crt").read_text()
            host = Path("/etc/ssl/certs/ca-certificates.crt")
            bundle = d / "bundle.pem"
            bundle.write_text((host.read_text() if host.exists() else "") + cert)
            made = {"bundle": str(bundle), "needle": cert.splitlines()[1]}  # a line of the certificate's base64 body
            save(made)
    return {"bundle": Path(made["bundle"]), "needle": made["needle"].encode()}


@contextlib.contextmanager
def once_per_run(name: str):
    """A session fixture's work done once per test run, not once per xdist worker: the first worker to get here does
    it under an inter-process lock and leaves its result (JSON) in the run's state dir; the others wait on the lock
    and read that. Yields (cached result or None, a function to save the result)."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")  # one id for all workers of this run (xdist sets it)
    if not run:  # one process: its session fixture runs once anyway
        yield None, lambda result: None
        return
    done = Path(os.environ["GPUFORGE_STATE_DIR"]) / f".tests-{name}-{run}.json"  # never another run's result
    with _run_lock(name):
        cached = json.loads(done.read_text()) if done.exists() else None
        yield cached, lambda result: done.write_text(json.dumps(result, default=str))


@contextlib.contextmanager
def _run_lock(name: str, *, shared: bool = False):
    """An inter-process lock in the run's state dir (pytest_configure sets it), which every worker shares."""
    import fcntl

    here = Path(os.environ["GPUFORGE_STATE_DIR"])
    here.mkdir(parents=True, exist_ok=True)
    with open(here / f".tests-{name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        yield


def reaping_validate(tmp_path: Path) -> subprocess.CompletedProcess:
    """The next run after a killed one: a `validate` whose input is good, so it first removes the containers of dead
    runs (a refused command changes nothing); with a state dir of its own it then stops at "not built", exit 8."""
    r = gpuforge("validate", "--reports", str(tmp_path / "next"), env={"GPUFORGE_STATE_DIR": str(tmp_path / "empty")})
    assert r.returncode == 8 and "has not been built" in r.stderr, r.stderr
    return r


@contextlib.contextmanager
def dead_runs_window(*, leaves_them: bool):
    """`build` and `validate` first remove the containers of gpuforge runs that died, and say so on stderr. A test
    that kills a run on the shared engine leaves such containers there until its own clean or reap: it holds this
    lock alone (`leaves_them=True`) from the kill to that clean. A test that asserts a `build`'s or `validate`'s whole
    stderr holds it shared, so a reaping line in what it reads is never another test's (a unit test's `validate`
    once reaped test_clean's killed owner and printed two lines)."""
    with _run_lock("dead-runs", shared=not leaves_them):
        yield


@pytest.fixture(scope="session")
def default_build(docker_engine, test_ca):
    """The matrix default, built for real once per test run (BuildKit's cache makes reruns fast). Once per run, not per
    worker: a second build of the same commit may be served another cache chain (on an engine where a --no-cache
    build of it ran) and move the default tag under the first worker's tests."""
    from state_here import records

    from gpuforge.plan.matrix import load_matrix

    t = load_matrix().select(None)[0]
    with once_per_run("default-build") as (rec, save):
        if rec is None:
            with steps.step("the default build"):
                r = gpuforge("build", "--extra-ca", str(test_ca["bundle"]), "--progress", "plain")
            assert r.returncode == 0, f"default build failed:\n{r.stdout[-4000:]}\n{r.stderr[-3000:]}"
            assert "build driver:" in r.stdout
            rec = records.require_build(t.id).model_dump(exclude_none=True)  # JSON: saved for the other workers
            save(rec)
    _keep(t, rec)
    print(f"\ndefault image {rec['image_id'][:19]} built on engine {rec['engine']}, image store {rec['image_store']}")
    return t, rec


def _keep(t, rec) -> None:
    """A tag of the run's own on the image a session fixture built: a later build of the same target (another
    revision, another module) moves the target's tag and leaves the image dangling, and a runner's clean-up (the
    workflows' `docker image prune` of dangling gpuforge images, run by tests/integration/workflows/) would delete it
    under the modules still using it."""
    from gpuforge.engine import client as engine

    engine.client().images.get(rec["image_id"]).tag("gpuforge-test/kept", t.id)


KEY_PASSWORD = "cosign-test-key-pass"


@pytest.fixture(scope="session")
def cosign_keys():
    """A cosign key pair made once for this run (the private key encrypted with KEY_PASSWORD): `validated` signs
    with it, and every module that verifies that evidence holds the same public key."""
    import shutil
    import tempfile

    if not shutil.which("cosign"):
        need("needs cosign (Debian trixie's; tools/start-engine.sh installs it)")
    with once_per_run("cosign-keys") as (made, save):
        if made is None:
            d = Path(tempfile.mkdtemp(prefix="cosign-", dir=os.environ["GPUFORGE_STATE_DIR"]))
            subprocess.run(["cosign", "generate-key-pair", "--output-key-prefix", str(d / "test")], check=True,
                           capture_output=True, env={**os.environ, "COSIGN_PASSWORD": KEY_PASSWORD})
            made = {"key": str(d / "test.key"), "pub": str(d / "test.pub")}
            save(made)
    return made


@pytest.fixture(scope="session")
def installed():
    """gpuforge installed as a user installs it (`pip install .[validate]`, not editable) into a venv of this run: its
    `gpuforge` executable. Once per run: `validated` runs this copy, and test_install.py asks it too."""
    import tempfile

    from installed import install

    with once_per_run("installed") as (made, save):
        if made is None:
            with steps.step("the installed copy (pip install .[validate])"):
                made = str(install(Path(tempfile.mkdtemp(prefix="venv-", dir=os.environ["GPUFORGE_STATE_DIR"]))))
            save(made)
    return Path(made)


@pytest.fixture(scope="session")
def validated(default_build, cosign_keys, installed):
    """The default image pushed with credentials to the run's htpasswd registry (`gpuforge push`), then the full
    non-GPU validator suite run once per test run against it with `gpuforge validate --attest`: a green report,
    signed onto the pushed digest in that run. Once, not per module: the modules that promote, report or inspect
    it share this one push (6 GB gzipped) and this one run of every validator.

    That validate is the installed copy's (`installed`), run from the repository root with its `clean` again and again
    beside it (tests/installed.py): test_install.py asserts what it said and what each clean saw (`beside`)."""
    import re

    from installed import validate_with_clean_beside
    from registries import PASSWORD, USER, run_registry

    host = run_registry()
    reports = Path(os.environ["GPUFORGE_STATE_DIR"]) / "tests-validated-reports"
    summary = reports / "step-summary.md"
    env = {"GPUFORGE_REGISTRY_USER": USER, "GPUFORGE_REGISTRY_PASSWORD": PASSWORD, "COSIGN_PASSWORD": KEY_PASSWORD}
    with once_per_run("validated") as (done, save):
        if done is None:
            t0 = time.monotonic()
            with steps.step("the run's push of the default image"):
                r = gpuforge("push", "--registry", host, env=env)
            assert r.returncode == 0, f"push failed:\n{r.stdout[-4000:]}\n{r.stderr[-3000:]}"
            pushed = {"seconds": time.monotonic() - t0, "ref": "", "digest": ""}
            pushed["ref"], pushed["digest"] = re.search(r"pushed (\S+)@(sha256:[0-9a-f]{64}) \(gzip", r.stdout).groups()
            t0 = time.monotonic()
            with steps.step("the run's signed validation (the installed copy's, clean beside it)"):
                beside = validate_with_clean_beside(
                    installed, ["--attest", "--sign-key", cosign_keys["key"], "--registry", host, "--reports",
                                str(reports), "--progress", "plain"],
                    {**env, "GITHUB_STEP_SUMMARY": str(summary)}, f"validated-{os.getpid()}", default_build[0].id)
            assert beside["rc"] == 0, f"validate --attest failed:\n{beside['out'][-6000:]}"
            assert "signed this run's validation (green)" in beside["out"], beside["out"][-2000:]
            done = {"seconds": time.monotonic() - t0, "push": pushed, "beside": beside}
            save(done)
    print(f"\npush of the default image: {done['push']['seconds']:.0f} s; full non-GPU validator suite, signed: "
          f"{done['seconds']:.1f} s")
    return {"reports": reports, "summary": summary, "seconds": done["seconds"], "target": default_build[0],
            "record": default_build[1], "registry": host, "push": done["push"], "beside": done["beside"]}


@pytest.fixture(scope="session")
def devel_build(default_build, test_ca):
    """The devel target, built after the default (its system and torch layers come from the default's cache). Once per
    run: the canary of `devel_canary` and test_devel_target.py hold the same image."""
    from devel_canary import DEVEL
    from state_here import records

    from gpuforge.plan.matrix import load_matrix

    [t] = load_matrix().select(DEVEL)
    with once_per_run("devel-build") as (rec, save):
        if rec is None:
            with steps.step("the devel build"):
                r = gpuforge("build", *DEVEL, "--extra-ca", str(test_ca["bundle"]), "--progress", "plain")
            assert r.returncode == 0, f"devel build failed:\n{r.stdout[-4000:]}\n{r.stderr[-3000:]}"
            rec = records.require_build(t.id).model_dump(exclude_none=True)  # JSON: saved for the other workers
            save(rec)
    _keep(t, rec)
    return t, rec


@pytest.fixture(scope="session")
def devel_canary(devel_build, validated, cosign_keys):
    """`gpuforge canary --env dev` of the devel image, once per run (tests/devel_canary.py): the canary's claims
    (test_registry.py) and the devel image's full validation (test_devel_target.py) are one run of every validator."""
    import tempfile

    from devel_canary import run
    from registries import PASSWORD, USER

    with once_per_run("devel-canary") as (done, save):
        if done is None:
            here = Path(tempfile.mkdtemp(prefix="devel-canary-", dir=os.environ["GPUFORGE_STATE_DIR"]))
            done = run(*devel_build, validated, cosign_keys, here, USER, PASSWORD)
            save(done)
    return done


# --- the suite leaves the checkout as it found it -------------------------------------------------------------
# It once rewrote target.json, .dockerignore and the bake file in place: that fails on a read-only checkout and
# races in parallel runs. Compared at the end of the session: git's view of the tree (modified and untracked files,
# ignored ones left out), the bytes of every file it lists, and each tracked file's mtime (a rewrite of the same
# bytes is still a write).

def _tree_state() -> dict[str, str] | None:
    import hashlib

    try:
        r = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain=v1", "-uall"], capture_output=True, text=True,
                           timeout=60, check=True)
    except (OSError, subprocess.SubprocessError):
        return None  # not a git checkout (an unpacked sdist): nothing to compare against
    state = {}
    for line in r.stdout.splitlines():
        path = ROOT / line[3:].split(" -> ")[-1]
        state[line] = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "-"
    tracked = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, text=True, timeout=60,
                             check=False).stdout.split("\0")
    for rel in filter(None, tracked):
        with contextlib.suppress(OSError):
            state[f"mtime {rel}"] = str((ROOT / rel).stat().st_mtime_ns)
    return state


def pytest_sessionstart(session):
    session.config._gpuforge_tree = _tree_state()
    if not hasattr(session.config, "workerinput"):  # the controller (or the only process) watches the disk
        _DISK.begin()


def pytest_sessionfinish(session, exitstatus):
    before = getattr(session.config, "_gpuforge_tree", None)
    if before is None or session.config.option.collectonly:
        return
    after = _tree_state()
    if after != before:
        changed = sorted({k for k, _ in set(before.items()) ^ set(after.items())})
        print(f"\ngpuforge tests: the run changed the checkout: {changed[:10]}", file=sys.stderr)
        session.exitstatus = 1


# --- the longest modules start first (`nox -s tests` runs modules on noxfile.WORKERS workers, a whole module each) ----
# xdist's loadfile scheduler gives each of the N workers one module in this order, then hands a worker the next module
# whenever it has 2 or fewer *tests* pending. The engine matrix has 2 tests, so its worker takes module N+1
# (test_buildx) at once and runs it after the engine matrix: the two modules that each hold a second engine's 6 GB
# image beside the default image never run side by side (they took 56 GB of disk that way). test_registry's worker
# takes more only near its end. tests/unit/core/test_module_order.py checks the counts. Seconds: a full run of
# `nox -s tests` on 2 cores (2026-12-05; the engine matrix and test_buildx 2026-12-06), an engine pruned to nothing, as
# CI's is, two workers; the default build, the run's push and signed validation (~520 s) count in test_registry, which
# needs them first.
LONGEST_FIRST = (
    "tests/integration/publish/test_engine_matrix.py",      # ~760 s: a second engine's cold build, a validation, zstd,
                                                            # the classic devel build
    "tests/integration/publish/test_registry.py",           # ~940 s: cold default build, the installed copy's venv, the
                                                            # run's push + validation (with clean beside it), the devel
                                                            # build and its canary (the devel image's full validation)
    "tests/integration/builder/test_buildx.py",             # ~110 s: after the engine matrix, on its worker
    "tests/integration/workflows/test_act.py",              # ~590 s: the shipped workflows under act, on the worker
                                                            # free first: two image jobs (push, validation, dev), ci
    "tests/integration/validate/test_broken_images.py",     # ~220 s: then the two parts of the validators' tests, one
    "tests/integration/validate/test_validators.py",        # ~100 s  to each worker, as each nears its end
    "tests/integration/validate/test_devel_target.py",      # ~40 s: the broken devel images (`devel_canary` validated it)
    "tests/integration/builder/test_build.py",              # ~40 s
    "tests/integration/core/test_install.py",               # seconds: asserts what the run's validation did
    "tests/integration/publish/test_fleet_promotion.py",    # ~15 s: its push mounts the run's layers
    "tests/integration/core/test_clean.py",                 # ~10 s
)


def pytest_collection_modifyitems(config, items):
    rank = {m: i for i, m in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda it: rank.get(it.nodeid.split("::", 1)[0], len(rank)))  # stable: module order kept


# --- where the run's time went: one row per test module (setup, call and teardown summed), at the end of the run ---
_MODULE_SECONDS: dict[str, float] = {}
_MODULE_TESTS: dict[str, int] = {}


_SPANS: dict[tuple[str, str], list[float]] = {}  # (worker, module) -> [first report's start, last report], monotonic
_STEPS: list[tuple[float, str, str, float]] = []  # (seconds, step, module, start in epoch seconds): tests/steps.py


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    outcome.get_result().user_properties.extend(steps.take())


def pytest_runtest_logreport(report):
    module = report.nodeid.split("::", 1)[0]
    _STEPS.extend((secs, name, module, began) for key, (name, secs, began) in
                  (p for p in report.user_properties if len(p) == 2 and p[0] == steps.KEY))
    node = getattr(report, "node", None)  # in xdist's controller: the worker that ran the test
    worker = node.gateway.id if node else "main"
    _DISK.running[worker] = module
    span = _SPANS.setdefault((worker, module), [time.monotonic() - report.duration, 0.0])
    span[1] = time.monotonic()
    _MODULE_SECONDS[module] = _MODULE_SECONDS.get(module, 0.0) + report.duration
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        _MODULE_TESTS[module] = _MODULE_TESTS.get(module, 0) + 1


# --- the disk the run takes: CI once ran out of it (two workers, each with a 6 GB image in flight) ----------------------
class _DiskWatch:
    """Samples the free space of the filesystems the run writes to (the engine's data root, /tmp, /var/tmp) every 2 s
    in the controlling process; the summary prints the lowest, when, and which modules were running then."""

    PATHS = ("/var/lib/docker", "/tmp", "/var/tmp")
    NEEDED = 50e9  # a whole run took 45 GB at its lowest point on a cold engine (33-35 GB on a warm one; docs/ci.md)

    def __init__(self):
        self.running: dict[str, str] = {}  # worker -> the module of its latest report
        self.start: dict[str, int] = {}
        self.low: dict[str, tuple[int, float, str]] = {}  # filesystem -> (free bytes, seconds in, modules then)
        self.t0 = self.wall0 = 0.0  # the run's start: monotonic, and epoch seconds (steps started in workers)

    def _devices(self) -> dict[str, str]:
        seen = {}
        for p in self.PATHS:
            with contextlib.suppress(OSError):
                seen.setdefault(str(os.stat(p).st_dev), p)
        return seen

    def begin(self):
        import shutil
        import threading

        self.t0, self.wall0 = time.monotonic(), time.time()
        devs = self._devices()
        self.start = {p: shutil.disk_usage(p).free for p in devs.values()}
        for p, free in self.start.items():
            if free < self.NEEDED:  # said at once: a registry then answers 500 to an upload, 20 minutes in
                print(f"\ngpuforge tests: warning: {free / 1e9:.1f} GB free on {p}; a whole run takes about "
                      f"{self.NEEDED / 1e9:.0f} GB (docs/ci.md, Disk: `docker builder prune`, old images)", file=sys.stderr)

        def sample():
            while True:
                for p in devs.values():
                    with contextlib.suppress(OSError):
                        free = shutil.disk_usage(p).free
                        if p not in self.low or free < self.low[p][0]:
                            self.low[p] = (free, time.monotonic() - self.t0, ", ".join(sorted(set(self.running.values()))))
                time.sleep(2)

        threading.Thread(target=sample, daemon=True, name="disk-watch").start()

    def lines(self) -> list[str]:
        gb = 1e9
        return [f"{p}: {self.start[p] / gb:.1f} GB free at the start, lowest {free / gb:.1f} GB "
                f"({(self.start[p] - free) / gb:.1f} GB taken) at {at:.0f} s, while {mods or 'no module had reported'}"
                for p, (free, at, mods) in self.low.items()]


_DISK = _DiskWatch()


def pytest_terminal_summary(terminalreporter):
    if _DISK.low:
        terminalreporter.section("disk")
        for line in _DISK.lines():
            terminalreporter.write_line(line)
    if _STEPS:
        terminalreporter.section("slowest steps")
        terminalreporter.write_line(f"{'seconds':>9} {'from':>6}  step (module); from: seconds into the run")
        for secs, name, module, began in sorted(_STEPS, reverse=True)[:20]:
            terminalreporter.write_line(f"{secs:9.1f} {began - _DISK.wall0:6.0f}  {name}  ({module.rsplit('/', 1)[-1]})")
    if len({w for w, _ in _SPANS}) > 1:
        terminalreporter.section("modules per worker")
        terminalreporter.write_line("from-to: seconds into the run; modules under 20 s counted, not named")
        for worker in sorted({w for w, _ in _SPANS}):
            spans = sorted((b - _DISK.t0, e - _DISK.t0, m) for (w, m), (b, e) in _SPANS.items() if w == worker)
            big = [f"{m.rsplit('/', 1)[-1]} {b:.0f}-{e:.0f}" for b, e, m in spans if e - b >= 20]
            small = [e - b for b, e, m in spans if e - b < 20]
            terminalreporter.write_line("; ".join([f"{worker}: ends {spans[-1][1]:.0f} s", *big,
                                                   f"{len(small)} more modules, {sum(small):.0f} s"]))
    if not _MODULE_SECONDS:
        return
    total = sum(_MODULE_SECONDS.values())
    tr = terminalreporter
    tr.section("time per test module")
    tr.write_line(f"{'seconds':>9} {'share':>6} {'tests':>6}  module")
    shown = [(m, s) for m, s in sorted(_MODULE_SECONDS.items(), key=lambda kv: -kv[1]) if s >= 1.0 or len(_MODULE_SECONDS) <= 40]
    for module, secs in shown:
        tr.write_line(f"{secs:9.1f} {secs / max(total, 1e-9):6.1%} {_MODULE_TESTS.get(module, 0):6d}  {module}")
    left = len(_MODULE_SECONDS) - len(shown)
    tr.write_line(f"{total:9.1f} {'100%':>6} {sum(_MODULE_TESTS.values()):6d}  all {len(_MODULE_SECONDS)} modules"
                  + (f" ({left} under 1 s not listed)" if left else "")
                  + "; a session fixture's time (the default build) counts in the first module that uses it")
