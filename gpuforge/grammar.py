"""The grammar of every matrix.yaml string that reaches a Dockerfile, a shell command or an image tag.

Each check returns the value unchanged or raises ValueError with a one-line reason that says what is
allowed (pydantic validators and the plan-time checks in gpuforge.plan.matrix both call these). The
templates quote what they render as well (gpuforge.render.dockerfile); these checks are the first line.
"""

from __future__ import annotations

import difflib
import re
import string
from collections.abc import Iterable
from typing import Literal, get_args
from urllib.parse import urlsplit

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

# How containers ask for GPUs: the NVIDIA runtime (--gpus) or CDI (--device nvidia.com/gpu=...). On the floor: the
# option table, the matrix schema, the engine and the validators read the one Literal (its values: the tuple).
GpuRequest = Literal["nvidia", "cdi"]
GPU_REQUESTS: tuple[GpuRequest, ...] = get_args(GpuRequest)

# Each grammar's regex lives here once, written to mean the same to Python's re and to ECMAScript (no \Z,
# no inline flags, no named groups): the checks below full-match them, and gpuforge.plan.schema puts them into
# matrix.schema.json as `pattern` (via json_pattern) for editors and check-jsonschema.

# Debian policy 5.6.1/5.6.12: lowercase name of 2+ characters; version [epoch:]upstream[-revision].
DEB_NAME = r"[a-z0-9][a-z0-9+.-]+"
DEB_VERSION = r"(?:[0-9]+:)?[0-9][A-Za-z0-9.+~-]*"
APT_PACKAGE = rf"{DEB_NAME}(?:={DEB_VERSION})?"

# distribution/reference (reference/regexp.go), ASCII only.
_ALNUM = r"[a-z0-9]+"
_PATH_COMPONENT = rf"{_ALNUM}(?:(?:[_.]|__|-+){_ALNUM})*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_HOST = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[0-9a-fA-F:.]+\])"
REPOSITORY = rf"{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
TAG_FIRST, TAG_CHAR = r"[A-Za-z0-9_]", r"[A-Za-z0-9_.-]"
TAG = rf"{TAG_FIRST}{TAG_CHAR}{{0,127}}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
# As docker splits a name: the first component is a registry only with a dot, a port, or as localhost.
_REF_DOMAIN = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})+|localhost|\[[0-9a-fA-F:.]+\])(?::[0-9]+)?|{_DOMAIN_COMPONENT}:[0-9]+"
_REF_NAME = rf"(?:({_REF_DOMAIN})/)?({REPOSITORY})"  # groups 1 (domain) and 2 (path)
# A registry is what the reference grammar reads as one: a name with a dot, localhost, an IPv6 literal, or any host
# with a port. `myhost/gpuforge/pytorch` would be docker.io's `myhost/gpuforge/pytorch`, and an empty registry
# would make the repository's first component the registry host.
REGISTRY = _REF_DOMAIN
IMAGE_REFERENCE = rf"{_REF_NAME}(?::({TAG}))?(?:@({_DIGEST}))?"  # groups 3 (tag) and 4 (digest)
# Pinned: a tag other than latest, or a digest.
PINNED_REFERENCE = rf"{_REF_NAME}(?:(?::{TAG})?@{_DIGEST}|:(?!latest(?!{TAG_CHAR})){TAG})"
NAME_MAX = 255  # distribution/reference NameTotalLengthMax
TAG_MAX = 128
# A build identifier (gpuforge.plan.version.BuildId): the UTC time a build was recorded, ISO 8601's basic format, to
# the second. Fixed length, sorts as time, and every character is a tag's: `{build}` of matrix.yaml's version_template.
BUILD_ID = r"[0-9]{8}T[0-9]{6}Z"
BUILD_ID_LEN = len("20261206T203015Z")
REFERENCE_CHAR = r"[A-Za-z0-9._:/@+\[\]-]"  # every character IMAGE_REFERENCE can contain

# useradd names (shadow-utils' default NAME_REGEX, 32 characters at most).
USER_NAME = r"[a-z_][a-z0-9_-]{0,31}"
USER_MAX = 32
# Accounts and groups that the bases already have (Debian's base-passwd, Ubuntu's base image, and what the
# packages gpuforge installs create): `useradd` of one of these fails at build time, or worse, the image's
# user would be an existing system account. `ubuntu` is not here: the template removes that user first.
SYSTEM_ACCOUNTS = frozenset("""
    root daemon bin sys sync games man lp mail news uucp proxy www-data backup list irc gnats nobody nogroup
    _apt adm tty disk kmem dialout fax voice cdrom floppy tape sudo audio dip operator src shadow utmp video
    sasl plugdev staff users input sgx kvm render netdev crontab messagebus systemd-journal systemd-network
    systemd-resolve systemd-timesync systemd-coredump sshd ssh _ssh tss lastlog uuidd syslog polkitd
""".split())

# Unicode categories Cc (C0, DEL, C1), Zl, Zp, Cs: what ends or breaks a Dockerfile line in some parser.
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")

# URLs: RFC 3986 characters only (no whitespace, quotes, backslashes or control characters); http or https;
# no userinfo (no @ before the path). url() explains each refusal; URL is the whole rule in one regex.
_URL_CHAR = r"[A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,;=%]"
URL = rf"https?://[A-Za-z0-9\-._~:\[\]!$&'()*+,;=%]+(?:[/?#]{_URL_CHAR}*)?"

# torch and the packages whose versions are fixed by the torch release: pip_packages may not replace them.
TORCH_FAMILY = ("torch", "torchvision", "torchaudio", "triton")
# PEP 508 as far as one regex can say it: a name that is not a torch-family package (any case: their
# canonical names have no separators), then extras, version specifiers and an environment marker whose
# quoted strings may hold any printable text. No @ outside quotes: direct URL requirements are refused.
# pip_requirement() parses with packaging as well.
_ANY_CASE = "|".join("".join(f"[{c}{c.upper()}]" for c in name) for name in TORCH_FAMILY)
_PIP_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
# The name is taken whole ((?!name char) after it): otherwise a failed match retries every shorter name, each
# rescanning the rest, and a 30 kB value took 19 s (quadratic); whole, the same value is refused in a millisecond.
PIP_REQUIREMENT = (rf" *(?!(?:{_ANY_CASE})(?![A-Za-z0-9._-])){_PIP_NAME}(?![A-Za-z0-9._-])"
                   r"""(?:[ A-Za-z0-9._\-\[\],<>=!~*+;()]|'[^'\x00-\x1f\x7f-\x9f\u2028\u2029]*'"""
                   r"""|"[^"\x00-\x1f\x7f-\x9f\u2028\u2029]*")*""")


def _full(pattern: str) -> re.Pattern[str]:
    return re.compile(rf"(?:{pattern})\Z")


def json_pattern(pattern: str) -> str:
    """`pattern` as a JSON-schema `pattern` (ECMAScript, searched: so anchored at both ends)."""
    return f"^(?:{pattern})$"


def template(fields: Iterable[str], *, first: str = TAG_FIRST, char: str = TAG_CHAR, required: Iterable[str] = ()) -> str:
    """The regex of a {placeholder} template over `fields` whose literal text is `char`s (the first one a
    `first`), containing each of `required`: what can render to a tag (or, given other classes, a reference)."""
    field = rf"\{{(?:{'|'.join(fields)})\}}"
    must = "".join(rf"(?=.*\{{{r}\}})" for r in required)
    return rf"{must}(?:{first}|{field})(?:{char}|{field})*"


_DEB_NAME, _DEB_VERSION = _full(DEB_NAME), _full(DEB_VERSION)
_REPOSITORY_RE, _DOMAIN_RE, _REFERENCE_RE, _PINNED_RE = map(_full, (REPOSITORY, REGISTRY, IMAGE_REFERENCE, PINNED_REFERENCE))
_TAG_CHARS = _full(rf"{TAG_FIRST}{TAG_CHAR}*")  # length checked apart, for a clearer message
_USER_RE, _URL_RE, _PIP_RE = _full(USER_NAME), _full(URL), _full(PIP_REQUIREMENT)
_URL_CHARS = _full(f"{_URL_CHAR}+")


def nearest(value: object, allowed: Iterable[object]) -> str:
    """'; did you mean "x"?' for a typo close to one allowed value, else ''."""
    names = [str(a) for a in allowed]
    text = str(value)
    close = [a for a in names if len(text) >= 3 and a.startswith(text)] or \
        difflib.get_close_matches(text, names, n=1, cutoff=0.6)
    return f"; perhaps you meant {close[0]!r}?" if close else ""


def printable(value: str) -> str | None:
    """Why `value` cannot go into a Dockerfile line at all (control or line-break characters), or None."""
    m = _UNPRINTABLE.search(value)
    return f"character {m.start() + 1} is the control character {m.group()!r}" if m else None


def _plain(value: str, what: str) -> None:
    why = printable(value)
    if why:
        msg = f"{what} may not contain control characters or line breaks ({why})"
        raise ValueError(msg)


def apt_package(value: str) -> str:
    """`name` or `name=version`, as `apt-get install` takes them."""
    _plain(value, "an apt package")
    name, eq, version = value.partition("=")
    if not _DEB_NAME.match(name):
        msg = (f"{value!r} is not a Debian package name (allowed: lowercase letters, digits and + . -, "
               "starting with a letter or digit, optionally =VERSION; e.g. vim or vim=2:9.0.1378-2)")
        raise ValueError(msg)
    if eq and not _DEB_VERSION.match(version):
        msg = f"{value!r}: {version!r} is not a Debian version (allowed: [EPOCH:]UPSTREAM[-REVISION], e.g. 2:9.0.1378-2)"
        raise ValueError(msg)
    return value


def pip_requirement(value: str) -> Requirement:
    """One PEP 508 requirement from an index (no URLs, no pip options, not a torch-family package)."""
    _plain(value, "a pip requirement")
    if value.lstrip().startswith("-"):
        msg = f"{value!r} is a pip option, not a requirement (allowed: PEP 508 requirements such as rich==15.0.0)"
        raise ValueError(msg)
    try:
        req = Requirement(value)
    except InvalidRequirement as e:
        first = str(e).splitlines()[0]
        msg = f"{value!r} is not a pip requirement ({first}); allowed: PEP 508, e.g. rich==15.0.0 or rich>=15"
        raise ValueError(msg) from None
    if req.url:
        msg = f"{value!r}: direct URL requirements are not allowed; publish the package to an index (pypi_url)"
        raise ValueError(msg)
    if canonicalize_name(req.name) in TORCH_FAMILY:
        msg = (f"{value!r} would replace {req.name}, which gpuforge pins for the target's torch release; "
               "change the matrix's `torch` axis instead")
        raise ValueError(msg)
    if not _PIP_RE.match(value):  # what packaging takes beyond the schema's pattern (e.g. `===a|b`)
        msg = (f"{value!r} is not a pip requirement gpuforge takes (allowed: NAME[EXTRAS] VERSION-SPECIFIERS[; MARKER]; "
               "characters such as | $ & @ only inside a marker's quoted strings)")
        raise ValueError(msg)
    return req


def url(value: str, *, what: str = "a URL") -> str:
    """An http(s) URL with a host, no credentials, no whitespace or control characters."""
    _plain(value, what)
    if not _URL_CHARS.match(value):
        bad = next((c for c in value if not _URL_CHARS.match(c)), " ")
        msg = f"{value!r} is not {what}: {bad!r} is not allowed in a URL (percent-encode it)"
        raise ValueError(msg)
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises ValueError for a bad port
    except ValueError as e:
        msg = f"{value!r} is not {what}: {e}"
        raise ValueError(msg) from None
    if parts.scheme not in ("http", "https"):
        if not parts.scheme or "//" not in value:
            msg = f"{value!r} is not {what}: it needs a scheme, e.g. https://{value.split('://')[-1]}"
        else:
            msg = f"{value!r} is not {what}: scheme {parts.scheme!r} is not allowed (allowed: http, https)"
        raise ValueError(msg)
    if "@" in parts.netloc:
        msg = (f"{what} may not contain credentials (user:password@): they would be written into the Dockerfile "
               "and `docker history`; keep them in a build secret or in your pip/docker config")
        raise ValueError(msg)
    if not parts.hostname:
        msg = f"{value!r} is not {what}: it has no host"
        raise ValueError(msg)
    if not _URL_RE.match(value):  # e.g. an upper-case scheme, which urlsplit folds
        msg = f"{value!r} is not {what} (allowed: http://HOST[:PORT]/PATH or https://…, lower-case scheme)"
        raise ValueError(msg)
    return value


def registry(value: str) -> str:
    """HOST[:PORT] of a registry, as the distribution reference grammar reads a domain."""
    if value == "":
        msg = ("an empty registry is not allowed: the repository's first component would be read as the registry "
               "host (allowed: HOST[:PORT], e.g. ghcr.io, docker.io or 127.0.0.1:5000)")
        raise ValueError(msg)
    _plain(value, "a registry")
    if "://" in value:
        msg = f"{value!r}: a registry is HOST[:PORT] without a scheme, e.g. {value.split('://', 1)[1].rstrip('/')}"
        raise ValueError(msg)
    if not _DOMAIN_RE.match(value):
        msg = (f"{value!r} is not a registry address (allowed: HOST[:PORT] where HOST has a dot, is localhost or has "
               "a port, e.g. ghcr.io or 127.0.0.1:5000; a bare name would be read as part of the repository)")
        raise ValueError(msg)
    return value


def repository(value: str) -> str:
    _plain(value, "a repository")
    if not _REPOSITORY_RE.match(value):
        msg = (f"{value!r} is not a repository name (allowed: lowercase path components of letters and digits "
               "joined by . _ - and /, e.g. gpuforge/pytorch)")
        raise ValueError(msg)
    return value


def tag(value: str, *, room: int = 0) -> str:
    """A tag by the distribution grammar; `room` characters are kept free for suffixes added later."""
    _plain(value, "a tag")
    if not _TAG_CHARS.match(value):
        msg = (f"{value!r} is not a valid tag (allowed: letters, digits, _ . -, not starting with . or -, "
               f"at most {TAG_MAX} characters)")
        raise ValueError(msg)
    if len(value) > TAG_MAX - room:
        msg = f"{value!r} is {len(value)} characters; tags may have at most {TAG_MAX - room} here ({TAG_MAX} minus suffixes)"
        raise ValueError(msg)
    return value


def image_reference(value: str, *, pinned: bool = False) -> str:
    """NAME[:TAG][@DIGEST] as docker pull takes it; `pinned`: with a tag other than latest, or a digest."""
    _plain(value, "an image reference")
    m = _REFERENCE_RE.match(value)
    if not m:
        msg = (f"{value!r} is not an image reference (allowed: [REGISTRY/]NAME[:TAG][@DIGEST] with a lowercase "
               "name, e.g. ubuntu:24.04 or registry.example.com/mirror/ubuntu:24.04)")
        raise ValueError(msg)
    name_len = len(value.split("@")[0].rsplit(":", 1)[0] if m.group(3) else value.split("@")[0])
    if name_len > NAME_MAX:
        msg = f"{value!r}: the image name is longer than {NAME_MAX} characters"
        raise ValueError(msg)
    if pinned and not _PINNED_RE.match(value):
        msg = f"{value!r} needs a version tag (not latest) or a digest, e.g. ubuntu:24.04, so rebuilds start from the same base"
        raise ValueError(msg)
    return value


def reference_match(value: str) -> re.Match[str]:
    """The match of a valid reference: groups 1 registry, 2 repository, 3 tag, 4 digest (gpuforge.plan.target.ImageRef)."""
    m = _REFERENCE_RE.match(value)
    if not m:
        msg = f"{value!r} is not an image reference"
        raise ValueError(msg)
    return m


def user_name(value: str) -> str:
    _plain(value, "a user name")
    if not _USER_RE.match(value):
        msg = (f"{value!r} is not a user name (allowed: lowercase letters, digits, _ and -, starting with a letter "
               "or _, at most 32 characters)")
        raise ValueError(msg)
    if value in SYSTEM_ACCOUNTS:
        msg = (f"{value!r} is an account or group the base image already has; the image's user must be a new, "
               "unprivileged account (e.g. gpuforge)")
        raise ValueError(msg)
    return value


def placeholders(template: str, allowed: Iterable[str], *, what: str, required: Iterable[str] = ()) -> str:
    """Only plain {name} placeholders from `allowed`: no format specs, conversions, attributes or indexes
    (a spec like {id:>999999999} would allocate gigabytes)."""
    _plain(template, what)
    try:
        fields = list(string.Formatter().parse(template))
    except ValueError as e:
        msg = f"{template!r} is not a valid {what}: {e} (write {{{{ and }}}} for literal braces)"
        raise ValueError(msg) from None
    names = set()
    for _, name, spec, conv in fields:
        if name is None:
            continue
        if not name.isidentifier() or spec or conv:
            shown = "{" + name + (f"!{conv}" if conv else "") + (f":{spec}" if spec else "") + "}"
            msg = f"{what} {template!r}: {shown} is not allowed (only plain placeholders: {', '.join('{' + a + '}' for a in allowed)})"
            raise ValueError(msg)
        if name not in allowed:
            msg = (f"{what} {template!r}: unknown placeholder {{{name}}} "
                   f"(allowed: {', '.join('{' + a + '}' for a in allowed)}){nearest(name, allowed)}")
            raise ValueError(msg)
        names.add(name)
    missing = [r for r in required if r not in names]
    if missing:
        msg = f"{what} {template!r} must contain {', '.join('{' + r + '}' for r in missing)}"
        raise ValueError(msg)
    return template


# --- the fleet (matrix.yaml `fleet:`): names that reach a workflow's `runs-on` and a job name
POOL_NAME = r"[a-z0-9][a-z0-9-]{0,39}"  # a pool's key: goes into job names and artifact names
RUNNER_LABEL = r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}"  # a GitHub Actions runner label (no spaces, no expressions)
DRIVER_VERSION = r"[0-9]{2,4}\.[0-9]{1,3}(?:\.[0-9]{1,3})?"  # NVIDIA Linux driver: 580.159.04, 570.26
CAPABILITY = r"[0-9]{1,2}\.[0-9]"  # CUDA compute capability: 9.0, 12.0
_POOL_RE, _LABEL_RE, _DRIVER_RE, _CC_RE = map(_full, (POOL_NAME, RUNNER_LABEL, DRIVER_VERSION, CAPABILITY))


def _matching(regex: re.Pattern[str], value: str, what: str, allowed: str) -> str:
    _plain(value, what)
    if not regex.match(value):
        msg = f"{value!r} is not {what} ({allowed})"
        raise ValueError(msg)
    return value


def pool_name(value: str) -> str:
    return _matching(_POOL_RE, value, "a pool name", "lowercase letters, digits and -, at most 40, e.g. h200")


def runner_label(value: str) -> str:
    return _matching(_LABEL_RE, value, "a runner label", "letters, digits, . _ -, at most 100, e.g. self-hosted")


def driver_version(value: str) -> str:
    return _matching(_DRIVER_RE, value, "an NVIDIA driver version", "e.g. 580.159.04 or 570.26")


def capability(value: str) -> str:
    return _matching(_CC_RE, value, "a compute capability", "MAJOR.MINOR, e.g. 9.0")
