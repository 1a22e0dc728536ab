"""The image's-users block of the template comes after the torch layer, so changing it never re-downloads
torch, and it holds what the journeys need: the pip constraints with torch pinned, the profile script, the
metrics mode's pins."""

from __future__ import annotations

from gpuforge.plan.matrix import load_matrix
from gpuforge.render import dockerfile as render


def test_users_block_follows_the_torch_layer_and_pins_torch():
    for t in load_matrix().targets:
        text = render.render_target(t)["Dockerfile"].decode()
        torch_at = text.index(f"torch=={t.variant.torch} torchvision==")
        block_at = text.index("# --- The image's users:")
        assert torch_at < block_at, t.id
        block = text[block_at:]
        assert "ENV PIP_CONSTRAINT=/opt/gpuforge/pip-constraints.txt" in block
        assert f"torch=={t.variant.torch} torchvision=={t.variant.torchvision}" in block  # torch in the user's constraints
        assert "COPY images/context/profile.sh /etc/profile.d/gpuforge.sh" in block
        assert all(p in block for p in render.metrics_tools())
