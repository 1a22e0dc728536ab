"""Where an image or a run comes from: the checkout's revision, the build's creation time, the repository's public
URL (the OCI labels gpuforge/render/labels.py lays out), and credentials hidden from any text gpuforge writes.

A floor module: the build, the validating run and the pushers all read it, so none of them reaches into another's
room for it.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import subprocess
from pathlib import Path

from gpuforge import paths
from gpuforge.errors import ConfigError

_CREDS = re.compile(r"(//)[^/@\s]+@")


def redact(text: str) -> str:
    """Hide credentials embedded in URLs (https://user:token@mirror/...)."""
    return _CREDS.sub(r"\1***@", text)


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=paths.project_root(), capture_output=True, text=True,
                              timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def git_revision() -> str:
    """org.opencontainers.image.revision: the commit, `-dirty` by paths.checkout_revision's one rule."""
    rev, dirty = paths.checkout_revision()
    return (rev or "unknown") + ("-dirty" if rev and dirty else "")


def created_time() -> str:
    """org.opencontainers.image.created: SOURCE_DATE_EPOCH, else the commit's time (a rebuild of one commit
    gives the same image config, so the same id), else now. RFC 3339, UTC."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH", "").strip() or _git("log", "-1", "--format=%ct")
    try:
        when = dt.datetime.fromtimestamp(int(epoch), dt.UTC)
    except ValueError:
        if os.environ.get("SOURCE_DATE_EPOCH", "").strip():
            msg = f"SOURCE_DATE_EPOCH={epoch!r}: not a Unix time (whole seconds since 1970)"
            raise ConfigError(msg) from None
        when = dt.datetime.now(dt.UTC)
    return when.isoformat(timespec="seconds").replace("+00:00", "Z")


def normalize_remote(url: str) -> str | None:
    """One repository, one URL: `git@host:owner/repo.git`, `ssh://git@host/owner/repo`, `https://token@host/owner/repo.git`
    all give `https://host/owner/repo`; credentials, a port of ssh and the .git suffix are dropped. A local path or
    file:// URL names no public repository: None (see source_url, which follows it)."""
    url = url.strip()
    if m := re.fullmatch(r"[A-Za-z0-9._-]+@([A-Za-z0-9.-]+):(?!/)(.+)", url):  # scp-like ssh
        host, path = m.groups()
    elif m := re.fullmatch(r"(?:ssh|git|https?)://(?:[^/@\s]+@)?([A-Za-z0-9.-]+)(?::\d+)?/(.+)", url):
        host, path = m.groups()
    else:
        return None
    path = path.strip("/").removesuffix(".git").strip("/")
    return f"https://{host.lower()}/{path}" if path and not re.search(r"\s", path) else None


def source_url(root: Path | None = None, hops: int = 3) -> str | None:
    """org.opencontainers.image.source: the CI's repository URL, else the git remote normalised (normalize_remote),
    following a remote that is a local clone to that clone's own remote; None (no label) when no repository URL is
    known. So clones of one commit label it alike (a local path, `unknown`, an ssh and an https remote would give
    four image ids)."""
    server, repo = os.environ.get("GITHUB_SERVER_URL"), os.environ.get("GITHUB_REPOSITORY")
    if server and repo:
        return normalize_remote(f"{server.rstrip('/')}/{repo}")
    where = root or paths.project_root()
    for _ in range(hops):
        try:
            url = subprocess.run(["git", "-C", str(where), "remote", "get-url", "origin"], capture_output=True, text=True,
                                 timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None
        if not url:
            return None
        local = Path(url.removeprefix("file://"))
        if not local.is_absolute():
            local = (where / local).resolve()
        if local.is_dir():
            where = local
            continue
        return normalize_remote(url)
    return None
