"""CDS and EDS for proxyless gRPC clients (see grpc_targets for the whole chain): which clusters
a client gets (the ports gRPC can call), whether it calls each with mTLS (`cluster_tls`: a
DestinationRule's setting, else auto mTLS within what gRPC can do), the one name a
LOGICAL_DNS cluster resolves, and load assignments in the shape gRPC requires.
"""

from __future__ import annotations

import functools

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
from google.protobuf.wrappers_pb2 import UInt32Value

from control.generate import locality_lb
from control.generate.addresses import is_ip, socket_address
from control.generate.context import GenContext
from control.generate.grpc_targets import (
    VARIANT,
    grpc_clusters,
)
from control.generate.load_assignment import EndpointKey, endpoint_keys, parse_locality
from control.generate.mesh_tls import grpc_upstream_socket
from control.generate.plans import OutboundCluster
from control.generate.resource_names import CLUSTER_TYPE, ENDPOINT_TYPE
from control.generate.warn import warn_once
from control.generate.wire import ads_config_source
from control.model.proxy import Proxy
from control.model.traffic import TlsMode
from control.xds.cache import Resource, ResourceSet


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
    mesh = ctx.index.mesh.locality_lb
    lbs = ctx.memo(
        ("grpc-eds-locality", id(found)),
        lambda: tuple(
            locality_lb.cluster_locality_lb(mesh, c.policy) if c.eds else None for c in found
        ),
    )
    label_keys = locality_lb.label_keys_of(lbs)
    # With locality load balancing the set depends on where the client is, too.
    client = None if label_keys is None else locality_lb.ClientPlace.of(proxy, label_keys)
    return ctx.memo(
        ("grpc-eds-set", id(found), client),
        lambda: ResourceSet(
            [
                _memo_assignment(ctx, c, lb, client)
                for c, lb in zip(found, lbs, strict=True)
                if c.eds
            ]
        ),
    )


def _memo_assignment(
    ctx: GenContext,
    cluster: OutboundCluster,
    lb: locality_lb.LocalityLb | None,
    client: locality_lb.ClientPlace | None,
) -> Resource:
    if lb is None or client is None:
        return ctx.memo(("grpc-eds", cluster.name), functools.partial(_assignment, ctx, cluster))
    return ctx.memo(
        ("grpc-eds", id(cluster), client),
        functools.partial(_client_assignment, ctx, cluster, lb, client),
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


def _client_assignment(
    ctx: GenContext,
    cluster: OutboundCluster,
    lb: locality_lb.LocalityLb,
    client: locality_lb.ClientPlace,
) -> Resource:
    groups = locality_lb.client_groups(lb, client, cluster.endpoints)
    return ctx.resource(
        ENDPOINT_TYPE,
        cluster.name,
        groups,
        functools.partial(build_grouped_assignment, cluster.name, groups),
        variant=(VARIANT, client),
    )


# --- pure builders: the output depends on the arguments only ---------------------------------


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

    gRPC always picks a locality by weight first and then round-robins inside it, whereas an
    Envoy sidecar here balances over all endpoints. A locality weighs the sum of its
    endpoints' weights (1 each when unset), so equal endpoints get equal shares either way.
    """
    groups: dict[str, list[EndpointKey]] = {}
    for key in sorted(endpoints):
        groups.setdefault(key[3], []).append(key)
    return build_grouped_assignment(
        name, tuple((locality, 0, 0, tuple(keys)) for locality, keys in sorted(groups.items()))
    )


def build_grouped_assignment(
    name: str, groups: tuple[locality_lb.Group, ...]
) -> ClusterLoadAssignment:
    """Locality groups (locality_lb.Group) in the shape gRPC requires: every group carries a
    locality and a non-zero weight (gRPC drops a group without one; a group given none weighs
    its endpoints); an address appears once (gRPC rejects the whole assignment for a
    duplicate); only IP addresses (no hostnames, no Unix sockets: gRPC would reject the
    resource, taking every other endpoint down with it); priorities without gaps (gRPC
    rejects a sparse list), so a group left empty gives its priority up."""
    out: list[LocalityLbEndpoints] = []
    seen: set[tuple[str, int]] = set()
    # The mTLS flag (last) is the cluster's business here (cluster_tls), not the endpoint's.
    for locality, priority, weight, endpoints in groups:
        lbs: list[LbEndpoint] = []
        total = 0
        for address, port, endpoint_weight, _, _ in endpoints:
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
            if endpoint_weight > 0:
                lb.load_balancing_weight.CopyFrom(UInt32Value(value=endpoint_weight))
            lbs.append(lb)
            total += max(endpoint_weight, 1)
        if lbs:
            out.append(
                LocalityLbEndpoints(
                    locality=parse_locality(locality),
                    load_balancing_weight=UInt32Value(value=weight or total),
                    lb_endpoints=lbs,
                    priority=priority,
                )
            )
    renumbered = {p: i for i, p in enumerate(sorted({g.priority for g in out}))}
    for group in out:
        group.priority = renumbered[group.priority]
    return ClusterLoadAssignment(cluster_name=name, endpoints=out)
