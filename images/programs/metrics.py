"""GPU metrics in Prometheus text format, read through NVML, named as dcgm-exporter names them.

    metrics.py [--port 9400] [--addr 0.0.0.0] [--names classic|4.9]   serve /metrics (the image's `metrics` mode)
    metrics.py --once [--repeat 20]                                     print one exposition, then the scrape timing

No DCGM host engine, no privileges: NVML's per-device queries only. A custom collector builds
prometheus_client families, and `exposition()` writes them as text format 0.0.4 with the names given:
prometheus_client's own writer would rename a counter's HELP/TYPE to `..._total`, which dcgm-exporter does not.
Label sets (dcgm-exporter's rendermetrics template):
  classic  gpu, UUID, pci_bus_id, device, modelName, Hostname   (dcgm-exporter up to 4.8.x)
  4.9      the same with `hostname` in lower case                (NVIDIA/dcgm-exporter#655, on main after 4.5.3-4.8.2)
Without a GPU or driver it still serves gpuforge_metrics_up 0 and gpuforge_gpus 0 and never crashes;
NVML is retried at most every RETRY_S seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client.core import Metric
from prometheus_client.utils import floatToGoString

RETRY_S = 30.0
NAME_SETS = ("classic", "4.9")

# dcgm-exporter's field name, type and help (etc/default-counters.csv), and how NVML gives the value.
FIELDS = [
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).", "sm_clock"),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz).", "mem_clock"),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", "temp"),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", "power"),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "Total energy consumption since boot (in mJ).", "energy"),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", "gpu_util"),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %).", "mem_util"),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.", "xid"),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).", "fb_free"),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", "fb_used"),
    ("DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (in MiB).", "fb_reserved"),
]


def _text(v) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


def image_info() -> dict[str, str]:
    """The image's id and versions, from the target.json the image was built from (labels of the info metric)."""
    out = {"target": os.environ.get("GPUFORGE_TARGET", "")}
    for path in (os.environ.get("GPUFORGE_TARGET_JSON", ""), "/opt/gpuforge/target.json"):
        if path and os.path.isfile(path):
            try:
                with open(path) as f:
                    t = json.load(f)
            except (OSError, ValueError):
                break
            out.update({k: str(t[k]) for k in ("id", "torch", "cuda", "cudnn", "nccl", "python", "os", "flavor") if k in t})
            out["target"] = out.get("id", out["target"])
            out.pop("id", None)
            break
    return out


class Nvml:
    """NVML, opened lazily and reopened after a failure; every call that is not supported is left out."""

    def __init__(self):
        self.nv = None
        self.error = ""
        self.driver = ""
        self.handles: list = []
        self.events = None
        self.last_xid: dict[int, int] = {}
        self._tried = 0.0
        self._lock = threading.Lock()

    def ready(self) -> bool:
        if self.nv is not None:
            return True
        if time.monotonic() - self._tried < RETRY_S and self._tried:
            return False
        self._tried = time.monotonic()
        try:
            import pynvml as nv  # nvidia-ml-py

            nv.nvmlInit()
            self.driver = _text(nv.nvmlSystemGetDriverVersion())
            self.handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]
            self.nv, self.error = nv, ""
            self._watch_xids()
            return True
        except Exception as e:  # no driver, no libnvidia-ml, no device: served as up 0, never a crash
            self.nv, self.handles, self.error = None, [], f"{type(e).__name__}: {e}"
            return False

    def _watch_xids(self) -> None:
        nv = self.nv
        try:
            self.events = nv.nvmlEventSetCreate()
            for h in self.handles:
                nv.nvmlDeviceRegisterEvents(h, nv.nvmlEventTypeXidCriticalError, self.events)
        except Exception:
            self.events = None  # unsupported (some vGPU/MIG setups): XID errors are then left out

    def _drain_xids(self) -> None:
        if self.events is None:
            return
        nv = self.nv
        for _ in range(64):
            try:
                ev = self.nv.nvmlEventSetWait_v2(self.events, 0)
            except nv.NVMLError:
                return  # timeout: no more events
            uuid = _text(nv.nvmlDeviceGetUUID(ev.device))
            idx = next((i for i, h in enumerate(self.handles) if _text(nv.nvmlDeviceGetUUID(h)) == uuid), None)
            if idx is not None:
                self.last_xid[idx] = int(ev.eventData)

    def read(self) -> list[tuple[dict[str, str], dict[str, float]]]:
        """[(identity, values)] per GPU; raises when NVML itself went away (the caller reopens it)."""
        nv = self.nv
        with self._lock:
            self._drain_xids()
        out = []
        for i, h in enumerate(self.handles):
            ident = {"gpu": str(i), "UUID": _text(nv.nvmlDeviceGetUUID(h)), "modelName": _text(nv.nvmlDeviceGetName(h))}
            ident["pci_bus_id"] = _try(lambda h=h: _text(nv.nvmlDeviceGetPciInfo(h).busId), "")
            ident["device"] = "nvidia" + str(_try(lambda h=h: nv.nvmlDeviceGetMinorNumber(h), i))
            vals: dict[str, float] = {}
            util = _try(lambda h=h: nv.nvmlDeviceGetUtilizationRates(h))
            if util is not None:
                vals["gpu_util"], vals["mem_util"] = util.gpu, util.memory
            vals.update(memory(nv, h))
            for key, fn in (("sm_clock", lambda h=h: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
                            ("mem_clock", lambda h=h: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM)),
                            ("temp", lambda h=h: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
                            ("power", lambda h=h: nv.nvmlDeviceGetPowerUsage(h) / 1000.0),
                            ("energy", lambda h=h: nv.nvmlDeviceGetTotalEnergyConsumption(h))):
                v = _try(fn)
                if v is not None:
                    vals[key] = v
            if self.events is not None:
                vals["xid"] = self.last_xid.get(i, 0)
            out.append((ident, vals))
        return out

    def reset(self) -> None:
        self.nv, self.handles, self.events, self._tried = None, [], None, time.monotonic()


def memory(nv, h) -> dict[str, int]:
    """Framebuffer MiB as DCGM reports them: used without the driver's reserved memory, which is a series of its
    own (DCGM_FI_DEV_FB_RESERVED). NVML's v1 call counts the reserved memory as used (615 MiB more than
    nvidia-smi on an H200); its v2 call gives the three apart. Drivers without v2: v1's figures, no reserved."""
    mem = _try(lambda: nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2))
    if mem is not None:
        return {"fb_free": mem.free // 2**20, "fb_used": mem.used // 2**20, "fb_reserved": mem.reserved // 2**20}
    mem = _try(lambda: nv.nvmlDeviceGetMemoryInfo(h))
    return {} if mem is None else {"fb_free": mem.free // 2**20, "fb_used": mem.used // 2**20}


def _try(fn, default=None):
    try:
        return fn()
    except Exception:  # NVML_ERROR_NOT_SUPPORTED and friends: the field is left out for this GPU
        return default


class GpuCollector:
    """The custom collector: every family written by hand with dcgm-exporter's exact names and labels."""

    def __init__(self, names: str = "classic", hostname: str | None = None):
        if names not in NAME_SETS:
            msg = f"--names {names!r}: allowed {', '.join(NAME_SETS)}"
            raise SystemExit(msg)
        self.host_label = "Hostname" if names == "classic" else "hostname"
        self.hostname = hostname or socket.gethostname()
        self.nvml = Nvml()
        self.info = image_info()

    def collect(self):
        gpus: list = []
        if self.nvml.ready():
            try:
                gpus = self.nvml.read()
            except Exception as e:
                self.nvml.error = f"{type(e).__name__}: {e}"
                self.nvml.reset()
        up = Metric("gpuforge_metrics_up", "1 when NVML answers (a driver and its library are visible), else 0.", "gauge")
        up.add_sample("gpuforge_metrics_up", {"error": self.nvml.error[:200]}, 1.0 if self.nvml.nv else 0.0)
        yield up
        count = Metric("gpuforge_gpus", "GPUs NVML sees in this container.", "gauge")
        count.add_sample("gpuforge_gpus", {}, float(len(gpus)))
        yield count
        info = Metric("gpuforge_image", "The image's target id and versions.", "info")
        info.add_sample("gpuforge_image_info", {**self.info, "driver": self.nvml.driver}, 1.0)
        yield info
        for name, typ, help_, key in FIELDS:
            fam = Metric(name, help_, typ)
            for ident, vals in gpus:
                if key in vals:
                    labels = {"gpu": ident["gpu"], "UUID": ident["UUID"], "pci_bus_id": ident["pci_bus_id"],
                              "device": ident["device"], "modelName": ident["modelName"], self.host_label: self.hostname}
                    fam.add_sample(name, labels, float(vals[key]))
            if fam.samples:
                yield fam


def _esc(text: str, quote: bool) -> str:
    text = text.replace("\\", "\\\\").replace("\n", "\\n")
    return text.replace('"', '\\"') if quote else text


def exposition(collector: GpuCollector) -> bytes:
    """Text format 0.0.4, family and sample names exactly as collected (an info family is a gauge `<name>_info`)."""
    lines = []
    for fam in collector.collect():
        typ = fam.type if fam.type in ("gauge", "counter") else "gauge"
        name = fam.name + "_info" if fam.type == "info" else fam.name
        lines += [f"# HELP {name} {_esc(fam.documentation, False)}", f"# TYPE {name} {typ}"]
        for s in fam.samples:
            labels = ",".join(f'{k}="{_esc(str(v), True)}"' for k, v in s.labels.items())
            lines.append(f"{s.name}{{{labels}}} {floatToGoString(s.value)}" if labels else f"{s.name} {floatToGoString(s.value)}")
    return ("\n".join(lines) + "\n").encode()


CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def serve(collector: GpuCollector, addr: str, port: int) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path.split("?")[0] not in ("/metrics", "/"):
                self.send_error(404)
                return
            body = exposition(collector) if self.path.startswith("/metrics") else b"gpuforge GPU metrics: /metrics\n"
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):  # one line per scrape would drown the container's log
            pass

    ThreadingHTTPServer.allow_reuse_address = True
    srv = ThreadingHTTPServer((addr, port), Handler)
    srv.daemon_threads = True
    return srv


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, default=int(os.environ.get("GPUFORGE_METRICS_PORT") or 9400))
    p.add_argument("--addr", default=os.environ.get("GPUFORGE_METRICS_ADDR", "0.0.0.0"))
    p.add_argument("--names", default=os.environ.get("GPUFORGE_METRICS_NAMES", "classic"), choices=NAME_SETS)
    p.add_argument("--once", action="store_true", help="print one exposition and the scrape timing, then exit")
    p.add_argument("--repeat", type=int, default=20, help="scrapes timed with --once (best and median reported)")
    a = p.parse_args(argv)
    if not 0 < a.port < 65536:
        print(f"gpuforge: error: metrics port {a.port} is not in 1-65535", file=sys.stderr)
        return 64
    collector = GpuCollector(a.names)
    if a.once:
        text = exposition(collector).decode()
        times = []
        for _ in range(max(1, a.repeat)):
            t0 = time.perf_counter()
            exposition(collector)
            times.append((time.perf_counter() - t0) * 1000)
        sys.stdout.write(text)
        print(f"# scrape: best {min(times):.2f} ms, median {statistics.median(times):.2f} ms, max {max(times):.2f} ms "
              f"over {len(times)} scrapes", file=sys.stderr)
        return 0
    try:
        srv = serve(collector, a.addr, a.port)
    except OSError as e:
        print(f"gpuforge: error: cannot serve metrics on {a.addr}:{a.port}: {e.strerror}", file=sys.stderr)
        return 64
    print(f"gpuforge: GPU metrics on {a.addr}:{a.port}/metrics ({a.names} dcgm-exporter names)", file=sys.stderr, flush=True)
    srv.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
