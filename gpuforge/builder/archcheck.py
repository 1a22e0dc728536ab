"""Build-time check of the compat data against the wheel: the GPU architectures torch was compiled for
(`torch._C._cuda_getArchFlags()`, what `torch.cuda.get_arch_list()` returns on a GPU machine, readable
without one) must be exactly the compat data's arch list + PTX for the variant. A mismatch fails the build,
so the validators' arch checks never trust a list that no build confirmed."""

from __future__ import annotations

import json

from gpuforge.engine import containers as run
from gpuforge.errors import EngineError
from gpuforge.image import compat

PROBE = "import json, torch; print(json.dumps((torch._C._cuda_getArchFlags() or '').split()))"


def wheel_arch_flags(image_id: str) -> list[str]:
    """The arch flags of the torch installed in the image (sm_XX cubins, compute_XX PTX)."""
    with run.container(image_id, ["python3", "-c", PROBE], env={"GPUFORGE_SKIP_DRIVER_CHECK": "1"}) as c:
        rc = c.container.wait(timeout=300).get("StatusCode")
        out = c.logs().strip().splitlines()
    try:
        if rc != 0:
            raise ValueError
        flags: list[str] = json.loads(out[-1])  # the probe prints a JSON list of strings
        return flags
    except (IndexError, ValueError):
        msg = f"cannot read torch's arch list in image {image_id[:19]} (exit {rc}): {' '.join(out[-3:])[-300:]}"
        raise EngineError(msg) from None


def mismatch(variant: compat.Variant, flags: list[str]) -> str | None:
    """Why the compat data's list for the variant is not the wheel's, or None when they agree."""
    want = set(variant.arch_list) | set(variant.ptx)
    got = set(flags)
    if want == got:
        return None
    return (f"compat data for torch {variant.torch} {variant.cuda} lists {sorted(want)}, the installed wheel was built for "
            f"{sorted(got)} (missing from the wheel: {sorted(want - got) or 'none'}, not in compat: {sorted(got - want) or 'none'}); "
            "fix gpuforge/image/data/compat.yaml")
