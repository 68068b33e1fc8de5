"""TLS termination on a gateway server: which SDS secrets hold its certificate and CA, and the
DownstreamTlsContext a terminating filter chain carries.

Certificates never appear in config; the router's agent serves them over SDS under Istio's
names: files on the router as `file-cert:<cert>~<key>` and `file-root:<ca>` (agent/sds/files.py),
a `credentialName` Secret as `kubernetes://<name>` and its CA as `kubernetes://<name>-cacert`,
ISTIO_MUTUAL the router's own mesh certificate (`default`, `ROOTCA`).

A missing or bad certificate file must not hold the other servers back. Envoy waits for a
referenced secret before it starts a listener; with the mesh's "wait forever" one bad server
would keep its whole listener (every server on that port) and the router's readiness down.
So gateway secrets have a finite initial fetch timeout: past it the listener starts, the chain
without its certificate refuses handshakes, and the certificate is used once it arrives.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from envoy.config.core.v3.base_pb2 import TransportSocket
from envoy.config.core.v3.config_source_pb2 import ConfigSource
from envoy.extensions.transport_sockets.tls.v3.common_pb2 import (
    CertificateValidationContext,
    SubjectAltNameMatcher,
    TlsParameters,
)
from envoy.extensions.transport_sockets.tls.v3.secret_pb2 import SdsSecretConfig
from envoy.extensions.transport_sockets.tls.v3.tls_pb2 import (
    CommonTlsContext,
    DownstreamTlsContext,
)
from envoy.type.matcher.v3.string_pb2 import StringMatcher
from google.protobuf.duration_pb2 import Duration
from google.protobuf.wrappers_pb2 import BoolValue

from control.generate.mesh_tls import ROOT_SECRET, TLS_SOCKET, WORKLOAD_SECRET, sds_config
from control.generate.wire import pack
from control.model.gateway import ServerTls, ServerTlsMode

FILE_CERT_PREFIX: Final = "file-cert:"
FILE_ROOT_PREFIX: Final = "file-root:"
CREDENTIAL_PREFIX: Final = "kubernetes://"
CA_SUFFIX: Final = "-cacert"
SECRET_FETCH_TIMEOUT_SECONDS: Final = 5
HTTPS_ALPN: Final = ("h2", "http/1.1")

_VERSIONS: Final = {
    "": TlsParameters.TLS_AUTO,
    "TLSV1_0": TlsParameters.TLSv1_0,
    "TLSV1_1": TlsParameters.TLSv1_1,
    "TLSV1_2": TlsParameters.TLSv1_2,
    "TLSV1_3": TlsParameters.TLSv1_3,
}


@dataclass(frozen=True, slots=True)
class ServerSecrets:
    """The SDS names a terminating server uses: its certificate, and the CA that client
    certificates must chain to ("" when clients are not asked for one)."""

    certificate: str
    ca: str = ""


def server_secrets(tls: ServerTls) -> ServerSecrets:
    if tls.mode is ServerTlsMode.ISTIO_MUTUAL:
        return ServerSecrets(WORKLOAD_SECRET, ROOT_SECRET)
    mutual = tls.mode in (ServerTlsMode.MUTUAL, ServerTlsMode.OPTIONAL_MUTUAL)
    if tls.credential_name:
        name = CREDENTIAL_PREFIX + tls.credential_name
        return ServerSecrets(name, name + CA_SUFFIX if mutual else "")
    certificate = f"{FILE_CERT_PREFIX}{tls.server_certificate}~{tls.private_key}"
    ca = FILE_ROOT_PREFIX + tls.ca_certificates if mutual and tls.ca_certificates else ""
    return ServerSecrets(certificate, ca)


def _gateway_sds() -> ConfigSource:
    source = sds_config()
    source.initial_fetch_timeout.CopyFrom(Duration(seconds=SECRET_FETCH_TIMEOUT_SECONDS))
    return source


def gateway_secret(name: str) -> SdsSecretConfig:
    """An SDS reference to a secret a router's agent serves: the mesh's own secrets keep the
    mesh's config source (and its wait), as in sidecars; the others wait a finite time."""
    if name in (WORKLOAD_SECRET, ROOT_SECRET):
        return SdsSecretConfig(name=name, sds_config=sds_config())
    return SdsSecretConfig(name=name, sds_config=_gateway_sds())


def server_socket(tls: ServerTls, alpn: tuple[str, ...]) -> TransportSocket:
    """The DownstreamTlsContext of a server that terminates TLS (SIMPLE, MUTUAL, ISTIO_MUTUAL):
    its certificate over SDS, and for the mutual modes a required client certificate that
    chains to the CA (and carries one of `subjectAltNames`, when given)."""
    secrets = server_secrets(tls)
    minimum = _VERSIONS.get(tls.min_protocol_version, TlsParameters.TLS_AUTO)
    common = CommonTlsContext(
        tls_params=TlsParameters(
            # Istio's gateway default: nothing older than TLS 1.2 unless asked for.
            tls_minimum_protocol_version=minimum
            if tls.min_protocol_version
            else TlsParameters.TLSv1_2,
            tls_maximum_protocol_version=_VERSIONS.get(
                tls.max_protocol_version, TlsParameters.TLS_AUTO
            ),
            cipher_suites=list(tls.cipher_suites),
        ),
        tls_certificate_sds_secret_configs=[gateway_secret(secrets.certificate)],
        alpn_protocols=list(alpn),
    )
    if secrets.ca:
        matchers = [
            SubjectAltNameMatcher(san_type=kind, matcher=StringMatcher(exact=san))
            for san in tls.subject_alt_names
            for kind in (SubjectAltNameMatcher.DNS, SubjectAltNameMatcher.URI)
        ]
        common.combined_validation_context.CopyFrom(
            CommonTlsContext.CombinedCertificateValidationContext(
                default_validation_context=CertificateValidationContext(
                    match_typed_subject_alt_names=matchers
                ),
                validation_context_sds_secret_config=gateway_secret(secrets.ca),
            )
        )
    context = DownstreamTlsContext(
        common_tls_context=common,
        # OPTIONAL_MUTUAL verifies a client certificate when one is shown, asks for none.
        require_client_certificate=BoolValue(
            value=bool(secrets.ca) and tls.mode is not ServerTlsMode.OPTIONAL_MUTUAL
        ),
    )
    return TransportSocket(name=TLS_SOCKET, typed_config=pack(context))
