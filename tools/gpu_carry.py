"""Carry the shipped image to the GPU machine and measure it there, in a container gpuforge starts.

The GPU machine has no registry, no network and no Docker, takes at most ~64 MiB of files per command, and keeps
/tmp only while it stays warm (a machine idle ~30 s is given back). So the image travels as `docker save` (its
layers, config and id) in checked parts, one part per command, back to back, and `docker load` there gives the same
image id and RootFS layers as the built image: GPU evidence made there is evidence for the built image by content.

  here:   python3 tools/gpu_carry.py parts IMAGE          # .carry/: zstd parts of `docker save`, sha256s, id, layers
  there:  python3 tools/gpu_carry.py setup                # carried Docker 26.1.5 with CDI      (carry .device .whl)
          python3 tools/gpu_carry.py part NN              # one per part, back to back     (carry .carry/pNN .carry/meta)
          python3 tools/gpu_carry.py import               # join, check, `docker load`; the id and layers must be the
                                                          # built image's (carry .carry/meta .carry/zstd)
          python3 tools/gpu_carry.py measure [STEP ...]   # smoke devel selftest expect metrics warm first perf perf-train
                                                          # ready faults repeat startup autotune autotune-artifacts (.whl)
  here:   python3 tools/gpu_carry.py proof STATE KEY      # .carry/proof: the record, the key and cosign for `measure bundle`,
                                                          # the GPU run signed offline into one file (`gpuforge attach` here)

Every call carries `.carry/meta/` (the parts' sha256s and the manifest with the image's config: a few kB). Each
step prints its wall seconds; `measure` writes its raw files under $OUT (at most 8 come back: one tar) and a
summary JSON. docs/contributing.md gives the timings and the call sequence.
Bad input: one line, exit 64; a step that fails: exit 1.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CARRY = ROOT / ".carry"
META = CARRY / "meta"  # parts.sha256 and manifest.json: a few kB, carried with every call
ZSTD = CARRY / "zstd"  # the zstd binary and its libraries (the GPU machine has none): carried with the import
PART_BYTES = 58 << 20  # one part, the working tree (~3 MB) and meta/ stay under the 64 MiB a call may carry
STATE = Path("/tmp/gpuforge-carry")  # there: the parts, kept between calls while the machine stays warm
ENGINE = Path("/tmp/dk")
IMAGE_NAME = "gpuforge-shipped:carried"
CDI_SPEC = """cdiVersion: "0.6.0"
kind: nvidia.com/gpu
devices:
  - name: "0"
    containerEdits:
      deviceNodes: [{path: /dev/nvidia0}]
  - name: all
    containerEdits:
      deviceNodes: [{path: /dev/nvidia0}]
containerEdits:
  deviceNodes: [{path: /dev/nvidiactl}, {path: /dev/nvidia-uvm}, {path: /dev/nvidia-uvm-tools}]
  mounts:
    - {hostPath: /usr/local/nvidia, containerPath: /usr/local/nvidia, options: [ro, nosuid, nodev, bind]}
  env: [LD_LIBRARY_PATH=/usr/local/nvidia/lib64, NVIDIA_VISIBLE_DEVICES=void]
"""


class Fail(Exception):
    pass


def say(msg: str) -> None:
    print(f"gpu_carry: {msg}", flush=True)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def sh(cmd: list[str] | str, check: bool = False, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, shell=isinstance(cmd, str), check=check, text=True, **kw)


# --- here ---------------------------------------------------------------------------------------------------------

def parts(image: str) -> int:
    if shutil.which("zstd") is None or shutil.which("docker") is None:
        msg = "parts needs docker and zstd here"
        raise Fail(msg)
    info = json.loads(sh(["docker", "image", "inspect", image], capture_output=True).stdout or "[]")
    if not info:
        msg = f"{image}: no such image here (build it: gpuforge build)"
        raise Fail(msg)
    shutil.rmtree(CARRY, ignore_errors=True)
    META.mkdir(parents=True)
    ZSTD.mkdir()
    t0 = time.perf_counter()
    whole = CARRY / "image.tar.zst"
    # docker save keeps what makes the image itself: its config (so its id) and its layers (so its diff_ids)
    r = sh(f"docker save {shlex.quote(image)} | zstd -T0 -9 --long=27 -q -o {shlex.quote(str(whole))}")
    if r.returncode != 0:
        msg = "docker save | zstd failed"
        raise Fail(msg)
    save_s = time.perf_counter() - t0
    names = []
    with open(whole, "rb") as f:
        for n in range(100):
            chunk = f.read(PART_BYTES)
            if not chunk:
                break
            (CARRY / f"p{n:02d}").write_bytes(chunk)
            names.append(f"p{n:02d}")
    (META / "parts.sha256").write_text("".join(f"{sha256(CARRY / p)}  {p}\n" for p in names))
    manifest = {"image": image, "image_id": info[0]["Id"], "diff_ids": info[0]["RootFS"]["Layers"],
                "labels": info[0]["Config"].get("Labels") or {}, "image_bytes": info[0]["Size"],
                "whole_sha256": sha256(whole), "whole_bytes": whole.stat().st_size, "parts": len(names),
                "save_zstd_s": round(save_s, 1)}
    whole.unlink()
    (META / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    zstd = Path(shutil.which("zstd")).resolve()
    shutil.copy2(zstd, ZSTD / "zstd")
    for line in sh(["ldd", str(zstd)], capture_output=True).stdout.splitlines():
        lib = line.split("=>")[-1].split("(")[0].strip()
        if "=>" in line and lib and "libc.so" not in lib:
            shutil.copy2(lib, ZSTD)
    say(f"{image} ({manifest['image_id'][:19]}, {len(manifest['diff_ids'])} layers): {manifest['whole_bytes'] >> 20} MiB "
        f"zstd in {len(names)} parts under {CARRY}, save + zstd {save_s:.0f} s")
    return 0


# --- there --------------------------------------------------------------------------------------------------------

def engine_env() -> dict:
    return {**os.environ, "PATH": f"{ENGINE}/usr/sbin:{ENGINE}/usr/bin:{os.environ['PATH']}"}


def setup() -> int:
    """The carried Docker 26.1.5 (.device/engine26.tar.xz) with CDI, started in a session of its own (it outlives the
    command), and gpuforge's wheels (.whl) installed under /tmp/site."""
    t0 = time.perf_counter()
    if not (ENGINE / "usr/bin/dockerd").exists():
        tarball = ROOT / ".device/engine26.tar.xz"
        if not tarball.exists():
            msg = "carry .device (engine26.tar.xz) with setup"
            raise Fail(msg)
        ENGINE.mkdir(parents=True, exist_ok=True)
        sh(["tar", "-C", str(ENGINE), "-xJf", str(tarball)], check=True)
    Path("/etc/ld.so.conf.d/zz-dk.conf").write_text(f"{ENGINE}/lib/x86_64-linux-gnu\n")
    sh(["ldconfig"])
    Path("/etc/docker").mkdir(exist_ok=True)
    Path("/etc/docker/daemon.json").write_text('{"features": {"cdi": true}}\n')
    Path("/etc/cdi").mkdir(exist_ok=True)
    Path("/etc/cdi/nvidia.yaml").write_text(CDI_SPEC)  # what `nvidia-ctk cdi generate` describes for this host
    env = engine_env()
    if sh(["docker", "info"], env=env, capture_output=True).returncode != 0:
        with open("/tmp/dockerd.log", "ab") as log:
            # the default bridge (no iptables: docker-proxy publishes ports), so the metrics validators can scrape
            subprocess.Popen(["dockerd", "--iptables=false"], env=env, stdout=log, stderr=log,
                             start_new_session=True)
    for _ in range(60):
        if sh(["docker", "info"], env=env, capture_output=True).returncode == 0:
            break
        time.sleep(0.5)
    else:
        raise Fail("dockerd did not answer: " + Path("/tmp/dockerd.log").read_text()[-1500:])
    wheels = sorted(str(p) for p in (ROOT / ".whl").glob("*.whl"))
    if wheels:
        sh([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--upgrade",
            "--target", "/tmp/site", *wheels], check=True)
    STATE.mkdir(parents=True, exist_ok=True)
    v = sh(["docker", "version", "--format", "{{.Server.Version}}"], env=env, capture_output=True).stdout.strip()
    say(f"setup: engine {v} with CDI, {len(wheels)} wheels, {time.perf_counter() - t0:.1f} s")
    return 0


def part(n: str) -> int:
    t0 = time.perf_counter()
    if not (len(n) == 2 and n.isdigit()):
        msg = f"part {n!r}: give the part number as two digits (00, 01, ...)"
        raise Fail(msg)
    src, sums = CARRY / f"p{n}", META / "parts.sha256"
    if not src.exists() or not sums.exists():
        msg = f"carry .carry/p{n} and .carry/meta with this call"
        raise Fail(msg)
    want = {line.split()[1]: line.split()[0] for line in sums.read_text().splitlines()}
    STATE.mkdir(parents=True, exist_ok=True)
    dest = STATE / f"p{n}"
    shutil.copyfile(src, dest)
    if sha256(dest) != want.get(f"p{n}"):
        dest.unlink()
        msg = f"p{n}: sha256 differs from parts.sha256 (a torn transfer): carry it again"
        raise Fail(msg)
    have = sorted(p.name for p in STATE.glob("p??"))
    say(f"p{n} ok: {len(have)} of {len(want)} parts here, {time.perf_counter() - t0:.1f} s")
    return 0


def import_image() -> int:
    t0 = time.perf_counter()
    m = json.loads((META / "manifest.json").read_text())
    have = sorted(STATE.glob("p??"))
    if len(have) != m["parts"]:
        missing = sorted({f"p{i:02d}" for i in range(m["parts"])} - {p.name for p in have})
        msg = f"have {len(have)} of {m['parts']} parts; missing {', '.join(missing)} (the machine was given back?)"
        raise Fail(msg)
    h = hashlib.sha256()
    for p in have:
        with open(p, "rb") as f:
            for chunk in iter(lambda f=f: f.read(1 << 22), b""):
                h.update(chunk)
    if h.hexdigest() != m["whole_sha256"]:
        msg = "the joined parts differ from the exported file's sha256"
        raise Fail(msg)
    env = {**engine_env(), "LD_LIBRARY_PATH": str(ZSTD)}
    cat = " ".join(shlex.quote(str(p)) for p in have)
    r = sh(f"cat {cat} | {shlex.quote(str(ZSTD / 'zstd'))} -dc --long=27 | docker load -q", env=env)
    if r.returncode != 0:
        msg = "docker load failed"
        raise Fail(msg)
    for p in have:
        p.unlink()  # the loaded image holds it now: free the disk for the runs
    got = json.loads(sh(["docker", "image", "inspect", m["image_id"]], env=engine_env(), capture_output=True).stdout or "[]")
    if not got or got[0]["Id"] != m["image_id"] or got[0]["RootFS"]["Layers"] != m["diff_ids"]:
        same = "equal" if got and got[0]["RootFS"]["Layers"] == m["diff_ids"] else "differ"
        msg = (f"the loaded image is not the built one: built {m['image_id'][:19]}, here "
               f"{got[0]['Id'][:19] if got else 'none'} (layers {same})")
        raise Fail(msg)
    sh(["docker", "tag", m["image_id"], IMAGE_NAME], env=engine_env(), check=True)
    say(f"loaded {m['image']}: id {got[0]['Id']} = the built image's, {len(m['diff_ids'])} RootFS layers equal; "
        f"{int(got[0]['Size']) >> 20} MiB, {time.perf_counter() - t0:.1f} s")
    return 0


# --- measurements there, each in a container gpuforge (or the benchmark) starts ----------------------------------

def _target_json(out: Path) -> Path:
    """The expected versions: the carried image's own labels are only what it claims, so they come from the
    checkout's rendered target of the image's id (what the host toolkit expects)."""
    m = json.loads((META / "manifest.json").read_text())
    tid = m["labels"].get("io.gpuforge.target")
    path = ROOT / "images" / "dist" / str(tid) / "target.json"
    if not path.exists():
        msg = f"the carried image is target {tid!r}, which this checkout does not render"
        raise Fail(msg)
    shutil.copy2(path, out / "target.json")
    return path


def _timed(out: Path, name: str, cmd: list[str], timeout: int = 580) -> dict:
    t0 = time.perf_counter()
    env = {**engine_env(), "PYTHONPATH": f"/tmp/site:{ROOT}", "PYTHONUNBUFFERED": "1", "NCCL_NVLS_ENABLE": "0"}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT, check=False)
    wall = round(time.perf_counter() - t0, 1)
    (out / f"{name}.log").write_text(f"$ {shlex.join(cmd)}\n{r.stdout}\n--- stderr\n{r.stderr}\nrc={r.returncode} wall_s={wall}\n")
    say(f"{name}: rc={r.returncode} in {wall} s")
    return {"rc": r.returncode, "wall_s": wall}


GPU = ["--gpu-request", "cdi"]
G = [sys.executable, "-m", "gpuforge"]


def step_smoke(out: Path) -> dict:
    tj = _target_json(out)
    res = _timed(out, "smoke", [*G, "smoke", "--image", IMAGE_NAME, *GPU, "--target-json", str(tj), "--reports",
                                str(out / "reports")])
    rep = next((out / "reports" / "smoke").glob("*.json"), None)
    if rep:
        data = json.loads(rep.read_text())
        res["outcomes"] = {o: sum(1 for c in data["checks"] if c["outcome"] == o) for o in ("passed", "failed", "skipped")}
        res["seconds"] = data.get("facts", {}).get("gpu_smoke_seconds")
    return res


def step_selftest(out: Path) -> dict:
    return _timed(out, "selftest", ["docker", "run", "--rm", "--network", "none", "--device", "nvidia.com/gpu=all",
                                    "--shm-size", "2g", IMAGE_NAME, "selftest"])


def step_expect(out: Path) -> dict:
    """A version the image does not have, asked for: exit 5, both versions named."""
    tj = _target_json(out)
    res = _timed(out, "expect", [*G, "smoke", "--image", IMAGE_NAME, *GPU, "--target-json", str(tj), "--expect",
                                 "torch=2.6.0", "--reports", str(out / "reports-expect"), "--pytest-args",
                                 "-k test_versions_are_the_expected_ones"])
    text = (out / "expect.log").read_text()
    res["names_both"] = "the image reports 2.7.1+cu126, expected 2.6.0" in text
    return res


def step_metrics(out: Path) -> dict:
    """The metrics validators on the GPU (names, types, labels; FB_USED/FB_RESERVED against this host's NVML)."""
    tj = _target_json(out)
    return _timed(out, "metrics", [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--rootdir", "validators",
                                   "validators/test_metrics.py",
                                   "--gpuforge-image", IMAGE_NAME, "--gpuforge-gpu", "--gpuforge-gpu-request", "cdi",
                                   "--gpuforge-target", str(tj), "-k", "gpu_metrics", "-rA"])


def step_warm(out: Path) -> dict:
    res = _timed(out, "warm", [sys.executable, "tools/warm_bench.py", "--image", IMAGE_NAME, "--overlap-ab", "--json",
                               str(out / "warm.json"), "--md", str(out / "warm.md")])
    if (out / "warm.json").exists():
        res["summary"] = json.loads((out / "warm.json").read_text()).get("summary")
    return res


def step_first(out: Path) -> dict:
    """The first-start bar alone: 3 interleaved pairs (no package / package built in the background), medians."""
    res = _timed(out, "first", [sys.executable, "tools/warm_bench.py", "--image", IMAGE_NAME, "--first-starts", "3",
                                "--json", str(out / "first.json")])
    if (out / "first.json").exists():
        f = json.loads((out / "first.json").read_text())["first_starts"]
        res["summary"] = {k: v for k, v in f.items() if k not in ("no_package", "with_package")}
    return res


PERF_PARTS = {  # each part's workloads fit one call: max-autotune's cold compile capped at PERF_CAP each
    "perf": "resnet50-infer-bs1,resnet50-infer-bs64-bf16,fusion",
    "perf-train": "resnet18-train-bs64,resnet18-train-bs64-bf16-cl",
}
PERF_CAP = 120


def _perf(out: Path, part: str) -> dict:
    """The perf table in a container of the image (its torch, its kernels): each workload in eager and the three
    compile modes, best of 5 with CV, a recommendation per workload, the seeds' claims. max-autotune as the image
    offers it (GPUFORGE_COMPILE_MODE: the entrypoint's limits on what it tunes), its cold compile capped. Merge the
    parts here: python3 images/programs/perf_table.py --merge perf.json perf-train.json --md perf-all.md"""
    vol = out / "perf"
    vol.mkdir(exist_ok=True)
    os.chmod(vol, 0o777)
    name = f"gpuforge-carry-{part}"
    try:
        res = _timed(out, part, ["docker", "run", "--rm", "--name", name, "--network", "none", "--device",
                                 "nvidia.com/gpu=all", "--shm-size", "2g", "-e",
                                 "GPUFORGE_COMPILE_MODE=max-autotune-no-cudagraphs", "-v", f"{vol}:/out", IMAGE_NAME,
                                 "python3", "/opt/gpuforge/programs/perf_table.py", "--no-warm-start", "--trials", "5",
                                 "--workloads", PERF_PARTS[part], "--cap", str(PERF_CAP), "--json", f"/out/{part}.json",
                                 "--md", f"/out/{part}.md"], timeout=590)
    except subprocess.TimeoutExpired:
        sh(["docker", "rm", "-f", name], env=engine_env(), capture_output=True)  # not left on the GPU for the next call
        raise
    with contextlib.suppress(OSError, ValueError, KeyError):
        rep = json.loads((vol / f"{part}.json").read_text())
        res["recommendations"] = {r["workload"]: r.get("mode") for r in rep["recommendations"]}
        res["claims"] = {c["id"]: c["verdict"] for c in rep["claims"] if c["verdict"] != "not measured"}
    return res


def step_perf(out: Path) -> dict:
    return _perf(out, "perf")


def step_perf_train(out: Path) -> dict:
    return _perf(out, "perf-train")


def _autotune(out: Path, way: str) -> dict:
    """max-autotune paid once (docs/images.md): ResNet-50 bs64 bf16 with GPUFORGE_COMPILE_MODE=max-autotune-no-cudagraphs,
    a cold container on a fresh volume (it tunes; the aot way then builds its package in the background), then two
    containers that load what it left; each start from `docker run` to its first tuned output checked against eager."""
    name = f"autotune-{way}"
    res = _timed(out, name, [sys.executable, "tools/warm_bench.py", "--image", IMAGE_NAME, "--ways", way, "--warm", "2",
                             "--baselines", "0", "--compile-mode", "max-autotune-no-cudagraphs", "--model",
                             "resnet50-bs64-bf16", "--cap", "480", "--json", str(out / f"{name}.json"),
                             "--md", str(out / f"{name}.md")], timeout=590)
    with contextlib.suppress(OSError, ValueError, KeyError):
        res["summary"] = json.loads((out / f"{name}.json").read_text())["summary"][way]
    return res


def step_autotune(out: Path) -> dict:
    return _autotune(out, "aot")


def step_autotune_artifacts(out: Path) -> dict:
    return _autotune(out, "artifacts")


def step_ready(out: Path) -> dict:
    """Readiness r1 and r2 through `gpuforge smoke --level` (a container gpuforge starts, judged with the host's bars),
    each with its wall time, its verdict and its findings."""
    tj = _target_json(out)
    res = {}
    for level in ("r1", "r2"):
        reports = out / f"reports-{level}"
        r = _timed(out, f"ready-{level}", [*G, "smoke", "--image", IMAGE_NAME, *GPU, "--target-json", str(tj),
                                           "--level", level, "--reports", str(reports)])
        rep = next((reports / "smoke").glob("*.json"), None)
        got = (json.loads(rep.read_text()).get("facts") or {}).get("readiness") if rep else None
        if got:
            r.update(verdict=got["verdict"], exit=got["exit"], program_s=got["facts"].get("seconds"),
                     failed=[f["check"] for f in got["findings"] if not f["ok"]])
        res[level] = r
    return res


FLOOR_RAISE = 2.0  # the injected floors: the seen model's own, twice over (a floor sits ~10 % under a healthy node)


def _gpu_names() -> list[str]:
    """The GPUs this machine has, by name: nvidia-smi where there is one, else NVML inside a container of the image."""
    if shutil.which("nvidia-smi"):
        out = sh(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True).stdout
    else:
        code = ("import pynvml as n; n.nvmlInit(); "
                "[print(n.nvmlDeviceGetName(n.nvmlDeviceGetHandleByIndex(i))) for i in range(n.nvmlDeviceGetCount())]")
        out = sh(["docker", "run", "--rm", "--network", "none", "--device", "nvidia.com/gpu=all", "--entrypoint",
                  "/opt/venv/bin/python", IMAGE_NAME, "-c", code], env=engine_env(), capture_output=True).stdout
    return [ln.strip() for ln in out.splitlines() if ln.strip()]


def raised_floors(bars: dict, names: list[str], factor: float = FLOOR_RAISE) -> dict:
    """`bars` with the r2 floors of each GPU model in `names` raised `factor` times (hbm_copy, gemm_bf16): a floor
    above what a healthy node of that model measures, so the fault is injected on the GPU present."""
    from gpuforge.image.compat import model_key

    floors = bars["r2"]["floors"]
    models = {model_key(n, floors) for n in names}
    if not names or None in models:
        msg = f"no r2 floors for the GPU(s) seen here ({', '.join(names) or 'none'}): the fault cannot be injected"
        raise Fail(msg)
    for m in models:
        floors[m].update({k: round(floors[m][k] * factor, 3) for k in ("hbm_copy", "gemm_bf16")})
    return bars


def _bars_raised() -> str:
    """The host's readiness bars with the r2 floors of the GPU seen here raised above what a healthy node gives."""
    sys.path.insert(0, str(ROOT))
    from gpuforge.image import readiness

    return json.dumps(raised_floors(readiness.bars(), _gpu_names()))


# Each readiness fault, in a container of the image with the GPU (CDI): (name, extra docker run arguments, selftest
# arguments, the blame it must get). The image's own `selftest --level` judges with its compat data, or the bars given.
# "unknown": the kernel log closed to the container (NO_KMSG: no /dev/kmsg, no CAP_SYSLOG) is not known, never the
# host's fault: READY naming it (exit 0), or with --strict exit 12.
NO_KMSG = "no-kmsg"
FAULTS = (
    ("healthy-r1", [], ["--level", "r1"], None),
    ("healthy-r2", [], ["--level", "r2"], None),
    ("no-visible-gpu", ["-e", "CUDA_VISIBLE_DEVICES="], ["--level", "r1"], "host"),
    ("shm-64m", ["--shm-size", "64m"], ["--level", "r1"], "host"),
    ("memlock-64k", ["--ulimit", "memlock=65536:65536"], ["--level", "r1"], "host"),
    ("require-cuda-above-driver", ["-e", "NVIDIA_REQUIRE_CUDA=cuda>=13.1"], ["--level", "r1"], "image"),
    ("floor-above-measured", [], ["--level", "r2", "--bars", "BARS"], "host"),
    ("kmsg-closed-r2", [NO_KMSG], ["--level", "r2"], "unknown"),
    ("kmsg-closed-strict", [NO_KMSG], ["--level", "r1", "--strict"], "unknown-strict"),
)
VERDICT_STARTS = ("READY", "NODE NOT FIT", "IMAGE AT FAULT", "NOT SHOWN FIT", "STOPPED")


def _selftest_cmd(run_args: list[str], st_args: list[str]) -> list[str]:
    # the node's kernel log for the XID check: a container has none of its own, and reading it takes root's
    # CAP_SYSLOG (kernel.dmesg_restrict=1)
    kmsg = [] if NO_KMSG in run_args else ["--device", "/dev/kmsg", "--user", "0", "--cap-add", "SYSLOG"]
    return ["docker", "run", "--rm", "--network", "none", "--device", "nvidia.com/gpu=all", *kmsg, "--shm-size", "2g",
            "--ulimit", "memlock=-1:-1", *[a for a in run_args if a != NO_KMSG], IMAGE_NAME, "selftest", *st_args]


def _verdict_line(log: str) -> str:
    lines = [ln for ln in log.splitlines() if ln.startswith("gpuforge selftest r")
             and ln.split(": ", 1)[-1].startswith(VERDICT_STARTS)]
    return lines[-1] if lines else ""


def blamed_right(rc: int, verdict: str, blame: str | None) -> bool:
    """The probe's exit code and verdict line are the ones the injected fault must give."""
    if blame is None:
        return rc == 0 and ": READY r" in verdict and "not known" not in verdict
    if blame == "unknown":
        return rc == 0 and ": READY r" in verdict and "not known: xid: " in verdict
    if blame == "unknown-strict":
        return rc == 12 and "NOT SHOWN FIT (unknown" in verdict and "xid: " in verdict
    if blame == "host":
        return rc == 10 and "NODE NOT FIT (host): " in verdict
    return rc == 5 and "IMAGE AT FAULT: " in verdict and "the probe crashed" not in verdict


def step_faults(out: Path) -> dict:
    res, bars = {}, None
    for name, run_args, st_args, blame in FAULTS:
        if "BARS" in st_args and bars is None:
            bars = _bars_raised()
        cmd = _selftest_cmd(run_args, [bars if a == "BARS" else a for a in st_args])
        r = _timed(out, f"fault-{name}", cmd, timeout=300)
        r["verdict"] = _verdict_line((out / f"fault-{name}.log").read_text())
        r["expected_blame"] = blame
        r["blamed_right"] = blamed_right(r["rc"], r["verdict"], blame)
        res[name] = r
    return res


REPEAT = int(os.environ.get("GPUFORGE_CARRY_REPEAT", "25"))  # runs per level in one `measure repeat`
# the levels one `measure repeat` runs (GPUFORGE_CARRY_LEVELS=r2: a call of r2 alone, the longer one)
LEVELS = tuple(x for x in os.environ.get("GPUFORGE_CARRY_LEVELS", "r1,r2").split(",") if x)


def step_repeat(out: Path) -> dict:
    """`selftest --level r1`, then r2, REPEAT times each (GPUFORGE_CARRY_REPEAT, 25 by default: on an H100 r1 is ~1 s a
    run and r2 ~11 s, so 25 of each fit one call of ~300 s; two calls make 50; GPUFORGE_CARRY_LEVELS=r2 runs r2
    alone), one container each with the node's kernel log: every run must exit 0
    with READY; any other exit, a crash line (glibc's 'double free', 'free(): invalid pointer') or a verdict that
    is not READY is counted and its log kept."""
    res = {}
    if not LEVELS or set(LEVELS) - {"r1", "r2"}:
        msg = f"GPUFORGE_CARRY_LEVELS={','.join(LEVELS)!r}: give r1, r2 or r1,r2"
        raise Fail(msg)
    for level in LEVELS:
        runs = []
        for i in range(REPEAT):
            name = f"repeat-{level}-{i:02d}"
            r = _timed(out, name, _selftest_cmd([], ["--level", level]), timeout=300)
            log = (out / f"{name}.log").read_text()
            r["verdict"] = _verdict_line(log)
            r["crash_lines"] = [ln for ln in log.splitlines() if "double free" in ln or "free(): " in ln
                                or "corrupted" in ln or "Segmentation fault" in ln or "crashed" in ln]
            if r["rc"] == 0 and ": READY r" in r["verdict"] and not r["crash_lines"]:
                (out / f"{name}.log").unlink()  # a clean run's log adds nothing; the bad ones are kept
            runs.append(r)
        bad = [i for i, r in enumerate(runs) if r["rc"] != 0 or ": READY r" not in r["verdict"] or r["crash_lines"]]
        res[level] = {"runs": len(runs), "exit_0_ready": len(runs) - len(bad), "bad": {i: runs[i] for i in bad},
                      "exit_codes": sorted({r["rc"] for r in runs}), "wall_s": [r["wall_s"] for r in runs]}
        say(f"repeat {level}: {len(runs) - len(bad)} of {len(runs)} exit 0 with READY; bad runs {bad}")
    return res


def step_startup(out: Path) -> dict:
    """Readiness after the pull (the cold start on the GPU; the image is local here): `docker run` -> process, first
    `import torch`, first CUDA op, first compiled inference, a Jupyter kernel answering; 3 runs, seconds from the
    command. The probe is tools/ready_probe.py's (no imports: this machine's Python reaches only the carried wheels),
    which tools/bench_ready.py times after a pull on the CPU machine."""
    import ready_probe  # beside this script

    runs = []
    for _ in range(3):
        t0 = time.time()
        r = subprocess.run(["docker", "run", "--rm", "--network", "none", "--device", "nvidia.com/gpu=all", "--shm-size",
                            "2g", IMAGE_NAME, "python3", "-c", ready_probe.PROBE], capture_output=True, text=True,
                           env=engine_env(), check=False)
        marks = {}
        for line in r.stdout.splitlines():
            with contextlib.suppress(json.JSONDecodeError, KeyError, TypeError):
                m = json.loads(line)
                marks[m["mark"]] = round(m["t"] - t0, 2)
        runs.append({"rc": r.returncode, "marks": marks, **({"stderr": r.stderr[-1500:]} if r.returncode else {})})
        say(f"startup: rc={r.returncode} {marks}")
    (out / "startup.json").write_text(json.dumps(runs, indent=1) + "\n")
    return {"runs": runs}


def step_devel(out: Path) -> dict:
    """The CPU-side devel and linking validators with the GPU given (the driver's libcuda must resolve), in a
    container the validator plugin starts: a devel image's toolkit and its linking on the GPU node."""
    tj = _target_json(out)
    return _timed(out, "devel", [sys.executable, "-m", "pytest", "validators/test_devel.py", "validators/test_linking.py",
                                 "-p", "no:cacheprovider", "-q", "-rs", "--rootdir", "validators", "--gpuforge-image",
                                 IMAGE_NAME, "--gpuforge-gpu", "--gpuforge-gpu-request", "cdi", "--gpuforge-target",
                                 str(tj), "--gpuforge-report", str(out / "devel-report.json")])


PROOF = CARRY / "proof"  # here: the build record, the signing key and cosign for `measure bundle` (carried with it)


def proof(state_dir: str, key: str) -> int:
    """Here: what `measure bundle` needs there: the build record of the carried image (it names the pushed digest the
    bundle's statements are about), the key pair's private key and its password (COSIGN_PASSWORD), and cosign; a
    matrix.yaml put beside them (the fleet pool the GPU machine is a node of) is the one the run there reads."""
    rec = Path(state_dir) / "builds.json"
    pw = os.environ.get("COSIGN_PASSWORD")
    if not rec.is_file() or not Path(key).is_file() or pw is None or shutil.which("cosign") is None:
        msg = "proof STATE_DIR KEY needs STATE_DIR/builds.json, the key file, COSIGN_PASSWORD and cosign here"
        raise Fail(msg)
    shutil.rmtree(PROOF, ignore_errors=True)
    (PROOF / "state").mkdir(parents=True)
    shutil.copy2(rec, PROOF / "state" / "builds.json")
    shutil.copy2(key, PROOF / "cosign.key")
    (PROOF / "cosign.password").write_text(pw)
    sh(f"xz -T0 -6 -c {shlex.quote(str(Path(shutil.which('cosign')).resolve()))} > {shlex.quote(str(PROOF / 'cosign.xz'))}",
       check=True)
    say(f"proof: record, key and cosign under {PROOF} ({sum(f.stat().st_size for f in PROOF.rglob('*') if f.is_file()) >> 20} MiB)")
    return 0


GLIBC = ("libc.so", "libm.so", "libpthread.so", "libdl.so", "librt.so", "libresolv.so", "ld-linux", "linux-vdso")


def _openssh_client() -> None:
    """The validators' journeys log in with OpenSSH's client, which the GPU machine lacks: where it has none, the
    loaded image's own (Debian's openssh-client, a dependency of its sshd) is copied out with the libraries it links
    beyond glibc, and put first on PATH. The same client `tools/start-engine.sh` installs on a runner."""
    if shutil.which("ssh"):
        return
    env, d = engine_env(), Path("/tmp/gpuforge-openssh")
    (d / "lib").mkdir(parents=True, exist_ok=True)
    libs = sh(["docker", "run", "--rm", "--network", "none", "--entrypoint", "ldd", IMAGE_NAME, "/usr/bin/ssh"],
              env=env, capture_output=True).stdout
    paths = [ln.split("=>")[1].split("(")[0].strip() for ln in libs.splitlines() if "=>" in ln]
    cid = sh(["docker", "create", IMAGE_NAME, "true"], env=env, capture_output=True, check=True).stdout.strip()
    try:
        sh(["docker", "cp", "-L", f"{cid}:/usr/bin/ssh", str(d / "ssh.bin")], env=env, check=True)
        for lib in (p for p in paths if p and not any(g in p for g in GLIBC)):
            sh(["docker", "cp", "-L", f"{cid}:{lib}", str(d / "lib" / Path(lib).name)], env=env, check=True)
    finally:
        sh(["docker", "rm", "-f", cid], env=env, capture_output=True)
    (d / "ssh").write_text(f'#!/bin/sh\nLD_LIBRARY_PATH={d / "lib"} exec {d / "ssh.bin"} "$@"\n')
    (d / "ssh").chmod(0o755)
    os.environ["PATH"] = f"{d}:{os.environ['PATH']}"
    say(f"openssh client: the image's ({sh([str(d / 'ssh'), '-V'], capture_output=True).stderr.strip()}), "
        f"{len(list((d / 'lib').iterdir()))} libraries")


def step_bundle(out: Path) -> dict:
    """`gpuforge validate T --gpu --bundle` on the loaded image (the built image's id): the GPU run signed offline with
    the key into one bundle file, for `gpuforge attach` on the connected side (carry .carry/proof with it)."""
    m = json.loads((META / "manifest.json").read_text())
    tid = m["labels"].get("io.gpuforge.target")
    if not (PROOF / "state" / "builds.json").is_file():
        msg = "carry .carry/proof (tools/gpu_carry.py proof STATE_DIR KEY, here) with `measure bundle`"
        raise Fail(msg)
    bin_dir = Path("/tmp/gpuforge-cosign")
    bin_dir.mkdir(exist_ok=True)
    sh(f"xz -dc {shlex.quote(str(PROOF / 'cosign.xz'))} > {bin_dir / 'cosign'} && chmod +x {bin_dir / 'cosign'}", check=True)
    state = Path("/tmp/gpuforge-proof-state")
    shutil.rmtree(state, ignore_errors=True)
    shutil.copytree(PROOF / "state", state)
    rec = json.loads((state / "builds.json").read_text())["builds"][tid]
    os.environ.update({"PATH": f"{bin_dir}:{os.environ['PATH']}", "GPUFORGE_STATE_DIR": str(state),
                       "GPUFORGE_COSIGN_KEY": str(PROOF / "cosign.key"),
                       "COSIGN_PASSWORD": (PROOF / "cosign.password").read_text(),
                       "GPUFORGE_REGISTRY": rec["pushed_ref"].split("/", 1)[0]})
    _openssh_client()
    matrix = ["--matrix", str(PROOF / "matrix.yaml")] if (PROOF / "matrix.yaml").is_file() else []
    res = _timed(out, "bundle", [*G, *matrix, "validate", tid, "--gpu", *GPU, "--bundle", str(out / "gpu.bundle"),
                                 "--reports", str(out / "reports-bundle")])
    res["image_id"] = m["image_id"]
    return res


STEPS = {"smoke": step_smoke, "devel": step_devel, "selftest": step_selftest, "expect": step_expect, "metrics": step_metrics,
         "warm": step_warm, "first": step_first, "perf": step_perf, "ready": step_ready, "faults": step_faults,
         "startup": step_startup, "bundle": step_bundle, "repeat": step_repeat, "perf-train": step_perf_train,
         "autotune": step_autotune, "autotune-artifacts": step_autotune_artifacts}
# `measure` with no step: these (the long runs, repeat, perf-train and autotune, only when named)
ALL = ("smoke", "devel", "selftest", "expect", "metrics", "warm", "first", "perf", "ready", "faults", "startup", "bundle")


def measure(names: list[str]) -> int:
    bad = [n for n in names if n not in STEPS]
    if bad:
        msg = f"unknown step(s) {', '.join(bad)}; known: {', '.join(STEPS)}"
        raise Fail(msg)
    out = Path(os.environ.get("OUT") or "/tmp/gpuforge-out")
    work = out / "raw"
    work.mkdir(parents=True, exist_ok=True)
    smi = ["nvidia-smi", "--query-gpu=name,driver_version,compute_cap,memory.total", "--format=csv,noheader"]
    host = sh(smi, capture_output=True).stdout.strip() if shutil.which("nvidia-smi") else "no nvidia-smi here"
    m = json.loads((META / "manifest.json").read_text())
    summary = {"image": m["image"], "image_id": m["image_id"], "host_gpu": host, "steps": {}}
    for n in names or ALL:
        try:
            summary["steps"][n] = STEPS[n](work)
        except (subprocess.TimeoutExpired, Fail, OSError) as e:
            summary["steps"][n] = {"error": f"{type(e).__name__}: {e}"}
            say(f"{n}: {type(e).__name__}: {e}")
    (work / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    with tarfile.open(out / f"measure-{'-'.join(names) or 'all'}.tar.gz", "w:gz") as t:
        t.add(work, arcname="raw")
    print(json.dumps(summary, indent=1))
    return 0 if all("error" not in s for s in summary["steps"].values()) else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("parts").add_argument("image")
    pr = sub.add_parser("proof")
    pr.add_argument("state_dir")
    pr.add_argument("key")
    sub.add_parser("setup")
    sub.add_parser("part").add_argument("n")
    sub.add_parser("import")
    sub.add_parser("measure").add_argument("steps", nargs="*")
    sub.add_parser("cdi-spec", help="print the CDI spec this host gets (tools/gpu_run.sh writes it too)")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "parts":
            return parts(args.image)
        if args.cmd == "proof":
            return proof(args.state_dir, args.key)
        if args.cmd == "setup":
            return setup()
        if args.cmd == "part":
            return part(args.n)
        if args.cmd == "import":
            return import_image()
        if args.cmd == "cdi-spec":
            print(CDI_SPEC, end="")
            return 0
        return measure(args.steps)
    except Fail as e:
        print(f"gpu_carry: error: {e}", file=sys.stderr)
        return 1
    except subprocess.CalledProcessError as e:
        print(f"gpu_carry: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
