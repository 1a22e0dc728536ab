"""ssh entrypoint: key login as the non-root user works and runs torch; root, password and wrong keys are refused."""

from __future__ import annotations

import socket

import paramiko
import pytest


def _client() -> paramiko.SSHClient:
    c = paramiko.SSHClient()
    c.set_missing_host_key_policy(paramiko.AutoAddPolicy())  # fresh per-container host key
    return c


def _exec(c: paramiko.SSHClient, cmd: str, timeout: int) -> tuple[int, str, str]:
    _, out, err = c.exec_command(cmd, timeout=timeout)
    rc = out.channel.recv_exit_status()
    return rc, out.read().decode(), err.read().decode()


def test_key_login_runs_torch_as_non_root(ssh_server, target, timeout, facts):
    c = _client()
    c.connect("127.0.0.1", ssh_server.port, username=ssh_server.user, pkey=ssh_server.key,
              look_for_keys=False, allow_agent=False, timeout=30)
    try:
        rc, out, err = _exec(c, 'python3 -c "import os, torch; print(os.getuid(), torch.__version__)"', timeout)
    finally:
        c.close()
    assert rc == 0, f"python over ssh failed: {err[-1500:]}"
    uid, version = out.split()
    facts["ssh_login_uid"] = int(uid)
    assert int(uid) != 0, "the ssh session runs as root"
    assert version == target.torch


def test_root_login_refused(ssh_server):
    """root holds the same valid key as the user (the fixture installs it): only sshd's policy can refuse."""
    c = _client()
    try:
        c.connect("127.0.0.1", ssh_server.port, username="root", pkey=ssh_server.key,
                  look_for_keys=False, allow_agent=False, timeout=30)
    except paramiko.AuthenticationException:
        return
    finally:
        c.close()
    pytest.fail("root logged in over ssh with a valid authorized key (PermitRootLogin must be no)")


def test_password_login_refused(ssh_server):
    sock = socket.create_connection(("127.0.0.1", ssh_server.port), timeout=30)
    t = paramiko.Transport(sock)
    try:
        t.start_client(timeout=30)
        allowed = None
        try:
            t.auth_none(ssh_server.user)  # the server answers with the methods it would accept
        except paramiko.BadAuthenticationType as e:
            allowed = e.allowed_types
        assert allowed == ["publickey"], f"sshd offers {allowed}: only publickey may be allowed"
        with pytest.raises(paramiko.SSHException):  # BadAuthenticationType or AuthenticationException
            t.auth_password(ssh_server.user, "gpuforge")
    finally:
        t.close()


def test_wrong_key_refused(ssh_server):
    c = _client()
    with pytest.raises(paramiko.AuthenticationException):
        c.connect("127.0.0.1", ssh_server.port, username=ssh_server.user, pkey=paramiko.RSAKey.generate(2048),
                  look_for_keys=False, allow_agent=False, timeout=30)
    c.close()


def test_ssh_audit_finds_no_failures(ssh_server, facts, timeout):
    """ssh-audit (PyPI) against the running sshd: no algorithm or key it rates `fail`."""
    import subprocess
    import sys

    import sshaudit

    # the pinned package of the interpreter running the validators, as a module: no console script needed on PATH
    # or beside the interpreter (wheels installed with --target, as on an offline GPU node, have none)
    r = subprocess.run([sys.executable, "-m", "ssh_audit", "-j", "-p", str(ssh_server.port), "127.0.0.1"],
                       capture_output=True, text=True, timeout=timeout)
    facts["ssh_audit_raw"] = {"exit": r.returncode, "stdout": r.stdout[-20000:], "stderr": r.stderr[-4000:]}  # kept
    rep, shape = sshaudit.parse(r.stdout)
    if rep is None:
        pytest.fail(f"ssh-audit's output is not the JSON 3.9.0 writes (exit {r.returncode}): {'; '.join(shape)}; "
                    f"raw (also in the report's facts.ssh_audit_raw): {(r.stdout or r.stderr)[-600:]!r}")
    fails = sshaudit.fail_items(rep)
    facts["ssh_audit_fail"] = len(fails)
    assert not fails, f"ssh-audit fail items: {fails}"


def test_only_sshd_listens(ssh_server, timeout):
    """ssh mode needs port 22 and nothing else (no Jupyter, no forwarding listeners)."""
    from plugin import listening

    socks = listening(ssh_server.root, timeout)
    assert {p for _, p in socks} == {22}, f"listening in ssh mode: {socks}"


def test_no_key_given_is_a_clear_error(image):
    from gpuforge.engine import containers as run

    with run.container(image, ["ssh"], user="root") as c:
        c.container.wait(timeout=60)
        logs = c.logs()
    assert "ssh mode needs a public key" in logs, f"logs: {logs[-800:]}"
