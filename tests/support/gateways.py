"""Gateway test material: a router proxy, and a mesh with one Istio Gateway of every server
shape (HTTP with a redirect, HTTPS SIMPLE by SNI, MUTUAL from a Secret, PASSTHROUGH, TCP)
and the VirtualServices bound to it."""

from __future__ import annotations

from collections.abc import Mapping

from control.model.proxy import Proxy, proxy_from_node
from protos.telemetry import ALS_NODE_METADATA
from tests.support.traffic import service

ROUTER_IP = "127.0.1.9"


def router(
    labels: Mapping[str, str] | None = None,
    *,
    ip: str = ROUTER_IP,
    namespace: str = "edge",
    mode: str = "NONE",
    als: bool = False,
) -> Proxy:
    meta: dict[str, object] = {
        "LABELS": dict(labels or {"istio": "ingressgateway"}),
        "SDS": "true",
        "INTERCEPTION_MODE": mode,
        "SERVICE_ACCOUNT": "ingress",
    }
    if als:
        meta[ALS_NODE_METADATA] = "true"
    return proxy_from_node(f"router~{ip}~ingress.{namespace}~{namespace}.svc.cluster.local", meta)


_GATEWAYS = """
---
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: a, namespace: edge}
spec:
  selector: {istio: ingressgateway}
  servers:
  - port: {number: 80, name: http, protocol: HTTP}
    hosts: [plain.example.com]
  - port: {number: 80, name: http-secure, protocol: HTTP}
    hosts: [secure.example.com]
    tls: {httpsRedirect: true}
  - port: {number: 443, name: https-a, protocol: HTTPS}
    bind: 127.0.1.40
    hosts: [a.example.com]
    tls: {mode: SIMPLE, serverCertificate: /certs/a.pem, privateKey: /certs/a.key}
  - port: {number: 8443, name: mtls, protocol: HTTPS}
    hosts: ["*"]
    tls: {mode: MUTUAL, credentialName: shop-cert, subjectAltNames: [client.example.com]}
  - port: {number: 9443, name: pass, protocol: TLS}
    hosts: ["*.example.com"]
    tls: {mode: PASSTHROUGH}
  - port: {number: 3306, name: db, protocol: TCP}
    hosts: ["*"]
---
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: b, namespace: edge}
spec:
  selector: {istio: ingressgateway}
  servers:
  - port: {number: 443, name: https-b, protocol: HTTPS}
    bind: 127.0.1.40
    hosts: [b.example.com]
    tls: {mode: SIMPLE, serverCertificate: /certs/b.pem, privateKey: /certs/b.key}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: site, namespace: default}
spec:
  hosts: [plain.example.com, secure.example.com, a.example.com, b.example.com]
  gateways: [edge/a, edge/b]
  http:
  - match: [{uri: {prefix: /ratings}}]
    route: [{destination: {host: ratings}}]
  - route: [{destination: {host: reviews}}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: mtls, namespace: default}
spec:
  hosts: [mtls.example.com]
  gateways: [edge/a]
  http: [{route: [{destination: {host: reviews}}]}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: pass, namespace: default}
spec:
  hosts: [pass.example.com]
  gateways: [edge/a]
  tls:
  - match: [{port: 9443, sniHosts: [pass.example.com]}]
    route: [{destination: {host: tlsbackend, port: {number: 9443}}}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: db, namespace: default}
spec:
  hosts: [db]
  gateways: [edge/a]
  tcp: [{route: [{destination: {host: db, port: {number: 3306}}}]}]
"""

# The backends the gateways route to.
SERVICES = "".join(
    (
        service("reviews", "reviews"),
        service("ratings", "ratings"),
        service("tlsbackend", "tlsbackend", 9443, None, "tls"),
        service("db", "db", 3306, None, "tcp"),
    )
)
GATEWAY_MESH = SERVICES + _GATEWAYS
