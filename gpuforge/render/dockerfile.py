"""Targets -> images/dist/<id>/ (Dockerfile, target.json, constraints.txt), the fleet's bake file and the root .dockerignore.

Every image builds from one context, the project root, with `-f images/dist/<id>/Dockerfile`; the
.dockerignore whitelists what images may COPY (paths.CONTEXT_PATHS). Only what really differs per
target is generated. Deterministic; committed; `--check` finds drift.
"""

from __future__ import annotations

import functools
import json
import re
import shutil
from pathlib import Path

import jinja2

from gpuforge import grammar, paths
from gpuforge.errors import ConfigError
from gpuforge.plan.target import Target
from gpuforge.render import locks
from gpuforge.render.labels import LICENSES, expected_labels
from gpuforge.render.packages import image_spec, metrics_tools, pip_tools
from gpuforge.state import files

PER_TARGET = ("Dockerfile", "target.json", "constraints.txt")


# Defence in depth behind gpuforge.grammar: what the template renders from matrix.yaml is quoted, so a value
# that slipped past a check still cannot add a Dockerfile instruction, a shell command or an option.
_PLAIN_WORD = re.compile(r"[A-Za-z0-9_@%+=:,./-]+\Z")
_PLAIN_VALUE = re.compile(r"[A-Za-z0-9_@%+=:,./?#&~-]+\Z")
# Reserved words are plain arguments to the shell, but shellcheck (through hadolint) reads a bare `then` or `fi`
# as misplaced syntax (SC1010 and friends; found by tests/unit/render/test_render_fuzz.py): they are quoted.
_RESERVED = frozenset("if then else elif fi case esac for select while until do done in function time".split())


def _renderable(value: object, what: str) -> str:
    text = str(value)
    why = grammar.printable(text)  # a line break would end the instruction; nothing can quote it
    if why:
        msg = f"refusing to render {text!r} into a Dockerfile {what}: {why}"
        raise ConfigError(msg)
    return text


def shell_word(value: object) -> str:
    """One shell argument: as is when plain, else double-quoted with \\ " $ ` escaped (single quotes would
    make hadolint's shellcheck warn on $); never an option."""
    text = _renderable(value, "shell word")
    if text.startswith("-"):
        msg = f"refusing to render {text!r} as a shell argument: it would be read as an option"
        raise ConfigError(msg)
    plain = _PLAIN_WORD.match(text) and text not in _RESERVED
    return text if plain else '"' + re.sub(r'([\\"$`])', r"\\\1", text) + '"'


def dockerfile_value(value: object) -> str:
    """An ARG/ENV value or WORKDIR path: as is when plain, else double-quoted with " $ escaped (the
    Dockerfile's own quoting; it would expand $VAR). Backslashes are refused: parsers disagree on them
    (hadolint misreads an escaped backslash before a quote in ENV), and no URL or user name has one."""
    text = _renderable(value, "value")
    if "\\" in text:
        msg = f"refusing to render {text!r} as a Dockerfile value: it contains a backslash"
        raise ConfigError(msg)
    return text if _PLAIN_VALUE.match(text) else '"' + re.sub(r'(["$])', r"\\\1", text) + '"'


@functools.cache
def _env() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.PackageLoader("gpuforge.render", "templates"), undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=True, autoescape=False)
    env.filters["sh"] = shell_word
    env.filters["dfv"] = dockerfile_value
    return env


def labels(t: Target) -> list[tuple[str, str]]:
    v = t.variant
    out = {
        "org.opencontainers.image.title": f"gpuforge {t.id}",
        "org.opencontainers.image.description": f"PyTorch {v.torch} + CUDA {v.cuda} ({t.flavor}, {t.source}, {t.os})",
        "org.opencontainers.image.version": v.torch_local_version,
        "org.opencontainers.image.vendor": "gpuforge",
        "org.opencontainers.image.base.name": t.base_image,
        "org.opencontainers.image.licenses": LICENSES,
    }
    out.update(expected_labels(t.expected()))
    return sorted(out.items())


def constraints(t: Target) -> str:
    """Every package's exact version: compat's CUDA wheels, then the Python + torch lock (gpuforge/render/locks.py)."""
    pinned = dict(sorted(t.variant.nvidia_pins.items()))
    for name, ver in locks.image_pins(t).items():
        pinned.setdefault(name, ver)
    return "".join(f"{k}=={val}\n" for k, val in sorted(pinned.items()))


def render_target(t: Target) -> dict[str, bytes]:
    """The target's generated files, name -> bytes (nothing written)."""
    try:  # FROM takes no quoting: the reference grammar is its guard, here as well as at plan time
        grammar.image_reference(t.base_image, pinned=True)
    except ValueError as e:
        msg = f"refusing to render FROM {t.base_image!r}: {e}"
        raise ConfigError(msg) from None
    spec = image_spec()
    apt = sorted({*spec["apt"]["common"], *t.settings.apt_packages})
    devel_apt = sorted(set(spec["apt"]["devel"]) - set(apt)) if t.flavor == "devel" else []
    dockerfile = _env().get_template("Dockerfile.j2").render(
        t=t, s=t.settings, v=t.variant, apt_packages=apt, devel_apt=devel_apt, pip_tools=pip_tools(t), metrics_tools=metrics_tools(),
        labels=labels(t),
        uv=spec["uv"],
        dist=f"images/dist/{t.id}")
    return {
        "Dockerfile": dockerfile.encode(),
        "target.json": t.expected_json().encode(),
        "constraints.txt": constraints(t).encode(),
    }


BAKE = "images/dist/docker-bake.json"


def bake_file(targets: list[Target], defaults: list[Target]) -> str:
    """A `docker buildx bake` file for the fleet (groups `default` and `all`), so a remote or Kubernetes
    BuildKit (`--builder`) can build the whole matrix. Paths are relative to the repository root, where
    bake runs; the CA bundle is a secret (variable GPUFORGE_CA), never a layer. Bases must be pullable
    by the builder (or bootstrapped first with `gpuforge build`). GPUFORGE_APT_STATE keys the system layer
    (e.g. the date, or the value `gpuforge build` printed): unset, that layer stays cached."""
    doc = {
        "variable": {"GPUFORGE_CA": {"default": "/etc/ssl/certs/ca-certificates.crt"},
                     "GPUFORGE_REVISION": {"default": "unknown"},
                     "GPUFORGE_APT_STATE": {"default": "unset"}},
        "group": {"default": {"targets": [t.id for t in defaults]}, "all": {"targets": [t.id for t in targets]}},
        "target": {t.id: {"context": ".", "dockerfile": f"images/dist/{t.id}/Dockerfile", "tags": list(t.tags),
                          "secret": ["id=ca,src=${GPUFORGE_CA}"],
                          "args": {"GPUFORGE_APT_STATE": "${GPUFORGE_APT_STATE}"},
                          "labels": {"org.opencontainers.image.revision": "${GPUFORGE_REVISION}"}}
                   for t in targets},
    }
    return json.dumps(doc, indent=2) + "\n"


def write_bake(targets: list[Target], defaults: list[Target]) -> Path:
    return files.write_output(paths.project_root() / BAKE, bake_file(targets, defaults))


def dockerignore() -> str:
    """The root .dockerignore: everything out, then the shared context paths and the generated files in."""
    keep = "".join(f"!{p}\n" for p in (*paths.CONTEXT_PATHS, "images/dist"))
    return ("# Generated by `gpuforge generate` from gpuforge/paths.py CONTEXT_PATHS; do not edit.\n"
            "# Every image builds from the repository root; only these paths reach the builder.\n"
            f"*\n{keep}**/__pycache__\n**/*.pyc\n")


def recipe_hash(t: Target, root: Path | None = None) -> str:
    """What decides the image's bytes: its generated files plus every shared context file."""
    return t.recipe_hash({**{f"images/dist/{t.id}/{k}": v for k, v in render_target(t).items()},
                          **paths.context_files(root)})


def write(t: Target, dist: Path | None = None) -> Path:
    """images/dist/<id>/, replaced as one: a crash or a full disk leaves the previous folder whole."""
    return files.replace_folder((dist or paths.dist()) / t.id, render_target(t))


def copy_context(dest: Path) -> Path:
    """A second copy of the build context (shared files + .dockerignore), for builds of scratch targets
    (tests, benchmarks) that must not touch the checkout. Write targets into dest/images/dist."""
    for rel, data in paths.context_files().items():
        f = dest / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(data)
        f.chmod((paths.project_root() / rel).stat().st_mode & 0o777)
    (dest / "images" / "dist").mkdir(parents=True, exist_ok=True)
    write_dockerignore(dest)
    return dest


def write_dockerignore(root: Path | None = None) -> Path:
    return files.write_output((root or paths.project_root()) / ".dockerignore", dockerignore())


def stale(targets: list[Target], dist: Path | None = None, *, all_targets: bool = True, bake: str | None = None) -> list[str]:
    """Paths that differ from what `generate` would write (missing, changed or extra); `bake`: the
    expected bake file (full checks only)."""
    root = paths.project_root()
    dist = dist or paths.dist()

    def show(f: Path) -> str:
        return str(f.relative_to(root) if f.is_relative_to(root) else f)

    bad: list[str] = []
    ignore = root / ".dockerignore"
    if not ignore.is_file() or ignore.read_text() != dockerignore():
        bad.append(show(ignore))
    for t in targets:
        want = render_target(t)
        have_dir = dist / t.id
        have = {str(p.relative_to(have_dir)) for p in have_dir.rglob("*") if p.is_file()} if have_dir.exists() else set()
        for name, data in want.items():
            f = have_dir / name
            if not f.is_file() or f.read_bytes() != data:
                bad.append(show(f))
        bad.extend(show(have_dir / n) for n in sorted(have - set(want)))
    if all_targets and dist.exists():
        ids = {t.id for t in targets}
        bad.extend(show(p) for p in sorted(dist.iterdir()) if p.is_dir() and p.name not in ids)
    if bake is not None and (not (root / BAKE).is_file() or (root / BAKE).read_text() != bake):
        bad.append(BAKE)
    bad.extend(locks.stale_image_locks(targets))  # an image lock compiled from other inputs: `gpuforge lock`
    return bad


def prune(targets: list[Target], dist: Path | None = None) -> list[Path]:
    """Remove dist folders of targets that left the matrix."""
    dist = dist or paths.dist()
    ids = {t.id for t in targets}
    gone = [p for p in sorted(dist.iterdir()) if p.is_dir() and p.name not in ids] if dist.exists() else []
    for p in gone:
        shutil.rmtree(p)
    return gone


def check(targets: list[Target], dist: Path | None = None, *, all_targets: bool = True, bake: str | None = None) -> None:
    bad = stale(targets, dist, all_targets=all_targets, bake=bake)
    if bad:
        shown = "\n  ".join(bad[:20]) + (f"\n  ... and {len(bad) - 20} more" if len(bad) > 20 else "")
        msg = f"generated files are stale; run `gpuforge generate` and commit:\n  {shown}"
        raise ConfigError(msg)
