"""Image references in the code that pushes, signs and promotes (push/, evidence/, publish/) are made by ImageRef
(gpuforge/plan/target.py), never joined as strings: `f"{host}/{repo}@{digest}"` wrote "/repo@sha256:..." for a
reference without a registry, and every copy of the idiom was one more place to get the grammar wrong."""

from __future__ import annotations

import re
import subprocess
from types import SimpleNamespace

from state_here import records

from gpuforge import paths
from gpuforge.cve import gate as cve
from gpuforge.fleet import support
from gpuforge.plan.target import ImageRef
from gpuforge.registry import attest
from gpuforge.registry import client as registry

D = "sha256:" + "d" * 64


def test_on_pinned_and_with_tag():
    r = ImageRef.parse("127.0.0.1:5000/gpuforge/pytorch:pt271")
    assert r.on(None) is r and r.on("") is r
    assert str(r.on("reg.example:5443")) == "reg.example:5443/gpuforge/pytorch:pt271"
    assert str(r.pinned(D)) == f"127.0.0.1:5000/gpuforge/pytorch@{D}"  # the tag dropped: what is signed
    assert str(r.at(D)) == f"127.0.0.1:5000/gpuforge/pytorch:pt271@{D}"
    assert str(r.with_tag("pt271-zstd")) == "127.0.0.1:5000/gpuforge/pytorch:pt271-zstd"
    bare = ImageRef.parse("gpuforge/pytorch:pt271")
    assert bare.registry == "" and str(bare.pinned(D)) == f"gpuforge/pytorch@{D}"


def _target(ref: str):
    return SimpleNamespace(id="t", ref=ImageRef.parse(ref))


def test_the_cve_verdict_is_signed_onto_the_reference_by_digest(tmp_path, monkeypatch):
    signed = []
    monkeypatch.setattr(attest, "attest", lambda ref, path, type_uri, signer: signed.append(ref))
    cve._sign(_target("gpuforge/pytorch:pt271"), tmp_path / "v.json", None, D)
    moved = SimpleNamespace(id="t", ref=ImageRef.parse("127.0.0.1:5000/gpuforge/pytorch:pt271").on("reg.example:5443"))
    cve._sign(moved, tmp_path / "v.json", None, D)  # --registry, applied to the target when it was loaded
    assert signed == [f"gpuforge/pytorch@{D}", f"reg.example:5443/gpuforge/pytorch@{D}"]


def test_release_evidence_is_read_from_the_reference_by_digest(monkeypatch, tmp_path):
    monkeypatch.setenv("GPUFORGE_STATE_DIR", str(tmp_path / "state"))
    read = set()
    monkeypatch.setattr(attest, "verified_predicates", lambda ref, type_uri, verifier: read.add(ref) or [])
    support.collect(_target("gpuforge/pytorch:pt271"), verifier=attest.Verifier(), records=records.here(),
                    digest=D)
    assert read == {f"gpuforge/pytorch@{D}"}


def test_skopeo_is_given_the_reference_imageref_writes(monkeypatch):
    argv = []

    def skopeo(args, what, host):
        argv.append(args[-1])
        return subprocess.CompletedProcess(args, 0, stdout="{}", stderr="")
    monkeypatch.setattr(registry, "skopeo", skopeo)
    monkeypatch.setattr(registry, "auth_file", lambda auth, host: __import__("contextlib").nullcontext(None))
    for host in ("127.0.0.1:5000", ""):
        reg = registry.Registry(registry.ANONYMOUS)
        reg.manifest(ImageRef(host, "gpuforge/pytorch", "pt271"))
        reg.manifest(ImageRef(host, "gpuforge/pytorch", digest=D))
    assert argv == ["docker://127.0.0.1:5000/gpuforge/pytorch:pt271", f"docker://127.0.0.1:5000/gpuforge/pytorch@{D}",
                    "docker://gpuforge/pytorch:pt271", f"docker://gpuforge/pytorch@{D}"]


# {a}/{b} or {a}@{b} (an unsliced digest) inside an f-string: an image reference joined by hand
_JOINED = re.compile(r"""f["'][^"']*(\{[^{}]+\}/\{[^{}]+\}|\}@\{[^{}\[]+\})""")
_NOT_REFS = ("pkg:pypi/",)  # package URLs, not image references


def test_no_publish_module_joins_an_image_reference_by_hand():
    found = [f"{py.relative_to(paths.project_root())}:{n}: {line.strip()}"
             for room in ("push", "evidence", "publish")
             for py in sorted((paths.project_root() / "gpuforge" / room).rglob("*.py"))
             for n, line in enumerate(py.read_text().splitlines(), 1)
             if _JOINED.search(line) and not any(s in line for s in _NOT_REFS)]
    assert found == [], "build these with ImageRef (on / pinned / at / with_tag):\n" + "\n".join(found)
