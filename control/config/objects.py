"""What loading produces: validated objects converted to the model, grouped per file."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from control.model.gateway import Gateway
from control.model.gatewayapi import GatewayApiObject
from control.model.secret import TlsSecret
from control.model.telemetry import Telemetry
from control.model.traffic import DestinationRule, VirtualService
from control.model.types import (
    AuthorizationPolicy,
    ConfigWarning,
    PeerAuthentication,
    Service,
    SidecarScope,
    SourceRef,
    Workload,
)
from control.model.workloadgroup import WorkloadGroup


@dataclass(frozen=True, slots=True)
class ConfigObject:
    """One loaded config object: where it came from, the raw object, what it became."""

    source: SourceRef
    raw: Mapping[str, Any] = field(compare=False)
    services: tuple[Service, ...] = ()
    workloads: tuple[Workload, ...] = ()
    sidecars: tuple[SidecarScope, ...] = ()
    peer_authentications: tuple[PeerAuthentication, ...] = ()
    authorization_policies: tuple[AuthorizationPolicy, ...] = ()
    virtual_services: tuple[VirtualService, ...] = ()
    destination_rules: tuple[DestinationRule, ...] = ()
    workload_groups: tuple[WorkloadGroup, ...] = ()
    gateways: tuple[Gateway, ...] = ()
    # Gateway API objects, translated once all are merged (control/gatewayapi/translate.py).
    gateway_api: tuple[GatewayApiObject, ...] = ()
    telemetries: tuple[Telemetry, ...] = ()
    secrets: tuple[TlsSecret, ...] = ()
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
