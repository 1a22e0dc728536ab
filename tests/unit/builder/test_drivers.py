"""buildx and classic BuildKit behind one Driver protocol (gpuforge/engine/drivers.py): each knows its command and
refuses, in one line, the options it cannot honour; nothing else in gpuforge branches on a driver's name."""

from __future__ import annotations

import ast

import pytest

from gpuforge import paths
from gpuforge.engine import drivers

KW = {"builder": None, "cache_from": (), "cache_to": None}


def test_buildx_takes_builder_cache_provenance_and_metadata():
    d = drivers.Buildx(client="docker", client_version="28")
    assert d.command(builder="remote", cache_from=("a",), cache_to="b", provenance="false", metadata="/m") == [
        "docker", "buildx", "build", "--load", "--builder", "remote", "--cache-from", "a", "--cache-to", "b",
        "--provenance=false", "--metadata-file", "/m"]
    assert d.writes_metadata and d.cannot(builder="x", cache_from=("a",), cache_to="b", gzip_level=1) is None
    # a gzip level is an exporter option: --load in its long form
    assert d.command(**KW, provenance=None, metadata=None, gzip_level=1) == [
        "docker", "buildx", "build", "--output", "type=docker,compression=gzip,compression-level=1"]


@pytest.mark.parametrize(("given", "words"), [({"cache_to": "type=inline"}, "--cache-from/--cache-to need buildx"),
                                              ({"cache_from": ("r",)}, "--cache-from/--cache-to need buildx"),
                                              ({"builder": "remote"}, "--builder remote needs buildx"),
                                              ({"gzip_level": 1}, "--compression-level needs buildx")])
def test_classic_refuses_what_it_cannot_do(given, words):
    d = drivers.Classic(client="/usr/bin/docker", client_version="20.10.24")
    assert words in d.cannot(**{**KW, **given}) and d.cannot(**KW) is None
    assert d.command(**KW, provenance=None, metadata=None) == ["/usr/bin/docker", "build"] and not d.writes_metadata


def test_every_driver_is_registered_by_its_name():
    assert {name: cls.name for name, cls in drivers.DRIVERS.items()} == {"buildx": "buildx", "classic": "classic"}


def test_no_module_branches_on_a_driver_name():
    """`driver.name == "buildx"` (or != "classic") belongs in the driver, not at its callers."""
    bad = []
    for py in sorted((paths.project_root() / "gpuforge").rglob("*.py")):
        for n in ast.walk(ast.parse(py.read_text())):
            if isinstance(n, ast.Compare) and any(isinstance(c, ast.Constant) and c.value in drivers.DRIVERS
                                                  for c in [n.left, *n.comparators]) \
                    and "name" in ast.unparse(n.left):
                bad.append(f"{py.name}:{n.lineno}: {ast.unparse(n)}")
    assert not bad, bad
