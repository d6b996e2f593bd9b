"""Reading a user's YAML file (node profile, kubeconfig, cloud-config part) strictly and boundedly.

One reader for every YAML file a user hands nodeprep:

- the file must be a regular file no larger than a limit (1 MiB by default), checked before parsing;
- UTF-8, or UTF-8/16/32 marked by a byte order mark (YAML allows these); anything else is refused
  with the offending byte's line;
- duplicate mapping keys are refused with both line numbers (PyYAML keeps the last one silently);
- nesting deeper than MAX_DEPTH and documents that expand (through aliases) to more than MAX_NODES
  nodes are refused before they are built ("billion laughs"), so no RecursionError and no blow-up;
- only the safe tags (SafeConstructor): `!!python/...` is refused with its line.

Problems raise InputFileError (exit 2) naming the file and the line. `load_yaml` returns the data and
the line of every mapping key and list item by path, so callers can name lines in their own checks.
Parsing uses libyaml's C parser when available (linear time; the pure-Python scanner is ~15x slower)
with the Python composer below, which enforces the limits.
"""

from __future__ import annotations

import codecs
import errno
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from yaml.composer import Composer, ComposerError
from yaml.constructor import SafeConstructor
from yaml.events import AliasEvent, ScalarEvent, SequenceStartEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from yaml.resolver import Resolver

from .errors import InputFileError
from .sysfs import UnsafeFile, read_bytes

MAX_BYTES = 1 << 20  # 1 MiB: a real profile is a few KiB
MAX_DEPTH = 64
MAX_NODES = 500_000  # nodes after alias expansion

try:  # libyaml's parser (Debian's python3-yaml and the wheels ship it)
    from yaml._yaml import CParser as _Parser

    _C = True
except ImportError:  # pragma: no cover - pure-Python PyYAML
    from yaml.parser import Parser as _ParserPy
    from yaml.reader import Reader
    from yaml.scanner import Scanner

    _C = False

_BOMS = (
    (codecs.BOM_UTF32_LE, "utf-32-le", "UTF-32"),
    (codecs.BOM_UTF32_BE, "utf-32-be", "UTF-32"),
    (codecs.BOM_UTF8, "utf-8", "UTF-8"),
    (codecs.BOM_UTF16_LE, "utf-16-le", "UTF-16"),
    (codecs.BOM_UTF16_BE, "utf-16-be", "UTF-16"),
)


def _human(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 and n % (1 << 20) == 0 else f"{n} bytes"


def read_input_bytes(path: Path, *, limit: int = MAX_BYTES, source: str | None = None,
                     error: type[InputFileError] = InputFileError) -> bytes:
    """The bytes of a user's input file: a regular file of at most `limit` bytes (never blocks on a
    FIFO, never reads more than limit + 1 bytes)."""
    src = source or str(path)
    try:
        return read_bytes(path, limit=limit, follow=True)
    except FileNotFoundError:
        raise error(["file not found"], source=src) from None
    except UnsafeFile as e:
        if e.errno == errno.EFBIG:
            raise error([f"larger than the {_human(limit)} limit for this file (refused before parsing)"],
                        source=src) from None
        raise error([e.strerror or "not a regular file"], source=src) from None
    except OSError as e:
        raise error([f"cannot read ({e.strerror})"], source=src) from None


def decode_text(raw: bytes, *, source: str, error: type[InputFileError] = InputFileError) -> str:
    """UTF-8, or UTF-8/16/32 with a byte order mark; anything else is refused with its line."""
    for bom, codec, name in _BOMS:
        if raw.startswith(bom):
            try:
                return raw[len(bom):].decode(codec)
            except UnicodeDecodeError as e:
                raise error([f"not valid {name} text after its byte order mark ({e.reason} at byte "
                             f"{e.start + len(bom)})"], source=source) from None
    if b"\x00" in raw:
        line = raw[:raw.index(b"\x00")].count(b"\n") + 1
        raise error([f"line {line}: contains NUL bytes (binary, or UTF-16/32 "
                     "without a byte order mark); save it as UTF-8"], source=source)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        raise error([f"line {line}: not UTF-8 text (byte 0x{raw[e.start]:02x}); save it as UTF-8"],
                    source=source) from None


# ---------------------------------------------------------------------------------------------
# Loader: C (or Python) parser + a composer with limits + SafeConstructor


class _LimitedComposer(Composer):
    """PyYAML's composer with a nesting limit, an expansion limit and duplicate-key detection."""

    def __init__(self) -> None:
        super().__init__()
        self._depth = 0
        self._expanded = 0
        self._weights: dict[int, int] = {}

    if TYPE_CHECKING:  # a mixin: the loader's parser (libyaml's or PyYAML's) provides these
        def peek_event(self) -> Any: ...
        def get_event(self) -> Any: ...

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        # Composer.compose_node with the limits (and without the path-resolver hooks, which
        # SafeLoader does not use): one event peeked, one type test, counters inline.
        event = self.peek_event()
        if isinstance(event, AliasEvent):
            self.get_event()
            node: Node | None = self.anchors.get(event.anchor)
            if node is None:
                # types-PyYAML: an event's mark may be libyaml's Mark, which its errors take too
                raise ComposerError(None, None, f"found undefined alias {event.anchor!r}",
                                    event.start_mark)  # type: ignore[arg-type]
            self._expanded += self._weights.get(id(node), 1)
            if self._expanded > MAX_NODES:
                raise ComposerError(None, None, f"expands to more than {MAX_NODES} nodes (aliases)",
                                    event.start_mark)  # type: ignore[arg-type]  # as above
            return node
        anchor = event.anchor
        if anchor is not None and anchor in self.anchors:
            raise ComposerError(f"found duplicate anchor {anchor!r}; first occurrence",
                                self.anchors[anchor].start_mark, "second occurrence", event.start_mark)
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise ComposerError(None, None, f"nested deeper than {MAX_DEPTH} levels", event.start_mark)
        self._expanded += 1
        if self._expanded > MAX_NODES:
            raise ComposerError(None, None, f"expands to more than {MAX_NODES} nodes (aliases)",
                                event.start_mark)
        before = self._expanded
        if isinstance(event, ScalarEvent):
            node = self.compose_scalar_node(anchor)
        elif isinstance(event, SequenceStartEvent):
            node = self.compose_sequence_node(anchor)
        else:
            node = self.compose_mapping_node(anchor)
        self._depth -= 1
        if anchor is not None:
            self._weights[id(node)] = self._expanded - before
        return node

    def compose_mapping_node(self, anchor: Any) -> MappingNode:  # str | None (types-PyYAML: a dict)
        node: MappingNode = super().compose_mapping_node(anchor)
        seen: dict[tuple[str, str], int] = {}
        for key, _ in node.value:
            if not isinstance(key, ScalarNode) or key.tag == "tag:yaml.org,2002:merge":
                continue
            ident = (key.tag, key.value)
            if ident not in seen:
                seen[ident] = key.start_mark.line + 1
                continue
            first = seen[ident]
            raise ComposerError(None, None, f"duplicate key {key.value[:60]!r} (first at line {first})",
                                    key.start_mark)
        return node


if _C:

    class _Loader(_Parser, _LimitedComposer, SafeConstructor, Resolver):
        def __init__(self, stream: str) -> None:
            _Parser.__init__(self, stream)
            _LimitedComposer.__init__(self)
            SafeConstructor.__init__(self)
            Resolver.__init__(self)

        # CParser defines its own (C) composer: use the Python one with the limits.
        get_single_node = _LimitedComposer.get_single_node
        compose_document = _LimitedComposer.compose_document
        compose_node = _LimitedComposer.compose_node
        compose_scalar_node = _LimitedComposer.compose_scalar_node
        compose_sequence_node = _LimitedComposer.compose_sequence_node
        compose_mapping_node = _LimitedComposer.compose_mapping_node

else:  # pragma: no cover

    # the same loader on PyYAML's own parser: one of the two definitions exists
    class _Loader(Reader, Scanner, _ParserPy, _LimitedComposer, SafeConstructor, Resolver):  # type: ignore[no-redef]
        def __init__(self, stream: str) -> None:
            Reader.__init__(self, stream)
            Scanner.__init__(self)
            _ParserPy.__init__(self)
            _LimitedComposer.__init__(self)
            SafeConstructor.__init__(self)
            Resolver.__init__(self)


class Document:
    """Parsed YAML plus the line (1-based) of every mapping key and list item, by path (worked out
    from the node tree only when a line is asked for: a valid file never pays for it)."""

    def __init__(self, data: Any, root: Node | None = None) -> None:
        self.data = data
        self._root = root
        self._lines: dict[tuple[Any, ...], int] | None = None

    @property
    def lines(self) -> dict[tuple[Any, ...], int]:
        if self._lines is None:
            self._lines = _record_lines(self._root)
        return self._lines

    def line(self, *path: Any) -> int | None:
        """Line of `path`, or of its longest known prefix."""
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path[:-1]
        return None


def _record_lines(root: Node | None) -> dict[tuple[Any, ...], int]:
    lines: dict[tuple[Any, ...], int] = {}
    seen: set[int] = set()
    stack: list[tuple[Node, tuple[Any, ...]]] = [(root, ())] if root is not None else []
    while stack:
        node, path = stack.pop()
        if id(node) in seen:  # an alias: its lines are those of the anchor
            continue
        seen.add(id(node))
        if isinstance(node, MappingNode):
            for key, value in node.value:
                if isinstance(key, ScalarNode):
                    sub = (*path, key.value)
                    lines.setdefault(sub, key.start_mark.line + 1)
                    stack.append((value, sub))
        elif isinstance(node, SequenceNode):
            for i, item in enumerate(node.value):
                sub = (*path, i)
                lines.setdefault(sub, item.start_mark.line + 1)
                stack.append((item, sub))
    return lines


def _yaml_problem(e: yaml.YAMLError) -> str:
    mark = getattr(e, "problem_mark", None)
    where = f"line {mark.line + 1}: " if mark is not None else ""
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    if isinstance(e, yaml.constructor.ConstructorError) and "constructor for the tag" in problem:
        problem = problem.replace("could not determine a constructor for the tag", "tag not allowed:")
    if "nesting depth" in problem:
        # libyaml's own depth limit (PyYAML >= 6.0.3 wheels) can refuse a deep flow collection in
        # its scanner before the composer's MAX_DEPTH sees it: the same refusal, one wording.
        problem = f"nested deeper than {MAX_DEPTH} levels"
    return f"{where}{problem}" if problem.startswith(("duplicate key", "nested", "expands")) \
        else f"{where}not valid YAML ({problem})"


def parse_yaml(text: str, *, source: str, error: type[InputFileError] = InputFileError) -> Document:
    """Parse one YAML document with the limits above; InputFileError naming the line otherwise."""
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as e:
        raise error([_yaml_problem(e)], source=source) from None
    except RecursionError:  # pragma: no cover - MAX_DEPTH keeps far below the interpreter's limit
        raise error([f"nested deeper than {MAX_DEPTH} levels"], source=source) from None
    finally:
        loader.dispose()
    return Document(data, node)


def load_yaml(path: Path, *, limit: int = MAX_BYTES, source: str | None = None,
              error: type[InputFileError] = InputFileError) -> tuple[str, Document]:
    """Read, decode and parse a user's YAML file: (its text, the parsed Document)."""
    src = source or str(path)
    text = decode_text(read_input_bytes(path, limit=limit, source=src, error=error), source=src, error=error)
    return text, parse_yaml(text, source=src, error=error)
