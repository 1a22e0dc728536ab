"""The Rekor transparency log, decided once by the Signer and Verifier the CLI makes (gpuforge/registry/attest.py):
keyless signing and verification always use it; a key pair only when GPUFORGE_COSIGN_TLOG=1 asks, so a key-signed
statement about a private registry's digest never reaches the public log by default. Each case is checked on the
cosign arguments the objects resolve to, and the signing command line on what cosign is actually run with."""

from __future__ import annotations

import json
import os
import stat

import pytest

from conftest import BASE_MATRIX
from gpuforge import cli, options
from gpuforge.errors import ConfigError
from gpuforge.registry import attest

IDENTITY = "https://github.com/org/repo/.github/workflows/images.yml@refs/heads/main"
ISSUER = "https://token.actions.githubusercontent.com"
REF = "127.0.0.1:5999/gpuforge/pytorch@sha256:" + "a" * 64


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for s in options.TABLE:
        if s.env and s.env not in ("GPUFORGE_STATE_DIR", "GPUFORGE_LOG_DIR"):
            monkeypatch.delenv(s.env, raising=False)


@pytest.fixture
def keys(tmp_path):
    """A private and a public key file as the option checks want them (cosign never reads them here)."""
    priv, pub = tmp_path / "cosign.key", tmp_path / "cosign.pub"
    priv.write_text("-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----\nx\n-----END ENCRYPTED SIGSTORE PRIVATE KEY-----\n")
    pub.write_text("-----BEGIN PUBLIC KEY-----\nMFkw\n-----END PUBLIC KEY-----\n")
    return str(priv), str(pub)


def _made(command: str, environ: dict[str, str]):
    """The Signer and Verifier the CLI makes for `command` in `environ` (resolved once, as main() does)."""
    run = cli._make_run(options.resolve(command=command, environ=environ), None)
    return cli._signer(run, run.signing.signing_key), cli._verifier_or_none(run)


def _key_env(keys, tlog: str | None) -> dict[str, str]:
    env = {"GPUFORGE_COSIGN_KEY": keys[0], "GPUFORGE_COSIGN_PUBLIC_KEY": keys[1]}
    return {**env, "GPUFORGE_COSIGN_TLOG": tlog} if tlog is not None else env


def _keyless_env(tlog: str | None) -> dict[str, str]:
    env = {"GPUFORGE_COSIGN_IDENTITY": IDENTITY, "GPUFORGE_COSIGN_ISSUER": ISSUER}
    return {**env, "GPUFORGE_COSIGN_TLOG": tlog} if tlog is not None else env


@pytest.mark.parametrize("tlog", [None, "0"])
def test_a_key_pair_skips_the_log_unless_asked(keys, tlog):
    signer, verifier = _made("promote", _key_env(keys, tlog))
    assert signer.tlog is False and verifier.tlog is False
    assert signer.args() == ["--tlog-upload=false", "--key", keys[0]]
    assert verifier.args() == ["--key", keys[1], "--insecure-ignore-tlog=true"]


def test_a_key_pair_uses_the_log_when_tlog_is_1(keys):
    signer, verifier = _made("promote", _key_env(keys, "1"))
    assert signer.tlog is True and verifier.tlog is True
    assert signer.args() == ["--tlog-upload=true", "--key", keys[0]]
    assert verifier.args() == ["--key", keys[1]]


@pytest.mark.parametrize("tlog", [None, "1"])
def test_keyless_always_uses_the_log(tlog):
    signer, verifier = _made("promote", _keyless_env(tlog))
    assert signer.key is None and signer.tlog is True and verifier.tlog is True
    assert signer.args() == ["--tlog-upload=true"]
    assert verifier.args() == ["--certificate-identity", IDENTITY, "--certificate-oidc-issuer", ISSUER]


def test_keyless_with_the_log_turned_off_is_refused_in_one_line(write_matrix, monkeypatch, capsys):
    """Asked for no log, a keyless signature would still go to the public log (or not verify): refused, exit 2,
    before anything is read from a registry."""
    with pytest.raises(ConfigError, match=r"^GPUFORGE_COSIGN_TLOG: keyless signing and verification always use"):
        attest.Signer(tlog=False)
    for k, v in _keyless_env("0").items():
        monkeypatch.setenv(k, v)
    assert cli.main(["--matrix", str(write_matrix(BASE_MATRIX)), "status"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpuforge: error: GPUFORGE_COSIGN_TLOG: keyless") and err.count("\n") == 1, err


def test_the_decision_is_made_once_and_kept():
    """Made with the setting (None: unset), the object holds a plain bool from then on; a copy keeps it."""
    import dataclasses

    s = attest.Signer(key="k")
    assert s.tlog is False and dataclasses.replace(s).tlog is False
    assert attest.Signer().tlog is True and attest.Verifier().tlog is True
    assert attest.Verifier.of(key="k.pub", identity=IDENTITY, issuer=ISSUER, tlog=None).tlog is False  # the key wins


@pytest.fixture
def fake_cosign(tmp_path, monkeypatch):
    """A `cosign` first on PATH that records its arguments and succeeds: what attest() runs, seen from outside."""
    bin_dir, log = tmp_path / "bin", tmp_path / "argv.json"
    bin_dir.mkdir()
    exe = bin_dir / "cosign"
    exe.write_text(f"#!/usr/bin/env python3\nimport json, sys\nopen({str(log)!r}, 'w').write(json.dumps(sys.argv[1:]))\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return lambda: json.loads(log.read_text())


@pytest.mark.parametrize(("case", "upload", "with_key"), [
    ("key, unset", "false", True), ("key, 1", "true", True), ("keyless, unset", "true", False),
    ("keyless, 1", "true", False)])
def test_cosign_attest_is_run_with_the_decision(keys, fake_cosign, tmp_path, case, upload, with_key):
    tlog = "1" if case.endswith("1") else None
    env = _key_env(keys, tlog) if with_key else _keyless_env(tlog)
    signer, _ = _made("validate", env)
    predicate = tmp_path / "p.json"
    predicate.write_text("{}")
    attest.attest(REF, predicate, attest.VALIDATION_TYPE, signer=signer)
    argv = fake_cosign()
    assert f"--tlog-upload={upload}" in argv
    assert (["--key", keys[0]] == argv[argv.index("--key"):argv.index("--key") + 2]) if with_key else "--key" not in argv
    assert argv[0] == "attest" and argv[-1] == REF


@pytest.mark.parametrize(("env", "ctlog"), [("key", False), ("key+1", True), ("keyless", True)])
def test_the_admission_policy_checks_the_log_where_statements_go_to_it(keys, write_matrix, monkeypatch, capsys, env,
                                                                       ctlog):
    chosen = ({"GPUFORGE_COSIGN_PUBLIC_KEY": keys[1], **({"GPUFORGE_COSIGN_TLOG": "1"} if env == "key+1" else {})}
              if env.startswith("key+") or env == "key" else _keyless_env(None))
    for k, v in chosen.items():
        monkeypatch.setenv(k, v)
    m = write_matrix(BASE_MATRIX)
    assert cli.main(["--matrix", str(m), "policy", "--env", "prod", "--format", "policy-controller"]) == 0
    [authority] = json.loads(capsys.readouterr().out)["spec"]["authorities"]
    assert ("ctlog" in authority) is ctlog
    assert ("keyless" in authority) is (env == "keyless")
