"""Istio mutual TLS for generated config: SDS secret references, the upstream context of
auto mTLS (`transport_socket_matches`) and the downstream context of inbound listeners, for
Envoy; certificate provider instances for proxyless gRPC (gRFC A29).

Certificates never appear in config. Envoy's side names the agent's SDS secrets — `default`
(the workload's certificate chain and key) and `ROOTCA` (the trust bundle) — fetched over the
`sds-grpc` cluster of the agent's bootstrap, exactly as Istio's sidecars do, so real Istio
agents and ours are interchangeable here. gRPC has no SDS: it names a certificate provider
instance of its bootstrap (`default`, a file_watcher over the files the agent writes) and the
same two certificate names, as Istio's grpcgen does.
"""

from __future__ import annotations

from typing import Final

from envoy.config.cluster.v3.cluster_pb2 import Cluster
from envoy.config.core.v3.base_pb2 import TransportSocket
from envoy.config.core.v3.config_source_pb2 import ApiConfigSource, ApiVersion, ConfigSource
from envoy.config.core.v3.grpc_service_pb2 import GrpcService
from envoy.extensions.transport_sockets.raw_buffer.v3.raw_buffer_pb2 import RawBuffer
from envoy.extensions.transport_sockets.tls.v3.common_pb2 import (
    CertificateProviderPluginInstance,
    CertificateValidationContext,
    SubjectAltNameMatcher,
    TlsParameters,
)
from envoy.extensions.transport_sockets.tls.v3.secret_pb2 import SdsSecretConfig
from envoy.extensions.transport_sockets.tls.v3.tls_pb2 import (
    CommonTlsContext,
    DownstreamTlsContext,
    UpstreamTlsContext,
)
from envoy.type.matcher.v3.string_pb2 import StringMatcher
from google.protobuf.duration_pb2 import Duration
from google.protobuf.struct_pb2 import Struct
from google.protobuf.wrappers_pb2 import BoolValue

from control.generate.load_assignment import MTLS_ENDPOINT_LABEL
from control.generate.wire import pack
from control.model.proxy import CERTIFICATE_PROVIDER

SDS_CLUSTER: Final = "sds-grpc"
WORKLOAD_SECRET: Final = "default"
ROOT_SECRET: Final = "ROOTCA"
TLS_SOCKET: Final = "envoy.transport_sockets.tls"
RAW_BUFFER_SOCKET: Final = "envoy.transport_sockets.raw_buffer"
MTLS_MATCH_NAME: Final = "tlsMode-istio"
PLAINTEXT_MATCH_NAME: Final = "tlsMode-disabled"
# What an Istio sidecar offers when it originates mTLS; inbound listeners recognise mesh mTLS
# (as opposed to an app's own TLS) by these, as Istio's do.
ISTIO_ALPN: Final = ("istio-peer-exchange", "istio")
# ... and towards an HTTP/2 port, as Istio's: h2 too, which a gRPC server (proxyless) must
# see negotiated (gRPC refuses a TLS connection without ALPN h2).
ISTIO_ALPN_H2: Final = (*ISTIO_ALPN, "h2")
MESH_ALPN_MATCH: Final = (
    "istio-peer-exchange",
    "istio",
    "istio-http/1.0",
    "istio-http/1.1",
    "istio-h2",
)


def sni(port: int, hostname: str) -> str:
    """Istio's SNI for a service port (`outbound_.9080_._.reviews.default.svc.cluster.local`),
    so an Istio gateway or sidecar on the other end can route on it."""
    return f"outbound_.{port}_._.{hostname}"


def sds_config() -> ConfigSource:
    # Not ADS: secrets come from the agent next to Envoy. No initial-fetch timeout, as Istio:
    # a listener or cluster without its certificate must wait for it, not start without TLS.
    return ConfigSource(
        api_config_source=ApiConfigSource(
            api_type=ApiConfigSource.GRPC,
            transport_api_version=ApiVersion.V3,
            set_node_on_first_message_only=True,
            grpc_services=[GrpcService(envoy_grpc=GrpcService.EnvoyGrpc(cluster_name=SDS_CLUSTER))],
        ),
        initial_fetch_timeout=Duration(seconds=0),
        resource_api_version=ApiVersion.V3,
    )


def _common(sans: tuple[str, ...], alpn: tuple[str, ...]) -> CommonTlsContext:
    validation = CertificateValidationContext(
        match_typed_subject_alt_names=[
            SubjectAltNameMatcher(
                san_type=SubjectAltNameMatcher.URI, matcher=StringMatcher(exact=s)
            )
            for s in sans
        ]
    )
    return CommonTlsContext(
        tls_params=TlsParameters(tls_minimum_protocol_version=TlsParameters.TLSv1_2),
        tls_certificate_sds_secret_configs=[
            SdsSecretConfig(name=WORKLOAD_SECRET, sds_config=sds_config())
        ],
        combined_validation_context=CommonTlsContext.CombinedCertificateValidationContext(
            default_validation_context=validation,
            validation_context_sds_secret_config=SdsSecretConfig(
                name=ROOT_SECRET, sds_config=sds_config()
            ),
        ),
        alpn_protocols=list(alpn),
    )


def upstream_socket(
    server_name: str, sans: tuple[str, ...], http2: bool = False
) -> TransportSocket:
    """ISTIO_MUTUAL towards one service port: our certificate, the mesh root, and the peer's
    URI SAN must be one of `sans` (the SPIFFE IDs of the service's workloads; none = any
    certificate the root signed, which is what Istio does for a service without accounts)."""
    alpn = ISTIO_ALPN_H2 if http2 else ISTIO_ALPN
    context = UpstreamTlsContext(common_tls_context=_common(sans, alpn), sni=server_name)
    return TransportSocket(name=TLS_SOCKET, typed_config=pack(context))


def auto_mtls_matches(
    server_name: str, sans: tuple[str, ...], http2: bool = False
) -> list[Cluster.TransportSocketMatch]:
    """Auto mTLS: endpoints labelled `tlsMode: istio` (they have a sidecar) get ISTIO_MUTUAL,
    every other endpoint of the same cluster plaintext."""
    match = Struct()
    match.update(MTLS_ENDPOINT_LABEL)
    return [
        Cluster.TransportSocketMatch(
            name=MTLS_MATCH_NAME,
            match=match,
            transport_socket=upstream_socket(server_name, sans, http2),
        ),
        Cluster.TransportSocketMatch(
            name=PLAINTEXT_MATCH_NAME,
            match=Struct(),
            transport_socket=TransportSocket(
                name=RAW_BUFFER_SOCKET, typed_config=pack(RawBuffer())
            ),
        ),
    ]


def downstream_socket() -> TransportSocket:
    """An inbound mTLS listener: our certificate, and a client certificate the mesh root
    signed is required (any workload's; AuthorizationPolicy decides who may do what)."""
    context = DownstreamTlsContext(
        common_tls_context=_common((), ()),
        require_client_certificate=BoolValue(value=True),
    )
    return TransportSocket(name=TLS_SOCKET, typed_config=pack(context))


# --- proxyless gRPC (certificate providers) --------------------------------------------------


def _provider_common(sans: tuple[str, ...]) -> CommonTlsContext:
    """Identity and roots from the bootstrap's `default` certificate provider. Each is named in
    the current field and in its deprecated twin, as Istio sends them: gRPC releases before
    the plugin-instance fields (and some other languages' clients) read only the old ones.
    SANs go in `match_subject_alt_names`, the field gRPC reads (not the typed one)."""
    identity = (CERTIFICATE_PROVIDER, WORKLOAD_SECRET)
    roots = (CERTIFICATE_PROVIDER, ROOT_SECRET)
    return CommonTlsContext(
        tls_certificate_provider_instance=CertificateProviderPluginInstance(
            instance_name=identity[0], certificate_name=identity[1]
        ),
        tls_certificate_certificate_provider_instance=CommonTlsContext.CertificateProviderInstance(
            instance_name=identity[0], certificate_name=identity[1]
        ),
        combined_validation_context=CommonTlsContext.CombinedCertificateValidationContext(
            default_validation_context=CertificateValidationContext(
                ca_certificate_provider_instance=CertificateProviderPluginInstance(
                    instance_name=roots[0], certificate_name=roots[1]
                ),
                match_subject_alt_names=[StringMatcher(exact=s) for s in sans],
            ),
            validation_context_certificate_provider_instance=(
                CommonTlsContext.CertificateProviderInstance(
                    instance_name=roots[0], certificate_name=roots[1]
                )
            ),
        ),
    )


def grpc_upstream_socket(sans: tuple[str, ...]) -> TransportSocket:
    """A proxyless client's mTLS towards a cluster: its workload certificate, the mesh root,
    and the server's SAN must be one of `sans` (none: any certificate the root signed). No
    SNI and no ALPN: gRPC ignores every UpstreamTlsContext field but `common_tls_context`."""
    context = UpstreamTlsContext(common_tls_context=_provider_common(sans))
    return TransportSocket(name=TLS_SOCKET, typed_config=pack(context))


def grpc_downstream_socket() -> TransportSocket:
    """A proxyless server's mTLS: a client certificate the mesh root signed is required. No
    SAN match: gRPC rejects `match_subject_alt_names` on servers (who may call is
    AuthorizationPolicy's business)."""
    common = _provider_common(())
    context = DownstreamTlsContext(
        common_tls_context=common, require_client_certificate=BoolValue(value=True)
    )
    return TransportSocket(name=TLS_SOCKET, typed_config=pack(context))
