"""The image's HEALTHCHECK: does the server of the container's mode answer? Exit 0 healthy, 1 not (the engine
reserves 2), and one line saying what was asked and what answered (`docker inspect` keeps the last five).

    HEALTHCHECK ... CMD ["/opt/venv/bin/python3", "-I", "-S", "/opt/gpuforge/programs/health.py"]

The engine runs it as the container's user, with the container's environment, every interval. It reads what the
entrypoint recorded for this start (the mode it resolved, then where its servers listen) in
$TMPDIR/gpuforge-health-<uid>/state, and asks on the container's own addresses only (loopback for a server that
listens on every address), with the standard library only (-I -S: nothing from a user's site or PYTHON* variables):

  jupyter   GET <base_url>api/status with the server's token, from the jpserver-<pid>.json the server wrote in
            its runtime dir: 200 (an API handler that does not count as activity, so a culler still sees idle)
  ssh       a TCP connect to sshd's listen address and its "SSH-" identification line
  metrics   GET /metrics: 200 with gpuforge_metrics_up in it
  GPUFORGE_METRICS_PORT beside any mode: that exporter, as in the metrics mode, on top of the mode's own check
  shell, selftest, `jupyter <subcommand>` and any other command: nothing is checked; healthy
A server mode whose server has not been started yet (the preflight or a warm start still runs) is not healthy yet.
With no state (an entrypoint replaced by --entrypoint) nothing is known to check: healthy, said so.
"""

from __future__ import annotations

import contextlib
import glob
import http.client
import json
import os
import socket
import ssl
import sys
import time

SERVER_MODES = ("jupyter", "ssh", "metrics")
PROBE_TIMEOUT = 2.0  # seconds per question; the probes of one run share BUDGET, under the HEALTHCHECK's --timeout
BUDGET = 4.0


class Unhealthy(Exception):
    pass


def state_path(environ=os.environ, uid: int | None = None) -> str:
    tmp = environ.get("TMPDIR") or "/tmp"
    return os.path.join(tmp, f"gpuforge-health-{os.getuid() if uid is None else uid}", "state")


def read_state(path: str) -> dict[str, str] | None:
    """The entrypoint's key=value lines; None when there are none. A folder or file that another uid owns or may
    write is refused: the verdict must rest on what this container's own entrypoint wrote."""
    try:
        st_dir, st = os.lstat(os.path.dirname(path)), os.lstat(path)
    except FileNotFoundError:
        return None
    for what, s in (("folder", st_dir), ("file", st)):
        if s.st_uid != os.getuid() or s.st_mode & 0o022:
            msg = f"the state {what} of {path} is not this uid's own (uid {s.st_uid}, mode {oct(s.st_mode & 0o777)})"
            raise Unhealthy(msg)
    with open(path, encoding="utf-8", errors="replace") as f:
        return dict(line.rstrip("\n").partition("=")[::2] for line in f if "=" in line)


def loopback(addr: str) -> str:
    """The address to ask for a server that listens on `addr`: loopback for every-address binds."""
    addr = addr.strip("[]")
    if addr in ("", "*", "0.0.0.0", "localhost"):
        return "127.0.0.1"
    return "::1" if addr == "::" else addr


def proc_state(pid: int) -> str:
    """The process's state letter (R, S, T stopped, Z zombie...), '' when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.unix_path)


def http_get(host: str, port: int, path: str, *, timeout: float, headers: dict | None = None,
             secure: bool = False, unix: str = "") -> tuple[int, bytes]:
    if unix:
        conn: http.client.HTTPConnection = _UnixHTTPConnection(unix, timeout)
    elif secure:  # the server's own certificate, asked on its own address: nothing to verify it against
        ctx = ssl.create_default_context()
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        conn = http.client.HTTPSConnection(host, port, timeout=timeout, context=ctx)
    else:
        conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", path, headers=headers or {})
        r = conn.getresponse()
        return r.status, r.read(1 << 20)
    finally:
        conn.close()


def _asked(what: str, call, timeout: float, stopped_pid: int = 0):
    try:
        return call()
    except TimeoutError:
        why = f"no answer in {timeout:.1f} s"
    except OSError as e:
        why = e.strerror or type(e).__name__
    except http.client.HTTPException as e:  # an answer that is not HTTP
        why = f"{type(e).__name__}: {e}"[:200]
    if stopped_pid and proc_state(stopped_pid) == "T":
        why += f" (pid {stopped_pid} is stopped)"
    msg = f"{what}: {why}"
    raise Unhealthy(msg)


# --- the servers ---------------------------------------------------------------------------------------------

def jupyter_servers(runtime_dir: str, main_pid: int) -> list[dict]:
    """The jpserver-<pid>.json files of servers still running; the mode's own server alone when it is among them
    (a server killed hard leaves its file behind; a server a user started from a kernel writes one too)."""
    live = []
    for path in sorted(glob.glob(os.path.join(runtime_dir, "jpserver-*.json"))):
        try:
            with open(path) as f:
                info = json.load(f)
        except (OSError, ValueError):
            continue
        pid = int(info.get("pid") or 0)
        if pid and proc_state(pid) not in ("", "Z"):
            live.append(info)
    own = [i for i in live if int(i.get("pid") or 0) == main_pid]
    return own or live


def check_jupyter(state: dict[str, str], timeout: float) -> str:
    runtime_dir = state.get("jupyter_runtime_dir", "")
    if not runtime_dir:
        msg = "jupyter: the server has not been started yet"
        raise Unhealthy(msg)
    servers = jupyter_servers(runtime_dir, int(state.get("pid") or 0))
    if not servers:
        msg = f"jupyter: no running server has a jpserver-<pid>.json in {runtime_dir}"
        raise Unhealthy(msg)
    info = servers[0]
    token = info.get("token") or ""
    # /api/status needs the token (it proves the server's auth answers too); with a password and no token, /api
    path = (info.get("base_url") or "/").rstrip("/") + ("/api/status" if token or not info.get("password") else "/api")
    headers = {"Authorization": f"token {token}"} if token else {}
    host, port, unix = loopback(str(info.get("hostname", ""))), int(info.get("port") or 0), info.get("sock") or ""
    where = f"unix:{unix}{path}" if unix else f"{'https' if info.get('secure') else 'http'}://{host}:{port}{path}"
    t0 = time.monotonic()
    status, _ = _asked(f"jupyter: GET {where}", lambda: http_get(host, port, path, timeout=timeout, headers=headers,
                                                                 secure=bool(info.get("secure")), unix=unix),
                       timeout, int(info.get("pid") or 0))
    if status != 200:
        msg = f"jupyter: GET {where} answered {status}"
        raise Unhealthy(msg)
    return f"jupyter: GET {where} answered 200 in {(time.monotonic() - t0) * 1000:.0f} ms"


def check_ssh(state: dict[str, str], timeout: float) -> str:
    listen = state.get("ssh_listen", "").split()
    if not listen:
        msg = "ssh: sshd has not been started yet"
        raise Unhealthy(msg)
    # sshd -T's listen addresses: one on every address is asked on loopback, IPv4 first
    anywhere = [a for a in listen if a.rpartition(":")[0] in ("0.0.0.0", "[::]")]
    addr, _, port = sorted(anywhere, key=lambda a: a.startswith("["))[0].rpartition(":") if anywhere else listen[0].rpartition(":")
    host = loopback(addr)
    t0 = time.monotonic()

    def banner() -> bytes:
        with socket.create_connection((host, int(port)), timeout=timeout) as s:
            got = b""
            while b"\n" not in got and len(got) < 256:
                chunk = s.recv(256)
                if not chunk:
                    break
                got += chunk
            if got.startswith(b"SSH-"):
                # answered in kind and closed in order, sshd logs one line for the probe (two for a silent close)
                with contextlib.suppress(OSError):
                    s.sendall(b"SSH-2.0-gpuforge-health\r\n")
                    s.shutdown(socket.SHUT_WR)
                    s.settimeout(0.5)
                    while s.recv(4096):
                        pass
            return got

    got = _asked(f"ssh: {host} port {port}", banner, timeout, int(state.get("pid") or 0))
    if not got.startswith(b"SSH-"):
        msg = f"ssh: {host} port {port} accepted but sent no SSH identification ({got[:40]!r})"
        raise Unhealthy(msg)
    line = got.split(b"\n", 1)[0].strip().decode("ascii", "replace")
    return f"ssh: {host} port {port} sent {line} in {(time.monotonic() - t0) * 1000:.0f} ms"


def check_metrics(state: dict[str, str], timeout: float) -> str:
    port = state.get("metrics_port", "")
    if not port:
        msg = "metrics: the exporter has not been started yet"
        raise Unhealthy(msg)
    host = loopback(state.get("metrics_addr", ""))
    own = int(state.get("pid") or 0) if state.get("mode") == "metrics" else 0  # an exporter beside runs under another
    t0 = time.monotonic()
    status, body = _asked(f"metrics: GET http://{host}:{port}/metrics",
                          lambda: http_get(host, int(port), "/metrics", timeout=timeout), timeout, own)
    if status != 200 or b"gpuforge_metrics_up" not in body:
        msg = f"metrics: GET http://{host}:{port}/metrics answered {status} without gpuforge_metrics_up"
        raise Unhealthy(msg)
    return f"metrics: GET http://{host}:{port}/metrics answered 200 in {(time.monotonic() - t0) * 1000:.0f} ms"


CHECKS = {"jupyter": check_jupyter, "ssh": check_ssh, "metrics": check_metrics}


def verdict(state: dict[str, str] | None) -> tuple[int, str]:
    if state is None:
        return 0, "no mode recorded by the entrypoint (was it replaced?): nothing to check"
    mode = state.get("mode", "")
    checks = [mode] if mode in SERVER_MODES else []
    if mode != "metrics" and "metrics_port" in state:  # GPUFORGE_METRICS_PORT: the exporter beside the mode
        checks.append("metrics")
    if not checks:
        return 0, f"{mode or 'unknown'} mode: no server to check"
    deadline = time.monotonic() + BUDGET
    said = []
    for name in checks:
        timeout = max(0.2, min(PROBE_TIMEOUT, deadline - time.monotonic()))
        try:
            said.append(CHECKS[name](state, timeout))
        except Unhealthy as e:
            return 1, "; ".join([*said, str(e)])
    return 0, "; ".join(said)


def main() -> int:
    try:
        rc, line = verdict(read_state(state_path()))
    except Unhealthy as e:
        rc, line = 1, str(e)
    except OSError as e:
        rc, line = 1, f"cannot read the health state: {e}"
    print(line, flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
