"""The two ways gpuforge runs a BuildKit build, behind one Protocol and registered by name (DRIVERS): buildx
(`docker buildx build --load`, the primary) and classic BuildKit (`DOCKER_BUILDKIT=1 docker build`, a docker.io
20.10 client). A driver knows its own command and which build options it cannot honour; the build stage adds what
both share (labels, secrets, the Dockerfile, the context)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol


class Driver(Protocol):
    name: ClassVar[str]  # buildx | classic: recorded in each build record
    # read-only (properties) so that the frozen dataclasses below satisfy the protocol
    @property
    def client(self) -> str: ...  # path of the docker client binary
    @property
    def client_version(self) -> str: ...
    writes_metadata: ClassVar[bool]  # whether the build writes --metadata-file (what BuildKit made: config digest, index)
    exports: ClassVar[bool]  # whether its recorded build can run again with another exporter (push's zstd copy)

    def describe(self) -> str: ...

    def command(self, *, builder: str | None, cache_from: Sequence[str], cache_to: str | None,
                provenance: str | None, metadata: str | None, gzip_level: int | None = None) -> list[str]:
        """The build command up to the options every driver shares."""
        ...

    def cannot(self, *, builder: str | None, cache_from: Sequence[str], cache_to: str | None,
               gzip_level: int | None = None) -> str | None:
        """Why this driver cannot honour the given options (None: it can): refused, never silently dropped."""
        ...


LOAD = "type=docker"  # buildx's --load: the image into the engine's own store


@dataclass(frozen=True, kw_only=True)
class Buildx:
    name: ClassVar[str] = "buildx"
    writes_metadata: ClassVar[bool] = True
    exports: ClassVar[bool] = True
    client: str
    client_version: str

    def describe(self) -> str:
        return f"build driver: {self.name} (docker buildx build --load) via {self.client} {self.client_version}"

    def command(self, *, builder: str | None, cache_from: Sequence[str], cache_to: str | None,
                provenance: str | None, metadata: str | None, gzip_level: int | None = None) -> list[str]:
        # --load is `--output type=docker`; the exporter's gzip level needs the long form
        load = ["--output", f"{LOAD},compression=gzip,compression-level={gzip_level}"] if gzip_level is not None else ["--load"]
        argv = [self.client, "buildx", "build", *load]
        if builder:
            argv += ["--builder", builder]
        for c in cache_from:
            argv += ["--cache-from", c]
        if cache_to:
            argv += ["--cache-to", cache_to]
        if provenance is not None:  # BuildKit >= 0.11 attaches provenance by default; buildx 0.10+ knows the flag
            argv.append(f"--provenance={provenance}")
        if metadata:
            argv += ["--metadata-file", metadata]
        return argv

    def cannot(self, *, builder: str | None, cache_from: Sequence[str], cache_to: str | None,
               gzip_level: int | None = None) -> str | None:
        return None


@dataclass(frozen=True, kw_only=True)
class Classic:
    name: ClassVar[str] = "classic"
    writes_metadata: ClassVar[bool] = False
    exports: ClassVar[bool] = False
    client: str
    client_version: str

    def describe(self) -> str:
        return f"build driver: {self.name} (DOCKER_BUILDKIT=1 docker build) via {self.client} {self.client_version}"

    def command(self, *, builder: str | None, cache_from: Sequence[str], cache_to: str | None,
                provenance: str | None, metadata: str | None, gzip_level: int | None = None) -> list[str]:
        return [self.client, "build"]  # no builder, cache export, provenance or exporter flags: cannot() refused them

    def cannot(self, *, builder: str | None, cache_from: Sequence[str], cache_to: str | None,
               gzip_level: int | None = None) -> str | None:
        if gzip_level is not None:
            return (f"--compression-level needs buildx (an exporter option), but the build driver is {self.name} "
                    f"({self.client}): install docker-buildx (tools/start-engine.sh) or leave it out")
        if cache_from or cache_to:  # classic `docker build` has no such flags
            return (f"--cache-from/--cache-to need buildx, but the build driver is {self.name} ({self.client}): "
                    "install docker-buildx (tools/start-engine.sh) or leave them out")
        if builder:
            return f"--builder {builder} needs buildx, but {self.client} has no buildx plugin"
        return None


DRIVERS: dict[str, type[Buildx] | type[Classic]] = {"buildx": Buildx, "classic": Classic}
