"""Targets -> images/dist/<id>/ (Dockerfile + build context). Deterministic; committed; --check finds drift."""

from __future__ import annotations

import functools
import shutil
from importlib import resources
from pathlib import Path

import jinja2
import yaml

from gpuforge.errors import ConfigError
from gpuforge.labels import expected_labels
from gpuforge.matrix import Target

ROOT = Path(__file__).resolve().parent.parent
TEMPLATES = ROOT / "images" / "templates"
STATIC = ROOT / "images" / "context"
UNITS = ROOT / "validators" / "units"
DIST = ROOT / "images" / "dist"
# The slice of gpuforge that images carry, so the entrypoint's preflight uses the same compat code.
IMAGE_MODULES = ("__init__.py", "compat.py", "hostinfo.py", "preflight.py", "data/compat.yaml")


@functools.cache
def image_spec() -> dict:
    return yaml.safe_load(resources.files("gpuforge").joinpath("data/image.yaml").read_text())


def labels(t: Target) -> list[tuple[str, str]]:
    v = t.variant
    out = {
        "org.opencontainers.image.title": f"gpuforge {t.id}",
        "org.opencontainers.image.description": f"PyTorch {v.torch} + CUDA {v.cuda} ({t.flavor}, {t.source}, {t.os})",
        "org.opencontainers.image.version": v.torch_local_version,
        "org.opencontainers.image.vendor": "gpuforge",
        "org.opencontainers.image.base.name": t.base_image,
    }
    out.update(expected_labels(t.expected()))
    return sorted(out.items())


def render_target(t: Target) -> dict[str, bytes]:
    """Every file of the target's build context, name -> bytes (nothing written)."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=True, autoescape=False)
    spec = image_spec()
    apt = sorted({*spec["apt"]["common"], *(spec["apt"]["devel"] if t.flavor == "devel" else []),
                  *t.settings.apt_packages})
    pip_tools = [*spec["pip"], *t.settings.pip_packages]
    files: dict[str, bytes] = {}
    dockerfile = env.get_template("Dockerfile.j2").render(
        t=t, s=t.settings, v=t.variant, apt_packages=apt, pip_tools=pip_tools, labels=labels(t))
    files["Dockerfile"] = dockerfile.encode()
    files["target.json"] = t.expected_json().encode()
    files["constraints.txt"] = "".join(f"{k}=={val}\n" for k, val in sorted(t.variant.nvidia_pins.items())).encode()
    for p in sorted(STATIC.iterdir()):
        files[p.name] = p.read_bytes()
    pkg = Path(__file__).resolve().parent
    for m in IMAGE_MODULES:
        files[f"gpuforge/{m}"] = (pkg / m).read_bytes()
    for p in sorted(UNITS.glob("*.py")):
        files[f"units/{p.name}"] = p.read_bytes()
    return files


EXECUTABLE = {"entrypoint.sh"}


def write(t: Target, dist: Path | None = None) -> Path:
    out = (dist or DIST) / t.id
    if out.exists():
        shutil.rmtree(out)
    for name, data in render_target(t).items():
        f = out / name
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(data)
        if name in EXECUTABLE:
            f.chmod(0o755)
    return out


def stale(targets: list[Target], dist: Path | None = None, *, all_targets: bool = True) -> list[str]:
    """Paths that differ from what `generate` would write (missing, changed or extra)."""
    dist = dist or DIST
    bad: list[str] = []
    for t in targets:
        want = render_target(t)
        have_dir = dist / t.id
        have = {str(p.relative_to(have_dir)) for p in have_dir.rglob("*") if p.is_file()} if have_dir.exists() else set()
        for name, data in want.items():
            f = have_dir / name
            if not f.is_file() or f.read_bytes() != data:
                bad.append(str(f.relative_to(ROOT) if f.is_relative_to(ROOT) else f))
        bad.extend(str(have_dir / n) for n in sorted(have - set(want)))
    if all_targets and dist.exists():
        ids = {t.id for t in targets}
        bad.extend(str(p) for p in sorted(dist.iterdir()) if p.is_dir() and p.name not in ids)
    return bad


def prune(targets: list[Target], dist: Path | None = None) -> list[Path]:
    """Remove dist folders of targets that left the matrix."""
    dist = dist or DIST
    ids = {t.id for t in targets}
    gone = [p for p in sorted(dist.iterdir()) if p.is_dir() and p.name not in ids] if dist.exists() else []
    for p in gone:
        shutil.rmtree(p)
    return gone


def check(targets: list[Target], dist: Path | None = None, *, all_targets: bool = True) -> None:
    bad = stale(targets, dist, all_targets=all_targets)
    if bad:
        shown = "\n  ".join(bad[:20]) + (f"\n  ... and {len(bad) - 20} more" if len(bad) > 20 else "")
        msg = f"generated files are stale; run `gpuforge generate` and commit:\n  {shown}"
        raise ConfigError(msg)
