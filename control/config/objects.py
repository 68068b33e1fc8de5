"""What loading produces: validated objects converted to the model, grouped per file."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from control.model.delegation import takes_part
from control.model.gatewayapi import GatewayApiObject
from control.model.types import (
    ConfigWarning,
    MeshObjects,
    SourceRef,
    Workload,
)


@dataclass(frozen=True, slots=True)
class ConfigObject(MeshObjects):
    """One loaded config object: where it came from, the raw object, what it became."""

    source: SourceRef
    raw: Mapping[str, Any] = field(compare=False)
    workloads: tuple[Workload, ...] = ()
    # Gateway API objects, translated once all are merged (control/gatewayapi/translate.py).
    gateway_api: tuple[GatewayApiObject, ...] = ()
    # Identity for duplicate detection: (kind, namespace, name). A kind outside the core and
    # Istio groups is qualified by its group (`Gateway.gateway.networking.k8s.io`), so an
    # Istio Gateway and a Gateway API Gateway of the same name are two objects. Worked out
    # once: every reload of any file checks the keys of all objects again (thousands).
    key: tuple[str, str, str] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        source = self.source
        key = (qualified_kind(source.kind, self.raw), source.namespace, source.name)
        object.__setattr__(self, "key", key)


def qualified_kind(kind: str, raw: Mapping[str, Any]) -> str:
    api_version = raw.get("apiVersion")
    group = api_version.rpartition("/")[0] if isinstance(api_version, str) else ""
    if not group or group.endswith(".istio.io"):
        return kind
    return f"{kind}.{group}"


@dataclass(frozen=True, slots=True)
class Converted:
    """A kind converter's result: the object (None when the kind is ignored) and warnings."""

    object: ConfigObject | None
    warnings: tuple[ConfigWarning, ...] = ()


@dataclass(frozen=True, slots=True)
class FileConfig:
    """All objects of one file, in file order, and the warnings found while loading it."""

    path: str
    objects: tuple[ConfigObject, ...] = ()
    warnings: tuple[ConfigWarning, ...] = ()
    # What the merge takes from this file, worked out once per version of the file: a reload
    # of one file merges every file again, and the unchanged ones should cost next to nothing.
    parts: MergeParts = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "parts", MergeParts.of(self.objects, self.path))


@dataclass(frozen=True, slots=True)
class MergeParts(MeshObjects):
    """Objects in (file, line) order, split by what they hold, with their duplicate keys.

    `file` is the one file every object came from, or "" when they came from several (then
    the parts of different files cannot simply be put end to end)."""

    file: str
    objects: tuple[ConfigObject, ...]
    keys: frozenset[tuple[str, str, str]]
    raw: tuple[tuple[SourceRef, Mapping[str, Any]], ...]
    workloads: tuple[Workload, ...]
    gateway_api: tuple[GatewayApiObject, ...]
    # Whether a VirtualService here is a delegate or delegates a route: merging every file
    # again on each reload resolves delegation only when one does.
    delegation: bool

    @classmethod
    def of(cls, objects: Iterable[ConfigObject], file: str = "") -> MergeParts:
        ordered = tuple(sorted(objects, key=_position))
        if any(o.source.file != file for o in ordered):
            file = ""
        per_kind = {name: tuple(x for o in ordered for x in getattr(o, name)) for name in _PER_KIND}
        return cls(
            file=file,
            objects=ordered,
            keys=frozenset(o.key for o in ordered),
            raw=tuple([(o.source, o.raw) for o in ordered]),
            delegation=any(map(takes_part, per_kind["virtual_services"])),
            **per_kind,
        )


# The tuples a ConfigObject holds per kind; MergeParts puts each end to end over its objects.
_PER_KIND = (*(f.name for f in fields(MeshObjects)), "workloads", "gateway_api")


def _position(obj: ConfigObject) -> tuple[str, int]:
    return (obj.source.file, obj.source.line)
