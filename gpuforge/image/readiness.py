"""Readiness levels of a GPU node. r1: is this node fit to run the image, in about a second, before any kernel?
r2 (r1, then about 10 s of measurements per GPU): is each GPU as fast as its model should be?

`collect()` reads the facts where the workload runs (inside the container, or on the host): the GPUs CUDA sees
against the GPUs NVML sees, the driver, each GPU's health from NVML (persistence, ECC mode and uncorrected errors,
row remapping, retired pages, clock-event reasons, power cap, MIG mode), XID errors from the kernel log, and the
container's limits (locked memory, /dev/shm). It never raises: a fact that could not be read holds its error.

`judge()` turns the facts into one finding per check. A check that could not run FAILS with its reason (as DCGM
counts it), and every failure is blamed on the **host** (driver, health, limits) or the **image** (what the image
itself asks for). One exception: the kernel log (XID errors) is often closed to a container by its own settings, not
by the node; a log that could not be read is **not known**, saying what is missing and how to grant it. It passes,
named in the verdict, unless the bars' `unknown_blocks` (the probe's --strict) make an unknown block (exit 12).
Stdlib only, plus pynvml (nvidia-ml-py) when present: every image carries gpuforge/image, and the bars come in as a
dict (`bars()` reads gpuforge/image/data/compat.yaml's `readiness` on the host).

`judge_r2()` holds r2's figures (images/programs/speed.py's, the fused kernel's, NCCL's) to the floors of the GPU's
model: a figure under its floor or unsteady trials blame the host; a figure that could not be measured blames the
image when its error is the image's (an import, a library, a compile), else the host.
"""

from __future__ import annotations

import ctypes
import os
import re
import resource
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from types import ModuleType
from typing import Any, Protocol, TypeVar

HOST, IMAGE, UNKNOWN = "host", "image", "unknown"
# verdict()'s exit codes: ready, the image at fault, the node not fit, not shown fit (an unknown that blocks)
READY_EXIT, IMAGE_EXIT, HOST_EXIT, UNKNOWN_EXIT = 0, 5, 10, 12
CHECKS = ("require_cuda", "gpus_seen", "driver", "persistence", "ecc_mode", "ecc_uncorrected", "row_remap", "retired_pages", "clocks",
          "power_cap", "mig", "xid", "memlock", "shm")
SPEED = ("hbm_copy", "gemm_bf16", "gemm_tf32", "h2d", "d2h")  # speed.py's figures, each with a floor per GPU model
R2_CHECKS = (*SPEED, "fusion", "allreduce")
LEVELS = {"r1": CHECKS, "r2": CHECKS + R2_CHECKS}
# An error of the image's making: its libraries or code do not load, or its compiler stack fails. Anything else (out
# of memory, a CUDA error, an ECC fault) is the node's, and the node's signs win: Inductor wraps whatever a compile
# meets ("BackendCompilerFailed: backend='inductor' raised: ... uncorrectable ECC error").
_HOST_ERROR = re.compile(r"out of memory|ECC|Xid|illegal (memory )?address|unspecified launch failure|"
                         r"TimeoutExpired|timed out|busy or unavailable|GPU is lost|fell off the bus", re.IGNORECASE)
_IMAGE_ERROR = re.compile(r"ImportError|ModuleNotFoundError|undefined symbol|cannot open shared object|CUDA_HOME|ptxas|"
                          r"nvcc|[Tt]riton|[Ii]nductor|[Dd]ynamo|no kernel image is available")

# NVML clock-event ("throttle") reasons that mean the node holds its clocks down; idle, application clocks, the
# software power cap under load and display clocks are normal and left out.
SLOWDOWN = {0x8: "hardware slowdown", 0x20: "software thermal slowdown", 0x40: "hardware thermal slowdown",
            0x80: "hardware power brake"}
_XID = re.compile(r"NVRM: Xid \(([^)]*)\): (\d+)")


@dataclass(frozen=True)
class Finding:
    check: str
    ok: bool
    blame: str  # host | image | unknown ("" when ok)
    figure: str  # what was measured, as the user reads it
    reason: str = ""  # why it failed (empty when ok); for an unknown, what is missing and how to grant it
    unknown: bool = False  # the check could not look: ok unless unknowns block (then blamed on "unknown")


T = TypeVar("T")


class Add(Protocol):
    """How a verdict function records one finding (judge_r1's and judge_r2's `add`)."""

    def __call__(self, check: str, ok: bool, figure: str, reason: str = ..., blame: str = ...) -> None: ...


# --- facts --------------------------------------------------------------------------------------------------------

def _try(fn: Callable[..., T], *a: object) -> T | dict[str, str]:
    try:
        return fn(*a)
    except Exception as e:  # a probe records what went wrong and goes on
        return {"error": f"{type(e).__name__}: {e}"}


def _text(v: object) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _cuda_seen() -> dict[str, Any]:
    """What the CUDA driver API sees (it honours CUDA_VISIBLE_DEVICES; NVML does not)."""
    lib = ctypes.CDLL("libcuda.so.1")
    n = ctypes.c_int(0)
    rc = lib.cuInit(0)
    if rc != 0:
        return {"count": 0, "init_error": rc}  # 100: CUDA_ERROR_NO_DEVICE
    lib.cuDeviceGetCount(ctypes.byref(n))
    return {"count": n.value}


def _gpu(nv: ModuleType, i: int) -> dict[str, Any]:  # nv: the pynvml module (no stubs)
    h = nv.nvmlDeviceGetHandleByIndex(i)
    g = {"index": i, "name": _text(nv.nvmlDeviceGetName(h)), "uuid": _text(nv.nvmlDeviceGetUUID(h))}
    g["persistence"] = _try(nv.nvmlDeviceGetPersistenceMode, h)
    g["ecc_mode"] = _try(lambda: list(nv.nvmlDeviceGetEccMode(h)))  # [current, pending]
    g["ecc_uncorrected"] = _try(lambda: {
        "volatile": nv.nvmlDeviceGetTotalEccErrors(h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC),
        "aggregate": nv.nvmlDeviceGetTotalEccErrors(h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_AGGREGATE_ECC)})
    g["row_remap"] = _try(lambda: dict(zip(("correctable", "uncorrectable", "pending", "failure"),
                                           nv.nvmlDeviceGetRemappedRows(h), strict=True)))
    g["retired_pending"] = _try(nv.nvmlDeviceGetRetiredPagesPendingStatus, h)
    g["clock_events"] = _try(nv.nvmlDeviceGetCurrentClocksThrottleReasons, h)
    g["power_w"] = _try(lambda: {"limit": nv.nvmlDeviceGetPowerManagementLimit(h) / 1000,
                                 "default": nv.nvmlDeviceGetPowerManagementDefaultLimit(h) / 1000})
    g["mig_mode"] = _try(lambda: list(nv.nvmlDeviceGetMigMode(h)))  # [current, pending]
    return g


def _nvml() -> dict[str, Any]:
    import pynvml as nv  # nvidia-ml-py

    nv.nvmlInit()
    try:
        out: dict[str, Any] = {"driver": _text(nv.nvmlSystemGetDriverVersion())}
        out["gpus"] = [_gpu(nv, i) for i in range(nv.nvmlDeviceGetCount())]
        return out
    finally:
        nv.nvmlShutdown()


def _kernel_log() -> str:
    """The kernel's log since boot: /dev/kmsg (records as they are), read without blocking."""
    fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    chunks = []
    try:
        while True:
            try:
                chunks.append(os.read(fd, 8192).decode(errors="replace"))
            except BlockingIOError:
                break
            except BrokenPipeError:  # a record overwritten while read: go on with the next
                continue
    finally:
        os.close(fd)
    return "".join(chunks)


def xid_events(log: str) -> list[dict[str, Any]]:
    return [{"pci": m.group(1).split(",")[0], "xid": int(m.group(2))} for m in _XID.finditer(log)]


def xid() -> dict[str, Any]:
    """XID errors since boot from this machine's kernel log, or {"error": ...} where it cannot be read."""
    return _try(lambda: {"source": "/dev/kmsg", "events": xid_events(_kernel_log())})


def _limit(res: int) -> int:
    soft = resource.getrlimit(res)[0]
    return -1 if soft == resource.RLIM_INFINITY else soft


def collect(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The r1 facts of the place this runs in; each fact holds {"error": ...} when it could not be read."""
    env = os.environ if env is None else env
    facts: dict[str, Any] = {"level": "r1", "visible": {k: env.get(k) for k in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")},
             "require_cuda": env.get("NVIDIA_REQUIRE_CUDA", "")}
    facts["nvml"] = _try(_nvml)
    facts["cuda"] = _try(_cuda_seen)
    facts["xid"] = xid()
    facts["memlock"] = _try(_limit, resource.RLIMIT_MEMLOCK)
    facts["shm"] = _try(lambda: os.statvfs("/dev/shm").f_frsize * os.statvfs("/dev/shm").f_blocks)
    return facts


# --- verdicts -----------------------------------------------------------------------------------------------------

def _err(v: object) -> str | None:
    error: str | None = v["error"] if isinstance(v, dict) and "error" in v else None  # a probe's {"error": text}
    return error


def _ver(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text)[:3])


def _gib(n: int) -> str:
    return ("unlimited" if n < 0 else f"{n / (1 << 30):.2f} GiB" if n >= 1 << 28 else f"{n >> 20} MiB" if n >= 1 << 20
            else f"{n >> 10} KiB")


def _per_gpu(gpus: list[dict[str, Any]], key: str, bad: Callable[[Any], object], say: Callable[[Any], str],
             unsupported: str = "") -> tuple[bool, str, str]:
    """(ok, figure, reason) of one NVML fact over every GPU: `bad(value)` says it fails, `say(value)` shows it;
    `unsupported`, when given, is what a GPU whose NVML answers "not supported" shows (it passes)."""
    figs, reasons = [], []
    for g in gpus:
        v = g.get(key)
        if unsupported and "NotSupported" in (_err(v) or ""):
            figs.append(f"GPU {g['index']}: {unsupported}")
            continue
        if _err(v):
            figs.append(f"GPU {g['index']}: unreadable")
            reasons.append(f"GPU {g['index']}: could not read it ({_err(v)})")
            continue
        figs.append(f"GPU {g['index']}: {say(v)}")
        why = bad(v)
        if why:
            reasons.append(f"GPU {g['index']}: {why}")
    return not reasons, "; ".join(figs), "; ".join(reasons)


def judge(facts: dict[str, Any], *, request: int | None, image_cuda: str, bars: dict[str, Any]) -> list[Finding]:
    """One finding per check of CHECKS. `request`: the GPUs asked for (None: all the node has); `image_cuda`: the
    CUDA the image carries (its label); `bars`: compat data's `readiness` (bars())."""
    out: list[Finding] = []
    blocks = bool(bars.get("unknown_blocks"))

    def add(check: str, ok: bool, figure: str, reason: str = "", blame: str = HOST) -> None:
        if blame == UNKNOWN and not ok:  # could not look: passes, named, unless unknowns block
            out.append(Finding(check, not blocks, UNKNOWN if blocks else "", figure, reason, unknown=True))
            return
        out.append(Finding(check, ok, "" if ok else blame, figure, "" if ok else reason))

    _require(add, facts, image_cuda)
    nvml = facts.get("nvml") or {"error": "no NVML facts"}
    if _err(nvml):  # without NVML no GPU health check can run: each fails, saying so
        for check in CHECKS:
            if check not in ("require_cuda", "memlock", "shm", "xid"):
                add(check, False, "NVML unreadable", f"NVML could not be read ({_err(nvml)})")
        gpus = []
    else:
        gpus = nvml["gpus"]
        _gpus_seen(add, facts, gpus, request)
        _driver(add, facts, nvml["driver"], image_cuda)
        ok, fig, why = _per_gpu(gpus, "persistence", lambda v: "" if v == 1 else "persistence mode is off: each "
                                "container start pays the driver's initialisation (nvidia-persistenced)",
                                lambda v: "on" if v == 1 else "off")
        add("persistence", ok, fig, why)
        ok, fig, why = _per_gpu(gpus, "ecc_mode", lambda v: "" if v == [1, 1] else (
            "ECC is off" if v[0] != 1 else "an ECC change waits for a GPU reset"), lambda v: f"current {v[0]}, pending {v[1]}")
        add("ecc_mode", ok, fig, why)
        ok, fig, why = _per_gpu(gpus, "ecc_uncorrected", lambda v: "" if v["volatile"] == 0 else (
            f"{v['volatile']} uncorrected ECC error(s) since the last reset: drain the node and reset the GPU"),
            lambda v: f"volatile {v['volatile']}, aggregate {v['aggregate']}")
        add("ecc_uncorrected", ok, fig, why)
        ok, fig, why = _per_gpu(gpus, "row_remap", lambda v: (
            "a row remapping failed: the GPU needs service" if v["failure"] else
            "a row remapping waits for a GPU reset" if v["pending"] else ""),
            lambda v: f"{v['correctable']}+{v['uncorrectable']} rows remapped, pending {bool(v['pending'])}, "
                      f"failure {bool(v['failure'])}")
        add("row_remap", ok, fig, why)
        # page retirement is pre-Ampere's remedy (row remapping replaced it): NVML says "not supported" there
        ok, fig, why = _per_gpu(gpus, "retired_pending", lambda v: "retired pages wait for a reboot" if v else "",
                                lambda v: f"pending {bool(v)}", unsupported="not used (row remapping instead)")
        add("retired_pages", ok, fig, why)
        ok, fig, why = _per_gpu(gpus, "clock_events", lambda v: "" if not v & sum(SLOWDOWN) else (
            "clocks held down: " + ", ".join(n for b, n in SLOWDOWN.items() if v & b)), lambda v: f"reasons {v:#x}")
        add("clocks", ok, fig, why)
        least = bars["power_cap_min_fraction"]
        ok, fig, why = _per_gpu(gpus, "power_w", lambda v: "" if v["limit"] >= least * v["default"] else (
            f"power capped at {v['limit']:.0f} W, under {least:.0%} of the model's default {v['default']:.0f} W"),
            lambda v: f"{v['limit']:.0f} W of {v['default']:.0f} W")
        add("power_cap", ok, fig, why)
        _mig(add, gpus)
    _xid(add, facts.get("xid"), bars)
    _limits(add, facts, bars)
    return out


def _gpus_seen(add: Add, facts: dict[str, Any], gpus: list[dict[str, Any]], request: int | None) -> None:
    cuda = facts.get("cuda") or {"error": "not read"}
    want = len(gpus) if request is None else request
    vis = ", ".join(f"{k}={v!r}" for k, v in facts.get("visible", {}).items() if v is not None) or "no *_VISIBLE_DEVICES"
    if _err(cuda):
        add("gpus_seen", False, f"NVML {len(gpus)}, CUDA unreadable", f"the CUDA driver could not be asked ({_err(cuda)})")
        return
    seen = cuda["count"]
    fig = f"asked {'all' if request is None else request}, NVML {len(gpus)}, CUDA {seen} ({vis})"
    if seen == want and len(gpus) >= want > 0:
        add("gpus_seen", True, fig)
        return
    init = f", cuInit error {cuda['init_error']}" if "init_error" in cuda else ""
    asked = f"asked for {want} GPU(s)" if want else "no GPU is seen"
    add("gpus_seen", False, fig, f"{asked}, CUDA sees {seen}{init} ({vis})")


def _require(add: Add, facts: dict[str, Any], image_cuda: str) -> None:
    """The image's own claim: NVIDIA_REQUIRE_CUDA above the CUDA it carries makes the runtime refuse drivers that
    would run it (or, through CDI, says nothing). The image's fault, judged without a GPU."""
    text = facts.get("require_cuda", "")
    need = re.search(r"cuda>=(\d+\.\d+)", text)
    fig = f"NVIDIA_REQUIRE_CUDA={text!r}, the image carries CUDA {image_cuda}"
    if need and _ver(need.group(1)) > _ver(image_cuda):
        add("require_cuda", False, fig, f"the image's NVIDIA_REQUIRE_CUDA asks for cuda>={need.group(1)}, above the "
            f"CUDA {image_cuda} it carries: the container runtime refuses drivers that would run it", blame=IMAGE)
    else:
        add("require_cuda", True, fig)


def _driver(add: Add, facts: dict[str, Any], driver: str, image_cuda: str) -> None:
    from gpuforge.image import compat  # PyYAML: present on the host and in every image

    try:
        v = compat.driver_verdict(driver, image_cuda, datacenter=None)
    except ValueError as e:  # no CUDA given, or one the compat data does not know: the check could not run
        add("driver", False, f"driver {driver}, CUDA {image_cuda or '?'}", f"the image's CUDA cannot be judged ({e})",
            blame=IMAGE)
        return
    add("driver", v.ok, f"driver {driver}, CUDA {image_cuda}: {v.kind}", v.message)


def _mig(add: Add, gpus: list[dict[str, Any]]) -> None:
    ok, fig, why = _per_gpu(gpus, "mig_mode", lambda v: (
        "MIG is on: the whole GPU asked for is split into instances" if v[0] == 1 else
        "a MIG change waits for a GPU reset" if v[1] != v[0] else ""), lambda v: f"current {v[0]}, pending {v[1]}")
    if not ok and all("NotSupported" in (_err(g.get("mig_mode")) or "") for g in gpus):
        ok, fig, why = True, "no MIG on this model", ""
    add("mig", ok, fig, why)


KMSG_GRANT = ("give the container the node's log: docker run --device /dev/kmsg --cap-add SYSLOG --user 0 (root with "
              "CAP_SYSLOG reads it; on the host, root, or sysctl kernel.dmesg_restrict=0 for any user)")


def kmsg_missing(error: str) -> str:
    """What kept the kernel log closed, from the error its read raised, in the words of whoever must grant it."""
    if "FileNotFoundError" in error or "No such file" in error:
        return "/dev/kmsg is not in this container"
    if "PermissionError" in error or "not permitted" in error or "Permission denied" in error:
        return "reading /dev/kmsg takes CAP_SYSLOG (as root) or the host's kernel.dmesg_restrict=0"
    return "the kernel log could not be read"


def _xid(add: Add, xid: Any, bars: dict[str, Any]) -> None:  # xid: the xid fact (JSON)
    if _err(xid) or xid is None:
        error = _err(xid) or "not read"
        # Closed by the container's or the runner's settings, not a sign of the node's health: not known, and
        # blocking only where the bars say an unknown must (--strict)
        add("xid", False, "kernel log unreadable: XID errors not known",
            f"XID errors are not known: {kmsg_missing(error)} ({error}); {KMSG_GRANT}", blame=UNKNOWN)
        return
    bad = [e for e in xid["events"] if e["xid"] not in bars["xid_benign"]]
    add("xid", not bad, f"{len(xid['events'])} XID event(s) since boot ({xid['source']})",
        "XID errors since boot: " + ", ".join(f"{e['xid']} on {e['pci']}" for e in bad[:8]))


def _limits(add: Add, facts: dict[str, Any], bars: dict[str, Any]) -> None:
    mem, shm = facts.get("memlock"), facts.get("shm")
    floor = bars["memlock_min_bytes"]
    if _err(mem) or mem is None:
        add("memlock", False, "unreadable", f"could not read RLIMIT_MEMLOCK ({_err(mem)})")
    else:
        add("memlock", mem < 0 or mem >= floor, _gib(mem),
            f"locked memory limited to {_gib(mem)}, under {_gib(floor)}: pinned host memory and NCCL fail or fall back "
            "(docker run --ulimit memlock=-1)")
    if _err(shm) or shm is None:
        add("shm", False, "unreadable", f"could not read /dev/shm's size ({_err(shm)})")
    else:
        why = shm_problem(shm, bars["shm_min_bytes"])
        add("shm", why is None, _gib(shm), why or "")


def shm_problem(size: int, floor: int) -> str | None:
    """What a /dev/shm under the floor does to its user, in one line (r1 and the entrypoint's start say the same)."""
    if size >= floor:
        return None
    return (f"/dev/shm is {_gib(size)}, under {_gib(floor)}: PyTorch DataLoader workers (num_workers > 0) pass "
            "batches through it and die with a bus error when it fills (docker run --shm-size 8g or --ipc=host)")


def judge_level(facts: dict[str, Any], level: str, *, request: int | None, image_cuda: str, bars: dict[str, Any]) -> list[Finding]:
    """The findings of a level: r1's from the facts, and at r2 judge_r2's from the figures under facts["speed"]."""
    found = judge(facts, request=request, image_cuda=image_cuda, bars=bars)
    if level == "r2":
        found += judge_r2(facts.get("speed") or {"error": "the program measured nothing"}, bars=bars)
    return found


def _blame(error: str) -> str:
    return IMAGE if _IMAGE_ERROR.search(error) and not _HOST_ERROR.search(error) else HOST


def judge_r2(speed: dict[str, Any], *, bars: dict[str, Any]) -> list[Finding]:
    """One finding per check of R2_CHECKS from r2's figures: {"gpus": [speed.measure() per GPU], "fusion": the smoke
    program's fusion figures, "allreduce": multi_gpu.py's (more than one GPU)} or {"error": why none was measured}."""
    out: list[Finding] = []

    def add(check: str, ok: bool, figure: str, reason: str = "", blame: str = HOST) -> None:
        out.append(Finding(check, ok, "" if ok else blame, figure, "" if ok else reason))

    if error := _err(speed):
        for check in R2_CHECKS:
            add(check, False, "not measured", f"r2 could not measure ({error})", blame=_blame(error))
        return out
    r2 = bars["r2"]
    for check in SPEED:
        _guarded(check, _speed, add, check, speed.get("gpus") or [], r2)
    _guarded("fusion", _fusion, add, speed.get("fusion") or {"error": "not measured"}, bars["fusion_min_ratio"])
    _guarded("allreduce", _allreduce, add, speed.get("allreduce"), len(speed.get("gpus") or []), bars["busbw_floor_gbs"])
    return out


def _guarded(check: str, judge: Callable[..., None], add: Add, *args: Any) -> None:
    """judge(add, ...) of one r2 check, or a failure naming the figures the image's program left out or mangled."""
    try:
        judge(add, *args)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        add(check, False, "malformed", f"the program's {check} figures are malformed ({type(e).__name__}: {e})",
            blame=IMAGE)


def cv_limit(check: str, r2: dict[str, Any]) -> float:
    """The spread of trials a healthy node stays under: the products run at the power limit, so their clocks settle
    over the trials (wider); copies do not. Bars written before `cv_max_gemm` hold every figure to `cv_max`."""
    limit = r2.get("cv_max_gemm", r2["cv_max"]) if check.startswith("gemm_") else r2["cv_max"]
    return float(limit)


def _speed(add: Add, check: str, gpus: list[dict[str, Any]], r2: dict[str, Any]) -> None:
    """One speed figure over every GPU against its model's floor."""
    from gpuforge.image.compat import model_key  # PyYAML: present on the host and in every image

    figs, reasons, blames = [], [], set()
    if not gpus:
        add(check, False, "no GPU measured", "no GPU was measured")
        return
    for g in gpus:
        v, who = g.get(check) or {"error": "not measured"}, f"GPU {g['index']}"
        if error := _err(v):
            figs.append(f"{who}: not measured")
            reasons.append(f"{who}: could not measure it ({error})")
            blames.add(_blame(error))
            continue
        model = model_key(g["name"], r2["floors"])
        row = r2["floors"][model] if model else {}
        floor = row.get(check)
        fig = f"{who}: {v['best']:g} {v['unit']} best of {len(v['trials'])} (CV {v['cv']:.1%})"
        figs.append(fig + (f", floor {floor:g}" if floor is not None else ", not judged" if check in row else ""))
        n = len(reasons)
        unconfirmed = " (a floor from the datasheet, not yet measured on this model)" if row.get("unconfirmed") else ""
        if check in row and floor is None:  # the model has no such unit: measured and shown, not judged
            pass
        elif floor is None:
            reasons.append(f"{who}: no r2 floor for {check} of a {g['name']!r} in the compat data (readiness.r2.floors): "
                           "this GPU model cannot be shown fit")
        elif v["best"] < floor:
            reasons.append(f"{who}: {v['best']:g} {v['unit']} is under the {model}'s floor of {floor:g} {v['unit']}"
                           f"{unconfirmed} (clocks or power held down, a degraded GPU, or another job on it)")
        elif v["cv"] > (cv_max := cv_limit(check, r2)):
            reasons.append(f"{who}: its trials vary by {v['cv']:.1%} (CV), over {cv_max:.0%}: "
                           "something else runs on this GPU, or its clocks wander")
        if len(reasons) > n:
            blames.add(HOST)  # a figure measured and found short, or a model without floors: the node's
    # the image only when every GPU's failure is an error of the image's making
    add(check, not reasons, "; ".join(figs), "; ".join(reasons), blame=IMAGE if blames == {IMAGE} else HOST)


def _fusion(add: Add, f: dict[str, Any], least: float) -> None:
    """The fused kernel's bandwidth against a copy on the same GPU: a ratio, so the node's speed cancels out and a
    low one is the image's compiler stack (Inductor, Triton) at fault."""
    if error := _err(f):
        add("fusion", False, "not measured", f"the fused kernel could not be built or run ({error})",
            blame=_blame(error))
        return
    fig = (f"compiled {f['compiled_kernels']} kernel(s), {f['compiled_gbs']:g} GB/s, {f['ratio_to_copy']:.0%} of a "
           f"copy's {f['copy_gbs']:g} GB/s (floor {least:.0%})")
    why = ("the compiled function launched "
           f"{f['compiled_kernels']} kernels, not 1: no fusion" if f["compiled_kernels"] != 1 else
           "compiled and eager results differ" if not f["equal"] else
           f"the fused kernel reaches {f['ratio_to_copy']:.0%} of a copy's bandwidth, under {least:.0%}"
           if f["ratio_to_copy"] < least else "")
    add("fusion", not why, fig, why, blame=IMAGE)


def _allreduce(add: Add, ar: dict[str, Any] | None, n_gpus: int, floors: dict[str, Any]) -> None:
    from gpuforge.image.compat import model_key

    if n_gpus < 2 and ar is None:
        add("allreduce", True, f"{n_gpus} GPU: no collective to measure")
        return
    if ar is None or _err(ar) or not ar.get("allreduce"):
        why = _err(ar) if ar else "not measured"
        add("allreduce", False, "not measured", f"NCCL all-reduce could not run ({why})", blame=_blame(why or ""))
        return
    big = max(ar["allreduce"], key=lambda r: r["bytes"])
    name = (ar.get("names") or [""])[0]
    model = model_key(name, floors)
    cv = f"CV {big['busbw_cv']:.1%}" if big.get("busbw_cv") is not None else "CV unknown"
    fig = f"{big['busbw_gbs']:g} GB/s bus bandwidth at {big['bytes'] >> 20} MiB over {ar.get('world_size')} GPUs " \
          f"({cv})" + (f", floor {floors[model]:g}" if model is not None else "")
    whose = f"the {model}'s" if model else "the given"  # "": the runner's own floor (--gpuforge-min-busbw)
    why = ("an all-reduce gave a wrong sum" if not all(r["exact"] for r in ar["allreduce"]) else
           f"no bus-bandwidth floor for a {name!r} in the compat data" if model is None else
           f"{big['busbw_gbs']:g} GB/s is under {whose} floor of {floors[model]:g} GB/s (NVLink down, or traffic "
           "through host memory)" if big["busbw_gbs"] < floors[model] else "")
    add("allreduce", not why, fig, why)


def bars() -> dict[str, Any]:
    """The readiness bars from the compat data (the host's copy: an image never sets its own bar): `readiness`, with
    the fused kernel's ratio and the all-reduce floors from where the smoke suite keeps them."""
    from gpuforge.image import compat

    d = compat.data()
    return {**d["readiness"], "fusion_min_ratio": d["smoke_thresholds"]["fusion_min_ratio"],
            "busbw_floor_gbs": {m: float(r["floor"]) for m, r in d["busbw_floor_gbs"].items()}}


def verdict(findings: list[Finding], level: str = "r1") -> tuple[str, int]:
    """(one line, exit code): 0 fit; 5 the image is at fault; 10 the node is not fit (the host first: an unfit node
    says nothing about the image); 12 not shown fit: a check could not look and unknowns block (--strict). A check
    that could not look is named in every line, with what it lacks."""
    bad = [f for f in findings if not f.ok]
    host = [f for f in bad if f.blame == HOST]
    image = [f for f in bad if f.blame not in (HOST, UNKNOWN)]
    unknown = [f for f in findings if f.unknown]
    also = "; not known: " + _said(unknown) if unknown else ""
    if host:
        return "NODE NOT FIT (host): " + _said(host) + also, HOST_EXIT
    if image:
        return "IMAGE AT FAULT: " + _said(image) + also, IMAGE_EXIT
    if bad:
        return "NOT SHOWN FIT (unknown; unknowns block here): " + _said(bad), UNKNOWN_EXIT
    passed = len(findings) - len(unknown)
    if unknown:
        return f"READY {level}: {passed} checks passed, {len(unknown)} not known: {_said(unknown)}", READY_EXIT
    return f"READY {level}: {passed} checks passed", READY_EXIT


def _said(bad: list[Finding]) -> str:
    """Each reason once, after the checks it failed (without NVML, ten checks fail for one reason)."""
    by: dict[str, list[str]] = {}
    for f in bad:
        by.setdefault(f.reason, []).append(f.check)
    return "; ".join(f"{', '.join(checks)}: {reason}" for reason, checks in by.items())


def report(facts: dict[str, Any], findings: list[Finding], level: str = "r1") -> dict[str, Any]:
    line, code = verdict(findings, level)
    return {"level": level, "verdict": line, "exit": code, "findings": [asdict(f) for f in findings], "facts": facts}
