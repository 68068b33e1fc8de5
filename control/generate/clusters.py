"""CDS: the clusters of an Envoy sidecar, named as Istio names them.

- `outbound|PORT||HOST` per port of every visible service: EDS over ADS, or a strict DNS
  cluster (Envoy's `envoy.cluster.dns` extension) with the endpoints inline for ServiceEntries
  with `resolution: DNS`; for a proxy with certificates (SDS), mesh-internal clusters carry
  Istio's auto mTLS `transport_socket_matches` (ISTIO_MUTUAL to endpoints with a sidecar);
- `inbound|PORT||` per Sidecar ingress port: STATIC, pointing at the app (defaultEndpoint);
- `BlackHoleCluster` and `PassthroughCluster`, which Istio users expect to find.

Every resource goes through the serialized-resource cache with a key made of exactly the
arguments of its pure builder below, so the key covers every input by construction.
"""

from __future__ import annotations

import functools

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

from control.generate.common import (
    BLACKHOLE_CLUSTER,
    CLUSTER_TYPE,
    CONNECT_TIMEOUT_SECONDS,
    PASSTHROUGH_CLUSTER,
    EndpointKey,
    InboundPort,
    OutboundCluster,
    Upstream,
    ads_config_source,
    endpoint_keys,
    inbound_cluster_name,
    inbound_ports,
    locality_endpoints,
    outbound_plan,
    pack,
    variant_resource,
)
from control.generate.context import GenContext
from control.generate.tls import auto_mtls_matches, sni
from control.model.proxy import Proxy
from control.xds.cache import Resource, ResourceSet

DNS_CLUSTER_EXTENSION = "envoy.cluster.dns"
_HTTP_OPTIONS_KEY = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
# An mTLS cluster's settings: (SNI, SANs the server's certificate may carry).
MtlsKey = tuple[str, tuple[str, ...]]
# Istio's default DNS refresh for ServiceEntry hosts; Envoy's own 5s default is needlessly busy.
_DNS_REFRESH_SECONDS = 60


def generate(ctx: GenContext, proxy: Proxy) -> ResourceSet:
    plan = outbound_plan(ctx, proxy)
    # Auto mTLS needs the proxy to hold certificates (SDS); without them it stays plaintext.
    mtls = proxy.sds
    outbound = ctx.memo(
        ("cds-outbound", id(plan.visible), mtls), lambda: _outbound(ctx, plan.clusters, mtls)
    )
    inbound = tuple(_inbound(ctx, port) for port in inbound_ports(ctx, proxy))
    # Proxies of one scope with equal inbound clusters share the set (and its digest).
    return ctx.memo(
        ("cds-set", id(plan.visible), mtls, inbound), lambda: ResourceSet(outbound + inbound)
    )


def _outbound(
    ctx: GenContext, clusters: tuple[OutboundCluster, ...], mtls: bool
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
    return fixed + tuple(
        ctx.memo(("cds", c.name, mtls), functools.partial(_resource, ctx, c, mtls))
        for c in clusters
    )


def auto_mtls(cluster: OutboundCluster, mtls: bool) -> MtlsKey | None:
    """The ISTIO_MUTUAL settings of a cluster (SNI, accepted SANs), or None for plaintext.

    As Istio: every mesh-internal cluster of a proxy that has certificates gets transport
    socket matches, and EDS decides per endpoint (`tlsMode: istio`) which one applies, so an
    endpoint gaining a sidecar is an EDS change only. Services outside the mesh are plaintext
    (their endpoints have no sidecar to talk mTLS to)."""
    if not mtls or cluster.service.mesh_external:
        return None
    return (sni(cluster.port.port, cluster.service.hostname), cluster.identities)


def _resource(ctx: GenContext, cluster: OutboundCluster, mtls: bool) -> Resource:
    http2 = cluster.port.protocol.is_http2
    tls = auto_mtls(cluster, mtls)
    # A plain and an mTLS proxy get different bytes under one name: a slot each (rule 8).
    if cluster.eds:
        eds_key = (http2, tls)
        return ctx.resource(
            CLUSTER_TYPE,
            cluster.name,
            eds_key,
            lambda: build_eds(cluster.name, *eds_key),
            variant=mtls,
        )
    endpoints = endpoint_keys(cluster.endpoints) or (
        # No endpoints: resolve the host itself, as Istio does for a DNS ServiceEntry.
        (cluster.service.hostname, cluster.port.port, 0, "", False),
    )
    dns_key = (http2, endpoints, tls)
    return ctx.resource(
        CLUSTER_TYPE,
        cluster.name,
        dns_key,
        lambda: build_dns(cluster.name, *dns_key),
        variant=mtls,
    )


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


def _apply_mtls(cluster: Cluster, tls: MtlsKey | None) -> None:
    if tls is not None:
        cluster.transport_socket_matches.extend(auto_mtls_matches(*tls))


def build_eds(name: str, http2: bool, tls: MtlsKey | None = None) -> Cluster:
    cluster = _base(name, Cluster.EDS, http2)
    cluster.eds_cluster_config.eds_config.CopyFrom(ads_config_source())
    cluster.eds_cluster_config.service_name = name
    _apply_mtls(cluster, tls)
    return cluster


def build_dns(
    name: str, http2: bool, endpoints: tuple[EndpointKey, ...], tls: MtlsKey | None = None
) -> Cluster:
    cluster = _base(name, None, http2)
    _apply_mtls(cluster, tls)
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
