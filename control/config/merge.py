"""Merging the objects of all files into one MeshConfig snapshot.

Objects are taken in (file, line) order, which makes every tie-break deterministic: for two
services with the same hostname the first one wins (and a warning names both).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Protocol, TypeVar

from control.config.conflicts import (
    destination_rule_conflicts,
    unknown_subsets,
    virtual_service_conflicts,
)
from control.config.errors import DuplicateObjectError
from control.config.objects import ConfigObject, FileConfig, MergeParts
from control.gatewayapi.translate import Translator
from control.model.delegation import merge_delegates
from control.model.traffic_index import mesh_virtual_services
from control.model.types import (
    ConfigWarning,
    Labels,
    MeshConfig,
    Service,
    SourceRef,
)

_T = TypeVar("_T")


def _where(source: SourceRef) -> str:
    return f"{source.file}:{source.line}"


def merge(
    files: Sequence[FileConfig],
    namespace_labels: Callable[[str], Labels] = lambda _ns: (),
    secrets: Collection[tuple[str, str]] | None = None,
    translator: Translator | None = None,
) -> MeshConfig:
    """One MeshConfig from the objects of all files.

    Gateway API objects are translated here, with the whole config at hand:
    `namespace_labels` answers a namespace's labels (for allowedRoutes selectors; files have
    none but the name label), `secrets` the known Secrets (None: the gateway certificates
    among the objects). A source that merges again and again passes the same `translator`,
    which translates again only the routes that changed (control/gatewayapi/translate.py).

    Raises DuplicateObjectError when two objects have the same kind, namespace and name; the
    error points at the later one and names the first.
    """
    parts = _in_order(files)
    _check_duplicates(parts)
    warnings: list[ConfigWarning] = [
        w for f in sorted(files, key=lambda f: f.path) for w in f.warnings
    ]

    services: list[Service] = []
    by_host: dict[str, Service] = {}
    for part in parts:
        for service in part.services:
            first = by_host.get(service.hostname)
            if first is None:
                by_host[service.hostname] = service
                services.append(service)
                continue
            warnings.append(
                ConfigWarning(
                    service.source,
                    f"host {service.hostname} is already defined by {first.source}; "
                    "this definition is ignored",
                )
            )
    sidecars = _all(parts, lambda p: p.sidecars)
    warnings.extend(
        _namespace_wide(
            [sc for sc in sidecars if sc.workload_selector is None], "Sidecar", "workloadSelector"
        )
    )
    peer_authentications = _all(parts, lambda p: p.peer_authentications)
    warnings.extend(
        _namespace_wide(
            [pa for pa in peer_authentications if pa.selector is None],
            "PeerAuthentication",
            "selector",
        )
    )
    telemetries = _all(parts, lambda p: p.telemetries)
    warnings.extend(
        _namespace_wide([t for t in telemetries if t.selector is None], "Telemetry", "selector")
    )
    written = _all(parts, lambda p: p.virtual_services)
    virtual_services = written
    if any(p.delegation for p in parts):
        # Roots with their delegates' routes in place, delegates left out: every index and
        # generator sees plain VirtualServices (configz still shows the objects as written).
        virtual_services, unresolved = merge_delegates(written)
        warnings.extend(unresolved)
    destination_rules = _all(parts, lambda p: p.destination_rules)
    # One VirtualService per host holds for sidecars; gateways merge theirs per host.
    warnings.extend(virtual_service_conflicts(mesh_virtual_services(virtual_services)))
    warnings.extend(destination_rule_conflicts(destination_rules))
    # As written: a delegate's unknown subset is reported at the delegate.
    warnings.extend(unknown_subsets(written, destination_rules, services))
    # Translated after the checks above: those are about sidecar routing (one VirtualService
    # per host), while a gateway merges the routes of many HTTPRoutes per host.
    tls_secrets = tuple(_all(parts, lambda p: p.secrets))
    if secrets is None:
        # The gateway certificates of this config (control/model/secret.py): certificateRefs
        # to anything else do not resolve.
        secrets = {(s.namespace, s.name) for s in tls_secrets}
    gateway_api = (translator or Translator()).translate(
        _all(parts, lambda p: p.gateway_api), services, namespace_labels, secrets
    )
    warnings.extend(gateway_api.warnings)
    virtual_services.extend(gateway_api.virtual_services)
    return MeshConfig(
        services=tuple(services),
        workload_entries=tuple(_all(parts, lambda p: p.workloads)),
        sidecars=tuple(sidecars),
        peer_authentications=tuple(peer_authentications),
        authorization_policies=tuple(_all(parts, lambda p: p.authorization_policies)),
        virtual_services=tuple(virtual_services),
        destination_rules=tuple(destination_rules),
        workload_groups=tuple(_all(parts, lambda p: p.workload_groups)),
        gateways=(*_all(parts, lambda p: p.gateways), *gateway_api.gateways),
        reference_grants=gateway_api.reference_grants,
        gateway_api_status=gateway_api.statuses,
        telemetries=tuple(telemetries),
        secrets=tls_secrets,
        raw=tuple(_all(parts, lambda p: p.raw)),
        warnings=tuple(dict.fromkeys(warnings)),
    )


def _all(parts: Sequence[MergeParts], kind: Callable[[MergeParts], Iterable[_T]]) -> list[_T]:
    """One kind of object of every part, in order. (Joined in C: every reload of any file
    merges all files again, thousands of objects.)"""
    return list(itertools.chain.from_iterable([kind(p) for p in parts]))


def _in_order(files: Sequence[FileConfig]) -> list[MergeParts]:
    """The files' objects in (file, line) order, as the parts each file worked out when it
    was loaded: files by path, end to end, when each holds only objects of its own path;
    otherwise (objects naming other files) all objects sorted again."""
    ordered = sorted(files, key=lambda f: f.path)
    if all(f.parts.file == f.path for f in ordered) and len({f.path for f in ordered}) == len(
        ordered
    ):
        return [f.parts for f in ordered]
    return [MergeParts.of(obj for f in files for obj in f.objects)]


def _check_duplicates(parts: Sequence[MergeParts]) -> None:
    # Every reload of any file checks every object again: as many keys as objects is the
    # common answer, found from each file's key set without a Python loop over objects.
    if sum(len(p.objects) for p in parts) != len(frozenset().union(*(p.keys for p in parts))):
        check_duplicates([obj for p in parts for obj in p.objects])


def check_duplicates(objects: Sequence[ConfigObject]) -> None:
    """Raise for the first object (in the given order) whose key was seen before."""
    if len({obj.key for obj in objects}) == len(objects):
        return
    seen: dict[tuple[str, str, str], ConfigObject] = {}
    for obj in objects:
        first = seen.setdefault(obj.key, obj)
        if first is obj:
            continue
        kind, namespace, name = obj.key
        what = f"{kind} {namespace}/{name}"
        raise DuplicateObjectError(
            obj.source.file,
            obj.source.line,
            f"duplicate {what}: already defined at {_where(first.source)}",
            first_file=first.source.file,
            first_line=first.source.line,
            what=what,
        )


class _Scoped(Protocol):
    @property
    def namespace(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def source(self) -> SourceRef: ...


def _namespace_wide(
    unselected: Iterable[_Scoped], kind: str, selector_field: str
) -> list[ConfigWarning]:
    """Istio counts one object of `kind` without a selector per namespace (for
    PeerAuthentication, the mesh-wide one in the root namespace); the first by name is used,
    as MeshIndex picks it, and the others are reported."""
    by_namespace: dict[str, list[_Scoped]] = {}
    for obj in unselected:
        by_namespace.setdefault(obj.namespace, []).append(obj)
    out: list[ConfigWarning] = []
    for group in by_namespace.values():
        used = min(group, key=lambda o: o.name)
        out.extend(
            ConfigWarning(
                obj.source,
                f"namespace {obj.namespace} has more than one {kind} without "
                f"{selector_field}; only {used.source} is used",
            )
            for obj in group
            if obj is not used
        )
    return out
