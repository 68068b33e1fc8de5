"""MeshIndex: one immutable view of config + registered workloads, with the lookups that the
generators need. A new index is made for every push; lookups are memoized inside it, so the
work of answering "which endpoints back this port" is done once per push, not once per proxy.

When only workloads changed since the previous push (the usual case: pods come and go, the
rules stay), `MeshIndex.next()` derives the new index from the previous one instead of building
it afresh: what the rules imply is shared, and only the services that select a changed workload
lose their memoized endpoints. `changed_since()` names those services, so the generators can
redo just their part (see GenContext).

MeshIndex decides when to derive and what "only workloads changed" means (`rules_of`,
`endpoints_only`); the lookups themselves live in one part per concern, each built from its
own slice of the config: endpoint_index (endpoints and identities: the only part that
depends on workloads, and the only one a derived index patches), traffic_index
(VirtualService, DestinationRule), security_index (PeerAuthentication, AuthorizationPolicy),
visibility_index (Sidecar scope, visible services) and gateway_index (the servers a router
serves, the VirtualServices bound to them). A derived index shares the rule-only parts, memos
and all, with its parent.

When rules did change, `next()` still shares every part whose own slice of the config is
equal to the parent's (a VirtualService edit leaves the endpoints, visibility and security
parts, and their memos, as they were), and `change_since()` says which slices differ and
which services' endpoints may, so a generator can reuse what depends on neither.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TypedDict, Unpack

from control.model.endpoint_index import EndpointIndex, workload_difference
from control.model.gateway import MESH_GATEWAY
from control.model.gateway_index import (
    BoundServer,
    GatewayIndex,
    GatewayListener,
    ServerConflict,
    target_ports,
)
from control.model.meshconfig import DEFAULT_MESH, MeshSettings
from control.model.proxy import Proxy
from control.model.secret import NO_GRANTS, GatewayGrants, ReferenceGrants, SecretIndex
from control.model.security_index import SecurityIndex
from control.model.telemetry import ProxyTelemetry
from control.model.telemetry_index import TelemetryIndex
from control.model.traffic import DestinationRule, VirtualService, bound_to
from control.model.traffic_index import TrafficIndex
from control.model.types import (
    AuthorizationPolicy,
    Endpoint,
    Labels,
    MeshConfig,
    PeerPolicy,
    Resolution,
    Service,
    ServicePort,
    SidecarScope,
    Workload,
)
from control.model.visibility_index import VisibilityIndex
from control.model.vs_carry import Replaced, carry_over

# The slices of the config that rules_of() names, in its order.
RULE_SLICES = (
    "services",
    "sidecars",
    "peer_authentications",
    "authorization_policies",
    "virtual_services",
    "destination_rules",
    "workload_groups",
    "gateways",
    "telemetries",
    "secret_shapes",
    "reference_grants",
)


@dataclass(frozen=True, slots=True)
class IndexChange:
    """What may differ between an index and the one it was derived from (MeshIndex.next):
    the config slices (RULE_SLICES names) that are not equal, and the hostnames of the
    services whose endpoints may differ (None: any service's)."""

    slices: frozenset[str]
    endpoints: frozenset[str] | None

    def touches(self, slices: Iterable[str]) -> bool:
        return not self.slices.isdisjoint(slices)


class IndexSettings(TypedDict, total=False):
    """MeshIndex's keyword arguments, as next() takes them."""

    trust_domain: str
    version: int
    outbound_traffic_policy: str
    mesh: MeshSettings


class MeshIndex:
    """Read-only lookups over one config snapshot and the workloads registered at that time."""

    config: MeshConfig
    mesh: MeshSettings
    trust_domain: str
    outbound_traffic_policy: str
    version: int
    # The parts (see _build_parts).
    services: tuple[Service, ...]
    service_by_host: dict[str, Service]
    _security: SecurityIndex
    _traffic: TrafficIndex
    _visibility: VisibilityIndex
    _gateways: GatewayIndex
    _telemetry: TelemetryIndex
    _endpoints: EndpointIndex
    # Gateway certificates, and who may read them across namespaces (control/secretaccess.py).
    secrets: SecretIndex
    secret_grants: ReferenceGrants

    def __init__(
        self,
        config: MeshConfig,
        registered: Iterable[Workload] = (),
        *,
        trust_domain: str = "cluster.local",
        version: int = 0,
        outbound_traffic_policy: str = "ALLOW_ANY",
        mesh: MeshSettings = DEFAULT_MESH,
        _parent: MeshIndex | None = None,
    ) -> None:
        """`_parent` (next() only): the index to derive this one from, when the mesh settings
        are equal."""
        if _parent is not None and (
            trust_domain != _parent.trust_domain
            or outbound_traffic_policy != _parent.outbound_traffic_policy
            or mesh != _parent.mesh
        ):
            _parent = None
        # VirtualServices equal to the parent's are the parent's objects from here on, so
        # what generators carry by identity holds for them (model/vs_carry.py).
        self._replaced: Replaced | None = None
        if _parent is not None:
            carried, self._replaced = carry_over(
                _parent.config.virtual_services, config.virtual_services
            )
            if carried is not config.virtual_services:
                config = dataclasses.replace(config, virtual_services=carried)
        self.config = config
        # Istio's MeshConfig in effect (--mesh-config; flags applied): telemetry reads it.
        self.mesh = mesh
        self.trust_domain = trust_domain
        # Mesh-wide (Istio's meshConfig.outboundTrafficPolicy): where a REDIRECT proxy sends
        # traffic for destinations the mesh does not know; a Sidecar may override it.
        self.outbound_traffic_policy = outbound_traffic_policy
        self.version = version
        # Identifies this index to the one derived from it (next()); a token rather than a
        # reference, so a chain of derived indexes does not keep every ancestor alive.
        self._token = object()
        self._derived_from: object = None if _parent is None else _parent._token
        differ = (
            frozenset()
            if _parent is None
            else frozenset(
                name
                for name, a, b in zip(
                    RULE_SLICES, rules_of(config), rules_of(_parent.config), strict=True
                )
                if a is not b and a != b
            )
        )
        self._change = IndexChange(differ, frozenset())
        self._build_parts(tuple(config.workload_entries) + tuple(registered), _parent)

    def _build_parts(self, workloads: tuple[Workload, ...], parent: MeshIndex | None) -> None:
        """Build each part from its slice of the config, or share the parent's when the
        slices it is built from are equal (`self._change` says which differ)."""
        config, change = self.config, self._change

        def same(*slices: str) -> bool:
            return not change.touches(slices)

        if parent is not None and same("services"):
            self.services = parent.services
            self.service_by_host = parent.service_by_host
        else:
            self.services = tuple(sorted(config.services, key=lambda s: s.hostname))
            self.service_by_host = {s.hostname: s for s in self.services}
        security = ("peer_authentications", "authorization_policies")
        if parent is not None and same(*security):
            self._security = parent._security
        else:
            self._security = SecurityIndex(config)
        if parent is not None and (
            same("virtual_services", "destination_rules", "services")
            or (same("destination_rules", "services") and self._mesh_unchanged())
        ):
            self._traffic = parent._traffic
        else:
            self._traffic = TrafficIndex(config, self.service_by_host)
        if parent is not None and same("sidecars", "services"):
            self._visibility = parent._visibility
        else:
            self._visibility = VisibilityIndex(
                config.sidecars, self.services, self.outbound_traffic_policy
            )
        if parent is not None and same("gateways", "virtual_services"):
            self._gateways = parent._gateways
        else:
            self._gateways = GatewayIndex(
                config,
                parent._gateways if parent is not None else None,
                self._replaced,
            )
        if parent is not None and same("telemetries"):
            self._telemetry = parent._telemetry
        else:
            self._telemetry = TelemetryIndex(config.telemetries, self.mesh)
        # Always afresh: equal rules hold the same Secrets, but not their contents (a rotation).
        self.secrets = SecretIndex(config.secrets)
        if parent is not None and same("reference_grants"):
            self.secret_grants = parent.secret_grants
        else:
            self.secret_grants = (
                GatewayGrants(config.reference_grants) if config.reference_grants else NO_GRANTS
            )
        if parent is not None and same("services", *security):
            old = parent._endpoints
            removed, added = workload_difference(old.workloads, workloads)
            if not removed and not added:
                self._endpoints = old
                return
            # Patching costs per changed workload; past a fraction of the mesh a fresh
            # index is as cheap and simpler to trust.
            if len(removed) + len(added) <= max(64, len(workloads) // 8):
                self._endpoints, changed = old.derive(workloads, removed, added)
                self._change = IndexChange(change.slices, changed)
                return
        self._endpoints = EndpointIndex(
            self.services,
            self.service_by_host,
            workloads,
            security=self._security,
            trust_domain=self.trust_domain,
        )
        if parent is not None:
            self._change = IndexChange(change.slices, None)

    def _mesh_unchanged(self) -> bool:
        """Whether the VirtualServices replaced since the parent are all gateway-only:
        sidecars' traffic rules (traffic_index) are then the parent's."""
        replaced = self._replaced
        return replaced is not None and all(
            bound_to(vs, MESH_GATEWAY) is None for vs in (*replaced.before, *replaced.now)
        )

    # --- the next push ---------------------------------------------------------------------

    def next(
        self,
        config: MeshConfig,
        registered: Iterable[Workload] = (),
        **settings: Unpack[IndexSettings],
    ) -> MeshIndex:
        """The index of a new snapshot, derived from this one when the mesh settings are
        equal: every part whose config slices are equal is shared (with only workloads
        changed, all but the endpoints, which are patched), else built afresh. Either way it
        answers every lookup exactly as `MeshIndex(config, registered, ...)` would."""
        return MeshIndex(config, registered, **settings, _parent=self)

    def changed_since(self, other: MeshIndex) -> frozenset[str] | None:
        """When this index was derived from `other` (next()) and their rules are equal: the
        hostnames of the services whose endpoints may differ between the two (nothing else
        can). None otherwise: then anything may differ."""
        change = self.change_since(other)
        if change is None or change.slices:
            return None
        return change.endpoints

    def change_since(self, other: MeshIndex) -> IndexChange | None:
        """What may differ from `other` when this index was derived from it (next()); None
        when it was not (anything may differ)."""
        return self._change if self._derived_from is other._token else None

    # --- endpoints (endpoint_index) --------------------------------------------------------

    @property
    def workloads(self) -> tuple[Workload, ...]:
        return self._endpoints.workloads

    def endpoints(self, service: Service, port: ServicePort) -> tuple[Endpoint, ...]:
        return self._endpoints.endpoints(service, port)

    def workloads_selected_by(self, service: Service) -> list[Workload]:
        return self._endpoints.workloads_selected_by(service)

    def identities(self, service: Service, port: ServicePort) -> tuple[str, ...]:
        return self._endpoints.identities(service, port)

    def subset_endpoints(
        self, service: Service, port: ServicePort, labels: Labels
    ) -> tuple[Endpoint, ...]:
        return self._endpoints.subset_endpoints(service, port, labels)

    # --- traffic rules (traffic_index) -----------------------------------------------------

    @property
    def virtual_services(self) -> tuple[VirtualService, ...]:
        return self._traffic.virtual_services

    @property
    def destination_rules(self) -> tuple[DestinationRule, ...]:
        return self._traffic.destination_rules

    def traffic_scope(self, client_namespace: str, labels: Labels = ()) -> str:
        return self._traffic.traffic_scope(client_namespace, labels)

    def virtual_service(self, host: str, scope: str) -> VirtualService | None:
        return self._traffic.virtual_service(host, scope)

    def destination_rule(self, host: str, scope: str) -> DestinationRule | None:
        return self._traffic.destination_rule(host, scope)

    # --- security policies (security_index) ------------------------------------------------

    def peer_policy(self, namespace: str, labels: Labels) -> PeerPolicy:
        return self._security.peer_policy(namespace, labels)

    def authorization_policies(
        self, namespace: str, labels: Labels
    ) -> tuple[AuthorizationPolicy, ...]:
        return self._security.authorization_policies(namespace, labels)

    # --- Sidecar scope and visibility (visibility_index) -----------------------------------

    def sidecar_for(self, proxy: Proxy) -> SidecarScope | None:
        return self._visibility.sidecar_for(proxy)

    def outbound_policy(self, proxy: Proxy) -> str:
        return self._visibility.outbound_policy(proxy)

    def services_selecting(self, proxy: Proxy) -> tuple[Service, ...]:
        return self._visibility.services_selecting(proxy)

    def visible_services(self, proxy: Proxy) -> tuple[Service, ...]:
        return self._visibility.visible_services(proxy)

    # --- gateways (gateway_index) ----------------------------------------------------------

    def gateway_listeners(
        self, proxy: Proxy, default_bind: str
    ) -> tuple[tuple[GatewayListener, ...], tuple[ServerConflict, ...]]:
        ports = target_ports(self.services_selecting(proxy))
        return self._gateways.listeners(proxy.labels, default_bind, ports, proxy.namespace)

    def gateway_virtual_services(self, bound: BoundServer) -> tuple[VirtualService, ...]:
        return self._gateways.virtual_services(bound)

    def gateway_bindings(
        self, bound: BoundServer
    ) -> tuple[tuple[VirtualService, tuple[str, ...]], ...]:
        """The VirtualServices bound to a server, each with the hosts it serves there."""
        return self._gateways.bindings(bound)

    # --- telemetry (telemetry_index) -------------------------------------------------------

    def telemetry(self, proxy: Proxy) -> ProxyTelemetry:
        """Access logs, tracing and metrics settings in effect for the proxy's workload."""
        return self._telemetry.for_workload(proxy.namespace, proxy.labels)


def rules_of(config: MeshConfig) -> tuple[object, ...]:
    """The config objects that everything but endpoints is built from: services, Sidecars,
    security policies and traffic rules. Two snapshots with equal rules differ at most in
    their workloads, i.e. in endpoints (and what follows from them: mTLS identities, DNS
    clusters of ServiceEntries that select workloads)."""
    return (
        config.services,
        config.sidecars,
        config.peer_authentications,
        config.authorization_policies,
        config.virtual_services,
        config.destination_rules,
        # What members register as and the probe their agents get (generate/probes.py).
        config.workload_groups,
        config.gateways,
        # Access logs, tracing and metrics settings (model/telemetry_index.py).
        config.telemetries,
        # Which Secrets exist (listeners may depend on it); their contents change SDS only.
        tuple(s.shape for s in config.secrets),
        # Who may read another namespace's Secrets (generate/secrets.py).
        config.reference_grants,
    )


def endpoints_only(old: MeshIndex, new: MeshIndex) -> bool:
    """Whether going from `old` to `new` changes endpoint assignments (EDS) and nothing else,
    as Istio's incremental EDS push decides. Not so when the index was not derived (rules
    changed), when the identities behind a changed service change (its mTLS clusters' SANs),
    when whether its endpoints all require mTLS changes (proxyless clients' clusters), or when
    a changed service is a DNS ServiceEntry that takes its endpoints from workloads (DNS
    clusters carry their endpoints inline, in CDS). Costs the changed services only."""
    changed = new.changed_since(old)
    if changed is None:
        return False
    for host in changed:
        service = new.service_by_host[host]
        if service.resolution is Resolution.DNS and service.workload_selector is not None:
            return False
        for p in service.ports:
            if old.identities(service, p) != new.identities(service, p):
                return False
            if _plaintext_labels(old.endpoints(service, p)) != _plaintext_labels(
                new.endpoints(service, p)
            ):
                return False
    return True


def _plaintext_labels(endpoints: tuple[Endpoint, ...]) -> frozenset[Labels]:
    """What a proxyless client's choice of mTLS for a cluster depends on (CDS, not EDS: gRPC
    has no per-endpoint transport sockets): whether some endpoint of the cluster accepts
    plaintext. For a subset cluster that is whether such an endpoint has the subset's labels,
    so equal sets of label sets here mean equal choices for every cluster of the port."""
    return frozenset(e.labels for e in endpoints if not e.tls_only)
