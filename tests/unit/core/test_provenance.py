"""Where an image comes from (gpuforge.provenance): the build's creation time, the repository's one public URL
whatever the clone's remote, and credentials hidden from what gpuforge writes."""

from __future__ import annotations

import subprocess

import pytest

from gpuforge import provenance
from gpuforge.errors import ConfigError
from gpuforge.render.labels import build_labels


def test_created_comes_from_source_date_epoch(monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    assert provenance.created_time() == "2023-11-14T22:13:20Z"
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "yesterday")
    with pytest.raises(ConfigError, match="SOURCE_DATE_EPOCH"):
        provenance.created_time()


def test_source_is_the_ci_repository(monkeypatch):
    monkeypatch.setenv("GITHUB_SERVER_URL", "https://github.com")
    monkeypatch.setenv("GITHUB_REPOSITORY", "org/gpuforge")
    assert provenance.source_url() == "https://github.com/org/gpuforge"


@pytest.mark.parametrize(("remote", "want"), [
    ("git@github.com:acme/gpuforge.git", "https://github.com/acme/gpuforge"),
    ("ssh://git@github.com:22/acme/gpuforge.git", "https://github.com/acme/gpuforge"),
    ("https://ci-bot:tok3n@GitHub.com/acme/gpuforge.git/", "https://github.com/acme/gpuforge"),
    ("https://github.com/acme/gpuforge", "https://github.com/acme/gpuforge"),
    ("/srv/git/gpuforge", None), ("file:///srv/git/gpuforge", None), ("unknown", None), ("", None),
])
def test_a_remote_is_one_normalised_url_or_none(remote, want):
    assert provenance.normalize_remote(remote) == want


def _git(*args, cwd):
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def test_clones_of_one_commit_label_one_source(tmp_path, monkeypatch):
    """Four clones of one commit: an ssh clone, an https clone with a token, a clone of the ssh clone (its remote a
    local path) and one with no remote. The first three give one URL (so one image id), the last no label at all."""
    monkeypatch.delenv("GITHUB_SERVER_URL", raising=False)
    monkeypatch.delenv("GITHUB_REPOSITORY", raising=False)
    up = tmp_path / "upstream"
    up.mkdir()
    _git("init", "-q", cwd=up)
    (up / "f").write_text("x")
    _git("add", "f", cwd=up)
    _git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one", cwd=up)
    ssh, tok, local, bare = (tmp_path / n for n in ("ssh", "tok", "local", "bare"))
    for d in (ssh, tok, bare):
        _git("clone", "-q", str(up), str(d), cwd=tmp_path)
    _git("remote", "set-url", "origin", "git@github.com:acme/gpuforge.git", cwd=ssh)
    _git("remote", "set-url", "origin", "https://ci:t0k@github.com/acme/gpuforge.git", cwd=tok)
    _git("clone", "-q", str(ssh), str(local), cwd=tmp_path)
    _git("remote", "remove", "origin", cwd=bare)
    got = {d.name: provenance.source_url(d) for d in (ssh, tok, local, bare)}
    assert got == {"ssh": "https://github.com/acme/gpuforge", "tok": "https://github.com/acme/gpuforge",
                   "local": "https://github.com/acme/gpuforge", "bare": None}
    labels = build_labels(revision="abc", created="2026-01-01T00:00:00Z", source=got["bare"], recipe="r")
    assert "org.opencontainers.image.source" not in labels  # absent, never a path or `unknown`


@pytest.mark.parametrize(("text", "want"), [
    ("+ pip install --index-url https://ci:t0k3n@mirror.example/simple torch",
     "+ pip install --index-url https://***@mirror.example/simple torch"),
    ("git clone ssh://git@github.com/acme/gpuforge", "git clone ssh://***@github.com/acme/gpuforge"),
    ("https://mirror.example/simple and no credentials", "https://mirror.example/simple and no credentials"),
])
def test_credentials_in_urls_are_hidden(text, want):
    assert provenance.redact(text) == want
