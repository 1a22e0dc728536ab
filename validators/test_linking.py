"""linking: every binary of the image finds the libraries it links, the GPU libraries load both lazily and
eagerly, nothing on LD_LIBRARY_PATH or LD_PRELOAD shadows the venv's cuDNN, NCCL, cuBLAS or torch libraries, and no
symbolic link dangles. The facts come from linking_probe.py, run in the image; the allowances live here, each with
its reason, and each one used is kept in the report's facts."""

from __future__ import annotations

import fnmatch
from pathlib import Path

import pytest

from vutil import py

PROBE = (Path(__file__).parent / "linking_probe.py").read_text()
DRIVER = "libcuda.so.1"
# (file under site-packages, library it may miss, why): libraries the image leaves to the host or to an optional
# component on purpose. The driver's libcuda is allowed only on a run without GPUs (validate --gpu must load it).
ALLOWED = (
    ("nvidia/cufile/lib/libcufile_rdma.so*", "libmlx5.so.1", "rdma"),
    ("nvidia/cufile/lib/libcufile_rdma.so*", "librdmacm.so.1", "rdma"),
    ("nvidia/cufile/lib/libcufile_rdma.so*", "libibverbs.so.1", "rdma"),
    ("torchaudio/lib/*sox*.so", "libsox.so", "sox"),
    ("torio/lib/*ffmpeg[456]*.so", "libav*.so.*", "ffmpeg"),
)
WHY = {
    "rdma": "GPUDirect Storage over RDMA: the host's rdma-core/MOFED provides these where that fabric exists, and cuFile "
            "opens this library only then",
    "sox": "torchaudio's optional sox backend, loaded only when libsox is installed (the image has none)",
    "ffmpeg": "torio's optional FFmpeg backends, one per FFmpeg major version, loaded only for an installed FFmpeg "
              "(the image has none)",
    "driver": "the NVIDIA driver's library, which the container runtime mounts on a GPU node; this run asked for no GPU",
}


def _probe(host, timeout, facts, part: str) -> dict:
    r = py(host, PROBE, part, timeout=max(timeout, 300))
    facts.setdefault("linking", {"allowed": []}).update({f"{part}_count": len(r[part]) if part in ("shadows", "links")
                                                           else r[part]["count"], "libcuda_loads": r["libcuda"]})
    if part == "elf":  # the host's files (a GPU node's mounted driver folder): not the image's to resolve
        facts["linking"]["host_mounted_files"] = r["elf"]["host_mounted"]
    return r


@pytest.fixture(scope="module")
def linking(host, timeout, facts):
    """linking(part): the probe's facts for that part, run once per module (a check selected alone pays for its own)."""
    got: dict[str, dict] = {}

    def part(name: str) -> dict:
        if name not in got:
            got[name] = _probe(host, timeout, facts, name)
        return got[name]

    return part


def _why(site: str, file: str, lib: str, gpu: bool) -> str | None:
    """The allowance for `file` missing `lib`, or None. The driver's library is allowed only on a run without GPUs:
    on a GPU run (validate --gpu) the container has the driver, and an image that cannot find it fails."""
    if lib == DRIVER and not gpu:
        return "driver"
    rel = file.removeprefix(site + "/")
    return next((why for f, lb, why in ALLOWED if fnmatch.fnmatch(rel, f) and fnmatch.fnmatch(lib, lb)), None)


def test_every_elf_file_resolves_its_libraries(linking, facts, gpu):
    probe, bad = linking("elf"), []
    allowed = facts["linking"]["allowed"]
    for u in probe["elf"]["unresolved"]:
        reasons = {lib: _why(probe["site"], u["file"], lib, gpu) for lib in u["missing"]}
        if not all(reasons.values()):
            bad.append(f"{u['file']}: {', '.join(lib for lib, why in reasons.items() if not why)} not found")
        else:
            allowed += [{"file": u["file"], "missing": lib, "why": WHY[why]} for lib, why in reasons.items()]
    assert probe["elf"]["count"] > 100, f"only {probe['elf']['count']} ELF files found: the sweep looked in the wrong place"
    assert not bad, f"{len(bad)} of {probe['elf']['count']} ELF files do not resolve: " + "; ".join(bad[:12])


def test_gpu_libraries_load_lazily_and_eagerly(linking, gpu):
    probe, bad = linking("dlopen"), []
    for f in probe["dlopen"]["failed"]:
        lib = f["error"].split(":", 1)[0].strip()
        if "cannot open shared object file" in f["error"] and _why(probe["site"], f["file"], lib, gpu):
            continue  # the same allowance as the ldd sweep: that library is missing on purpose
        bad.append(f"{f['file']} ({f['mode']}): {f['error'][:240]}")
    lazy_only = sorted({b.split(" (")[0] for b in bad if "(RTLD_NOW)" in b} - {b.split(" (")[0] for b in bad if "(RTLD_LAZY)" in b})
    assert probe["dlopen"]["count"] >= 10, f"only {probe['dlopen']['count']} GPU libraries found under {probe['site']}"
    assert not bad, (f"{len(bad)} GPU library loads failed" + (f" (load lazily, not eagerly: {', '.join(lazy_only)})"
                                                                 if lazy_only else "") + ": " + "; ".join(bad[:8]))


def test_nothing_shadows_the_venv_gpu_libraries(linking):
    probe = linking("shadows")
    lines = [f"{s['by']} shadows {s['of']} ({s['via']})" for s in probe["shadows"]]
    if probe["import_error"]:  # said after the shadows: a shadowing library is the likelier cause
        lines.append(f"import torch failed in the probe: {probe['import_error']}")
    assert not lines, "; ".join(lines)


def test_no_broken_symlinks(linking):
    bad = [f"{ln['link']} -> {ln['target']}" for ln in linking("links")["links"] if not ln["excluded"]]
    assert not bad, f"{len(bad)} symbolic links point nowhere: " + "; ".join(bad[:12])
