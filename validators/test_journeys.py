"""The image's users, as they start it: a login shell over OpenSSH with a pty, ssh tunnels, `jupyter lab ...`
typed as the command (also as root), pip install as the user without network, Kubeflow (NB_PREFIX, the
default command, no token only on request), OpenShift's arbitrary uid with gid 0, a home of another owner,
read-only roots in every mode, and a JupyterLab that makes no outbound calls.

Expected values come from the target (uid, torch), the engine (the container's environment) or gpuforge's
own template (the venv's path, clients.VENV), never from the image under test.
"""

from __future__ import annotations

import json
import re
import secrets
import subprocess
import time
import uuid

import pytest
import requests

from clients import SSH_OPTS, VENV, answered, free_port, key_file, openssh, simple_index, ssh_argv, tunnel, wait_http, wheel
from vutil import Health, processes, sh

TOKEN = uuid.uuid4().hex
AUTH = {"Authorization": f"token {TOKEN}"}
PREFIX = "/notebook/team-a/gpuforge-nb"  # how Kubeflow names a notebook's path: /notebook/NAMESPACE/NAME


def _run():
    from gpuforge.engine import containers as run

    return run


def _jupyter(image: str, command: list[str] | None, **kw):
    """A jupyter container with port 8888 published and the test token unless `env` says otherwise."""
    env = kw.pop("env", {"JUPYTER_TOKEN": TOKEN})
    return _run().container(image, command, env=env, ports={8888: None}, **kw)


def _healthy(c) -> str | None:
    """None when the image's HEALTHCHECK calls the container healthy, else why not. Probed every second here: these
    journeys check that the program finds the server in their kind of start; test_health.py holds the image's own
    interval to its bars."""
    h = Health(c)
    return None if h.wait("healthy", 30) else f"docker's health status is {h.status!r}, last probe: {h.last()!r}"


FAST = {"health_interval": 1}  # see _healthy


def _uids(c, word: str) -> set[str]:
    """uids of the container's processes whose command line holds `word` (tini, PID 1, is root by design)."""
    return {uid for uid, cmd in processes(c) if word in cmd and not cmd.startswith("/usr/bin/tini")}


# --- login shells ----------------------------------------------------------------------------------

LOGIN_PROBE = ('command -v python; command -v pip; python -c "import sys, torch; print(sys.prefix, torch.__version__)"; '
               'echo "ENV NVIDIA_VISIBLE_DEVICES=${NVIDIA_VISIBLE_DEVICES-} LD_LIBRARY_PATH=${LD_LIBRARY_PATH-}"')


def _login_facts(out: str) -> dict:
    lines = [x.strip() for x in out.replace("\r", "").splitlines() if x.strip()]
    return {"python": next((x for x in lines if x.endswith("/python")), ""),
            "pip": next((x for x in lines if x.endswith("/pip")), ""),
            "prefix": next((x.split()[0] for x in lines if x.startswith("/") and " " in x and "+" in x), ""),
            "torch": next((x.split()[1] for x in lines if x.startswith("/") and " " in x and "+" in x), ""),
            "env": next((x for x in lines if x.startswith("ENV ")), "")}


def _assert_login(f: dict, target, where: str) -> None:
    assert f["python"] == f"{VENV}/bin/python", f"{where}: the login shell's python is {f['python'] or 'not found'!r}, not the venv's"
    assert f["pip"] == f"{VENV}/bin/pip", f"{where}: the login shell's pip is {f['pip'] or 'not found'!r}, not the venv's"
    assert (f["prefix"], f["torch"]) == (VENV, target.torch), f"{where}: python in a login shell: {f}"


def test_login_shell_has_the_venv(host, is_image, target, timeout):
    """`bash -l` and `docker exec -it C bash -l` read /etc/profile, which resets PATH: the venv must come first again."""
    if not is_image:
        pytest.skip("needs an image (--gpuforge-image): a host's login shells are its own")
    r = sh(host, "bash -lc %s", LOGIN_PROBE, timeout=timeout, check=False)
    _assert_login(_login_facts(r.stdout), target, "bash -l")


def test_ssh_pty_login_gets_the_image_environment(ssh_server, target, tmp_path, timeout):
    """OpenSSH with a pty (`ssh -tt`): a login shell, whose PATH has the venv and whose CUDA/NVIDIA variables are the
    container's (as the engine reports them), though sshd starts sessions with a fresh environment."""
    key = key_file(ssh_server, tmp_path)
    r = subprocess.run(ssh_argv(ssh_server, key, "-tt"), input=LOGIN_PROBE + "; exit\n", capture_output=True, text=True,
                       timeout=timeout)
    f = _login_facts(r.stdout)
    _assert_login(f, target, "ssh -tt login shell")
    env = dict(e.split("=", 1) for e in ssh_server.running.container.attrs["Config"]["Env"])
    want = f"ENV NVIDIA_VISIBLE_DEVICES={env.get('NVIDIA_VISIBLE_DEVICES', '')} LD_LIBRARY_PATH={env.get('LD_LIBRARY_PATH', '')}"
    assert f["env"] == want, f"ssh login environment: {f['env']!r}, the container's: {want!r}"


# --- tunnels -----------------------------------------------------------------------------------------

def test_ssh_local_forward_reaches_the_container_loopback(ssh_server, tmp_path, target):
    """`ssh -L PORT:localhost:P` (Jupyter over SSH) reaches a server on the container's own loopback."""
    c = ssh_server.running.container
    local = free_port()
    # the client first: without one the test fails before it starts anything in the shared container
    argv = ssh_argv(ssh_server, key_file(ssh_server, tmp_path), "-N", "-o", "ExitOnForwardFailure=yes",
                    "-L", f"{local}:localhost:8765")
    serve = "echo $$ > /tmp/gpuforge-probe.pid; exec python3 -m http.server --bind 127.0.0.1 8765 --directory /opt/gpuforge"
    c.exec_run(["sh", "-c", serve], user=str(target.uid), detach=True)
    try:
        with tunnel(argv, local) as t:
            r = wait_http(f"http://127.0.0.1:{local}/target.json", timeout=30, refused=t.refused)
    finally:  # the ssh container is shared: leave nothing listening (test_ssh counts the listeners)
        c.exec_run(["sh", "-c", "kill $(cat /tmp/gpuforge-probe.pid)"], user=str(target.uid))
    assert json.loads(r.text)["id"] == target.id


def test_ssh_forwarding_beyond_loopback_and_remote_refused(ssh_server, tmp_path, timeout):
    """Only the container's loopback: a direct-tcpip channel elsewhere is prohibited, and so is -R."""
    key = key_file(ssh_server, tmp_path)
    own = subprocess.run(ssh_argv(ssh_server, key, "-W", "localhost:22"), input="", capture_output=True, text=True, timeout=timeout)
    assert own.stdout.startswith("SSH-2.0"), f"ssh -W localhost:22 (the allowed loopback) gave: {own.stderr[-500:]}"
    ip = ssh_server.running.container.attrs["NetworkSettings"]["IPAddress"]
    other = subprocess.run(ssh_argv(ssh_server, key, "-W", f"{ip}:22"), input="", capture_output=True, text=True, timeout=timeout)
    assert not other.stdout.startswith("SSH-2.0"), f"ssh -W {ip}:22 (not loopback) was forwarded"
    remote = subprocess.run(ssh_argv(ssh_server, key, "-o", "ExitOnForwardFailure=yes", "-R", "0:localhost:22", "true"),
                            capture_output=True, text=True, timeout=timeout)
    assert remote.returncode != 0, "ssh -R (remote forwarding) was allowed"


# --- Jupyter as people start it -------------------------------------------------------------------

def test_jupyter_lab_as_the_command(image, target):
    """`docker run IMAGE jupyter lab --ip=0.0.0.0 --port=8888`: the jupyter mode's server (token, not root)."""
    with _jupyter(image, ["jupyter", "lab", "--ip=0.0.0.0", "--port=8888"], **FAST) as c:
        url = f"http://127.0.0.1:{c.port(8888)}"
        wait_http(f"{url}/api/status", headers=AUTH, running=c)
        assert requests.get(f"{url}/api/status", timeout=10).status_code in (401, 403), "jupyter lab as typed needs no token"
        assert _uids(c, "jupyter-lab") <= {str(target.uid)}, f"jupyter lab runs as {_uids(c, 'jupyter-lab')}"
        assert requests.get(f"{url}/api/contents", headers=AUTH, timeout=10).status_code == 200
        health = _healthy(c)
    assert health is None, f"jupyter lab as typed: {health}"


def test_jupyter_as_root_runs_as_the_user(image, target):
    """`docker run --user root IMAGE jupyter notebook --ip=0.0.0.0 --allow-root`: one line says it runs as the user."""
    with _jupyter(image, ["jupyter", "notebook", "--ip=0.0.0.0", "--allow-root"], user="root", **FAST) as c:
        url = f"http://127.0.0.1:{c.port(8888)}"
        wait_http(f"{url}/api/status", headers=AUTH, running=c)
        logs = c.logs()
        assert len(re.findall(r"started as root: Jupyter runs as", logs)) == 1, f"no one-line notice for root: {logs[-1500:]}"
        uids = _uids(c, "jupyter")
        assert uids and "0" not in uids, f"jupyter processes run as uids {uids} (root refused)"
        health = _healthy(c)  # the check runs as root, the server as the user: its runtime dir is the user's
    assert health is None, f"jupyter started as root: {health}"


def test_jupyter_makes_no_outbound_calls(image):
    """No news feed, no update check, announcements off and a read-only extension manager (it would query PyPI)."""
    with _jupyter(image, ["jupyter"]) as c:
        url = f"http://127.0.0.1:{c.port(8888)}"
        wait_http(f"{url}/api/status", headers=AUTH, running=c)
        news = requests.get(f"{url}/lab/api/news", headers=AUTH, timeout=10).json()
        update = requests.get(f"{url}/lab/api/update", headers=AUTH, timeout=10).json()
        page = requests.get(f"{url}/lab", headers=AUTH, timeout=30).text
    m = re.search(r'<script id="jupyter-config-data" type="application/json">(.*?)</script>', page, re.S)
    assert m, "no page config in /lab"
    cfg = json.loads(m.group(1))
    problems = []
    if news.get("news"):
        problems.append(f"news feed: {news}")
    if update.get("notification"):
        problems.append(f"update check: {update}")
    if "@jupyterlab/apputils-extension:announcements" not in cfg.get("disabledExtensions", []):
        problems.append(f"announcements plugin enabled (disabledExtensions: {cfg.get('disabledExtensions')})")
    if cfg.get("extensionManager", {}).get("can_install"):
        problems.append(f"extension manager queries an index: {cfg.get('extensionManager')}")
    assert not problems, f"JupyterLab would call out: {problems}"


# --- pip install as the user --------------------------------------------------------------------------

PIP_SCRIPT = r"""
cd /wheels && python -m http.server 8123 --bind 127.0.0.1 > /tmp/index.log 2>&1 &
up() { python -c "import urllib.request as u; u.urlopen('http://127.0.0.1:8123/simple/')" 2>/dev/null; }
for i in $(seq 100); do up && break; sleep 0.1; done
IDX="--index-url http://127.0.0.1:8123/simple/"
stack() { pip freeze 2>/dev/null | grep -iE '^(torch|torchvision|torchaudio|triton|nvidia-[a-z0-9-]+)==' | sort; }
stack > /tmp/stack.before
pip install $IDX jprobe > /tmp/pip1.log 2>&1 || { echo "PIP_FAILED $(tail -1 /tmp/pip1.log)"; exit 3; }
if pip install $IDX jswap > /tmp/pip2.log 2>&1; then echo SWAP_INSTALLED; else echo SWAP_REFUSED; fi
echo "SWAP_LOG $(grep ERROR /tmp/pip2.log | tail -1)"
if pip install $IDX jcudnn > /tmp/pip3.log 2>&1; then echo CUDNN_INSTALLED; else echo CUDNN_REFUSED; fi
echo "CUDNN_LOG $(grep ERROR /tmp/pip3.log | tail -1)"
pip check > /tmp/check.log 2>&1 && echo CHECK_OK || echo "CHECK_FAILED $(tr '\n' ' ' < /tmp/check.log)"
stack > /tmp/stack.after
if cmp -s /tmp/stack.before /tmp/stack.after; then echo "STACK_SAME $(wc -l < /tmp/stack.after)"
else echo "STACK_CHANGED $(diff /tmp/stack.before /tmp/stack.after | tr '\n' ' ')"; fi
# one interpreter, after every install: the user's package and torch import side by side (a torch import costs ~1.5 s)
python -c "import json, jprobe, torch, os
print('PROBE ' + json.dumps({'file': jprobe.__file__, 'torch': torch.__version__, 'home': os.environ['HOME']}))
print('TORCH_AFTER', torch.__version__)"
"""


@pytest.fixture(scope="module")
def wheels(tmp_path_factory):
    """A hostile PEP 503 index (served in the container on 127.0.0.1): a plain package, one that wants torch 2.8.0 and
    one that wants cuDNN 8, with that torch and that cuDNN right there: an unconstrained pip would take them."""
    d = tmp_path_factory.mktemp("wheels")
    d.chmod(0o755)
    made = [wheel(d, "jprobe", "1.0"), wheel(d, "jswap", "1.0", requires=("torch==2.8.0",)),
            wheel(d, "torch", "2.8.0", body="__version__ = '2.8.0'\n"),
            wheel(d, "jcudnn", "1.0", requires=("nvidia-cudnn-cu12==8.9.7.29",)),
            wheel(d, "nvidia_cudnn_cu12", "8.9.7.29")]
    simple_index(d, made)
    return d


PIP_AS = {"default-user": {}, "openshift-read-only": {"user": "12345:0", "read_only": True, "tmpfs": {"/tmp": "exec"}},
          "root": {"user": "root"}}  # root: a derived image's `RUN pip install`, which goes into the venv itself


@pytest.mark.parametrize("how", list(PIP_AS))
def test_pip_install_as_the_user_offline(image, target, wheels, how):
    """pip install from a hostile index on the container's loopback, in a network-less container, lands in the user's
    site (root: the venv) and keeps `pip check` clean; the image's constraints refuse a package that would swap torch
    and one that would swap cuDNN (both are in the index; as root nothing else would stop them); the torch stack's
    `pip freeze` is the same afterwards."""
    kw = PIP_AS[how]
    with _run().container(image, ["bash", "-c", PIP_SCRIPT], network="none",
                          volumes={str(wheels): {"bind": "/wheels", "mode": "ro"}}, **kw) as c:
        rc = c.container.wait(timeout=300)["StatusCode"]
        out = c.logs()
    assert "PIP_FAILED" not in out and rc == 0, f"pip install as the user failed ({how}, exit {rc}): {out[-1500:]}"
    # the swaps first: the probe runs after them, so a swap that went through would show there as torch 2.8.0
    assert "SWAP_REFUSED" in out, "pip swapped torch for 2.8.0: the image's constraints (PIP_CONSTRAINT) are not applied"
    assert "CUDNN_REFUSED" in out, "pip swapped cuDNN for 8.9.7: the image's constraints (PIP_CONSTRAINT) are not applied"
    for word in ("SWAP_LOG", "CUDNN_LOG"):
        why = next(x for x in out.splitlines() if x.startswith(word))
        assert "ResolutionImpossible" in why, f"the swap was refused, but not by the image's constraints: {why}"
    line = next((x for x in out.splitlines() if x.startswith("PROBE ")), None)
    assert line, f"the installed package and torch did not import after the installs: {out[-1500:]}"
    probe = json.loads(line.split(" ", 1)[1])
    site = f"{VENV}/lib/" if how == "root" else probe["home"] + "/.local/"
    assert probe["file"].startswith(site), f"installed outside {site}: {probe}"
    assert probe["torch"] == target.torch
    assert "CHECK_OK" in out, f"pip check after the installs: {out[-800:]}"
    same = next((x for x in out.splitlines() if x.startswith(("STACK_SAME", "STACK_CHANGED"))), "no STACK line")
    assert same.startswith("STACK_SAME") and int(same.split()[1]) >= 5, f"the torch stack's pip freeze changed: {same}"
    assert f"TORCH_AFTER {target.torch}" in out, out[-800:]


# --- /dev/shm ----------------------------------------------------------------------------------------------------

LOADER = """
import torch
from torch.utils.data import DataLoader, Dataset
class Big(Dataset):
    def __len__(self): return 16
    def __getitem__(self, i): return torch.full((4 << 20,), float(i))  # 16 MB a sample: 64 MB a batch of 4
n = sum(float(b[:, 0].sum()) for b in DataLoader(Big(), batch_size=4, num_workers=2))
print("LOADER_OK", n)
"""


def _started(image: str, command: list[str], **kw) -> tuple[int, str]:
    with _run().container(image, command, network="none", **kw) as c:
        rc = c.container.wait(timeout=300)["StatusCode"]
        return rc, c.logs()


def test_small_dev_shm_is_said_at_start(image):
    """Docker's default /dev/shm (64 MB): the start says in one line that DataLoader workers need --shm-size or
    --ipc=host. Started as that line says, it says nothing and a DataLoader with two workers moves 256 MB."""
    _, small = _started(image, ["true"])
    rc, big = _started(image, ["python", "-c", LOADER], shm_size="2g")
    said = [x for x in small.splitlines() if "/dev/shm" in x]
    assert len(said) == 1 and "DataLoader workers" in said[0] and "--shm-size" in said[0], (
        f"the /dev/shm warning was not said once at start with Docker's 64 MB: {small[-800:]}")
    assert "/dev/shm" not in big, f"a 2 GB /dev/shm was warned about: {big[-800:]}"
    assert rc == 0 and "LOADER_OK 120.0" in big, f"DataLoader workers with a 2 GB /dev/shm (exit {rc}): {big[-1500:]}"


# --- networks: IPv6, no route out; the start's log ------------------------------------------------------------

def _network(**kw):
    """A bridge network of this test's own, labelled as the run's (`gpuforge clean` removes it if the run dies)."""
    return _run().network(**kw)


def _address(c, net, key: str = "IPAddress") -> str:
    c.reload()
    return c.container.attrs["NetworkSettings"]["Networks"][net.name][key]


def _ssh_key(tmp_path):
    import paramiko

    key = paramiko.Ed25519Key.generate() if hasattr(paramiko.Ed25519Key, "generate") else paramiko.RSAKey.generate(2048)
    path = tmp_path / "id_key"
    key.write_private_key_file(str(path))
    path.chmod(0o600)
    return f"{key.get_name()} {key.get_base64()} gpuforge-validator", path


def test_ssh_and_jupyter_answer_over_ipv6(image, target, tmp_path):
    """On a Docker network with IPv6 (a ULA subnet of this run's own), Jupyter and SSH answer on the container's IPv6
    address, as an IPv6-only cluster reaches them."""
    import docker

    subnet = f"fd{secrets.token_hex(1)}:{secrets.token_hex(2)}:{secrets.token_hex(2)}::/64"
    ipam = docker.types.IPAMConfig(pool_configs=[docker.types.IPAMPool(subnet=subnet)])
    pub, key = _ssh_key(tmp_path)
    with _network(enable_ipv6=True, ipam=ipam) as net:
        with _jupyter(image, ["jupyter"], network=net.name) as c:
            wait_http(f"http://127.0.0.1:{c.port(8888)}/api/status", headers=AUTH, running=c)  # up (IPv4)
            ip6 = _address(c, net, "GlobalIPv6Address")
            jupyter = answered(f"http://[{ip6}]:8888/api/status", 10, headers=AUTH)
        with _run().container(image, ["ssh"], user="root", env={"SSH_AUTHORIZED_KEYS": pub}, network=net.name) as c:
            c.wait_for_log(r"Server listening on", timeout=60)
            ssh_ip6 = _address(c, net, "GlobalIPv6Address")
            r = subprocess.run([openssh(), *SSH_OPTS, "-6", "-i", str(key), f"{target.user}@{ssh_ip6}",
                                'echo "IPV6_OK $SSH_CONNECTION"'], capture_output=True, text=True, timeout=60)
    assert ip6 and ssh_ip6, f"no IPv6 address on the network {subnet}"
    assert jupyter == 200, f"Jupyter did not answer over IPv6 at [{ip6}]:8888 (got {jupyter}): it listens on IPv4 only"
    assert r.returncode == 0 and "IPV6_OK" in r.stdout and ssh_ip6 in r.stdout, (
        f"ssh over IPv6 to [{ssh_ip6}]:22 failed (exit {r.returncode}): {r.stderr[-500:]}")


# Log lines that say something went wrong or was tried and refused, at any mode's start
TROUBLE = re.compile(r"Traceback|\b(ERROR|WARNING|CRITICAL)\b|^\[[WEC] |warning:|error:|Failed to establish|"
                     r"name resolution|Network is unreachable|Max retries exceeded|timed out", re.I | re.M)
# Reviewed lines that may appear, each with its reason: (pattern, why, only on a host without a GPU)
WAIVED = (
    # these containers ask for no GPU (on a GPU host too), so the entrypoint says there is none, once, by design
    (r"^gpuforge: warning: no NVIDIA driver visible", "started without a GPU request: said once, by design", False),
    # on a GPU host the driver shows through /proc/driver/nvidia in every container, GPU asked for or not: the
    # entrypoint then says it sees the driver but no device, once, by design (the same containers, on a GPU runner)
    (r"^gpuforge: warning: NVIDIA driver \S+ visible but no GPU: .*started without a GPU request",
     "started without a GPU request on a GPU host: said once, by design", False),
    # jupyter_server says this whenever ServerApp.ip is "" (every address, both stacks: what an IPv6 network needs)
    # and TLS is off; "0.0.0.0" listens on every IPv4 address just the same without the line. The token is required,
    # and the boundary is the engine's port publishing (127.0.0.1) or a TLS proxy in front.
    (r"WARNING: The Jupyter server is listening on all IP addresses and not using encryption\. This is not recommended\.$",
     "Jupyter's own note on binding every address without TLS, true by design in a container", False),
)


def _modes(pub: str) -> dict:
    """mode: (command, container options, how the host sees it ready: a URL on port 8888/9400 or a log line)."""
    return {"jupyter": (["jupyter"], {"env": {"JUPYTER_TOKEN": TOKEN}}, ("http", 8888, "/api/status")),
            "ssh": (["ssh"], {"user": "root", "env": {"SSH_AUTHORIZED_KEYS": pub}}, ("log", 0, r"Server listening on")),
            "metrics": (["metrics"], {}, ("http", 9400, "/metrics"))}


def _ready_seconds(image: str, mode: tuple, net=None) -> tuple[float, str]:
    """Seconds from `docker run` until the host sees the mode ready, and the log of its start. On `net`, the host
    asks the container's address; without one (the default bridge) its published port."""
    command, kw, (how, port, what) = mode
    if net is None and how == "http":
        kw = {**kw, "ports": {port: None}}
    t0 = time.monotonic()
    with _run().container(image, command, network=net.name if net else None, shm_size="2g", **kw) as c:
        if how == "log":
            c.wait_for_log(what, timeout=120)
        else:
            where = f"{_address(c, net)}:{port}" if net else f"127.0.0.1:{c.port(port)}"
            got = answered(f"http://{where}{what}", 120, headers=AUTH)
            assert got == 200, f"{' '.join(command)}: {what} answered {got} ({c.logs()[-800:]})"
        seconds = time.monotonic() - t0
        time.sleep(2)  # what it does right after ready is part of its start
        return seconds, c.logs()


SLOWER = 1.5  # an internal start may take this times the bridge's (+5 s): a wait on an outbound call takes far longer
BAR = 20.0  # ssh and metrics start in 1-3 s


def test_every_mode_starts_with_no_route_out_and_a_clean_log(image, gpu, tmp_path):
    """On an --internal network (no route out, as in a closed cluster) each mode is ready as soon as on the default
    bridge (jupyter, timed side by side) or within 20 s (ssh, metrics), and its log holds no traceback,
    error, warning or refused outbound call beyond the reviewed waivers."""
    pub, _ = _ssh_key(tmp_path)
    waived = [w for w, _, cpu_only in WAIVED if not (cpu_only and gpu)]
    problems = []
    with _network(internal=True) as net:
        for name, mode in _modes(pub).items():
            seconds, log = _ready_seconds(image, mode, net)
            bad = [ln for ln in log.splitlines() if TROUBLE.search(ln) and not any(re.search(w, ln) for w in waived)]
            if bad:
                problems.append(f"{name} logged: {' | '.join(x[:200] for x in bad[:4])}")
            bar = BAR if name in ("ssh", "metrics") else SLOWER * _ready_seconds(image, mode)[0] + 5
            if seconds > bar:
                problems.append(f"{name} took {seconds:.1f} s to be ready with no route out (bar {bar:.1f} s)")
    assert not problems, "; ".join(problems)


# --- Kubeflow, OpenShift, homes, read-only roots --------------------------------------------------------

def test_kubeflow_notebook_contract(image, target):
    """Started as Kubeflow starts it (default command, NB_PREFIX, an empty home volume, no token asked for explicitly):
    keeps running, uid 1000, HOME writable, port 8888, the UI and the API under NB_PREFIX and not beside it."""
    env = {"NB_PREFIX": PREFIX, "GPUFORGE_JUPYTER_NO_TOKEN": "1"}
    with _jupyter(image, None, env=env, tmpfs={f"/home/{target.user}": f"uid={target.uid},mode=0755"}, **FAST) as c:
        url = f"http://127.0.0.1:{c.port(8888)}"
        wait_http(f"{url}{PREFIX}/api/status", running=c, timeout=90, ok=(200, 404))  # up, wherever it serves
        api = requests.get(f"{url}{PREFIX}/api/status", timeout=10)
        lab = requests.get(f"{url}{PREFIX}/lab", timeout=30)
        beside = requests.get(f"{url}/lab", timeout=30, allow_redirects=False)
        # the culler's contract: it reads each kernel's last_activity and the server's through NB_PREFIX
        ui = requests.Session()
        ui.get(f"{url}{PREFIX}/lab", timeout=30)  # the _xsrf cookie a browser gets
        made = ui.post(f"{url}{PREFIX}/api/kernels", json={"name": "python3"}, timeout=120,
                       headers={"X-XSRFToken": ui.cookies.get("_xsrf") or ""})
        kernels = requests.get(f"{url}{PREFIX}/api/kernels", timeout=10)
        status = requests.get(f"{url}{PREFIX}/api/status", timeout=10)
        time.sleep(3)
        assert c.status() == "running", f"the default command did not keep running: {c.logs()[-1500:]}"
        home = c.container.exec_run(["sh", "-c", 'test -w "$HOME" && echo "$HOME"'], user=str(target.uid)).output.decode().strip()
        logs = c.logs()
        uids = _uids(c, "jupyter")
        health = _healthy(c)  # asked under NB_PREFIX, without a token
    assert api.status_code == 200, f"GET {PREFIX}/api/status answered {api.status_code}: the API is not served under NB_PREFIX"
    assert lab.status_code == 200, f"GET {PREFIX}/lab answered {lab.status_code}: not served under NB_PREFIX"
    assert beside.status_code == 404, f"GET /lab answered {beside.status_code}: served beside NB_PREFIX"
    assert made.status_code == 201, f"POST {PREFIX}/api/kernels from the UI's session answered {made.status_code}"
    listed = kernels.json() if kernels.status_code == 200 else []
    assert len(listed) == 1 and all(k.get("last_activity") and k.get("execution_state") for k in listed), (
        f"GET {PREFIX}/api/kernels (what the culler reads) answered {kernels.status_code}: {kernels.text[:300]}")
    st = status.json()
    assert st.get("last_activity") and st.get("kernels") == 1, f"GET {PREFIX}/api/status: {st}"
    assert uids == {str(target.uid)}, f"jupyter runs as uids {uids}"
    assert home == f"/home/{target.user}", f"HOME not writable for uid {target.uid}: {home!r}"
    assert "generated Jupyter token" not in logs, "a token was announced that is not in force"
    assert logs.count("WITHOUT a token") == 1, "no-token mode not said in one line"
    assert health is None, f"Kubeflow's start: {health}"


def test_nb_prefix_alone_keeps_the_token(image):
    """Kubeflow's NB_PREFIX alone does not switch the token off: no-token needs GPUFORGE_JUPYTER_NO_TOKEN=1."""
    with _jupyter(image, None, env={"NB_PREFIX": PREFIX, "JUPYTER_TOKEN": TOKEN}) as c:
        url = f"http://127.0.0.1:{c.port(8888)}"
        wait_http(f"{url}{PREFIX}/api/status", headers=AUTH, running=c)
        r = requests.get(f"{url}{PREFIX}/api/status", timeout=10)
    assert r.status_code in (401, 403), f"{PREFIX}/api/status without a token answered {r.status_code}"


@pytest.mark.parametrize("user", ["12345:0", "23456:0"])  # OpenShift's kind of uid, and OpenDataHub's
def test_arbitrary_uid_with_gid_0(image, target, user):
    """An arbitrary uid with gid 0 and no passwd entry: jupyter starts, HOME is the image's home, files can be saved."""
    with _jupyter(image, ["jupyter"], user=user, **FAST) as c:
        url = f"http://127.0.0.1:{c.port(8888)}"
        wait_http(f"{url}/api/status", headers=AUTH, running=c)
        put = requests.put(f"{url}/api/contents/openshift.txt", headers=AUTH, timeout=30,
                           json={"type": "file", "format": "text", "content": "saved"})
        owner = c.container.exec_run(["stat", "-c", "%u:%g", f"/home/{target.user}/openshift.txt"], user="root").output.decode().strip()
        logs = c.logs()
        health = _healthy(c)  # the check runs as that uid too, with no passwd entry
    assert put.status_code == 201, f"saving a file as uid {user} answered {put.status_code}: {put.text[:300]}; logs: {logs[-800:]}"
    assert owner == user, f"the saved file is {owner!r}, not in the image's home as {user}"
    assert health is None, f"jupyter as uid {user}: {health}"


def test_home_of_another_owner_is_one_line(image, target):
    """A home volume the uid may not write: the server still starts, and ONE line says what happened."""
    with _jupyter(image, ["jupyter"], tmpfs={f"/home/{target.user}": "uid=4242,gid=4242,mode=0755"}, **FAST) as c:
        url = f"http://127.0.0.1:{c.port(8888)}"
        wait_http(f"{url}/api/status", headers=AUTH, running=c)
        logs = c.logs()
        health = _healthy(c)  # the server's runtime dir is under the HOME the entrypoint picked instead
    lines = [x for x in logs.splitlines() if "is not writable by uid" in x]
    assert len(lines) == 1, f"expected one line about the home's owner, got {lines}"
    assert health is None, f"jupyter with a HOME of another owner: {health}"


READ_ONLY = {"read_only": True, "tmpfs": {"/tmp": "exec"}}


def test_read_only_root_shell_and_jupyter(image):
    """`--read-only --tmpfs /tmp:exec`: a command runs and the jupyter mode serves."""
    with _run().container(image, ["shell", "-c", "python -c 'import torch; print(\"RO-OK\")'"], **READ_ONLY) as c:
        rc = c.container.wait(timeout=300)["StatusCode"]
        assert rc == 0 and "RO-OK" in c.logs(), f"shell on a read-only root (exit {rc}): {c.logs()[-800:]}"
    with _jupyter(image, ["jupyter"], **READ_ONLY, **FAST) as c:
        wait_http(f"http://127.0.0.1:{c.port(8888)}/api/status", headers=AUTH, running=c)
        health = _healthy(c)
    assert health is None, f"jupyter on a read-only root: {health}"


def test_read_only_root_ssh(image, target):
    """ssh mode on a read-only root: host key and authorized keys under /tmp, and a key login runs torch."""
    import paramiko

    key = paramiko.RSAKey.generate(2048)
    pub = f"{key.get_name()} {key.get_base64()}"
    with _run().container(image, ["ssh"], user="root", env={"SSH_AUTHORIZED_KEYS": pub}, ports={22: None}, **READ_ONLY, **FAST) as c:
        c.wait_for_log(r"Server listening on", timeout=60)
        health = _healthy(c)
        cli = paramiko.SSHClient()
        cli.set_missing_host_key_policy(paramiko.AutoAddPolicy())
        cli.connect("127.0.0.1", c.port(22), username=target.user, pkey=key, look_for_keys=False, allow_agent=False, timeout=30)
        try:
            _, out, _ = cli.exec_command("python -c 'import torch; print(torch.__version__)'", timeout=120)
            got = out.read().decode().strip()
        finally:
            cli.close()
    assert got == target.torch, f"python over ssh on a read-only root: {got!r}"
    assert health is None, f"ssh on a read-only root: {health}"


def test_read_only_root_metrics(image):
    with _run().container(image, ["metrics"], ports={9400: None}, **READ_ONLY, **FAST) as c:
        r = wait_http(f"http://127.0.0.1:{c.port(9400)}/metrics", running=c, timeout=60)
        health = _healthy(c)
    assert "gpuforge_gpus" in r.text
    assert health is None, f"metrics on a read-only root: {health}"
