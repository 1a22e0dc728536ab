"""The records every stage shares about one image: Target (what to build, from matrix.yaml), its id, and
ImageRef (an image reference parsed once by the distribution reference grammar, never split as a string)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from typing import Any

from gpuforge import grammar
from gpuforge.image import compat
from gpuforge.image.expected import Expected
from gpuforge.plan.schema import AXES, Settings
from gpuforge.plan.version import BuildId


@dataclass(frozen=True)
class ImageRef:
    """REGISTRY/REPOSITORY[:TAG][@DIGEST]. `registry` is "" when the reference names none (docker.io's)."""

    registry: str
    repository: str
    tag: str | None = None
    digest: str | None = None

    @classmethod
    def parse(cls, text: str) -> ImageRef:
        """Parse by the distribution grammar (a first component is the registry only when it has a dot or a
        port, or is localhost); ValueError says what is allowed."""
        grammar.image_reference(text)
        m = grammar.reference_match(text)
        return cls(m.group(1) or "", m.group(2), m.group(3), m.group(4))

    @property
    def name(self) -> str:
        """REGISTRY/REPOSITORY (REPOSITORY alone without a registry): what `docker tag` and a push name."""
        return f"{self.registry}/{self.repository}" if self.registry else self.repository

    def on(self, registry: str | None) -> ImageRef:
        """The same repository and tag on another registry; this one when none is given (no --registry)."""
        return replace(self, registry=grammar.registry(registry)) if registry else self

    def at(self, digest: str) -> ImageRef:
        return replace(self, digest=digest)

    def with_tag(self, tag: str) -> ImageRef:
        """Another tag of the same repository (the matrix keeps room for gpuforge's suffixes: grammar.tag)."""
        return replace(self, tag=tag)

    def canonical(self) -> ImageRef:
        """Docker's defaults made explicit: docker.io when no registry is named, library/ before its one-word
        repositories, tag latest when neither tag nor digest is given."""
        registry = self.registry or "docker.io"
        repository = self.repository if self.registry or "/" in self.repository else f"library/{self.repository}"
        tag = self.tag or (None if self.digest else "latest")
        return replace(self, registry=registry, repository=repository, tag=tag)

    def bare(self) -> ImageRef:
        """REGISTRY/REPOSITORY alone: the repository that tags and digests are asked of."""
        return replace(self, tag=None, digest=None)

    def pinned(self, digest: str) -> ImageRef:
        """REGISTRY/REPOSITORY@DIGEST, without the tag: what is signed and verified (a tag beside a digest is
        ignored by the registry and would only mislead)."""
        return replace(self, tag=None, digest=digest)

    def __str__(self) -> str:
        return self.name + (f":{self.tag}" if self.tag else "") + (f"@{self.digest}" if self.digest else "")


@dataclass(frozen=True, kw_only=True)
class Target:
    """One image to build: its axes, resolved settings and every version it must contain."""

    id: str
    torch: str
    cuda: str
    python: str
    os: str
    flavor: str
    source: str
    base_image: str  # what FROM names; for bootstrapped bases, the local tag gpuforge builds
    bootstrap: dict[str, Any] | None  # {suite, mirror, security_mirror, variant, rootfs} when the base is bootstrapped
    settings: Settings = field(hash=False, compare=False)
    variant: compat.Variant = field(hash=False, compare=False)
    tags: tuple[str, ...]  # full references: registry/repository:tag (the target's tag, shared by its builds)
    version_template: str = field(hash=False, compare=False)  # the version tag with {build} left to fill
    aliases: dict[str, Any] = field(hash=False, compare=False)  # env -> tuple of alias tags (no registry)
    registry: str
    repository: str
    pools: tuple[Any, ...] = field(default=(), hash=False, compare=False)  # gpuforge.plan.fleet.Pool that validate it
    excluded_from: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)  # pool -> the exclude entry

    @property
    def ref(self) -> ImageRef:
        """The target's tag, parsed: registry, repository, tag (shared by its builds; each build's own is version_ref)."""
        return ImageRef.parse(self.tags[0])

    def on(self, registry: str | None) -> Target:
        """This target on `registry` (--registry / GPUFORGE_REGISTRY) instead of matrix.yaml's; itself when none is
        given. The CLI applies it once, when it loads the targets, so every stage reads the target's own ref."""
        if not registry:
            return self
        refs = [ImageRef.parse(tag).on(registry) for tag in self.tags]
        return replace(self, tags=tuple(map(str, refs)), registry=refs[0].registry)

    def version(self, build: BuildId) -> str:
        """The version tag of `build` (matrix.yaml's version_template, e.g. pt271-…-wheels-20261206T203015Z)."""
        return self.version_template.format(build=build)

    def version_ref(self, version: str) -> ImageRef:
        """The build pushed under its version tag, in this target's repository (and its --registry)."""
        return self.ref.with_tag(version)

    @property
    def image_name(self) -> str:
        return self.ref.name

    @property
    def tag(self) -> str:
        return str(self.ref.tag)

    @property
    def index_url(self) -> str:
        """Where torch comes from: cuda-base images use the PyTorch index of their CUDA; wheels images
        use PyPI when PyPI's default wheel is that CUDA variant, the PyTorch index otherwise."""
        if self.settings.index_url:
            return self.settings.index_url
        if self.source == "wheels" and self.variant.on_pypi:
            return self.settings.pypi_url
        return self.variant.index_url

    def axes(self) -> dict[str, str]:
        return {k: getattr(self, k) for k in AXES}

    def expected(self) -> Expected:
        """What the validators expect inside the image (its target.json); the one place tests get versions from."""
        v = self.variant
        return Expected(
            id=self.id, torch=v.torch_local_version, cuda=v.cuda, cudnn=v.cudnn, nccl=v.nccl, triton=v.triton,
            torchvision=v.torchvision, torchaudio=v.torchaudio, python=self.python, flavor=self.flavor,
            source=self.source, os=self.os, user=self.settings.user, uid=self.settings.uid,
            size_budget_gb=self.settings.size_budget_gb, arch_list=tuple(v.arch_list), ptx=tuple(v.ptx),
            toolkit=self.toolkit_wheels or None,
        )

    @property
    def toolkit_wheels(self) -> tuple[str, ...]:
        """What a devel image built from wheels installs on top of torch's stack (ptxas, NVVM, CCCL); () otherwise."""
        return self.variant.toolkit_wheels if self.flavor == "devel" and self.source == "wheels" else ()

    def expected_json(self) -> str:
        """expected() as the target.json that images carry and validators read."""
        return self.expected().to_json()

    def recipe_hash(self, context_files: dict[str, bytes] | None = None) -> str:
        """Hash of everything that decides the image's bytes (the rendered context, when given)."""
        h = hashlib.sha256(json.dumps(self.expected().as_dict(), sort_keys=True).encode())
        h.update(self.base_image.encode())
        given = context_files or {}
        for name in sorted(given):
            h.update(name.encode() + b"\0" + given[name])
        return h.hexdigest()[:16]


def target_id(torch: str, cuda: str, python: str, os_name: str, flavor: str, source: str) -> str:
    """Flat id with one grammar, usable as a tag: pt271-cu126-py311-debian12-runtime-wheels."""
    return "-".join([
        "pt" + torch.replace(".", ""),
        compat.cuda_variant_name(cuda),
        "py" + python.replace(".", ""),
        os_name.replace(".", ""),
        flavor,
        source.replace("-", ""),
    ])
