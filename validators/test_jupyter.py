"""jupyter entrypoint: token required, kernel runs torch, server is not root."""

from __future__ import annotations

import json
import time
import uuid

import pytest
import requests
import websocket

TOKEN = uuid.uuid4().hex


@pytest.fixture(scope="module")
def server(image):
    from gpuforge import run

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
            time.sleep(0.5)
        yield c, f"http://127.0.0.1:{port}"


def test_status_refused_without_token(server):
    _, url = server
    r = requests.get(f"{url}/api/status", timeout=10)
    assert r.status_code in (401, 403), f"/api/status without a token answered {r.status_code}"


def test_status_ok_with_token(server):
    _, url = server
    r = requests.get(f"{url}/api/status", headers={"Authorization": f"token {TOKEN}"}, timeout=10)
    assert r.status_code == 200


def test_server_runs_as_non_root(server):
    c, _ = server
    top = c.container.top()
    col_user, col_cmd = top["Titles"].index("UID"), top["Titles"].index("CMD")
    users = [row[col_user] for row in top["Processes"] if "jupyter" in row[col_cmd]]
    assert users, f"no jupyter process in {top['Processes']}"
    assert not {"0", "root"} & set(users), f"jupyter runs as root: {top['Processes']}"


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
    from gpuforge import run

    with run.container(image, ["jupyter"], ports={8888: None}) as c:
        m = c.wait_for_log(r"generated Jupyter token \(printed once\): ([0-9a-f]{48})", timeout=60)
        token = m.group(1)
        url = f"http://127.0.0.1:{c.port(8888)}"
        c.wait_for_log(r"Jupyter Server .* is running at", timeout=90)
        assert requests.get(f"{url}/api/status", headers={"Authorization": f"token {token}"}, timeout=10).status_code == 200
        assert c.logs().count("generated Jupyter token") == 1, "the token announcement was printed more than once"
