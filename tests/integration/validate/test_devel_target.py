"""The devel image built from wheels, with the real CLI and engine: it builds on the default image's layers, the
whole validator suite is green on it (the devel checks ran, not skipped), and each devel check fails on a broken
devel image for its stated reason. The GPU half (the extension's kernel and the C++ AOTI loader run on the GPU) is
measured on the H200 with the shipped devel image (docs/measurements/).

The devel image's one full validation is `gpuforge canary --env dev` of it (`devel_canary` in conftest.py,
tests/devel_canary.py): a canary runs every validator on the digest, and test_registry.py asserts the canary's own
claims on the same run (one full validation fewer per run)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from conftest import ROOT
from gpuforge.validate import plugins, report

pytestmark = pytest.mark.docker
SITE = "/opt/venv/lib/python3.11/site-packages"


def test_devel_builds_on_the_default_layers_and_validates_green(devel_build, default_build, devel_canary, docker_engine):
    t, rec = devel_build
    _, base = default_build
    layers = {n: docker_engine.images.get(r["image_id"]).attrs["RootFS"]["Layers"]
              for n, r in (("devel", rec), ("default", base))}
    # the base, system, user, constraints and torch layers (5.9 of the default's 6.0 GB) are the devel image's too:
    # a registry and a node hold them once
    shared = next(i for i, (a, b) in enumerate(zip(layers["devel"], layers["default"], strict=False)) if a != b)
    assert shared >= 5, f"the devel image shares only {shared} layers with the default"
    rep = report.load(Path(devel_canary["report"]))
    out = devel_canary["stdout"]
    assert devel_canary["rc"] == 0 and report.is_green(rep), f"validate failed:\n{out[-4000:]}{devel_canary['stderr'][-2000:]}"
    assert f"validating {t.id}" in out and rep["facts"]["image_id"] == rec["image_id"], out[-2000:]  # this image, checked
    devel = {c["name"]: c["outcome"] for c in rep["checks"] if c["module"] == "test_devel"}
    assert set(devel.values()) == {"passed"} and len(devel) == 4, devel  # the runtime and cuda-base ones: not chosen
    na = {n["id"] for n in rep["selection"]["not_applicable"]}
    assert {"test_devel.py::test_runtime_has_no_cuda_compiler", "test_devel.py::test_cuda_base_devel_nvcc_is_the_target_cuda"} <= na
    ext = rep["facts"]["devel"]["extension"]
    assert ext["ok"] and ext["arch"] == "sm_90" and ext["nvrtc"] == t.variant.cuda, ext
    assert rep["facts"]["size_gb"] <= t.settings.size_budget_gb


def test_devel_layers_and_history_hold_no_build_ca(devel_build, test_ca, tmp_path):
    """A canary reads no build record, so it knows no build's CA bundle and its run skips the CA checks (an allowed
    skip). The devel image's are run here, with the bundle it was built with: no layer and no history entry holds it."""
    t, rec = devel_build
    assert rec["extra_ca"] == str(test_ca["bundle"])
    checks = ["test_build_ca_nowhere_in_filesystem", "test_history_has_no_secrets"]
    r, rep = _run_checks(rec["image_id"], t.expected_json(), [f"test_security.py::{c}" for c in checks], tmp_path,
                         "--gpuforge-ca", rec["extra_ca"])
    assert r.returncode == 0, r.stdout[-2000:]
    assert {c["name"]: c["outcome"] for c in rep["checks"]} == dict.fromkeys(checks, "passed"), rep["checks"]


NVRTC_H = f"{SITE}/nvidia/cuda_nvrtc/include/nvrtc.h"
LOADER_H = f"{SITE}/torch/include/torch/csrc/inductor/aoti_package/model_package_loader.h"
# (name, Dockerfile lines on top of the devel image, the devel check, words its failure must name)
DEVEL_BROKEN = [
    ("no-cuda-home", ["ENV CUDA_HOME="], "test_cuda_home_holds_the_toolkit", "CUDA_HOME is not set"),
    ("header-gone", ["USER root", f"RUN rm {NVRTC_H}", "USER 1000"], "test_cuda_home_holds_the_toolkit",
     "lacks: include/nvrtc.h"),
    ("cccl-off-pin", ["USER root", f"RUN sed -i 's/^Version: .*/Version: 12.6.37/' {SITE}/nvidia_cuda_cccl_cu12-*.dist-info/METADATA",
                      "USER 1000"],
     "test_toolkit_wheels_at_their_pins", "'nvidia-cuda-cccl-cu12': ('12.6.37', '12.6.77')"),
    ("ptxas-of-another-cuda", ["USER root", "RUN printf '#!/bin/sh\\necho \"Cuda compilation tools, release 12.4, V12.4.131\"\\n' "
                               "> /opt/gpuforge/cuda/bin/ptxas-12.4 && chmod +x /opt/gpuforge/cuda/bin/ptxas-12.4 "
                               "&& ln -sf ptxas-12.4 /opt/gpuforge/cuda/bin/ptxas", "USER 1000"],
     "test_toolkit_wheels_at_their_pins", "ptxas is CUDA 12.4"),
    ("no-ninja", ["USER root", "RUN rm /usr/bin/ninja", "USER 1000"], "test_cuda_extension_builds_and_compiles_its_kernel",
     "the extension failed at build"),
    ("no-loader-header", ["USER root", f"RUN rm {LOADER_H}", "USER 1000"], "test_aoti_cpp_loader_builds_and_links",
     "building the C++ loader failed"),
]


# A cuda-base devel image (nvidia/cuda's toolkit) cannot be built here: its nvcc check runs on the devel image with a
# cuda-base devel target and an nvcc of another CUDA where nvidia/cuda puts it.
FAKE_NVCC = ["USER root", "RUN mkdir -p /usr/local/cuda/bin && printf '#!/bin/sh\\necho \"Cuda compilation tools, release 12.4, "
             "V12.4.131\"\\n' > /usr/local/cuda/bin/nvcc && chmod +x /usr/local/cuda/bin/nvcc", "USER 1000"]


@pytest.mark.parametrize(("lines", "check", "words"), [b[1:] for b in DEVEL_BROKEN], ids=[b[0] for b in DEVEL_BROKEN])
def test_each_devel_check_fails_on_a_broken_devel_image(devel_build, docker_engine, tmp_path, lines, check, words):
    t, _ = devel_build
    _fails_on(devel_build, docker_engine, tmp_path, lines, t.expected_json(), check, words)


def test_cuda_base_devel_nvcc_check_fails_on_another_cuda(devel_build, docker_engine, tmp_path):
    t, _ = devel_build
    cuda_base = {**json.loads(t.expected_json()), "source": "cuda-base"}
    cuda_base.pop("toolkit")
    _fails_on(devel_build, docker_engine, tmp_path, FAKE_NVCC, json.dumps(cuda_base),
              "test_cuda_base_devel_nvcc_is_the_target_cuda", "nvcc is CUDA 12.4, the target's CUDA is 12.6")


def _fails_on(devel_build, docker_engine, tmp_path, lines: list[str], target_json: str, check: str, words: str) -> None:
    _, rec = devel_build
    dockerfile = "\n".join([f"FROM {rec['image_id']}", *lines]) + "\n"
    # named: images.yml's clean-up (`docker image prune --filter label=io.gpuforge.target`, run by the act tests
    # beside this module) removes untagged images that carry the base's labels
    img, _ = docker_engine.images.build(fileobj=io.BytesIO(dockerfile.encode()), rm=True, forcerm=True,
                                        labels={"io.gpuforge.test": "broken"},
                                        tag=f"gpuforge-test/broken-devel:{uuid.uuid4().hex[:12]}")
    try:
        r, rep = _run_checks(img.id, target_json, [f"test_devel.py::{check}"], tmp_path)
    finally:
        docker_engine.images.remove(img.id, force=True)
    failed = [c for c in rep["checks"] if c["outcome"] == "failed"]
    assert r.returncode != 0 and failed, f"the devel check passed a broken image:\n{r.stdout[-2000:]}"
    assert any(words.lower() in c["message"].lower() for c in failed), [c["message"] for c in failed]


def _run_checks(image_id: str, target_json: str, selects: list[str], tmp_path, *extra: str):
    """The `selects`ed validators run on `image_id` against `target_json`: (the pytest run, its report)."""
    (tmp_path / "target.json").write_text(target_json)
    r = subprocess.run([sys.executable, "-m", "pytest", *(f"validators/{s}" for s in selects), *plugins.PLUGIN_ARGS,
                        "-q", "--rootdir", "validators", "--gpuforge-image", image_id, "--gpuforge-target",
                        str(tmp_path / "target.json"), "--gpuforge-report", str(tmp_path / "report.json"), *extra],
                       cwd=ROOT, capture_output=True, text=True, timeout=900, env={**os.environ, **plugins.PLUGIN_ENV})
    return r, json.loads((tmp_path / "report.json").read_text())
