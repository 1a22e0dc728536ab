"""`gpuforge clean` removes only containers whose owning process is gone (unless --all), against the real
engine: a live owner's container stays running, a SIGKILLed owner's goes, a container from before the last
boot goes, another host's stays. That a whole `validate` stays green with `clean` run again and again beside it
(a clean during a validate must never remove a live run's containers) is proven in test_install.py,
by the installed copy's own validate and clean: one full validation serves both claims.

--all and the hand-labelled containers run on a private second engine: --all on the shared one would stop
other runs' containers.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys

import docker
import docker.errors
import pytest
from second_engine import SecondEngine, StartError

from conftest import ROOT, dead_runs_window, gpuforge, need
from gpuforge.builder import bases
from gpuforge.engine import client as engine
from gpuforge.engine import containers as run
from gpuforge.plan.matrix import load_matrix

pytestmark = pytest.mark.docker

# A gpuforge run that holds one container until its stdin closes (or it is SIGKILLed).
OWNER = """
import sys
from gpuforge.engine import containers as run
with run.container(sys.argv[1], ["sleep", "infinity"]) as c:
    print(c.id, flush=True)
    sys.stdin.read()
"""


@pytest.fixture(scope="module")
def base_image(docker_engine):
    t = load_matrix().select(None)[0]
    bases.ensure_base(t, log=lambda *_: None)
    return t.base_image


def _owner(*args: str, env: dict | None = None, script: str = OWNER) -> tuple[subprocess.Popen, str]:
    """A gpuforge run holding what `script` makes (a container of image args[0], or a network) until its stdin closes:
    (the process, the id it printed)."""
    p = subprocess.Popen([sys.executable, "-c", script, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})}, cwd=ROOT)
    made = p.stdout.readline().strip()
    assert made, p.stderr.read()
    return p, made


def _clean(*args: str, env: dict | None = None) -> str:
    r = gpuforge("clean", *args, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stderr == "", f"clean must say its count once, on stdout; stderr: {r.stderr!r}"
    [line] = r.stdout.splitlines()
    assert line.startswith("removed "), line
    return line


def test_clean_keeps_a_live_runs_container_and_removes_a_killed_runs(docker_engine, base_image):
    live, live_id = _owner(base_image)
    dead, dead_id = _owner(base_image)
    try:
        with dead_runs_window(leaves_them=True):  # a killed run's container on the shared engine, until this clean
            dead.send_signal(signal.SIGKILL)  # no `finally` runs: its container is left behind, as after an OOM kill
            dead.wait()
            assert docker_engine.containers.get(dead_id).status == "running"
            line = _clean()
            assert "of live runs" in line  # at least this test's live owner
            assert docker_engine.containers.get(live_id).status == "running"
            with pytest.raises(docker.errors.NotFound):
                docker_engine.containers.get(dead_id)
    finally:
        live.stdin.close()  # the live owner ends normally and removes its own container
        live.wait(timeout=60)
        dead.kill()
    with pytest.raises(docker.errors.NotFound):
        docker_engine.containers.get(live_id)


@pytest.fixture(scope="module")
def private_engine(docker_engine, base_image):
    if not (shutil.which("dockerd") and shutil.which("ip")):
        need("needs dockerd and ip (a private second engine, so --all stops no one else's container)")
    try:
        eng = SecondEngine(prefix="gf18c-")
    except (StartError, subprocess.CalledProcessError) as e:
        pytest.fail(f"second engine: {e}")
    try:
        eng.load(base_image)
        yield eng
    finally:
        eng.stop()


def _labelled(eng, owner: str, boot: str) -> str:
    labels = {engine.LABEL_OWNER: "gpuforge", run.RUN_LABEL: "test18", run.OWNER_LABEL: owner, run.BOOT_LABEL: boot}
    return eng.client.containers.create(_base(eng), ["sleep", "infinity"], labels=labels).id


def _base(eng) -> str:
    return load_matrix().select(None)[0].base_image


def test_owners_from_before_a_reboot_go_and_other_hosts_stay_then_all_removes_every_one(private_engine):
    eng = private_engine
    env = {"DOCKER_HOST": eng.host}
    _host, pid, started = run._owner().split(":")
    before_reboot = _labelled(eng, run._owner(), "00000000-0000-0000-0000-000000000000")  # this very process, another boot
    other_host = _labelled(eng, f"another-runner:{pid}:{started}", run._boot_id())
    unlabelled = eng.client.containers.create(_base(eng), ["true"], labels={engine.LABEL_OWNER: "gpuforge"}).id
    live, live_id = _owner(_base(eng), env=env)
    try:
        line = _clean(env=env)
        assert line == ("removed 1 gpuforge container(s); kept 1 of live runs, 2 of unknown owner "
                        "(another host or namespace; --all removes them)")
        ids = {c.id for c in eng.client.containers.list(all=True)}
        assert before_reboot not in ids and {other_host, unlabelled, live_id} <= ids
        assert _clean("--all", env=env) == "removed 3 gpuforge container(s)"
        assert eng.client.containers.list(all=True) == []
    finally:
        live.stdin.close()
        live.wait(timeout=60)


# A gpuforge run that holds one network of its own (a validator's IPv6 or closed network) until stdin closes.
NET_OWNER = """
import sys
from gpuforge.engine import containers as run
with run.network(internal=True) as n:
    print(n.id, flush=True)
    sys.stdin.read()
"""


def test_clean_removes_the_network_of_a_killed_run_and_keeps_a_live_ones(private_engine):
    # on the private engine: on the shared one another module's `clean` (test_install runs one every 3 s beside a
    # validate) may remove the killed run's network first, and this clean then has none to count (a whole run failed so)
    eng, env = private_engine, {"DOCKER_HOST": private_engine.host}
    live, live_id = _owner(script=NET_OWNER, env=env)
    dead, dead_id = _owner(script=NET_OWNER, env=env)
    try:
        dead.send_signal(signal.SIGKILL)  # its `finally` never runs: the network stays, as after an OOM kill
        dead.wait()
        eng.client.networks.get(dead_id)
        line = _clean(env=env)
        assert line.startswith("removed 0 gpuforge container(s) and 1 network(s)"), line
        eng.client.networks.get(live_id)  # a live run's network stays
        with pytest.raises(docker.errors.NotFound):
            eng.client.networks.get(dead_id)
    finally:
        live.stdin.close()  # the live owner ends normally and removes its own network
        live.wait(timeout=60)
        dead.kill()
    with pytest.raises(docker.errors.NotFound):
        eng.client.networks.get(live_id)
