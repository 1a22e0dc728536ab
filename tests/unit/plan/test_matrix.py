"""Expansion semantics: axes product, exclude, include (GitHub Actions rules), overrides, stable ids."""

from __future__ import annotations

import json

import pytest

from conftest import BASE_MATRIX
from gpuforge.cli import main
from gpuforge.errors import ConfigError
from gpuforge.plan.matrix import load_matrix
from gpuforge.plan.target import target_id


def test_product_of_axes(write_matrix):
    m = load_matrix(write_matrix(BASE_MATRIX))
    assert sorted(t.id for t in m.targets) == sorted([
        "pt271-cu126-py312-ubuntu2404-runtime-cudabase", "pt271-cu126-py312-ubuntu2404-devel-cudabase",
        "pt271-cu128-py312-ubuntu2404-runtime-cudabase", "pt271-cu128-py312-ubuntu2404-devel-cudabase"])


def test_ids_are_stable_and_flat():
    assert target_id("2.7.1", "12.6", "3.11", "debian12", "runtime", "wheels") == "pt271-cu126-py311-debian12-runtime-wheels"


def test_exclude_removes_partial_matches(write_matrix):
    text = BASE_MATRIX.replace("default:", "  exclude:\n    - {cuda: \"12.8\", flavor: devel}\ndefault:")
    ids = {t.id for t in load_matrix(write_matrix(text)).targets}
    assert "pt271-cu128-py312-ubuntu2404-devel-cudabase" not in ids
    assert len(ids) == 3


def test_include_adds_keys_to_matching_combinations(write_matrix):
    # {cuda: 12.8, size_budget_gb: 30} overwrites no original value of cu128 rows: merged into both
    text = BASE_MATRIX.replace("default:", "  include:\n    - {cuda: \"12.8\", size_budget_gb: 30}\ndefault:")
    m = load_matrix(write_matrix(text))
    budgets = {t.id: t.settings.size_budget_gb for t in m.targets}
    assert budgets["pt271-cu128-py312-ubuntu2404-devel-cudabase"] == 30
    assert budgets["pt271-cu126-py312-ubuntu2404-devel-cudabase"] == 14
    assert len(m.targets) == 4


def test_include_that_would_overwrite_becomes_a_new_target(write_matrix):
    inc = '    - {torch: "2.7.1", cuda: "12.6", python: "3.11", os: debian12, flavor: runtime, source: wheels}\n'
    text = BASE_MATRIX.replace("default:", "  include:\n" + inc + "default:")
    m = load_matrix(write_matrix(text))
    assert len(m.targets) == 5
    t = m.by_id("pt271-cu126-py311-debian12-runtime-wheels")
    assert t.bootstrap == {"suite": "bookworm", "mirror": "http://deb.debian.org/debian",
                           "security_mirror": "http://deb.debian.org/debian-security", "variant": "minbase", "rootfs": 3}
    assert t.base_image.startswith("gpuforge/base:debian12-bookworm-")


def test_overrides_apply_by_selector_in_order(write_matrix):
    text = BASE_MATRIX + 'overrides:\n  - {select: "flavor=devel", size_budget_gb: 20}\n  - {select: "cuda=12.8 flavor=devel", size_budget_gb: 25}\n'
    m = load_matrix(write_matrix(text))
    got = {t.id: t.settings.size_budget_gb for t in m.targets}
    assert got["pt271-cu126-py312-ubuntu2404-devel-cudabase"] == 20
    assert got["pt271-cu128-py312-ubuntu2404-devel-cudabase"] == 25
    assert got["pt271-cu126-py312-ubuntu2404-runtime-cudabase"] == 14


def test_cuda_base_uses_nvidia_image_and_pytorch_index(write_matrix):
    m = load_matrix(write_matrix(BASE_MATRIX))
    t = m.by_id("pt271-cu128-py312-ubuntu2404-devel-cudabase")
    assert t.base_image == "nvidia/cuda:12.8.1-cudnn-devel-ubuntu24.04"
    assert t.index_url == "https://download.pytorch.org/whl/cu128"
    assert t.expected().torch == "2.7.1+cu128"


def test_wheels_on_pypi_default_variant_use_pypi():
    t = load_matrix().select(None)[0]
    assert (t.source, t.cuda, t.index_url) == ("wheels", "12.6", "https://pypi.org/simple")


def test_default_selection(write_matrix):
    m = load_matrix(write_matrix(BASE_MATRIX))
    assert [t.id for t in m.select(None)] == ["pt271-cu126-py312-ubuntu2404-runtime-cudabase"]


def test_tag_template_and_aliases(write_matrix):
    text = BASE_MATRIX.replace("repository: gpuforge/pytorch", 'repository: gpuforge/pytorch\ntag_template: "{torch}-{cuda_tag}-{flavor}"')
    text += 'defaults:\n  aliases: {prod: ["{torch}-{cuda_tag}-{flavor}-{env}"]}\n'
    t = load_matrix(write_matrix(text)).by_id("pt271-cu128-py312-ubuntu2404-devel-cudabase")
    assert t.tags == ("127.0.0.1:5000/gpuforge/pytorch:2.7.1-cu128-devel",)
    assert t.aliases == {"prod": ("2.7.1-cu128-devel-prod",)}


def test_tag_collisions_are_refused(write_matrix):
    text = BASE_MATRIX.replace("repository: gpuforge/pytorch", 'repository: gpuforge/pytorch\ntag_template: "{torch}-{flavor}"')
    with pytest.raises(ConfigError, match="would name both"):
        load_matrix(write_matrix(text))


def test_shipped_matrix_describes_the_fleet(capsys):
    assert main(["plan", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["include"]
    combos = {(r["cuda"], r["flavor"], r["os"], r["source"]) for r in rows}
    for cuda in ("12.6", "12.8"):
        for flavor in ("runtime", "devel"):
            assert (cuda, flavor, "ubuntu24.04", "cuda-base") in combos
    assert any(r["os"] == "ubuntu22.04" for r in rows)
    default = [r for r in rows if r["default"]]
    assert [(r["os"], r["source"], r["torch"], r["cuda"]) for r in default] == [("debian12", "wheels", "2.7.1", "12.6")]


def test_plan_table_and_selectors(capsys):
    assert main(["plan", "cuda=12.8", "flavor=runtime"]) == 0
    out = capsys.readouterr().out
    assert "1 target(s)" in out


def test_id_glob_selector(capsys):
    assert main(["plan", "--json", "*-devel-*"]) == 0
    rows = json.loads(capsys.readouterr().out)["include"]
    assert rows and all(r["flavor"] == "devel" for r in rows)


def test_include_never_merges_into_an_added_combination(write_matrix):
    # GitHub's documented example: {fruit: banana} and {fruit: banana, animal: cat} both stand alone
    incs = ('    - {torch: "2.7.1", cuda: "12.6", python: "3.10", os: ubuntu22.04, flavor: runtime, source: cuda-base}\n'
            '    - {torch: "2.7.1", cuda: "12.6", python: "3.11", os: debian12, flavor: runtime, source: wheels}\n')
    text = BASE_MATRIX.replace("default:", "  include:\n" + incs + "default:")
    ids = {t.id for t in load_matrix(write_matrix(text)).targets}
    assert {"pt271-cu126-py310-ubuntu2204-runtime-cudabase", "pt271-cu126-py311-debian12-runtime-wheels"} <= ids
    assert len(ids) == 6


def test_committed_json_schema_is_current_and_accepts_the_matrix():
    import yaml

    from conftest import ROOT
    from gpuforge.plan.schema import json_schema

    committed = json.loads((ROOT / "matrix.schema.json").read_text())
    assert committed == json_schema(), "matrix.schema.json is stale: run `nox -s schema`"
    data = yaml.safe_load((ROOT / "matrix.yaml").read_text())
    assert set(data) <= set(committed["properties"]) and set(committed["required"]) <= set(data)


def test_plan_table_never_truncates_ids_without_a_tty(capsys):
    assert main(["plan"]) == 0
    out = capsys.readouterr().out
    for t in load_matrix().targets:
        assert t.id in out and t.base_image in out
    assert "…" not in out


def test_yaml_merge_keys_and_anchors_work_and_keep_lines(write_matrix):
    text = BASE_MATRIX.replace("default:", "  include:\n    - &devel {torch: \"2.7.1\", cuda: \"12.6\", python: \"3.11\", os: debian12, "
                                           "flavor: runtime, source: wheels}\n    - {<<: *devel, flavor: devel}\ndefault:")
    m = load_matrix(write_matrix(text))
    assert {"pt271-cu126-py311-debian12-runtime-wheels", "pt271-cu126-py311-debian12-devel-wheels"} <= {t.id for t in m.targets}
    assert m.doc.line(("matrix", "include", 1, "flavor")) == 15 and m.doc.line(("matrix", "include", 1, "torch")) == 15


def test_extra_ca_next_to_the_matrix_is_accepted(write_matrix, tmp_path):
    (tmp_path / "certs").mkdir()
    (tmp_path / "certs" / "ca.pem").write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    assert load_matrix(write_matrix(BASE_MATRIX + "extra_ca: certs/ca.pem\n")).spec.extra_ca == "certs/ca.pem"


def test_one_mistake_is_one_line_however_many_targets(write_matrix):
    text = BASE_MATRIX.replace('python: ["3.12"]', 'python: ["3.11"]')
    with pytest.raises(ConfigError) as e:
        load_matrix(write_matrix(text))
    assert str(e.value).count("\n") == 0 and "(4 targets, e.g." in str(e.value) and ":9: matrix.python.0:" in str(e.value)


def test_settings_are_resolved_once_per_combination_of_sources(write_matrix):
    text = BASE_MATRIX + 'overrides:\n  - {select: "flavor=devel", apt_packages: [vim]}\n'
    m = load_matrix(write_matrix(text))
    devel = [t for t in m.targets if t.flavor == "devel"]
    assert devel[0].settings is devel[1].settings and devel[0].settings.apt_packages == ["vim"]
    assert all(t.settings.apt_packages == [] for t in m.targets if t.flavor == "runtime")


def test_pip_packages_that_keep_the_cuda_pins_are_fine(write_matrix):
    text = BASE_MATRIX + 'defaults: {pip_packages: ["rich==15.0.0", "nvidia-cudnn-cu12>=9"]}\n'
    assert load_matrix(write_matrix(text)).targets[0].settings.pip_packages == ["rich==15.0.0", "nvidia-cudnn-cu12>=9"]


@pytest.mark.parametrize("os_name", ["debian12", "ubuntu22.04", "ubuntu24.04"])
def test_torch_27_every_cuda_both_flavors_from_wheels_plans(write_matrix, capsys, os_name):
    """The cross product users write for torch 2.7: every CUDA variant it publishes (cu118 too: its devel image takes
    NVIDIA's CUDA 11.8 toolkit wheels), runtime and devel, from wheels, on each OS with the Python it ships."""
    from gpuforge.image import compat

    python = compat.os_info(os_name)["python"]
    text = f"""\
        registry: 127.0.0.1:5000
        repository: gpuforge/pytorch
        bases:
          debian12:
            bootstrap: {{suite: bookworm}}
          ubuntu22.04: {{image: "ubuntu:22.04"}}
          ubuntu24.04: {{image: "ubuntu:24.04"}}
        matrix:
          torch: ["2.7.0", "2.7.1"]
          cuda: ["11.8", "12.6", "12.8"]
          python: ["{python}"]
          os: [{os_name}]
          flavor: [runtime, devel]
          source: [wheels]
        default: ["cuda=11.8 flavor=devel"]
        """
    path = write_matrix(text)
    m = load_matrix(path)
    assert len(m.targets) == 12
    for t in m.targets:
        assert t.toolkit_wheels == (t.variant.toolkit_wheels if t.flavor == "devel" else ())
    cu118 = m.by_id(f"pt271-cu118-py{python.replace('.', '')}-{os_name.replace('.', '')}-devel-wheels")
    assert cu118.toolkit_wheels == ("nvidia-cuda-nvcc-cu11==11.8.89", "nvidia-cuda-cccl-cu11==11.8.89.post1")
    assert cu118.index_url == "https://download.pytorch.org/whl/cu118"
    assert main(["--matrix", str(path), "plan", "--json", "torch=2.7.*"]) == 0
    assert len(json.loads(capsys.readouterr().out)["include"]) == 12
