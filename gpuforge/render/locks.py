"""Pins for everything pip installs, resolved by uv (pinned) and committed.

- gpuforge's own environments: requirements/dev.lock (pyproject's deps + extras, with hashes) and
  requirements/nox.lock (nox itself, for the set-up script); nox installs with --require-hashes.
- the images: gpuforge/render/data/locks/image-py<PY>-torch<T>.txt, one per Python + torch of the fleet,
  the whole tree (JupyterLab's included) except what compat pins per CUDA variant (torch, torchvision,
  torchaudio, triton, nvidia-*). `gpuforge generate` merges it into each target's constraints.txt.

Compiling needs the index (`gpuforge lock`, `nox -s lock`); checking that a lock is current does not:
each lock's header holds the hash of its inputs.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
import tempfile
import tomllib
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuforge import paths
from gpuforge.errors import ConfigError
from gpuforge.render import packages
from gpuforge.state import files

if TYPE_CHECKING:
    from gpuforge.image.compat import Variant
    from gpuforge.plan.target import Target

UV = "uv==0.13.8"  # gpuforge's resolver; the images pin their own uv in data/image.yaml
PLATFORM = ("--python-platform", "x86_64-manylinux_2_28")
DEV_PYTHON = "3.11"  # nox sessions' Python (noxfile.PY)
PYPI = "https://pypi.org/simple"
# pinned per CUDA variant by compat (constraints + the template's exact torch pins), so not locked here
_VARIANT = re.compile(r"^(torch|torchvision|torchaudio|triton|nvidia-[a-z0-9-]+-cu[0-9]+)$")
LOCKS = "data/locks"  # the image locks, below gpuforge/render: package data, committed
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(text: str) -> dict[str, str]:
    """name -> version of every `name==version` line (hash continuation lines and comments skipped)."""
    out = {}
    for line in text.splitlines():
        m = _PIN.match(line.strip())
        if m:
            out[_norm(m.group(1))] = m.group(2)
    return out


def inputs_hash(lines: list[str]) -> str:
    return "sha256:" + hashlib.sha256("\n".join(sorted(lines)).encode()).hexdigest()[:16]


def header_hash(text: str) -> str | None:
    m = re.search(r"^# inputs: (sha256:[0-9a-f]+)$", text, re.M)
    return m.group(1) if m else None


def _uv_compile(reqs: list[str], constraints: list[str], python: str, extra: list[str]) -> str:
    with tempfile.TemporaryDirectory(prefix="gpuforge-lock-") as tmp:
        r, c = Path(tmp) / "in.txt", Path(tmp) / "c.txt"
        r.write_text("\n".join(reqs) + "\n")
        c.write_text("\n".join(constraints) + "\n")
        argv = [sys.executable, "-m", "uv", "pip", "compile", str(r), "-c", str(c), "--python-version", python, *PLATFORM,
                "--index-url", PYPI, "--no-header", "--no-config", "-q", *extra]
        p = subprocess.run(argv, capture_output=True, text=True)
    if p.returncode != 0:
        tail = " | ".join(p.stderr.strip().splitlines()[-3:])
        msg = f"uv pip compile failed for Python {python}: {tail} (is `{UV}` installed and the index reachable?)"
        raise ConfigError(msg)
    return p.stdout


# ---- images -------------------------------------------------------------------------------------

def image_inputs(targets: list[Any]) -> dict[str, list[str]]:
    """lock name -> its input requirement lines, for the Pythons and torch versions of `targets`."""
    groups: dict[str, set[str]] = {}
    for t in targets:
        v = t.variant
        name = f"image-py{t.python.replace('.', '')}-torch{v.torch.replace('.', '')}"
        groups.setdefault(name, set()).update({
            f"# python {t.python}", f"torch=={v.torch}", f"torchvision=={v.torchvision}", f"torchaudio=={v.torchaudio}",
            f"triton=={v.triton}", f"uv=={packages.image_spec()['uv']}", *packages.pip_tools(t),
            *packages.metrics_tools()})
    return {k: sorted(v) for k, v in sorted(groups.items())}


def image_lock_name(t: Target) -> str:
    return f"image-py{t.python.replace('.', '')}-torch{t.variant.torch.replace('.', '')}"


def image_lock_text(name: str) -> str | None:
    f = resources.files("gpuforge.render").joinpath(f"{LOCKS}/{name}.txt")
    return f.read_text() if f.is_file() else None


def locks_to_write() -> Path:
    """Where `gpuforge lock` writes the image locks: the checkout's gpuforge/render/data/locks, and only when that
    is the package data this gpuforge reads (an editable install, as nox's sessions make). `generate` reads the
    locks from the package it runs from, so locks written into an installed copy are never committed and vanish with
    the next install, and locks written into the checkout would not reach `generate` until a reinstall: refused."""
    installed = Path(str(resources.files("gpuforge.render").joinpath(LOCKS)))
    source = paths.project_root() / "gpuforge" / "render" / LOCKS
    if installed.resolve() != source.resolve():
        msg = (f"`gpuforge lock` rewrites the image locks `gpuforge generate` reads, which are gpuforge's package "
               f"data, and this gpuforge reads them from {installed}, not from the checkout ({source}): install the "
               "checkout editable (`pip install --no-deps -e .`, as `nox -s lock` does) and run it from there")
        raise ConfigError(msg)
    return source


def image_pins(t: Target) -> dict[str, str]:
    """The locked versions for target t (empty when its lock is missing: `generate --check` says so)."""
    text = image_lock_text(image_lock_name(t))
    return pins(text) if text else {}


def stale_image_locks(targets: list[Any]) -> list[str]:
    """Lock files that are missing or were compiled from other inputs (a pin in image.yaml changed...)."""
    bad = []
    for name, lines in image_inputs(targets).items():
        text = image_lock_text(name)
        if text is None or header_hash(text) != inputs_hash(lines):
            bad.append(f"gpuforge/render/{LOCKS}/{name}.txt")
    return bad


def compile_image_locks(targets: list[Any], out_dir: Path) -> list[Path]:
    written = []
    pypi_default = {t.variant.torch: t.variant for t in targets}
    for name, lines in image_inputs(targets).items():
        python = next(x.split()[-1] for x in lines if x.startswith("# python"))
        reqs = [x for x in lines if not x.startswith("#")]
        torch = next(x.split("==")[1] for x in reqs if x.startswith("torch=="))
        # resolve against PyPI's default torch wheel; its CUDA wheels are dropped below (compat pins them)
        nvidia = [f"{k}=={v}" for k, v in sorted(_pypi_variant(pypi_default[torch]).nvidia_pins.items())]
        text = _uv_compile(reqs, nvidia, python, ["--no-annotate"])
        kept = [f"{n}=={v}" for n, v in sorted(pins(text).items()) if not _VARIANT.match(n)]
        head = (f"# Generated by `gpuforge lock` ({UV} pip compile, Python {python}, linux x86_64); do not edit.\n"
                "# Every package the image installs except torch/torchvision/torchaudio/triton/nvidia-* (compat pins).\n"
                f"# inputs: {inputs_hash(lines)}\n")
        written.append(files.write_output(out_dir / f"{name}.txt", head + "".join(k + "\n" for k in kept)))
    return written


def _pypi_variant(v: Variant) -> Variant:
    from gpuforge.image import compat

    name = compat.data()["torch"][v.torch]["pypi_default_variant"]
    return next(x for x in (compat.variant(v.torch, c) for c in compat.cuda_variants(v.torch)) if x and x.name == name)


# ---- gpuforge's own environments ----------------------------------------------------------------

# The dev lock's last part: wheels whose Requires-Python is newer than the Python they run on (pyproject's
# [tool.gpuforge.apart]), installed after this line with no dependency resolved, as for the Python it names:
# tools/start-engine.sh and noxfile.py read the line.
APART = "# --- installed apart, as for Python {python}: their Requires-Python is not checked ([tool.gpuforge.apart]) ---"
_APART = re.compile(r"^# --- installed apart, as for Python ([0-9.]+):", re.M)


def apart(pyproject: Path) -> tuple[str, list[str]]:
    """(the Python the apart part is installed as for, its pins) from pyproject's [tool.gpuforge.apart]."""
    a = tomllib.loads(pyproject.read_text()).get("tool", {}).get("gpuforge", {}).get("apart", {})
    return str(a.get("python", "")), list(a.get("packages", []))


def project_pins(pyproject: Path) -> dict[str, str]:
    data = tomllib.loads(pyproject.read_text())["project"]
    lines = [*data["dependencies"], *(x for extra in data.get("optional-dependencies", {}).values() for x in extra),
             *apart(pyproject)[1]]
    return pins("\n".join(lines))


def dev_lock_problems(root: Path) -> list[str]:
    """Why requirements/dev.lock does not match pyproject.toml (empty when it is current)."""
    lock = root / "requirements" / "dev.lock"
    if not lock.is_file():
        return [f"{lock} is missing; run `nox -s lock`"]
    text = lock.read_text()
    have = pins(text)
    bad = []
    for name, ver in project_pins(root / "pyproject.toml").items():
        if have.get(name) != ver:
            bad.append(f"{name}=={ver} (lock: {have.get(name, 'absent')})")
    python, packages = apart(root / "pyproject.toml")
    m = _APART.search(text)
    if packages and (m is None or m.group(1) != python or set(pins(text[m.end():])) != set(pins("\n".join(packages)))):
        bad.append(f"its apart part is not {', '.join(packages)} as for Python {python}")
    if bad:
        return [f"requirements/dev.lock is stale ({', '.join(bad)}); run `nox -s lock`"]
    return []


def _compile_hashed(root: Path, name: str, src: str, args: list[str]) -> str:
    argv = [sys.executable, "-m", "uv", "pip", "compile", src, *args, "--generate-hashes", *PLATFORM, "--index-url",
            PYPI, "--no-config", "--no-header", "-q"]
    p = subprocess.run(argv, capture_output=True, text=True, cwd=root)
    if p.returncode != 0:
        msg = f"uv pip compile for {name} failed: {' | '.join(p.stderr.strip().splitlines()[-3:])}"
        raise ConfigError(msg)
    return p.stdout


def compile_dev_locks(root: Path) -> list[Path]:
    data = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    extras = [a for e in data.get("optional-dependencies", {}) for a in ("--extra", e)]
    python, packages = apart(root / "pyproject.toml")
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "nox.in").write_text((root / "requirements" / "nox.in").read_text())
        (Path(tmp) / "apart.in").write_text("".join(f"{x}\n" for x in packages))
        texts = {"dev.lock": _compile_hashed(root, "dev.lock", str(root / "pyproject.toml"),
                                             [*extras, "--python-version", DEV_PYTHON]),
                 "nox.lock": _compile_hashed(root, "nox.lock", str(Path(tmp) / "nox.in"), ["--python-version", DEV_PYTHON])}
        if packages:
            texts["dev.lock"] += APART.format(python=python) + "\n" + _compile_hashed(
                root, "dev.lock", str(Path(tmp) / "apart.in"), ["--no-deps", "--no-annotate", "--python-version", python])
    for name, text in texts.items():
        f = root / "requirements" / name
        f.write_text(f"# Generated by `nox -s lock` ({UV} pip compile --generate-hashes, Python {DEV_PYTHON}, linux x86_64);"
                     " do not edit.\n" + text)
        out.append(f)
    return out
