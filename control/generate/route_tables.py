"""RDS: one RouteConfiguration per outbound HTTP port, named after the port (`"9080"`), as
Istio does. HTTP services sharing a port share its listener and are told apart by the
Host/authority header, so each gets a virtual host `HOST:PORT` whose domains are every name a
client in the proxy's namespace may use for it.

A service without a VirtualService has one route, `default`, to its cluster. A VirtualService
for the host replaces it with its `http` routes for this port, in order (route_translation.py
translates each one); a request none of them matches gets 404, as with Istio.
"""

from __future__ import annotations

from collections.abc import Iterable

from envoy.config.route.v3.route_components_pb2 import VirtualHost
from envoy.config.route.v3.route_pb2 import RouteConfiguration
from google.protobuf.wrappers_pb2 import BoolValue

from control.generate import listeners_redirect
from control.generate.conflicts import Conflict, Conflicts
from control.generate.context import GenContext, variant_resource
from control.generate.filters import direct_body_limit
from control.generate.names import search_names
from control.generate.plans import (
    OutboundPort,
    destination_cluster,
    destination_port,
    outbound_plan,
)
from control.generate.resource_names import ROUTE_TYPE
from control.generate.route_translation import (
    DEFAULT_ROUTE,
    RouteSpec,
    WeightedCluster,
    build_route,
)
from control.generate.warn import warn_once
from control.model.index import MeshIndex
from control.model.proxy import Proxy
from control.model.traffic import (
    ConsistentHash,
    Destination,
    DestinationRule,
    HttpMatch,
    HttpRoute,
    VirtualService,
)
from control.model.types import Labels, Service, workload_selector_matches
from control.xds.cache import Resource, ResourceSet

# (virtual host name, domains, routes): everything a virtual host's bytes are made of.
VhostSpec = tuple[str, tuple[str, ...], tuple[RouteSpec, ...]]


def generate(ctx: GenContext, proxy: Proxy) -> ResourceSet:
    plan = outbound_plan(ctx, proxy)
    # REDIRECT: hosts outside the registry go where the outbound traffic policy says.
    fallback = listeners_redirect.route_fallback(ctx, proxy)
    # Short names depend on the client's namespace, so the scope alone is not enough; which
    # `sourceLabels` matches apply depends on the client's labels, but only through which of
    # the mesh's source selectors they satisfy (usually none exist: the key then stays the
    # same for every client's labels).
    labels = proxy.labels
    return ctx.memo(
        ("rds-set", proxy.namespace, plan.key, fallback, source_signature(ctx, labels)),
        lambda: ResourceSet(
            [
                _resource(ctx, port, proxy.namespace, plan.scope, fallback, labels)
                for port in plan.ports
                if port.http
            ]
        ),
    )


def source_signature(
    ctx: GenContext, labels: Labels, *, gateways: bool = False
) -> tuple[Labels, ...]:
    """The `sourceLabels` selectors of the mesh's VirtualServices that `labels` satisfy, in
    a fixed order: two clients with the same signature get the same routes from them. Of
    the parts sidecars see, or with `gateways` of every VirtualService (those bound to
    gateways only too). The selectors themselves rather than one flag per selector: a key
    carried to the next push (gateway route tables) then still says the same when another
    selector came or went."""
    selectors: tuple[Labels, ...] = ctx.memo(
        ("source-selectors", gateways),
        lambda: _selectors(
            ctx.index.config.virtual_services if gateways else ctx.index.virtual_services
        ),
    )
    return tuple(s for s in selectors if workload_selector_matches(s, labels))


def _selectors(virtual_services: Iterable[VirtualService]) -> tuple[Labels, ...]:
    found = {
        m.source_labels: None
        for vs in virtual_services
        for r in vs.http
        for m in r.matches
        if m.source_labels
    }
    return tuple(found)


def _resource(
    ctx: GenContext,
    port: OutboundPort,
    client_namespace: str,
    scope: str,
    fallback: str = "",
    client_labels: Labels = (),
) -> Resource:
    specs = vhost_specs(ctx.index, port, client_namespace, scope, ctx.conflicts, client_labels)
    key = (port.number, specs, fallback)
    # The same name ("9080") carries different domains for clients in different namespaces;
    # the key holds the finished domains, so namespaces that end up with the same names (the
    # usual case: no service of theirs on the port) share the bytes.
    return variant_resource(ctx, ROUTE_TYPE, str(port.number), key, lambda: build(*key))


def vhost_specs(
    index: MeshIndex,
    port: OutboundPort,
    client_namespace: str,
    scope: str = "",
    conflicts: Conflicts | None = None,
    client_labels: Labels = (),
) -> tuple[VhostSpec, ...]:
    """Virtual hosts in hostname order; a domain two services could claim goes to the first
    (Envoy rejects a RouteConfiguration with a duplicate domain, case-insensitively)."""
    claimed: dict[str, str] = {}
    specs: list[VhostSpec] = []
    for cluster in sorted(port.http, key=lambda c: c.service.hostname):
        service = cluster.service
        domains: list[str] = []
        own: set[str] = set()
        for domain in domains_for(service, port.number, client_namespace):
            folded = domain.lower()
            owner = claimed.setdefault(folded, service.hostname)
            if owner == service.hostname:
                # A VIP can repeat a name already listed; say each domain once.
                if folded not in own:
                    own.add(folded)
                    domains.append(domain)
                continue
            if conflicts is not None:
                conflicts.add(Conflict.DUPLICATE_DOMAIN, (port.number, folded, service.hostname))
            warn_once(
                ("domain-conflict", port.number, domain, service.hostname, owner),
                "port %d: domain %s of %s is already used by %s; left out",
                port.number,
                domain,
                service.hostname,
                owner,
            )
        if domains:
            routes = _routes(index, service, port.number, client_namespace, scope, client_labels)
            specs.append((f"{service.hostname}:{port.number}", tuple(domains), routes))
    return tuple(specs)


def _routes(
    index: MeshIndex,
    service: Service,
    port: int,
    client_namespace: str,
    scope: str,
    client_labels: Labels,
) -> tuple[RouteSpec, ...]:
    vs = index.virtual_service(service.hostname, scope)
    if vs is None or not vs.http:
        target = _destination(index, Destination(service.hostname), port, scope)
        return (
            RouteSpec(
                DEFAULT_ROUTE, (), (target,), _hash(index, service.hostname, port, "", scope)
            ),
        )
    return vs_routes(index, vs, port, client_namespace, scope, client_labels)


def vs_routes(
    index: MeshIndex,
    vs: VirtualService,
    port: int,
    client_namespace: str,
    scope: str,
    client_labels: Labels = (),
) -> tuple[RouteSpec, ...]:
    """The routes of `vs` for one client: its namespace and scope, and its workload labels
    (at a gateway the router's own, as Istio matches `sourceLabels` there)."""
    out: list[RouteSpec] = []
    for route in vs.http:
        matches = tuple(
            m for m in route.matches if _applies(m, port, client_namespace, client_labels)
        )
        if route.matches and not matches:
            continue  # every match is for another port or other clients
        out.append(_route_spec(index, route, matches, port, scope))
    return tuple(out)


def _applies(m: HttpMatch, port: int, client_namespace: str, client_labels: Labels) -> bool:
    """Whether a match is for this listener port and this client (see `vs_routes`)."""
    if m.port is not None and m.port != port:
        return False
    if m.source_namespace and m.source_namespace != client_namespace:
        return False
    return workload_selector_matches(m.source_labels, client_labels)


# What a VirtualService's translation reads besides the VirtualService itself (the ports of
# destination services, the consistent hash of their DestinationRules).
ROUTE_SLICES = frozenset(("services", "destination_rules"))
_RouteInputs = tuple[tuple[str, Service | None, DestinationRule | None], ...]


# One VirtualService's translation and what it was made from (renew_vs_routes).
RoutesEntry = tuple[VirtualService, _RouteInputs, tuple[RouteSpec, ...]]


def renew_vs_routes(
    index: MeshIndex,
    old: RoutesEntry | None,
    vs: VirtualService,
    port: int,
    client_namespace: str,
    scope: str,
    rules_same: bool,
    client_labels: Labels = (),
) -> RoutesEntry:
    """`vs_routes` carried over from the previous push (`old`, made for the same port,
    client namespace and scope, and for labels that satisfy the same `sourceLabels`
    selectors: `source_signature`) while the VirtualService object and what its translation
    reads stay the same; `rules_same`: neither services nor DestinationRules changed since
    (GenContext.unchanged(ROUTE_SLICES)), so only the object needs checking. The entry
    itself is returned while it holds, so what is built from its routes can be kept by
    identity too."""
    if old is not None and old[0] is vs:
        if rules_same or old[1] == route_inputs(index, vs, scope):
            return old
    return (
        vs,
        route_inputs(index, vs, scope),
        vs_routes(index, vs, port, client_namespace, scope, client_labels),
    )


def route_inputs(index: MeshIndex, vs: VirtualService, scope: str) -> _RouteInputs:
    """Every input of `vs_routes` beyond the VirtualService, port and client: for each
    destination host, its service and the DestinationRule clients of `scope` see for it."""
    hosts = {d.host for r in vs.http for d in r.destinations}
    hosts.update(r.mirror.host for r in vs.http if r.mirror is not None)
    return tuple(
        (h, index.service_by_host.get(h), index.destination_rule(h, scope)) for h in sorted(hosts)
    )


def _route_spec(
    index: MeshIndex,
    route: HttpRoute,
    matches: tuple[object, ...],
    port: int,
    scope: str,
) -> RouteSpec:
    targets = tuple(_destination(index, d, port, scope) for d in route.destinations)
    mirror = _destination(index, route.mirror, port, scope).cluster if route.mirror else ""
    hashed = None
    if route.destinations:
        first = route.destinations[0]
        hashed = _hash(index, first.host, _port_of(index, first, port), first.subset, scope)
    return RouteSpec(route, matches, targets, hashed, mirror)  # type: ignore[arg-type]


def _port_of(index: MeshIndex, dest: Destination, listener_port: int) -> int:
    return destination_port(index, dest, listener_port)


def _destination(
    index: MeshIndex, dest: Destination, listener_port: int, scope: str
) -> WeightedCluster:
    return WeightedCluster(
        destination_cluster(index, dest, listener_port), dest.weight, dest.headers
    )


def _hash(index: MeshIndex, host: str, port: int, subset: str, scope: str) -> ConsistentHash | None:
    rule = index.destination_rule(host, scope)
    if rule is None:
        return None
    lb = rule.effective_policy(port, subset).load_balancer
    return lb.consistent_hash if lb is not None else None


def domains_for(service: Service, port: int, client_namespace: str) -> list[str]:
    """Every Host a client may send for `service`: its FQDN; for a Kubernetes service also the
    search-path forms `name.ns.svc`, `name.ns` and (same namespace only) `name`; the VIPs; each
    bare and with `:port`."""
    names = search_names(service, client_namespace)
    # A ServiceEntry address may be a CIDR, which is no Host value.
    names += [a for a in service.addresses if "/" not in a]
    out: list[str] = []
    for name in names:
        host = f"[{name}]" if ":" in name else name
        out += [host, f"{host}:{port}"]
    return out


def build(port: int, vhosts: tuple[VhostSpec, ...], fallback: str = "") -> RouteConfiguration:
    config = RouteConfiguration(
        name=str(port),
        virtual_hosts=[
            VirtualHost(
                name=name,
                domains=list(domains),
                routes=[r for spec in routes for r in build_route(spec)],
            )
            for name, domains, routes in vhosts
        ],
        # Clusters and routes travel on one ADS stream in separate responses; validating
        # references would reject a route that merely arrived before its cluster.
        validate_clusters=BoolValue(value=False),
        max_direct_response_body_size_bytes=direct_body_limit(),
    )
    config.virtual_hosts.extend(listeners_redirect.fallback_vhosts(fallback))
    return config
