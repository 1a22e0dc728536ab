"""Another CI runner on this machine, for the registry-cache test and benchmark: a second dockerd with an
empty data root, a loopback docker-registry between the runners, a snapshot of the checkout both build
from, and BuildKit's plain step log read back (which RUN steps came from the cache).

Shared by tests/integration/builder/test_buildx.py and tools/bench_build.py; no pytest here (failures raise
StartError, the callers decide whether that skips, fails or aborts).
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import docker

DOCKER = "/usr/bin/docker"
# The modern engine of the engine matrix: Debian trixie's dockerd and the containerd it manages,
# unpacked (`apt-get download` + `dpkg -x`) into a private folder so the machine's engine stays 20.10.
TRIXIE_ENGINE = ("docker.io=26.1.5+dfsg1-9+deb13u1+b1", "containerd=1.7.24~ds1-6+deb13u1")
ENGINE_DIR = Path("/var/tmp/gpuforge-engine-26.1.5")
# what a dockerd needs to keep images in containerd (snapshotters) instead of its own graphdriver
CONTAINERD_STORE = {"features": {"containerd-snapshotter": True}}
# what a runner's checkout does not carry (caches, venvs, local state); both runners build one snapshot
CHECKOUT_IGNORE = (".git", ".nox", ".gpuforge", "reports", "__pycache__", "*.egg-info", ".venv", "build")


class StartError(RuntimeError):
    """A helper process did not come up; the message ends with the tail of its log."""


def trixie_engine(dest: Path = ENGINE_DIR) -> Path:
    """The root of an unpacked trixie dockerd 26.1.5 + containerd 1.7.24 (usr/sbin/dockerd, usr/bin/containerd),
    downloaded once per machine (56 MB; needs the trixie apt source tools/start-engine.sh adds)."""
    root = dest / "root"
    if (root / "usr/sbin/dockerd").is_file():
        return root
    tmp = Path(tempfile.mkdtemp(prefix=f"{dest.name}.", dir=dest.parent))
    try:
        r = subprocess.run(["apt-get", "download", *TRIXIE_ENGINE], cwd=tmp, capture_output=True, text=True)
        if r.returncode != 0:
            msg = (f"apt-get download {' '.join(TRIXIE_ENGINE)} failed (is trixie an apt source? tools/start-engine.sh "
                   f"adds it): {(r.stderr or r.stdout).strip()[-500:]}")
            raise StartError(msg)
        for deb in sorted(tmp.glob("*.deb")):
            subprocess.run(["dpkg", "-x", str(deb), str(tmp / "root")], check=True, capture_output=True)
            deb.unlink()
        try:
            tmp.rename(dest)  # atomic: a concurrent run either sees the whole folder or makes its own
        except OSError:
            if not (root / "usr/sbin/dockerd").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return root


def free_port(ports: range) -> int:
    for p in ports:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", p))
            except OSError:
                continue
            return p
    msg = f"no free port in {ports.start}-{ports.stop - 1}"
    raise StartError(msg)


def checkout_snapshot(root: Path, dest: Path) -> Path:
    """A copy of the working tree, as two runners check out one commit (others may edit the live tree)."""
    return Path(shutil.copytree(root, dest, ignore=shutil.ignore_patterns(*CHECKOUT_IGNORE)))


def matrix_copy(root: Path, dest: Path, registry: str, repository: str) -> Path:
    """The project matrix with another registry and repository (same targets, same generated files):
    builds from it move no shared tag."""
    text = re.sub(r"^registry: .*$", f"registry: {registry}", (root / "matrix.yaml").read_text(), count=1, flags=re.M)
    text = re.sub(r"^repository: .*$", f"repository: {repository}", text, count=1, flags=re.M)
    dest.write_text(text)
    return dest


def run_steps(log: str) -> dict[str, bool]:
    """BuildKit plain-progress log -> {RUN step header: CACHED?}."""
    heads = dict(re.findall(r"^(#\d+) \[[^\]]*\] (RUN .*)$", log, re.M))
    return {head: bool(re.search(rf"^{num} CACHED$", log, re.M)) for num, head in heads.items()}


def end(proc: subprocess.Popen, timeout: float) -> None:
    """Stop a child: SIGTERM, then SIGKILL if it is still there after `timeout` seconds."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class Registry:
    """Debian's docker-registry on 127.0.0.1:port (plain HTTP, deletes on); `config` adds YAML (e.g. auth)."""

    def __init__(self, d: Path, port: int, config: str = ""):
        exe = shutil.which("docker-registry")
        if not exe:
            msg = "docker-registry is not installed (apt-get install docker-registry)"
            raise StartError(msg)
        d.mkdir(parents=True, exist_ok=True)
        (d / "config.yml").write_text(f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {d / 'data'}\n"
                                      f"  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{port}\n{config}")
        self.d, self.host = d, f"127.0.0.1:{port}"
        self.log = open(d / "registry.log", "w")  # closed in stop()
        # a session of its own: Ctrl-C reaches the caller, whose cleanup then stops this
        self.proc = subprocess.Popen([exe, "serve", str(d / "config.yml")], stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        for _ in range(100):
            try:
                urllib.request.urlopen(f"http://{self.host}/v2/", timeout=1)
                return
            except urllib.error.HTTPError:  # 401 from an auth-enabled registry: it is up
                return
            except OSError:
                time.sleep(0.1)
        self.stop()
        msg = f"docker-registry did not start: {(d / 'registry.log').read_text()[-1000:]}"
        raise StartError(msg)

    def stop(self):
        end(self.proc, 30)
        self.log.close()


class SecondEngine:
    """Another dockerd on this machine with its own empty data root under /var/tmp: a second CI runner.

    It gets a bridge of its own: `--bridge=none` would make dockerd delete the shared docker0 interface
    (the first engine's containers and RUN steps then lose their network). It leaves the shared engine's
    iptables chains alone (--iptables=false); `outbound=True` adds only NAT + forward rules for its own
    subnet, so its RUN steps reach the network (a cold build downloads wheels). stop() undoes everything."""

    def __init__(self, *, outbound: bool = False, prefix: str = "gf13-", binaries: Path | None = None,
                 containerd_store: bool = False):
        """`binaries`: the root of another engine's unpacked packages (trixie_engine()), whose usr/sbin and
        usr/bin come first on the daemon's PATH (its managed containerd too); `containerd_store`: keep images
        in containerd's snapshotter, not a graphdriver (the default on new installs of Docker 29)."""
        self.binaries, self.containerd_store = binaries, containerd_store
        # a short path: the socket path must stay under 108 bytes
        self.d = Path(tempfile.mkdtemp(prefix=prefix, dir="/var/tmp"))
        self.sock = self.d / "s.sock"
        self.host = f"unix://{self.sock}"
        # per run (two runs may overlap on one machine): a bridge name and subnet from the temp dir's name
        self.bridge = f"gf{self.d.name[-8:]}"
        net = int(hashlib.sha256(self.d.name.encode()).hexdigest(), 16) % 250 + 1
        self.cidr = f"10.213.{net}.1/24"
        self.subnet = str(ipaddress.ip_interface(self.cidr).network)
        self.rules: list[list[str]] = []  # iptables rules added, each without its -I/-A verb
        self.proc = self.log = None
        try:
            self._start(outbound)
        except BaseException:
            self.stop()
            raise

    def _start(self, outbound: bool) -> None:
        subprocess.run(["ip", "link", "add", self.bridge, "type", "bridge"], check=True, capture_output=True)
        subprocess.run(["ip", "addr", "add", self.cidr, "dev", self.bridge], check=True, capture_output=True)
        if outbound:
            for rule in (["-t", "nat", "POSTROUTING", "-s", self.subnet, "!", "-o", self.bridge, "-j", "MASQUERADE"],
                         ["FORWARD", "-i", self.bridge, "!", "-o", self.bridge, "-j", "ACCEPT"],
                         ["FORWARD", "-o", self.bridge, "-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED",
                          "-j", "ACCEPT"]):
                table, chain = (rule[:2], rule[2:]) if rule[0] == "-t" else ([], rule)
                subprocess.run(["iptables", *table, "-I", *chain], check=True, capture_output=True)
                self.rules.append(rule)
        self.log = open(self.d / "dockerd.log", "w")  # closed in stop()
        # its own config file: the machine's /etc/docker/daemon.json is the shared engine's
        (self.d / "daemon.json").write_text(json.dumps(CONTAINERD_STORE if self.containerd_store else {}))
        env = dict(os.environ)
        exe = "dockerd"
        if self.binaries:
            env["PATH"] = os.pathsep.join([str(self.binaries / "usr/sbin"), str(self.binaries / "usr/bin"), env["PATH"]])
            exe = str(self.binaries / "usr/sbin/dockerd")
        self.proc = subprocess.Popen([exe, "--config-file", str(self.d / "daemon.json"), "--data-root", str(self.d / "data"),
                                      "--exec-root", str(self.d / "x"), "--pidfile", str(self.d / "pid"), "-H", self.host,
                                      f"--bridge={self.bridge}", "--iptables=false", "--ip-masq=false"],
                                     stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        for _ in range(60):
            if subprocess.run([DOCKER, "-H", self.host, "info"], capture_output=True).returncode == 0:
                self.client = docker.DockerClient(base_url=self.host, timeout=600)
                return
            if self.proc.poll() is not None:
                break
            time.sleep(1)
        msg = f"second dockerd did not start: {(self.d / 'dockerd.log').read_text()[-1500:]}"
        raise StartError(msg)

    def describe(self) -> str:
        """Which engine and image store this is, as the engine itself reports them."""
        info = self.client.info()
        status = dict(tuple(p) for p in info.get("DriverStatus") or [] if len(p) == 2)
        store = info.get("Driver")
        if status.get("driver-type") == "io.containerd.snapshotter.v1":
            store = f"containerd/{store}"
        return f"engine {info.get('ServerVersion')}, image store {store}"

    def load(self, image: str) -> None:
        """Copy an image from the shared engine (a bootstrapped base exists only locally)."""
        save = subprocess.Popen([DOCKER, "save", image], stdout=subprocess.PIPE)
        subprocess.run([DOCKER, "-H", self.host, "load", "-q"], stdin=save.stdout, check=True, capture_output=True)
        save.stdout.close()
        if save.wait() != 0:
            msg = f"docker save {image} failed"
            raise StartError(msg)

    def stop(self):
        if self.proc is not None:
            end(self.proc, 60)
        if self.log is not None:
            self.log.close()
        for rule in self.rules:
            table, chain = (rule[:2], rule[2:]) if rule[0] == "-t" else ([], rule)
            subprocess.run(["iptables", *table, "-D", *chain], capture_output=True)
        self.rules = []
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
        # a killed dockerd leaves overlay mounts under its data root: unmount them (deepest first), then remove
        mounts = [ln.split()[1] for ln in Path("/proc/mounts").read_text().splitlines()
                  if ln.split()[1].startswith(f"{self.d}/")]
        for m in sorted(mounts, key=len, reverse=True):
            subprocess.run(["umount", "-l", m], capture_output=True)
        remove_later(self.d)


def remove_later(d: Path) -> None:
    """Remove `d` in a process of its own that nobody waits for: a 26.1.5 engine's data root holds 10-20 GB of
    snapshots, which took its worker 18 s (two workers) to 46 s (three) to unlink, in I/O wait, before its next
    module could start. Renamed first, so no later engine or sweep mistakes it for a live one; if the rename fails,
    it goes in place, as before."""
    gone = d.with_name(f"{d.name}.removing")
    try:
        d.rename(gone)
    except OSError:
        shutil.rmtree(d, ignore_errors=True)
        return
    subprocess.Popen(["rm", "-rf", "--one-file-system", str(gone)], start_new_session=True,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
