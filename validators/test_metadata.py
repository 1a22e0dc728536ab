"""metadata: what the image says about itself (labels, user, PID 1, NVIDIA variables, ports, size)."""

from __future__ import annotations

import datetime as dt
import re

import pytest

from gpuforge.render.labels import BUILD_LABELS, OCI, expected_labels, label_key


@pytest.fixture(scope="module")
def config(image):
    from gpuforge.engine import client as engine

    return engine.client().images.get(image).attrs


def test_labels_match_the_matrix(config, target):
    labels = config["Config"].get("Labels") or {}
    wrong = {k: (labels.get(k), v) for k, v in expected_labels(target.expected).items() if labels.get(k) != v}
    assert not wrong, "labels differ from the matrix (label: (image, matrix)): " + repr(wrong)


def _same(label: str, running: str, key: str) -> bool:
    if key == "cudnn":  # the label has 4 parts (9.5.1.17), torch reports 90501
        n = int(running)
        return ".".join(label.split(".")[:3]) == f"{n // 10000}.{n // 100 % 100}.{n % 100}"
    if key in ("torchvision", "torchaudio"):  # wheels carry a local version (+cu126) the label leaves out
        return label == str(running).split("+")[0]
    return label == str(running)


def test_labels_match_the_running_image(config, runtime_versions):
    """The labels describe what the image really runs: versions read by importing the libraries in a
    container, not the function that wrote the labels."""
    labels = config["Config"].get("Labels") or {}
    lying = {}
    for key in ("torch", "torchvision", "torchaudio", "triton", "cuda", "cudnn", "nccl", "python"):
        label = labels.get(label_key(key))
        if label is None or not _same(label, runtime_versions[key], key):
            lying[label_key(key)] = (label, runtime_versions[key])
    assert not lying, "labels disagree with the running image (label: (label value, running)): " + repr(lying)


def test_oci_labels_present(config):
    labels = config["Config"].get("Labels") or {}
    for k in ("org.opencontainers.image.title", "org.opencontainers.image.version", *BUILD_LABELS,
              "org.opencontainers.image.licenses"):
        if k == f"{OCI}.source" and k not in labels:
            continue  # absent when no repository URL is known: never a local path or `unknown`
        assert labels.get(k), f"label {k} is missing"
    source = labels.get(f"{OCI}.source")
    assert source is None or (re.fullmatch(r"https://[A-Za-z0-9.-]+/[^\s@]+", source) and not source.endswith(".git")), (
        f"label {OCI}.source={source!r} is not one normalised repository URL (https://host/path, no credentials)")
    created = labels[f"{OCI}.created"]
    try:  # RFC 3339 as the OCI annotation spec asks (Python reads the trailing Z from 3.11)
        dt.datetime.fromisoformat(created)
    except ValueError:
        pytest.fail(f"label {OCI}.created={created!r} is not an RFC 3339 date-time")


def test_default_user_is_not_root(config):
    user = (config["Config"].get("User") or "").split(":")[0]
    assert user not in ("", "0", "root"), f"default user is root ({user!r}); the image must end with USER <uid>"


def test_tini_is_pid_1(host, image):
    comm = host.file("/proc/1/comm").content_string.strip()
    assert comm == "tini", f"PID 1 is {comm!r}, not tini"


def test_nvidia_variables(config, target):
    env = dict(e.split("=", 1) for e in config["Config"].get("Env") or [])
    assert env.get("NVIDIA_VISIBLE_DEVICES") == "all", f"NVIDIA_VISIBLE_DEVICES={env.get('NVIDIA_VISIBLE_DEVICES')!r}"
    caps = set((env.get("NVIDIA_DRIVER_CAPABILITIES") or "").split(","))
    assert {"compute", "utility"} <= caps or "all" in caps, f"NVIDIA_DRIVER_CAPABILITIES={caps}"
    req = env.get("NVIDIA_REQUIRE_CUDA", "")
    assert f"cuda>={target.cuda}" in req, f"NVIDIA_REQUIRE_CUDA={req!r} lacks cuda>={target.cuda}"


def test_ports_exposed(config):
    ports = set(config["Config"].get("ExposedPorts") or {})
    assert {"22/tcp", "8888/tcp"} <= ports, f"exposed: {sorted(ports)}"


def test_size_within_budget(config, target, facts):
    size_gb = config["Size"] / 1e9
    facts["size_gb"] = round(size_gb, 2)
    budget = float(target.size_budget_gb)
    assert size_gb <= budget, f"image is {size_gb:.2f} GB, over the target's budget of {budget} GB"
