"""Every error gpuforge reports to a user. Caught once, in gpuforge.cli.main, printed as one line."""

from __future__ import annotations


class FatalError(Exception):
    """An error the user can act on; its message says what failed, why, and what to do."""

    return_code = 1


class ConfigError(FatalError):
    """matrix.yaml, a flag, a GPUFORGE_* variable or an input file (--target-json) is malformed or asks for
    something impossible."""

    return_code = 2


class SelectorError(ConfigError):
    """A target selector matched nothing."""


class EngineError(FatalError):
    """The Docker engine or client is missing, not running, or refused a request."""

    return_code = 3


class BuildError(FatalError):
    """One or more targets failed to build."""

    return_code = 4


class ValidationFailed(FatalError):
    """Validators ran and at least one check failed."""

    return_code = 5


class RegistryError(FatalError):
    """The registry is unreachable, refused credentials, or lacks a manifest."""

    return_code = 6


class PromotionRefused(FatalError):
    """Promotion was refused; every tag was left as it was."""

    return_code = 7


class StateError(FatalError):
    """A record (state dir) or report file cannot be read or written: malformed, of another shape or schema
    version, a symlink, or the disk refused (no space, permission, read-only). The line names the file."""

    return_code = 8
    errno: int | None = None


class CveGateRed(FatalError):
    """The CVE gate's verdict is red: counted findings, expired exceptions, unaudited packages or a stale database."""

    return_code = 9
