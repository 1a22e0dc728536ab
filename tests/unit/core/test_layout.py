"""The tree says where code runs: gpuforge/image/ is what images carry, and it stands alone."""

from __future__ import annotations

import ast
import sys

from gpuforge import paths

IMAGE_PKG = paths.project_root() / "gpuforge" / "image"
# pynvml (nvidia-ml-py) is optional: hostinfo imports it lazily and falls back to nvidia-smi without it.
ALLOWED_THIRD_PARTY = {"yaml", "packaging", "pynvml"}


def _imports(py) -> set[str]:
    mods: set[str] = set()
    for node in ast.walk(ast.parse(py.read_text(), str(py))):
        if isinstance(node, ast.Import):
            mods.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            mods.add(node.module or "")
            if node.module == "gpuforge":
                mods.update(f"gpuforge.{a.name}" for a in node.names)
    return mods


def test_image_package_imports_only_stdlib_yaml_packaging_and_itself():
    files = sorted(IMAGE_PKG.rglob("*.py"))
    assert len(files) >= 4
    for py in files:
        for mod in _imports(py):
            top = mod.split(".")[0]
            if top == "gpuforge":
                assert mod == "gpuforge.image" or mod.startswith("gpuforge.image."), f"{py}: imports {mod}"
            else:
                assert top in sys.stdlib_module_names or top in ALLOWED_THIRD_PARTY or top == "__future__", \
                    f"{py}: imports {mod} (images carry stdlib + PyYAML + packaging only)"


def test_in_image_programs_import_only_gpuforge_image():
    """Every image carries gpuforge/image beside the programs: that, and nothing else of gpuforge, they may use."""
    for py in sorted((paths.project_root() / "images" / "programs").glob("*.py")):
        bad = [m for m in _imports(py) if m.split(".")[0] == "gpuforge" and not m.startswith("gpuforge.image")]
        assert not bad, f"{py}: imports {bad}"


def test_the_smoke_program_finds_gpuforge_image_in_the_image_layout(tmp_path):
    """As the Dockerfile lays it out (/opt/gpuforge/{programs,lib/gpuforge/image}), with no PYTHONPATH, from
    another folder: the program imports its verdicts."""
    import shutil
    import subprocess

    root = paths.project_root()
    home = tmp_path / "opt" / "gpuforge"
    shutil.copytree(root / "images" / "programs", home / "programs")
    shutil.copytree(root / "gpuforge" / "image", home / "lib" / "gpuforge" / "image")
    shutil.copy(root / "gpuforge" / "__init__.py", home / "lib" / "gpuforge" / "__init__.py")
    probe = ("import runpy, sys; sys.argv = ['gpu_smoke.py', '--help']; "
             f"g = runpy.run_path({str(home / 'programs' / 'gpu_smoke.py')!r}, run_name='probe'); "
             "print(g['smoke_verdicts'].__file__)")
    r = subprocess.run([sys.executable, "-I", "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(home / "lib" / "gpuforge" / "image" / "smoke_verdicts.py")


def test_no_python_under_dist_and_no_package_copies():
    root = paths.project_root()
    assert not list((root / "images" / "dist").rglob("*.py"))
    assert not (root / "validators" / "units").exists()


def test_test_module_basenames_are_unique():
    """pytest's default import mode needs unique basenames across tests/unit and tests/integration."""
    names = [p.name for p in (paths.project_root() / "tests").rglob("test_*.py")]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
