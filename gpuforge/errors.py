"""Every error gpuforge reports to a user. Caught once, in gpuforge.cli.main, printed as one line.

Each kind has its own exit code and a short `what` (the `--help` epilog and the README list them from
here, so a new kind documents itself). Raise a subclass: a bare FatalError (exit 1) is a bug.
"""

from __future__ import annotations


class FatalError(Exception):
    """An error the user can act on; its message says what failed, why, and what to do."""

    return_code = 1
    what = "an error gpuforge did not classify (a bug: please report it)"


class ConfigError(FatalError):
    """matrix.yaml, a flag, a GPUFORGE_* variable or an input file (--target-json) is malformed or asks for
    something impossible."""

    return_code = 2
    what = "bad input: matrix.yaml, a CLI option, an environment variable, an image that is not a gpuforge image"


class SelectorError(ConfigError):
    """A target selector matched nothing."""


class EngineError(FatalError):
    """The Docker engine or client is missing, not running, or refused a request."""

    return_code = 3
    what = "the Docker engine: missing, unreachable, lost mid-run, or no GPU / NVIDIA runtime"


class BuildError(FatalError):
    """One or more targets failed to build."""

    return_code = 4
    what = "a build failed"


class ValidationFailed(FatalError):
    """Validators ran and at least one check failed."""

    return_code = 5
    what = "validation ran and a check failed"


class RegistryError(FatalError):
    """The registry is unreachable, refused credentials, or lacks a manifest."""

    return_code = 6
    what = "the registry: unreachable, refused, or lacks a manifest"


class PromotionRefused(FatalError):
    """Promotion was refused; every tag was left as it was."""

    return_code = 7
    what = "promotion refused; no tag moved"


class StateError(FatalError):
    """A record (state dir), report or bundle file cannot be read or written: malformed, truncated, of another shape
    or schema version, a symlink, or the disk refused (no space, permission, read-only). The line names the file."""

    return_code = 8
    what = ("a state, report or bundle file: no build record, malformed or truncated, a symlink, or it cannot be "
            "written (disk full, read-only)")
    errno: int | None = None


class CveGateRed(FatalError):
    """The CVE gate's verdict is red: counted findings, expired exceptions, unaudited packages or a stale database."""

    return_code = 9
    what = "the CVE gate is red (findings, expired exceptions, unaudited packages, stale database)"


class NodeNotFit(FatalError):
    """The GPU node failed readiness (`smoke --level r1|r2`, `validate --gpu`) for a reason of its own: driver, GPU
    health, the container's limits or the GPU's speed. Says nothing about the image."""

    return_code = 10
    what = "the GPU node is not fit (readiness blamed the host: driver, GPU health, limits, speed)"


class BundleRefused(FatalError):
    """`gpuforge attach` refused a bundle of offline-signed evidence: a signature that does not verify with the key,
    another image's layers, another validator set, an expired statement, another pool, another digest. Nothing was
    attached."""

    return_code = 11
    what = ("attach refused: the bundle is not evidence for this image here (signature, signer, digest, layers, "
            "validator set, age, pool); nothing attached")


def exit_codes() -> list[tuple[int, str]]:
    """(exit code, what it means) for every error kind, ascending; 0 success, 130 interrupted."""
    seen: dict[int, str] = {}
    todo = list(FatalError.__subclasses__())
    while todo:
        cls = todo.pop(0)
        todo += cls.__subclasses__()
        seen.setdefault(cls.return_code, getattr(cls, "what", None) or (cls.__doc__ or "").strip().splitlines()[0])
    return sorted([(0, "success"), *seen.items(), (130, "interrupted (Ctrl-C)")])
