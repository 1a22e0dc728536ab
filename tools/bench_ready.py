"""Cold start by readiness: what a user waits for, from the moment the container is asked for, on an engine
with no layers, with the registry behind a shaped link. Three ways to ship one image, side by side in one run:

  gzip   the image's layers gzip-compressed, pulled whole, unpacked by containerd's overlayfs snapshotter
  zstd   the same layers zstd-compressed, pulled whole, overlayfs
  soci   the gzip image plus a SOCI index, pulled lazily by the SOCI snapshotter (FUSE): files fetched when read

    nox -s bench -- --ready [--rounds N] [--rates 1gbit,200mbit]   (or: python tools/bench_ready.py ...)

Every run starts a new private containerd (and SOCI snapshotter) on empty roots: nothing cached, the SOCI index too
(the snapshotter finds it in the registry through the referrers tag `soci push` leaves). The registry
(docker-registry, TLS with a certificate of the run's own: soci 0.4.1 fetches indexes over https only, and over
plain http falls back to a whole pull) lives in a network namespace of the benchmark's own; its link is shaped with
tc's token bucket (tbf: this kernel has no netem). A run times, from the pull's start: the pull (for soci, the lazy one), then inside
one container of the image (`ctr run`: containerd's own client, the same for the three ways) the first
`import torch`, the first compiled inference (torch.compile of an MLP, on the CPU here), and a Jupyter kernel
answering (jupyter_client's start_new_kernel). The bytes the registry sent before each mark are read from the link's
counters: the startup working set, as a share of the image's compressed size.

No silent fallback: a soci run must show the snapshotter's FUSE mounts while its container runs and must have read
less than the whole image before it is ready, else it is reported as fallen back and its figures are refused.
Prints best of N with the spread per way and rate, the ratios to gzip, and a verdict per way; --json keeps it all.
Needs root, containerd, soci-snapshotter (Debian trixie's 0.4.1), docker-registry, skopeo, ~30 GB under /var/tmp;
removes everything on exit, also after a failure or Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import ready_probe  # beside this script

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from gpuforge.plan.target import ImageRef  # after the path set-up above
from gpuforge.push import soci
from gpuforge.registry.client import ANONYMOUS

LAB = Path("/var/tmp/gfready")
RUN = Path("/run/gfready")
NS, HOST_IF, NS_IF = "gfready", "gfready0", "gfready1"
HOST_IP, REG_IP, PORT = "10.78.0.1", "10.78.0.2", 5000
REPO = f"{REG_IP}:{PORT}/bench/pytorch"
CERT = LAB / "reg.crt"
HOST_CA = Path("/etc/docker/certs.d") / f"{REG_IP}:{PORT}" / "ca.crt"  # where gpuforge's registry clients find its CA
SOCI_ROOT = soci.SOCI_ROOT  # the soci CLI's own store (not settable in 0.4.1): the snapshotter runs on it too
TLS_ENV = {**os.environ, "SSL_CERT_FILE": str(CERT)}
CTD_NS = "gfready"
WAYS = ("gzip", "zstd", "soci")
MARKS = ("pulled", "import_torch", "compiled_inference", "jupyter_kernel")

PROBE = ready_probe.PROBE  # the milestones inside the container (tools/ready_probe.py)


class Fail(Exception):
    pass


def say(msg: str) -> None:
    print(f"bench_ready: {msg}", flush=True)


def sh(*argv: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run(list(argv), capture_output=True, text=True, **kw)
    if check and r.returncode != 0:
        msg = f"{' '.join(argv[:6])} ... failed ({r.returncode}): {(r.stderr or r.stdout)[-1500:]}"
        raise Fail(msg)
    return r


def rx_bytes() -> int:
    """Bytes the registry's side has sent to this host so far (the host end of the link receives them)."""
    return int(Path(f"/sys/class/net/{HOST_IF}/statistics/rx_bytes").read_text())


class Lab:
    """The namespace, the shaped link, the registry, and a private containerd + SOCI snapshotter."""

    def __init__(self) -> None:
        self.procs: dict[str, subprocess.Popen] = {}

    # --- network and registry -----------------------------------------------------------------------------------
    def up(self) -> None:
        self.down()
        for d in (LAB, RUN):
            d.mkdir(parents=True, exist_ok=True)
        sh("ip", "netns", "add", NS)
        sh("ip", "link", "add", HOST_IF, "type", "veth", "peer", "name", NS_IF)
        sh("ip", "link", "set", NS_IF, "netns", NS)
        sh("ip", "addr", "add", f"{HOST_IP}/24", "dev", HOST_IF)
        sh("ip", "link", "set", HOST_IF, "up")
        sh("ip", "-n", NS, "addr", "add", f"{REG_IP}/24", "dev", NS_IF)
        sh("ip", "-n", NS, "link", "set", NS_IF, "up")
        sh("ip", "-n", NS, "link", "set", "lo", "up")
        # TLS: soci 0.4.1 fetches its index and zTOCs over https only (plain http falls back to a whole pull)
        sh("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=gfready-registry",
           "-addext", f"subjectAltName=IP:{REG_IP}", "-keyout", str(LAB / "reg.key"), "-out", str(CERT))
        cfg = LAB / "registry.yml"
        cfg.write_text(f"version: 0.1\nlog: {{level: error, accesslog: {{disabled: true}}}}\n"
                       f"storage: {{filesystem: {{rootdirectory: {LAB / 'registry'}}}, delete: {{enabled: true}}}}\n"
                       f"http: {{addr: '{REG_IP}:{PORT}', tls: {{certificate: {CERT}, key: {LAB / 'reg.key'}}}}}\n")
        HOST_CA.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(CERT, HOST_CA)
        self._start("registry", ["ip", "netns", "exec", NS, "docker-registry", "serve", str(cfg)])
        self._wait(lambda: sh("curl", "-sf", "--cacert", str(CERT), f"https://{REG_IP}:{PORT}/v2/",
                              check=False).returncode == 0, "registry")

    def shape(self, rate: str | None) -> None:
        """The registry's sending side at `rate` (tbf), or unshaped (None: pushes and set-up)."""
        sh("tc", "-n", NS, "qdisc", "del", "dev", NS_IF, "root", check=False)
        if rate:
            sh("tc", "-n", NS, "qdisc", "add", "dev", NS_IF, "root", "tbf", "rate", rate, "burst", "512kb",
               "latency", "100ms")

    # --- containerd ---------------------------------------------------------------------------------------------
    def engine(self) -> None:
        """A new containerd and SOCI snapshotter on empty roots."""
        self.stop_engine()
        (RUN).mkdir(parents=True, exist_ok=True)
        (LAB / "containerd.toml").write_text(CONTAINERD_CONFIG)
        self._start("soci", ["soci-snapshotter-grpc", "-root", str(SOCI_ROOT), "-address", str(RUN / "soci.sock"),
                             "-log-level", "info"], log=LAB / "soci.log", env=TLS_ENV)
        self._wait(lambda: (RUN / "soci.sock").exists(), "soci-snapshotter-grpc")
        self._start("containerd", ["containerd", "--config", str(LAB / "containerd.toml")], log=LAB / "containerd.log")
        self._wait(lambda: sh("ctr", "-a", str(RUN / "containerd.sock"), "version", check=False).returncode == 0,
                   "containerd")

    def stop_engine(self) -> None:
        for name in ("containerd", "soci"):
            p = self.procs.pop(name, None)
            if p and p.poll() is None:
                p.terminate()
                try:
                    p.wait(20)
                except subprocess.TimeoutExpired:
                    p.kill()
        for line in reversed(Path("/proc/mounts").read_text().splitlines()):  # innermost first
            point = line.split()[1]
            if point.startswith((str(LAB / "ctd"), str(SOCI_ROOT), str(RUN))) and point != str(RUN):
                sh("umount", "-l", point, check=False)
        shutil.rmtree(LAB / "ctd", ignore_errors=True)
        shutil.rmtree(SOCI_ROOT, ignore_errors=True)  # its index store too: each run fetches the index itself
        for s in ("containerd.sock", "containerd.sock.ttrpc", "soci.sock"):
            (RUN / s).unlink(missing_ok=True)

    def down(self) -> None:
        self.stop_engine()
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
        self.procs.clear()
        sh("pkill", "-f", f"docker-registry serve {LAB}", check=False)
        sh("ip", "netns", "del", NS, check=False)
        sh("ip", "link", "del", HOST_IF, check=False)
        shutil.rmtree(HOST_CA.parent, ignore_errors=True)

    def _start(self, name: str, argv: list[str], log: Path | None = None, env: dict | None = None) -> None:
        out = open(log or LAB / f"{name}.log", "ab")
        self.procs[name] = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env)

    def _wait(self, ready, what: str, timeout: float = 60) -> None:
        t_end = time.monotonic() + timeout
        while time.monotonic() < t_end:
            if ready():
                return
            time.sleep(0.2)
        msg = f"{what} did not come up in {timeout:.0f} s (logs under {LAB})"
        raise Fail(msg)

    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return sh("ctr", "-a", str(RUN / "containerd.sock"), "-n", CTD_NS, *args, check=check)

    def soci(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return sh("soci", "-a", str(RUN / "containerd.sock"), "-n", CTD_NS, *args, check=check, env=TLS_ENV)


CONTAINERD_CONFIG = f"""version = 2
root = "{LAB}/ctd"
state = "{RUN}/ctd-state"
[grpc]
  address = "{RUN}/containerd.sock"
[proxy_plugins]
  [proxy_plugins.soci]
    type = "snapshot"
    address = "{RUN}/soci.sock"
[plugins."io.containerd.grpc.v1.cri"]
  disable = true
"""


# --- the image in three ways ---------------------------------------------------------------------------------------

def publish(lab: Lab, image: str) -> dict:
    """The image in the registry as gzip and zstd (skopeo, from the engine), and a SOCI index of the gzip one."""
    refs = {"gzip": f"{REPO}:gzip", "zstd": f"{REPO}:zstd"}
    tls = ["--dest-cert-dir", str(LAB / "certs.d")]
    (LAB / "certs.d").mkdir(exist_ok=True)
    shutil.copy2(CERT, LAB / "certs.d" / "ca.crt")
    t0 = time.monotonic()
    sh("skopeo", "copy", "--quiet", *tls, "--digestfile", str(LAB / "gzip.digest"), f"docker-daemon:{image}",
       f"docker://{refs['gzip']}")
    gzip_digest = (LAB / "gzip.digest").read_text().strip()
    say(f"pushed gzip: {time.monotonic() - t0:.0f} s")
    # skopeo 1.9 keeps gzip layers when a docker-daemon source goes straight to zstd: through an OCI layout it recompresses
    t0 = time.monotonic()
    layout = LAB / "oci-zstd"
    sh("skopeo", "copy", "--quiet", "-f", "oci", "--dest-compress-format", "zstd", f"docker-daemon:{image}",
       f"oci:{layout}:zstd")
    sh("skopeo", "copy", "--quiet", "--preserve-digests", *tls, f"oci:{layout}:zstd", f"docker://{refs['zstd']}")
    shutil.rmtree(layout, ignore_errors=True)
    say(f"pushed zstd: {time.monotonic() - t0:.0f} s")
    t0 = time.monotonic()  # the SOCI index as `gpuforge push --compression soci` makes it: the same code
    index = soci.index_pushed(ImageRef.parse(refs["gzip"]), gzip_digest, ANONYMOUS, LAB, LAB / "soci-index.log").digest
    say(f"SOCI index {index[:19]} made and pushed (gpuforge.push.soci): {time.monotonic() - t0:.0f} s")
    sizes = {w: compressed_size(r) for w, r in refs.items()}
    if sizes["zstd"] >= sizes["gzip"]:
        msg = f"the zstd image is not smaller ({sizes}): its layers were not recompressed"
        raise Fail(msg)
    return {"refs": refs, "soci_index": index, "sizes": sizes}


def compressed_size(ref: str) -> int:
    doc = json.loads(sh("skopeo", "inspect", "--cert-dir", str(LAB / "certs.d"), "--raw", f"docker://{ref}").stdout)
    return sum(layer["size"] for layer in doc["layers"])


# --- one run -------------------------------------------------------------------------------------------------------

def one_run(lab: Lab, way: str, pub: dict, rate: str) -> dict:
    lab.engine()
    lab.shape(rate)
    ref = pub["refs"]["zstd" if way == "zstd" else "gzip"]
    snap = "soci" if way == "soci" else "overlayfs"
    b0, t0 = rx_bytes(), time.time()
    marks: dict[str, dict] = {}
    try:
        if way == "soci":  # no digest given: it finds the index in the registry, as a user's pull does
            lab.soci("image", "rpull", "--tlscacert", str(CERT), ref)
        else:
            lab.ctr("images", "pull", "--tlscacert", str(CERT), ref)
        marks["pulled"] = {"s": time.time() - t0, "bytes": rx_bytes() - b0}
        fuse: list[int] = []
        p = subprocess.Popen(["ctr", "-a", str(RUN / "containerd.sock"), "-n", CTD_NS, "run", "--rm", "--snapshotter",
                              snap, "--env", "JUPYTER_RUNTIME_DIR=/tmp/jr", ref, f"gfready-{way}",
                              "python3", "-c", PROBE], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        watch = threading.Thread(target=_count_fuse, args=(p, fuse), daemon=True)
        watch.start()
        for line in p.stdout:
            with contextlib.suppress(json.JSONDecodeError, KeyError):
                m = json.loads(line)
                marks[m["mark"]] = {"s": m["t"] - t0, "bytes": rx_bytes() - b0}
        err = p.stderr.read()
        rc = p.wait(600)
        watch.join(5)
        remote = _remote_snapshots(lab) if way == "soci" else 0
    finally:
        lab.shape(None)
    missing = [m for m in MARKS if m not in marks]
    res = {"way": way, "rate": rate, "marks": marks, "rc": rc, "fuse_mounts_max": max(fuse or [0]),
           "remote_snapshots": remote,
           "image_bytes": pub["sizes"]["zstd" if way == "zstd" else "gzip"]}
    if rc != 0 or missing:
        res["error"] = f"exit {rc}, marks missing {missing}: {err[-1500:]}"
    elif way == "soci":  # no silent fallback: lazily served, and less than the image read before ready
        ready = marks["jupyter_kernel"]["bytes"]
        if not remote or res["fuse_mounts_max"] == 0 or ready >= 0.95 * res["image_bytes"]:
            res["error"] = (f"fell back: {remote} remote snapshots, {res['fuse_mounts_max']} FUSE mounts, "
                            f"{ready / res['image_bytes']:.0%} of the image read before ready")
    lab.stop_engine()
    return res


def _remote_snapshots(lab: Lab) -> int:
    """Snapshots the SOCI snapshotter prepared as remote (lazily served) ones, by their containerd label."""
    names = [ln.split()[0] for ln in lab.ctr("snapshots", "--snapshotter", "soci", "ls").stdout.splitlines()[1:] if ln]
    return sum('"containerd.io/snapshot/remote"' in lab.ctr("snapshots", "--snapshotter", "soci", "info", n,
                                                             check=False).stdout for n in names)


def _count_fuse(p: subprocess.Popen, out: list[int]) -> None:
    """How many of the SOCI snapshotter's FUSE mounts exist, sampled while the container runs."""
    while p.poll() is None:
        mounts = Path("/proc/mounts").read_text().splitlines()
        out.append(sum(1 for ln in mounts if " fuse" in ln and str(SOCI_ROOT) in ln))
        time.sleep(0.5)


# --- the table ---------------------------------------------------------------------------------------------------

def summarize(runs: list[dict], rates: list[str]) -> dict:
    table: dict = {}
    for rate in rates:
        for way in WAYS:
            good = [r for r in runs if r["rate"] == rate and r["way"] == way and "error" not in r]
            row: dict = {"n": len(good), "refused": sum(1 for r in runs if r["rate"] == rate and r["way"] == way
                                                           and "error" in r)}
            for m in MARKS:
                xs = [r["marks"][m]["s"] for r in good]
                if xs:
                    row[m] = {"best": round(min(xs), 1), "spread": round(max(xs) - min(xs), 1)}
            if good:
                best = min(good, key=lambda r: r["marks"]["jupyter_kernel"]["s"])
                row["working_set"] = round(best["marks"]["jupyter_kernel"]["bytes"] / best["image_bytes"], 3)
            table.setdefault(rate, {})[way] = row
    return table


def verdicts(table: dict) -> dict[str, str]:
    out = {}
    for way in WAYS[1:]:
        says = []
        for rate, rows in table.items():
            g, w = rows["gzip"], rows[way]
            if "jupyter_kernel" not in g or "jupyter_kernel" not in w:
                says.append(f"{rate}: not measured")
                continue
            r = {m: g[m]["best"] / w[m]["best"] for m in MARKS[1:]}
            says.append(f"{rate}: ready {r['jupyter_kernel']:.2f}x gzip's (import torch {r['import_torch']:.2f}x, "
                        f"compiled inference {r['compiled_inference']:.2f}x)")
        out[way] = "; ".join(says)
    return out


def print_table(table: dict, sizes: dict, verdict: dict) -> None:
    print(f"\n{'rate':8} {'way':5} {'pulled':>14} {'import torch':>14} {'compiled inf.':>14} {'kernel ready':>14} "
          f"{'working set':>12}  n")
    for rate, rows in table.items():
        for way, row in rows.items():
            cells = [f"{row[m]['best']:6.1f} ±{row[m]['spread']:4.1f}" if m in row else f"{'-':>11}" for m in MARKS]
            ws = f"{row['working_set']:.0%}" if "working_set" in row else "-"
            print(f"{rate:8} {way:5} {'  '.join(f'{c:>12}' for c in cells)} {ws:>12}  {row['n']}"
                  + (f" ({row['refused']} refused)" if row["refused"] else ""))
    print("compressed: " + ", ".join(f"{w} {s / 1e9:.2f} GB" for w, s in sizes.items()))
    for way, text in verdict.items():
        print(f"verdict {way}: {text}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--image", help="the image (default: the default target's last build)")
    ap.add_argument("--rounds", type=int, default=2, help="runs per way and rate (best of N)")
    ap.add_argument("--rates", default="1gbit,200mbit", help="link rates (tc tbf), comma-separated")
    ap.add_argument("--json", help="write every run and the table here")
    ap.add_argument("--ready", action="store_true", help="accepted for `nox -s bench -- --ready`")
    args = ap.parse_args()
    if args.rounds < 1:
        sys.exit("bench_ready: --rounds must be at least 1")
    for tool in ("containerd", "ctr", "soci", "soci-snapshotter-grpc", "docker-registry", "skopeo", "tc", "openssl"):
        if not shutil.which(tool):
            sys.exit(f"bench_ready: {tool} is not installed (apt-get install containerd soci-snapshotter "
                     "docker-registry skopeo iproute2)")
    image = args.image or default_image()
    rates = [r.strip() for r in args.rates.split(",") if r.strip()]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(130))
    lab = Lab()
    runs: list[dict] = []
    try:
        lab.up()
        pub = publish(lab, image)
        for n in range(args.rounds):
            for rate in rates:
                ways = WAYS if n % 2 == 0 else tuple(reversed(WAYS))  # interleaved, order alternating
                for way in ways:
                    r = one_run(lab, way, pub, rate)
                    runs.append(r)
                    got = ", ".join(f"{m} {v['s']:.1f} s" for m, v in r["marks"].items())
                    say(f"round {n + 1} {rate} {way}: {got}" + (f" — REFUSED: {r['error'][:300]}" if "error" in r else ""))
    finally:
        lab.down()
        shutil.rmtree(LAB, ignore_errors=True)
    table = summarize(runs, rates)
    verdict = verdicts(table)
    print_table(table, pub["sizes"], verdict)
    if args.json:
        Path(args.json).write_text(json.dumps({"image": image, "published": pub, "runs": runs, "table": table,
                                               "verdict": verdict}, indent=1) + "\n")
    return 0


def default_image() -> str:
    """The default target's image id as the last `gpuforge build` recorded it."""
    from gpuforge import options
    from gpuforge.plan.matrix import load_matrix
    from gpuforge.state.records import Records

    t = load_matrix().select(None)[0]
    records = Records(Path(options.resolve_one(options.SETTINGS["state_dir"]).value))  # gpuforge's own resolution
    return records.require_build(t.id).image_id


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Fail as e:
        sys.exit(f"bench_ready: error: {e}")
    except KeyboardInterrupt:
        sys.exit(130)
