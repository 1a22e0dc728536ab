"""Bounded YAML loading that remembers where every value came from, so errors can name file:line.

matrix.yaml is untrusted input. The file is parsed once, by libyaml's event parser when present, and the
data is built here from the events (iteratively: deep nesting cannot exhaust the C stack), with limits
checked as the events arrive: file size, nesting depth, and how much alias expansion may add (a
"billion laughs" file is refused at its first oversized alias, before anything walks the expanded tree).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Final, NoReturn, Protocol, cast

import yaml

from gpuforge.errors import ConfigError

Loc = tuple[str | int, ...]  # a path of keys and list indexes, e.g. ("matrix", "include", 2, "cuda")

MAX_BYTES = 1 << 20  # matrix files are a few KB; this is room for thousands of include entries
MAX_DEPTH = 32
MAX_ALIAS_VALUES = 10_000  # values that alias expansion may add in total

# libyaml's loader where PyYAML was built with it
_Loader: type[yaml.SafeLoader] | type[yaml.CSafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_STR = "tag:yaml.org,2002:str"
_MERGE = "tag:yaml.org,2002:merge"
_SEQ = "tag:yaml.org,2002:seq"
_MAP = "tag:yaml.org,2002:map"
_BINARY = "tag:yaml.org,2002:binary"
_KIND = {"tag:yaml.org,2002:bool": "a boolean", "tag:yaml.org,2002:int": "a number", "tag:yaml.org,2002:float": "a number",
         "tag:yaml.org,2002:null": "null", "tag:yaml.org,2002:timestamp": "a date"}


# Names a schema checker (pydantic) puts into an error's loc that are branches of the schema (a union's member, a
# validator), not keys of the file.
_BRANCHES = frozenset({"str", "int", "float", "bool", "none", "list", "dict", "union", "nullable", "literal"})


def error_loc(data: object, err: Mapping[str, Any]) -> Loc:
    """Where a schema error (pydantic's `{"loc": ..., "type": ...}`) points in the data: the keys and list indexes
    of its loc that the data holds, plus the name of a missing field; the branch names in between are left out.
    The one rule for every file gpuforge checks with a schema, so each names a problem's line alike."""
    loc, cur = [], data
    for p in err["loc"]:
        if (isinstance(cur, dict) and p in cur) or (isinstance(cur, list) and isinstance(p, int) and 0 <= p < len(cur)):
            loc.append(p)
            cur = cur[p]
        elif err["type"] == "missing" and isinstance(p, str) and p not in _BRANCHES and "[" not in p:
            loc.append(p)
            break
    return tuple(loc)


class Positioned:
    """Parsed YAML data plus each value's 1-based line and, for scalars, the text as written."""

    def __init__(self, path: Path, data: object, lines: dict[Loc, int], raw: dict[Loc, str] | None = None):
        self.path = path
        self.data = data
        self.lines = lines
        self.raw = raw or {}

    def line(self, loc: Loc) -> int:
        """The line of `loc`, or of its nearest ancestor that has one."""
        loc = tuple(loc)
        while loc and loc not in self.lines:
            loc = loc[:-1]
        return self.lines.get(loc, 1)

    def where(self, loc: Loc) -> str:
        return f"{self.path}:{self.line(loc)}"

    def written(self, loc: Loc, value: object) -> str:
        """The value as the file spells it (`12.10`, `no`), for hints; repr-ish when unknown."""
        text = self.raw.get(tuple(loc))
        return text if text is not None else str(value)


class _Mark(Protocol):
    """Where an event starts or ends: yaml.Mark from PyYAML's parser, yaml._yaml.Mark from libyaml's."""

    line: int  # 0-based


class _EventLoader(Protocol):
    """What _Builder uses of a loader (yaml.SafeLoader, or libyaml's yaml.CSafeLoader): the parser's events, the
    resolver of implicit tags and the constructors of scalars."""

    yaml_constructors: ClassVar[dict[str | None, Any]]

    def get_event(self) -> yaml.Event | None: ...

    def resolve(self, kind: type[yaml.Node], value: str, implicit: tuple[bool, bool]) -> str: ...


class _Merge(enum.Enum):
    KEY = "<<"


# A frame's pending key when the key was `<<` (the value merges); an enum member, so no str key can be it.
_MERGE_KEY: Final = _Merge.KEY


def _line(mark: _Mark | None) -> int:
    return mark.line + 1 if mark is not None else 1


class _Frame:
    __slots__ = ("anchor", "data", "key", "loc", "mark", "merges", "seen", "size")

    def __init__(self, data: dict[str, object] | list[object], loc: Loc | None, anchor: str | None,
                 mark: _Mark | None):
        self.data, self.loc, self.anchor, self.mark = data, loc, anchor, mark
        self.key: str | _Merge | None = None
        self.seen: set[str] = set()
        self.merges: list[dict[Any, Any]] = []
        self.size = 1


class _Builder:
    """Data from parser events; records lines and raw scalar text per loc; enforces the limits."""

    def __init__(self, path: Path, loader: _EventLoader):
        self.path, self.loader = path, loader
        self.lines: dict[Loc, int] = {}
        self.raw: dict[Loc, str] = {}
        self.anchors: dict[str, tuple[object, int]] = {}  # anchor -> (data, expanded size)
        self.open_anchors: set[str] = set()
        self.alias_values = 0

    def fail(self, mark: _Mark | None, text: str) -> NoReturn:
        msg = f"{self.path}:{_line(mark)}: {text}"
        raise ConfigError(msg)

    def scalar(self, ev: yaml.ScalarEvent) -> object:
        tag = ev.tag
        if tag is None or tag == "!":
            tag = self.loader.resolve(yaml.ScalarNode, ev.value, ev.implicit)
        if tag == _STR:
            return ev.value
        ctor = self.loader.yaml_constructors.get(tag) if tag in _KIND or tag == _BINARY else None
        if ctor is None:
            self.fail(ev.start_mark, f"the tag {tag} is not allowed (matrix files hold plain strings, numbers, lists and mappings)")
        try:
            # types-PyYAML types a node's marks as yaml.Mark; libyaml's parser gives its own Mark, with the same fields
            start, end = cast("yaml.Mark | None", ev.start_mark), cast("yaml.Mark | None", ev.end_mark)
            return ctor(self.loader, yaml.ScalarNode(tag, ev.value, start, end, ev.style))
        # IndexError: PyYAML's int constructor reads value[0], so an empty `!!int` raises it; KeyError: its bool
        # constructor looks the word up, so `!!bool maybe` raises it
        except (yaml.YAMLError, ValueError, TypeError, OverflowError, IndexError, KeyError) as e:
            self.fail(ev.start_mark, f"cannot read {ev.value!r} as {tag.rsplit(':', 1)[-1]}: {getattr(e, 'problem', None) or e}")
        return None

    def build(self) -> object:
        """Read the event stream into plain values, noting each value's line; one document only."""
        ld = self.loader
        stack: list[_Frame] = []
        root = None
        docs = 0
        while True:
            ev = ld.get_event()
            if ev is None or isinstance(ev, yaml.StreamEndEvent):  # None: the parser has no events left
                return root
            if isinstance(ev, yaml.DocumentStartEvent):
                docs += 1
                if docs > 1:
                    self.fail(ev.start_mark, "more than one YAML document (---); a matrix file holds one")
                continue
            parent = stack[-1] if stack else None
            if isinstance(ev, yaml.CollectionStartEvent):  # a mapping or sequence starts
                stack.append(self._opened(ev, self._loc_for(parent), parent, depth=len(stack)))
                continue
            if isinstance(ev, yaml.CollectionEndEvent):
                value, size, mark = self._closed(stack.pop())
                parent = stack[-1] if stack else None
            elif isinstance(ev, yaml.AliasEvent | yaml.ScalarEvent):
                loc = self._loc_for(parent)
                if isinstance(ev, yaml.AliasEvent):
                    value, size = self._alias(ev)
                else:
                    if parent is not None and isinstance(parent.data, dict) and parent.key is None:
                        self._key(parent, ev)
                        parent.size += 1
                        continue
                    value, size = self.scalar(ev), 1
                    if loc is not None:
                        self.raw[loc] = ev.value
                mark = ev.start_mark
                if loc is not None:
                    self.lines.setdefault(loc, _line(mark))
                if ev.anchor:
                    self.anchors[ev.anchor] = (value, size)
            else:  # the stream's start, a document's end: no value
                continue
            if parent is None:
                root = value
            else:
                self._attach(parent, value, size, mark, ev)

    def _closed(self, done: _Frame) -> tuple[object, int, _Mark | None]:
        """A mapping or sequence that ended: its merges applied, its anchor (if any) now usable."""
        if isinstance(done.data, dict):
            for merged in done.merges:  # explicit keys win, then earlier merges over later ones
                for k, v in merged.items():
                    done.data.setdefault(k, v)
        if done.anchor:
            self.anchors[done.anchor] = (done.data, done.size)
            self.open_anchors.discard(done.anchor)
        return done.data, done.size, done.mark

    def _alias(self, ev: yaml.AliasEvent) -> tuple[object, int]:
        """The anchored value an alias names; a recursive alias, a forward one or an alias bomb is refused."""
        if ev.anchor in self.open_anchors:
            self.fail(ev.start_mark, f"alias *{ev.anchor} refers to a value that contains it (recursive)")
        if ev.anchor not in self.anchors:
            self.fail(ev.start_mark, f"alias *{ev.anchor} has no anchor &{ev.anchor} before it")
        value, size = self.anchors[ev.anchor]
        self.alias_values += size
        if self.alias_values > MAX_ALIAS_VALUES:
            self.fail(ev.start_mark, f"YAML aliases expand to more than {MAX_ALIAS_VALUES:,} values "
                                     f"(at *{ev.anchor}); refused as an alias bomb: write the values out")
        return value, size

    def _opened(self, ev: yaml.CollectionStartEvent, loc: Loc | None, parent: _Frame | None, *, depth: int) -> _Frame:
        """The frame of a mapping or sequence that starts: plain tags only, bounded depth, never a key."""
        tag = ev.tag if ev.tag not in (None, "!") else None
        is_map = isinstance(ev, yaml.MappingStartEvent)
        if tag not in (None, _MAP if is_map else _SEQ):
            self.fail(ev.start_mark, f"the tag {tag} is not allowed (matrix files hold plain lists and mappings)")
        if depth >= MAX_DEPTH:
            self.fail(ev.start_mark, f"nested deeper than {MAX_DEPTH} levels")
        if loc is not None:
            self.lines.setdefault(loc, _line(ev.start_mark))
        data: dict[str, object] | list[object] = {} if is_map else []
        frame = _Frame(data, loc, ev.anchor, ev.start_mark)
        if parent is not None and parent.key is None and isinstance(parent.data, dict):
            self.fail(ev.start_mark, "a mapping key must be a plain string, not a list or mapping")
        if ev.anchor:
            self.open_anchors.add(ev.anchor)
        return frame

    def _attach(self, parent: _Frame, value: object, size: int, mark: _Mark | None, ev: yaml.Event) -> None:
        """Put a finished value into its parent: appended to a list, or under the pending key (a merge key merges)."""
        parent.size += size
        if isinstance(parent.data, list):
            parent.data.append(value)
        elif parent.key is None:
            self.fail(ev.start_mark, "a mapping key must be a plain string, not an alias")
        else:
            if parent.key is _MERGE_KEY:
                self._merge(parent, value, mark)
            else:
                parent.data[parent.key] = value
            parent.key = None

    def _loc_for(self, parent: _Frame | None) -> Loc | None:
        if parent is None:
            return ()
        if parent.loc is None:
            return None
        if isinstance(parent.data, list):
            return (*parent.loc, len(parent.data))
        if parent.key is None or parent.key is _MERGE_KEY:
            return None  # a key, or a merged value: positions come from the keys themselves
        return (*parent.loc, parent.key)

    def _key(self, parent: _Frame, ev: yaml.ScalarEvent) -> None:
        value = ev.value
        tag = ev.tag if ev.tag not in (None, "!") else self.loader.resolve(yaml.ScalarNode, ev.value, ev.implicit)
        if tag == _MERGE:
            parent.key = _MERGE_KEY
            return
        if tag != _STR:
            self.fail(ev.start_mark, f'the key {ev.value} is read by YAML as {_KIND.get(tag, tag)}; quote it: "{ev.value}"')
        if value in parent.seen:
            where = ".".join(str(p) for p in (*(parent.loc or ()), value))
            self.fail(ev.start_mark, f"{where}: duplicate key {value!r} (each key may appear once)")
        parent.seen.add(value)
        parent.key = value
        if parent.loc is not None:
            self.lines[(*parent.loc, value)] = _line(ev.start_mark)

    def _merge(self, parent: _Frame, value: object, mark: _Mark | None) -> None:
        items = value if isinstance(value, list) else [value]
        merges = [m for m in items if isinstance(m, dict)]
        if len(merges) != len(items):
            self.fail(mark, "<< (merge) needs a mapping or a list of mappings")
        parent.merges.extend(merges)


def _read(path: Path) -> str:
    try:
        with path.open("rb") as f:
            data = f.read(MAX_BYTES + 1)
    except FileNotFoundError:
        msg = f"{path}: file not found (pass --matrix PATH or run from the project root)"
        raise ConfigError(msg) from None
    except IsADirectoryError:
        msg = f"{path}: is a directory, not a matrix file"
        raise ConfigError(msg) from None
    except OSError as e:
        msg = f"{path}: cannot read: {e.strerror}"
        raise ConfigError(msg) from None
    if len(data) > MAX_BYTES:
        msg = f"{path}:1: larger than {MAX_BYTES // 1024} KiB; a matrix file this big is refused (it is a few KB normally)"
        raise ConfigError(msg)
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        col = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        msg = f"{path}:{line}: not UTF-8 text: byte 0x{data[e.start]:02x} at column {col} (save the file as UTF-8)"
        raise ConfigError(msg) from None


def load(path: Path) -> Positioned:
    text = _read(path)
    loader = _Loader(text)
    builder = _Builder(path, loader)
    try:
        data = builder.build()
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark else 1
        msg = f"{path}:{line}: not valid YAML: {e.problem or e.context}"
        raise ConfigError(msg) from None
    except yaml.reader.ReaderError as e:
        line = text.count("\n", 0, e.position) + 1
        code = e.character if isinstance(e.character, int) else ord(str(e.character)[:1] or "\0")
        msg = f"{path}:{line}: not valid YAML: {e.reason} (character U+{code:04X}; remove it)"
        raise ConfigError(msg) from None
    except yaml.YAMLError as e:
        msg = f"{path}:1: not valid YAML: {str(e).splitlines()[0]}"
        raise ConfigError(msg) from None
    finally:
        loader.dispose()
    return Positioned(path, data, builder.lines, builder.raw)
