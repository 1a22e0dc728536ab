"""Where an AOTInductor package's build and load spend their time (run on the GPU machine, in a container
or on the bare host). Not a check: it prints one JSON object of stage timings.

  builder (this process): import torch, CUDA start, export + aoti_compile_and_package of the smoke's small MLP,
                          every subprocess Inductor starts (g++, ld, objcopy) with its seconds
  loader  (fresh processes, one per way): import torch, CUDA start, torch._inductor.codecache, the package's
                          metadata, the C++ AOTIModelPackageLoader, first run; Python stacks every 3 s while a
                          stage runs long (faulthandler), and with --gdb the native stacks of the loader 5 s and
                          12 s into its C++ load (cuda-gdb attach; needs ptrace in the container)

python3 tools/aoti_probe.py [--gdb] [--configs JSON]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "images", "programs"))

LOADER = r"""
import faulthandler, json, os, sys, time
T = {}
t = time.perf_counter()
def stage(name):
    global t
    now = time.perf_counter(); T[name] = round(now - t, 3); t = now
    print(f"STAGE {name} done {T[name]}", file=sys.stderr, flush=True)
faulthandler.dump_traceback_later(3, repeat=True, file=sys.stderr)
import torch
stage("import_torch")
torch.empty(1, device="cuda"); torch.cuda.synchronize()
stage("cuda_start")
way, pkg, data = sys.argv[1], sys.argv[2], sys.argv[3]
if way == "direct":
    import torch._inductor.codecache as cc
    stage("import_codecache")
    meta = torch._C._aoti.AOTIModelPackageLoader.load_metadata_from_package(pkg, "model")
    stage("load_metadata")
    cc.get_device_information(meta["AOTI_DEVICE_KEY"])
    stage("device_information")
    print("STAGE ctor start", file=sys.stderr, flush=True)
    loader = torch._C._aoti.AOTIModelPackageLoader(pkg, "model", False, 1, 0)
    stage("cpp_loader")
    run = lambda x: loader.run([x])
else:
    print("STAGE ctor start", file=sys.stderr, flush=True)
    runner = torch._inductor.aoti_load_package(pkg)
    stage("aoti_load_package")
    if way == "twice":
        runner = torch._inductor.aoti_load_package(pkg)
        stage("aoti_load_package_again")
    run = runner
d = torch.load(data)
with torch.no_grad():
    out = run(d["x"].cuda())
out = out[0] if isinstance(out, (list, tuple)) else out
torch.cuda.synchronize()
stage("first_run")
faulthandler.cancel_dump_traceback_later()
err = float((out.double().cpu() - d["ref"].double()).norm() / d["ref"].double().norm())
print(json.dumps({"way": way, "stages": T, "rel_err": err}))
"""


def timed_popen(log: list):
    """subprocess.Popen that records each command Inductor runs and how long it took (until wait/communicate)."""
    base = subprocess.Popen

    class Popen(base):  # type: ignore[misc,valid-type]
        def __init__(self, args, *a, **kw):
            self._t0 = time.perf_counter()
            self._argv = args if isinstance(args, str) else " ".join(map(str, args))
            super().__init__(args, *a, **kw)

        def _done(self):
            if not getattr(self, "_logged", False):
                self._logged = True
                log.append({"s": round(time.perf_counter() - self._t0, 2), "cmd": self._argv[:300],
                            "rc": self.returncode})

        def wait(self, *a, **kw):
            r = super().wait(*a, **kw)
            self._done()
            return r

        def communicate(self, *a, **kw):
            r = super().communicate(*a, **kw)
            self._done()
            return r
    return Popen


def gdb_stacks(pid: int) -> str:
    import glob

    gdb = shutil.which("cuda-gdb") or next(iter(sorted(glob.glob("/usr/local/cuda*/bin/cuda-gdb"))), None) or shutil.which("gdb")
    if not gdb:
        return "no cuda-gdb/gdb on PATH"
    r = subprocess.run([gdb, "-p", str(pid), "-batch", "-nx", "-ex", "set pagination off",
                        "-ex", "thread apply all bt 25"], capture_output=True, text=True, timeout=120)
    keep = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.startswith(("#", "Thread"))]
    return "\n".join(keep)[:6000]


def run_loader(way: str, pkg: str, data: str, use_gdb: bool) -> dict:
    p = subprocess.Popen([sys.executable, "-c", LOADER, way, pkg, data], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    err_lines: list = []
    stacks: list = []

    def reader():
        for line in p.stderr:
            err_lines.append(line.rstrip())
            if use_gdb and line.startswith("STAGE ctor start"):
                def later():
                    for delay in (5, 7):
                        time.sleep(delay)
                        if p.poll() is None:
                            stacks.append(gdb_stacks(p.pid))
                threading.Thread(target=later, daemon=True).start()
    th = threading.Thread(target=reader, daemon=True)
    th.start()
    t0 = time.perf_counter()
    out = p.stdout.read()
    p.wait()
    th.join(5)
    res: dict = {"way": way, "exit": p.returncode, "wall_s": round(time.perf_counter() - t0, 2)}
    try:
        res.update(json.loads(out.strip().splitlines()[-1]))
    except (IndexError, json.JSONDecodeError):
        res["stdout"] = out[-1500:]
    # the faulthandler dumps: the first 'File' line of each (the innermost Python frame) tells the stage
    res["python_stacks"] = [ln for ln in err_lines if ln.startswith(("STAGE", "  File", "Thread", "Current"))][-80:]
    res["native_stacks"] = stacks
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--gdb", action="store_true")
    ap.add_argument("--configs", help="JSON object of Inductor configs (default: the smoke check's)")
    ap.add_argument("--ways", default="direct,package,twice")
    args = ap.parse_args()
    rep: dict = {"env": {k: v for k, v in os.environ.items() if k.startswith(("TORCH", "CUDA", "CXX", "CC", "LD_", "PATH"))}}
    t0 = time.perf_counter()
    import torch
    rep["import_torch_s"] = round(time.perf_counter() - t0, 2)
    t0 = time.perf_counter()
    torch.empty(1, device="cuda")
    torch.cuda.synchronize()
    rep["cuda_start_s"] = round(time.perf_counter() - t0, 2)
    from gpu_smoke import aoti_build_configs, package_contents
    from torch._inductor import config
    rep["aot_inductor_settings"] = sorted(k for k in dir(config.aot_inductor) if not k.startswith("_"))
    rep["cpp_settings"] = {k: str(getattr(config.cpp, k))[:80] for k in dir(config.cpp) if not k.startswith("_")}
    configs = json.loads(args.configs) if args.configs else aoti_build_configs()
    rep["configs"] = configs
    log: list = []
    subprocess.Popen = timed_popen(log)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 10)).cuda().eval()
    x = torch.randn(8, 64, device="cuda")
    with torch.no_grad():
        ref = model(x)
    d = tempfile.mkdtemp(prefix="aoti-probe-")
    pkg, data = os.path.join(d, "model.pt2"), os.path.join(d, "data.pt")
    t0 = time.perf_counter()
    ep = torch.export.export(model, (x,))
    rep["export_s"] = round(time.perf_counter() - t0, 2)
    t0 = time.perf_counter()
    torch._inductor.aoti_compile_and_package(ep, package_path=pkg, inductor_configs=configs)
    rep["compile_package_s"] = round(time.perf_counter() - t0, 2)
    subprocess.Popen = subprocess.Popen.__mro__[1]
    rep["subprocesses"] = log
    rep["subprocess_s"] = round(sum(e["s"] for e in log), 2)
    rep["package_contents"] = package_contents(pkg)
    import zipfile
    with zipfile.ZipFile(pkg) as z:
        rep["package_files"] = [[i.filename, i.file_size] for i in z.infolist()]
    torch.save({"x": x.cpu(), "ref": ref.cpu()}, data)
    rep["loaders"] = [run_loader(w, pkg, data, args.gdb) for w in args.ways.split(",")]
    print(json.dumps(rep, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
