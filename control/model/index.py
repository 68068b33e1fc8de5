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
"""

from __future__ import annotations

from collections.abc import Iterable

from control.model.endpoint_index import EndpointIndex, workload_difference
from control.model.gateway_index import (
    BoundServer,
    GatewayIndex,
    GatewayListener,
    ServerConflict,
    target_ports,
)
from control.model.meshconfig import DEFAULT_MESH, MeshSettings
from control.model.proxy import Proxy
from control.model.security_index import SecurityIndex
from control.model.telemetry import ProxyTelemetry
from control.model.telemetry_index import TelemetryIndex
from control.model.traffic import DestinationRule, VirtualService
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


class MeshIndex:
    """Read-only lookups over one config snapshot and the workloads registered at that time."""

    def __init__(
        self,
        config: MeshConfig,
        registered: Iterable[Workload] = (),
        *,
        trust_domain: str = "cluster.local",
        version: int = 0,
        outbound_traffic_policy: str = "ALLOW_ANY",
        mesh: MeshSettings = DEFAULT_MESH,
    ) -> None:
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
        self._derived_from: object = None
        self._changed: frozenset[str] = frozenset()
        self.services: tuple[Service, ...] = tuple(
            sorted(config.services, key=lambda s: s.hostname)
        )
        self.service_by_host: dict[str, Service] = {s.hostname: s for s in self.services}
        self._security = SecurityIndex(config)
        self._traffic = TrafficIndex(config, self.service_by_host)
        self._visibility = VisibilityIndex(config.sidecars, self.services, outbound_traffic_policy)
        self._gateways = GatewayIndex(config)
        self._telemetry = TelemetryIndex(config.telemetries, mesh)
        self._endpoints = EndpointIndex(
            self.services,
            self.service_by_host,
            tuple(config.workload_entries) + tuple(registered),
            security=self._security,
            trust_domain=trust_domain,
        )

    # --- the next push ---------------------------------------------------------------------

    def next(
        self,
        config: MeshConfig,
        registered: Iterable[Workload] = (),
        *,
        trust_domain: str = "cluster.local",
        version: int = 0,
        outbound_traffic_policy: str = "ALLOW_ANY",
        mesh: MeshSettings = DEFAULT_MESH,
    ) -> MeshIndex:
        """The index of a new snapshot: derived from this one when only workloads changed
        (the rules and mesh settings are equal), else built afresh. Either way it answers
        every lookup exactly as `MeshIndex(config, registered, ...)` would."""
        workloads = tuple(config.workload_entries) + tuple(registered)
        if (
            trust_domain == self.trust_domain
            and outbound_traffic_policy == self.outbound_traffic_policy
            and mesh == self.mesh
            and rules_of(config) == rules_of(self.config)
        ):
            removed, added = workload_difference(self.workloads, workloads)
            # Patching costs per changed workload; past a fraction of the mesh a fresh
            # index is as cheap and simpler to trust.
            if len(removed) + len(added) <= max(64, len(workloads) // 8):
                new = object.__new__(MeshIndex)
                # The rule-only parts are shared: both indexes have equal rules, so their
                # memos hold the same answers for both.
                new.__dict__.update(self.__dict__)
                new.config = config
                new.version = version
                new._token = object()
                new._derived_from = self._token
                new._endpoints, new._changed = self._endpoints.derive(workloads, removed, added)
                return new
        return MeshIndex(
            config,
            registered,
            trust_domain=trust_domain,
            version=version,
            outbound_traffic_policy=outbound_traffic_policy,
            mesh=mesh,
        )

    def changed_since(self, other: MeshIndex) -> frozenset[str] | None:
        """When this index was derived from `other` (next()): the hostnames of the services
        whose endpoints may differ between the two (nothing else can). None when it was not:
        then anything may differ."""
        return self._changed if self._derived_from is other._token else None

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

    def traffic_scope(self, client_namespace: str) -> str:
        return self._traffic.traffic_scope(client_namespace)

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
