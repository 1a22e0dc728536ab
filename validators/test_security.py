"""security: sshd locked down, no host keys or secrets baked in, nothing world-writable on PATH."""

from __future__ import annotations

import re
from pathlib import Path

from gpuforge.validate.selection import EnvSkip
from vutil import EnvSkipped, sh

# Every hardening setting, as `sshd -T` reports the effective value (the image's sshd_config.d/gpuforge.conf).
SSHD_WANT = {
    "permitrootlogin": "no",
    "passwordauthentication": "no",
    "kbdinteractiveauthentication": "no",
    "challengeresponseauthentication": "no",
    "pubkeyauthentication": "yes",
    "permitemptypasswords": "no",
    "hostbasedauthentication": "no",
    "x11forwarding": "no",
    "allowtcpforwarding": "local",  # ssh -L to the container's own loopback only (permitopen), for Jupyter over SSH
    "permitopen": "localhost:* 127.0.0.1:*",
    "permitlisten": "none",
    "allowagentforwarding": "no",
    "allowstreamlocalforwarding": "no",
    "permittunnel": "no",
    "gatewayports": "no",
    "permituserenvironment": "no",
    "strictmodes": "yes",
    "hostkeyalgorithms": "ssh-ed25519",
    "maxauthtries": "3",
    "logingracetime": "30",
}
# Algorithms that must not be offered at all (NIST curves, SHA-1, CBC, 64-bit tags, DSA/ECDSA keys).
SSHD_WEAK = re.compile(r"nistp|sha1|-cbc|umac-64|ssh-dss|ssh-rsa$|ecdsa|diffie-hellman-group(1|14)-")
PRIVATE_KEY = r"-----BEGIN ([A-Z]+ )?PRIVATE KEY-----"
# Well-known token shapes (GitHub, GitLab, AWS, Slack, PyPI, Hugging Face), as whole words: base64 blobs
# (e.g. fonts embedded in PIL) contain AKIA... runs that are not keys.
TOKENS = (r"\b(ghp_[A-Za-z0-9]{36}|github_pat_[A-Za-z0-9_]{40,}|glpat-[A-Za-z0-9_-]{20}|AKIA[0-9A-Z]{16}"
          r"|xox[bp]-[0-9A-Za-z-]{20,}|pypi-AgEI[A-Za-z0-9_-]{20,}|hf_[A-Za-z0-9]{34})\b")
# Test fixtures that Python packages ship (e.g. tornado/test/test.key) are not secrets.
KEY_ALLOW = re.compile(r"/site-packages/[^/]+/(.+/)?tests?/")
SCAN = "grep -rlIE --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev -e %s / 2>/dev/null | head -50"


def test_sshd_effective_settings(ssh_server, timeout):
    out = sh(ssh_server.root, "/usr/sbin/sshd -T", timeout=timeout).stdout
    eff = dict(line.split(" ", 1) for line in out.splitlines() if " " in line)
    wrong = {k: eff.get(k) for k, v in SSHD_WANT.items() if eff.get(k) != v and not (k == "challengeresponseauthentication"
                                                                                   and k not in eff)}
    assert not wrong, f"sshd -T differs from the hardening settings (setting: effective value): {wrong}"
    weak = {k: [a for a in eff.get(k, "").split(",") if SSHD_WEAK.search(a)]
            for k in ("kexalgorithms", "ciphers", "macs", "hostkeyalgorithms", "pubkeyacceptedalgorithms")}
    weak = {k: v for k, v in weak.items() if v}
    assert not weak, f"sshd offers weak algorithms: {weak}"


def test_no_ssh_host_keys_in_image(host, image):
    keys = [f for f in host.file("/etc/ssh").listdir() if f.startswith("ssh_host_")]
    assert not keys, f"SSH host keys baked into the image: {keys} (every container must make its own)"


def test_host_keys_differ_between_containers(ssh_server, second_ssh_server, timeout):
    cmd = "ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub"
    a = sh(ssh_server.root, cmd, timeout=timeout).stdout.split()[1]
    b = sh(second_ssh_server.root, cmd, timeout=timeout).stdout.split()[1]
    assert a != b, f"two containers of one image share the host key {a}"


def test_path_has_no_world_writable_dir(host):
    path = host.environment().get("PATH", "")
    bad = [d for d in path.split(":") if d and host.file(d).exists and host.file(d).mode & 0o002]
    assert not bad, f"world-writable directories on PATH: {bad}"


def test_no_unexpected_setuid_files(root_host, image, pytestconfig, timeout):
    allow = {p for p in pytestconfig.getoption("gpuforge_setuid_allow").split(",") if p}
    out = sh(root_host, "find / -xdev -type f -perm /6000 2>/dev/null", timeout=timeout, check=False).stdout.split()
    unexpected = sorted(set(out) - allow)
    assert not unexpected, f"setuid/setgid files: {unexpected}"


def test_no_private_keys_or_tokens(root_host, image, timeout):
    keys = sh(root_host, SCAN, PRIVATE_KEY, timeout=timeout, check=False).stdout.split()
    keys = [k for k in keys if not KEY_ALLOW.search(k)]
    assert not keys, f"private keys in the image: {keys}"
    tokens = sh(root_host, SCAN, TOKENS, timeout=timeout, check=False).stdout.split()
    assert not tokens, f"files holding token-shaped strings: {tokens}"


# The public roots the host's distribution ships (Debian/Ubuntu's ca-certificates). A build's bundle is usually the
# host's whole trust store: its public roots are in every certifi copy too, and a host and an image whose
# ca-certificates differ by one security update (a root added or distrusted) would otherwise look like a leak.
HOST_PUBLIC_ROOTS = Path("/usr/share/ca-certificates/mozilla")


def _distinct_certs(ca_path: str, root_host, timeout) -> list[str]:
    """Certificates of the build's CA bundle that are private to it: neither in the image's own trust store nor a
    public root the host's distribution ships (what is left is the extra CA the build was given, e.g. a proxy's)."""
    text = Path(ca_path).read_text()
    certs = re.findall(r"-----BEGIN CERTIFICATE-----\n(.+?)\n", text)
    system = sh(root_host, "cat /etc/ssl/certs/ca-certificates.crt 2>/dev/null", timeout=timeout, check=False).stdout
    public = "".join(f.read_text(errors="replace") for f in sorted(HOST_PUBLIC_ROOTS.glob("*.crt")))
    return [c for c in certs if c not in system and c not in public]


def test_build_ca_nowhere_in_filesystem(root_host, image, pytestconfig, timeout, facts):
    ca = pytestconfig.getoption("gpuforge_ca")
    if not ca:
        raise EnvSkipped(EnvSkip.NO_BUILD_CA, "no --gpuforge-ca given")
    needles = _distinct_certs(ca, root_host, timeout)
    facts["ca_certs_searched"] = len(needles)
    if not needles:
        return
    # one pass over the filesystem for all the certificates (a file holding any of them is a hit): a whole-image grep
    # per certificate was the validator suite's longest check (21.5 s for 3 certificates); bytes, not characters
    patterns = " ".join("-e %s" for _ in needles)
    hits = sh(root_host, f"LC_ALL=C grep -rlF --exclude-dir=proc --exclude-dir=sys {patterns} / 2>/dev/null | head",
              *(n[:60] for n in needles), timeout=timeout, check=False).stdout.split()
    assert not hits, f"the build's CA certificate landed in the image: {hits}"


def test_history_has_no_secrets(image, pytestconfig):
    from gpuforge.engine import client as engine

    hist = "\n".join(h.get("CreatedBy", "") for h in engine.client().images.get(image).history())
    assert not re.search(PRIVATE_KEY, hist), "a private key is in docker history"
    assert not re.search(TOKENS, hist), "a token-shaped string is in docker history"
    assert not re.search(r"//[^/\s:@]+:[^/\s@]+@", hist), "a URL with credentials is in docker history"
    ca = pytestconfig.getoption("gpuforge_ca")
    if ca:
        body = re.findall(r"-----BEGIN CERTIFICATE-----\n(.+?)\n", Path(ca).read_text())
        assert not any(b in hist for b in body), "the build's CA bundle is in docker history"
