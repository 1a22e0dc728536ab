"""What an image installed (`pip freeze` in a container of it) against what its target pins: test_engine_matrix.py asks
it of its cold build on Docker 26.1.5 (the run's second full build) and of its classic devel build."""

from __future__ import annotations

from gpuforge.render import dockerfile as render
from gpuforge.render import locks


def freeze(client, image: str) -> str:
    """`pip freeze` of the image's venv, run on the engine `client` talks to."""
    return client.containers.run(image, ["/opt/venv/bin/pip", "freeze"], remove=True, stderr=False,
                                 entrypoint="").decode()


def pinned(t) -> dict[str, str]:
    """name -> version of what a target's image may install: its constraints, the torch stack's four pins and the
    devel toolkit's wheels."""
    return {**locks.pins(render.constraints(t)), "torch": t.variant.torch, "torchvision": t.variant.torchvision,
            "torchaudio": t.variant.torchaudio, "triton": t.variant.triton,
            **locks.pins("\n".join(t.toolkit_wheels))}


def unpinned(frozen: str, t) -> dict[str, str]:
    """What `frozen` holds at a version the target does not pin ({} when everything is pinned)."""
    allowed = pinned(t)
    return {n: v for n, v in locks.pins(frozen).items() if allowed.get(n) != v}
