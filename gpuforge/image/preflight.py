"""The image's start-up check (run by the entrypoint): can this host's driver and GPUs run this image?

No GPU: one warning line, exit 0. Incompatible driver or unsupported GPU: an error and exit 70,
unless GPUFORGE_SKIP_DRIVER_CHECK=1. Also usable on a GPU runner: python -m gpuforge.image.preflight.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from gpuforge.image import compat, hostinfo

EXIT_INCOMPATIBLE = 70


def verdict_for(expected: dict, host: hostinfo.HostGpus) -> compat.Verdict:
    """The driver verdict for this host: forward compatibility counts only on datacenter GPUs with a
    cuda-compat libcuda loaded."""
    datacenter = bool(host.gpus) and all(compat.datacenter_gpu(g.name, g.brand) for g in host.gpus)
    return compat.driver_verdict(host.driver, expected["cuda"], datacenter=datacenter, compat_package=host.compat_package)


def check(expected: dict, host: hostinfo.HostGpus) -> tuple[str, list[str]]:
    """('no-gpu' | 'ok' | 'incompatible', messages); the first message is the driver verdict.

    The entrypoint and the driver validator both decide through this one function.
    """
    if host.driver is None:
        return "no-gpu", [f"no NVIDIA driver visible ({host.detail}); CUDA will be unavailable (start with --gpus all)"]
    verdict = verdict_for(expected, host)
    msgs = [verdict.message]
    bad = not verdict.ok
    for g in host.gpus:
        if not compat.arch_supported(g.capability, expected["arch_list"], expected.get("ptx", [])):
            bad = True
            better = compat.variants_supporting(expected["torch"].split("+")[0], g.capability)
            msgs.append(f"GPU {g.index} {g.name} (sm_{g.capability.replace('.', '')}) is not in this image's arch list "
                        f"{' '.join(expected['arch_list'])}; use {' or '.join(better) or 'a newer torch'}")
    return ("incompatible" if bad else "ok"), msgs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--target", type=Path, default=Path("/opt/gpuforge/target.json"))
    ap.add_argument("--verbose", action="store_true", help="also print the verdict when all is well")
    args = ap.parse_args(argv)
    expected = json.loads(args.target.read_text())
    state, msgs = check(expected, hostinfo.detect())
    if state == "no-gpu":
        print(f"gpuforge: warning: {msgs[0]}", file=sys.stderr)
        return 0
    if state == "incompatible":
        for m in msgs:
            print(f"gpuforge: error: {m}", file=sys.stderr)
        if os.environ.get("GPUFORGE_SKIP_DRIVER_CHECK") == "1":
            print("gpuforge: GPUFORGE_SKIP_DRIVER_CHECK=1 set; starting anyway", file=sys.stderr)
            return 0
        print("gpuforge: set GPUFORGE_SKIP_DRIVER_CHECK=1 to start anyway", file=sys.stderr)
        return EXIT_INCOMPATIBLE
    if args.verbose or os.environ.get("GPUFORGE_PREFLIGHT_VERBOSE") == "1":
        for m in msgs:
            print(f"gpuforge: {m}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
