"""Kubernetes Gateway API objects (`gateway.networking.k8s.io`) as loaded and validated.

These are inputs of the translator (control/gatewayapi/translate.py), which turns them into
model Gateways and VirtualServices the generators know; nothing else reads them except
ReferenceGrants, which other parts consult through `reference_granted` (a gateway fetching a
certificate from another namespace, for instance). Route matches and filters are already in
the model's terms (HttpMatch, HeaderOps, Redirect, Rewrite); references stay unresolved
(namespace and name), since resolving them needs the whole config.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field

from control.model.traffic import NO_HEADERS, HeaderOps, HttpMatch, Redirect, Rewrite
from control.model.types import Labels, SourceRef

GROUP = "gateway.networking.k8s.io"
# A router pod with this label (value: the Gateway's name) in the Gateway's namespace serves it.
GATEWAY_NAME_LABEL = "gateway.networking.k8s.io/gateway-name"
# GatewayClasses with one of these controllerNames are ours; the first is what we write.
CONTROLLER_NAME = "pilotfish.dev/gateway-controller"
CONTROLLER_NAMES = (CONTROLLER_NAME, "istio.io/gateway-controller")
# The label every Kubernetes namespace carries with its own name (what files can rely on).
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"

# Kinds as `(group, kind)`; the core group is "".
GroupKind = tuple[str, str]
HTTP_ROUTE: GroupKind = (GROUP, "HTTPRoute")
GRPC_ROUTE: GroupKind = (GROUP, "GRPCRoute")
TLS_ROUTE: GroupKind = (GROUP, "TLSRoute")
TCP_ROUTE: GroupKind = (GROUP, "TCPRoute")
GATEWAY: GroupKind = (GROUP, "Gateway")
SERVICE: GroupKind = ("", "Service")
SECRET: GroupKind = ("", "Secret")


@dataclass(frozen=True, slots=True)
class GatewayClass:
    name: str
    source: SourceRef = field(compare=False)
    controller_name: str = ""
    generation: int = 0

    @property
    def ours(self) -> bool:
        return self.controller_name in CONTROLLER_NAMES


class FromNamespaces(enum.StrEnum):
    ALL = "All"
    SAME = "Same"
    SELECTOR = "Selector"


@dataclass(frozen=True, slots=True)
class LabelSelector:
    """A metav1.LabelSelector: matchLabels and matchExpressions (In, NotIn, Exists,
    DoesNotExist), all ANDed."""

    match_labels: Labels = ()
    match_expressions: tuple[tuple[str, str, tuple[str, ...]], ...] = ()

    def matches(self, labels: Labels) -> bool:
        have = dict(labels)
        if any(have.get(k) != v for k, v in self.match_labels):
            return False
        for key, op, values in self.match_expressions:
            present = key in have
            if op == "In" and not (present and have[key] in values):
                return False
            if op == "NotIn" and present and have[key] in values:
                return False
            if op == "Exists" and not present:
                return False
            if op == "DoesNotExist" and present:
                return False
        return True


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """A reference to another object (certificateRef, backendRef, ...); `namespace` is
    already defaulted to the referring object's namespace."""

    group: str
    kind: str
    namespace: str
    name: str


class TlsMode(enum.StrEnum):
    TERMINATE = "Terminate"
    PASSTHROUGH = "Passthrough"


@dataclass(frozen=True, slots=True)
class Listener:
    name: str
    port: int
    protocol: str  # HTTP, HTTPS, TLS, TCP (others are kept to be reported in status)
    hostname: str = ""  # "" = any
    tls_mode: TlsMode | None = None
    certificate_refs: tuple[ObjectRef, ...] = ()
    from_namespaces: FromNamespaces = FromNamespaces.SAME
    namespace_selector: LabelSelector | None = None
    # `allowedRoutes.kinds`; empty: the protocol's default kinds.
    kinds: tuple[GroupKind, ...] = ()


@dataclass(frozen=True, slots=True)
class ApiGateway:
    """A Gateway API `Gateway` (named so to stay apart from the model's `Gateway`)."""

    namespace: str
    name: str
    source: SourceRef = field(compare=False)
    class_name: str = ""
    listeners: tuple[Listener, ...] = ()
    generation: int = 0


@dataclass(frozen=True, slots=True)
class ParentRef:
    group: str
    kind: str
    namespace: str
    name: str
    section_name: str = ""
    port: int | None = None
    # The parentRef as written (for status, which echoes it).
    written: tuple[tuple[str, str | int], ...] = ()


@dataclass(frozen=True, slots=True)
class BackendRef:
    ref: ObjectRef
    port: int | None = None
    weight: int = 1
    headers: HeaderOps = NO_HEADERS


@dataclass(frozen=True, slots=True)
class Mirror:
    backend: BackendRef
    percent: float = 100.0


@dataclass(frozen=True, slots=True)
class RouteRule:
    """One `rules[]` entry of an HTTPRoute or GRPCRoute, matches already in model terms."""

    matches: tuple[HttpMatch, ...] = ()
    backends: tuple[BackendRef, ...] = ()
    headers: HeaderOps = NO_HEADERS
    redirect: Redirect | None = None
    rewrite: Rewrite | None = None
    # URLRewrite `ReplacePrefixMatch`: replaces the part of the path each PathPrefix match
    # matched, so it is resolved per match by the translator.
    replace_prefix: str | None = None
    mirrors: tuple[Mirror, ...] = ()
    timeout: float | None = None


class RouteKind(enum.StrEnum):
    HTTP = "HTTPRoute"
    GRPC = "GRPCRoute"
    TLS = "TLSRoute"
    TCP = "TCPRoute"


@dataclass(frozen=True, slots=True)
class ApiRoute:
    """An HTTPRoute, GRPCRoute, TLSRoute or TCPRoute (TLS and TCP rules carry backends only)."""

    kind: RouteKind
    namespace: str
    name: str
    source: SourceRef = field(compare=False)
    parents: tuple[ParentRef, ...] = ()
    hostnames: tuple[str, ...] = ()
    rules: tuple[RouteRule, ...] = ()
    generation: int = 0
    created: str = ""  # metadata.creationTimestamp (RFC 3339 sorts as text); "" in files

    @property
    def group_kind(self) -> GroupKind:
        return (GROUP, self.kind.value)


@dataclass(frozen=True, slots=True)
class GrantFrom:
    group: str
    kind: str
    namespace: str


@dataclass(frozen=True, slots=True)
class GrantTo:
    group: str
    kind: str
    name: str = ""  # "" = every object of the kind


@dataclass(frozen=True, slots=True)
class ReferenceGrant:
    namespace: str
    name: str
    source: SourceRef = field(compare=False)
    from_: tuple[GrantFrom, ...] = ()
    to: tuple[GrantTo, ...] = ()


def reference_granted(
    grants: Iterable[ReferenceGrant],
    from_ref: tuple[str, str, str],
    to_ref: tuple[str, str, str, str],
) -> bool:
    """Whether an object of (group, kind) in a namespace may refer to (group, kind, namespace,
    name): always within one namespace, else only when a ReferenceGrant in the target's
    namespace lists both sides."""
    from_group, from_kind, from_namespace = from_ref
    to_group, to_kind, to_namespace, to_name = to_ref
    if from_namespace == to_namespace:
        return True
    for grant in grants:
        if grant.namespace != to_namespace:
            continue
        if not any(
            f.group == from_group and f.kind == from_kind and f.namespace == from_namespace
            for f in grant.from_
        ):
            continue
        if any(
            t.group == to_group and t.kind == to_kind and t.name in ("", to_name) for t in grant.to
        ):
            return True
    return False


# --- status ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Condition:
    type: str
    status: bool
    reason: str
    message: str = ""


@dataclass(frozen=True, slots=True)
class ListenerStatus:
    name: str
    supported_kinds: tuple[GroupKind, ...] = ()
    attached_routes: int = 0
    conditions: tuple[Condition, ...] = ()


@dataclass(frozen=True, slots=True)
class ParentStatus:
    parent: ParentRef
    conditions: tuple[Condition, ...] = ()


@dataclass(frozen=True, slots=True)
class ObjectStatus:
    """The status we own for one object: conditions (GatewayClass, Gateway), listeners
    (Gateway) or parents (routes)."""

    kind: str
    namespace: str  # "" for GatewayClass (cluster-scoped)
    name: str
    generation: int = 0
    conditions: tuple[Condition, ...] = ()
    listeners: tuple[ListenerStatus, ...] = ()
    parents: tuple[ParentStatus, ...] = ()

    @property
    def is_route(self) -> bool:
        return self.kind in tuple(RouteKind)


GatewayApiObject = GatewayClass | ApiGateway | ApiRoute | ReferenceGrant
