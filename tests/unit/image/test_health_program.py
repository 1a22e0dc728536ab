"""images/programs/health.py, the image's HEALTHCHECK: what each mode's verdict rests on, against local stand-ins for
the servers (a Jupyter API that wants its token under its base_url, an sshd that sends its identification line,
the metrics endpoint, and servers that accept a connection but never answer, as a stopped process does); the state
it trusts; the time it may take; and the HEALTHCHECK every generated Dockerfile declares. The real servers are
checked in the image by validators/test_health.py."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gpuforge import paths
from gpuforge.plan.matrix import load_matrix
from gpuforge.render import dockerfile as render

PROG = paths.project_root() / "images" / "programs" / "health.py"
sys.path.insert(0, str(PROG.parent))
import health  # noqa: E402

TOKEN = "a" * 48


@pytest.fixture(autouse=True)
def quick(monkeypatch):
    """Short probes: a server that never answers costs 0.3 s here, not 2 s."""
    monkeypatch.setattr(health, "PROBE_TIMEOUT", 0.3)
    monkeypatch.setattr(health, "BUDGET", 0.8)


def _serve(handler_get) -> int:
    class H(BaseHTTPRequestHandler):
        def do_GET(self):
            status, body = handler_get(self.path, self.headers)
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv.server_address[1]


@pytest.fixture
def silent_port():
    """A port that accepts connections (the kernel's backlog) and never answers: a stopped or hung server."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    yield s.getsockname()[1]
    s.close()


@pytest.fixture
def jupyter_api():
    """Jupyter's /api/status under a base_url: 200 with the token, 403 without it, 404 elsewhere."""
    def get(path, headers):
        if path != "/user/a/api/status":
            return 404, b"{}"
        ok = headers.get("Authorization") == f"token {TOKEN}"
        return (200, b'{"started": "x"}') if ok else (403, b"{}")
    return _serve(get)


def _runtime(tmp_path, **info) -> str:
    d = tmp_path / "runtime"
    d.mkdir(exist_ok=True)
    info = {"hostname": "localhost", "base_url": "/user/a/", "token": TOKEN, "password": False, "secure": False,
            "sock": "", "pid": os.getpid(), **info}
    (d / f"jpserver-{info['pid']}.json").write_text(json.dumps(info))
    return str(d)


def test_shell_and_one_shot_modes_check_nothing_and_are_healthy():
    for mode in ("shell", "selftest", "command"):
        rc, line = health.verdict({"mode": mode})
        assert rc == 0 and "no server to check" in line


def test_no_state_is_healthy_and_says_nothing_was_known():
    rc, line = health.verdict(None)
    assert rc == 0 and "nothing to check" in line


@pytest.mark.parametrize("mode", ["jupyter", "ssh", "metrics"])
def test_a_server_mode_before_its_server_starts_is_not_healthy_yet(mode):
    """The preflight or a warm start still runs: the entrypoint has recorded the mode, not yet where it listens."""
    rc, line = health.verdict({"mode": mode})
    assert rc == 1 and "not been started yet" in line


def test_jupyter_answers_with_its_token_under_its_base_url(tmp_path, jupyter_api):
    state = {"mode": "jupyter", "pid": str(os.getpid()), "jupyter_runtime_dir": _runtime(tmp_path, port=jupyter_api)}
    rc, line = health.verdict(state)
    assert rc == 0, line
    assert f"GET http://127.0.0.1:{jupyter_api}/user/a/api/status answered 200" in line


@pytest.mark.parametrize(("info", "said"), [
    ({"token": "wrong"}, "answered 403"),          # not the server's token
    ({"base_url": "/"}, "answered 404"),          # not where the server serves (Kubeflow's NB_PREFIX)
])
def test_jupyter_asked_otherwise_than_it_serves_is_unhealthy(tmp_path, jupyter_api, info, said):
    state = {"mode": "jupyter", "jupyter_runtime_dir": _runtime(tmp_path, port=jupyter_api, **info)}
    rc, line = health.verdict(state)
    assert rc == 1 and said in line, line


def test_jupyter_that_stopped_answering_is_unhealthy(tmp_path, silent_port):
    rc, line = health.verdict({"mode": "jupyter", "jupyter_runtime_dir": _runtime(tmp_path, port=silent_port)})
    assert rc == 1 and "no answer in 0.3 s" in line, line


def test_a_jpserver_file_left_by_a_dead_server_is_no_server(tmp_path, jupyter_api):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    rc, line = health.verdict({"mode": "jupyter", "jupyter_runtime_dir": _runtime(tmp_path, port=jupyter_api, pid=dead.pid)})
    assert rc == 1 and "no running server" in line


def test_the_modes_own_server_is_asked_before_another_one(tmp_path, jupyter_api, silent_port):
    """A second server (one a user started from a kernel) does not stand in for the mode's own."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        d = _runtime(tmp_path, port=jupyter_api, pid=child.pid)
        _runtime(tmp_path, port=silent_port)  # this process: the mode's own server, which does not answer
        rc, line = health.verdict({"mode": "jupyter", "pid": str(os.getpid()), "jupyter_runtime_dir": d})
    finally:
        child.kill()
    assert rc == 1 and f":{silent_port}/" in line, line


def _sshd(payload: bytes) -> int:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)

    def loop():
        while True:
            c, _ = srv.accept()
            c.sendall(payload)
            c.close()
    threading.Thread(target=loop, daemon=True).start()
    return srv.getsockname()[1]


def test_ssh_reads_sshds_identification_line():
    port = _sshd(b"SSH-2.0-OpenSSH_9.2p1 Debian-2+deb12u10\r\n")
    rc, line = health.verdict({"mode": "ssh", "ssh_listen": f"[::]:{port} 0.0.0.0:{port} "})
    assert rc == 0 and f"127.0.0.1 port {port} sent SSH-2.0-OpenSSH_9.2p1" in line, line


def test_ssh_that_accepts_but_never_sends_its_banner_is_unhealthy(silent_port):
    """A stopped sshd: the kernel still completes the TCP handshake, so a connect alone would call it healthy."""
    rc, line = health.verdict({"mode": "ssh", "ssh_listen": f"0.0.0.0:{silent_port}"})
    assert rc == 1 and "no answer in 0.3 s" in line, line


def test_ssh_port_answered_by_something_else_is_unhealthy():
    port = _sshd(b"HTTP/1.1 400 Bad Request\r\n\r\n")
    rc, line = health.verdict({"mode": "ssh", "ssh_listen": f"0.0.0.0:{port}"})
    assert rc == 1 and "sent no SSH identification" in line, line


def test_metrics_endpoint_answers_with_the_exporters_series():
    port = _serve(lambda path, _: (200, b"gpuforge_metrics_up 0\ngpuforge_gpus 0\n") if path == "/metrics" else (404, b""))
    rc, line = health.verdict({"mode": "metrics", "metrics_addr": "0.0.0.0", "metrics_port": str(port)})
    assert rc == 0 and f"GET http://127.0.0.1:{port}/metrics answered 200" in line, line
    other = _serve(lambda path, _: (200, b"hello\n"))
    rc, line = health.verdict({"mode": "metrics", "metrics_addr": "0.0.0.0", "metrics_port": str(other)})
    assert rc == 1 and "without gpuforge_metrics_up" in line


def test_an_exporter_beside_any_mode_is_checked_too(tmp_path, jupyter_api):
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there: the exporter beside died
    rc, line = health.verdict({"mode": "shell", "metrics_addr": "0.0.0.0", "metrics_port": str(port)})
    assert rc == 1 and "Connection refused" in line, line
    state = {"mode": "jupyter", "jupyter_runtime_dir": _runtime(tmp_path, port=jupyter_api), "metrics_port": str(port)}
    rc, line = health.verdict(state)
    assert rc == 1 and line.startswith("jupyter: GET") and "metrics: GET" in line, line


def test_two_servers_that_never_answer_stay_within_the_budget(tmp_path, silent_port):
    """The probes of one run share BUDGET, so the engine's --timeout never cuts the verdict off."""
    state = {"mode": "jupyter", "jupyter_runtime_dir": _runtime(tmp_path, port=silent_port), "metrics_port": str(silent_port)}
    t0 = time.monotonic()
    rc, _ = health.verdict(state)
    assert rc == 1 and time.monotonic() - t0 < health.BUDGET + 0.3


def _state_file(tmp_path, text: str, mode: int = 0o600):
    d = tmp_path / "tmp" / f"gpuforge-health-{os.getuid()}"
    d.mkdir(parents=True, mode=0o700)
    (d / "state").write_text(text)
    (d / "state").chmod(mode)
    return d / "state"


def test_state_written_by_the_entrypoint_is_read_from_tmpdir(tmp_path):
    path = _state_file(tmp_path, "mode=ssh\npid=7\nssh_listen=[::]:22 0.0.0.0:22 \n")
    assert health.state_path({"TMPDIR": str(tmp_path / "tmp")}) == str(path)
    assert health.read_state(str(path)) == {"mode": "ssh", "pid": "7", "ssh_listen": "[::]:22 0.0.0.0:22 "}


def test_state_others_may_write_is_refused(tmp_path):
    path = _state_file(tmp_path, "mode=shell\n", mode=0o622)
    with pytest.raises(health.Unhealthy, match="not this uid's own"):
        health.read_state(str(path))


def test_run_as_the_healthcheck_runs_it(tmp_path):
    """`python3 -I -S health.py` with the container's environment: the standard library only, one line, exit 0/1."""
    _state_file(tmp_path, "mode=metrics\nmetrics_addr=0.0.0.0\nmetrics_port=1\n")
    r = subprocess.run([sys.executable, "-I", "-S", str(PROG)], capture_output=True, text=True, timeout=30,
                       env={"TMPDIR": str(tmp_path / "tmp"), "PATH": os.environ.get("PATH", "")})
    assert r.returncode == 1 and r.stderr == "" and r.stdout.count("\n") == 1, (r.stdout, r.stderr)
    assert r.stdout.startswith("metrics: GET http://127.0.0.1:1/metrics: Connection refused")


def _healthcheck(df: str) -> dict[str, str]:
    lines = [ln for ln in df.replace("\\\n", " ").splitlines() if ln.startswith("HEALTHCHECK ")]
    assert len(lines) == 1, f"{len(lines)} HEALTHCHECK instructions"
    opts = dict(re.findall(r"--([a-z-]+)=(\S+)", lines[0]))
    opts["cmd"] = json.dumps(json.loads(lines[0].split(" CMD ", 1)[1]))
    return opts


def _seconds(v: str) -> float:
    return float(v[:-1]) * {"s": 1, "m": 60}[v[-1]]


@pytest.mark.parametrize("t", load_matrix().targets, ids=lambda t: t.id)
def test_every_image_declares_the_healthcheck(t):
    """One HEALTHCHECK running this program; a server ready at t is seen healthy by t + interval + a probe (the
    validators hold jupyter to 30 s from `docker run`, so that must leave most of it for the start), a stop is
    unhealthy after `retries` probes, and a probe's own budget fits the engine's --timeout with room for Python."""
    hc = _healthcheck(render.render_target(t)["Dockerfile"].decode())
    assert json.loads(hc["cmd"]) == ["/opt/venv/bin/python3", "-I", "-S", "/opt/gpuforge/programs/health.py"]
    interval, timeout, retries = _seconds(hc["interval"]), _seconds(hc["timeout"]), int(hc["retries"])
    assert interval + health.BUDGET <= 10, "a server ready at 20 s would not be healthy by 30 s"
    assert retries * (interval + health.BUDGET) <= 30, "a stopped server would stay healthy over 30 s"
    assert health.BUDGET + 0.5 <= timeout, "the engine would cut a probe off before it says why"
    assert _seconds(hc["start-period"]) >= 60, "a warm start would be called unhealthy before it ends"
