"""Where things are. Package data (templates, compat data) comes from importlib.resources; the
project checkout (matrix.yaml, images/, validators/) is found once, here, so a normal (non-editable)
install works from the repository root.
"""

from __future__ import annotations

import functools
from pathlib import Path

from gpuforge import options
from gpuforge.errors import ConfigError

# What every image may COPY from the one build context (the project root). The root .dockerignore is
# generated from this list (render.dockerignore), and the recipe hash covers exactly these files.
CONTEXT_PATHS = ("gpuforge/__init__.py", "gpuforge/image", "images/context", "images/programs")
MARKERS = options.CHECKOUT_MARKERS


_given: list[Path] = []  # the checkout the entry point named (use_root), if any


def use_root(root: Path | None) -> None:
    """The checkout this process works on, named once by its entry point: the CLI's root setting (GPUFORGE_ROOT,
    checked by gpuforge.options), the validator plugin's own checkout; None: found from the cwd again."""
    _given[:] = [Path(root)] if root else []


def project_root() -> Path:
    """The checkout named by use_root(), else the nearest folder at or above the cwd that holds images/context and
    validators/."""
    if _given:
        return _given[0]
    return _found(Path.cwd().resolve())


@functools.cache
def _found(here: Path) -> Path:
    for d in (here, *here.parents):
        if all((d / m).is_dir() for m in MARKERS):
            return d
    msg = (f"no gpuforge checkout at or above {here} (a folder with {' and '.join(MARKERS)}); "
           "run from the repository root or set GPUFORGE_ROOT")
    raise ConfigError(msg)


def dist() -> Path:
    return project_root() / "images" / "dist"


def checkout_revision(root: Path | None = None) -> tuple[str | None, bool | None]:
    """(commit, dirty) of the checkout, the one rule for every label and signed run block: dirty is any change git
    reports, tracked or untracked (an untracked file under images/ or validators/ changes what is built or run);
    ignored files do not count. (None, None) outside a git checkout or without git."""
    import subprocess

    where = str(root or project_root())
    try:
        rev = subprocess.run(["git", "-C", where, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=30)
        if rev.returncode != 0:
            return None, None
        st = subprocess.run(["git", "-C", where, "status", "--porcelain"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None, None
    return rev.stdout.strip(), (bool(st.stdout.strip()) if st.returncode == 0 else None)


def validators() -> Path:
    return project_root() / "validators"


def programs() -> Path:
    """The in-image programs (smoke, inductor CPU, multi-GPU, perf), as the host has them."""
    return project_root() / "images" / "programs"


def context_files(root: Path | None = None) -> dict[str, bytes]:
    """Every file the images may COPY from the shared context, relative path -> bytes (sorted)."""
    root = root or project_root()
    out: dict[str, bytes] = {}
    for rel in CONTEXT_PATHS:
        p = root / rel
        files = [p] if p.is_file() else sorted(f for f in p.rglob("*") if f.is_file())
        for f in files:
            if "__pycache__" in f.parts or f.suffix == ".pyc":
                continue
            out[str(f.relative_to(root))] = f.read_bytes()
    return dict(sorted(out.items()))
