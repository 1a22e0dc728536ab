"""gpuforge outdated's pure parts: the compat data against the matrix, and recorded `apt-get -s upgrade` output of
the default image against bookworm-security (tests/unit/fixtures/outdated, recorded here on 2026-12-03)."""

from __future__ import annotations

import copy
from pathlib import Path

from gpuforge.fleet import outdated
from gpuforge.image import compat
from gpuforge.plan.matrix import load_matrix

APT = Path(__file__).parents[1] / "fixtures" / "outdated" / "apt-security-default.txt"


def test_pending_security_updates_are_read_from_recorded_apt_output():
    text = APT.read_text()
    ups = outdated.parse_apt_upgrade(text)
    assert len(ups) == 27 == int(text.split(" upgraded,")[0].rsplit("\n", 1)[-1])  # apt's own count
    assert {"package": "libssl3", "installed": "3.0.20-1~deb12u2", "candidate": "3.0.22-1~deb12u2",
            "origin": "Debian-Security:12/oldstable-security"} in ups
    # a line from another pocket is not a security update
    assert outdated.parse_apt_upgrade("Inst vim [2:9.0.1378-2] (2:9.0.1378-2+deb12u1 Debian:12.9/stable [amd64])") == []


def test_the_security_pocket_comes_from_the_os_facts():
    assert outdated.security_source("debian12") == "deb http://security.debian.org/debian-security bookworm-security main"
    assert "noble-security" in outdated.security_source("ubuntu24.04")


def test_a_newer_torch_patch_and_cuda_variant_in_the_compat_data_are_reported(monkeypatch):
    targets = load_matrix().targets
    assert outdated.upstream(targets) == []  # the matrix uses the newest the data knows
    d = copy.deepcopy(compat.data())
    d["torch"]["2.7.2"] = copy.deepcopy(d["torch"]["2.7.1"])
    d["torch"]["2.7.1"]["variants"] = {**d["torch"]["2.7.1"]["variants"],
                                       "cu129": {**d["torch"]["2.7.1"]["variants"]["cu128"], "cuda": "12.9"}}
    monkeypatch.setattr(compat, "data", lambda: d)
    lines = [f.line() for f in outdated.upstream(targets)]
    assert "upstream: torch 2.7.1: newer 2.7.x patch in the compat data: 2.7.2 (add it to the matrix's torch axis)" in lines
    assert "upstream: torch 2.7.1 CUDA 12.8: newer CUDA variant(s) in the compat data: cu129" in lines


def test_image_references_split_as_docker_does():
    assert outdated.split_image("ubuntu:24.04") == ("docker.io", "library/ubuntu", "24.04")
    assert outdated.split_image("nvidia/cuda:12.6.3-cudnn-runtime-ubuntu24.04") == \
        ("docker.io", "nvidia/cuda", "12.6.3-cudnn-runtime-ubuntu24.04")
    assert outdated.split_image("127.0.0.1:5123/base/ubuntu:24.04") == ("127.0.0.1:5123", "base/ubuntu", "24.04")
