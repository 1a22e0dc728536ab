"""Pure parts of the gate: which containers are reaped, how registry tool errors read, and what counts
as an insecure (plain HTTP) registry. Engine and registry behaviour is in tests/integration."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
import state_here

from gpuforge.engine import containers as run
from gpuforge.errors import RegistryError
from gpuforge.registry import client as registry


def test_a_live_process_owns_its_containers():
    assert run.owner_alive(run._owner())


def test_a_dead_process_does_not():
    p = subprocess.Popen([sys.executable, "-c", "import os; print(os.getpid())"], stdout=subprocess.PIPE, text=True)
    pid = int(p.communicate()[0])
    started = run._started(os.getpid())  # any start time: the pid is gone, so nothing matches it
    assert not run.owner_alive(f"{socket.gethostname()}:{pid}:{started}")


def test_a_reused_pid_is_not_the_owner():
    """Same pid, other start time: the original owner is gone even though the pid is alive."""
    assert not run.owner_alive(f"{socket.gethostname()}:{os.getpid()}:1")


@pytest.mark.parametrize("owner", ["other-host:1:1", "garbage", f"{socket.gethostname()}:notapid:1", ""])
def test_foreign_or_unreadable_owners_are_left_alone(owner):
    assert run.owner_alive(owner) is None  # not judged: `clean` keeps it (only --all removes it)


def test_an_owner_from_before_the_last_boot_is_gone():
    """Same host, pid and start time, but another boot id: the machine rebooted since, that process is gone."""
    boot = run._boot_id()
    assert boot and run.owner_alive(run._owner(), boot) is True
    assert run.owner_alive(run._owner(), "00000000-0000-0000-0000-000000000000") is False


def test_the_owner_label_keeps_the_format_older_versions_read():
    """host:pid:start, as gpuforge 593cb6f parses it: an older gpuforge on the same runner must not take a
    live run's container for a dead one's (a 4-field value once made them reap each other's containers)."""
    host, pid, started = run._owner().split(":")
    assert (host, pid) == (socket.gethostname(), str(os.getpid())) and started.isdigit()


def test_clean_says_what_it_kept():
    assert run.Swept(0, 0, 0).line() == "removed 0 gpuforge container(s)"
    line = run.Swept(2, 3, 1).line()
    assert line.startswith("removed 2 gpuforge container(s); kept 3 of live runs, 1 of unknown owner")
    assert "\n" not in line


@pytest.mark.parametrize(("host", "insecure"), [
    ("127.0.0.1:5100", True), ("localhost:5000", True), ("127.1.2.3", True),
    ("registry.example.com", False), ("127.0.0.1.evil.example:443", False), ("10.0.0.1:5000", False),
])
def test_only_loopback_registries_are_plain_http(host, insecure, monkeypatch):
    monkeypatch.delenv("GPUFORGE_REGISTRY_INSECURE", raising=False)
    assert registry.insecure(host, registry.ANONYMOUS) is insecure


@pytest.mark.parametrize(("stderr", "words"), [
    ('time="..." level=fatal msg="Error reading manifest x: unauthorized: authentication required"', "refused the credentials"),
    ("level=fatal msg=\"... denied: requested access to the resource is denied\"", "refused the credentials"),
    ('level=fatal msg="pinging container registry 127.0.0.1:5199: dial tcp 127.0.0.1:5199: connect: connection refused"',
     "cannot reach registry"),
    ('level=fatal msg="something else entirely"', "something else entirely"),
    ('level=fatal msg="reading manifest sha256:af241b7b1a8fbc309f10e6a3d6405a91e2524d1a1b634514033843b8d5af9926: received '
     'unexpected HTTP status: 500"', "unexpected HTTP status"),  # "403" inside a digest is not a refusal
    ('level=fatal msg="... received unexpected HTTP status: 401 Unauthorized"', "refused the credentials"),
])
def test_skopeo_errors_become_one_clear_line(stderr, words):
    r = subprocess.CompletedProcess([], 1, "", stderr)
    with pytest.raises(RegistryError, match=words) as e:
        registry._fail(r, "127.0.0.1:5199", "GET x:y")
    assert "\n" not in str(e.value)


def test_env_credentials_go_to_a_private_file_never_argv(monkeypatch):
    monkeypatch.setenv("GPUFORGE_REGISTRY_USER", "u")
    monkeypatch.setenv("GPUFORGE_REGISTRY_PASSWORD", "p4ss")
    with registry.auth_file(state_here.auth(), "127.0.0.1:5100") as af:
        assert af and os.stat(af).st_mode & 0o077 == 0
        assert "127.0.0.1:5100" in open(af).read()
    assert not os.path.exists(af)


def test_arch_mismatch_names_both_sides():
    import dataclasses

    from gpuforge.builder import archcheck
    from gpuforge.image import compat

    v = compat.variant("2.7.1", "12.6")
    assert archcheck.mismatch(v, [*v.arch_list, *v.ptx]) is None
    why = archcheck.mismatch(dataclasses.replace(v, ptx=("compute_90",)), list(v.arch_list))
    assert "missing from the wheel: ['compute_90']" in why and "compat.yaml" in why
    why = archcheck.mismatch(v, [*v.arch_list, "sm_100"])
    assert "not in compat: ['sm_100']" in why


def test_a_zombie_owner_is_gone():
    """A killed run's process may linger as a zombie when nothing collects it (PID 1 in some containers)."""
    import time

    p = subprocess.Popen([sys.executable, "-c", "pass"])
    owner = f"{socket.gethostname()}:{p.pid}:{run._started(p.pid)}"
    for _ in range(100):  # exited but not waited for: a zombie
        if open(f"/proc/{p.pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z":
            break
        time.sleep(0.05)
    assert not run.owner_alive(owner)
    p.wait()


def test_a_manifest_gone_is_not_a_refusal_whatever_its_digest_holds():
    """A deleted manifest whose digest holds "403" (CI's registry test failed once on one): not found, not denied."""
    err = ('level=fatal msg="Error parsing image name \\"docker://127.0.0.1:5100/gpuforge/gone@sha256:af241b7b1a8fbc309f10e6a3d6405a91'
           '2524d1a1b634514033843b8d5af9926\\": reading manifest sha256:af24...: manifest unknown"')
    assert registry._NOT_FOUND.search(err) and not registry._DENIED.search(err)
