"""metrics mode: Prometheus text on 9400 from NVML with dcgm-exporter's names and labels, an info metric with
the image's id and versions, unprivileged, beside another mode (GPUFORGE_METRICS_PORT), and without a GPU
still up with a GPU count of 0. Parsed with prometheus_client's own parser; expected values from the target
and the host's NVML (gpuforge.image.hostinfo), never from the exporter."""

from __future__ import annotations

import re

import pytest
from prometheus_client.parser import text_string_to_metric_families

from clients import wait_http
from vutil import Health, processes

# dcgm-exporter's names (etc/default-counters.csv) for what NVML gives, and their types
DCGM = {"DCGM_FI_DEV_GPU_UTIL": "gauge", "DCGM_FI_DEV_MEM_COPY_UTIL": "gauge", "DCGM_FI_DEV_GPU_TEMP": "gauge",
        "DCGM_FI_DEV_POWER_USAGE": "gauge", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": "counter", "DCGM_FI_DEV_FB_USED": "gauge",
        "DCGM_FI_DEV_FB_FREE": "gauge", "DCGM_FI_DEV_SM_CLOCK": "gauge", "DCGM_FI_DEV_MEM_CLOCK": "gauge",
        "DCGM_FI_DEV_XID_ERRORS": "gauge", "DCGM_FI_DEV_FB_RESERVED": "gauge"}
LABELS = {"classic": {"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname"},
          "4.9": {"gpu", "UUID", "pci_bus_id", "device", "modelName", "hostname"}}


def families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def _metrics(image, pytestconfig, gpu, env=None, user=None, command=("metrics",), health_interval=None):
    from gpuforge.engine import containers as run

    return run.container(image, list(command), ports={9400: None}, env=env or {}, user=user, gpus=gpu,
                         gpu_request=pytestconfig.getoption("gpuforge_gpu_request"), health_interval=health_interval)


@pytest.fixture(scope="module")
def scraped(image, pytestconfig, gpu):
    with _metrics(image, pytestconfig, gpu, user="root") as c:
        r = wait_http(f"http://127.0.0.1:{c.port(9400)}/metrics", running=c, timeout=60)
        yield {"text": r.text, "type": r.headers.get("Content-Type", ""),
               "uids": {uid for uid, cmd in processes(c) if "metrics.py" in cmd}}


def test_metrics_up_with_the_gpu_count(scraped, gpu, facts):
    fams = families(scraped["text"])
    assert "text/plain" in scraped["type"] and "version=0.0.4" in scraped["type"], scraped["type"]
    assert "gpuforge_metrics_up" in fams and "gpuforge_gpus" in fams, sorted(fams)
    up = fams["gpuforge_metrics_up"].samples[0].value
    count = fams["gpuforge_gpus"].samples[0].value
    facts["metrics"] = {"up": up, "gpus": count}
    if gpu:
        from gpuforge.image import hostinfo

        h = hostinfo.detect()
        assert up == 1 and count == len(h.gpus), f"NVML in the container: up {up}, {count} GPUs; the runner has {len(h.gpus)}"
    else:
        assert count == 0, f"no GPU was given, yet the exporter counts {count}"


def test_metrics_info_names_the_image(scraped, target):
    fams = families(scraped["text"])
    info = fams.get("gpuforge_image_info") or fams.get("gpuforge_image")  # an info metric written as a gauge
    assert info is not None, "no gpuforge_image_info metric"
    labels = info.samples[0].labels
    want = {"target": target.id, "torch": target.torch, "cuda": target.cuda}
    assert {k: labels.get(k) for k in want} == want, labels


def test_metrics_exporter_is_unprivileged(scraped, target):
    """Started by root (as ssh mode would), the exporter itself runs as the image's user."""
    assert scraped["uids"] == {str(target.uid)}, f"metrics.py runs as uids {scraped['uids']}"


def test_metrics_beside_jupyter(image, pytestconfig):
    """GPUFORGE_METRICS_PORT=9400 beside the jupyter mode: both answer, and the HEALTHCHECK asks both (probed every
    second here; test_health.py holds the image's own interval)."""
    with _metrics(image, pytestconfig, False, env={"GPUFORGE_METRICS_PORT": "9400", "JUPYTER_TOKEN": "x" * 32},
                  command=("jupyter",), health_interval=1) as c:
        c.container.reload()
        r = wait_http(f"http://127.0.0.1:{c.port(9400)}/metrics", running=c, timeout=60)
        h = Health(c)
        healthy = h.wait("healthy", 30)
    assert "gpuforge_gpus" in r.text
    assert healthy and "jupyter: GET" in h.last() and "metrics: GET" in h.last(), (
        f"jupyter with metrics beside: docker's health status {h.status!r}, last probe {h.last()!r}")


@pytest.mark.gpu
@pytest.mark.parametrize("names", ["classic", "4.9"])
def test_gpu_metrics_named_as_dcgm_exporter(image, pytestconfig, gpu, names, facts):
    """On a GPU runner: every field with dcgm-exporter's exact name, type and labels; values sane."""
    with _metrics(image, pytestconfig, gpu, command=("metrics", "--names", names)) as c:
        text = wait_http(f"http://127.0.0.1:{c.port(9400)}/metrics", running=c, timeout=60).text
    fams = families(text)
    missing = {n for n in DCGM if n not in fams}
    assert not missing, f"dcgm-exporter fields missing: {sorted(missing)}"
    wrong = {n: fams[n].type for n, t in DCGM.items() if fams[n].type != t}
    assert not wrong, f"types differ from dcgm-exporter's: {wrong}"
    for n in DCGM:
        # the exact sample names, read from the text: prometheus_client's parser adds _total to a counter's samples
        assert re.search(rf"^{n}{{", text, re.M) and not re.search(rf"^{n}_total", text, re.M), f"{n}: names must stay exact"
        for s in fams[n].samples:
            assert set(s.labels) == LABELS[names], f"{n} labels {sorted(s.labels)}"
    vals = {n: [s.value for s in fams[n].samples] for n in DCGM}
    facts.setdefault("gpu_metrics", {})[names] = vals
    assert all(0 <= v <= 100 for v in vals["DCGM_FI_DEV_GPU_UTIL"]), vals["DCGM_FI_DEV_GPU_UTIL"]
    assert all(v > 0 for v in vals["DCGM_FI_DEV_GPU_TEMP"] + vals["DCGM_FI_DEV_POWER_USAGE"]), vals


def host_memory_mib() -> list[dict[str, int]]:
    """Each GPU's framebuffer MiB as the runner's NVML gives it (v2: used without the reserved memory)."""
    import pynvml as nv

    nv.nvmlInit()
    try:
        out = []
        for i in range(nv.nvmlDeviceGetCount()):
            m = nv.nvmlDeviceGetMemoryInfo(nv.nvmlDeviceGetHandleByIndex(i), version=nv.nvmlMemory_v2)
            out.append({k: getattr(m, k) // 2**20 for k in ("total", "reserved", "used", "free")})
        return out
    finally:
        nv.nvmlShutdown()


@pytest.mark.gpu
def test_gpu_metrics_memory_as_nvml_reports_it(image, pytestconfig, gpu, facts):
    """FB_USED is NVML's used memory without the driver's reserved memory (dcgm-exporter's meaning), FB_RESERVED
    that reserved memory, and used + reserved + free is the GPU's total — against the runner's own NVML."""
    with _metrics(image, pytestconfig, gpu) as c:
        text = wait_http(f"http://127.0.0.1:{c.port(9400)}/metrics", running=c, timeout=60).text
        host = host_memory_mib()  # read while the exporter's container is up: the same GPUs, the same moment
    fams = families(text)
    got = {n: {s.labels["gpu"]: s.value for s in fams[n].samples}
           for n in ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_RESERVED", "DCGM_FI_DEV_FB_FREE")}
    facts["gpu_metrics_memory"] = {"exporter": got, "nvml": host}
    slack = 64  # MiB: what another process may allocate between the two reads
    for i, h in enumerate(host):
        used, reserved, free = (got[n][str(i)] for n in ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_RESERVED", "DCGM_FI_DEV_FB_FREE"))
        assert reserved == h["reserved"], f"GPU {i}: FB_RESERVED {reserved} MiB, NVML reserved {h['reserved']} MiB"
        assert abs(used - h["used"]) <= slack, f"GPU {i}: FB_USED {used} MiB, NVML used (v2) {h['used']} MiB"
        assert abs(used + reserved + free - h["total"]) <= 2, (f"GPU {i}: used {used} + reserved {reserved} + free {free} "
                                                               f"MiB is not the total {h['total']} MiB")
