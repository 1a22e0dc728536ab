"""The shape of matrix.yaml (pydantic, with gpuforge.grammar for every string that reaches a Dockerfile, a
shell or a tag), and the translation of its errors into one file:line message per problem."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Annotated, Any, Literal, get_args

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.fields import FieldInfo

from gpuforge import grammar
from gpuforge.errors import ConfigError
from gpuforge.grammar import GpuRequest
from gpuforge.image import compat
from gpuforge.plan.yamlpos import Positioned, error_loc

AXES = ("torch", "cuda", "python", "os", "flavor", "source")
Flavor = Literal["runtime", "devel"]
Source = Literal["cuda-base", "wheels"]
Env = Literal["dev", "prod"]  # promotion environments (gpuforge promote --env)
FLAVORS: tuple[Flavor, ...] = get_args(Flavor)
SOURCES: tuple[Source, ...] = get_args(Source)
ENVS: tuple[Env, ...] = get_args(Env)
# How containers ask the engine for GPUs (gpuforge.engine.containers.gpu_device_request): `gpu_request:` in matrix.yaml,
# --gpu-request and GPUFORGE_GPU_REQUEST (resolved by gpuforge.options.gpu_request): grammar.GpuRequest.
# What tag_template and aliases may name ({env} only in aliases), what version_template may name (it must name
# {build}: gpuforge.plan.version), and what cuda_base_image may name.
TAG_FIELDS = (*AXES, "id", "cuda_tag")
VERSION_FIELDS = (*TAG_FIELDS, "tag", "build")
CUDA_BASE_FIELDS = ("cuda_full", "cudnn_tag", "flavor", "os")
MAX_ERRORS = 40  # lines of one report; the rest are counted

_strict = ConfigDict(extra="forbid", strict=True)


def _text(pattern: str, about: str, **schema: Any) -> FieldInfo:
    """The schema of a string the loader checks (an AfterValidator beside it in the Annotated): matrix.schema.json
    carries `pattern` (grammar's own regex) so editors and check-jsonschema apply the same rule, and `about` says
    what the loader checks beyond it."""
    # pydantic types Field() as Any, so that `x: int = Field(...)` type-checks as a default; it is a FieldInfo
    info: FieldInfo = Field(description=about, json_schema_extra={"pattern": grammar.json_pattern(pattern), **schema})
    return info


def _budget(v: float) -> float:
    if not math.isfinite(v) or v <= 0:
        msg = f"size_budget_gb must be a positive, finite number of GB (got {v})"
        raise ValueError(msg)
    return v


def _tag_template(template: str) -> str:
    if "{build}" in template:
        msg = (f"tag_template {template!r}: {{build}} names one build, and the target's tag is shared by its builds "
               "(the local engine tag, the stem of `<tag>-dev`); put it in version_template (default {tag}-{build})")
        raise ValueError(msg)
    return grammar.placeholders(template, TAG_FIELDS, what="tag_template", required=())


def _alias(template: str) -> str:
    return grammar.placeholders(template, (*TAG_FIELDS, "env"), what="alias")


def _pip(requirement: str) -> str:
    grammar.pip_requirement(requirement)
    return requirement


# An os axis value: one the compat data knows (the loader says which, with the nearest).
Os = Annotated[str, Field(json_schema_extra={"enum": compat.os_names()})]
_URL_ABOUT = "http(s)://HOST[:PORT]/PATH: no credentials, whitespace or control characters"
Url = Annotated[str, AfterValidator(grammar.url), _text(grammar.URL, _URL_ABOUT)]


class Bootstrap(BaseModel):
    """A base made from a Debian mirror with debootstrap (airgapped sites use their own mirrors). Its apt sources
    name the suite and `<suite>-updates` on `mirror`, and `<suite>-security` on `security_mirror`."""

    model_config = _strict
    suite: str = Field(description="the os's own Debian codename (e.g. bookworm for debian12)")
    mirror: Annotated[str, AfterValidator(lambda v: grammar.url(v, what="a mirror URL")),
                      _text(grammar.URL, _URL_ABOUT)] = "http://deb.debian.org/debian"
    security_mirror: Annotated[
        str, AfterValidator(lambda v: grammar.url(v, what="a security mirror URL")),
        _text(grammar.URL, f"{_URL_ABOUT}; serves <suite>-security (Debian's: http://deb.debian.org/debian-security)"),
    ] = "http://deb.debian.org/debian-security"
    variant: Literal["minbase", "buildd"] = "minbase"


class Base(BaseModel):
    model_config = _strict
    image: Annotated[
        str, AfterValidator(lambda v: grammar.image_reference(v, pinned=True)),
        _text(grammar.PINNED_REFERENCE, f"[REGISTRY/]NAME:TAG (not latest) or NAME@DIGEST; the name at most "
                                        f"{grammar.NAME_MAX} characters, of the os's own family and version"),
    ] | None = None
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
    size_budget_gb: Annotated[float | int, AfterValidator(_budget), Field(json_schema_extra={"exclusiveMinimum": 0})] = 14
    user: Annotated[
        str, AfterValidator(grammar.user_name),
        _text(grammar.USER_NAME, "a new, unprivileged account (not one the base image has)",
              maxLength=grammar.USER_MAX, **{"not": {"enum": sorted(grammar.SYSTEM_ACCOUNTS)}}),
    ] = "gpuforge"
    uid: int = Field(1000, ge=1000, le=65000)
    index_url: Url | None = None  # None: PyPI for PyPI's default variant, download.pytorch.org otherwise
    pypi_url: Url = "https://pypi.org/simple"
    apt_packages: list[Annotated[str, AfterValidator(grammar.apt_package),
                                 _text(grammar.APT_PACKAGE, "a Debian package name, optionally =VERSION")]] = []
    pip_packages: list[Annotated[
        str, AfterValidator(_pip),
        _text(grammar.PIP_REQUIREMENT, "a PEP 508 requirement from an index, not torch, torchvision, torchaudio or "
                                       "triton; the loader also parses it with packaging and checks it against the "
                                       "target's pins"),
    ]] = []
    aliases: dict[Env, list[Annotated[
        str, AfterValidator(_alias),
        _text(grammar.template((*TAG_FIELDS, "env")),
              "a tag template: each target's alias must render to a valid tag, unique"),
    ]]] = {}


SETTING_KEYS = tuple(Settings.model_fields)


class Override(Settings):
    model_config = ConfigDict(json_schema_extra={"minProperties": 2})  # select and at least one setting
    select: str

    @model_validator(mode="after")
    def _sets_something(self) -> Override:
        if not self.model_fields_set - {"select"}:
            msg = f"this override sets nothing (add one of: {', '.join(SETTING_KEYS)})"
            raise ValueError(msg)
        return self


class AxisValues(BaseModel):
    """At most one value per axis (AXES): what an `include:` or `exclude:` entry names. The one definition of those
    fields, so the two entries cannot come to accept different values for an axis."""

    model_config = _strict
    torch: str | None = None
    cuda: str | None = None
    python: str | None = None
    os: Os | None = None
    flavor: Flavor | None = None
    source: Source | None = None


class ExcludeEntry(AxisValues):
    """An `exclude:` entry: axis values that remove the combinations they all match."""

    model_config = ConfigDict(**_strict, json_schema_extra={"minProperties": 1})

    @model_validator(mode="after")
    def _not_empty(self) -> ExcludeEntry:
        if not self.model_fields_set:
            msg = f"an empty exclude entry would exclude everything (give axis values: {', '.join(AXES)})"
            raise ValueError(msg)
        return self


class IncludeEntry(Settings, AxisValues):
    """An `include:` entry: axis values (GitHub Actions include semantics) plus per-target settings."""

    def given(self) -> dict[str, Any]:
        return self.model_dump(exclude_unset=True)


class Axes(BaseModel):
    model_config = _strict
    torch: list[str] = []
    cuda: list[str] = []
    python: list[str] = []
    os: list[Os] = []
    flavor: list[Flavor] = []
    source: list[Source] = []
    include: list[IncludeEntry] = []
    exclude: list[ExcludeEntry] = []


# A fleet pool's GPU model: one the compat data knows (gpuforge.plan.fleet says which, with the nearest).
GpuModel = Annotated[str, Field(json_schema_extra={"enum": compat.gpu_models()})]


class Gpu(BaseModel):
    """A pool's GPU: the model (a key of the compat data's gpu_capability) and its compute capability, which
    must be the one the compat data gives that model (the data is the only source of GPU facts)."""

    model_config = _strict
    model: GpuModel
    capability: Annotated[str, AfterValidator(grammar.capability),
                          _text(grammar.CAPABILITY, "MAJOR.MINOR; must equal the compat data's for the model")]


class Pool(BaseModel):
    """One node pool of the fleet: the GPU model, the driver(s) its nodes run, the runner labels that reach
    it, how many GPUs one job gets, and the targets it is not meant to run (selectors)."""

    model_config = _strict
    gpu: Gpu
    drivers: list[Annotated[str, AfterValidator(grammar.driver_version),
                            _text(grammar.DRIVER_VERSION, "an NVIDIA Linux driver version")]] = Field(min_length=1)
    runs_on: list[Annotated[str, AfterValidator(grammar.runner_label),
                            _text(grammar.RUNNER_LABEL, "a GitHub Actions runner label")]] = Field(min_length=1)
    gpus: int = Field(1, ge=1, le=64)
    exclude: list[str] = []  # target selectors (as `overrides.select`) this pool does not validate


class MatrixFile(BaseModel):
    model_config = _strict
    registry: Annotated[
        str, AfterValidator(grammar.registry),
        _text(grammar.REGISTRY, "HOST[:PORT] without a scheme (a dot, localhost, or a port)"),
    ] = "127.0.0.1:5000"
    repository: Annotated[
        str, AfterValidator(grammar.repository),
        _text(grammar.REPOSITORY, f"registry/repository at most {grammar.NAME_MAX} characters",
              maxLength=grammar.NAME_MAX),
    ] = "gpuforge/pytorch"
    tag_template: Annotated[
        str, AfterValidator(_tag_template),
        _text(grammar.template(TAG_FIELDS),
              "the target's tag, shared by its builds (the local engine tag, the stem of the environment tags); "
              f"must render to a valid tag of at most {grammar.TAG_MAX} characters, less promotion suffixes"),
    ] = "{id}"
    version_template: Annotated[
        str, AfterValidator(lambda v: grammar.placeholders(v, VERSION_FIELDS, what="version_template",
                                                           required=("build",))),
        _text(grammar.template(VERSION_FIELDS, required=("build",)),
              "the version tag of one build, which never moves; must contain {build} (the build's UTC "
              "time, e.g. 20261206T203015Z) and render to a valid tag of at most "
              f"{grammar.TAG_MAX} characters, less promotion suffixes"),
    ] = "{tag}-{build}"
    cuda_base_image: Annotated[
        str, AfterValidator(lambda v: grammar.placeholders(v, CUDA_BASE_FIELDS, what="cuda_base_image",
                                                           required=("cuda_full",))),
        _text(grammar.template(CUDA_BASE_FIELDS, first=r"[A-Za-z0-9\[]", char=grammar.REFERENCE_CHAR,
                               required=("cuda_full",)),
              "must render to an image reference for each target"),
    ] = "nvidia/cuda:{cuda_full}-{cudnn_tag}-{flavor}-{os}"
    bases: dict[str, Base] = {}
    defaults: Settings = Settings()
    matrix: Axes
    overrides: list[Override] = []
    default: list[str] = Field(min_length=1)
    extra_ca: str | None = None
    gpu_request: GpuRequest | None = None  # None: --gpu-request / GPUFORGE_GPU_REQUEST, else nvidia
    fleet: dict[str, Pool] = {}  # pool name -> pool (gpuforge.plan.fleet checks every target against each)


# What each model allows, for "did you mean" suggestions on unknown keys.
_FIELDS = {
    m.__name__: tuple(m.model_fields)
    for m in (Bootstrap, Base, Settings, Override, Axes, MatrixFile, IncludeEntry, ExcludeEntry, Gpu, Pool)
}


def _scalar_hint(value: object, written: str) -> str:
    kind = "a boolean" if isinstance(value, bool) else "null" if value is None else "a number"
    if kind == "a number":
        return f"expected a string, got {written} (a number to YAML): quote version numbers, e.g. \"{written}\""
    return f"expected a string, got {written} ({kind} to YAML): quote it, e.g. \"{written}\""


def _hint(err: Mapping[str, Any], doc: Positioned, loc: tuple[Any, ...]) -> str:
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
    message: str = err["msg"]
    if kind == "value_error":
        return message.removeprefix("Value error, ")
    if kind in ("float_type", "int_type", "bool_type") and isinstance(value, str):
        return f"expected a number, got the string {value!r} (write it unquoted)"
    shown = doc.written(loc, value) if not isinstance(value, dict | list) else type(value).__name__
    return message.replace("Input should be", "expected") + f" (got {shown})"


def _allowed_at(loc: tuple[Any, ...]) -> tuple[str, ...]:
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
    if head == "fleet":
        return _FIELDS["Gpu"] if "gpu" in loc[2:] else _FIELDS["Pool"]
    return ()


def json_schema() -> dict[str, Any]:
    """matrix.yaml's JSON schema, generated from the models (editors validate against it), plus what the loader
    checks per os from the compat data (gpuforge.plan.matrix._check_bases): known os names, debootstrap only for
    Debian and only of the os's own suite."""
    schema = MatrixFile.model_json_schema()
    base = {"$ref": "#/$defs/Base"}
    per_os = {}
    for name in compat.os_names():
        info = compat.os_info(name)
        assert info is not None  # os_names() lists the keys os_info reads
        rule = ({"properties": {"bootstrap": {"properties": {"suite": {"const": info["codename"]}}}}}
                if info["family"] == "debian" else {"not": {"required": ["bootstrap"]}})
        per_os[name] = {"allOf": [base, rule]}
    schema["properties"]["bases"].update(propertyNames={"enum": compat.os_names()}, properties=per_os)
    schema["properties"]["fleet"]["propertyNames"] = {"pattern": grammar.json_pattern(grammar.POOL_NAME)}
    return schema


def report(lines: list[str]) -> str:
    """One error report: distinct lines, at most MAX_ERRORS of them, then a count of the rest."""
    lines = list(dict.fromkeys(lines))
    if len(lines) > MAX_ERRORS:
        lines = [*lines[:MAX_ERRORS], f"... and {len(lines) - MAX_ERRORS} more problems"]
    return "\n".join(lines)


def field(loc: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in loc) or "(top level)"


def parse(doc: Positioned) -> MatrixFile:
    if not isinstance(doc.data, dict):
        msg = f"{doc.path}:1: the matrix file must be a mapping with at least `matrix:` and `default:`"
        raise ConfigError(msg)
    try:
        return MatrixFile.model_validate(doc.data)
    except ValidationError as e:
        by_loc: dict[tuple[Any, ...], tuple[int, str]] = {}
        for err in e.errors():
            loc = error_loc(doc.data, err)
            if loc not in by_loc:  # one line per value (a union reports each branch)
                by_loc[loc] = (doc.line(loc), f"{doc.where(loc)}: {field(loc)}: {_hint(err, doc, loc)}")
        raise ConfigError(report([text for _, text in sorted(by_loc.values(), key=lambda x: x[0])])) from None
