"""The newcomer path is one path: README's set-up step and test command are what .ci/run runs, and the
set-up script pins what it takes from trixie (and only that) at apt priority 100."""

from __future__ import annotations

import re

from conftest import ROOT

SCRIPT = (ROOT / "tools" / "start-engine.sh").read_text()


def _commands(text: str) -> list[str]:
    return [line.split("#")[0].strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def test_ci_runs_the_readme_commands():
    readme = (ROOT / "README.md").read_text()
    ci = _commands((ROOT / ".ci" / "run").read_text())
    assert "bash tools/start-engine.sh" in ci and "nox -s lint tests" in ci
    blocks = re.findall(r"```bash\n(.*?)```", readme, re.S)
    shown = [c for b in blocks for c in _commands(b)]
    assert {"bash tools/start-engine.sh", "nox -s lint tests", "nox -s build validate"} <= set(shown), shown
    assert not any("pip install" in c for c in ci), ".ci/run must install nothing the README's set-up step does not"


def test_trixie_packages_are_pinned_and_held_at_priority_100():
    [entries] = re.findall(r"^TRIXIE=\(([^)]*)\)$", SCRIPT, re.M)
    pkgs = entries.split()
    assert "docker-buildx=0.13.1+ds1-3" in pkgs
    assert all(re.fullmatch(r"[a-z0-9.+-]+=[0-9][\w.+:~-]*", p) for p in pkgs), pkgs
    assert "Pin: release n=trixie\\nPin-Priority: 100" in SCRIPT
    assert '-t trixie --no-install-recommends "${trixie_need[@]}"' in SCRIPT


def test_nox_comes_from_the_hashed_lock():
    assert "--require-hashes --no-deps -r requirements/nox.lock" in SCRIPT
    assert 'exec sudo' in SCRIPT  # a non-root user with sudo gets the same path


def test_the_set_up_step_puts_gpuforge_on_path():
    """gpuforge's own venv from the hashed dev lock, the checkout editable without re-resolving, linked on PATH;
    each step skipped when already done (idempotent). Run for real in tests/integration/core/test_setup_cli.py."""
    # with the nox venv's pinned uv when it is there (about 1 s for the lock, against pip's 15 s), else pip
    assert '"$NOX_VENV/bin/uv" pip install -q --python "$GF_VENV/bin/python" "$@"' in SCRIPT
    assert 'else "$GF_VENV/bin/python" -m pip install -q "$@"; fi' in SCRIPT
    assert 'gf_pip --require-hashes -r "$parts/resolved.lock"' in SCRIPT  # the lock less its apart part (test_locks.py)
    assert 'gf_pip --python-version "$apart_python" --no-deps --require-hashes -r "$parts/apart.lock"' in SCRIPT
    assert 'gf_pip --ignore-requires-python --no-deps --require-hashes -r "$parts/apart.lock"' in SCRIPT
    assert 'gf_pip --no-deps -e "$PWD"' in SCRIPT
    assert 'ln -sf "$GF_VENV/bin/gpuforge" "$GF_BIN/gpuforge"' in SCRIPT
    assert "GF_VENV=${GPUFORGE_SETUP_VENV:-/opt/gpuforge}" in SCRIPT and "GF_BIN=${GPUFORGE_SETUP_BIN:-/usr/local/bin}" in SCRIPT
    assert 'if ! cmp -s requirements/dev.lock "$GF_VENV/dev.lock"' in SCRIPT  # the lock only when it changed
    readme = (ROOT / "README.md").read_text()
    assert "linked as `/usr/local/bin/gpuforge`" in readme
