"""The shape of matrix.yaml (pydantic, with gpuforge.grammar for every string that reaches a Dockerfile, a
shell or a tag), and the translation of its errors into one file:line message per problem."""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator

from gpuforge import grammar
from gpuforge.errors import ConfigError
from gpuforge.yamlpos import Positioned

AXES = ("torch", "cuda", "python", "os", "flavor", "source")
FLAVORS = ("runtime", "devel")
SOURCES = ("cuda-base", "wheels")
ENVS = ("dev", "prod")  # promotion environments (gpuforge promote --to)
# How containers ask the engine for GPUs (gpuforge.run.gpu_device_request): `gpu_request:` in matrix.yaml,
# --gpu-request and GPUFORGE_GPU_REQUEST (resolved by gpuforge.options.gpu_request).
GPU_REQUESTS = ("nvidia", "cdi")
# What tag_template and aliases may name ({env} only in aliases), and what cuda_base_image may name.
TAG_FIELDS = (*AXES, "id", "cuda_tag")
CUDA_BASE_FIELDS = ("cuda_full", "cudnn_tag", "flavor", "os")
MAX_ERRORS = 40  # lines of one report; the rest are counted

_strict = ConfigDict(extra="forbid", strict=True)


def _each(check):
    return Annotated[str, AfterValidator(check)]


def _budget(v: float) -> float:
    if not math.isfinite(v) or v <= 0:
        msg = f"size_budget_gb must be a positive, finite number of GB (got {v})"
        raise ValueError(msg)
    return v


def _alias(template: str) -> str:
    return grammar.placeholders(template, (*TAG_FIELDS, "env"), what="alias")


def _pip(requirement: str) -> str:
    grammar.pip_requirement(requirement)
    return requirement


Url = _each(grammar.url)


class Bootstrap(BaseModel):
    """A base made from a Debian mirror with debootstrap (airgapped sites use their own mirror)."""

    model_config = _strict
    suite: str
    mirror: Annotated[str, AfterValidator(lambda v: grammar.url(v, what="a mirror URL"))] = "http://deb.debian.org/debian"
    variant: Literal["minbase", "buildd"] = "minbase"


class Base(BaseModel):
    model_config = _strict
    image: _each(lambda v: grammar.image_reference(v, pinned=True)) | None = None
    bootstrap: Bootstrap | None = None

    @model_validator(mode="after")
    def _one(self) -> Base:
        if (self.image is None) == (self.bootstrap is None):
            msg = "a base needs exactly one of `image:` (pulled) or `bootstrap:` (built from a mirror)"
            raise ValueError(msg)
        return self


class Settings(BaseModel):
    """Per-target settings: `defaults:`, then `overrides:` that select, then include entries."""

    model_config = _strict
    size_budget_gb: Annotated[float | int, AfterValidator(_budget)] = 14
    user: _each(grammar.user_name) = "gpuforge"
    uid: int = Field(1000, ge=1000, le=65000)
    index_url: Url | None = None  # None: PyPI for PyPI's default variant, download.pytorch.org otherwise
    pypi_url: Url = "https://pypi.org/simple"
    apt_packages: list[_each(grammar.apt_package)] = []
    pip_packages: list[_each(_pip)] = []
    aliases: dict[Literal[ENVS], list[_each(_alias)]] = {}


SETTING_KEYS = tuple(Settings.model_fields)


class Override(Settings):
    select: str

    @model_validator(mode="after")
    def _sets_something(self) -> Override:
        if not self.model_fields_set - {"select"}:
            msg = f"this override sets nothing (add one of: {', '.join(SETTING_KEYS)})"
            raise ValueError(msg)
        return self


class ExcludeEntry(BaseModel):
    """An `exclude:` entry: axis values that remove the combinations they all match."""

    model_config = _strict
    torch: str | None = None
    cuda: str | None = None
    python: str | None = None
    os: str | None = None
    flavor: Literal["runtime", "devel"] | None = None
    source: Literal["cuda-base", "wheels"] | None = None

    @model_validator(mode="after")
    def _not_empty(self) -> ExcludeEntry:
        if not self.model_fields_set:
            msg = f"an empty exclude entry would exclude everything (give axis values: {', '.join(AXES)})"
            raise ValueError(msg)
        return self


class IncludeEntry(Settings):
    """An `include:` entry: axis values (GitHub Actions include semantics) plus per-target settings."""

    torch: str | None = None
    cuda: str | None = None
    python: str | None = None
    os: str | None = None
    flavor: Literal["runtime", "devel"] | None = None
    source: Literal["cuda-base", "wheels"] | None = None

    def given(self) -> dict:
        return self.model_dump(exclude_unset=True)


class Axes(BaseModel):
    model_config = _strict
    torch: list[str] = []
    cuda: list[str] = []
    python: list[str] = []
    os: list[str] = []
    flavor: list[Literal["runtime", "devel"]] = []
    source: list[Literal["cuda-base", "wheels"]] = []
    include: list[IncludeEntry] = []
    exclude: list[ExcludeEntry] = []


class MatrixFile(BaseModel):
    model_config = _strict
    registry: _each(grammar.registry) = "127.0.0.1:5000"
    repository: _each(grammar.repository) = "gpuforge/pytorch"
    tag_template: _each(lambda v: grammar.placeholders(v, TAG_FIELDS, what="tag_template", required=())) = "{id}"
    cuda_base_image: _each(lambda v: grammar.placeholders(v, CUDA_BASE_FIELDS, what="cuda_base_image",
                                                          required=("cuda_full",))) = \
        "nvidia/cuda:{cuda_full}-{cudnn_tag}-{flavor}-{os}"
    bases: dict[str, Base] = {}
    defaults: Settings = Settings()
    matrix: Axes
    overrides: list[Override] = []
    default: list[str] = Field(min_length=1)
    extra_ca: str | None = None
    gpu_request: Literal[GPU_REQUESTS] | None = None  # None: --gpu-request / GPUFORGE_GPU_REQUEST, else nvidia


# What each model allows, for "did you mean" suggestions on unknown keys.
_FIELDS = {
    m.__name__: tuple(m.model_fields)
    for m in (Bootstrap, Base, Settings, Override, Axes, MatrixFile, IncludeEntry, ExcludeEntry)
}
# Names pydantic puts into an error's loc that are schema branches, not keys of the file.
_BRANCHES = {"str", "int", "float", "bool", "none", "list", "dict", "union", "nullable", "literal"}


def _scalar_hint(value: object, written: str) -> str:
    kind = "a boolean" if isinstance(value, bool) else "null" if value is None else "a number"
    if kind == "a number":
        return f"expected a string, got {written} (a number to YAML): quote version numbers, e.g. \"{written}\""
    return f"expected a string, got {written} ({kind} to YAML): quote it, e.g. \"{written}\""


def _hint(err: dict, doc: Positioned, loc: tuple) -> str:
    kind = err["type"]
    value = err.get("input")
    if kind == "extra_forbidden":
        key = str(loc[-1])
        allowed = _allowed_at(loc[:-1])
        return f"unknown key {key!r} (allowed: {', '.join(allowed)}){grammar.nearest(key, allowed)}"
    if kind == "missing":
        return "required field is missing"
    if kind == "string_type" and (value is None or isinstance(value, bool | int | float)):
        return _scalar_hint(value, doc.written(loc, value))
    if kind == "literal_error":
        allowed = err["ctx"]["expected"].replace("'", "").replace(" or ", ", ")
        shown = doc.written(loc, value) if not isinstance(value, str) else value
        return f"{shown!r} is not allowed (allowed: {allowed}){grammar.nearest(shown, allowed.split(', '))}"
    if kind == "value_error":
        return err["msg"].removeprefix("Value error, ")
    if kind in ("float_type", "int_type", "bool_type") and isinstance(value, str):
        return f"expected a number, got the string {value!r} (write it unquoted)"
    shown = doc.written(loc, value) if not isinstance(value, dict | list) else type(value).__name__
    return err["msg"].replace("Input should be", "expected") + f" (got {shown})"


def _allowed_at(loc: tuple) -> tuple[str, ...]:
    if not loc:
        return _FIELDS["MatrixFile"]
    head = loc[0]
    if head == "matrix":
        if len(loc) >= 3 and loc[1] in ("include", "exclude"):
            return _FIELDS["IncludeEntry" if loc[1] == "include" else "ExcludeEntry"]
        return _FIELDS["Axes"]
    if head == "defaults":
        return _FIELDS["Settings"]
    if head == "overrides":
        return _FIELDS["Override"]
    if head == "bases":
        return _FIELDS["Bootstrap"] if "bootstrap" in loc else _FIELDS["Base"]
    return ()


def _real_loc(data: object, err: dict) -> tuple:
    """err's loc without the union/validator branch names pydantic adds: the keys and indexes found in the
    data, plus the name of a missing field."""
    loc, cur = [], data
    for p in err["loc"]:
        if (isinstance(cur, dict) and p in cur) or (isinstance(cur, list) and isinstance(p, int) and 0 <= p < len(cur)):
            loc.append(p)
            cur = cur[p]
        elif err["type"] == "missing" and isinstance(p, str) and p not in _BRANCHES and "[" not in p:
            loc.append(p)
            break
    return tuple(loc)


def json_schema() -> dict:
    """matrix.yaml's JSON schema, generated from the models (editors validate against it)."""
    return MatrixFile.model_json_schema()


def report(lines: list[str]) -> str:
    """One error report: distinct lines, at most MAX_ERRORS of them, then a count of the rest."""
    lines = list(dict.fromkeys(lines))
    if len(lines) > MAX_ERRORS:
        lines = [*lines[:MAX_ERRORS], f"... and {len(lines) - MAX_ERRORS} more problems"]
    return "\n".join(lines)


def field(loc: tuple) -> str:
    return ".".join(str(p) for p in loc) or "(top level)"


def parse(doc: Positioned) -> MatrixFile:
    if not isinstance(doc.data, dict):
        msg = f"{doc.path}:1: the matrix file must be a mapping with at least `matrix:` and `default:`"
        raise ConfigError(msg)
    try:
        return MatrixFile.model_validate(doc.data)
    except ValidationError as e:
        by_loc: dict[tuple, tuple[int, str]] = {}
        for err in e.errors():
            loc = _real_loc(doc.data, err)
            if loc not in by_loc:  # one line per value (a union reports each branch)
                by_loc[loc] = (doc.line(loc), f"{doc.where(loc)}: {field(loc)}: {_hint(err, doc, loc)}")
        raise ConfigError(report([text for _, text in sorted(by_loc.values(), key=lambda x: x[0])])) from None
