"""Thin sessions over the gpuforge package; session.posargs pass through (e.g. selectors)."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import nox

nox.options.sessions = ["lint", "tests"]
nox.options.reuse_venv = "yes"
# uv (requirements/nox.lock puts it beside nox) makes a session's venv in about 1 s where pip takes 15 s; nox falls
# back to virtualenv + pip where uv is absent. uv reads no pip.conf: a private index is UV_INDEX_URL (docs/ci.md).
nox.options.default_venv_backend = "uv|virtualenv"
PY = "3.11"


# two workers on two cores (tests/conftest.py orders the modules). A third filled the cores' waits here (21.1 min against
# 21.9), but CI ran it in 1,338 s against two workers' 1,207 s (docs/measurements/ci-suite.md). The 25 slowest steps are
# listed beside the per-module table: where the next cut of the run's time is
WORKERS = 2
PARALLEL = ["-n", str(WORKERS), "--dist", "loadfile", "--no-loadscope-reorder", "--durations", "25"]
LOCK = "requirements/dev.lock"  # every dependency and extra, pinned with hashes (`nox -s lock` rewrites it)


# the lock's last part: wheels whose Requires-Python is newer than this Python though they run on it (pyproject's
# [tool.gpuforge.apart]), after a line naming the Python to install them as for (gpuforge.render.locks.APART)
APART = re.compile(r"^# --- installed apart, as for Python ([0-9.]+):.*$", re.M)


def _install(session: nox.Session, *extras: str) -> None:
    """The locked environment (hash-checked), then gpuforge itself without resolving anything. The lock's apart part
    goes in last, with no dependency resolved: uv as for the Python its line names, pip ignoring Requires-Python."""
    text = Path(LOCK).read_text()
    m = APART.search(text)
    with tempfile.TemporaryDirectory() as tmp:
        parts = Path(tmp, "resolved.lock"), Path(tmp, "apart.lock")
        parts[0].write_text(text[:m.start()] if m else text)
        session.install("--require-hashes", "-r", str(parts[0]))
        if m:
            parts[1].write_text(text[m.start():])
            how = ["--python-version", m[1]] if session.venv_backend == "uv" else ["--ignore-requires-python"]
            session.install(*how, "--no-deps", "--require-hashes", "-r", str(parts[1]))
    session.install("--no-deps", "-e", ".")


@nox.session(python=PY)
def generate(session: nox.Session) -> None:
    """Render images/dist/ from matrix.yaml (`-- --check` to only check for drift)."""
    _install(session)
    session.run("gpuforge", "generate", *session.posargs)


@nox.session(python=PY, default=False, tags=["maintenance"])
def schema(session: nox.Session) -> None:
    """Regenerate matrix.schema.json from the pydantic models."""
    _install(session)
    session.run("gpuforge", "schema", *session.posargs)


@nox.session(python=PY)
def lint(session: nox.Session) -> None:
    """hadolint the generated Dockerfiles, ruff, mypy, shellcheck, zizmor + the workflow schema, the lock is current."""
    _install(session, "lint")
    session.run("python", "tools/lint.py", *session.posargs)


@nox.session(python=PY, name="plan")
def plan(session: nox.Session) -> None:
    """Print the expanded targets (`-- --json` for a GitHub Actions matrix)."""
    _install(session)
    session.run("gpuforge", "plan", *session.posargs)


@nox.session(python=PY)
def matrix(session: nox.Session) -> None:
    """Alias of plan, for workflows: `nox -s matrix -- --json`."""
    _install(session)
    session.run("gpuforge", "plan", *session.posargs)


@nox.session(python=PY)
def build(session: nox.Session) -> None:
    """Build the selected targets (default: the matrix default) into images."""
    _install(session)
    session.run("gpuforge", "build", *session.posargs, external=False)


@nox.session(python=PY)
def validate(session: nox.Session) -> None:
    """Run the validators against the built targets; reports under reports/."""
    _install(session, "validate")
    session.run("gpuforge", "validate", *session.posargs)


@nox.session(python=PY)
def smoke(session: nox.Session) -> None:
    """GPU driver + smoke validators against HOST: `nox -s smoke -- local:// --expect torch=...`."""
    _install(session, "validate")
    session.run("gpuforge", "smoke", *(session.posargs or ["local://"]))


@nox.session(python=PY)
def push(session: nox.Session) -> None:
    """Push built targets to the registry and record their digests."""
    _install(session)
    session.run("gpuforge", "push", *session.posargs)


@nox.session(python=PY)
def pull(session: nox.Session) -> None:
    """Pull the pushed digests of built targets into the engine (credentials never in a docker config)."""
    _install(session)
    session.run("gpuforge", "pull", *session.posargs)


@nox.session(python=PY)
def promote(session: nox.Session) -> None:
    """Promote validated digests: `nox -s promote -- --env dev` (evidence: `nox -s validate -- --attest`)."""
    _install(session)
    session.run("gpuforge", "promote", *session.posargs)


@nox.session(python=PY)
def tests(session: nox.Session) -> None:
    """The toolkit's own tests: unit + integration against a real engine and registry."""
    _install(session, "validate", "lint")
    # CI runs everything, the `heavy` engine matrix included; locally `nox -s tests -- tests/unit tests/integration
    # -ra -m "not heavy"` leaves it out (docs/ci.md). Two workers, a whole module each at a time (its module-scoped
    # registries and engines stay in one process), the longest modules first (tests/conftest.py: LONGEST_FIRST):
    # the modules wait on different things (a second engine's export, a push's gzip, containers) side by side.
    session.run("pytest", *(session.posargs or ["tests/unit", "tests/integration", "-ra", *PARALLEL]))


@nox.session(python=PY, default=False, tags=["maintenance"])
def lock(session: nox.Session) -> None:
    """Re-resolve requirements/*.lock (gpuforge's environments) and the images' locks with uv, pinned."""
    _install(session)
    session.run("python", "-c", "from pathlib import Path; from gpuforge.render import locks; "
                "print(*locks.compile_dev_locks(Path('.')), sep='\\n')")
    session.run("gpuforge", "lock")
    session.run("gpuforge", "generate")


@nox.session(python=PY, default=False, tags=["bench"])
def bench(session: nox.Session) -> None:
    """Build benchmark: warm gpuforge vs plain docker build (`-- --cold`: uv vs pip vs a naive Dockerfile);
    `-- --pull [--rounds N]`: gzip vs zstd layers pulled into a fresh engine (tools/bench_pull.py);
    `-- --ready [--rounds N] [--rates 1gbit,200mbit]`: cold start by readiness, gzip vs zstd vs SOCI lazy pulling
    behind a shaped link (tools/bench_ready.py)."""
    _install(session)
    tool = ("tools/bench_pull.py" if "--pull" in session.posargs else
            "tools/bench_ready.py" if "--ready" in session.posargs else "tools/bench_build.py")
    session.run("python", tool, *session.posargs)


@nox.session(python=PY, default=False, tags=["bench"])
def bench_matrix(session: nox.Session) -> None:
    """Matrix benchmark: hostile matrices (time, peak RSS, budgets) and a 2,000-target plan vs d32d7c3."""
    _install(session)
    session.run("python", "tools/bench_matrix.py", *session.posargs)


@nox.session(python=False, default=False, tags=["maintenance"])
def engine(session: nox.Session) -> None:
    """Install and start a local Docker engine + registry tools on a bare Debian box (root)."""
    session.run("bash", "tools/start-engine.sh", external=True)


@nox.session(python=PY, default=False, tags=["maintenance"])
def clean(session: nox.Session) -> None:
    """Remove containers left by a crashed run."""
    _install(session)
    session.run("gpuforge", "clean")


@nox.session(python=PY, name="fleet")
def fleet(session: nox.Session) -> None:
    """The fleet commands: `nox -s fleet -- cve-gate|outdated|support|release-notes|prod-sboms|canary ...`
    (docs/fleet.md, docs/cve.md, docs/promotion.md)."""
    _install(session)
    allowed = ("cve-gate", "outdated", "support", "release-notes", "prod-sboms", "canary")
    if not session.posargs or session.posargs[0] not in allowed:
        session.error(f"nox -s fleet -- COMMAND ...: COMMAND is one of {', '.join(allowed)}")
    session.run("gpuforge", *session.posargs)
