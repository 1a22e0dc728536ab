"""The image's users with the real clients, end to end on the default image: Jupyter reached through an OpenSSH
`ssh -L` tunnel, and behind Debian's nginx as a reverse proxy at a sub-path, driven by headless Chromium (Debian's chromium + chromium-driver, Selenium from PyPI) that
opens Lab with the token and runs a cell; a real Prometheus (Debian's 2.42) scraping the metrics mode on
loopback, its HTTP API returning the series; `promtool check metrics` on the exposition. The per-journey
validators (validators/test_journeys.py, test_metrics.py) run against the same image in the full suite and
against the broken images in test_broken_images.py."""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import requests

from conftest import ROOT, need

pytestmark = pytest.mark.docker
sys.path.insert(0, str(ROOT / "validators"))

from clients import SSH_OPTS, answered, free_port, tunnel, wait_http  # noqa: E402

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
# promtool's lint on dcgm-exporter's own names: the findings we keep on purpose (names stay dcgm-exporter's)
KNOWN_LINT = ("counter metrics should have \"_total\" suffix", "metric names should be written in 'snake_case' not 'camelCase'",
              "label names should be written in 'snake_case' not 'camelCase'", "no help text")


def _tool(path: str, pkg: str) -> str:
    if not Path(path).exists() and not shutil.which(Path(path).name):
        need(f"needs {path} (Debian's {pkg}; tools/start-engine.sh installs it)")
    return path if Path(path).exists() else shutil.which(Path(path).name)


@pytest.fixture
def ssh_container(default_build, tmp_path):
    from gpuforge.engine import containers as run

    t, rec = default_build
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "id")], check=True)
    pub = (tmp_path / "id.pub").read_text().strip()
    with run.container(rec["image_id"], ["ssh"], user="root", env={"SSH_AUTHORIZED_KEYS": pub}, ports={22: None}) as c:
        c.wait_for_log("Server listening on", timeout=60)
        yield t, c, tmp_path / "id"


def _ssh(c, key: Path, user: str, *args: str) -> list[str]:
    return ["ssh", *SSH_OPTS, "-i", str(key), "-p", str(c.port(22)), *args, f"{user}@127.0.0.1"]


def _browser(tmp_path: Path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = _tool(CHROMIUM, "chromium")
    for a in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
              "--disable-sync", "--no-first-run", "--disable-dev-shm-usage", "--window-size=1400,1000", f"--user-data-dir={tmp_path / 'chromium'}"):
        opts.add_argument(a)
    return webdriver.Chrome(service=Service(_tool(CHROMEDRIVER, "chromium-driver")), options=opts)


def _notebook(url: str, token: str) -> None:
    nb = {"type": "notebook", "content": {"nbformat": 4, "nbformat_minor": 5, "metadata": {
        "kernelspec": {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}}, "cells": [
        {"cell_type": "code", "metadata": {}, "source": "import torch; print('TORCH', torch.__version__)", "outputs": [],
         "execution_count": None, "id": "c1"}]}}
    put = requests.put(f"{url}/api/contents/journey.ipynb", json=nb, headers={"Authorization": f"token {token}"}, timeout=30)
    assert put.status_code == 201, put.text[:300]


def _run_cell_in_lab(url: str, token: str, tmp_path: Path) -> tuple[float, str]:
    """Chromium opens Lab at `url` with the token, waits for the kernel, runs the notebook's cell as people do (the
    toolbar's Run button): (seconds until the kernel was idle, the cell's output)."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    _notebook(url, token)
    d = _browser(tmp_path)
    try:
        t0 = time.monotonic()
        d.get(f"{url}/lab/tree/journey.ipynb?token={token}")
        wait = WebDriverWait(d, 120)
        # the kernel's own "Idle" in the status bar (the execution indicator says idle before a kernel exists)
        wait.until(lambda d: d.execute_script(
            "const s = document.querySelector('#jp-main-statusbar'); return !!s && / \\| Idle/.test(s.innerText);"))
        opened = time.monotonic() - t0
        wait.until(lambda d: d.find_element(By.CSS_SELECTOR, ".jp-Cell .cm-content")).click()  # select the cell
        run = d.find_elements(By.CSS_SELECTOR, '[data-command="notebook:run-cell-and-select-next"]')
        if run:  # the toolbar's Run button, as people click it
            run[0].click()
        else:
            ActionChains(d).key_down(Keys.SHIFT).send_keys(Keys.ENTER).key_up(Keys.SHIFT).perform()
        out = WebDriverWait(d, 300).until(lambda d: next(
            (e.text for e in d.find_elements(By.CSS_SELECTOR, ".jp-OutputArea-output") if "TORCH" in e.text), None))
    finally:
        d.quit()
    return opened, out


def test_jupyter_over_an_ssh_tunnel_in_chromium_runs_a_cell(ssh_container, tmp_path):
    """ssh mode; the user starts JupyterLab on the container's loopback in an ssh session (`jupyter lab` as typed),
    reaches it through `ssh -L`, and Chromium opens Lab with the token and runs a cell that imports torch."""
    t, c, key = ssh_container
    user, token = t.settings.user, uuid.uuid4().hex
    start = (f"cd ~; JUPYTER_TOKEN={token} nohup jupyter lab --ip=127.0.0.1 --port=8888 "
             "--config=/etc/jupyter/jupyter_server_config.py > /tmp/jupyter.log 2>&1 < /dev/null &")
    r = subprocess.run([*_ssh(c, key, user), start], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    local = free_port()
    with tunnel(_ssh(c, key, user, "-N", "-o", "ExitOnForwardFailure=yes", "-L", f"{local}:localhost:8888"), local):
        url = f"http://127.0.0.1:{local}"
        wait_http(f"{url}/api/status", headers={"Authorization": f"token {token}"}, timeout=90)
        opened, out = _run_cell_in_lab(url, token, tmp_path)
    print(f"\nLab opened through ssh -L in {opened:.1f} s; cell output: {out}")
    assert out.strip() == f"TORCH {t.expected().torch}", out


# --- Jupyter behind nginx at a sub-path ------------------------------------------------------------------------

SUBPATH = "/u/alice"
NGINX_CONF = """worker_processes 1;
error_log {d}/error.log;
pid {d}/nginx.pid;
events {{ worker_connections 64; }}
http {{
  access_log {d}/access.log;
  client_body_temp_path {d}/body; proxy_temp_path {d}/proxy; fastcgi_temp_path {d}/fastcgi;
  uwsgi_temp_path {d}/uwsgi; scgi_temp_path {d}/scgi;
  map $http_upgrade $connection_upgrade {{ default upgrade; '' close; }}
  server {{
    listen 127.0.0.1:{port};
    location / {{ return 404; }}
    location {sub}/ {{
      proxy_pass http://127.0.0.1:{upstream};
      proxy_http_version 1.1;
      proxy_set_header Host $http_host;
      proxy_read_timeout 3600s;
      proxy_buffering off;
{websocket}    }}
  }}
}}
"""
WEBSOCKET = "      proxy_set_header Upgrade $http_upgrade;\n      proxy_set_header Connection $connection_upgrade;\n"


@contextlib.contextmanager
def _nginx(d: Path, upstream: int, *, websocket: bool = True):
    """Debian's nginx in the foreground with a config of this test's own: {SUBPATH}/ proxied to `upstream`, with the
    websocket upgrade headers as Jupyter's docs give them (websocket=False: a proxy set up without them)."""
    exe = _tool("/usr/sbin/nginx", "nginx-light")
    d.mkdir(parents=True, exist_ok=True)
    port = free_port()
    (d / "nginx.conf").write_text(NGINX_CONF.format(d=d, port=port, sub=SUBPATH, upstream=upstream,
                                                    websocket=WEBSOCKET if websocket else ""))
    p = subprocess.Popen([exe, "-p", str(d), "-c", str(d / "nginx.conf"), "-g", "daemon off;"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        if answered(f"http://127.0.0.1:{port}/", 30, alive=lambda: p.poll() is None) != 404:  # up: only the sub-path
            pytest.fail(f"nginx did not come up: {(d / 'error.log').read_text(errors='replace')[-1500:]}")
        yield f"http://127.0.0.1:{port}{SUBPATH}"
    finally:
        p.terminate()
        p.wait(10)


def _websocket_status(url: str, token: str) -> int:
    """The status a kernel websocket handshake through `url` gets (101: switched)."""
    h = {"Authorization": f"token {token}"}
    kid = requests.post(f"{url}/api/kernels", json={"name": "python3"}, headers=h, timeout=120).json()["id"]
    key = base64.b64encode(os.urandom(16)).decode()
    origin = url.split(SUBPATH)[0]  # as the browser sends it: the page's own origin, the proxy's
    r = requests.get(f"{url}/api/kernels/{kid}/channels", stream=True, timeout=30,
                     headers={**h, "Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13",
                              "Sec-WebSocket-Key": key, "Origin": origin})
    r.close()
    return r.status_code


@pytest.fixture
def subpath_jupyter(default_build):
    from gpuforge.engine import containers as run

    t, rec = default_build
    token = uuid.uuid4().hex
    with run.container(rec["image_id"], ["jupyter"], env={"NB_PREFIX": SUBPATH, "JUPYTER_TOKEN": token},
                       ports={8888: None}) as c:
        wait_http(f"http://127.0.0.1:{c.port(8888)}{SUBPATH}/api/status", headers={"Authorization": f"token {token}"},
                  running=c, timeout=90)
        yield t, c, token


def test_jupyter_behind_nginx_at_a_sub_path_in_chromium_runs_a_cell(subpath_jupyter, tmp_path):
    """JupyterLab served under /u/alice/ behind Debian's nginx as a reverse proxy at that sub-path: Chromium opens Lab
    through the proxy and runs a cell (its kernel websocket goes through the proxy); the handshake answers 101."""
    t, c, token = subpath_jupyter
    with _nginx(tmp_path / "nginx", c.port(8888)) as url:
        opened, out = _run_cell_in_lab(url, token, tmp_path)
        handshake = _websocket_status(url, token)
    print(f"\nLab opened through nginx at {SUBPATH}/ in {opened:.1f} s; cell output: {out}")
    assert out.strip() == f"TORCH {t.expected().torch}", out
    assert handshake == 101, f"the kernel websocket handshake through nginx answered {handshake}"


def test_a_proxy_without_websocket_headers_is_what_breaks_the_kernel(subpath_jupyter, tmp_path):
    """The broken setting: the same proxy without the Upgrade/Connection headers answers the kernel websocket with
    400 (what users of sub-path proxies report), while plain HTTP through it still works: the journey above catches it."""
    _, c, token = subpath_jupyter
    with _nginx(tmp_path / "nginx", c.port(8888), websocket=False) as url:
        api = requests.get(f"{url}/api/status", headers={"Authorization": f"token {token}"}, timeout=30).status_code
        handshake = _websocket_status(url, token)
    assert api == 200
    assert handshake == 400, f"a proxy without the upgrade headers answered the websocket handshake with {handshake}"


@pytest.fixture
def metrics_container(default_build):
    from gpuforge.engine import containers as run

    _, rec = default_build
    with run.container(rec["image_id"], ["metrics"], ports={9400: None}) as c:
        wait_http(f"http://127.0.0.1:{c.port(9400)}/metrics", running=c, timeout=60)
        yield c


def test_prometheus_scrapes_the_metrics_mode(metrics_container, tmp_path, default_build):
    """Debian's prometheus scrapes the metrics mode on loopback; its HTTP API returns the series."""
    t, _ = default_build
    exe = _tool("/usr/bin/prometheus", "prometheus")
    port, web = metrics_container.port(9400), free_port()
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text("global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
                   f"scrape_configs:\n  - job_name: gpuforge\n    static_configs: [{{targets: ['127.0.0.1:{port}']}}]\n")
    proc = subprocess.Popen([exe, f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{web}"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        api = f"http://127.0.0.1:{web}/api/v1/query"
        deadline, got = time.monotonic() + 90, {}
        while time.monotonic() < deadline:
            try:
                got = {q: requests.get(api, params={"query": q}, timeout=5).json()["data"]["result"]
                       for q in ('up{job="gpuforge"}', "gpuforge_gpus", "gpuforge_image_info")}
                if all(got.values()):
                    break
            except (requests.RequestException, KeyError, ValueError):
                pass
            if proc.poll() is not None:
                pytest.fail(f"prometheus exited {proc.returncode}: {proc.stderr.read()[-1500:]}")
            time.sleep(1)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert all(got.values()), f"prometheus's API has no series for {[q for q, v in got.items() if not v]}"
    assert got['up{job="gpuforge"}'][0]["value"][1] == "1"
    assert got["gpuforge_gpus"][0]["value"][1] == "0"  # this machine has no GPU
    assert got["gpuforge_image_info"][0]["metric"]["target"] == t.id


def _promtool(text: str) -> tuple[int, list[str]]:
    exe = _tool("/usr/bin/promtool", "prometheus")
    r = subprocess.run([exe, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    return r.returncode, [x for x in (r.stdout + r.stderr).splitlines() if x.strip()]


def test_promtool_accepts_the_exposition(metrics_container):
    """The served text (no GPU here) passes promtool's parser and lint."""
    text = requests.get(f"http://127.0.0.1:{metrics_container.port(9400)}/metrics", timeout=10).text
    rc, lines = _promtool(text)
    assert rc == 0, lines


def test_promtool_on_gpu_families_only_known_naming_warnings():
    """The GPU families as metrics.py writes them (NVML replaced by fixed readings: this checks names and format,
    the values are measured on the H200): promtool parses them and only warns about dcgm-exporter's own names."""
    sys.path.insert(0, str(ROOT / "images" / "programs"))
    import metrics

    class Readings:
        nv, error, driver = object(), "", "580.159.04"

        def ready(self):
            return True

        def read(self):
            ident = {"gpu": "0", "UUID": "GPU-00000000-0000-0000-0000-000000000000", "modelName": "NVIDIA H200",
                     "pci_bus_id": "00000000:19:00.0", "device": "nvidia0"}
            return [(ident, {k: 1.0 for _, _, _, k in metrics.FIELDS})]

    for names in metrics.NAME_SETS:
        col = metrics.GpuCollector(names, hostname="node-1")
        col.nvml = Readings()
        text = metrics.exposition(col).decode()
        rc, lines = _promtool(text)
        assert rc in (0, 3), f"promtool check metrics exit {rc} ({names}): {lines}"
        unknown = [x for x in lines if not any(k in x for k in KNOWN_LINT)]
        assert not unknown, f"promtool findings beyond dcgm-exporter's naming ({names}): {unknown}"
        assert "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter" in text  # exact, no _total added
        print(f"\npromtool ({names}): exit {rc}; " + "; ".join(sorted(set(lines))))


def test_metrics_once_prints_the_exposition_and_a_timing():
    """The command the GPU host runs (`python images/programs/metrics.py --once`), here without a GPU."""
    r = subprocess.run([sys.executable, str(ROOT / "images" / "programs" / "metrics.py"), "--once", "--repeat", "5"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "gpuforge_gpus 0.0" in r.stdout and "# scrape: best" in r.stderr
