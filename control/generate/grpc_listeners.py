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

A gRPC xDS server (gRFC A36: `grpc.server(..., xds=True)`) asks for the listener named by
the bootstrap's `server_listener_resource_name_template` with the address it listens on:
`xds.istio.io/grpc/lds/inbound/10.0.0.5:8080` (Istio's template). It gets one for every
inbound port of its workload (the target ports of the services selecting it) at each
address it may listen on (its IPs, `0.0.0.0`, `[::]`): one filter chain holding an
HttpConnectionManager with a non-forwarding route (the server's own handlers answer), mTLS
or plaintext as PeerAuthentication says (see `proxyless_tls`), and the workload's
AuthorizationPolicies as RBAC HTTP filters before the router (gRFC A41), built by the same
code as the sidecars' (`control/generate/authz_rbac.py`): DENY, then ALLOW. Every matcher that code
emits is one gRPC evaluates: principals (the peer certificate's URI SAN, so nothing matches a
plaintext caller), `url_path` (the gRPC method, `/pkg.Service/Method`), `destination_port`,
headers (`:method` is always POST for gRPC), and and/or/not combinations.

mTLS (gRFC A29) comes from the bootstrap's `default` certificate provider, which the agent
points at the workload certificate files it writes; it is used only for proxies whose node
metadata says their bootstrap has it (gRPC rejects a whole response naming a provider it
lacks). A cluster is mTLS when every endpoint behind it accepts nothing else (auto mTLS
within what gRPC can do: no per-endpoint `transport_socket_matches`, no Istio ALPN), or when
a DestinationRule says ISTIO_MUTUAL; SIMPLE/MUTUAL origination with files cannot be said to
gRPC and stays plaintext with a warning.

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
from envoy.config.listener.v3.listener_components_pb2 import Filter, FilterChain
from envoy.config.listener.v3.listener_pb2 import Listener
from envoy.config.rbac.v3.rbac_pb2 import RBAC
from envoy.config.route.v3.route_components_pb2 import (
    NonForwardingAction,
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

from control.generate.addresses import is_ip, socket_address
from control.generate.authz_rbac import http_filters as rbac_http_filters
from control.generate.context import GenContext
from control.generate.load_assignment import EndpointKey, endpoint_keys, parse_locality
from control.generate.mesh_tls import grpc_downstream_socket, grpc_upstream_socket
from control.generate.plans import OutboundCluster, outbound_plan, service_inbound_ports
from control.generate.resource_names import CLUSTER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE, ROUTE_TYPE
from control.generate.warn import warn_once
from control.generate.wire import ads_config_source, pack
from control.model.proxy import Proxy
from control.model.traffic import TlsMode
from control.model.types import (
    TLS_MODE_LABEL,
    AuthorizationPolicy,
    MtlsMode,
    Protocol,
    Service,
    proxyless_tls,
)
from control.xds.cache import Resource, ResourceSet

ROUTER_FILTER: Final = "envoy.filters.http.router"
HCM_FILTER: Final = "envoy.filters.network.http_connection_manager"
# Istio's listener name template for gRPC xDS servers (its agent writes it into the
# bootstrap as `server_listener_resource_name_template`; `%s` is the listening IP:port).
SERVER_LISTENER_PREFIX: Final = "xds.istio.io/grpc/lds/inbound/"
# Where a server may listen besides its pod IPs: every address (IPv4, IPv6).
WILDCARD_HOSTS: Final = ("0.0.0.0", "::")
# Suffixes of the RBAC filter names (DENY, ALLOW), see build_server_listener.
_RBAC_ACTIONS: Final = {RBAC.DENY: "deny", RBAC.ALLOW: "allow"}
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
# (and their ids unique) for the whole push, as in plans.outbound_plan.


def generate_listeners(ctx: GenContext, proxy: Proxy) -> ResourceSet:
    found = targets(ctx, proxy)
    outbound = ctx.memo(
        ("grpc-lds-outbound", id(found)),
        lambda: tuple(_listener(ctx, name) for name, _ in found),
    )
    inbound = server_listeners(ctx, proxy)
    if not inbound:
        return ctx.memo(("grpc-lds-set", id(found)), lambda: ResourceSet(list(outbound)))
    return ResourceSet([*outbound, *inbound])


def generate_routes(ctx: GenContext, proxy: Proxy) -> ResourceSet:
    found = targets(ctx, proxy)
    return ctx.memo(
        ("grpc-rds-set", id(found)),
        lambda: ResourceSet([_route(ctx, name, cluster.name) for name, cluster in found]),
    )


def generate_clusters(ctx: GenContext, proxy: Proxy) -> ResourceSet:
    found = grpc_clusters(ctx, proxy)
    capable = proxy.cert_provider
    # Keyed by the cluster object, not its name: scopes under different DestinationRules get
    # different objects (and TLS settings) under one name.
    return ctx.memo(
        ("grpc-cds-set", id(found), capable),
        lambda: ResourceSet(
            [
                ctx.memo(("grpc-cds", id(c), capable), functools.partial(_cluster, ctx, c, capable))
                for c in found
            ]
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


# --- xDS servers -------------------------------------------------------------------------------


def server_listener_name(host: str, port: int) -> str:
    """The listener a gRPC xDS server listening on host:port asks for (IPv6 in brackets, as
    gRPC joins host and port)."""
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return SERVER_LISTENER_PREFIX + address


def server_ports(ctx: GenContext, proxy: Proxy) -> tuple[int, ...]:
    """The ports the proxy's workload serves: target ports of the services selecting it."""
    return ctx.memo(
        ("grpc-server-ports", proxy.namespace, proxy.labels),
        lambda: tuple(
            p.number for p in service_inbound_ports(ctx.index.services_selecting(proxy), proxy.ip)
        ),
    )


def server_listeners(ctx: GenContext, proxy: Proxy) -> tuple[Resource, ...]:
    """A listener per inbound port and address the server may listen on. Without the
    certificate provider a STRICT port cannot be served and gets no listener: the gRPC server
    then never starts serving it (fail closed); other ports are plaintext."""
    ports = server_ports(ctx, proxy)
    if not ports:
        return ()
    peer = ctx.index.peer_policy(proxy.namespace, proxy.labels)
    policies = ctx.index.authorization_policies(proxy.namespace, proxy.labels)
    labelled = dict(proxy.labels).get(TLS_MODE_LABEL) == "istio"
    hosts = (*proxy.ips, *WILDCARD_HOSTS)
    out: list[Resource] = []
    for port in ports:
        mode = peer.mode_for(port)
        tls = proxyless_tls(mode, labelled)
        if tls and not proxy.cert_provider:
            if mode is MtlsMode.STRICT:
                warn_once(
                    ("grpc-strict-without-provider", proxy.id, port),
                    "proxy %s: inbound port %d is STRICT mTLS but the gRPC bootstrap has no "
                    "`default` certificate provider (node metadata CERTIFICATE_PROVIDER); the "
                    "port is not served",
                    proxy.id,
                    port,
                )
                continue
            tls = False
        for host in hosts:
            name = server_listener_name(host, port)
            key = (host, port, tls, policies)
            out.append(
                ctx.memo(
                    ("grpc-lds-in", name, tls, policies),
                    functools.partial(
                        ctx.resource,
                        LISTENER_TYPE,
                        name,
                        key,
                        functools.partial(build_server_listener, name, *key),
                        variant=VARIANT,
                    ),
                )
            )
    return tuple(out)


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


def _cluster(ctx: GenContext, cluster: OutboundCluster, capable: bool) -> Resource:
    tls = cluster_tls(cluster, capable)
    # Clients with and without the certificate provider get different bytes under one name:
    # a slot each (rule 8).
    variant = (VARIANT, capable)
    if cluster.eds:
        return ctx.resource(
            CLUSTER_TYPE,
            cluster.name,
            ("eds", tls),
            functools.partial(build_eds_cluster, cluster.name, tls),
            variant=variant,
        )
    host, port = _dns_target(cluster)
    return ctx.resource(
        CLUSTER_TYPE,
        cluster.name,
        ("dns", host, port, tls),
        functools.partial(build_dns_cluster, cluster.name, host, port, tls),
        variant=variant,
    )


def cluster_tls(cluster: OutboundCluster, capable: bool) -> tuple[str, ...] | None:
    """The SANs a proxyless client accepts when it calls `cluster` with mTLS, or None for
    plaintext. `capable`: the client's bootstrap has the certificate provider.

    A DestinationRule `tls` setting wins, as for sidecars: DISABLE is plaintext, ISTIO_MUTUAL
    mTLS. SIMPLE and MUTUAL take certificates from files, which gRPC cannot be told (it only
    knows its certificate providers), so they stay plaintext with a warning. Without a rule,
    auto mTLS: a mesh-internal cluster whose endpoints all accept nothing but mTLS. gRPC uses
    one transport socket per cluster, so a cluster that also has endpoints accepting
    plaintext (a plain workload, a sidecar in PERMISSIVE, whose mTLS chain wants Istio's
    ALPN) is plaintext, which every one of those accepts."""
    tls = cluster.policy.tls if cluster.policy is not None else None
    if tls is not None:
        if tls.mode is TlsMode.DISABLE:
            return None
        if tls.mode is TlsMode.ISTIO_MUTUAL:
            if capable:
                return cluster.identities
            warn_once(
                ("grpc-istio-mutual-without-provider", cluster.name),
                "cluster %s: ISTIO_MUTUAL for proxyless clients needs the `default` "
                "certificate provider in their bootstrap (pilotfish-agent --proxy-only writes "
                "it); plaintext for clients without it",
                cluster.name,
            )
            return None
        warn_once(
            ("grpc-tls-origination", cluster.name),
            "cluster %s: DestinationRule tls mode %s cannot be given to proxyless gRPC "
            "clients (gRPC takes certificates from its certificate providers only, not from "
            "files); plaintext for them",
            cluster.name,
            tls.mode.value,
        )
        return None
    if not capable or cluster.service.mesh_external:
        return None
    if not cluster.eds and not cluster.endpoints:
        return None  # the host itself is resolved: nothing in the mesh stands behind it
    plaintext = sum(1 for e in cluster.endpoints if not e.tls_only)
    if plaintext:
        if plaintext < len(cluster.endpoints):
            warn_once(
                ("grpc-mixed-mtls", cluster.name),
                "cluster %s: %d of %d endpoints accept plaintext and the rest only mTLS; "
                "proxyless clients use one transport for a cluster and call all of them in "
                "plaintext",
                cluster.name,
                plaintext,
                len(cluster.endpoints),
            )
        return None
    return cluster.identities


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


def build_server_listener(
    name: str,
    host: str,
    port: int,
    mtls: bool,
    policies: tuple[AuthorizationPolicy, ...] = (),
) -> Listener:
    """What gRPC's xDS server accepts (A36, A29): the address it listens on (it refuses a
    listener for another), exactly one filter per chain (the HttpConnectionManager, with the
    router last), a route whose action is non-forwarding (any other fails the calls), no
    `use_original_dst`, and for mTLS a DownstreamTlsContext naming certificate providers.
    Nothing goes into `filter_chain_match`: gRPC never matches a chain on SNI, ALPN or
    transport protocol."""
    hcm = HttpConnectionManager(
        route_config=RouteConfiguration(
            name="inbound",
            virtual_hosts=[
                VirtualHost(
                    name="inbound",
                    domains=["*"],
                    routes=[
                        Route(
                            name="default",
                            match=RouteMatch(prefix="/"),
                            non_forwarding_action=NonForwardingAction(),
                        )
                    ],
                )
            ],
        ),
        http_filters=[
            # gRPC runs them in order; the router, terminal, must come last. Unlike Envoy,
            # gRPC refuses a listener whose HTTP filters share a name: one per action.
            *(
                HttpFilter(name=f"{n}.{_RBAC_ACTIONS[cfg.rules.action]}", typed_config=pack(cfg))
                for n, cfg in rbac_http_filters(policies)
            ),
            HttpFilter(name=ROUTER_FILTER, typed_config=pack(Router())),
        ],
    )
    chain = FilterChain(
        name="inbound-mtls" if mtls else "inbound-plaintext",
        filters=[Filter(name=HCM_FILTER, typed_config=pack(hcm))],
    )
    if mtls:
        chain.transport_socket.CopyFrom(grpc_downstream_socket())
    return Listener(name=name, address=socket_address(host, port), filter_chains=[chain])


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


def build_eds_cluster(name: str, tls: tuple[str, ...] | None = None) -> Cluster:
    cluster = Cluster(name=name, type=Cluster.EDS, lb_policy=Cluster.ROUND_ROBIN)
    cluster.eds_cluster_config.eds_config.CopyFrom(ads_config_source())
    cluster.eds_cluster_config.service_name = name
    if tls is not None:
        cluster.transport_socket.CopyFrom(grpc_upstream_socket(tls))
    return cluster


def build_dns_cluster(
    name: str, host: str, port: int, tls: tuple[str, ...] | None = None
) -> Cluster:
    # gRPC's LOGICAL_DNS wants exactly one locality holding exactly one endpoint.
    cluster = Cluster(
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
    if tls is not None:
        cluster.transport_socket.CopyFrom(grpc_upstream_socket(tls))
    return cluster


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
    # The mTLS flag (last) is the cluster's business here (cluster_tls), not the endpoint's.
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
