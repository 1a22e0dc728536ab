"""`gpuforge outdated`: what moved upstream since the matrix and its images were made.

  upstream  a newer torch 2.7.x patch, or a newer CUDA variant of a torch the matrix uses, in the compat data;
  base      a pulled base image whose tag now names another digest than bases.lock records (or one not locked);
  security  security updates pending inside a built image: `apt-get -s upgrade` against the OS's security pocket
            only, run as root in a throwaway container of the recorded image id;
  cve       a prod digest whose newest signed CVE verdict is red (or missing).
Each finding is one line (text) or one object (--json) with kind, subject and detail; the watch workflow
(.github/workflows/watch.yml) turns a non-empty list into a pull request.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from packaging.version import Version

from gpuforge.errors import ConfigError, FatalError
from gpuforge.image import compat
from gpuforge.plan.target import ImageRef
from gpuforge.state import files

if TYPE_CHECKING:
    from gpuforge.plan.target import Target
    from gpuforge.registry.attest import Verifier
    from gpuforge.registry.client import RegistryAuth
    from gpuforge.state.records import Records

LOCK_NAME = "bases.lock"  # beside matrix.yaml: {"reference": "sha256:..."} for every pulled base
# Only the security pocket, so what `-s upgrade` lists is security updates; the image's own lists are untouched
# (the container is thrown away).
SECURITY_SOURCES = {
    "debian": "deb http://security.debian.org/debian-security {codename}-security main",
    "ubuntu": "deb http://security.ubuntu.com/ubuntu {codename}-security main restricted universe multiverse",
}
APT_SCRIPT = ("echo \"$GPUFORGE_SECURITY_SOURCE\" > /tmp/security.list && "
              "apt-get update -qq -o Dir::Etc::SourceList=/tmp/security.list -o Dir::Etc::SourceParts=- && "
              "apt-get -s -o Dir::Etc::SourceList=/tmp/security.list -o Dir::Etc::SourceParts=- upgrade")
_INST = re.compile(r"^Inst (\S+) \[([^\]]+)\] \((\S+) (.+?) \[[^\]]+\]\)", re.MULTILINE)


@dataclass(frozen=True)
class Finding:
    kind: str  # upstream | base | security | cve | unchecked
    subject: str
    detail: str

    def line(self) -> str:
        return f"{self.kind}: {self.subject}: {self.detail}"


# --- upstream: the compat data against the matrix -----------------------------------------------------------

def upstream(targets: Sequence[Target]) -> list[Finding]:
    out = []
    used = sorted({t.torch for t in targets}, key=Version)
    for series in sorted({".".join(v.split(".")[:2]) for v in used}):
        newest_used = max((v for v in used if v.startswith(series + ".")), key=Version)
        newer = [r for r in compat.torch_releases() if r.startswith(series + ".") and Version(r) > Version(newest_used)]
        if newer:
            out.append(Finding("upstream", f"torch {newest_used}", f"newer {series}.x patch in the compat data: "
                                                                    f"{', '.join(newer)} (add it to the matrix's torch axis)"))
    for torch in used:
        have = {t.cuda for t in targets if t.torch == torch}
        top = max(have, key=Version)
        newer = [c for c in compat.cuda_variants(torch) if Version(c) > Version(top)]
        if newer:
            out.append(Finding("upstream", f"torch {torch} CUDA {top}", f"newer CUDA variant(s) in the compat data: "
                                                                       f"{', '.join(compat.cuda_variant_name(c) for c in newer)}"))
    return out


# --- base images: tags against the lock ---------------------------------------------------------------------

def split_image(ref: str) -> tuple[str, str, str]:
    """'ubuntu:24.04' -> ('docker.io', 'library/ubuntu', '24.04'); '127.0.0.1:5000/a/b:t' -> (host, 'a/b', 't'):
    ImageRef's parse with Docker's defaults made explicit."""
    c = ImageRef.parse(ref).canonical()
    return c.registry, c.repository, str(c.tag)


def pulled_bases(targets: Sequence[Target]) -> list[str]:
    """The FROM references gpuforge pulls (bootstrapped bases are built here, not pulled; digests are pinned)."""
    return sorted({t.base_image for t in targets if not t.bootstrap and "@" not in t.base_image})


def lock_path(matrix: Path) -> Path:
    return Path(matrix).parent / LOCK_NAME


def read_lock(path: Path) -> dict[str, str]:
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        msg = f"{path}: not JSON ({e.msg} at line {e.lineno}); rewrite it with `gpuforge outdated --write-base-lock`"
        raise ConfigError(msg) from None
    bad = [k for k, v in data.items() if not (isinstance(v, str) and re.fullmatch(r"sha256:[0-9a-f]{64}", v))] \
        if isinstance(data, dict) else ["(top level)"]
    if bad:
        msg = f"{path}: {bad[0]}: not a sha256 digest (the lock maps each pulled base reference to sha256:<64 hex>)"
        raise ConfigError(msg)
    lock: dict[str, str] = data  # checked above: base reference -> sha256 digest
    return lock


def current_digest(ref: str, auth: RegistryAuth | None = None) -> str | None:
    """The digest a base reference names now (read with `auth`, a RegistryAuth; None: no credentials of ours)."""
    from gpuforge.registry.client import ANONYMOUS, Registry

    m = Registry(auth or ANONYMOUS).manifest(ImageRef.parse(ref).canonical())
    return m.digest if m else None


def bases(targets: Sequence[Target], lock: dict[str, str], auth: RegistryAuth | None = None) -> list[Finding]:
    out = []
    for ref in pulled_bases(targets):
        try:
            now = current_digest(ref, auth)
        except FatalError as e:
            out.append(Finding("unchecked", ref, f"cannot read the tag's digest: {e}"))
            continue
        if now is None:
            out.append(Finding("base", ref, "the tag is gone from its registry"))
        elif ref not in lock:
            out.append(Finding("base", ref, f"not pinned in {LOCK_NAME} (now {now}); run `gpuforge outdated --write-base-lock`"))
        elif lock[ref] != now:
            out.append(Finding("base", ref, f"the tag moved: {lock[ref]} (locked) -> {now}; rebuild on the new base "
                                            "and update the lock"))
    return out


def write_lock(targets: Sequence[Target], path: Path, auth: RegistryAuth | None = None) -> dict[str, str]:
    lock = {ref: d for ref in pulled_bases(targets) if (d := current_digest(ref, auth))}
    files.write_output(path, json.dumps(lock, indent=2, sort_keys=True) + "\n")
    return lock


# --- security updates inside built images -------------------------------------------------------------------

def parse_apt_upgrade(text: str) -> list[dict[str, Any]]:
    """The security updates in `apt-get -s upgrade` output: one dict per `Inst` line from a *-security origin."""
    out = []
    for m in _INST.finditer(text):
        name, installed, candidate, origin = m.groups()
        if "security" in origin.lower():
            out.append({"package": name, "installed": installed, "candidate": candidate, "origin": origin.strip()})
    return out


def security_source(os_name: str) -> str:
    info = compat.os_info(os_name)
    if info is None or info["family"] not in SECURITY_SOURCES:
        msg = f"no security pocket is known for os {os_name!r}"
        raise ConfigError(msg)
    return SECURITY_SOURCES[info["family"]].format(codename=info["codename"])


def apt_security_output(image: str, os_name: str) -> str:
    """Run APT_SCRIPT as root in a throwaway container of `image` (the engine removes it, also on Ctrl-C)."""
    from gpuforge.engine import containers as run

    with run.container(image, ["sh", "-c", APT_SCRIPT + "; echo gpuforge-apt-exit=$?"], user="root",
                       env={"GPUFORGE_SECURITY_SOURCE": security_source(os_name)}) as c:
        c.wait_for_log(r"gpuforge-apt-exit=\d+", timeout=600)
        text = c.logs()
    done = re.search(r"gpuforge-apt-exit=(\d+)", text)
    if done is None:  # wait_for_log saw the marker: logs read again without it are the engine's loss
        msg = f"apt-get -s upgrade in {image[:19]}: its exit status is missing from the container's logs"
        raise FatalError(msg)
    rc = done.group(1)
    if rc != "0":
        msg = f"apt-get -s upgrade in {image[:19]} failed (exit {rc}): {text.strip().splitlines()[-2][-300:]}"
        raise FatalError(msg)
    return text


def security(targets: Sequence[Target], records: Records) -> list[Finding]:
    """Pending security updates in each target's built image (`records`: state.records.Records, this checkout's)."""
    out = []
    for t in targets:
        rec = records.build(t.id)
        if rec is None:
            out.append(Finding("unchecked", t.id, "not built here (no build record): its packages cannot be checked"))
            continue
        try:
            updates = parse_apt_upgrade(apt_security_output(rec.image_id, t.os))
        except FatalError as e:
            out.append(Finding("unchecked", t.id, str(e)))
            continue
        for u in updates:
            out.append(Finding("security", t.id, f"{u['package']} {u['installed']} -> {u['candidate']} ({u['origin']})"))
    return out


# --- prod digests whose CVE verdict turned red --------------------------------------------------------------

def prod_cve(targets: Sequence[Target], *, verifier: Verifier) -> list[Finding]:
    from gpuforge.cve import gate as cve
    from gpuforge.registry import attest
    from gpuforge.registry.client import Registry

    out = []
    for t in targets:
        ref = t.ref
        try:
            m = Registry(verifier.auth).manifest(ref.with_tag(f"{ref.tag}-prod"))
            if m is None:
                continue  # never promoted
            probs = cve.cve_ok(attest.verified_predicates(str(ref.pinned(m.digest)), cve.CVE_TYPE, verifier),
                               digest=m.digest)
        except FatalError as e:
            out.append(Finding("unchecked", t.id, f"prod CVE verdict: {e}"))
            continue
        out += [Finding("cve", f"{t.id} prod {m.digest[:19]}", p) for p in probs]
    return out


def report(findings: list[Finding], *, as_json: bool) -> str:
    if as_json:
        return json.dumps({"findings": [asdict(f) for f in findings]}, sort_keys=True) + "\n"  # one line: `| tail -n 1`
    if not findings:
        return "gpuforge: outdated: nothing moved upstream\n"
    return "".join(f"{f.line()}\n" for f in findings)
