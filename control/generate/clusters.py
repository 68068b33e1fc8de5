"""CDS: the clusters of an Envoy sidecar, named as Istio names them.

- `outbound|PORT||HOST` per port of every visible service: EDS over ADS, or a strict DNS
  cluster (Envoy's `envoy.cluster.dns` extension) with the endpoints inline for ServiceEntries
  with `resolution: DNS`; for a proxy with certificates (SDS), mesh-internal clusters carry
  Istio's auto mTLS `transport_socket_matches` (ISTIO_MUTUAL to endpoints with a sidecar);
- `outbound|PORT|SUBSET|HOST` per DestinationRule subset, with the subset's endpoints only;
  a DestinationRule's traffic policy (load balancer, connection pool, outlier detection, TLS)
  applies as Istio merges it (top level, port level, subset, subset port level); its TLS
  setting replaces auto mTLS;
- `inbound|PORT||` per Sidecar ingress port: STATIC, pointing at the app (defaultEndpoint);
- `BlackHoleCluster` and `PassthroughCluster`, which Istio users expect to find.

Every resource goes through the serialized-resource cache with a key made of exactly the
arguments of its pure builder below, so the key covers every input by construction.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Final

from envoy.config.cluster.v3.cluster_pb2 import Cluster
from envoy.config.endpoint.v3.endpoint_components_pb2 import (
    Endpoint,
    LbEndpoint,
    LocalityLbEndpoints,
)
from envoy.config.endpoint.v3.endpoint_pb2 import ClusterLoadAssignment
from envoy.extensions.clusters.common.dns.v3.dns_pb2 import DnsLookupFamily
from envoy.extensions.clusters.dns.v3.dns_cluster_pb2 import DnsCluster
from envoy.extensions.upstreams.http.v3.http_protocol_options_pb2 import HttpProtocolOptions
from google.protobuf.duration_pb2 import Duration

from control.generate.addresses import Upstream
from control.generate.context import GenContext, variant_resource
from control.generate.destination_policy import (
    HTTP_OPTIONS_KEY,
    ClusterPolicy,
    apply_policy,
    origination_socket,
)
from control.generate.load_assignment import EndpointKey, endpoint_keys, locality_endpoints
from control.generate.locality_lb import cluster_locality_lb
from control.generate.mesh_tls import auto_mtls_matches, sni, upstream_socket
from control.generate.plans import (
    InboundPort,
    OutboundCluster,
    OutboundPlan,
    inbound_ports,
    outbound_plan,
)
from control.generate.resource_names import (
    BLACKHOLE_CLUSTER,
    CLUSTER_TYPE,
    PASSTHROUGH_CLUSTER,
    inbound_cluster_name,
)
from control.generate.tracing import collector_clusters
from control.generate.warn import warn_once
from control.generate.wire import ads_config_source, pack
from control.model.proxy import Proxy
from control.model.traffic import ClientTls, TlsMode
from control.xds.cache import Resource, ResourceSet

DNS_CLUSTER_EXTENSION = "envoy.cluster.dns"
CONNECT_TIMEOUT_SECONDS: Final = 10
_HTTP_OPTIONS_KEY = HTTP_OPTIONS_KEY


@dataclass(frozen=True, slots=True)
class UpstreamTls:
    """How a cluster speaks TLS: auto mTLS (per endpoint, `transport_socket_matches`),
    ISTIO_MUTUAL to every endpoint, or SIMPLE/MUTUAL origination (`client`)."""

    kind: str  # "auto" | "istio" | "origination"
    sni: str
    sans: tuple[str, ...] = ()
    client: ClientTls | None = None
    credential: str = ""  # origination at a gateway: the rule's credentialName


@dataclass(frozen=True, slots=True)
class _Caller:
    """What of the proxy its outbound clusters depend on."""

    mtls: bool  # it holds certificates (SDS): auto mTLS applies
    router: bool  # a gateway: a rule's `credentialName` applies (sidecars read files)


# Istio's default DNS refresh for ServiceEntry hosts; Envoy's own 5s default is needlessly busy.
_DNS_REFRESH_SECONDS = 60


def generate(ctx: GenContext, proxy: Proxy) -> ResourceSet:
    plan = outbound_plan(ctx, proxy)
    # Auto mTLS needs the proxy to hold certificates (SDS); without them it stays plaintext.
    caller = _Caller(proxy.sds, proxy.is_router)
    key = ("cds-outbound", plan.key, caller)
    outbound = ctx.memo(
        key,
        lambda: (
            _patched_outbound(ctx, plan, caller, key) or _outbound(ctx, plan.all_clusters, caller)
        ),
    )
    inbound = tuple(_inbound(ctx, port) for port in inbound_ports(ctx, proxy))
    # The tracers' collectors (generate/tracing.py), unless a service cluster is one already.
    names = ctx.memo(("cds-names", plan.key), lambda: frozenset(c.name for c in plan.all_clusters))
    inbound += collector_clusters(ctx, proxy, names)
    # Proxies of one scope with equal inbound clusters share the set (and its digest).
    set_key = ("cds-set", plan.key, caller, inbound)

    def resource_set() -> ResourceSet:
        # Made of the same resources as the previous push's: that very set (and its digest).
        old = ctx.previous_memo(set_key, depends=frozenset())
        if isinstance(old, ResourceSet) and ctx.previous_memo(key, frozenset()) is outbound:
            return old
        return ResourceSet(outbound + inbound)

    return ctx.memo(set_key, resource_set)


def _patched_outbound(
    ctx: GenContext, plan: OutboundPlan, caller: _Caller, key: Hashable
) -> tuple[Resource, ...] | None:
    """The previous push's outbound clusters with those of the rebuilt plan clusters made
    again, when the plan was patched from the previous push's (same key, so same clusters
    in the same order): the tuple itself when none was rebuilt."""
    old = ctx.previous_memo(key, depends=frozenset())
    if plan.rebuilt is None or not isinstance(old, tuple):
        return None
    # The reused clusters are served again without asking the cache for them. With none
    # rebuilt, they are all of them: the list of their slots is kept for the next push.
    rebuilt = {id(c) for c in plan.rebuilt}
    kept_key = ("cds-kept", key)
    found = ctx.previous_memo(kept_key, depends=frozenset()) if not rebuilt else None
    reused: list[tuple[str, Hashable]]
    if isinstance(found, list):
        reused = found
    else:
        reused = [(r.name, None) for r in old[:_FIXED]]
        reused += [(c.name, _variant(c, caller)) for c in plan.all_clusters if id(c) not in rebuilt]
    if not rebuilt:
        ctx.memo(kept_key, lambda: reused)
    ctx.cache.keep_slots(CLUSTER_TYPE, reused)
    if not rebuilt:
        return old  # type: ignore[no-any-return]
    made = tuple(
        ctx.memo(("cds", id(c), caller), functools.partial(_resource, ctx, c, caller))
        if id(c) in rebuilt
        else old[_FIXED + i]
        for i, c in enumerate(plan.all_clusters)
    )
    return old[:_FIXED] + made  # type: ignore[no-any-return]


# How many clusters every outbound tuple starts with (BlackHoleCluster, PassthroughCluster).
_FIXED = 2


def _outbound(
    ctx: GenContext, clusters: tuple[OutboundCluster, ...], caller: _Caller
) -> tuple[Resource, ...]:
    fixed = (
        ctx.memo(
            ("cds", BLACKHOLE_CLUSTER),
            lambda: ctx.resource(CLUSTER_TYPE, BLACKHOLE_CLUSTER, (), _blackhole),
        ),
        ctx.memo(
            ("cds", PASSTHROUGH_CLUSTER),
            lambda: ctx.resource(CLUSTER_TYPE, PASSTHROUGH_CLUSTER, (), _passthrough),
        ),
    )
    # An outbound cluster's content depends on its service alone, never on who looks at it, so
    # it is looked up once per push however many scopes include it.
    # The memo key holds the cluster object (not just its name): scopes that see different
    # DestinationRules get different cluster objects under one name.
    return fixed + tuple(
        ctx.memo(("cds", id(c), caller), functools.partial(_resource, ctx, c, caller))
        for c in clusters
    )


def auto_mtls(cluster: OutboundCluster, mtls: bool, router: bool = False) -> UpstreamTls | None:
    """How a cluster speaks TLS, or None for plaintext.

    A DestinationRule `tls` setting wins, as in Istio: DISABLE is plaintext, ISTIO_MUTUAL is
    mesh mTLS to every endpoint, SIMPLE/MUTUAL originate TLS with the rule's files. Without
    one, auto mTLS: every mesh-internal cluster of a proxy that has certificates gets
    transport socket matches, and EDS decides per endpoint (`tlsMode: istio`) which one
    applies, so an endpoint gaining a sidecar is an EDS change only. Services outside the
    mesh are plaintext (their endpoints have no sidecar to talk mTLS to)."""
    server_name = sni(cluster.port.port, cluster.service.hostname)
    tls = cluster.policy.tls if cluster.policy is not None else None
    if tls is not None:
        if tls.mode is TlsMode.DISABLE:
            return None
        if tls.mode is TlsMode.ISTIO_MUTUAL:
            if not mtls:
                warn_once(
                    ("istio-mutual-without-sds", cluster.name),
                    "cluster %s: ISTIO_MUTUAL needs a proxy with SDS; plaintext for proxies "
                    "without certificates",
                    cluster.name,
                )
                return None
            return UpstreamTls("istio", tls.sni or server_name, cluster.identities)
        credential = tls.credential_name if router else ""
        return UpstreamTls(
            "origination", cluster.service.hostname, client=tls, credential=credential
        )
    if not mtls or cluster.service.mesh_external:
        return None
    return UpstreamTls("auto", server_name, cluster.identities)


def _variant(cluster: OutboundCluster, caller: _Caller) -> Hashable:
    """A plain and an mTLS proxy get different bytes under one name: a slot each (rule 8); so
    do clusters under other DestinationRules (a rule in the client's namespace), and, where
    the rule names a credential, gateways and sidecars."""
    tls = cluster.policy.tls if cluster.policy is not None else None
    if caller.router and tls is not None and tls.credential_name:
        return (caller.mtls, cluster.policy, "router")
    return (caller.mtls, cluster.policy)


def _resource(ctx: GenContext, cluster: OutboundCluster, caller: _Caller) -> Resource:
    http2 = cluster.port.protocol.is_http2
    http = cluster.port.protocol.is_http
    tls = auto_mtls(cluster, caller.mtls, caller.router)
    policy = ClusterPolicy.of(cluster.policy)
    variant = _variant(cluster, caller)
    key: Hashable
    build: Callable[[], Cluster]
    if cluster.eds:
        locality = cluster_locality_lb(ctx.index.mesh.locality_lb, cluster.policy)
        weighted = locality is not None and locality.weighted
        eds_key = (http2, tls, policy, http, weighted)
        key, build = eds_key, lambda: build_eds(cluster.name, *eds_key)
    else:
        endpoints = endpoint_keys(cluster.endpoints)
        if not endpoints and not cluster.subset:
            # No endpoints: resolve the host itself, as Istio does for a DNS ServiceEntry.
            endpoints = ((cluster.service.hostname, cluster.port.port, 0, "", False),)
        dns_key = (http2, endpoints, tls, policy, http)
        key, build = dns_key, lambda: build_dns(cluster.name, *dns_key)
    return ctx.resource(CLUSTER_TYPE, cluster.name, key, build, variant=variant)


def _inbound(ctx: GenContext, port: InboundPort) -> Resource:
    key = (port.number, port.protocol.is_http2, port.upstream)
    return variant_resource(ctx, CLUSTER_TYPE, port.cluster, key, lambda: build_inbound(*key))


# --- pure builders: the output depends on the arguments only --------------------------------


def _base(name: str, kind: Cluster.DiscoveryType.ValueType | None, http2: bool) -> Cluster:
    cluster = Cluster(
        name=name,
        connect_timeout=Duration(seconds=CONNECT_TIMEOUT_SECONDS),
        lb_policy=Cluster.ROUND_ROBIN,
    )
    if kind is not None:
        cluster.type = kind
    if http2:
        options = HttpProtocolOptions()
        options.explicit_http_config.http2_protocol_options.SetInParent()
        cluster.typed_extension_protocol_options[_HTTP_OPTIONS_KEY].CopyFrom(pack(options))
    return cluster


def _apply_tls(cluster: Cluster, tls: UpstreamTls | None, http2: bool) -> None:
    if tls is None:
        return
    if tls.kind == "auto":
        cluster.transport_socket_matches.extend(auto_mtls_matches(tls.sni, tls.sans, http2))
    elif tls.kind == "istio":
        cluster.transport_socket.CopyFrom(upstream_socket(tls.sni, tls.sans, http2))
    elif tls.client is not None:
        cluster.transport_socket.CopyFrom(origination_socket(tls.client, tls.sni, tls.credential))


def build_eds(
    name: str,
    http2: bool,
    tls: UpstreamTls | None = None,
    policy: ClusterPolicy | None = None,
    http: bool = False,
    locality_weighted: bool = False,
) -> Cluster:
    cluster = _base(name, Cluster.EDS, http2)
    cluster.eds_cluster_config.eds_config.CopyFrom(ads_config_source())
    cluster.eds_cluster_config.service_name = name
    _apply_tls(cluster, tls, http2)
    apply_policy(cluster, policy, http, http2)
    if locality_weighted:
        # Locality `distribute`: the assignments weigh each locality (control/generate/
        # locality_lb.py), which Envoy honours only with this set.
        cluster.common_lb_config.locality_weighted_lb_config.SetInParent()
    return cluster


def build_dns(
    name: str,
    http2: bool,
    endpoints: tuple[EndpointKey, ...],
    tls: UpstreamTls | None = None,
    policy: ClusterPolicy | None = None,
    http: bool = False,
) -> Cluster:
    cluster = _base(name, None, http2)
    _apply_tls(cluster, tls, http2)
    apply_policy(cluster, policy, http, http2)
    # Envoy 1.40 deprecates the DNS settings on Cluster itself in favour of the DNS cluster
    # extension; with all_addresses_in_single_endpoint off it behaves as STRICT_DNS.
    dns = DnsCluster(
        dns_refresh_rate=Duration(seconds=_DNS_REFRESH_SECONDS),
        respect_dns_ttl=True,
        dns_lookup_family=DnsLookupFamily.V4_ONLY,
    )
    cluster.cluster_type.CopyFrom(
        Cluster.CustomClusterType(name=DNS_CLUSTER_EXTENSION, typed_config=pack(dns))
    )
    cluster.load_assignment.CopyFrom(
        ClusterLoadAssignment(
            cluster_name=name, endpoints=locality_endpoints(name, endpoints, dns=True)
        )
    )
    return cluster


def build_inbound(number: int, http2: bool, upstream: Upstream) -> Cluster:
    name = inbound_cluster_name(number)
    cluster = _base(name, Cluster.STATIC, http2)
    endpoint = LbEndpoint(endpoint=Endpoint(address=upstream.address()))
    cluster.load_assignment.CopyFrom(
        ClusterLoadAssignment(
            cluster_name=name, endpoints=[LocalityLbEndpoints(lb_endpoints=[endpoint])]
        )
    )
    return cluster


def _blackhole() -> Cluster:
    return Cluster(
        name=BLACKHOLE_CLUSTER,
        type=Cluster.STATIC,
        connect_timeout=Duration(seconds=CONNECT_TIMEOUT_SECONDS),
    )


def _passthrough() -> Cluster:
    # Declared for parity with Istio; in interception mode NONE nothing routes to it yet, but
    # REDIRECT mode will, and users look for it in config_dump.
    return Cluster(
        name=PASSTHROUGH_CLUSTER,
        type=Cluster.ORIGINAL_DST,
        lb_policy=Cluster.CLUSTER_PROVIDED,
        connect_timeout=Duration(seconds=CONNECT_TIMEOUT_SECONDS),
    )
