"""xDS for proxyless gRPC clients (node metadata `GENERATOR: grpc`), as Istio's grpcgen serves
them. A gRPC channel to `xds:///echo.default.svc.cluster.local:7070` walks one chain:

    LDS  "echo.default.svc.cluster.local:7070"   api_listener HCM, RDS over ADS
    RDS  "echo.default.svc.cluster.local:7070"   one virtual host "*", prefix "/"
    CDS  "outbound|7070||echo.default.svc.cluster.local"   EDS over ADS (LOGICAL_DNS for DNS)
    EDS  "outbound|7070||echo.default.svc.cluster.local"   endpoints by locality, weighted

gRPC asks for the listener named exactly as the target it dialled, so every name a client may
dial for a service port gets a listener: the FQDN, and for a Kubernetes service `svc.ns.svc`,
`svc.ns` and (in the client's own namespace) `svc`, each with `:port`. Nothing is bound: an
api_listener is configuration for the client's own channel, so there is no address.

The generators return every resource of the proxy's scope (Sidecar egress hosts); the ADS
state machines pick what the client subscribed to (gRPC always names what it wants).

Every resource is cached in its own "grpc" variant slot: an Envoy CLA or cluster with the same
name carries different bytes, and sharing a slot would make the two kinds of proxy evict each
other's bytes on every push (rule 8).
"""

from __future__ import annotations

import functools
from typing import Final

from envoy.config.cluster.v3.cluster_pb2 import Cluster
from envoy.config.core.v3.health_check_pb2 import HealthStatus
from envoy.config.endpoint.v3.endpoint_components_pb2 import (
    Endpoint as EnvoyEndpoint,
)
from envoy.config.endpoint.v3.endpoint_components_pb2 import (
    LbEndpoint,
    LocalityLbEndpoints,
)
from envoy.config.endpoint.v3.endpoint_pb2 import ClusterLoadAssignment
from envoy.config.listener.v3.api_listener_pb2 import ApiListener
from envoy.config.listener.v3.listener_pb2 import Listener
from envoy.config.route.v3.route_components_pb2 import (
    Route,
    RouteAction,
    RouteMatch,
    VirtualHost,
)
from envoy.config.route.v3.route_pb2 import RouteConfiguration
from envoy.extensions.filters.http.router.v3.router_pb2 import Router
from envoy.extensions.filters.network.http_connection_manager.v3.http_connection_manager_pb2 import (  # noqa: E501
    HttpConnectionManager,
    HttpFilter,
    Rds,
)
from google.protobuf.wrappers_pb2 import UInt32Value

from control.generate.common import (
    CLUSTER_TYPE,
    ENDPOINT_TYPE,
    LISTENER_TYPE,
    ROUTE_TYPE,
    EndpointKey,
    OutboundCluster,
    ads_config_source,
    endpoint_keys,
    is_ip,
    outbound_plan,
    pack,
    parse_locality,
    socket_address,
    warn_once,
)
from control.generate.context import GenContext
from control.model.proxy import Proxy
from control.model.types import Protocol, Service
from control.xds.cache import Resource, ResourceSet

ROUTER_FILTER: Final = "envoy.filters.http.router"
# Cache variant of every resource made here; see the module docstring.
VARIANT: Final = "grpc"

# (listener name, cluster): one name a client may dial and the cluster it leads to.
Target = tuple[str, OutboundCluster]


# --- which names lead where ------------------------------------------------------------------


def serves(cluster: OutboundCluster) -> bool:
    """Ports a gRPC client can call through xDS: HTTP-family ones, and UNKNOWN (an unnamed
    Kubernetes port, the usual case for a plain gRPC service). Ports declared TCP, TLS or HTTPS
    are not offered: the owner said they are not plaintext HTTP/2. A wildcard host cannot be
    dialled, so it has no listener either."""
    protocol = cluster.port.protocol
    return (protocol.is_http or protocol is Protocol.UNKNOWN) and not (
        cluster.service.hostname.startswith("*")
    )


def dial_names(service: Service, client_namespace: str) -> list[str]:
    """Hosts a client may put in `xds:///HOST:PORT` for `service`: its FQDN and, for a
    Kubernetes service, the DNS search-path forms (bare `svc` only in its own namespace)."""
    names = [service.hostname]
    if service.registry == "Kubernetes":
        svc = f"{service.name}.{service.namespace}.svc"
        if service.hostname.startswith(svc + "."):
            names += [svc, f"{service.name}.{service.namespace}"]
            if service.namespace == client_namespace:
                names.append(service.name)
    return names


def grpc_clusters(ctx: GenContext, proxy: Proxy) -> tuple[OutboundCluster, ...]:
    plan = outbound_plan(ctx, proxy)
    return ctx.memo(
        ("grpc-clusters", id(plan.visible)),
        lambda: tuple(c for c in plan.clusters if serves(c)),
    )


def targets(ctx: GenContext, proxy: Proxy) -> tuple[Target, ...]:
    """Every listener name of the proxy's scope, with its cluster. Short names depend on the
    client's namespace, so this is shared per (namespace, scope)."""
    plan = outbound_plan(ctx, proxy)
    return ctx.memo(
        ("grpc-targets", proxy.namespace, id(plan.visible)),
        lambda: _claim(grpc_clusters(ctx, proxy), proxy.namespace),
    )


def _claim(clusters: tuple[OutboundCluster, ...], client_namespace: str) -> tuple[Target, ...]:
    """A name two services could answer to goes to the one whose hostname it is, else to the
    first by hostname, with a warning: one listener name can lead to one cluster only. FQDNs
    are unique (one Service per hostname), so every cluster keeps at least its own name."""
    owner: dict[str, OutboundCluster] = {}
    for cluster in clusters:
        owner[f"{cluster.service.hostname}:{cluster.port.port}"] = cluster
    for cluster in sorted(clusters, key=lambda c: (c.service.hostname, c.port.port)):
        port = cluster.port.port
        for host in dial_names(cluster.service, client_namespace)[1:]:
            name = f"{host}:{port}"
            first = owner.setdefault(name, cluster)
            if first is not cluster:
                warn_once(
                    ("grpc-name-conflict", name, cluster.name, first.name),
                    "gRPC listener %s of %s is already taken by %s; left out",
                    name,
                    cluster.name,
                    first.name,
                )
    return tuple(sorted(owner.items()))


# --- generators ------------------------------------------------------------------------------

# The set memo keys use id() of tuples that the push memo holds, which therefore stay alive
# (and their ids unique) for the whole push, as in common.outbound_plan.


def generate_listeners(ctx: GenContext, proxy: Proxy) -> ResourceSet:
    found = targets(ctx, proxy)
    return ctx.memo(
        ("grpc-lds-set", id(found)),
        lambda: ResourceSet([_listener(ctx, name) for name, _ in found]),
    )


def generate_routes(ctx: GenContext, proxy: Proxy) -> ResourceSet:
    found = targets(ctx, proxy)
    return ctx.memo(
        ("grpc-rds-set", id(found)),
        lambda: ResourceSet([_route(ctx, name, cluster.name) for name, cluster in found]),
    )


def generate_clusters(ctx: GenContext, proxy: Proxy) -> ResourceSet:
    found = grpc_clusters(ctx, proxy)
    return ctx.memo(
        ("grpc-cds-set", id(found)),
        lambda: ResourceSet(
            [ctx.memo(("grpc-cds", c.name), functools.partial(_cluster, ctx, c)) for c in found]
        ),
    )


def generate_endpoints(ctx: GenContext, proxy: Proxy) -> ResourceSet:
    found = grpc_clusters(ctx, proxy)
    return ctx.memo(
        ("grpc-eds-set", id(found)),
        lambda: ResourceSet(
            [
                ctx.memo(("grpc-eds", c.name), functools.partial(_assignment, ctx, c))
                for c in found
                if c.eds
            ]
        ),
    )


def _listener(ctx: GenContext, name: str) -> Resource:
    # The listener says nothing but its own name (twice), so the name is the whole key.
    return ctx.memo(
        ("grpc-lds", name),
        lambda: ctx.resource(
            LISTENER_TYPE, name, (), functools.partial(build_listener, name), variant=VARIANT
        ),
    )


def _route(ctx: GenContext, name: str, cluster: str) -> Resource:
    # `svc:port` leads to a different cluster in each namespace: one slot per cluster, so
    # clients of several namespaces do not evict each other's bytes.
    return ctx.memo(
        ("grpc-rds", name, cluster),
        lambda: ctx.resource(
            ROUTE_TYPE,
            name,
            cluster,
            functools.partial(build_route, name, cluster),
            variant=(VARIANT, cluster),
        ),
    )


def _cluster(ctx: GenContext, cluster: OutboundCluster) -> Resource:
    if cluster.eds:
        return ctx.resource(
            CLUSTER_TYPE,
            cluster.name,
            "eds",
            functools.partial(build_eds_cluster, cluster.name),
            variant=VARIANT,
        )
    host, port = _dns_target(cluster)
    return ctx.resource(
        CLUSTER_TYPE,
        cluster.name,
        ("dns", host, port),
        functools.partial(build_dns_cluster, cluster.name, host, port),
        variant=VARIANT,
    )


def _dns_target(cluster: OutboundCluster) -> tuple[str, int]:
    """The one name a LOGICAL_DNS cluster resolves. gRPC accepts exactly one endpoint there (it
    resolves that name and balances over its addresses), so a DNS ServiceEntry with several
    endpoints is reduced to its first, with a warning; with none the host itself is resolved,
    as Istio does."""
    candidates = [
        (address, port)
        for address, port, _, _, _ in sorted(endpoint_keys(cluster.endpoints))
        if not address.startswith("unix://")
    ]
    if not candidates:
        return cluster.service.hostname, cluster.port.port
    if len(candidates) > 1:
        warn_once(
            ("grpc-dns-endpoints", cluster.name, tuple(candidates)),
            "cluster %s: gRPC resolves one DNS name per cluster; using %s:%d, %d other "
            "endpoint(s) left out",
            cluster.name,
            candidates[0][0],
            candidates[0][1],
            len(candidates) - 1,
        )
    return candidates[0]


def _assignment(ctx: GenContext, cluster: OutboundCluster) -> Resource:
    key = endpoint_keys(cluster.endpoints)
    return ctx.resource(
        ENDPOINT_TYPE,
        cluster.name,
        key,
        functools.partial(build_assignment, cluster.name, key),
        variant=VARIANT,
    )


# --- pure builders: the output depends on the arguments only --------------------------------


def build_listener(name: str) -> Listener:
    hcm = HttpConnectionManager(
        rds=Rds(config_source=ads_config_source(), route_config_name=name),
        # gRPC runs the filters in order and requires the router, a terminal filter, last.
        http_filters=[HttpFilter(name=ROUTER_FILTER, typed_config=pack(Router()))],
    )
    return Listener(name=name, api_listener=ApiListener(api_listener=pack(hcm)))


def build_route(name: str, cluster: str) -> RouteConfiguration:
    # The route configuration belongs to one listener name, hence one service: a single
    # catch-all virtual host also matches when the channel overrides its authority.
    return RouteConfiguration(
        name=name,
        virtual_hosts=[
            VirtualHost(
                name=name,
                domains=["*"],
                routes=[
                    Route(
                        name="default",
                        match=RouteMatch(prefix="/"),
                        route=RouteAction(cluster=cluster),
                    )
                ],
            )
        ],
    )


def build_eds_cluster(name: str) -> Cluster:
    cluster = Cluster(name=name, type=Cluster.EDS, lb_policy=Cluster.ROUND_ROBIN)
    cluster.eds_cluster_config.eds_config.CopyFrom(ads_config_source())
    cluster.eds_cluster_config.service_name = name
    return cluster


def build_dns_cluster(name: str, host: str, port: int) -> Cluster:
    # gRPC's LOGICAL_DNS wants exactly one locality holding exactly one endpoint.
    return Cluster(
        name=name,
        type=Cluster.LOGICAL_DNS,
        lb_policy=Cluster.ROUND_ROBIN,
        load_assignment=ClusterLoadAssignment(
            cluster_name=name,
            endpoints=[
                LocalityLbEndpoints(
                    lb_endpoints=[
                        LbEndpoint(endpoint=EnvoyEndpoint(address=socket_address(host, port)))
                    ]
                )
            ],
        ),
    )


def build_assignment(name: str, endpoints: tuple[EndpointKey, ...]) -> ClusterLoadAssignment:
    """Endpoints grouped by locality, in sorted order so equal inputs give equal bytes.

    What gRPC needs beyond Envoy: every group carries a locality and a non-zero weight (gRPC
    drops a group without one, and then has no endpoints at all); an address appears once (gRPC
    rejects the whole assignment for a duplicate); only IP addresses (no hostnames, no Unix
    sockets: gRPC would reject the resource, taking every other endpoint down with it).

    gRPC always picks a locality by weight first and then round-robins inside it, whereas an
    Envoy sidecar here balances over all endpoints. A locality weighs the sum of its
    endpoints' weights (1 each when unset), so equal endpoints get equal shares either way.
    """
    groups: dict[str, list[LbEndpoint]] = {}
    weights: dict[str, int] = {}
    seen: set[tuple[str, int]] = set()
    # Proxyless gRPC is plaintext for now: the mTLS flag (last) is not used here.
    for address, port, weight, locality, _ in sorted(endpoints):
        if not is_ip(address):
            warn_once(
                ("grpc-unusable-endpoint", name, address),
                "cluster %s: endpoint address %s is not an IP, which gRPC requires; left out",
                name,
                address,
            )
            continue
        if (address, port) in seen:
            continue
        seen.add((address, port))
        lb = LbEndpoint(
            endpoint=EnvoyEndpoint(address=socket_address(address, port)),
            health_status=HealthStatus.HEALTHY,
        )
        if weight > 0:
            lb.load_balancing_weight.CopyFrom(UInt32Value(value=weight))
        groups.setdefault(locality, []).append(lb)
        weights[locality] = weights.get(locality, 0) + max(weight, 1)
    return ClusterLoadAssignment(
        cluster_name=name,
        endpoints=[
            LocalityLbEndpoints(
                locality=parse_locality(locality),
                load_balancing_weight=UInt32Value(value=weights[locality]),
                lb_endpoints=groups[locality],
            )
            for locality in sorted(groups)
        ],
    )
