"""The shape of matrix.yaml (pydantic), and the translation of its errors into file:line messages."""

from __future__ import annotations

import difflib
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from gpuforge.errors import ConfigError
from gpuforge.yamlpos import Positioned

AXES = ("torch", "cuda", "python", "os", "flavor", "source")
FLAVORS = ("runtime", "devel")
SOURCES = ("cuda-base", "wheels")

_strict = ConfigDict(extra="forbid", strict=True)


class Bootstrap(BaseModel):
    """A base made from a Debian mirror with debootstrap (airgapped sites use their own mirror)."""

    model_config = _strict
    suite: str
    mirror: str = "http://deb.debian.org/debian"
    variant: Literal["minbase", "buildd"] = "minbase"


class Base(BaseModel):
    model_config = _strict
    image: str | None = None
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
    size_budget_gb: float | int = 14
    user: str = Field("gpuforge", pattern=r"^[a-z_][a-z0-9_-]{0,31}$")
    uid: int = Field(1000, ge=1000, le=65000)
    index_url: str | None = None  # None: PyPI for PyPI's default variant, download.pytorch.org otherwise
    pypi_url: str = "https://pypi.org/simple"
    apt_packages: list[str] = []
    pip_packages: list[str] = []
    aliases: dict[str, list[str]] = {}


SETTING_KEYS = tuple(Settings.model_fields)


class Override(Settings):
    select: str


class Axes(BaseModel):
    model_config = _strict
    torch: list[str] = []
    cuda: list[str] = []
    python: list[str] = []
    os: list[str] = []
    flavor: list[Literal["runtime", "devel"]] = []
    source: list[Literal["cuda-base", "wheels"]] = []
    include: list[dict] = []
    exclude: list[dict] = []


class MatrixFile(BaseModel):
    model_config = _strict
    registry: str = "127.0.0.1:5000"
    repository: str = Field("gpuforge/pytorch", pattern=r"^[a-z0-9]+([._/-][a-z0-9]+)*$")
    tag_template: str = "{id}"
    cuda_base_image: str = "nvidia/cuda:{cuda_full}-{cudnn_tag}-{flavor}-{os}"
    bases: dict[str, Base] = {}
    defaults: Settings = Settings()
    matrix: Axes
    overrides: list[Override] = []
    default: list[str] = Field(min_length=1)
    extra_ca: str | None = None


# What each model allows, for "did you mean" suggestions on unknown keys.
_FIELDS = {
    m.__name__: tuple(m.model_fields)
    for m in (Bootstrap, Base, Settings, Override, Axes, MatrixFile)
}


def _hint(err: dict, doc: Positioned, loc: tuple) -> str:
    kind = err["type"]
    if kind == "extra_forbidden":
        key = str(loc[-1])
        allowed = _allowed_at(loc[:-1])
        close = difflib.get_close_matches(key, allowed, n=1)
        maybe = f"; perhaps you meant {close[0]!r}?" if close else ""
        return f"unknown key {key!r} (allowed: {', '.join(allowed)}){maybe}"
    if kind == "missing":
        return "required field is missing"
    if kind in ("string_type",) and isinstance(err.get("input"), float | int):
        return f"expected a string, got {err['input']!r}: quote version numbers, e.g. \"{err['input']}\""
    if kind == "literal_error":
        return f"{err['input']!r} is not allowed: {err['msg'].removeprefix('Input should be ')}"
    return err["msg"].replace("Input should be", "expected") + f" (got {err.get('input')!r})"


def _allowed_at(loc: tuple) -> tuple[str, ...]:
    head = loc[0] if loc else None
    if not loc:
        return _FIELDS["MatrixFile"]
    if head == "matrix":
        return _FIELDS["Axes"]
    if head == "defaults":
        return _FIELDS["Settings"]
    if head == "overrides":
        return _FIELDS["Override"]
    if head == "bases":
        return _FIELDS["Bootstrap"] if "bootstrap" in loc else _FIELDS["Base"]
    return ()


def json_schema() -> dict:
    """matrix.yaml's JSON schema, generated from the models (editors validate against it)."""
    return MatrixFile.model_json_schema()


def parse(doc: Positioned) -> MatrixFile:
    if not isinstance(doc.data, dict):
        msg = f"{doc.path}:1: the matrix file must be a mapping with at least `matrix:` and `default:`"
        raise ConfigError(msg)
    try:
        return MatrixFile.model_validate(doc.data)
    except ValidationError as e:
        lines = []
        for err in e.errors():
            # pydantic appends union/literal branch names to loc; keep only real keys and indexes
            loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and ("[" in p or p in ("str", "int", "float", "function-after"))))
            field = ".".join(str(p) for p in loc) or "(top level)"
            lines.append(f"{doc.where(loc)}: {field}: {_hint(err, doc, loc)}")
        raise ConfigError("\n".join(dict.fromkeys(lines))) from None
