"""The image's HEALTHCHECK (images/programs/health.py) as the engine reports it (`docker inspect`, State.Health): the
image declares one with settings that can keep the promises below; every long-running mode goes `healthy` within
30 s of `docker run` with the settings shipped; its server stopped INSIDE the running container (SIGSTOP: the process
keeps its port and the kernel still completes TCP handshakes, as for a hung server) makes it `unhealthy` within
30 s, and no probe begun after the stop may say healthy; an exporter beside a mode (GPUFORGE_METRICS_PORT) that dies
makes the container unhealthy too; shell and one-shot commands are healthy with nothing asked, and none of their
probes fails.

Every mode this run checks is started at once (one module fixture) and every server stopped at once, so the module
waits for about one start and one stop, not one per mode. The bars are the product's (docs/images.md, "Health
check"), never read from the image under test. The journeys (test_journeys.py, test_metrics.py) hold the check to
`healthy` in the ways people start the image (as root, an arbitrary uid, Kubeflow's NB_PREFIX, read-only roots).
"""

from __future__ import annotations

import base64
import contextlib
import os
import time

import pytest

from vutil import Health, engine_time

HEALTHY_BAR = 30.0  # s from the container's start to the end of its first healthy probe
UNHEALTHY_BAR = 30.0  # s from the server's stop to `unhealthy`
# where gpuforge's template puts the program (gpuforge/render/templates/Dockerfile.j2)
PROGRAM = "/opt/gpuforge/programs/health.py"

# A public key nobody holds the private half of: the ssh mode needs one to start, no one logs in here.
PUB = "ssh-ed25519 " + base64.b64encode(b"\0\0\0\x0bssh-ed25519\0\0\0\x20" + os.urandom(32)).decode() + " health"
FOREVER = ["sleep", "infinity"]

# mode: (command, container options, a fixed string of the server's command line, the signal that stops it)
MODES = {
    "jupyter": (["jupyter"], {}, "jupyter-lab", "STOP"),
    "ssh": (["ssh"], {"user": "root", "env": {"SSH_AUTHORIZED_KEYS": PUB}}, "[listener]", "STOP"),
    "metrics": (["metrics"], {}, "programs/metrics.py", "STOP"),
    # the exporter beside a mode is not the container's main process: it can die while the container runs on
    "metrics-beside": (["shell", "-c", "sleep infinity"], {"env": {"GPUFORGE_METRICS_PORT": "9400"}}, "programs/metrics.py", "KILL"),
    "shell": (["shell", "-c", "sleep infinity"], {}, None, None),
    "command": (FOREVER, {}, None, None),
}
SERVERS = [m for m, (_, _, server, _) in MODES.items() if server]
QUIET = [m for m in MODES if m not in SERVERS]

# The first process (not this shell) whose command line holds $1 gets signal $2; prints its pid and the time
# (the container's clock is the engine's: the probes' Start times are compared with it).
STOP = ('for d in /proc/[0-9]*; do p=${d#/proc/}; [ "$p" = "$$" ] && continue; '
        'if tr "\\0" " " < "$d/cmdline" 2>/dev/null | grep -qF -- "$1"; then kill -"$2" "$p" && echo "$p $(date +%s.%N)"; exit; fi; '
        'done; echo "no process matches $1" >&2; exit 3')


def _seconds(ns) -> float:
    return (ns or 0) / 1e9


def test_the_image_declares_a_healthcheck(image):
    """One HEALTHCHECK that runs the image's health program, probing often enough that a server ready 20 s after
    `docker run` is healthy by 30 s, judging on more than one probe, and patient for a long warm start."""
    from gpuforge.engine import client as engine

    hc = engine.client().images.get(image).attrs["Config"].get("Healthcheck") or {}
    test = hc.get("Test") or []
    assert test and test[0] != "NONE", "the image declares no HEALTHCHECK: docker ps, Compose and Swarm cannot tell a hung server"
    assert test[0] == "CMD" and PROGRAM in test, f"the HEALTHCHECK does not run {PROGRAM}: {test}"
    # the engine's defaults for what the image leaves out: 30 s interval and timeout, 3 retries, no start period
    interval, timeout = _seconds(hc.get("Interval")) or 30, _seconds(hc.get("Timeout")) or 30
    retries, start = hc.get("Retries") or 3, _seconds(hc.get("StartPeriod"))
    problems = []
    if interval + timeout > 10:
        problems.append(f"interval {interval:g} s + timeout {timeout:g} s: a server ready at 20 s is not seen healthy by {HEALTHY_BAR:g} s")
    if retries < 2:
        problems.append(f"retries {retries}: one slow answer would make it unhealthy")
    if start < 60:
        problems.append(f"start period {start:g} s: a warm start of a minute would be called unhealthy")
    assert not problems, "; ".join(problems)


@pytest.fixture(scope="module")
def started(image, request):
    """Every mode this run checks, started at once with the image's own health settings: {mode: Health}."""
    from gpuforge.engine import containers as run

    wanted = {i.callspec.params["mode"] for i in request.session.items
              if i.module is request.module and "mode" in getattr(getattr(i, "callspec", None), "params", {})}
    with contextlib.ExitStack() as stack:
        out = {}
        for mode, (command, kw, _, _) in MODES.items():
            if mode in wanted:
                out[mode] = Health(stack.enter_context(run.container(image, command, **kw)))
        yield out


def _failed_probe(h: Health) -> str | None:
    bad = [p for p in h.seen() if p["ExitCode"] != 0]
    return f"a probe failed where there is no server to ask: {bad[0]['Output'].strip()!r}" if bad else None


def _healthy(h: Health, mode: str) -> float:
    """Seconds from the container's start to the end of its first healthy probe; fails past the bar."""
    quiet = mode in QUIET
    ok = h.wait("healthy", h.t0 + HEALTHY_BAR + 3 - time.monotonic(), stop_if=_failed_probe if quiet else None)
    if not ok:
        pytest.fail(f"{mode}: not healthy {HEALTHY_BAR:g} s after docker run (status {h.status}); last probe: {h.last()!r}; "
                    f"logs: {h.running.logs()[-600:]}")
    first = min(engine_time(p["End"]) for p in h.seen() if p["ExitCode"] == 0)
    return first - h.started


@pytest.mark.parametrize("mode", list(MODES))
def test_healthy_within_30_s_of_docker_run(started, mode, facts):
    h = started[mode]
    took = _healthy(h, mode)
    facts.setdefault("health", {}).setdefault(mode, {})["healthy_s"] = round(took, 1)
    assert took <= HEALTHY_BAR, f"{mode}: healthy {took:.1f} s after docker run (bar {HEALTHY_BAR:g} s)"
    if mode in QUIET:
        assert h.last().endswith("no server to check"), f"{mode}: the check asked something: {h.last()!r}"


@pytest.fixture(scope="module")
def stopped(started) -> dict[str, tuple[float, float] | str]:
    """Each server of the modes started, stopped inside its running container once it was healthy, all at once:
    {mode: (the engine's time of the stop, this machine's)}, or why it was not stopped."""
    out: dict[str, tuple[float, float] | str] = {}
    for mode in SERVERS:
        if mode not in started:
            continue
        h = started[mode]
        if not h.wait("healthy", h.t0 + HEALTHY_BAR + 3 - time.monotonic()):
            out[mode] = f"never healthy (last probe: {h.last()!r}), so a stop proves nothing"
            continue
        _, _, server, signal = MODES[mode]
        r = h.running.container.exec_run(["sh", "-c", STOP, "sh", server, signal], user="root")
        words = r.output.decode(errors="replace").split()
        ok = r.exit_code == 0 and len(words) == 2
        out[mode] = (float(words[1]), time.monotonic()) if ok else f"could not stop it: {r.output[-300:]!r}"
    return out


@pytest.mark.parametrize("mode", SERVERS)
def test_unhealthy_once_its_server_stops_answering(started, stopped, mode, facts):
    h, stop = started[mode], stopped[mode]
    if isinstance(stop, str):
        pytest.fail(f"{mode}: {stop}")
    at, local = stop
    _, _, server, signal = MODES[mode]

    def said_healthy(h: Health) -> str | None:
        late = [p for p in h.seen(since=at + 0.5) if p["ExitCode"] == 0]
        return (f"{mode}: a probe begun after the server ({server!r}) was sent SIG{signal} said healthy: "
                f"{late[0]['Output'].strip()!r}") if late else None

    ok = h.wait("unhealthy", local + UNHEALTHY_BAR + 3 - time.monotonic(), stop_if=said_healthy)
    assert ok, f"{mode}: still {h.status} {UNHEALTHY_BAR:g} s after its server was sent SIG{signal}; last probe: {h.last()!r}"
    # the status turns with the failure that completes `retries` in a row (a probe under way at the stop counts)
    retries = (h.running.container.attrs["Config"].get("Healthcheck") or {}).get("Retries") or 3
    failed = sorted((p for p in h.seen(since=at - 10) if p["ExitCode"] != 0 and engine_time(p["End"]) > at),
                    key=lambda p: engine_time(p["End"]))
    took = engine_time(failed[min(retries, len(failed)) - 1]["End"]) - at
    facts.setdefault("health", {}).setdefault(mode, {})["unhealthy_s"] = round(took, 1)
    assert took <= UNHEALTHY_BAR, f"{mode}: unhealthy {took:.1f} s after its server stopped (bar {UNHEALTHY_BAR:g} s)"
    said = failed[-1]["Output"].strip()
    assert said.startswith(f"{mode.split('-')[0]}:") or f"; {mode.split('-')[0]}:" in said, f"{mode}: the probe says {said!r}"
