"""The grammar of strings that reach a Dockerfile, a shell or a tag: what is accepted, what is refused."""

from __future__ import annotations

import pytest

from gpuforge import grammar

GOOD = [
    (grammar.apt_package, ["vim", "g++", "libc6-dev", "python3.11", "vim=2:9.0.1378-2", "ca-certificates=20230311"]),
    (grammar.pip_requirement, ["rich==15.0.0", "rich>=15", "Rich[jupyter]~=15.0", 'numpy; python_version >= "3.11"']),
    (grammar.url, ["https://pypi.org/simple", "http://10.0.0.5:8080/simple/", "https://mirror.example.com/pypi/simple?x=1"]),
    (grammar.registry, ["ghcr.io", "127.0.0.1:5000", "localhost:5000", "registry-1.example.com", "[::1]:5000"]),
    (grammar.repository, ["gpuforge/pytorch", "a", "org/team/image", "a__b", "a.b-c"]),
    (grammar.tag, ["2.7.1-cu126", "latest", "_x", "A" * 128]),
    (grammar.image_reference, ["ubuntu:24.04", "nvidia/cuda:12.6.3-cudnn-runtime-ubuntu24.04", "localhost:5000/a/b:t",
                               "registry.example.com/mirror/debian:bookworm", "debian@sha256:" + "a" * 64]),
    (grammar.user_name, ["gpuforge", "_svc", "a-b", "u" * 32]),
]
BAD = [
    (grammar.apt_package, ["", "v", "Vim", "-oX=y", "vim;id", "vim\nRUN id", "vim=", "vim=abc", "vim:amd64"]),
    (grammar.pip_requirement, ["", "--index-url=x", "rich; curl x", "foo @ https://x/f.whl", "torch==2.6", "TorchVision",
                               "triton>=3", "TORCH", "a\nb"]),
    (grammar.url, ["", "pypi.org/simple", "ftp://x/y", "https://u:p@x/y", "https://tok@x/y", "https://x/a b", "https://x/\"",
                   "https://", "https://x:99999/", "https://x/\u00e9", "file:///etc/passwd"]),
    (grammar.registry, ["", "myhost", "https://ghcr.io", "ghcr.io/", "a b", "ghcr.io:port"]),
    (grammar.repository, ["GPUForge/x", "a/", "/a", "a//b", "a b", "-a"]),
    (grammar.tag, ["", ".x", "-x", "a+b", "a/b", "a:b", "A" * 129, "ü"]),
    (grammar.image_reference, ["", "Ubuntu:24.04", "ubuntu:24.04; id", "ubuntu:", "NVIDIA/cuda:1", "a" * 300]),
    (grammar.user_name, ["", "root", "nobody", "sshd", "www-data", "Root", "1abc", "a b", "u" * 33]),
]


@pytest.mark.parametrize(("check", "value"), [(c, v) for c, vs in GOOD for v in vs])
def test_accepted(check, value):
    check(value)


@pytest.mark.parametrize(("check", "value"), [(c, v) for c, vs in BAD for v in vs])
def test_refused_with_a_reason(check, value):
    with pytest.raises(ValueError, match=r".{20,}"):
        check(value)


def test_pinned_references_need_a_version():
    grammar.image_reference("ubuntu:24.04", pinned=True)
    grammar.image_reference("ubuntu@sha256:" + "0" * 64, pinned=True)
    for ref in ("ubuntu", "ubuntu:latest"):
        with pytest.raises(ValueError, match="needs a version tag"):
            grammar.image_reference(ref, pinned=True)


def test_tags_keep_room_for_promotion_suffixes():
    grammar.tag("x" * 123, room=5)
    with pytest.raises(ValueError, match="at most 123"):
        grammar.tag("x" * 124, room=5)


@pytest.mark.parametrize(("template", "why"), [
    ("{id:>999999999}", "is not allowed"), ("{id!r}", "is not allowed"), ("{id.__class__}", "is not allowed"),
    ("{0}", "is not allowed"), ("{ide}", "perhaps you meant 'id'"), ("{id", "not a valid"), ("{}", "is not allowed"),
])
def test_placeholders_are_plain_names_only(template, why):
    with pytest.raises(ValueError, match=why):
        grammar.placeholders(template, ("id", "torch"), what="tag_template")


def test_placeholders_required_and_literal_braces():
    assert grammar.placeholders("{{literal}}-{id}", ("id",), what="t") == "{{literal}}-{id}"
    with pytest.raises(ValueError, match=r"must contain \{cuda_full\}"):
        grammar.placeholders("nvidia/cuda:{os}", ("os", "cuda_full"), what="cuda_base_image", required=("cuda_full",))


def test_nearest_prefers_what_the_text_starts():
    assert grammar.nearest("cuda", ["cudnn_tag", "cuda_full"]) == "; perhaps you meant 'cuda_full'?"
    assert grammar.nearest("ubuntu2404", ["debian12", "ubuntu24.04"]) == "; perhaps you meant 'ubuntu24.04'?"
    assert grammar.nearest("zzz", ["debian12"]) == ""
