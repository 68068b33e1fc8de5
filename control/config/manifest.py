"""Config objects as they appear in a file: the Kubernetes envelope around each document.

Every object needs `apiVersion`, `kind` and `metadata.name`; `metadata.namespace` defaults to
"default". A `kind: List` (what `kubectl get -o yaml` writes) is expanded into its items.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from control.config import formats
from control.config.errors import ConfigError
from control.config.yamlsource import Document, Path, line_in
from control.model.types import SourceRef

DEFAULT_NAMESPACE = "default"
REVISION_LABEL = "istio.io/rev"


@dataclass(frozen=True, slots=True)
class RawObject:
    """One config object with its envelope checked; `data` is the whole object as loaded."""

    file: str
    line: int  # where the object starts
    api_version: str
    kind: str
    namespace: str
    name: str
    data: Mapping[str, Any]
    lines: Mapping[Path, int]  # paths relative to `data`

    def line_of(self, path: Path) -> int:
        return line_in(self.lines, path, self.line)

    @property
    def source(self) -> SourceRef:
        return SourceRef(self.kind, self.namespace, self.name, self.file, self.line)

    @property
    def label(self) -> str:
        """How messages name the object: `Service default/backend`."""
        return f"{self.kind} {self.namespace}/{self.name}"


def in_revision(raw: RawObject, revision: str) -> bool:
    """Whether a control plane of `revision` ("" = the default revision) uses the object, as
    Istio's LabelsInRevision with istiod's REVISION (`default` unless installed as a
    revision): Istio and Gateway API config labelled `istio.io/rev` is for that revision
    only; unlabelled config, and Kubernetes' own kinds, are for every revision."""
    group = raw.api_version.rpartition("/")[0]
    if not (group.endswith(".istio.io") or group == "gateway.networking.k8s.io"):
        return True
    labels = (raw.data.get("metadata") or {}).get("labels") or {}
    wanted = labels.get(REVISION_LABEL) if isinstance(labels, Mapping) else None
    return wanted is None or str(wanted) == (revision or "default")


def format_path(path: Path) -> str:
    """`("spec", "ports", 0, "port")` -> `spec.ports[0].port`; odd keys are quoted."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part and all(c.isalnum() or c in "_-" for c in part):
            out += f".{part}" if out else part
        else:
            out += f"[{part!r}]"
    return out


def objects_of(doc: Document) -> list[RawObject]:
    """The config objects in one YAML document (several for a `kind: List`)."""
    return _objects(doc.file, doc.value, doc.lines, (), doc.line)


def _objects(
    file: str, value: Any, lines: Mapping[Path, int], shown: Path, line: int
) -> list[RawObject]:
    """`lines` are relative to `value`; `shown` is the path of `value` for messages."""

    def fail(path: Path, reason: str) -> ConfigError:
        where = format_path(shown + path)
        return ConfigError(file, line_in(lines, path, line), f"{where}: {reason}")

    if not isinstance(value, dict):
        what = "a list" if isinstance(value, list) else f"the value {value!r}"
        prefix = f"{format_path(shown)}: " if shown else ""
        raise ConfigError(
            file,
            line,
            f"{prefix}expected a Kubernetes object (a mapping with apiVersion, kind, metadata), "
            f"got {what}",
        )
    api_version = _required_str(value, "apiVersion", fail)
    kind = _required_str(value, "kind", fail)
    if kind == "List":
        return _list_items(file, value, lines, shown, line, fail)
    metadata = value.get("metadata")
    if metadata is None:
        raise fail(("metadata",), "is required (with at least a name)")
    if not isinstance(metadata, dict):
        raise fail(("metadata",), "must be a mapping")
    name = metadata.get("name")
    if name is None or name == "":
        raise fail(("metadata", "name"), "is required")
    if not isinstance(name, str):
        raise fail(("metadata", "name"), "must be a string")
    namespace = metadata.get("namespace")
    if namespace is None or namespace == "":
        namespace = DEFAULT_NAMESPACE
    elif not isinstance(namespace, str):
        raise fail(("metadata", "namespace"), "must be a string")
    elif (problem := formats.dns1123_label(namespace)) is not None:
        raise fail(("metadata", "namespace"), problem)
    return [RawObject(file, line, api_version, kind, namespace, name, value, lines)]


def _list_items(
    file: str,
    value: Mapping[str, Any],
    lines: Mapping[Path, int],
    shown: Path,
    line: int,
    fail: Callable[[Path, str], ConfigError],
) -> list[RawObject]:
    items = value.get("items")
    if items is None:
        return []
    if not isinstance(items, list):
        raise fail(("items",), "must be a list of objects")
    # Split the line map by item in one pass (a List can hold thousands of objects).
    per_item: list[dict[Path, int]] = [{} for _ in items]
    for path, ln in lines.items():
        if len(path) >= 2 and path[0] == "items" and isinstance(path[1], int):
            per_item[path[1]][path[2:]] = ln
    out: list[RawObject] = []
    for i, item in enumerate(items):
        item_line = per_item[i].get((), line)
        out.extend(_objects(file, item, per_item[i], (*shown, "items", i), item_line))
    return out


def _required_str(
    value: Mapping[str, Any], key: str, fail: Callable[[Path, str], ConfigError]
) -> str:
    got = value.get(key)
    if got is None or got == "":
        raise fail((key,), "is required")
    if not isinstance(got, str):
        raise fail((key,), "must be a string")
    return got
