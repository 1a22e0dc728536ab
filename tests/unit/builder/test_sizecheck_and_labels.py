"""The image size check against its baseline, the build-time OCI labels on the build command, and which id a build
made."""

from __future__ import annotations

import json

import pytest
from state_here import records

from gpuforge.builder import export, runner, sizecheck
from gpuforge.engine import client as engine
from gpuforge.errors import ConfigError
from gpuforge.render.labels import BUILD_LABELS, build_labels

TID = "pt271-cu126-py311-debian12-runtime-wheels"


@pytest.fixture
def baseline(tmp_path):
    p = tmp_path / "size-baseline.json"
    p.write_text(json.dumps({"targets": {TID: {"size": 6_000_000_000, "store": "overlay2"}}}))
    return p


def test_within_five_percent_passes_outside_fails(baseline):
    assert sizecheck.problem(TID, 6_250_000_000, "overlay2", path=baseline) is None  # +4.2 %
    assert sizecheck.problem(TID, 5_750_000_000, "overlay2", path=baseline) is None  # -4.2 %
    grown = sizecheck.problem(TID, 6_400_000_000, "overlay2", path=baseline)
    assert "+6.7%" in grown and "tools/size_baseline.py" in grown
    assert "-10.0%" in sizecheck.problem(TID, 5_400_000_000, "overlay2", path=baseline)


def test_other_store_or_target_is_not_compared(baseline):
    assert sizecheck.problem(TID, 9_000_000_000, "containerd/overlayfs", path=baseline) is None
    assert "not compared" in sizecheck.note(TID, 9_000_000_000, "containerd/overlayfs", path=baseline)
    assert sizecheck.problem("other", 9_000_000_000, "overlay2", path=baseline) is None
    assert "no baseline" in sizecheck.note("other", 1, "overlay2", path=baseline)


@pytest.mark.parametrize("text", ["[]", '{"targets": {"x": {"size": "big", "store": "overlay2"}}}', "{not json"])
def test_malformed_baseline_is_one_line(tmp_path, text):
    p = tmp_path / "b.json"
    p.write_text(text)
    with pytest.raises(ConfigError, match=r"b\.json"):
        sizecheck.problem(TID, 1, "overlay2", path=p)


def test_committed_baseline_is_well_formed():
    assert sizecheck.load()[TID]["store"] == "overlay2"


def test_size_baseline_tool_records_a_build_from_its_typed_record(tmp_path, monkeypatch, capsys):
    """tools/size_baseline.py reads the build record of the state dir gpuforge resolves and writes the baseline."""
    import importlib
    import sys

    from gpuforge import paths

    monkeypatch.syspath_prepend(str(paths.project_root() / "tools"))
    tool = importlib.import_module("size_baseline")
    monkeypatch.setenv("GPUFORGE_STATE_DIR", str(tmp_path / "state"))
    out = tmp_path / "size-baseline.json"
    monkeypatch.setattr(sizecheck, "BASELINE", out)
    assert tool.main(["other-target"]) == 2 and "build it first" in capsys.readouterr().err
    records.update_build(TID, image_id="sha256:" + "a" * 64, size=6_100_000_000, image_store="overlay2", engine="29.1")
    assert tool.main([TID]) == 0
    assert json.loads(out.read_text())["targets"][TID] == {"size": 6_100_000_000, "store": "overlay2", "engine": "29.1",
                                                           "image_id": "sha256:" + "a" * 64, "revision": "unknown"}
    assert "6.100 GB on overlay2" in capsys.readouterr().out
    sys.modules.pop("size_baseline", None)


def test_build_labels_are_passed_on_the_command_line(tmp_path):
    from gpuforge.plan.matrix import load_matrix

    t = load_matrix().select(None)[0]
    labels = build_labels(revision="abc", created="2026-01-01T00:00:00Z", source="https://github.com/o/r", recipe="r")
    assert set(labels) == set(BUILD_LABELS)
    drv = engine.DRIVERS["buildx"](client="docker", client_version="28")
    argv = runner.build_argv(drv, t, tmp_path, tmp_path / "iid", runner.BuildOptions(provenance="false", records=records.here(), log_dir=tmp_path), labels,
                             tmp_path / "meta.json")
    assert "org.opencontainers.image.created=2026-01-01T00:00:00Z" in argv and "--provenance=false" in argv
    assert argv[argv.index("--metadata-file") + 1] == str(tmp_path / "meta.json")
    again = export.export_argv(argv, "type=image,name=x,push=true", tmp_path / "t")
    assert "--load" not in again and again[again.index("--output") + 1] == "type=image,name=x,push=true"
    assert again[again.index("--iidfile") + 1] == str(tmp_path / "t" / "iidfile")


@pytest.mark.parametrize("driver", ["buildx", "classic"])
def test_no_cache_reaches_the_build_command(tmp_path, driver):
    """`gpuforge build --no-cache` is passed to the driver's command (no integration test builds with it: a cold build
    of the whole image costs a torch install, and the engine matrix's empty engine builds cold anyway)."""
    from gpuforge.plan.matrix import load_matrix

    t = load_matrix().select(None)[0]
    drv = engine.DRIVERS[driver](client="docker", client_version="20.10")
    argv = [runner.build_argv(drv, t, tmp_path, tmp_path / "iid", runner.BuildOptions(no_cache=no_cache, records=records.here(),
                                                                                     log_dir=tmp_path), {})
            for no_cache in (True, False)]
    assert "--no-cache" in argv[0] and "--no-cache" not in argv[1]


def test_gzip_level_reaches_the_exporter_and_the_zstd_copy_replaces_it(tmp_path):
    """`--compression-level N` reaches the build command as the exporter's gzip level, in place of --load (the engine
    matrix builds with it on the containerd store; classic BuildKit refuses it: test_drivers.py); push's zstd copy
    replaces that output with its own, as it replaces --load."""
    from gpuforge.builder.export import export_argv
    from gpuforge.errors import StateError
    from gpuforge.plan.matrix import load_matrix

    t = load_matrix().select(None)[0]
    drv = engine.DRIVERS["buildx"](client="docker", client_version="0.13")
    leveled, default = (runner.build_argv(drv, t, tmp_path, tmp_path / "iid", runner.BuildOptions(
        gzip_level=level, records=records.here(), log_dir=tmp_path), {}) for level in (1, None))
    assert "--load" not in leveled and "--output" in leveled
    assert leveled[leveled.index("--output") + 1] == "type=docker,compression=gzip,compression-level=1"
    assert "--load" in default and "--output" not in default
    for argv in (leveled, default):
        again = export_argv(argv, "type=image,name=r/x:zstd", tmp_path)
        assert again[again.index("--output") + 1] == "type=image,name=r/x:zstd" and "--load" not in again
        assert again.count("--output") == 1
    with pytest.raises(StateError, match="neither by --load nor by --output type=docker"):  # a state file is input
        export_argv(["docker", "buildx", "build", "--output", "type=local,dest=x", "."], "type=image,name=r/x:zstd", tmp_path)


@pytest.mark.parametrize("text", ["10", "-1", "fast", "1.5", ""])
def test_a_gzip_level_outside_0_to_9_is_refused(text):
    from gpuforge import options

    with pytest.raises(ValueError, match="is not a gzip level"):
        options.SETTINGS["compression_level"].check(text)
    assert options.SETTINGS["compression_level"].check("1") == 1


def test_engine_id_comes_from_the_build_metadata():
    """A containerd store names a single-manifest image by its manifest digest; BuildKit's iidfile then
    holds the config digest, which that engine does not know (seen on 26.1.5 with --provenance=false)."""
    meta = {"containerimage.config.digest": "sha256:c", "containerimage.digest": "sha256:m"}
    assert engine.built_image_id("sha256:c\n", meta) == "sha256:m"
    assert engine.built_image_id("sha256:c\n", None) == "sha256:c"
