"""target.json, typed: what an image (or a GPU host) must contain. One shape for every reader and writer.

Written once, by rendering (images/dist/<id>/target.json, copied into the image as /opt/gpuforge/target.json, and
beside each report); read with a schema check by the validator plugin, the entrypoint's preflight and
`gpuforge smoke --target-json`. Stdlib only: every image carries gpuforge/image.

A file of another shape (unknown key, wrong type, not a JSON object, not JSON, unreadable) raises ExpectedError:
one line naming the file, the field and what to do.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

_VERSION = re.compile(r"[0-9A-Za-z][0-9A-Za-z.+_-]{0,63}")
_PIN = re.compile(r"[a-z0-9][a-z0-9-]{0,63}==[0-9][0-9.]{0,31}")
_ARCH = re.compile(r"sm_[0-9]{2,3}[a-z]?|compute_[0-9]{2,3}[a-z]?")
WHAT_TO_DO = "regenerate it with `gpuforge generate` (or pass the image's /opt/gpuforge/target.json)"


class ExpectedError(ValueError):
    """A target.json (or --expect value) of the wrong shape; the message names the source and the field."""


@dataclass(frozen=True, kw_only=True)
class Expected:
    """Every field may be absent (None): a GPU host may be checked against a few --expect values only; the
    checks that need an absent field say so."""

    id: str | None = None
    torch: str | None = None
    torchvision: str | None = None
    torchaudio: str | None = None
    triton: str | None = None
    cuda: str | None = None
    cudnn: str | None = None
    nccl: str | None = None
    python: str | None = None
    os: str | None = None
    flavor: str | None = None
    source: str | None = None
    user: str | None = None
    uid: int | None = None
    size_budget_gb: float | None = None
    arch_list: tuple[str, ...] | None = None
    ptx: tuple[str, ...] = ()
    toolkit: tuple[str, ...] | None = None  # devel from wheels: the CUDA toolkit wheels it adds, name==version

    # --- reading ---------------------------------------------------------------------------------

    @classmethod
    def from_dict(cls, raw: object, source: str, *, text: bool = False) -> Expected:
        """Check and convert a parsed target.json (`text`: values are KEY=VALUE strings, as --expect gives them)."""
        if not isinstance(raw, Mapping):
            msg = f"{source}: not a target.json (a JSON object of expected versions, got {type(raw).__name__}); {WHAT_TO_DO}"
            raise ExpectedError(msg)
        unknown = sorted(set(raw) - set(FIELDS))
        if unknown:
            msg = f"{source}: unknown key(s) {', '.join(map(str, unknown))} (known: {', '.join(FIELDS)}); {WHAT_TO_DO}"
            raise ExpectedError(msg)
        return cls(**{k: _field(k, v, source, text) for k, v in raw.items() if v is not None})

    @classmethod
    def load(cls, path: str | Path) -> Expected:
        """Read and check a target.json file."""
        p = Path(path)
        try:
            data = p.read_bytes()
        except FileNotFoundError:
            msg = f"{p}: no such target.json; {WHAT_TO_DO}"
            raise ExpectedError(msg) from None
        except OSError as e:
            msg = f"{p}: cannot read the target.json ({e.strerror}); {WHAT_TO_DO}"
            raise ExpectedError(msg) from None
        try:
            raw = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            where = f" at line {e.lineno}" if isinstance(e, json.JSONDecodeError) else ""
            msg = f"{p}: not valid JSON{where} ({type(e).__name__}); {WHAT_TO_DO}"
            raise ExpectedError(msg) from None
        return cls.from_dict(raw, str(p))

    @classmethod
    def coerce(cls, value: Expected | Mapping[str, Any], source: str = "target") -> Expected:
        return value if isinstance(value, Expected) else cls.from_dict(value, source)

    def merged(self, overrides: Mapping[str, str], source: str) -> Expected:
        """These values with KEY=VALUE overrides (smoke --expect) applied, checked the same way."""
        given = {k: v for k, v in self.as_dict().items()}
        given.update(Expected.from_dict(dict(overrides), source, text=True).as_dict())
        return Expected.from_dict(given, source)

    # --- writing ---------------------------------------------------------------------------------

    def as_dict(self) -> dict[str, Any]:
        """The given fields, JSON-ready (lists for the arch fields)."""
        out = {}
        for k, v in asdict(self).items():
            if v is not None:
                out[k] = list(v) if isinstance(v, tuple) else v
        return out

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), indent=2, sort_keys=True) + "\n"


FIELDS = tuple(f.name for f in fields(Expected))


def _field(key: str, value: object, source: str, text: bool) -> Any:
    def bad(allowed: str) -> ExpectedError:
        return ExpectedError(f"{source}: {key}={value!r} is not {allowed}; {WHAT_TO_DO}")

    arch, uid, size, name = ("a list of CUDA architectures (sm_90, compute_90)", "a user id (0 to 2147483647)",
                             "a size in GB", "a version or name (letters, digits and . + _ -)")

    if key in ("arch_list", "ptx"):
        items = value.split(",") if isinstance(value, str) and text else value
        if not isinstance(items, list | tuple) or not all(isinstance(a, str) and _ARCH.fullmatch(a) for a in items):
            raise bad(arch)
        return tuple(items)
    if key == "toolkit":
        items = value.split(",") if isinstance(value, str) and text else value
        if not isinstance(items, list | tuple) or not all(isinstance(a, str) and _PIN.fullmatch(a) for a in items):
            allowed = "a list of pinned wheels (name==version)"
            raise bad(allowed)
        return tuple(items)
    if key == "uid":
        if text and isinstance(value, str) and value.isdigit():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**31:
            raise bad(uid)
        return value
    if key == "size_budget_gb":
        if text and isinstance(value, str):
            try:
                num = float(value)
            except ValueError:
                raise bad(size) from None
            value = int(num) if num.is_integer() and "." not in value else num  # keep 14 as 14 (the label reads "14")
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 10_000:
            raise bad(size)
        return value
    if not isinstance(value, str) or not _VERSION.fullmatch(value):
        raise bad(name)
    return value
