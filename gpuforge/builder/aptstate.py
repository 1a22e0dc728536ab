"""GPUFORGE_APT_STATE: the key of an image's system layer, resolved once per build from the apt suites the image
installs from, so that layer (apt-get update, upgrade, install) is rebuilt when one of them published other packages
and taken from BuildKit's cache while none did.

The value is a digest of the SHA256 sums each suite's InRelease lists for its binary package indexes
(`<component>/binary-<arch>/Packages`), read over http from the mirror the image's apt uses: it changes when a package
is added, replaced or removed, not when a Release file is only signed again (the security suite is, daily, with a new
Date and Valid-Until). The same upstream state gives the same value on every engine, so builds share one cache. It
keys a cache and is trusted for nothing else: apt checks the signatures inside the build.

When an InRelease cannot be read: one warning line, and the UTC date instead (`date:2026-12-07`), so the layer is
still rebuilt once a day, never cached for good.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import http.client
import re
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

from gpuforge.errors import ConfigError
from gpuforge.image import compat
from gpuforge.plan.target import Target

BUILD_ARG = "GPUFORGE_APT_STATE"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
DEBIAN_SECURITY = "http://deb.debian.org/debian-security"
# What the ubuntu (and nvidia/cuda) images' own sources name: the archive, and the security host for -security;
# every architecture but amd64 and i386 lives on the ports mirror, -security included.
UBUNTU_ARCHIVE = "http://archive.ubuntu.com/ubuntu"
UBUNTU_SECURITY = "http://security.ubuntu.com/ubuntu"
UBUNTU_PORTS = "http://ports.ubuntu.com/ubuntu-ports"
COMPONENTS = {"debian": ("main",), "ubuntu": ("main", "restricted", "universe", "multiverse")}
# Debian's architecture names for the engine's (`docker info`: the kernel's machine name).
ARCHES = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64", "ppc64le": "ppc64el",
          "s390x": "s390x", "i386": "i386", "i686": "i386"}
INDEX_NAMES = ("Packages", "Packages.xz", "Packages.gz")  # the first one an InRelease lists stands for the index
FETCH_TIMEOUT = 20  # seconds per InRelease
FETCH_MAX = 8 << 20  # bytes: Ubuntu's largest InRelease is a few hundred kB
_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True, kw_only=True)
class Suite:
    """One apt suite an image installs from: `deb MIRROR NAME COMPONENTS...`."""

    mirror: str
    name: str
    components: tuple[str, ...]

    @property
    def inrelease(self) -> str:
        return f"{self.mirror.rstrip('/')}/dists/{self.name}/InRelease"

    def source_line(self) -> str:
        return f"deb {self.mirror} {self.name} {' '.join(self.components)}"


@dataclass(frozen=True, kw_only=True)
class AptSources:
    """The suites an image's apt uses, and the architecture whose indexes count."""

    os: str
    arch: str
    suites: tuple[Suite, ...]


@dataclass(frozen=True, kw_only=True)
class AptState:
    """The system layer's key (the build arg GPUFORGE_APT_STATE) and where it came from."""

    value: str
    source: str  # for the build log: the InRelease files, the date fallback and why, or the flag/variable that pinned it
    fallback: bool = False

    def line(self, os_name: str) -> str:
        return f"gpuforge: apt state of {os_name}: {BUILD_ARG}={self.value} ({self.source})"


def debian_suites(suite: str, mirror: str = DEBIAN_MIRROR, security_mirror: str = DEBIAN_SECURITY) -> tuple[Suite, ...]:
    """A Debian release with its updates and its security updates (a bootstrapped base's sources, in this order)."""
    main = COMPONENTS["debian"]
    return (Suite(mirror=mirror, name=suite, components=main),
            Suite(mirror=mirror, name=f"{suite}-updates", components=main),
            Suite(mirror=security_mirror, name=f"{suite}-security", components=main))


def debian_arch(machine: str) -> str:
    """The engine's architecture (`x86_64`) as Debian names it (`amd64`); an unknown one as given."""
    return ARCHES.get(machine, machine) or "amd64"


def sources(t: Target, arch: str) -> AptSources:
    """The suites `t`'s image installs from: a bootstrapped base's own mirrors, else the os image's usual ones."""
    info = compat.os_info(t.os)
    family = info["family"] if info else None
    if family == "debian" and info is not None:  # a family implies the info (the test narrows it for mypy)
        boot = t.bootstrap or {}
        suites = debian_suites(boot.get("suite", info["codename"]), boot.get("mirror", DEBIAN_MIRROR),
                               boot.get("security_mirror", DEBIAN_SECURITY))
    elif family == "ubuntu" and info is not None:
        archive, security = (UBUNTU_ARCHIVE, UBUNTU_SECURITY) if arch in ("amd64", "i386") else (UBUNTU_PORTS,) * 2
        c, parts = info["codename"], COMPONENTS["ubuntu"]
        suites = (Suite(mirror=archive, name=c, components=parts),
                  Suite(mirror=archive, name=f"{c}-updates", components=parts),
                  Suite(mirror=security, name=f"{c}-security", components=parts))
    else:
        msg = f"no apt suites are known for os {t.os!r} (the compat data's os family: {family})"
        raise ConfigError(msg)
    return AptSources(os=t.os, arch=arch, suites=suites)


def index_digests(text: str, components: tuple[str, ...], arch: str) -> dict[str, str]:
    """{path: sha256} of each component's binary package index for `arch`, from an InRelease's SHA256 list (the
    uncompressed Packages, else .xz, else .gz). ValueError when the text lists none of them for a component."""
    listed: dict[str, str] = {}
    section = ""
    for line in text.splitlines():
        if line.startswith("-----BEGIN PGP SIGNATURE"):
            break
        if line[:1].strip():  # a field name starts a line; its list entries are indented
            section = line.split(":", 1)[0]
        elif section == "SHA256" and len(parts := line.split()) == 3 and _SHA256.fullmatch(parts[0]):
            listed[parts[2]] = parts[0]
    if not listed:
        msg = "no SHA256 list of indexes (not an InRelease file?)"
        raise ValueError(msg)
    out = {}
    for comp in components:
        path = next((p for n in INDEX_NAMES if (p := f"{comp}/binary-{arch}/{n}") in listed), None)
        if path is None:
            msg = f"lists no {comp}/binary-{arch}/Packages index"
            raise ValueError(msg)
        out[path] = listed[path]
    return out


def fetch_text(url: str) -> str:
    """The body of `url` (http; the host's proxy variables apply), at most FETCH_MAX bytes."""
    req = urllib.request.Request(url, headers={"User-Agent": "gpuforge"})
    with urllib.request.urlopen(req, timeout=FETCH_TIMEOUT) as r:
        body: bytes = r.read(FETCH_MAX + 1)
    if len(body) > FETCH_MAX:
        msg = f"larger than {FETCH_MAX >> 20} MB"
        raise ValueError(msg)
    return body.decode()


def resolve(src: AptSources, *, fetch: Callable[[str], str] = fetch_text, today: dt.date | None = None) -> AptState:
    """The state of `src`'s suites now: a digest of their indexes, or, when one cannot be read, the UTC date."""
    lines = []
    for s in src.suites:
        try:
            digests = index_digests(fetch(s.inrelease), s.components, src.arch)
        except (OSError, ValueError, http.client.HTTPException) as e:
            return date_fallback(src, f"{s.inrelease}: {_why(e)}", today)
        lines += [f"{s.mirror.rstrip('/')} {s.name} {path} {sha}" for path, sha in sorted(digests.items())]
    value = "index:" + hashlib.sha256("\n".join(lines).encode()).hexdigest()[:24]
    names = ", ".join(s.inrelease for s in src.suites)
    return AptState(value=value, source=f"the {src.arch} package indexes listed in {names}")


def for_targets(targets: list[Target], arch: str, *, pinned: AptState | None = None,
                resolve: Callable[[AptSources], AptState] = resolve) -> dict[str, AptState]:
    """Each target's state, resolved once per set of suites (every target of a build that shares them gets one
    value), or `pinned` for all; one line on stdout per value. Target id -> state."""
    seen: dict[AptSources, AptState] = {}
    out = {}
    for t in targets:
        src = sources(t, arch)
        if src not in seen:
            seen[src] = pinned or resolve(src)
            print(seen[src].line(t.os), flush=True)
        out[t.id] = seen[src]
    return out


def date_fallback(src: AptSources, why: str, today: dt.date | None = None) -> AptState:
    day = (today or dt.datetime.now(dt.UTC).date()).isoformat()
    print(f"gpuforge: warning: cannot read the apt indexes of {src.os} ({why}); its system layer is keyed by the UTC "
          f"date ({BUILD_ARG}=date:{day}) instead, so it is rebuilt once a day", file=sys.stderr, flush=True)
    return AptState(value=f"date:{day}", source=f"the UTC date: {why}", fallback=True)


def pinned(value: str, where: str) -> AptState:
    """A value given by hand (`--apt-state`, GPUFORGE_APT_STATE): every target's system layer keyed by it."""
    return AptState(value=value, source=f"pinned by {where}")


def _why(e: BaseException) -> str:
    if isinstance(e, urllib.error.URLError) and not isinstance(e, urllib.error.HTTPError):
        e = e.reason if isinstance(e.reason, BaseException) else e  # the socket's own error, not urlopen's wrapper
    return str(e) or type(e).__name__
