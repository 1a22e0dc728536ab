"""Pinned everything: gpuforge's hashed dev lock matches pyproject.toml, the images' locks match their inputs
and reach every target's constraints.txt, and the fleet's bake file is generated from the matrix."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil

from conftest import ROOT
from gpuforge.plan.matrix import load_matrix
from gpuforge.render import dockerfile as render
from gpuforge.render import locks


def test_dev_lock_is_current_and_hashed():
    assert locks.dev_lock_problems(ROOT) == []
    for name in ("dev.lock", "nox.lock"):
        text = (ROOT / "requirements" / name).read_text()
        n = len(locks.pins(text))
        assert n and len(re.findall(r"^[A-Za-z0-9][^\s]*==[^\s]+ \\$", text, re.M)) == n, f"{name}: a pin without hashes"
    assert locks.pins((ROOT / "requirements" / "nox.lock").read_text())["nox"] == "2026.10.20"


def test_dev_lock_drift_is_found(tmp_path):
    (tmp_path / "requirements").mkdir()
    shutil.copy(ROOT / "requirements" / "dev.lock", tmp_path / "requirements")
    text = (ROOT / "pyproject.toml").read_text().replace('"rich==15.0.0"', '"rich==15.0.1"')
    (tmp_path / "pyproject.toml").write_text(text)
    [problem] = locks.dev_lock_problems(tmp_path)
    assert "rich==15.0.1 (lock: 15.0.0)" in problem and "nox -s lock" in problem


def test_image_locks_are_current_and_pin_every_target():
    targets = load_matrix().targets
    assert locks.stale_image_locks(targets) == []
    for t in targets:
        c = locks.pins(render.constraints(t))
        assert c["jupyterlab"] == "4.6.6" and "jupyter-server" in c and "sympy" in c and "uv" in c
        assert all(c[k] == v for k, v in t.variant.nvidia_pins.items())
        assert not {"torch", "torchvision", "torchaudio", "triton"} & set(c)  # the template pins those exactly
        assert all(re.fullmatch(r"[a-z0-9-]+==\S+", line) for line in render.constraints(t).splitlines())


def test_a_changed_pin_makes_the_image_lock_stale():
    t = load_matrix().select(None)[0]
    t2 = dataclasses.replace(t, settings=t.settings.model_copy(update={"pip_packages": ["rich==15.0.0"]}))
    assert locks.stale_image_locks([t2]) == [f"gpuforge/render/data/locks/{locks.image_lock_name(t)}.txt"]


def test_bake_file_is_generated_from_the_matrix():
    m = load_matrix()
    text = render.bake_file(list(m.targets), m.select(None))
    assert (ROOT / render.BAKE).read_text() == text
    doc = json.loads(text)
    assert doc["group"]["default"]["targets"] == [t.id for t in m.select(None)]
    assert set(doc["group"]["all"]["targets"]) == set(doc["target"]) == {t.id for t in m.targets}
    for t in m.targets:
        bt = doc["target"][t.id]
        assert bt["context"] == "." and bt["tags"] == list(t.tags)
        assert bt["secret"] == ["id=ca,src=${GPUFORGE_CA}"]
