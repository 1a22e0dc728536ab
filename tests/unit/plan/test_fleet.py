"""matrix.yaml's fleet: which pools validate which targets, decided at plan time from the compat data only."""

from __future__ import annotations

import json

from hostile_cases import BASE

from gpuforge.cli import main
from gpuforge.image import compat
from gpuforge.plan.matrix import load_matrix

POOLS = """\
fleet:
  h200:
    gpu: {model: H200, capability: "9.0"}
    drivers: ["580.159.04"]
    runs_on: [self-hosted, linux, x64, gpu, h200]
  rtx5090:
    gpu: {model: RTX 5090, capability: "12.0"}
    drivers: ["575.64.03"]
    runs_on: [self-hosted, gpu, rtx5090]
    gpus: 2
"""


def _matrix(tmp_path, extra: str):
    p = tmp_path / "matrix.yaml"
    p.write_text(BASE + extra)
    return p


def test_cu126_target_on_an_sm120_pool_is_refused_at_plan_time(tmp_path, capsys):
    p = _matrix(tmp_path, POOLS)
    assert main(["--matrix", str(p), "plan"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err  # one line for every cu126 target the pool cannot run
    # the facts in the line are the compat data's, not written here
    v = compat.variant("2.7.1", "12.6")
    assert not compat.arch_supported("12.0", v.arch_list, v.ptx)
    assert f"{p}:{len(BASE.splitlines()) + 7}: fleet.rtx5090.gpu: RTX 5090 (sm_120) cannot run torch 2.7.1+cu126" in err[0]
    assert f"{v.arch_list[0]}..{v.arch_list[-1]}" in err[0] and "cu128" in err[0]


def test_an_excluded_target_is_planned_without_that_pool_and_said(tmp_path, capsys):
    p = _matrix(tmp_path, POOLS + '    exclude: ["cuda=12.6"]\n')
    m = load_matrix(p)
    by_id = {t.id: t for t in m.targets}
    cu126 = [t for t in m.targets if t.cuda == "12.6"]
    assert cu126 and all([x.name for x in t.pools] == ["h200"] for t in cu126)
    assert all(t.excluded_from == {"rtx5090": "cuda=12.6"} for t in cu126)
    assert all([x.name for x in t.pools] == ["h200", "rtx5090"] for t in m.targets if t.cuda == "12.8")
    assert main(["--matrix", str(p), "plan"]) == 0
    out = capsys.readouterr().out
    assert "pool rtx5090 (RTX 5090, sm_120, driver 575.64.03, 2 GPUs" in out
    assert f"  excluded: {cu126[0].id} (by 'cuda=12.6')" in out
    assert main(["--matrix", str(p), "plan", "--json", "--pools"]) == 0
    rows = json.loads(capsys.readouterr().out)["include"]
    assert len(rows) == sum(len(t.pools) for t in m.targets)
    five = [r for r in rows if r["pool"] == "rtx5090"]
    assert {r["id"] for r in five} == {t.id for t in m.targets if t.cuda == "12.8"}
    assert five[0]["runs_on"] == ["self-hosted", "gpu", "rtx5090"] and five[0]["gpus"] == 2
    assert by_id[five[0]["id"]].tag == five[0]["tag"]


def test_the_driver_floor_comes_from_the_compat_data(tmp_path, capsys):
    floor = compat.data()["minor_version_compat"]["12"]["min_driver"]  # below it, no CUDA 12 at all
    major, rest = floor.split(".", 1)
    below = f"{int(major) - 1}.{rest}"
    p = _matrix(tmp_path, POOLS.replace("580.159.04", below))
    assert main(["--matrix", str(p), "plan"]) == 2
    err = capsys.readouterr().err
    assert f"fleet.h200.drivers.0: driver {below} cannot run CUDA 12.6: needs >= {floor}" in err
    p = _matrix(tmp_path, POOLS.replace("580.159.04", floor) + '    exclude: ["cuda=12.6"]\n')
    assert load_matrix(p).targets  # at the floor: minor-version compatibility runs it


def test_the_committed_matrix_fleet_example_uncommented_gives_the_default_the_h200_pool(tmp_path):
    """matrix.yaml ships the fleet commented out (declared, every prod promotion needs its evidence)."""
    from conftest import ROOT

    text = (ROOT / "matrix.yaml").read_text()
    assert "fleet:" not in [line.strip() for line in text.splitlines()]  # not declared by default
    head, _, example = text.partition("\n# fleet:\n")
    assert example, "matrix.yaml should carry a commented `# fleet:` example"
    block = "\n".join(line.removeprefix("# ") for line in example.splitlines())
    (tmp_path / "matrix.yaml").write_text(head + "\nfleet:\n" + block + "\n")
    (t,) = load_matrix(tmp_path / "matrix.yaml").select(None)
    assert [(p.name, p.model, p.capability) for p in t.pools] == [("h200", "H200", compat.gpu_capability("H200"))]


def test_without_a_fleet_each_target_gets_one_gpu_row_on_any_gpu_runner(tmp_path, capsys):
    """The workflow's gpu job runs once per row: with no fleet declared every pushed digest still gets a GPU run
    (prod always needs GPU evidence), on a runner with the documented GPU labels."""
    p = _matrix(tmp_path, "")
    m = load_matrix(p)
    assert main(["--matrix", str(p), "plan", "--json", "--pools"]) == 0
    rows = json.loads(capsys.readouterr().out)["include"]
    assert [r["id"] for r in rows] == [t.id for t in m.targets]
    assert all(r["pool"] == "any" and r["runs_on"] == ["self-hosted", "linux", "x64", "gpu"] for r in rows), rows
