"""YAML loading that remembers where every value came from, so errors can name file:line."""

from __future__ import annotations

from pathlib import Path

import yaml

from gpuforge.errors import ConfigError

Loc = tuple  # a path of keys and list indexes, e.g. ("matrix", "include", 2, "cuda")


class Positioned:
    """Parsed YAML data plus a map from each value's path to its 1-based line."""

    def __init__(self, path: Path, data: object, lines: dict[Loc, int]):
        self.path = path
        self.data = data
        self.lines = lines

    def line(self, loc: Loc) -> int:
        """The line of `loc`, or of its nearest ancestor that has one."""
        loc = tuple(loc)
        while loc and loc not in self.lines:
            loc = loc[:-1]
        return self.lines.get(loc, 1)

    def where(self, loc: Loc) -> str:
        return f"{self.path}:{self.line(loc)}"


def _walk(path: Path, node: yaml.Node, loc: Loc, lines: dict[Loc, int]) -> None:
    lines[loc] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        seen: set = set()
        for k, v in node.value:
            key = k.value
            if key in seen:
                # PyYAML keeps the last duplicate silently; a matrix with two `cuda:` keys is a mistake.
                where = ".".join(str(p) for p in (*loc, key))
                msg = f"{path}:{k.start_mark.line + 1}: {where}: duplicate key {key!r} (each key may appear once)"
                raise ConfigError(msg)
            seen.add(key)
            _walk(path, v, (*loc, key), lines)
            lines[(*loc, key)] = k.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            _walk(path, v, (*loc, i), lines)


def load(path: Path) -> Positioned:
    try:
        text = path.read_text()
    except FileNotFoundError:
        msg = f"{path}: file not found (pass --matrix PATH or run from the project root)"
        raise ConfigError(msg) from None
    except OSError as e:
        msg = f"{path}: cannot read: {e.strerror}"
        raise ConfigError(msg) from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark
        line = mark.line + 1 if mark else 1
        msg = f"{path}:{line}: not valid YAML: {e.problem}"
        raise ConfigError(msg) from None
    lines: dict[Loc, int] = {}
    if node is not None:
        _walk(path, node, (), lines)
    return Positioned(path, data, lines)
