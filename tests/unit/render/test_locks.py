"""Pinned everything: gpuforge's hashed dev lock matches pyproject.toml, the images' locks match their inputs
and reach every target's constraints.txt, and the fleet's bake file is generated from the matrix."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess

from conftest import ROOT
from gpuforge.cli import main
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


def test_the_apart_part_is_pinned_and_both_installers_cut_it_off_at_its_line(tmp_path):
    """The wheels of pyproject's [tool.gpuforge.apart] (Requires-Python newer than the Python they run on) close the
    dev lock after a line naming the Python to install them as for: tools/start-engine.sh (its own sed lines, run
    here) and noxfile.py (its own pattern) cut the lock there, the rest installed as resolved."""
    text = (ROOT / "requirements" / "dev.lock").read_text()
    python, packages = locks.apart(ROOT / "pyproject.toml")
    assert packages == ["opa-golib-python-bindings==0.4.4"] and python == "3.14"
    script = (ROOT / "tools" / "start-engine.sh").read_text()
    cut = [ln.strip() for ln in script.splitlines()
           if ln.startswith("APART=") or re.match(r'\s+(sed .*requirements/dev.lock >"\$parts/|apart_python=\$\(sed )', ln)]
    assert len(cut) == 4, cut
    r = subprocess.run(["bash", "-euc", f"parts={tmp_path}\n" + "\n".join(cut) + '\necho "$apart_python"'], cwd=ROOT,
                       capture_output=True, text=True, timeout=30, check=True)
    resolved, apart = (tmp_path / "resolved.lock").read_text(), (tmp_path / "apart.lock").read_text()
    assert r.stdout.strip() == python and resolved + apart == text
    assert set(locks.pins(apart)) == set(locks.pins("\n".join(packages))) == {"opa-golib-python-bindings"}
    assert "opa-golib-python-bindings" not in locks.pins(resolved) and "gordon-to-regorus" in locks.pins(resolved)
    [pattern] = re.findall(r'^APART = re\.compile\(r"(.+)", re\.M\)$', (ROOT / "noxfile.py").read_text(), re.M)
    m = re.search(pattern, text, re.M)
    assert m and m[1] == python and text[:m.start()] == resolved


def test_a_changed_apart_pin_makes_the_dev_lock_stale(tmp_path):
    (tmp_path / "requirements").mkdir()
    shutil.copy(ROOT / "requirements" / "dev.lock", tmp_path / "requirements")
    text = (ROOT / "pyproject.toml").read_text()
    for old, new, why in (('"opa-golib-python-bindings==0.4.4"', '"opa-golib-python-bindings==0.4.5"',
                           "opa-golib-python-bindings==0.4.5 (lock: 0.4.4)"),
                          ('python = "3.14"', 'python = "3.15"', "its apart part is not opa-golib-python-bindings==0.4.4 "
                           "as for Python 3.15")):
        (tmp_path / "pyproject.toml").write_text(text.replace(old, new))
        [problem] = locks.dev_lock_problems(tmp_path)
        assert why in problem and "nox -s lock" in problem, problem


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


def _no_compile(monkeypatch) -> list:
    """compile_image_locks recorded, not run (it needs the index): where `gpuforge lock` would write."""
    asked: list = []
    monkeypatch.setattr(locks, "compile_image_locks", lambda targets, out: asked.append(out) or [])
    return asked


def test_lock_writes_into_the_checkout_source_it_runs_from(monkeypatch, capsys):
    asked = _no_compile(monkeypatch)
    monkeypatch.setenv("GPUFORGE_ROOT", str(ROOT))
    assert main(["lock"]) == 0
    assert asked == [ROOT / "gpuforge" / "render" / "data" / "locks"]


def test_lock_refuses_a_checkout_that_is_not_the_package_it_runs_from(tmp_path, monkeypatch, capsys):
    """Locks written into an installed copy are never committed, and `generate` reads the installed copy's: so a
    gpuforge that is not the checkout's own source (here: a checkout without it) refuses, exit 2, writing nothing."""
    for rel in ("images/context", "validators"):
        (tmp_path / rel).mkdir(parents=True)
    shutil.copy(ROOT / "matrix.yaml", tmp_path / "matrix.yaml")
    asked = _no_compile(monkeypatch)
    monkeypatch.setenv("GPUFORGE_ROOT", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    assert main(["lock"]) == 2
    err = capsys.readouterr().err
    assert asked == [] and err.count("\n") == 1 and "pip install --no-deps -e ." in err, err
    assert str(tmp_path / "gpuforge" / "render" / "data" / "locks") in err
    assert not (tmp_path / "gpuforge").exists()
