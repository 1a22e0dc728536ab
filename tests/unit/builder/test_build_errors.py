"""A failed build's error line names the cause and the fix (diagnosis.diagnose), and the host's CA trust is the
build's CA secret by default (gpuforge.options' extra_ca falls back to the host's pip trust)."""

from __future__ import annotations

import pytest

from gpuforge.builder import diagnosis
from gpuforge.builder import runner as build
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
    assert phrase in (diagnosis.diagnose(f"#1 [internal] load build definition\n{line}\n#9 ERROR: exit code: 1\n") or "")


def test_unrecognised_failure_is_not_guessed():
    assert diagnosis.diagnose("#9 ERROR: process \"/bin/sh -c false\" did not complete successfully: exit code: 1") is None


def test_host_trust_order_and_missing_file(monkeypatch, tmp_path):
    """No --extra-ca, GPUFORGE_EXTRA_CA or matrix extra_ca: the host's pip trust, in pip's order, PEM-checked."""
    from gpuforge import options

    a, b = tmp_path / "pip.pem", tmp_path / "ssl.pem"
    a.write_text("-----BEGIN CERTIFICATE-----\nx\n")
    b.write_text("-----BEGIN CERTIFICATE-----\ny\n")
    for env in (*build.HOST_TRUST_ENV, "GPUFORGE_EXTRA_CA"):
        monkeypatch.delenv(env, raising=False)

    def extra_ca():
        r = options.resolve(command="build").get("extra_ca")
        return r.value, r.source

    assert extra_ca() == (None, "default")
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(b))
    assert extra_ca() == (str(b), "REQUESTS_CA_BUNDLE")
    monkeypatch.setenv("PIP_CERT", str(a))
    assert extra_ca() == (str(a), "PIP_CERT")
    monkeypatch.setenv("PIP_CERT", str(tmp_path / "gone.pem"))
    with pytest.raises(ConfigError, match=r"^PIP_CERT: .*gone.pem: no such file"):
        extra_ca()


def test_unknown_driver_from_the_environment_is_refused():
    from conftest import gpuforge

    r = gpuforge("build", env={"GPUFORGE_DRIVER": "buildkitd; rm -rf /"})
    assert r.returncode == 2
    assert r.stderr == ("gpuforge: error: GPUFORGE_DRIVER: 'buildkitd; rm -rf /' is not a build driver "
                        "(allowed: auto, buildx, classic)\n")
