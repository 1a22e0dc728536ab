"""The image's start-up check (run by the entrypoint): can this host's driver and GPUs run this image?

No driver visible: one warning line, exit 0. A /dev/shm under the readiness floor (Docker's 64 MB default): one warning
line saying what it does to DataLoader workers and how to start instead. A driver but no GPU device (NVIDIA_VISIBLE_DEVICES=none/void,
no GPU request, driver libraries not mounted): one warning line naming the cause, exit 0, or exit 70 with
GPUFORGE_REQUIRE_GPU=1. Incompatible driver, unsupported GPU, or a CUDA the compat data does not know:
an error and exit 70, unless GPUFORGE_SKIP_DRIVER_CHECK=1. A probe that breaks never stops the container:
it is reported as a warning. Also usable on a GPU runner: python -m gpuforge.image.preflight.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuforge.image import compat, hostinfo
from gpuforge.image.expected import Expected

EXIT_INCOMPATIBLE = 70
GPU_REQUEST_HINT = "docker run --gpus all (NVIDIA container runtime) or --device nvidia.com/gpu=all (CDI)"


def verdict_for(expected: Expected | dict[str, Any], host: hostinfo.HostGpus) -> compat.Verdict:
    """The driver verdict for this host: forward compatibility counts only on datacenter GPUs with a
    cuda-compat libcuda loaded, and a compat libcuda on any other GPU is an error (804)."""
    expected = Expected.coerce(expected)
    if expected.cuda is None:
        msg = "the target gives no CUDA version"
        raise ValueError(msg)
    if host.driver is None:
        msg = "no NVIDIA driver visible: there is no driver to judge"
        raise ValueError(msg)
    datacenter = all(compat.datacenter_gpu(g.name, g.brand) for g in host.gpus) if host.gpus else None
    return compat.driver_verdict(host.driver, expected.cuda, datacenter=datacenter, compat_package=host.compat_package)


def no_device_reason(host: hostinfo.HostGpus) -> str:
    """Why a visible driver comes with no usable GPU, in the words a user can act on."""
    nvd = (host.visible_devices or "").strip()
    if host.device_nodes:
        return (f"{len(host.device_nodes)} GPU device node(s) ({' '.join(host.device_nodes)}) but neither NVML nor "
                f"nvidia-smi could list them ({host.detail or 'no driver libraries'}): the driver's user-space "
                f"libraries are not in the container; request the GPU through the NVIDIA runtime or a CDI spec")
    if nvd in ("none", "void"):
        return (f"NVIDIA_VISIBLE_DEVICES={nvd}: the container runtime was told to pass no GPU; "
                f"unset it or start with {GPU_REQUEST_HINT}")
    return f"no /dev/nvidiaN device node: the container was started without a GPU request; start with {GPU_REQUEST_HINT}"


def check(expected: Expected | dict[str, Any], host: hostinfo.HostGpus) -> tuple[str, list[str]]:
    """('no-gpu' | 'no-device' | 'unknown' | 'incompatible' | 'ok', messages); the first message is the
    driver verdict (or why there is none).

    The entrypoint and the driver validator both decide through this one function.
    """
    expected = Expected.coerce(expected)
    if host.driver is None:
        return "no-gpu", [f"no NVIDIA driver visible ({host.detail}); CUDA will be unavailable (start with {GPU_REQUEST_HINT})"]
    if not host.gpus:
        return "no-device", [f"NVIDIA driver {host.driver} visible but no GPU: {no_device_reason(host)}"]
    try:
        verdict = verdict_for(expected, host)
    except (ValueError, KeyError) as e:
        return "unknown", [f"cannot judge driver {host.driver} against this image's CUDA {expected.cuda!r}: {e}"]
    msgs = [verdict.message]
    bad = not verdict.ok
    for g in host.gpus:
        if not g.capability:
            msgs.append(f"GPU {g.index} {g.name}: compute capability unknown; arch support not checked")
            continue
        if not compat.arch_supported(g.capability, list(expected.arch_list or ()), list(expected.ptx)):
            bad = True
            better = compat.variants_supporting((expected.torch or "").split("+")[0], g.capability)
            msgs.append(f"GPU {g.index} {g.name} (sm_{g.capability.replace('.', '')}) is not in this image's arch list "
                        f"{' '.join(expected.arch_list or ())}; use {' or '.join(better) or 'a newer torch'}")
    return ("incompatible" if bad else "ok"), msgs


def decide(state: str, msgs: list[str], env: dict[str, Any]) -> tuple[int, list[str]]:
    """(exit code, stderr lines) for a check() outcome under the user's environment switches."""
    if state == "no-gpu":
        return 0, [f"gpuforge: warning: {msgs[0]}"]
    if state == "no-device":
        if env.get("GPUFORGE_REQUIRE_GPU") == "1":
            return EXIT_INCOMPATIBLE, [f"gpuforge: error: {msgs[0]}", "gpuforge: GPUFORGE_REQUIRE_GPU=1 is set"]
        return 0, [f"gpuforge: warning: {msgs[0]}"]
    if state in ("incompatible", "unknown"):
        lines = [f"gpuforge: error: {m}" for m in msgs]
        if env.get("GPUFORGE_SKIP_DRIVER_CHECK") == "1":
            return 0, [*lines, "gpuforge: GPUFORGE_SKIP_DRIVER_CHECK=1 set; starting anyway"]
        return EXIT_INCOMPATIBLE, [*lines, "gpuforge: set GPUFORGE_SKIP_DRIVER_CHECK=1 to start anyway"]
    verbose = env.get("GPUFORGE_PREFLIGHT_VERBOSE") == "1"
    return 0, [f"gpuforge: {m}" for m in msgs] if verbose else [f"gpuforge: warning: {m}" for m in msgs[1:]]


def main(argv: list[str] | None = None, *, detect: Callable[[], hostinfo.HostGpus] = hostinfo.detect,
         env: dict[str, Any] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--target", type=Path, default=Path("/opt/gpuforge/target.json"))
    ap.add_argument("--verbose", action="store_true", help="also print the verdict when all is well")
    args = ap.parse_args(argv)
    env = dict(os.environ if env is None else env)
    if args.verbose:
        env["GPUFORGE_PREFLIGHT_VERBOSE"] = "1"
    try:
        expected = Expected.load(args.target)  # schema-checked: a target.json of another shape is named, not guessed
        state, msgs = check(expected, detect())
    except Exception as e:  # never a traceback, never a dead entrypoint: say what broke and start
        print(f"gpuforge: warning: the driver check itself failed ({type(e).__name__}: {e}); starting without it",
              *shm_lines(), sep="\n", file=sys.stderr)
        return 0
    code, lines = decide(state, msgs, env)
    for line in [*lines, *shm_lines()]:
        print(line, file=sys.stderr)
    return code


def shm_lines(path: str = "/dev/shm") -> list[str]:
    """One warning when /dev/shm is under the readiness floor (Docker's default is 64 MB); nothing when it is not, or
    cannot be read (r1 reports that)."""
    try:
        from gpuforge.image import compat, readiness

        st = os.statvfs(path)
        why = readiness.shm_problem(st.f_frsize * st.f_blocks, int(compat.data()["readiness"]["shm_min_bytes"]))
    except Exception:  # a probe that breaks never stops the container (the module's rule); r1 reports the size
        return []
    return [f"gpuforge: warning: {why}"] if why else []


if __name__ == "__main__":
    sys.exit(main())
