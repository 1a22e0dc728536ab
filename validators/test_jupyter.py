"""jupyter entrypoint: every door needs the token (REST, kernel websocket, terminals, cross-origin),
the kernel runs torch, the server is not root, the token stays out of the process list and the logs,
and nothing but the server's port listens beyond loopback."""

from __future__ import annotations

import json
import re
import time
import uuid

import pytest
import requests
import websocket

from vutil import processes

TOKEN = uuid.uuid4().hex


@pytest.fixture(scope="module")
def server(image):
    from gpuforge.engine import containers as run

    with run.container(image, ["jupyter"], env={"JUPYTER_TOKEN": TOKEN}, ports={8888: None}) as c:
        port = c.port(8888)
        deadline = time.monotonic() + 90
        while True:
            try:
                if requests.get(f"http://127.0.0.1:{port}/api", timeout=5).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            if time.monotonic() > deadline or c.status() == "exited":
                pytest.fail(f"jupyter did not answer in 90 s; logs:\n{c.logs()[-2000:]}")
            time.sleep(0.2)
        yield c, f"http://127.0.0.1:{port}"


def test_status_refused_without_token(server):
    _, url = server
    r = requests.get(f"{url}/api/status", timeout=10)
    assert r.status_code in (401, 403), f"/api/status without a token answered {r.status_code}"


@pytest.mark.parametrize("path", ["/api/status", "/api/kernels", "/api/sessions", "/api/contents", "/lab/api/settings"])
def test_api_refused_without_or_with_a_wrong_token(server, path):
    _, url = server
    for headers in ({}, {"Authorization": f"token {uuid.uuid4().hex}"}):
        r = requests.get(f"{url}{path}", headers=headers, timeout=10, allow_redirects=False)
        assert r.status_code in (401, 403), f"GET {path} with {headers or 'no token'} answered {r.status_code}"


def test_kernel_start_refused_without_token(server):
    _, url = server
    for headers in ({}, {"Authorization": f"token {uuid.uuid4().hex}"}):
        r = requests.post(f"{url}/api/kernels", headers=headers, json={"name": "python3"}, timeout=30)
        assert r.status_code in (401, 403), f"POST /api/kernels with {headers or 'no token'} answered {r.status_code}"
    running = requests.get(f"{url}/api/kernels", headers={"Authorization": f"token {TOKEN}"}, timeout=10).json()
    assert running == [], f"kernels started without a token: {running}"


def test_kernel_websocket_refused_without_token(server):
    _, url = server
    auth = {"Authorization": f"token {TOKEN}"}
    kid = requests.post(f"{url}/api/kernels", headers=auth, json={"name": "python3"}, timeout=30).json()["id"]
    try:
        for query in ("", f"?token={uuid.uuid4().hex}"):
            with pytest.raises(websocket.WebSocketBadStatusException) as e:
                websocket.create_connection(f"{url.replace('http', 'ws')}/api/kernels/{kid}/channels{query}", timeout=30)
            assert e.value.status_code in (401, 403), f"websocket{query or ' without token'}: {e.value.status_code}"
    finally:
        requests.delete(f"{url}/api/kernels/{kid}", headers=auth, timeout=30)


def test_terminals_are_off(server):
    """No shell over HTTP even with the token (terminals_enabled = False)."""
    _, url = server
    for headers in ({}, {"Authorization": f"token {TOKEN}"}):
        r = requests.post(f"{url}/api/terminals", headers=headers, timeout=10)
        assert r.status_code in (401, 403, 404), f"POST /api/terminals with {headers or 'no token'} answered {r.status_code}"


def test_cross_origin_post_refused(server):
    """A browser page on another origin cannot use a logged-in session: its POST is refused by the origin
    check even with the XSRF token, a same-origin POST without the XSRF token is refused, and no answer
    carries an Access-Control-Allow-Origin that would let the page read it."""
    _, url = server
    auth = {"Authorization": f"token {TOKEN}"}
    s = requests.Session()
    s.get(f"{url}/lab?token={TOKEN}", timeout=30)  # log in as a browser does: session + _xsrf cookies
    xsrf = s.cookies.get("_xsrf")
    assert xsrf, f"no _xsrf cookie after login: {s.cookies.keys()}"
    evil = {"Origin": "http://evil.example", "Referer": "http://evil.example/"}
    cross = s.post(f"{url}/api/kernels", json={"name": "python3"}, timeout=30, headers={**evil, "X-XSRFToken": xsrf})
    assert cross.status_code in (401, 403, 404), f"cross-origin cookie POST /api/kernels answered {cross.status_code}"
    r = s.post(f"{url}/api/kernels", json={"name": "python3"}, timeout=30, headers={"Origin": url})
    assert r.status_code in (401, 403), f"same-origin cookie POST without the XSRF token answered {r.status_code}"
    # Answers to another origin carry no CORS grant, so a page there cannot read them (Jupyter would echo the
    # Origin of token-authenticated requests; the image's allow_origin_pat stops that). A preflight asking for
    # the Authorization header is granted by Jupyter by design: the request behind it still needs the token.
    for resp in (cross, requests.get(f"{url}/api/status", headers={**auth, **evil}, timeout=10),
                 requests.get(f"{url}/api/status", headers=evil, timeout=10)):
        assert "access-control-allow-origin" not in {k.lower() for k in resp.headers}, dict(resp.headers)
    assert requests.get(f"{url}/api/kernels", headers=auth, timeout=10).json() == []


def test_token_not_in_process_list_or_logs(server):
    c, _ = server
    ps = c.container.exec_run(["sh", "-c", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '"], user="root").output.decode(errors="replace")
    assert "jupyter" in ps, f"no jupyter process seen: {ps[-500:]}"
    assert TOKEN not in ps, "the Jupyter token is on a command line (visible to every process via ps)"
    top = json.dumps(c.container.top())
    assert TOKEN not in top, "the Jupyter token is in `docker top`"
    assert TOKEN not in c.logs(), "the Jupyter token given at run time is printed in the logs"


def test_only_the_server_port_listens(server, timeout):
    """Beyond loopback (kernels' ZMQ ports) only 8888 listens: no sshd, no debug or extension servers."""
    import testinfra

    from plugin import listening

    c, _ = server
    socks = listening(testinfra.get_host(f"docker://root@{c.id}"), timeout)
    exposed = [(a, p) for a, p in socks if a != "loopback"]
    assert exposed == [("any", 8888)], f"listening beyond loopback: {exposed} (all: {socks})"


def test_status_ok_with_token(server):
    _, url = server
    r = requests.get(f"{url}/api/status", headers={"Authorization": f"token {TOKEN}"}, timeout=10)
    assert r.status_code == 200


def test_server_runs_as_non_root(server):
    c, _ = server
    procs = processes(c)
    users = [uid for uid, cmd in procs if "jupyter" in cmd]
    assert users, f"no jupyter process in {procs}"
    assert not {"0", "root"} & set(users), f"jupyter runs as root: {procs}"


def test_kernel_runs_torch(server, target, timeout, facts):
    _, url = server
    auth = {"Authorization": f"token {TOKEN}"}
    kid = requests.post(f"{url}/api/kernels", headers=auth, json={"name": "python3"}, timeout=30).json()["id"]
    ws = websocket.create_connection(f"{url.replace('http', 'ws')}/api/kernels/{kid}/channels?token={TOKEN}",
                                     timeout=timeout)
    msg_id = uuid.uuid4().hex
    ws.send(json.dumps({
        "header": {"msg_id": msg_id, "username": "gpuforge", "session": uuid.uuid4().hex, "msg_type": "execute_request",
                   "version": "5.3"},
        "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
        "content": {"code": "import torch; print(torch.__version__)", "silent": False, "store_history": False,
                    "user_expressions": {}, "allow_stdin": False},
    }))
    out, status = "", None
    deadline = time.monotonic() + timeout
    while status is None and time.monotonic() < deadline:
        m = json.loads(ws.recv())
        if m.get("parent_header", {}).get("msg_id") != msg_id:
            continue
        if m["msg_type"] == "stream":
            out += m["content"]["text"]
        elif m["msg_type"] == "error":
            out += "\n".join(m["content"]["traceback"])
        elif m["msg_type"] == "execute_reply":
            status = m["content"]["status"]
    ws.close()
    requests.delete(f"{url}/api/kernels/{kid}", headers=auth, timeout=30)
    facts["jupyter_kernel_torch"] = out.strip()
    assert status == "ok", f"kernel execution: {status}: {out[-1500:]}"
    assert out.strip() == target.torch


def test_generated_token_printed_once_and_works(image):
    from gpuforge.engine import containers as run

    with run.container(image, ["jupyter"], ports={8888: None}) as c:
        m = c.wait_for_log(r"generated Jupyter token \(printed once\): ([0-9a-f]{48})", timeout=60)
        token = m.group(1)
        url = f"http://127.0.0.1:{c.port(8888)}"
        c.wait_for_log(r"Jupyter Server .* is running at", timeout=90)
        assert requests.get(f"{url}/api/status", headers={"Authorization": f"token {token}"}, timeout=10).status_code == 200
        assert c.logs().count("generated Jupyter token") == 1, "the token announcement was printed more than once"
        assert len(re.findall(re.escape(token), c.logs())) == 1, "the generated token appears in the logs beyond its announcement"
        ps = c.container.exec_run(["sh", "-c", "cat /proc/[0-9]*/cmdline"], user="root").output.decode(errors="replace")
        assert token not in ps, "the generated token is on a command line"
