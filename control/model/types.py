"""The typed mesh model: what the config sources produce and the generators consume.

Everything here is a frozen dataclass so objects can be shared between pushes, used as cache
keys (rule 8: resources are serialized once per version of their inputs) and compared cheaply.
Mappings are stored as sorted tuples of pairs for the same reason.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from control.model.gateway import Gateway
    from control.model.gatewayapi import ObjectStatus, ReferenceGrant
    from control.model.secret import TlsSecret
    from control.model.telemetry import Telemetry
    from control.model.traffic import DestinationRule, VirtualService
    from control.model.workloadgroup import WorkloadGroup

Labels = tuple[tuple[str, str], ...]


def labels_of(mapping: Mapping[str, str] | None) -> Labels:
    """Freeze a label mapping into the sorted tuple form used throughout the model."""
    return tuple(sorted((mapping or {}).items()))


def selector_matches(selector: Labels, labels: Labels) -> bool:
    """Kubernetes equality-based selector semantics; an empty selector matches nothing here,
    because a Service without a selector has no automatically managed endpoints."""
    if not selector:
        return False
    have = dict(labels)
    return all(have.get(k) == v for k, v in selector)


def workload_selector_matches(selector: Labels, labels: Labels) -> bool:
    """Istio `workloadSelector` semantics: an empty selector selects every workload."""
    have = dict(labels)
    return all(have.get(k) == v for k, v in selector)


class Protocol(enum.StrEnum):
    HTTP = "HTTP"
    HTTP2 = "HTTP2"
    GRPC = "GRPC"
    TCP = "TCP"
    TLS = "TLS"
    HTTPS = "HTTPS"
    UNKNOWN = "UNKNOWN"

    @property
    def is_http(self) -> bool:
        return self in (Protocol.HTTP, Protocol.HTTP2, Protocol.GRPC)

    @property
    def is_http2(self) -> bool:
        return self in (Protocol.HTTP2, Protocol.GRPC)


class Resolution(enum.StrEnum):
    NONE = "NONE"
    STATIC = "STATIC"
    DNS = "DNS"


class CaptureMode(enum.StrEnum):
    DEFAULT = "DEFAULT"
    IPTABLES = "IPTABLES"
    NONE = "NONE"


@dataclass(frozen=True, slots=True)
class SourceRef:
    """Where a config object came from, for errors, warnings and /debug/configz."""

    kind: str
    namespace: str
    name: str
    file: str = ""
    line: int = 0

    def __str__(self) -> str:
        where = f" ({self.file}:{self.line})" if self.file else ""
        return f"{self.kind} {self.namespace}/{self.name}{where}"


@dataclass(frozen=True, slots=True)
class ServicePort:
    name: str
    port: int
    protocol: Protocol
    # Port on the endpoint: a number, a named port (resolved per workload), or None = same as port.
    target_port: int | str | None = None


@dataclass(frozen=True, slots=True)
class Service:
    """A v1 Service or a ServiceEntry host, normalized. One Service per hostname."""

    hostname: str  # FQDN, e.g. backend.default.svc.cluster.local or api.example.com
    namespace: str
    name: str  # the Kubernetes name (or the ServiceEntry's name)
    ports: tuple[ServicePort, ...]
    source: SourceRef = field(compare=False)  # moving an object in its file is no change
    # Kubernetes services select workloads by labels; None means no selector at all.
    selector: Labels | None = None
    addresses: tuple[str, ...] = ()  # cluster IP / ServiceEntry addresses (VIPs)
    mesh_external: bool = False
    resolution: Resolution = Resolution.STATIC
    # "Kubernetes" for v1 Service, "External" for ServiceEntry (as Istio's registry names).
    registry: str = "Kubernetes"
    # ServiceEntry static endpoints (already resolved into the model).
    static_endpoints: tuple[WorkloadEndpointSpec, ...] = ()
    # ServiceEntry workloadSelector (selects WorkloadEntries and registered proxies).
    workload_selector: Labels | None = None
    export_to: tuple[str, ...] = ("*",)

    def port_by_number(self, number: int) -> ServicePort | None:
        for p in self.ports:
            if p.port == number:
                return p
        return None


@dataclass(frozen=True, slots=True)
class WorkloadEndpointSpec:
    """An endpoint stated inline in a ServiceEntry (`spec.endpoints[]`)."""

    address: str
    ports: tuple[tuple[str, int], ...] = ()  # port name -> endpoint port
    labels: Labels = ()
    service_account: str = ""
    network: str = ""
    locality: str = ""
    weight: int = 0


@dataclass(frozen=True, slots=True)
class Workload:
    """A workload instance: a WorkloadEntry, or a connected proxy (auto-registered)."""

    name: str
    namespace: str
    address: str
    labels: Labels
    service_account: str
    source: SourceRef = field(compare=False)
    ports: tuple[tuple[str, int], ...] = ()  # WorkloadEntry port name -> port
    # True when the workload runs a sidecar (a connected proxy, or the Istio tlsMode label).
    has_sidecar: bool = False
    locality: str = ""
    weight: int = 0
    # A proxyless gRPC workload whose agent gives it certificates (the `default` certificate
    # provider): its xDS server terminates mTLS where `proxyless_tls` says so.
    proxyless: bool = False

    def port_for(self, port: ServicePort) -> int:
        """The port this workload serves `port` on (Kubernetes targetPort semantics)."""
        named = dict(self.ports)
        if port.name in named:
            return named[port.name]
        if isinstance(port.target_port, int):
            return port.target_port
        if isinstance(port.target_port, str) and port.target_port in named:
            return named[port.target_port]
        return port.port


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One address:port backing one service port, as EDS will state it."""

    address: str
    port: int
    labels: Labels = ()
    service_account: str = ""
    namespace: str = ""
    has_sidecar: bool = False
    locality: str = ""
    weight: int = 0
    # Reached with Istio mutual TLS (auto mTLS): it has a sidecar and its PeerAuthentication
    # does not DISABLE mTLS on this port. EDS labels it `tlsMode: istio`.
    mtls: bool = False
    # Accepts nothing but mTLS on this port: a sidecar under STRICT, or a proxyless server
    # whose listener is mTLS only (`proxyless_tls`). A proxyless gRPC client, which can
    # neither pick TLS per endpoint nor offer Istio's ALPN, uses mTLS towards a cluster
    # exactly when every endpoint is like this.
    tls_only: bool = False


@dataclass(frozen=True, slots=True)
class SidecarPort:
    number: int
    protocol: Protocol
    name: str = ""


@dataclass(frozen=True, slots=True)
class IngressListener:
    port: SidecarPort
    bind: str = ""  # empty: the pod IP
    default_endpoint: str = ""  # "127.0.0.1:8080", "0.0.0.0:8080" (app at pod IP) or unix://
    capture_mode: CaptureMode = CaptureMode.DEFAULT


@dataclass(frozen=True, slots=True)
class EgressListener:
    hosts: tuple[str, ...]  # "ns/host" forms, e.g. "./*", "istio-system/*", "*/foo.example.com"
    port: SidecarPort | None = None
    bind: str = ""
    capture_mode: CaptureMode = CaptureMode.DEFAULT


@dataclass(frozen=True, slots=True)
class SidecarScope:
    """An Istio `Sidecar` object."""

    namespace: str
    name: str
    source: SourceRef = field(compare=False)
    workload_selector: Labels | None = None  # None: applies to the whole namespace
    ingress: tuple[IngressListener, ...] = ()
    egress: tuple[EgressListener, ...] = ()
    # ALLOW_ANY or REGISTRY_ONLY; "" = not set here, the mesh-wide setting applies.
    outbound_traffic_policy: str = ""


# --- security (security.istio.io/v1) ---------------------------------------------------------

# Istio's default root namespace: policies here without a selector apply to the whole mesh.
ROOT_NAMESPACE = "istio-system"
# The label (on a WorkloadEntry or ServiceEntry endpoint) that says "this endpoint has a sidecar".
TLS_MODE_LABEL = "security.istio.io/tlsMode"


class MtlsMode(enum.StrEnum):
    UNSET = "UNSET"  # inherit from the enclosing scope (workload -> namespace -> mesh)
    DISABLE = "DISABLE"
    PERMISSIVE = "PERMISSIVE"
    STRICT = "STRICT"


@dataclass(frozen=True, slots=True)
class PeerAuthentication:
    """An Istio `PeerAuthentication`: which inbound connections must be mutual TLS."""

    namespace: str
    name: str
    source: SourceRef = field(compare=False)
    selector: Labels | None = None  # None: namespace-wide (mesh-wide in the root namespace)
    mode: MtlsMode = MtlsMode.UNSET
    port_modes: tuple[tuple[int, MtlsMode], ...] = ()  # portLevelMtls, sorted by port


class AuthzAction(enum.StrEnum):
    ALLOW = "ALLOW"
    DENY = "DENY"


@dataclass(frozen=True, slots=True)
class AuthzSource:
    """One `from[].source`: every field set must match (AND); values of a field are ORed."""

    principals: tuple[str, ...] = ()
    not_principals: tuple[str, ...] = ()
    namespaces: tuple[str, ...] = ()
    not_namespaces: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class AuthzOperation:
    """One `to[].operation`. Paths and methods exist only in HTTP; ports in both."""

    paths: tuple[str, ...] = ()
    not_paths: tuple[str, ...] = ()
    methods: tuple[str, ...] = ()
    not_methods: tuple[str, ...] = ()
    ports: tuple[int, ...] = ()
    not_ports: tuple[int, ...] = ()

    @property
    def http_only(self) -> bool:
        return bool(self.paths or self.not_paths or self.methods or self.not_methods)


@dataclass(frozen=True, slots=True)
class AuthzRule:
    """One rule: any `from` matches AND any `to` matches (an empty list matches anything).

    `unsupported` marks a rule that had conditions we cannot enforce (`when`, `ipBlocks`, ...;
    reported when loading). It fails closed: such an ALLOW rule never matches, such a DENY
    rule matches without those conditions, i.e. denies more.
    """

    sources: tuple[AuthzSource, ...] = ()
    operations: tuple[AuthzOperation, ...] = ()
    unsupported: bool = False


@dataclass(frozen=True, slots=True)
class AuthorizationPolicy:
    """An Istio `AuthorizationPolicy` (actions ALLOW and DENY)."""

    namespace: str
    name: str
    source: SourceRef = field(compare=False)
    selector: Labels | None = None  # None: every workload of the namespace (mesh in the root)
    action: AuthzAction = AuthzAction.ALLOW
    rules: tuple[AuthzRule, ...] = ()


@dataclass(frozen=True, slots=True)
class PeerPolicy:
    """The PeerAuthentication in effect for one workload, inheritance resolved (workload, then
    namespace, then mesh, then Istio's default PERMISSIVE): no mode here is UNSET."""

    mode: MtlsMode = MtlsMode.PERMISSIVE
    port_modes: tuple[tuple[int, MtlsMode], ...] = ()

    def mode_for(self, port: int) -> MtlsMode:
        return dict(self.port_modes).get(port, self.mode)


def proxyless_tls(mode: MtlsMode, tls_mode_label: bool) -> bool:
    """Whether a proxyless gRPC server's inbound port is mutual TLS (else plaintext). A gRPC
    xDS server picks a filter chain without looking at the bytes (it drops chains that match
    on `transport_protocol: tls`), so it cannot serve TLS and plaintext on one port: PERMISSIVE
    is plaintext, as in Istio, unless the workload carries `security.istio.io/tlsMode: istio`,
    which tells every client to use mTLS (Istio then treats PERMISSIVE as STRICT)."""
    return mode is MtlsMode.STRICT or (mode is MtlsMode.PERMISSIVE and tls_mode_label)


def spiffe_id(trust_domain: str, namespace: str, service_account: str) -> str:
    return f"spiffe://{trust_domain}/ns/{namespace}/sa/{service_account or 'default'}"


@dataclass(frozen=True, slots=True)
class ConfigWarning:
    """A problem found while loading config that did not reject the file (e.g. an unsupported
    field that was ignored). Reported once per (source, message)."""

    source: SourceRef
    message: str

    def __str__(self) -> str:
        return f"{self.source}: {self.message}"


@dataclass(frozen=True, slots=True, kw_only=True)
class MeshObjects:
    """The model objects by kind, as one loaded config object (config/objects.py) and the
    merged snapshot both hold them; workloads are not here, each of the two names its own."""

    services: tuple[Service, ...] = ()
    sidecars: tuple[SidecarScope, ...] = ()
    peer_authentications: tuple[PeerAuthentication, ...] = ()
    authorization_policies: tuple[AuthorizationPolicy, ...] = ()
    virtual_services: tuple[VirtualService, ...] = ()
    destination_rules: tuple[DestinationRule, ...] = ()
    workload_groups: tuple[WorkloadGroup, ...] = ()
    gateways: tuple[Gateway, ...] = ()
    telemetries: tuple[Telemetry, ...] = ()
    # Gateway certificates (`v1 Secret`, control/model/secret.py).
    secrets: tuple[TlsSecret, ...] = ()


@dataclass(frozen=True, slots=True)
class MeshConfig(MeshObjects):
    """One consistent snapshot of all config objects from every source."""

    workload_entries: tuple[Workload, ...] = ()
    # Gateway API ReferenceGrants (see control.model.gatewayapi.reference_granted).
    reference_grants: tuple[ReferenceGrant, ...] = ()
    # Gateway API status as computed from this config (shown in /debug/configz, written back
    # in Kubernetes mode); derived from the fields above, so not part of equality.
    gateway_api_status: tuple[ObjectStatus, ...] = field(default=(), compare=False)
    # The raw objects as loaded (for /debug/configz): (SourceRef, dict) pairs.
    raw: tuple[tuple[SourceRef, Mapping[str, object]], ...] = field(default=(), compare=False)
    warnings: tuple[ConfigWarning, ...] = field(default=(), compare=False)
