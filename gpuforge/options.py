"""Option resolution in one place: CLI flag, then environment, then matrix.yaml, then the default.

Each resolved value remembers where it came from, so an error names the real source (`--extra-ca`,
`GPUFORGE_EXTRA_CA`, or `matrix.yaml:12: extra_ca`), and a relative path from the matrix file is
resolved against the matrix file's folder, not the cwd.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from gpuforge.errors import ConfigError
from gpuforge.plan import grammar
from gpuforge.plan.schema import GPU_REQUESTS


@dataclass(frozen=True)
class Resolved:
    name: str
    value: str | None
    source: str  # "--flag", "ENV_VAR", "matrix.yaml:LINE: key" or "default"

    def __bool__(self) -> bool:
        return self.value is not None


def resolve(name: str, *, flag: str, cli: str | None, env: str | None = None, matrix=None, key: str | None = None,
            default: str | None = None, is_path: bool = False) -> Resolved:
    """The first value given among: the CLI flag, $env, matrix.yaml's `key`, the default.

    `matrix` is a loaded gpuforge.plan.matrix.Matrix (its spec and positions); `key` a top-level matrix key.
    """
    if cli not in (None, ""):
        return Resolved(name, cli, flag)
    if env and os.environ.get(env):
        return Resolved(name, os.environ[env], env)
    if matrix is not None and key and getattr(matrix.spec, key, None) not in (None, ""):
        value = str(getattr(matrix.spec, key))
        if is_path and not Path(value).is_absolute():
            value = str((matrix.path.parent / value).resolve())
        return Resolved(name, value, f"{matrix.doc.where((key,))}: {key}")
    return Resolved(name, default, "default")


def existing_file(opt: Resolved, what: str) -> Resolved:
    """Refuse a path option that names no file, blaming the source it came from."""
    if opt.value is not None and not Path(opt.value).is_file():
        msg = f"{opt.source}: {opt.value}: no such file ({what})"
        raise ConfigError(msg)
    return opt


def one_of(opt: Resolved, allowed, what: str) -> Resolved:
    """Refuse a value outside `allowed`, blaming the source it came from (a flag or an env var get no
    pydantic check; matrix.yaml's value was checked at load, this is the same rule again)."""
    if opt.value is not None and opt.value not in allowed:
        msg = (f"{opt.source}: {opt.value!r} is not {what} (allowed: {', '.join(allowed)})"
               f"{grammar.nearest(opt.value, allowed)}")
        raise ConfigError(msg)
    return opt


def gpu_request(cli: str | None, matrix=None) -> Resolved:
    """How containers ask for GPUs: --gpu-request, GPUFORGE_GPU_REQUEST, matrix.yaml's gpu_request, nvidia."""
    opt = resolve("gpu_request", flag="--gpu-request", cli=cli, env="GPUFORGE_GPU_REQUEST", matrix=matrix,
                  key="gpu_request", default=GPU_REQUESTS[0])
    return one_of(opt, GPU_REQUESTS, "a GPU request mode")
