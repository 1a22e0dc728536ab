"""matrix.yaml -> frozen Target objects (GitHub Actions include/exclude semantics), checked by compat.

Every problem found is collected (Problems) and reported once, grouped: one line per distinct problem, at
the line of the value that causes it, however many targets it affects. Everything `build` would trip on
later is checked here, at plan time.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from packaging.utils import canonicalize_name

from gpuforge import grammar, options
from gpuforge.errors import ConfigError, SelectorError
from gpuforge.image import compat
from gpuforge.plan import fleet, selectors
from gpuforge.plan.schema import AXES, ENVS, SETTING_KEYS, MatrixFile, Settings, parse, report
from gpuforge.plan.schema import field as field_name
from gpuforge.plan.target import ImageRef, Target, target_id
from gpuforge.plan.version import SAMPLE
from gpuforge.plan.yamlpos import Positioned, load

__all__ = ["DEFAULT_MATRIX", "Matrix", "load_matrix"]

DEFAULT_MATRIX = Path("matrix.yaml")
MAX_TARGETS = 10_000  # a product of axes beyond this is refused before it is expanded
# promote tags each target `{tag}-{env}` and each build `{version}-{env}`; push --compression zstd `{version}-zstd`
_ENV_SUFFIX = max(len(f"-{e}") for e in (*ENVS, "zstd"))


# How gpuforge.builder.bases shapes a bootstrapped root file system; part of the base's recipe (a change
# gives a new base tag). 2: without docs, man pages and translations (copyright files kept). 3: apt sources name
# <suite>-updates and <suite>-security too, so each image's system layer applies their updates.
BOOTSTRAP_ROOTFS = 3


def bootstrap_tag(os_name: str, boot: dict[str, Any]) -> str:
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
        ids = [t.id for t in self.targets]
        msg = f"unknown target {target_id!r}{grammar.nearest(target_id, ids)} (run `gpuforge plan` to list the {len(ids)})"
        raise SelectorError(msg)


class Problems:
    """Problems found in one matrix file, grouped: one line per (value, message), counting targets."""

    def __init__(self, doc: Positioned):
        self.doc = doc
        self._items: dict[tuple[Any, ...], tuple[str, list[str]]] = {}

    def add(self, loc: tuple[Any, ...], message: str, target: str | None = None, *, key: object = None) -> None:
        """`key` groups messages that differ per target (a rendered tag) as one problem of that value."""
        _, ids = self._items.setdefault((tuple(loc), key or message), (message, []))
        if target:
            ids.append(target)

    def __bool__(self) -> bool:
        return bool(self._items)

    def check(self) -> None:
        if not self._items:
            return
        lines = []
        for (loc, _), (message, ids) in self._items.items():
            who = f" ({len(ids)} targets, e.g. {ids[0]})" if len(ids) > 1 else f" (target {ids[0]})" if ids else ""
            lines.append((self.doc.line(loc), f"{self.doc.where(loc)}: {field_name(loc)}: {message}{who}"))
        raise ConfigError(report([text for _, text in sorted(lines, key=lambda x: x[0])]))


@dataclass
class _Row:
    values: dict[str, Any]  # axis -> value, plus the settings of include entries merged in
    locs: dict[str, Any]  # axis -> loc of the value that set it
    origin: tuple[Any, ...]  # ("matrix",) or ("matrix", "include", i)
    includes: list[Any] = field(default_factory=list)  # indexes of include entries merged into a product row


def _expand(spec: MatrixFile, doc: Positioned, problems: Problems) -> list[_Row] | None:
    """Rows of axis values (GitHub Actions semantics: exclude, then include), each knowing its locs."""
    ax = spec.matrix
    axes = [k for k in AXES if getattr(ax, k)]
    values = _axis_values(spec, axes, problems)
    count = math.prod(len(values[k]) for k in axes) if axes else 0
    if count > MAX_TARGETS:
        sizes = " x ".join(f"{len(values[k])} {k}" for k in axes)
        problems.add(("matrix",), f"the axes multiply to {count:,} combinations ({sizes}); at most {MAX_TARGETS:,} are allowed")
        return None
    originals: list[_Row] = []
    if axes:
        for picks in itertools.product(*(values[k] for k in axes)):
            originals.append(_Row({k: v for k, (_, v) in zip(axes, picks, strict=True)},
                                  {k: ("matrix", k, i) for k, (i, _) in zip(axes, picks, strict=True)}, ("matrix",)))
    rows = _exclude(spec, axes, originals, problems)
    _include(spec, axes, _Matching(axes, rows), rows)
    return _complete(rows, problems)


def _axis_values(spec: MatrixFile, axes: list[str], problems: Problems) -> dict[str, list[tuple[int, str]]]:
    """Each axis's (item index, value) pairs; a value listed twice would make every combination with it twice."""
    values = {}
    for k in axes:
        first: dict[str, int] = {}
        for i, v in enumerate(getattr(spec.matrix, k)):
            if v in first:
                problems.add(("matrix", k, i), f'"{v}" is listed twice (also item {first[v]}); each value may appear once')
            first.setdefault(v, i)
        values[k] = [(i, v) for v, i in first.items()]
    return values


class _Matching:
    """Product rows whose values equal an entry's on the keys they share (indexed once per key set)."""

    def __init__(self, axes: list[str], rows: list[_Row]):
        self.axes, self.rows = axes, list(rows)
        self.index: dict[tuple[Any, ...], dict[tuple[Any, ...], list[_Row]]] = {}

    def __call__(self, entry: dict[str, Any]) -> list[_Row]:
        keys = tuple(k for k in self.axes if k in entry)
        if keys not in self.index:
            self.index[keys] = {}
            for r in self.rows:
                self.index[keys].setdefault(tuple(r.values[k] for k in keys), []).append(r)
        return self.index[keys].get(tuple(entry[k] for k in keys), [])


def _exclude(spec: MatrixFile, axes: list[str], originals: list[_Row], problems: Problems) -> list[_Row]:
    """The product rows no exclude entry matches; an entry that excludes nothing is a problem (a typo, usually)."""
    matching = _Matching(axes, originals)
    removed: set[int] = set()
    for i, ex in enumerate(spec.matrix.exclude):
        given = ex.model_dump(exclude_unset=True)
        hit = [r for r in matching(given) if set(given) <= set(axes)] if given else []
        if not hit:
            problems.add(("matrix", "exclude", i), f"{_show(given)} excludes nothing (check the values)")
        removed.update(id(r) for r in hit)
    return [r for r in originals if id(r) not in removed]


def _include(spec: MatrixFile, axes: list[str], matching: _Matching, rows: list[_Row]) -> None:
    """GitHub Actions: an include entry merges into every *original* combination whose original values it does not
    overwrite (combinations that earlier includes added are never merged into); one that matches none is a new row."""
    for i, inc in enumerate(spec.matrix.include):
        given = inc.given()
        loc = ("matrix", "include", i)
        merged = matching(given)
        for r in merged:
            for k, v in given.items():
                if k not in axes:
                    r.values[k] = v
                    if k in AXES:
                        r.locs[k] = (*loc, k)
            r.includes.append(i)
        if not merged:
            rows.append(_Row(dict(given), {k: (*loc, k) for k in given if k in AXES}, loc, [i]))


def _complete(rows: list[_Row], problems: Problems) -> list[_Row]:
    """The rows that give every axis; each other one is a problem naming what it lacks."""
    out = []
    for r in rows:
        missing = [k for k in AXES if k not in r.values]
        if missing:
            problems.add(r.origin, f"the combination {_show(r.values)} has no {', '.join(missing)} "
                                   f"(every target needs: {', '.join(AXES)})")
            continue
        out.append(r)
    return out


def _show(values: dict[str, Any]) -> str:
    return "{" + ", ".join(f"{k}: {v}" for k, v in values.items() if k in AXES) + "}"


# Which axis value each of compat.problems' reasons is about (so the error points at that value).
_BLAME = (("is not a known release", "torch"), ("publishes no CUDA", "cuda"), ("does not support python", "python"),
          ("unknown os", "os"), ("ships python", "python"), ("no nvidia/cuda base image", "cuda"), ("nvidia/cuda", "os"))


def _blame(row: _Row, problem: str) -> tuple[tuple[Any, ...], str]:
    """(loc of the axis value the problem is about, the problem with a nearest allowed value for typos)."""
    axis = next((a for text, a in _BLAME if text in problem), None)
    allowed = re.search(r"\(allowed: ([^)]*)\)", problem)
    if axis and allowed:
        problem += grammar.nearest(row.values[axis], allowed.group(1).split(", "))
    return (row.locs.get(axis, row.origin) if axis else row.origin), problem


class _Resolver:
    """Settings per target: defaults -> overrides whose `select` matches -> include entries. Resolved once
    per distinct combination of sources, remembering which source set each key (for error lines)."""

    def __init__(self, spec: MatrixFile, doc: Positioned, problems: Problems):
        self.spec, self.problems = spec, problems
        self.hits = [0] * len(spec.overrides)
        self.cache: dict[tuple[Any, ...], tuple[Settings, dict[str, Any]]] = {}
        self.compiled: list[tuple[list[tuple[str, str]], list[str]] | None] = []  # None: a select that did not compile
        for i, ov in enumerate(spec.overrides):
            try:
                self.compiled.append(selectors.compile(ov.select.split()))
            except SelectorError as e:
                problems.add(("overrides", i, "select"), str(e))
                self.compiled.append(None)

    def overrides_for(self, row: _Row, tid: str) -> tuple[int, ...]:
        """Indexes of the overrides whose `select` matches this row (counted, for overrides matching nothing)."""
        probe = SimpleNamespace(id=tid, **{k: row.values[k] for k in AXES})  # what selectors read
        hits = tuple(i for i, c in enumerate(self.compiled) if c is not None and selectors.hit(probe, c))
        for i in hits:
            self.hits[i] += 1
        return hits

    def resolve(self, row: _Row, hits: tuple[int, ...]) -> tuple[Settings, dict[str, Any]]:
        key = (hits, tuple(row.includes))
        if key not in self.cache:
            values = self.spec.defaults.model_dump()
            source: dict[str, tuple[Any, ...]] = dict.fromkeys(values, ("defaults",))
            for i in hits:
                ov = self.spec.overrides[i].model_dump(exclude_unset=True, exclude={"select"})
                values.update(ov)
                source.update(dict.fromkeys(ov, ("overrides", i)))
            for i in row.includes:
                own = {k: v for k, v in self.spec.matrix.include[i].given().items() if k in SETTING_KEYS}
                values.update(own)
                source.update({k: ("matrix", "include", i, k) for k in own})
            self.cache[key] = (Settings.model_validate(values, strict=False), source)
        return self.cache[key]

    def unused(self) -> None:
        for i, n in enumerate(self.hits):
            if n == 0 and self.compiled[i] is not None:
                self.problems.add(("overrides", i, "select"), f"{self.spec.overrides[i].select!r} matches no target "
                                                              "(an override that applies nowhere is a mistake, like an exclude)")


def _check_bases(spec: MatrixFile, problems: Problems) -> None:
    """Bases make sense: a known os; debootstrap only for Debian, of that os's own suite; a pulled image of
    the os's own family and version when it names one of the known OS images."""
    for name, base in spec.bases.items():
        info = compat.os_info(name)
        if info is None:
            problems.add(("bases", name), f"unknown os {name!r} (allowed: {', '.join(compat.os_names())})"
                                          f"{grammar.nearest(name, compat.os_names())}")
            continue
        if base.bootstrap:
            if info["family"] != "debian":
                problems.add(("bases", name, "bootstrap"), f"debootstrap bases are for Debian; use `image:` for {name}")
            elif base.bootstrap.suite != info["codename"]:
                problems.add(("bases", name, "bootstrap", "suite"),
                             f"suite {base.bootstrap.suite!r} is not {name}'s ({info['codename']}): another suite is "
                             f"another OS with another Python than {name} promises (allowed: {info['codename']})")
            continue
        # os_names() lists the keys os_info reads, so no info is None
        family = {i["family"] for i in map(compat.os_info, compat.os_names()) if i is not None}
        assert base.image is not None  # Base._one: a base without bootstrap has an image
        ref = ImageRef.parse(base.image)  # the schema checked its grammar
        image_name, tag = ref.repository.rsplit("/", 1)[-1], ref.tag
        version = str(ImageRef.parse(info["image"]).tag)
        if image_name in family and image_name != info["family"]:
            problems.add(("bases", name, "image"), f"{base.image!r} is {image_name}, not {info['family']} ({name})")
        elif image_name == info["family"] and tag and not _tag_is(tag, version, info["codename"]):
            problems.add(("bases", name, "image"),
                         f"{base.image!r} is not {name}: its tag should start with {version} or {info['codename']}")


def _tag_is(tag: str, version: str, codename: str) -> bool:
    return any(tag == v or tag.startswith((f"{v}-", f"{v}.")) for v in (version, codename))


def _check_extra_ca(spec: MatrixFile, path: Path, problems: Problems) -> None:
    """extra_ca is read from the matrix file's folder and must be PEM: gpuforge.options' one rule, at plan time."""
    if not spec.extra_ca:
        return
    f = Path(spec.extra_ca) if Path(spec.extra_ca).is_absolute() else path.parent / spec.extra_ca
    why = options.pem_problem(f)
    if why:
        problems.add(("extra_ca",), f"{why} (a PEM CA bundle; a relative path is read from the matrix file's folder)")


def _pip_pin_conflicts(settings: Settings, source: dict[str, Any], variant: compat.Variant) -> list[tuple[tuple[Any, ...], str]]:
    """pip_packages may not move a CUDA wheel that the target's constraints pin (pip would fail at build)."""
    pins = {canonicalize_name(k): (k, v) for k, v in variant.nvidia_pins.items()}
    out = []
    for i, text in enumerate(settings.pip_packages):
        req = grammar.pip_requirement(text)
        pin = pins.get(canonicalize_name(req.name))
        if pin and not req.specifier.contains(pin[1], prereleases=True):
            loc = source.get("pip_packages", ("defaults",))
            out.append(((*loc, "pip_packages", i) if loc[-1] != "pip_packages" else (*loc, i),
                        f"{text!r} conflicts with {pin[0]}=={pin[1]}, which torch {variant.torch} {variant.name} pins"))
    return out


def load_matrix(path: Path = DEFAULT_MATRIX) -> Matrix:
    doc = load(path)
    spec = parse(doc)
    problems = Problems(doc)
    _check_bases(spec, problems)
    _check_extra_ca(spec, path, problems)
    image_name = ImageRef(spec.registry, spec.repository).name
    if len(image_name) > grammar.NAME_MAX:
        problems.add(("repository",), f"{image_name!r} (registry/repository) is longer than {grammar.NAME_MAX} characters")
    rows = _expand(spec, doc, problems)  # None: too many to expand
    make = _Targets(spec, doc, problems)
    targets = [t for row in rows or () if (t := make.target(row)) is not None]
    if rows is not None:
        make.resolver.unused()
    if spec.fleet:
        targets = fleet.assign(spec, targets, problems)
    if not problems:
        _check_unique_tags(targets, problems)
        try:
            selectors.select(targets, spec.default)
        except SelectorError as e:
            problems.add(("default",), str(e))
    problems.check()
    return Matrix(path=path, spec=spec, targets=tuple(targets), doc=doc)


class _Targets:
    """Rows -> Targets, noting every problem against its line; what many rows share is worked out once (the torch
    variant of a (torch, cuda) pair, the pin conflicts of one settings object with it)."""

    def __init__(self, spec: MatrixFile, doc: Positioned, problems: Problems):
        self.spec, self.doc, self.problems = spec, doc, problems
        self.resolver = _Resolver(spec, doc, problems)
        self.seen: dict[str, tuple[Any, ...]] = {}
        self.variants: dict[tuple[Any, ...], compat.Variant] = {}
        self.pin_conflicts: dict[tuple[Any, ...], list[Any]] = {}

    def target(self, row: _Row) -> Target | None:
        """The row's target, or None when it is a duplicate or compat refuses it (a problem is noted)."""
        spec, problems = self.spec, self.problems
        axes = {k: row.values[k] for k in AXES}
        tid = target_id(**{("os_name" if k == "os" else k): v for k, v in axes.items()})
        if tid in self.seen:
            problems.add(row.origin, f"duplicate target id {tid} (first defined at line {self.doc.line(self.seen[tid])}); "
                                     "each combination may appear once")
            return None
        self.seen[tid] = row.origin
        hits = self.resolver.overrides_for(row, tid)
        found = compat.problems(torch=axes["torch"], cuda=axes["cuda"], python=axes["python"], os_name=axes["os"],
                                source=axes["source"], flavor=axes["flavor"], cuda_base_template=spec.cuda_base_image)
        for p in found:
            problems.add(*_blame(row, p), tid)
        if found:
            return None
        settings, source = self.resolver.resolve(row, hits)
        variant = self._variant(settings, source, (axes["torch"], axes["cuda"]), tid)
        base_image, boot = _base_for(spec, row, problems, tid)
        fmt = {**axes, "id": tid, "cuda_tag": compat.cuda_variant_name(axes["cuda"])}
        tag = spec.tag_template.format(**fmt)
        version = spec.version_template.format(**fmt, tag=tag, build="{build}")  # {build}: filled when it is built
        try:
            grammar.tag(tag, room=_ENV_SUFFIX)
        except ValueError as e:
            problems.add(("tag_template",), f"renders {e}", tid, key="renders")
        else:  # a tag too long already said so; its version would only repeat it
            try:
                grammar.tag(version.format(build=SAMPLE), room=_ENV_SUFFIX)
            except ValueError as e:
                problems.add(("version_template",), f"renders {e} (with a build identifier of {grammar.BUILD_ID_LEN} "
                                                    "characters)", tid, key="renders")
        return Target(
            id=tid, **axes, base_image=base_image, bootstrap=boot, settings=settings, variant=variant,
            tags=(str(ImageRef(spec.registry, spec.repository, tag)),), version_template=version,
            aliases=self._aliases(settings, source, fmt, tid), registry=spec.registry, repository=spec.repository,
        )

    def _variant(self, settings: Settings, source: dict[str, Any], key: tuple[Any, ...], tid: str) -> compat.Variant:
        """The torch variant of (torch, cuda); pip_packages that contradict its pins are problems."""
        if key not in self.variants:
            variant = compat.variant(*key)
            assert variant is not None  # target() asks after compat.problems, which refuses a pair without a variant
            self.variants[key] = variant
        variant = self.variants[key]
        if (id(settings), key) not in self.pin_conflicts:  # once per distinct settings and torch variant
            self.pin_conflicts[id(settings), key] = _pip_pin_conflicts(settings, source, variant)
        for loc, message in self.pin_conflicts[id(settings), key]:
            self.problems.add(loc, message, tid, key="pin")
        return variant

    def _aliases(self, settings: Settings, source: dict[str, Any], fmt: dict[str, Any], tid: str) -> dict[str, tuple[str, ...]]:
        """Each environment's moving aliases, rendered; one that is not a tag is a problem at its line."""
        aliases: dict[str, tuple[str, ...]] = {}
        for env, lst in settings.aliases.items():
            aliases[env] = tuple(a.format(**fmt, env=env) for a in lst)
            for j, a in enumerate(aliases[env]):
                try:
                    grammar.tag(a)
                except ValueError as e:
                    loc = source.get("aliases", ("defaults",))
                    self.problems.add((*loc, "aliases", env, j) if loc[-1] != "aliases" else (*loc, env, j),
                                      f"{lst[j]!r} renders {e}", tid, key="renders")
        return aliases


def _base_for(spec: MatrixFile, row: _Row, problems: Problems, tid: str) -> tuple[str, dict[str, Any] | None]:
    os_name = row.values["os"]
    if row.values["source"] == "cuda-base":
        ref, _ = compat.cuda_image(row.values["cuda"], row.values["flavor"], os_name, spec.cuda_base_image)
        try:
            grammar.image_reference(ref or "", pinned=True)
        except ValueError as e:
            problems.add(("cuda_base_image",), f"renders {e}", tid, key="renders")
        return ref or "", None
    base = spec.bases.get(os_name)
    if base is None:
        info = compat.os_info(os_name)
        return (info["image"] if info else ""), None
    if base.bootstrap:
        boot = {**base.bootstrap.model_dump(), "rootfs": BOOTSTRAP_ROOTFS}
        return bootstrap_tag(os_name, boot), boot
    assert base.image is not None  # Base._one: a base without bootstrap has an image
    return base.image, None


def _check_unique_tags(targets: list[Target], problems: Problems) -> None:
    """Every tag names one target: the targets' tags, aliases, the `{tag}-{env}` tags promotion adds, and the version
    tags of builds made in the same second (and their `{version}-{env}`), which nothing else may name either."""
    owner: dict[str, str] = {}
    for t in targets:
        names = [t.tag, *(f"{t.tag}-{e}" for e in ENVS), *(a for lst in t.aliases.values() for a in lst)]
        for n in dict.fromkeys(names):
            if owner.setdefault(n, t.id) != t.id:
                problems.add(("tag_template",), f"tag {n!r} would name both {owner[n]} and {t.id}; make "
                                                "tag_template/aliases include the axes that differ")
    for t in targets:
        version = t.version(SAMPLE)
        for n in (version, *(f"{version}-{e}" for e in ENVS)):
            if owner.setdefault(n, t.id) != t.id:
                shown = n.replace(str(SAMPLE), "{build}")
                problems.add(("version_template",), f"version tag {shown!r} would name both {owner[n]} and {t.id} "
                                                    "(built in the same second); make version_template include {tag} "
                                                    "(or the axes that differ)", t.id, key="collides")
                break
