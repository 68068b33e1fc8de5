"""The Kubernetes Gateway API kinds (`gateway.networking.k8s.io`), keyed by (group, kind) so
that `Gateway` here and the Istio `Gateway` (networking.istio.io) stay apart."""

from __future__ import annotations

from collections.abc import Callable

from control.config.fields import Context
from control.config.kinds.gatewayapi import gateway, referencegrant, routes
from control.config.kinds.gatewayapi.refs import (
    ALPHA,
    GRPC_ROUTE_VERSIONS,
    REFERENCE_GRANT_VERSIONS,
    V1,
)
from control.config.objects import ConfigObject
from control.model.gatewayapi import GROUP

Converter = Callable[[Context, str], ConfigObject]

# (group, kind) -> (apiVersions, converter, plural)
KINDS: dict[tuple[str, str], tuple[tuple[str, ...], Converter, str]] = {
    (GROUP, "GatewayClass"): (V1, gateway.convert_class, "gatewayclasses"),
    (GROUP, "Gateway"): (V1, gateway.convert_gateway, "gateways"),
    (GROUP, "HTTPRoute"): (V1, routes.convert_http, "httproutes"),
    (GROUP, "GRPCRoute"): (GRPC_ROUTE_VERSIONS, routes.convert_grpc, "grpcroutes"),
    (GROUP, "TLSRoute"): (ALPHA, routes.convert_tls, "tlsroutes"),
    (GROUP, "TCPRoute"): (ALPHA, routes.convert_tcp, "tcproutes"),
    (GROUP, "ReferenceGrant"): (
        REFERENCE_GRANT_VERSIONS,
        referencegrant.convert,
        "referencegrants",
    ),
}
