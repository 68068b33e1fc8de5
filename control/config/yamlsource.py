"""YAML text -> plain Python trees that remember the line of every node.

PyYAML's constructors throw position information away, so this module composes the node graph
(with libyaml when it is available) and builds plain dicts, lists and scalars itself, recording
a side map from each node's path (`("spec", "ports", 0, "port")`) to its 1-based line. The
validators use that map to point errors at the offending field.

Only the YAML that Kubernetes and Istio manifests use is accepted: the core schema scalars,
mappings with string keys, sequences, anchors/aliases and merge keys (`<<`). Custom tags,
duplicate keys, recursive aliases and alias bombs are errors, never tracebacks.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from control.config.errors import ConfigError

logger = logging.getLogger(__name__)

Path = tuple[str | int, ...]

_Loader: type[Any] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

# Guards against alias bombs ("billion laughs") and absurd nesting, far above real manifests:
# aliases may expand a document to at most MAX_ALIAS_EXPANSION times its own size (and any
# document may reach ALIAS_EXPANSION_FLOOR nodes).
MAX_ALIAS_EXPANSION = 10
ALIAS_EXPANSION_FLOOR = 100_000
MAX_DEPTH = 100

_TAG = "tag:yaml.org,2002:"
_STRING_TAGS = frozenset({_TAG + "str", _TAG + "timestamp", _TAG + "binary"})
_scalars = SafeConstructor()


@dataclass(frozen=True, slots=True)
class Document:
    """One non-empty YAML document: its value and the line of each node (by path)."""

    file: str
    line: int  # line where the document's root node starts
    value: Any
    lines: Mapping[Path, int]

    def line_of(self, path: Path) -> int:
        """The line of `path`, or of its nearest ancestor that exists (for missing fields)."""
        return line_in(self.lines, path, self.line)


def line_in(lines: Mapping[Path, int], path: Path, default: int) -> int:
    while path:
        found = lines.get(path)
        if found is not None:
            return found
        path = path[:-1]
    return lines.get((), default)


def parse_yaml(text: str, file: str, first_line: int = 0) -> list[Document]:
    """Parse multi-document YAML; empty documents (`---` alone, comments only) are skipped.
    `first_line`: how many lines of the file precede `text` (a part of it), added to the
    line of every node.

    Raises ConfigError with the line the YAML parser reports for syntax errors.
    """
    try:
        roots: list[Node] = list(yaml.compose_all(text, Loader=_Loader))
    except yaml.MarkedYAMLError as exc:
        # At the end of a file without a final newline libyaml's mark is one line past it.
        line = min(_mark_line(exc), last_line(text)) + first_line
        raise ConfigError(file, line, _yaml_reason(exc, first_line)) from None
    except yaml.reader.ReaderError as exc:
        line = _reader_line(exc, text) + first_line
        raise ConfigError(file, line, f"invalid YAML: {_reader_reason(exc)}") from None
    except yaml.YAMLError as exc:  # any other libyaml complaint without a position
        raise ConfigError(file, 1 + first_line, f"invalid YAML: {exc}") from None
    except RecursionError:
        raise ConfigError(file, 1 + first_line, "invalid YAML: nesting is too deep") from None
    docs: list[Document] = []
    for root in roots:
        if root is None or _is_null(root):
            continue
        builder = _Builder(file, first_line + 1)
        value = builder.build(root, (), 0)
        docs.append(Document(file, root.start_mark.line + builder.base, value, builder.lines))
    return docs


_LINE_BREAK = re.compile("\r\n|[\r\n\x85\u2028\u2029]")  # what YAML counts as one


def last_line(text: str) -> int:
    """The number of the last line of `text` (1-based, as YAML counts lines)."""
    return len(_LINE_BREAK.findall(text)) + 1


def _is_null(node: Node) -> bool:
    return isinstance(node, ScalarNode) and node.tag == _TAG + "null"


def _mark_line(exc: yaml.MarkedYAMLError) -> int:
    mark = exc.problem_mark or exc.context_mark
    return mark.line + 1 if mark is not None else 1


def _yaml_reason(exc: yaml.MarkedYAMLError, first_line: int = 0) -> str:
    reason = f"invalid YAML: {exc.problem or 'syntax error'}"
    if exc.context:
        where = ""
        if exc.context_mark is not None and exc.problem_mark is not None:
            if exc.context_mark.line != exc.problem_mark.line:
                where = f" started at line {exc.context_mark.line + 1 + first_line}"
        reason += f" ({exc.context}{where})"
    return reason


def _reader_line(exc: yaml.reader.ReaderError, text: str) -> int:
    char = exc.character
    index = text.find(chr(char)) if isinstance(char, int) else -1
    if index < 0:
        index = exc.position if exc.position <= len(text) else 0
    return text.count("\n", 0, index) + 1


def _reader_reason(exc: yaml.reader.ReaderError) -> str:
    if isinstance(exc.character, int):
        return f"unacceptable character #x{exc.character:04x}: {exc.reason}"
    return str(exc.reason)


class _Builder:
    """Builds plain values from a node graph, recording the line of every path."""

    def __init__(self, file: str, base: int = 1) -> None:
        self.file = file
        self.base = base  # the line number of the text's first line
        self.lines: dict[Path, int] = {}
        self._count = 0
        self._distinct: set[int] = set()
        self._active: set[int] = set()

    def _fail(self, node: Node, reason: str) -> ConfigError:
        return ConfigError(self.file, node.start_mark.line + self.base, reason)

    def build(self, node: Node, path: Path, depth: int) -> Any:
        self._count += 1
        self._distinct.add(id(node))
        if self._count > ALIAS_EXPANSION_FLOOR and self._count > MAX_ALIAS_EXPANSION * len(
            self._distinct
        ):
            raise self._fail(
                node,
                f"document too large: aliases expand it more than {MAX_ALIAS_EXPANSION}-fold "
                "(an alias bomb?)",
            )
        if depth > MAX_DEPTH:
            raise self._fail(node, f"document nested too deeply (more than {MAX_DEPTH} levels)")
        self.lines.setdefault(path, node.start_mark.line + self.base)
        if isinstance(node, ScalarNode):
            return self._scalar(node)
        if id(node) in self._active:
            raise self._fail(node, "recursive YAML alias (a node that contains itself)")
        self._active.add(id(node))
        try:
            if isinstance(node, SequenceNode):
                if node.tag != _TAG + "seq":
                    raise self._fail(node, f"unsupported YAML tag {node.tag}")
                return [
                    self.build(child, (*path, i), depth + 1) for i, child in enumerate(node.value)
                ]
            if isinstance(node, MappingNode):
                if node.tag != _TAG + "map":
                    raise self._fail(node, f"unsupported YAML tag {node.tag}")
                return self._mapping(node, path, depth)
            raise self._fail(node, f"unsupported YAML node {type(node).__name__}")
        finally:
            self._active.discard(id(node))

    def _mapping(self, node: MappingNode, path: Path, depth: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        merges: list[Node] = []
        for key_node, value_node in node.value:
            if key_node.tag == _TAG + "merge":
                merges.append(value_node)
                continue
            # Kubernetes turns YAML into JSON, where a number key (Istio's `portLevelMtls:
            # {8080: ...}`) becomes its decimal string; other non-string keys have no JSON form.
            is_number = (
                isinstance(key_node, ScalarNode)
                and key_node.tag == _TAG + "int"
                and key_node.value.isdigit()
            )
            if not is_number and (
                not isinstance(key_node, ScalarNode) or key_node.tag != _TAG + "str"
            ):
                shown = key_node.value if isinstance(key_node, ScalarNode) else "a collection"
                raise self._fail(key_node, f"mapping keys must be strings (got {shown!r})")
            key = str(int(key_node.value)) if is_number else str(key_node.value)
            child = (*path, key)
            if key in out:
                first = self.lines.get(child)
                raise self._fail(key_node, f"duplicate key {key!r} (first defined at line {first})")
            self.lines[child] = key_node.start_mark.line + self.base
            out[key] = self.build(value_node, child, depth + 1)
        # Merge keys (`<<: *base` or `<<: [*a, *b]`): keys stated here win, then earlier sources.
        for merge in merges:
            sources = merge.value if isinstance(merge, SequenceNode) else [merge]
            for source in sources:
                if not isinstance(source, MappingNode):
                    raise self._fail(source, "a merge key (<<) must refer to a mapping")
                sub = _Builder(self.file, self.base)
                sub._count, sub._distinct, sub._active = self._count, self._distinct, self._active
                merged = sub.build(source, path, depth + 1)
                self._count = sub._count
                taken: set[str] = set()
                for key, value in merged.items():
                    if key not in out:
                        out[key] = value
                        taken.add(key)
                # The lines of what was taken, in one pass over the source's lines (a pass per
                # key made a large merged mapping cost quadratic time: a few hundred kilobytes
                # of YAML kept the loader busy for minutes).
                at = len(path)
                for sub_path, line in sub.lines.items():
                    if len(sub_path) > at and sub_path[at] in taken:
                        self.lines.setdefault(sub_path, line)
        return out

    def _scalar(self, node: ScalarNode) -> Any:
        tag = node.tag
        if tag in _STRING_TAGS:
            return str(node.value)
        try:
            if tag == _TAG + "null":
                return None
            if tag == _TAG + "bool":
                return _scalars.construct_yaml_bool(node)
            if tag == _TAG + "int":
                return _scalars.construct_yaml_int(node)
            if tag == _TAG + "float":
                return _scalars.construct_yaml_float(node)
        except (ValueError, yaml.YAMLError):
            raise self._fail(
                node, f"invalid {tag.removeprefix(_TAG)} value {node.value!r}"
            ) from None
        raise self._fail(node, f"unsupported YAML tag {tag} on value {node.value!r}")
