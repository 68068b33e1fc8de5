"""The per-scope plans that the Envoy generators follow: which outbound clusters (and
DestinationRule subset clusters) a set of visible services implies, grouped by port number and
by how a listener tells them apart (Host, SNI, nothing); which inbound ports a proxy serves and
where they forward; where listeners bind; which cluster a VirtualService destination names.

Clusters, endpoints, listeners and routes must agree exactly on these decisions (a listener
must never name a cluster that CDS did not send, every EDS cluster needs a CLA), so they are
made once here and memoized per push instead of being re-derived in each module; a push in
which only endpoints changed patches the previous push's outbound plan (`_patched_plan`).
"""

from __future__ import annotations

import functools
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field

from control.generate.addresses import (
    WILDCARD_BIND,
    Upstream,
    parse_default_endpoint,
)
from control.generate.conflicts import Conflict, Conflicts
from control.generate.context import GenContext
from control.generate.resource_names import (
    inbound_cluster_name,
    listener_name,
    outbound_cluster_name,
    subset_cluster_name,
)
from control.generate.warn import warn_once
from control.model.index import MeshIndex
from control.model.proxy import Proxy
from control.model.traffic import Destination, DestinationRule, TrafficPolicy
from control.model.types import (
    Endpoint,
    IngressListener,
    Protocol,
    Resolution,
    Service,
    ServicePort,
    SidecarScope,
)

# --- outbound plan ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, eq=False)
class OutboundCluster:
    name: str
    service: Service
    port: ServicePort
    eds: bool  # False: STRICT_DNS with its load assignment inline
    endpoints: tuple[Endpoint, ...]
    # SPIFFE IDs of the endpoints reached with mTLS (the SANs an mTLS client accepts).
    identities: tuple[str, ...] = ()
    subset: str = ""  # a DestinationRule subset: only endpoints with its labels
    # The DestinationRule's traffic policy for this port (and subset), merged; None: no rule.
    policy: TrafficPolicy | None = None


@dataclass(frozen=True, slots=True, eq=False)
class OutboundPort:
    """The services that share one port number, split by how a listener can tell them apart:
    HTTP by Host/authority, TLS by SNI, plain TCP not at all."""

    number: int
    http: tuple[OutboundCluster, ...]
    tls: tuple[OutboundCluster, ...]
    tcp: tuple[OutboundCluster, ...]


@dataclass(frozen=True, slots=True, eq=False)
class OutboundPlan:
    # Holding the visible-services tuple keeps its id() unique for the whole push, which is what
    # makes `id(visible)` a sound memo key.
    visible: tuple[Service, ...]
    clusters: tuple[OutboundCluster, ...]  # one per service port
    ports: tuple[OutboundPort, ...]
    # DestinationRule subset clusters (`outbound|PORT|SUBSET|HOST`).
    subsets: tuple[OutboundCluster, ...] = ()
    # The traffic-rule scope (MeshIndex.traffic_scope) the plan was made for.
    scope: str = ""
    # A plan patched from the previous push's (same key): the clusters it rebuilt, those of
    # the services whose endpoints changed. None: built from scratch.
    rebuilt: tuple[OutboundCluster, ...] | None = None
    # hostname -> where its clusters are in `clusters` and in `subsets`, so that patching
    # the plan for a changed service costs that service, not the plan.
    positions: Mapping[str, tuple[tuple[int, ...], tuple[int, ...]]] = field(default_factory=dict)

    @property
    def key(self) -> tuple[int, str]:
        """Memo key of everything derived from this plan within a push."""
        return (id(self.visible), self.scope)

    @property
    def all_clusters(self) -> tuple[OutboundCluster, ...]:
        return self.clusters + self.subsets


def _uses_eds(service: Service, endpoints: tuple[Endpoint, ...]) -> bool:
    # Resolution NONE would be ORIGINAL_DST in Istio, which needs traffic capture; without it
    # EDS is the only way to reach the endpoints. A DNS entry with a wildcard host and no
    # endpoints has nothing to resolve, so it degrades to an (empty) EDS cluster too.
    if service.resolution is not Resolution.DNS:
        return True
    return not endpoints and service.hostname.startswith("*")


# What a plan is made of besides the visible services (its key) and endpoints (patched): the
# DestinationRules of those services, picked by their namespaces.
PLAN_SLICES = frozenset(("services", "destination_rules"))


def outbound_plan(ctx: GenContext, proxy: Proxy) -> OutboundPlan:
    visible = ctx.index.visible_services(proxy)
    scope = ctx.index.traffic_scope(proxy.namespace, proxy.labels)
    # MeshIndex memoizes visible_services per scope, so proxies with the same scope hand us the
    # same tuple object: keying on its identity avoids hashing every service for every proxy.
    key = ("outbound-plan", id(visible), scope)
    plan = ctx.memo(
        key, lambda: _patched_plan(ctx, key, visible) or _build_plan(ctx, visible, scope)
    )
    assert plan.visible is visible
    return plan


def _patched_plan(
    ctx: GenContext, key: Hashable, visible: tuple[Service, ...]
) -> OutboundPlan | None:
    """The previous push's plan with the clusters of the changed services rebuilt, when this
    push is incremental over it and neither services nor DestinationRules changed (the same
    services and rules give the same clusters in the same order, only what they hold of
    endpoints and identities differs; a VirtualService or Gateway change leaves the plan as
    it was). None when there is nothing to patch."""
    old = ctx.previous_memo(key, depends=PLAN_SLICES)
    change = ctx.change
    if (
        change is None
        or change.endpoints is None
        or not isinstance(old, OutboundPlan)
        or old.visible is not visible
    ):
        return None
    clusters, subsets = list(old.clusters), list(old.subsets)
    replaced: dict[int, OutboundCluster] = {}
    for host in change.endpoints:
        in_clusters, in_subsets = old.positions.get(host, ((), ()))
        for group, positions in ((clusters, in_clusters), (subsets, in_subsets)):
            for i in positions:
                c = group[i]
                group[i] = _plan_cluster(ctx, c.service, c.port, old.scope, c.subset)
                replaced[id(c)] = group[i]
    numbers = {c.port.port for c in replaced.values()}

    def members(group: tuple[OutboundCluster, ...]) -> tuple[OutboundCluster, ...]:
        return tuple(replaced.get(id(c), c) for c in group)

    ports = tuple(
        OutboundPort(p.number, members(p.http), members(p.tls), members(p.tcp))
        if p.number in numbers
        else p
        for p in old.ports
    )
    return OutboundPlan(
        visible,
        tuple(clusters),
        ports,
        tuple(subsets),
        old.scope,
        rebuilt=tuple(replaced.values()),
        positions=old.positions,
    )


def _build_plan(ctx: GenContext, visible: tuple[Service, ...], scope: str) -> OutboundPlan:
    clusters: list[OutboundCluster] = []
    subsets: list[OutboundCluster] = []
    by_port: dict[int, list[OutboundCluster]] = {}
    for service in sorted(visible, key=lambda s: s.hostname):
        rule = ctx.index.destination_rule(service.hostname, scope)
        for port in sorted(service.ports, key=lambda p: p.port):
            cluster = _plan_cluster(ctx, service, port, scope)
            clusters.append(cluster)
            by_port.setdefault(port.port, []).append(cluster)
            for subset in rule.subsets if rule is not None else ():
                subsets.append(_plan_cluster(ctx, service, port, scope, subset.name))
    ports = []
    for number in sorted(by_port):
        members = by_port[number]
        ports.append(
            OutboundPort(
                number=number,
                http=tuple(c for c in members if c.port.protocol.is_http),
                tls=tuple(c for c in members if c.port.protocol in (Protocol.TLS, Protocol.HTTPS)),
                tcp=tuple(
                    c
                    for c in members
                    if not c.port.protocol.is_http
                    and c.port.protocol not in (Protocol.TLS, Protocol.HTTPS)
                ),
            )
        )
    positions: dict[str, tuple[list[int], list[int]]] = {}
    for group, which in ((clusters, 0), (subsets, 1)):
        for i, c in enumerate(group):
            positions.setdefault(c.service.hostname, ([], []))[which].append(i)
    return OutboundPlan(
        visible,
        tuple(clusters),
        tuple(ports),
        tuple(subsets),
        scope,
        positions={h: (tuple(a), tuple(b)) for h, (a, b) in positions.items()},
    )


def _plan_cluster(
    ctx: GenContext, service: Service, port: ServicePort, scope: str, subset: str = ""
) -> OutboundCluster:
    # Cluster contents depend on the service and its DestinationRule only, so scopes that
    # see the same rule share the objects.
    rule = ctx.index.destination_rule(service.hostname, scope)
    rule_key = rule.key if rule is not None else None
    return ctx.memo(
        ("outbound-cluster", service.hostname, port.port, rule_key, subset),
        functools.partial(_outbound_cluster, ctx, service, port, rule, subset),
    )


def _outbound_cluster(
    ctx: GenContext,
    service: Service,
    port: ServicePort,
    rule: DestinationRule | None,
    subset: str = "",
) -> OutboundCluster:
    endpoints = ctx.index.endpoints(service, port)
    name = outbound_cluster_name(port.port, service.hostname)
    # Whether the cluster is EDS or DNS is the service's choice, not the subset's.
    eds = _uses_eds(service, endpoints)
    found = rule.subset(subset) if rule is not None and subset else None
    if found is not None:
        endpoints = ctx.index.subset_endpoints(service, port, found.labels)
        name = subset_cluster_name(port.port, subset, service.hostname)
    return OutboundCluster(
        name=name,
        service=service,
        port=port,
        eds=eds,
        endpoints=endpoints,
        identities=ctx.index.identities(service, port),
        subset=subset,
        policy=rule.effective_policy(port.port, subset) if rule is not None else None,
    )


def destination_port(index: MeshIndex, dest: Destination, listener_port: int) -> int:
    """A VirtualService destination's port: stated, else the listener's port when the service
    has it, else the service's only port (Istio lets a single-port service go unstated)."""
    if dest.port is not None:
        return dest.port
    service = index.service_by_host.get(dest.host)
    if service is None or service.port_by_number(listener_port) is not None:
        return listener_port
    if len(service.ports) == 1:
        return service.ports[0].port
    return listener_port


def destination_cluster(index: MeshIndex, dest: Destination, listener_port: int) -> str:
    """The cluster a VirtualService destination names (it may not exist: an unknown subset or
    host, which Envoy answers with 503 as Istio's proxies do)."""
    port = destination_port(index, dest, listener_port)
    if dest.subset:
        return subset_cluster_name(port, dest.subset, dest.host)
    return outbound_cluster_name(port, dest.host)


# --- inbound plan ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class InboundPort:
    number: int
    protocol: Protocol
    bind: str
    upstream: Upstream

    @property
    def cluster(self) -> str:
        return inbound_cluster_name(self.number)

    @property
    def listener(self) -> str:
        return listener_name(self.bind, self.number)


def sidecar_of(ctx: GenContext, proxy: Proxy) -> SidecarScope | None:
    # The Sidecar is chosen by namespace and labels only; proxies of one deployment share it.
    return ctx.memo(
        ("sidecar", proxy.namespace, proxy.labels), lambda: ctx.index.sidecar_for(proxy)
    )


def inbound_ports(ctx: GenContext, proxy: Proxy) -> tuple[InboundPort, ...]:
    """The proxy's inbound ports from its Sidecar's ingress listeners. In interception mode
    NONE nothing else can reach the pod through the sidecar, so no Sidecar means no inbound.
    In REDIRECT, without Sidecar ingress, they are the ports of the services that select the
    workload (as Istio derives them), forwarded to the app at the pod IP. A router has no
    inbound side (its listeners are its Gateways' servers)."""
    if proxy.is_router:
        return ()
    sidecar = sidecar_of(ctx, proxy)
    if sidecar is None or not sidecar.ingress:
        if proxy.interception_mode == "REDIRECT":
            return ctx.memo(
                ("inbound-ports-redirect", proxy.ip, proxy.namespace, proxy.labels),
                lambda: service_inbound_ports(
                    ctx.index.services_selecting(proxy), proxy.ip, ctx.conflicts
                ),
            )
        return ()
    return ctx.memo(
        ("inbound-ports", proxy.ip, sidecar.ingress),
        lambda: _build_inbound(sidecar, sidecar.ingress, proxy.ip, ctx.conflicts),
    )


def _build_inbound(
    sidecar: SidecarScope,
    ingress: tuple[IngressListener, ...],
    proxy_ip: str,
    conflicts: Conflicts,
) -> tuple[InboundPort, ...]:
    out: list[InboundPort] = []
    seen: set[int] = set()
    for listener in ingress:
        number = listener.port.number
        bind = listener.bind or proxy_ip
        upstream = parse_default_endpoint(listener.default_endpoint, proxy_ip, number)
        if upstream is None:
            warn_once(
                ("bad-default-endpoint", sidecar.source, number),
                "%s: ingress port %d: defaultEndpoint %r is not IP:PORT or unix:///path; "
                "port skipped",
                sidecar.source,
                number,
                listener.default_endpoint,
            )
            continue
        if not upstream.pipe and (upstream.host, upstream.port) == (bind, number):
            warn_once(
                ("inbound-loop", sidecar.source, proxy_ip, number),
                "%s: ingress port %d would forward to its own listener %s:%d; port skipped",
                sidecar.source,
                number,
                bind,
                number,
            )
            continue
        if number in seen:
            # Both would be named inbound|PORT||: the cluster name has no room for the bind.
            conflicts.add(Conflict.INBOUND, (sidecar.source, number))
            warn_once(
                ("inbound-dup", sidecar.source, number),
                "%s: ingress port %d declared twice; the first one is used",
                sidecar.source,
                number,
            )
            continue
        seen.add(number)
        out.append(InboundPort(number, listener.port.protocol, bind, upstream))
    return tuple(out)


def service_inbound_ports(
    services: tuple[Service, ...], proxy_ip: str, conflicts: Conflicts | None = None
) -> tuple[InboundPort, ...]:
    """One inbound port per workload port (the target port: what a caller's connection is
    addressed to, so what the capture sees), the first service by hostname deciding the
    protocol when several share it. A named target port cannot be resolved for a proxy (it
    declares no ports), so its service port number stands in."""
    out: dict[int, InboundPort] = {}
    for service in sorted(services, key=lambda s: s.hostname):
        for port in sorted(service.ports, key=lambda p: p.port):
            number = port.target_port if isinstance(port.target_port, int) else port.port
            if number not in out:
                out[number] = InboundPort(
                    number, port.protocol, WILDCARD_BIND, Upstream(proxy_ip, number)
                )
            elif conflicts is not None and out[number].protocol != port.protocol:
                # Istio's inbound listener conflict: two services select this workload
                # port with different protocols; the first by hostname decides.
                conflicts.add(Conflict.INBOUND, (proxy_ip, number, service.hostname))
    return tuple(out[n] for n in sorted(out))


def egress_bind(sidecar: SidecarScope | None, port: int, proxy_ip: str) -> str:
    """Address of the outbound listener for `port`: the bind of a Sidecar egress listener for
    that port, else of the port-less (catch-all) egress listener, else the pod IP."""
    if sidecar is None:
        return proxy_ip
    for egress in sidecar.egress:
        if egress.port is not None and egress.port.number == port and egress.bind:
            return egress.bind
    for egress in sidecar.egress:
        if egress.port is None and egress.bind:
            return egress.bind
    return proxy_ip
