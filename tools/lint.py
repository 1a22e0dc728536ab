"""`nox -s lint`: hadolint (generated Dockerfiles), ruff (Python), mypy (the package, strict: [tool.mypy] in
pyproject.toml), shellcheck (scripts), the workflows
(check-jsonschema + zizmor, tools/workflows.py) and the lock file (requirements/dev.lock matches pyproject.toml).

Repository maintenance, not part of the package: run from the checkout (`python tools/lint.py`).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import workflows
from gpuforge.engine.client import echo_cmd
from gpuforge.render import locks

ROOT = Path(__file__).resolve().parent.parent  # tools/ lives in the checkout it lints
PYTHON = ["gpuforge", "validators", "tests", "tools", "noxfile.py", "images/context", "images/programs"]
SHELL = ["images/context/entrypoint.sh", "tools/start-engine.sh", "tools/runner-setup.sh", ".ci/run"]


def _run(argv: list[str]) -> bool:
    tool = Path(sys.executable).parent / argv[0]  # the venv's copy (the wheels ship the binaries)
    if tool.exists():
        argv = [str(tool), *argv[1:]]
    echo_cmd(argv)
    return subprocess.run(argv, cwd=ROOT).returncode == 0


def main() -> int:
    ok = True
    dockerfiles = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "images" / "dist").glob("*/Dockerfile"))
    if not dockerfiles:
        print("lint: no generated Dockerfiles; run `gpuforge generate`", file=sys.stderr)
        ok = False
    else:
        ok &= _run(["hadolint", "--config", ".hadolint.yaml", *dockerfiles])
    ok &= _run(["ruff", "check", *PYTHON])
    ok &= _run(["mypy"])  # its files and strictness are in pyproject.toml's [tool.mypy]
    ok &= _run(["shellcheck", *SHELL])
    bad = workflows.problems(sorted((ROOT / ".github" / "workflows").glob("*.yml")))
    bad += locks.dev_lock_problems(ROOT)
    for b in bad:
        print(f"lint: {b}", file=sys.stderr)
    ok &= not bad
    print("lint: clean" if ok else "lint: findings above", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
