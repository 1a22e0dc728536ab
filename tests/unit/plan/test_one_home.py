"""The plan's types and rules each have one home: `Target` is imported from gpuforge.plan.target only, the six axis
fields of include and exclude entries are declared once, and every schema-checked file names a problem's place by
one rule (yamlpos.error_loc)."""

from __future__ import annotations

import ast
import inspect
import typing
from pathlib import Path

import pytest

from conftest import BASE_MATRIX
from gpuforge import paths
from gpuforge.cve import gate
from gpuforge.errors import ConfigError
from gpuforge.plan import matrix, schema
from gpuforge.plan.matrix import load_matrix
from gpuforge.plan.target import Target

ROOT = paths.project_root()
HOME = {"Target": "gpuforge.plan.target", "ImageRef": "gpuforge.plan.target", "target_id": "gpuforge.plan.target"}


def _python_files() -> list[Path]:
    return sorted(f for top in ("gpuforge", "tests", "tools", "validators") for f in (ROOT / top).rglob("*.py")
                  if "__pycache__" not in f.parts)


def test_target_is_imported_from_its_home_only():
    wrong = []
    for f in _python_files():
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("gpuforge."):
                wrong += [f"{f.relative_to(ROOT)}:{node.lineno}: {a.name} from {node.module}"
                          for a in node.names if a.name in HOME and node.module != HOME[a.name]]
    assert wrong == [], "import these from gpuforge.plan.target:\n" + "\n".join(wrong)
    assert not set(HOME) & set(matrix.__all__)  # the matrix module does not offer them as its own
    assert load_matrix().targets[0].__class__ is Target


def test_the_axis_fields_of_include_and_exclude_are_declared_once():
    assert tuple(schema.AxisValues.model_fields) == schema.AXES
    for entry in (schema.IncludeEntry, schema.ExcludeEntry):
        assert issubclass(entry, schema.AxisValues)
        own = set(inspect.get_annotations(entry))
        assert not own & set(schema.AXES), f"{entry.__name__} declares axis fields again: {own & set(schema.AXES)}"
    assert typing.get_args(schema.Flavor) == schema.FLAVORS and typing.get_args(schema.Source) == schema.SOURCES


@pytest.mark.parametrize("where", ["include", "exclude"])
def test_include_and_exclude_refuse_an_axis_value_alike(write_matrix, where):
    text = BASE_MATRIX.replace("matrix:\n", f"matrix:\n  {where}:\n    - {{flavor: nightly}}\n", 1)
    with pytest.raises(ConfigError) as e:
        load_matrix(write_matrix(text))
    assert f"matrix.{where}.0.flavor" in str(e.value) and "(allowed: runtime, devel)" in str(e.value), str(e.value)


def test_an_allowlist_names_a_missing_field_as_matrix_yaml_does(tmp_path, write_matrix):
    """The CVE allowlist and matrix.yaml both name the field that is missing, at its entry's line."""
    allow = tmp_path / "allow.yaml"
    allow.write_text("global:\n  - {id: CVE-2026-99001, review_by: 2026-12-31}\n")
    with pytest.raises(ConfigError) as e:
        gate.load_allowlist(allow)
    assert str(e.value) == f"{allow}:2: global.0.reason: Field required"
    text = BASE_MATRIX.replace("matrix:\n", "fleet:\n  h200:\n    gpu: {model: H200, capability: '9.0'}\n"
                               "    runs_on: [gpu]\nmatrix:\n", 1)
    with pytest.raises(ConfigError) as e:
        load_matrix(write_matrix(text))
    assert str(e.value).endswith(":7: fleet.h200.drivers: required field is missing"), str(e.value)
    assert not hasattr(gate, "_real_loc") and not hasattr(schema, "_real_loc")
