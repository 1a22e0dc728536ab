"""matrix.yaml's `fleet:`: the node pools images are validated on, and which targets each pool can run.

Every target is validated on every pool unless the pool's `exclude:` selects it. A target a pool cannot run
(no cubin or PTX for the pool's GPU in the wheel's arch list, or a CUDA the pool's driver cannot run) and
that the pool does not exclude is refused at plan time, one line per problem, at the pool's line. The compat
data (gpuforge.image.compat) is the only source of facts: arch lists, driver floors, GPU capabilities.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

from gpuforge import grammar
from gpuforge.errors import SelectorError
from gpuforge.image import compat
from gpuforge.plan import selectors

if TYPE_CHECKING:
    from gpuforge.plan.schema import MatrixFile
    from gpuforge.plan.target import Target


# gpuforge.plan.matrix's Problems and Matrix, as this module uses them (matrix imports this module)
class _Problems(Protocol):
    def add(self, loc: tuple[Any, ...], message: str, target: str | None = None, *, key: object = None) -> None: ...


class _Matrix(Protocol):
    @property
    def spec(self) -> MatrixFile: ...

    @property
    def targets(self) -> Sequence[Target]: ...


@dataclass(frozen=True, kw_only=True)
class Pool:
    """A checked pool, as targets and the workflow see it."""

    name: str
    model: str
    capability: str
    drivers: tuple[str, ...]
    runs_on: tuple[str, ...]
    gpus: int

    @property
    def sm(self) -> str:
        return compat.sm(self.capability)

    def describe(self) -> str:
        return (f"{self.name} ({self.model}, {self.sm}, driver {', '.join(self.drivers)}, {self.gpus} GPU"
                f"{'s' if self.gpus > 1 else ''}, runs-on {', '.join(self.runs_on)})")

    def as_dict(self) -> dict[str, Any]:
        return {"pool": self.name, "gpu_model": self.model, "capability": self.capability,
                "drivers": list(self.drivers), "runs_on": list(self.runs_on), "gpus": self.gpus}


def _arch_text(v: compat.Variant) -> str:
    ptx = ", ".join(v.ptx) if v.ptx else "no PTX"
    return f"{v.arch_list[0]}..{v.arch_list[-1]} ({ptx})" if v.arch_list else ptx


def _pools(spec: MatrixFile, problems: _Problems) -> list[tuple[Pool, list[Any]]]:
    """The pools whose own fields are sound, each with its compiled exclude selectors."""
    out = []
    known = compat.gpu_models()
    for name, p in spec.fleet.items():
        loc = ("fleet", name)
        try:
            grammar.pool_name(name)
        except ValueError as e:
            problems.add(loc, str(e))
            continue
        want = compat.gpu_capability(p.gpu.model)
        if want is None:
            problems.add((*loc, "gpu", "model"), f"GPU model {p.gpu.model!r} is not in the compat data (known: "
                                                 f"{', '.join(known)}; add it to gpuforge/image/data/compat.yaml gpu_capability with "
                                                 f"its source){grammar.nearest(p.gpu.model, known)}")
            continue
        if p.gpu.capability != want:
            problems.add((*loc, "gpu", "capability"), f"{p.gpu.model} has compute capability {want} in the compat data, "
                                                      f"not {p.gpu.capability} (allowed: {want})")
            continue
        compiled = []
        for i, sel in enumerate(p.exclude):
            try:
                compiled.append((i, selectors.compile(sel.split())))
            except SelectorError as e:
                problems.add((*loc, "exclude", i), str(e))
        out.append((Pool(name=name, model=p.gpu.model, capability=want, drivers=tuple(p.drivers),
                         runs_on=tuple(p.runs_on), gpus=p.gpus), compiled))
    return out


def why_not(pool: Pool, t: Target) -> list[tuple[tuple[str | int, ...], str, object]]:
    """(loc below the pool, problem, group key) for each reason `pool` cannot run target `t`; [] when it can."""
    v = t.variant
    out: list[tuple[tuple[str | int, ...], str, object]] = []
    if not compat.arch_supported(pool.capability, v.arch_list, v.ptx):
        can = compat.variants_supporting(v.torch, pool.capability)
        fix = f"use a CUDA variant that has it ({', '.join(can)})" if can else "no torch variant in the compat data has it"
        out.append((("gpu",), f"{pool.model} ({pool.sm}) cannot run torch {v.torch_local_version}: its wheels carry "
                              f"{_arch_text(v)}, no kernel for {pool.sm} (CUDA fails with 'no kernel image is "
                              f"available'); {fix}, or exclude these targets from the pool "
                              f"(fleet.{pool.name}.exclude: [\"cuda={t.cuda}\"])", ("arch", v.name)))
    datacenter = compat.datacenter_gpu(pool.model)
    for i, d in enumerate(pool.drivers):
        verdict = compat.driver_verdict(d, t.cuda, datacenter=datacenter)
        if not verdict.ok:
            out.append((("drivers", i), f"{verdict.message} (pool {pool.name}); or exclude these targets from the pool "
                                        f"(fleet.{pool.name}.exclude: [\"cuda={t.cuda}\"])", ("driver", d, t.cuda)))
    return out


def assign(spec: MatrixFile, targets: list[Any], problems: _Problems) -> list[Any]:
    """Targets with `.pools` set (the pools that validate each, in file order) and `.excluded_from` (pool ->
    the exclude entry that removed it); every target a pool cannot run and does not exclude is a problem."""
    pools = _pools(spec, problems)
    hits = {(p.name, i): 0 for p, compiled in pools for i, _ in compiled}
    out = []
    for t in targets:
        mine, excluded = [], {}
        for pool, compiled in pools:
            ex = next((i for i, c in compiled if selectors.hit(t, c)), None)
            if ex is not None:
                hits[pool.name, ex] += 1
                excluded[pool.name] = spec.fleet[pool.name].exclude[ex]
                continue
            reasons = why_not(pool, t)
            for sub, message, key in reasons:
                problems.add(("fleet", pool.name, *sub), message, t.id, key=key)
            if not reasons:
                mine.append(pool)
        out.append(replace(t, pools=tuple(mine), excluded_from=excluded))
    for (name, i), n in hits.items():
        if n == 0:
            problems.add(("fleet", name, "exclude", i), f"{spec.fleet[name].exclude[i]!r} excludes no target from pool "
                                                        f"{name} (an exclude that applies nowhere is a mistake)")
    return out


# Where a target's GPU validation runs when matrix.yaml declares no fleet: any GPU runner registered with these labels
# (docs/ci.md), so every pushed digest still gets a GPU run before prod.
ANY_GPU_RUNNER = ("self-hosted", "linux", "x64", "gpu")


def gpu_matrix(targets: list[Any]) -> list[dict[str, Any]]:
    """One row per (target, pool) for the workflow's GPU validation job: `runs-on` the pool's labels; a target no pool
    validates (matrix.yaml declares no fleet, or its pools all exclude it) gets one row on ANY_GPU_RUNNER, pool "any"."""
    rows = []
    for t in targets:
        rows += [{"id": t.id, "tag": t.tag, **p.as_dict()} for p in t.pools] or \
            [{"id": t.id, "tag": t.tag, "pool": "any", "runs_on": list(ANY_GPU_RUNNER), "gpus": 1}]
    return rows


def pools_of(m: _Matrix) -> list[Pool]:
    """Every pool a loaded matrix declares, in file order (a pool that excludes every target included)."""
    seen: dict[str, Pool] = {}
    for t in m.targets:
        for p in t.pools:
            seen.setdefault(p.name, p)
    out = []
    for name, p in m.spec.fleet.items():
        out.append(seen.get(name) or Pool(name=name, model=p.gpu.model, capability=p.gpu.capability,
                                          drivers=tuple(p.drivers), runs_on=tuple(p.runs_on), gpus=p.gpus))
    return out
