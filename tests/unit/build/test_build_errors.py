"""A failed build's error line names the cause and the fix (build.diagnose), and the host's CA trust is the
build's CA secret by default (build.host_trust)."""

from __future__ import annotations

import pytest

from gpuforge.build import runner as build
from gpuforge.errors import ConfigError

# (a line as pip, uv, apt or BuildKit print it, a phrase the diagnosis must contain)
LOGS = [
    ("#9 3.1 WARNING: Retrying ... SSLError(SSLCertVerificationError(1, '[SSL: CERTIFICATE_VERIFY_FAILED] certificate "
     "verify failed: self-signed certificate in certificate chain (_ssl.c:1006)'))", "TLS certificate verification failed"),
    ("#9 2.0   Caused by: invalid peer certificate: UnknownIssuer", "--extra-ca"),
    ("#6 ERROR: failed to copy: write /var/lib/docker/tmp/x: no space left on device", "no space left on device"),
    ('#2 ERROR: pull access denied for nvidia/cuda, repository does not exist or may require \'docker login\'',
     "base image cannot be pulled"),
    ("ERROR: failed to solve: nvidia/cuda:12.6.3-cudnn-runtime-ubuntu24.04: failed to resolve source metadata for "
     "docker.io/nvidia/cuda:12.6.3-cudnn-runtime-ubuntu24.04: failed to do request: Head \"https://registry-1.docker.io/"
     "v2/nvidia/cuda/manifests/12.6.3\": dial tcp: lookup registry-1.docker.io: no such host", "base image cannot be pulled"),
    ("#9 1.2   ╰─▶ Because there is no version of torch==2.7.99 and you require torch==2.7.99, we can conclude that "
     "your requirements are unsatisfiable.", "pinned Python package version is not on the index"),
    ("ERROR: No matching distribution found for torch==2.7.99", "pinned Python package version"),
    ("#7 4.0 E: Failed to fetch http://deb.debian.org/debian/dists/bookworm/InRelease  Temporary failure resolving",
     "index or mirror is unreachable"),
    ("#9 5.0 error: Failed to fetch: `https://pypi.org/simple/uv/`  Caused by: dns error: failed to lookup address",
     "index or mirror is unreachable"),
]


@pytest.mark.parametrize(("line", "phrase"), LOGS)
def test_build_log_is_diagnosed(line, phrase):
    assert phrase in (build.diagnose(f"#1 [internal] load build definition\n{line}\n#9 ERROR: exit code: 1\n") or "")


def test_unrecognised_failure_is_not_guessed():
    assert build.diagnose("#9 ERROR: process \"/bin/sh -c false\" did not complete successfully: exit code: 1") is None


def test_host_trust_order_and_missing_file(monkeypatch, tmp_path):
    a, b = tmp_path / "pip.pem", tmp_path / "ssl.pem"
    a.write_text("x")
    b.write_text("y")
    for env in build.HOST_TRUST_ENV:
        monkeypatch.delenv(env, raising=False)
    assert build.host_trust() is None
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(b))
    assert (build.host_trust().value, build.host_trust().source) == (str(b), "REQUESTS_CA_BUNDLE")
    monkeypatch.setenv("PIP_CERT", str(a))
    assert (build.host_trust().value, build.host_trust().source) == (str(a), "PIP_CERT")
    monkeypatch.setenv("PIP_CERT", str(tmp_path / "gone.pem"))
    with pytest.raises(ConfigError, match=r"^PIP_CERT: .*gone.pem: no such file"):
        build.host_trust()


def test_unknown_driver_from_the_environment_is_refused():
    from conftest import gpuforge

    r = gpuforge("build", env={"GPUFORGE_DRIVER": "buildkitd; rm -rf /"})
    assert r.returncode == 2 and "GPUFORGE_DRIVER='buildkitd; rm -rf /': not a build driver" in r.stderr
    assert "Traceback" not in r.stderr
