"""matrix.yaml -> frozen Target objects (GitHub Actions include/exclude semantics), checked by compat."""

from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

from gpuforge import selectors
from gpuforge.errors import ConfigError, SelectorError
from gpuforge.image import compat
from gpuforge.schema import AXES, FLAVORS, SETTING_KEYS, SOURCES, Base, MatrixFile, Settings, parse
from gpuforge.yamlpos import Positioned, load

DEFAULT_MATRIX = Path("matrix.yaml")


@dataclass(frozen=True, kw_only=True)
class Target:
    """One image to build: its axes, resolved settings and every version it must contain."""

    id: str
    torch: str
    cuda: str
    python: str
    os: str
    flavor: str
    source: str
    base_image: str  # what FROM names; for bootstrapped bases, the local tag gpuforge builds
    bootstrap: dict | None  # {suite, mirror, variant} when the base is bootstrapped
    settings: Settings = field(hash=False, compare=False)
    variant: compat.Variant = field(hash=False, compare=False)
    tags: tuple[str, ...]  # full references: registry/repository:tag
    aliases: dict = field(hash=False, compare=False)  # env -> tuple of alias tags (no registry)
    registry: str
    repository: str

    @property
    def image_name(self) -> str:
        return f"{self.registry}/{self.repository}" if self.registry else self.repository

    @property
    def tag(self) -> str:
        return self.tags[0].rsplit(":", 1)[1]

    @property
    def index_url(self) -> str:
        """Where torch comes from: cuda-base images use the PyTorch index of their CUDA; wheels images
        use PyPI when PyPI's default wheel is that CUDA variant, the PyTorch index otherwise."""
        if self.settings.index_url:
            return self.settings.index_url
        if self.source == "wheels" and self.variant.on_pypi:
            return self.settings.pypi_url
        return self.variant.index_url

    def axes(self) -> dict[str, str]:
        return {k: getattr(self, k) for k in AXES}

    def expected(self) -> dict:
        """What the validators expect inside the image; the one place tests get versions from."""
        v = self.variant
        return {
            "id": self.id,
            "torch": v.torch_local_version,
            "cuda": v.cuda,
            "cudnn": v.cudnn,
            "nccl": v.nccl,
            "triton": v.triton,
            "torchvision": v.torchvision,
            "torchaudio": v.torchaudio,
            "python": self.python,
            "flavor": self.flavor,
            "source": self.source,
            "os": self.os,
            "user": self.settings.user,
            "uid": self.settings.uid,
            "size_budget_gb": self.settings.size_budget_gb,
            "arch_list": list(v.arch_list),
            "ptx": list(v.ptx),
        }

    def expected_json(self) -> str:
        """expected() as the target.json that images carry and validators read."""
        return json.dumps(self.expected(), indent=2, sort_keys=True) + "\n"

    def recipe_hash(self, context_files: dict[str, bytes] | None = None) -> str:
        """Hash of everything that decides the image's bytes (the rendered context, when given)."""
        h = hashlib.sha256(json.dumps(self.expected(), sort_keys=True).encode())
        h.update(self.base_image.encode())
        for name in sorted(context_files or {}):
            h.update(name.encode() + b"\0" + context_files[name])
        return h.hexdigest()[:16]


def target_id(torch: str, cuda: str, python: str, os_name: str, flavor: str, source: str) -> str:
    """Flat id with one grammar, usable as a tag: pt271-cu126-py311-debian12-runtime-wheels."""
    return "-".join([
        "pt" + torch.replace(".", ""),
        compat.cuda_variant_name(cuda),
        "py" + python.replace(".", ""),
        os_name.replace(".", ""),
        flavor,
        source.replace("-", ""),
    ])


def bootstrap_tag(os_name: str, boot: dict) -> str:
    digest = hashlib.sha256(json.dumps(boot, sort_keys=True).encode()).hexdigest()[:12]
    return f"gpuforge/base:{os_name.replace('.', '')}-{boot['suite']}-{digest}"


@dataclass(frozen=True, kw_only=True)
class Matrix:
    path: Path
    spec: MatrixFile
    targets: tuple[Target, ...]
    doc: Positioned = field(repr=False)

    def select(self, sels: list[str] | None) -> list[Target]:
        """The targets selectors pick; none given -> the matrix's default selection."""
        if not sels:
            chosen = selectors.select(self.targets, self.spec.default)
            if not chosen:
                msg = f"{self.doc.where(('default',))}: default: selects no target"
                raise SelectorError(msg)
            return chosen
        return selectors.select(self.targets, sels)

    def by_id(self, target_id: str) -> Target:
        for t in self.targets:
            if t.id == target_id:
                return t
        msg = f"unknown target {target_id!r} (known: {', '.join(t.id for t in self.targets)})"
        raise SelectorError(msg)


def _expand(spec: MatrixFile, doc: Positioned) -> list[tuple[dict, tuple]]:
    """Rows of axis values (plus per-row settings), each with the loc it came from."""
    ax = spec.matrix
    axis_values = {k: getattr(ax, k) for k in AXES if getattr(ax, k)}
    combos: list[tuple[dict, dict, tuple]] = []  # (original values, added values, origin)
    if axis_values:
        keys = list(axis_values)
        for values in itertools.product(*(axis_values[k] for k in keys)):
            combos.append((dict(zip(keys, values, strict=True)), {}, ("matrix",)))
    for i, ex in enumerate(ax.exclude):
        loc = ("matrix", "exclude", i)
        _check_entry_keys(ex, doc, loc, allow_settings=False)
        before = len(combos)
        combos = [c for c in combos if not all(_s(c[0].get(k, c[1].get(k))) == _s(v) for k, v in ex.items())]
        if len(combos) == before:
            msg = f"{doc.where(loc)}: matrix.exclude[{i}]: {ex} excludes nothing (check the values)"
            raise ConfigError(msg)
    for i, inc in enumerate(ax.include):
        loc = ("matrix", "include", i)
        _check_entry_keys(inc, doc, loc, allow_settings=True)
        inc = {k: _s(v) if k in AXES else v for k, v in inc.items()}
        merged = False
        for orig, added, origin in combos:
            # GitHub Actions: merge into every *original* combination whose original values it does not
            # overwrite; combinations that earlier includes added are never merged into.
            if origin == ("matrix",) and all(orig[k] == v for k, v in inc.items() if k in orig):
                added.update({k: v for k, v in inc.items() if k not in orig})
                merged = True
        if not merged:
            combos.append(({}, dict(inc), loc))
    rows = []
    for orig, added, origin in combos:
        row = {**added, **orig}
        missing = [k for k in AXES if k not in row]
        if missing:
            msg = (f"{doc.where(origin)}: {'.'.join(map(str, origin))}: the combination {row} has no "
                   f"{', '.join(missing)} (every target needs: {', '.join(AXES)})")
            raise ConfigError(msg)
        rows.append((row, origin))
    return rows


def _s(v: object) -> str:
    return v if isinstance(v, str) else str(v)


def _check_entry_keys(entry: dict, doc: Positioned, loc: tuple, *, allow_settings: bool) -> None:
    allowed = AXES + (SETTING_KEYS if allow_settings else ())
    for k, v in entry.items():
        if k not in allowed:
            msg = f"{doc.where((*loc, k))}: {'.'.join(map(str, (*loc, k)))}: unknown key {k!r} (allowed: {', '.join(allowed)})"
            raise ConfigError(msg)
        if k in AXES and not isinstance(v, str):
            msg = (f"{doc.where((*loc, k))}: {'.'.join(map(str, (*loc, k)))}: expected a string, got {v!r}: "
                   f"quote version numbers, e.g. \"{v}\"")
            raise ConfigError(msg)
        if (k == "flavor" and v not in FLAVORS) or (k == "source" and v not in SOURCES):
            choices = FLAVORS if k == "flavor" else SOURCES
            msg = f"{doc.where((*loc, k))}: {'.'.join(map(str, (*loc, k)))}: {v!r} is not allowed (allowed: {', '.join(choices)})"
            raise ConfigError(msg)


def _settings_for(spec: MatrixFile, doc: Positioned, row: dict, tid: str) -> Settings:
    """Resolve once: defaults -> overrides whose `select` matches -> the include entry's own keys."""
    values = spec.defaults.model_dump()
    probe = SimpleNamespace(id=tid, **{k: row[k] for k in AXES})  # what selectors read, before the Target exists
    for i, ov in enumerate(spec.overrides):
        try:
            hit = selectors.matches(probe, ov.select.split())
        except SelectorError as e:
            msg = f"{doc.where(('overrides', i, 'select'))}: overrides[{i}].select: {e}"
            raise ConfigError(msg) from None
        if hit:
            values.update(ov.model_dump(exclude_unset=True, exclude={"select"}))
    values.update({k: v for k, v in row.items() if k in SETTING_KEYS})
    return Settings.model_validate(values, strict=False)


def _base_for(spec: MatrixFile, doc: Positioned, row: dict, origin: tuple) -> tuple[str, dict | None]:
    if row["source"] == "cuda-base":
        ref, _ = compat.cuda_image(row["cuda"], row["flavor"], row["os"], spec.cuda_base_image)
        return ref or "", None
    base: Base | None = spec.bases.get(row["os"])
    if base is None:
        info = compat.os_info(row["os"])
        if info is None:
            return "", None
        return info["image"], None
    if base.bootstrap:
        boot = base.bootstrap.model_dump()
        if compat.os_info(row["os"]) and compat.os_info(row["os"])["family"] != "debian":
            msg = (f"{doc.where(('bases', row['os'], 'bootstrap'))}: bases.{row['os']}.bootstrap: debootstrap "
                   f"bases are for Debian; use `image:` for {row['os']}")
            raise ConfigError(msg)
        return bootstrap_tag(row["os"], boot), boot
    return base.image, None


def load_matrix(path: Path = DEFAULT_MATRIX) -> Matrix:
    doc = load(path)
    spec = parse(doc)
    for name in spec.bases:
        if compat.os_info(name) is None:
            msg = f"{doc.where(('bases', name))}: bases.{name}: unknown os (allowed: {', '.join(compat.os_names())})"
            raise ConfigError(msg)
    targets: list[Target] = []
    seen: dict[str, tuple] = {}
    problems: list[str] = []
    for row, origin in _expand(spec, doc):
        axes = {k: row[k] for k in AXES}
        tid = target_id(**{("os_name" if k == "os" else k): v for k, v in axes.items()})
        if tid in seen:
            msg = (f"{doc.where(origin)}: {'.'.join(map(str, origin))}: duplicate target id {tid} "
                   f"(first defined at line {doc.line(seen[tid])}); each combination may appear once")
            raise ConfigError(msg)
        seen[tid] = origin
        for p in compat.problems(torch=axes["torch"], cuda=axes["cuda"], python=axes["python"],
                                 os_name=axes["os"], source=axes["source"], flavor=axes["flavor"],
                                 cuda_base_template=spec.cuda_base_image):
            problems.append(f"{doc.where(origin)}: {'.'.join(map(str, origin))}: {tid}: {p}")
        if problems:
            continue
        settings = _settings_for(spec, doc, row, tid)
        base_image, boot = _base_for(spec, doc, row, origin)
        variant = compat.variant(axes["torch"], axes["cuda"])
        fmt = {**axes, "id": tid, "cuda_tag": compat.cuda_variant_name(axes["cuda"])}
        try:
            tag = spec.tag_template.format(**fmt)
            aliases = {env: tuple(a.format(**fmt, env=env) for a in lst) for env, lst in settings.aliases.items()}
        except (KeyError, IndexError, ValueError) as e:
            msg = (f"{doc.where(('tag_template',))}: tag_template/aliases: unknown placeholder {e} "
                   f"(allowed: {', '.join(sorted({*fmt, 'env'}))})")
            raise ConfigError(msg) from None
        image_name = f"{spec.registry}/{spec.repository}" if spec.registry else spec.repository
        targets.append(Target(
            id=tid, **axes, base_image=base_image, bootstrap=boot, settings=settings, variant=variant,
            tags=(f"{image_name}:{tag}",), aliases=aliases, registry=spec.registry, repository=spec.repository,
        ))
    if problems:
        raise ConfigError("\n".join(problems))
    _check_unique_tags(targets, doc)
    m = Matrix(path=path, spec=spec, targets=tuple(targets), doc=doc)
    try:
        m.select(None)
    except SelectorError as e:
        msg = f"{doc.where(('default',))}: default: {e}"
        raise ConfigError(msg) from None
    return m


def _check_unique_tags(targets: list[Target], doc: Positioned) -> None:
    owner: dict[str, str] = {}
    for t in targets:
        names = list(t.tags) + [a for lst in t.aliases.values() for a in lst]
        for n in names:
            if n in owner and owner[n] != t.id:
                msg = (f"{doc.where(('tag_template',))}: tag {n!r} would name both {owner[n]} and {t.id}; "
                       "make tag_template/aliases include the axes that differ")
                raise ConfigError(msg)
            owner[n] = t.id
