"""DestinationRule traffic policy on Envoy clusters and routes, as Istio translates it.

Pure functions: model settings in, Envoy messages (or edits of a Cluster being built) out. The
cluster builders call `apply_policy`; the route builders call `hash_policies` (consistent hash
lives on the route in Envoy, on the destination in Istio).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from envoy.config.cluster.v3.circuit_breaker_pb2 import CircuitBreakers
from envoy.config.cluster.v3.cluster_pb2 import Cluster
from envoy.config.cluster.v3.outlier_detection_pb2 import OutlierDetection as EnvoyOutlier
from envoy.config.core.v3.base_pb2 import DataSource, TransportSocket
from envoy.config.route.v3.route_components_pb2 import RouteAction
from envoy.extensions.transport_sockets.tls.v3.common_pb2 import (
    CertificateValidationContext,
    SubjectAltNameMatcher,
    TlsCertificate,
)
from envoy.extensions.transport_sockets.tls.v3.tls_pb2 import (
    CommonTlsContext,
    UpstreamTlsContext,
)
from envoy.extensions.upstreams.http.v3.http_protocol_options_pb2 import HttpProtocolOptions
from envoy.type.matcher.v3.string_pb2 import StringMatcher
from envoy.type.v3.percent_pb2 import Percent
from google.protobuf.duration_pb2 import Duration
from google.protobuf.wrappers_pb2 import UInt32Value, UInt64Value

from control.generate.gateway_tls import CA_SUFFIX, CREDENTIAL_PREFIX, gateway_secret
from control.generate.mesh_tls import TLS_SOCKET
from control.generate.wire import pack
from control.model.traffic import (
    ClientTls,
    ConnectionPool,
    ConsistentHash,
    LbPolicy,
    LoadBalancer,
    OutlierDetection,
    TlsMode,
    TrafficPolicy,
)

HTTP_OPTIONS_KEY: Final = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
# Where Debian-family hosts keep the system trust bundle: SIMPLE/MUTUAL origination without
# caCertificates verifies the server against it, as Istio does with the system roots.
SYSTEM_CA_BUNDLE: Final = "/etc/ssl/certs/ca-certificates.crt"
# Istio's ring size when the rule does not set one.
_DEFAULT_RING_SIZE: Final = 1024


@dataclass(frozen=True, slots=True)
class ClusterPolicy:
    """What a cluster's bytes take from its DestinationRule (the TLS part is decided apart,
    with auto mTLS): a cache-key-friendly cut of TrafficPolicy."""

    load_balancer: LoadBalancer | None = None
    connection_pool: ConnectionPool | None = None
    outlier_detection: OutlierDetection | None = None

    @classmethod
    def of(cls, policy: TrafficPolicy | None) -> ClusterPolicy | None:
        if policy is None:
            return None
        cut = cls(policy.load_balancer, policy.connection_pool, policy.outlier_detection)
        return cut if cut != cls() else None


def _duration(seconds: float) -> Duration:
    d = Duration()
    d.FromNanoseconds(round(seconds * 1e9))
    return d


def apply_policy(cluster: Cluster, policy: ClusterPolicy | None, http: bool, http2: bool) -> None:
    if policy is None:
        return
    _load_balancer(cluster, policy.load_balancer)
    if policy.connection_pool is not None:
        _connection_pool(cluster, policy.connection_pool, http, http2)
    if policy.outlier_detection is not None:
        _outlier(cluster, policy.outlier_detection)


def _load_balancer(cluster: Cluster, lb: LoadBalancer | None) -> None:
    if lb is None:
        return
    if lb.consistent_hash is not None:
        if lb.consistent_hash.maglev:
            cluster.lb_policy = Cluster.MAGLEV
        else:
            cluster.lb_policy = Cluster.RING_HASH
            ring = lb.consistent_hash.minimum_ring_size or _DEFAULT_RING_SIZE
            cluster.ring_hash_lb_config.minimum_ring_size.CopyFrom(UInt64Value(value=ring))
    elif lb.simple is LbPolicy.LEAST_REQUEST:
        cluster.lb_policy = Cluster.LEAST_REQUEST
    elif lb.simple is LbPolicy.RANDOM:
        cluster.lb_policy = Cluster.RANDOM
    elif lb.simple is LbPolicy.ROUND_ROBIN:
        cluster.lb_policy = Cluster.ROUND_ROBIN


def _connection_pool(cluster: Cluster, pool: ConnectionPool, http: bool, http2: bool) -> None:
    if pool.connect_timeout is not None:
        cluster.connect_timeout.CopyFrom(_duration(pool.connect_timeout))
    limits = CircuitBreakers.Thresholds()
    if pool.max_connections is not None:
        limits.max_connections.value = pool.max_connections
    if pool.http1_max_pending_requests is not None:
        limits.max_pending_requests.value = pool.http1_max_pending_requests
    if pool.http2_max_requests is not None:
        limits.max_requests.value = pool.http2_max_requests
    if pool.max_retries is not None:
        limits.max_retries.value = pool.max_retries
    if limits.ByteSize():
        cluster.circuit_breakers.thresholds.append(limits)
    if not http:
        return
    if pool.max_requests_per_connection or pool.idle_timeout is not None or pool.h2_upgrade:
        options = HttpProtocolOptions()
        if HTTP_OPTIONS_KEY in cluster.typed_extension_protocol_options:
            cluster.typed_extension_protocol_options[HTTP_OPTIONS_KEY].Unpack(options)
        if pool.max_requests_per_connection:
            options.common_http_protocol_options.max_requests_per_connection.CopyFrom(
                UInt32Value(value=pool.max_requests_per_connection)
            )
        if pool.idle_timeout is not None:
            options.common_http_protocol_options.idle_timeout.CopyFrom(_duration(pool.idle_timeout))
        if http2 or pool.h2_upgrade:
            options.explicit_http_config.http2_protocol_options.SetInParent()
        else:
            options.explicit_http_config.http_protocol_options.SetInParent()
        cluster.typed_extension_protocol_options[HTTP_OPTIONS_KEY].CopyFrom(pack(options))


def _outlier(cluster: Cluster, outlier: OutlierDetection) -> None:
    out = EnvoyOutlier(enforcing_success_rate=UInt32Value(value=0))
    # As Istio: a threshold that is set is enforced every time (100%), 0 turns it off.
    if outlier.consecutive_5xx is not None:
        out.consecutive_5xx.value = outlier.consecutive_5xx
        out.enforcing_consecutive_5xx.value = 100 if outlier.consecutive_5xx else 0
    if outlier.consecutive_gateway is not None:
        out.consecutive_gateway_failure.value = outlier.consecutive_gateway
        out.enforcing_consecutive_gateway_failure.value = 100 if outlier.consecutive_gateway else 0
    if outlier.interval is not None:
        out.interval.CopyFrom(_duration(outlier.interval))
    if outlier.base_ejection_time is not None:
        out.base_ejection_time.CopyFrom(_duration(outlier.base_ejection_time))
    if outlier.max_ejection_percent is not None:
        out.max_ejection_percent.value = outlier.max_ejection_percent
    cluster.outlier_detection.CopyFrom(out)
    # Istio's minHealthPercent is Envoy's panic threshold (0 by default: never panic, so
    # ejected hosts stay out even when most of them are).
    cluster.common_lb_config.healthy_panic_threshold.CopyFrom(
        Percent(value=float(outlier.min_health_percent))
    )


def origination_socket(tls: ClientTls, sni: str, credential: str = "") -> TransportSocket:
    """SIMPLE / MUTUAL TLS origination (to a host outside the mesh, usually). `credential`:
    the Secret a gateway takes the client certificate (MUTUAL) and the CA from, over SDS
    (`kubernetes://<name>`, `…-cacert`), instead of the rule's files."""
    if credential:
        return _credential_socket(tls, sni, CREDENTIAL_PREFIX + credential)
    common = CommonTlsContext()
    if tls.client_certificate:
        common.tls_certificates.append(
            TlsCertificate(
                certificate_chain=DataSource(filename=tls.client_certificate),
                private_key=DataSource(filename=tls.private_key),
            )
        )
    if not tls.insecure_skip_verify:
        common.validation_context.CopyFrom(
            CertificateValidationContext(
                trusted_ca=DataSource(filename=tls.ca_certificates or SYSTEM_CA_BUNDLE),
                match_typed_subject_alt_names=_san_matchers(tls.subject_alt_names),
            )
        )
    context = UpstreamTlsContext(common_tls_context=common, sni=tls.sni or sni)
    return TransportSocket(name=TLS_SOCKET, typed_config=pack(context))


def _credential_socket(tls: ClientTls, sni: str, secret: str) -> TransportSocket:
    common = CommonTlsContext()
    if tls.mode is TlsMode.MUTUAL:
        common.tls_certificate_sds_secret_configs.append(gateway_secret(secret))
    if not tls.insecure_skip_verify:
        common.combined_validation_context.CopyFrom(
            CommonTlsContext.CombinedCertificateValidationContext(
                default_validation_context=CertificateValidationContext(
                    match_typed_subject_alt_names=_san_matchers(tls.subject_alt_names)
                ),
                validation_context_sds_secret_config=gateway_secret(secret + CA_SUFFIX),
            )
        )
    context = UpstreamTlsContext(common_tls_context=common, sni=tls.sni or sni)
    return TransportSocket(name=TLS_SOCKET, typed_config=pack(context))


def _san_matchers(names: tuple[str, ...]) -> list[SubjectAltNameMatcher]:
    return [
        SubjectAltNameMatcher(san_type=SubjectAltNameMatcher.DNS, matcher=StringMatcher(exact=n))
        for n in names
    ]


def hash_policies(hashed: ConsistentHash | None) -> list[RouteAction.HashPolicy]:
    """The route-side half of `consistentHash` (the cluster side is its lb_policy)."""
    if hashed is None:
        return []
    if hashed.header:
        return [
            RouteAction.HashPolicy(header=RouteAction.HashPolicy.Header(header_name=hashed.header))
        ]
    if hashed.cookie:
        cookie = RouteAction.HashPolicy.Cookie(name=hashed.cookie, path=hashed.cookie_path)
        if hashed.cookie_ttl is not None:
            cookie.ttl.CopyFrom(_duration(hashed.cookie_ttl))
        return [RouteAction.HashPolicy(cookie=cookie)]
    if hashed.query_param:
        return [
            RouteAction.HashPolicy(
                query_parameter=RouteAction.HashPolicy.QueryParameter(name=hashed.query_param)
            )
        ]
    return [
        RouteAction.HashPolicy(
            connection_properties=RouteAction.HashPolicy.ConnectionProperties(source_ip=True)
        )
    ]
