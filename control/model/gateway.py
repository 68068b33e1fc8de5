"""Gateways in the model: Istio `Gateway` servers, and the routers that serve them.

Both config forms end here: an Istio `networking.istio.io` Gateway converts to one `Gateway`
directly; a Kubernetes Gateway API `Gateway` (with its HTTPRoutes, GRPCRoutes, TLSRoutes and
TCPRoutes) is translated into `Gateway` objects plus VirtualServices bound to them, as Istio
does, so the generators know one shape. A router proxy (node type `router`) serves the servers
of every Gateway whose selector matches its labels.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from control.model.types import Labels, Protocol, SourceRef, workload_selector_matches


class ServerTlsMode(enum.StrEnum):
    """`servers[].tls.mode` (Istio names)."""

    SIMPLE = "SIMPLE"  # terminate TLS with the server's certificate
    MUTUAL = "MUTUAL"  # terminate TLS and require a client certificate from caCertificates
    # Terminate TLS; a client certificate is verified against caCertificates if one is shown.
    OPTIONAL_MUTUAL = "OPTIONAL_MUTUAL"
    PASSTHROUGH = "PASSTHROUGH"  # route by SNI without terminating
    ISTIO_MUTUAL = "ISTIO_MUTUAL"  # terminate with the router's mesh certificate, mesh clients only


@dataclass(frozen=True, slots=True)
class ServerTls:
    """`servers[].tls`. A certificate comes from `credential_name` (a `v1 Secret`, served over
    SDS as `kubernetes://<name>`) or from files on the router (`server_certificate`,
    `private_key`, `ca_certificates`)."""

    mode: ServerTlsMode = ServerTlsMode.SIMPLE
    https_redirect: bool = False
    credential_name: str = ""  # "<name>" or "<namespace>/<name>" (Gateway API cross-namespace)
    server_certificate: str = ""
    private_key: str = ""
    ca_certificates: str = ""
    subject_alt_names: tuple[str, ...] = ()
    min_protocol_version: str = ""  # "" or TLSV1_0 .. TLSV1_3
    max_protocol_version: str = ""
    # `cipherSuites` (BoringSSL names, TLS 1.2 and older), in order; (): Envoy's defaults.
    cipher_suites: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class GatewayServer:
    """One `servers[]` entry: a port, the hosts it serves, and how it terminates TLS."""

    port: int
    protocol: Protocol
    port_name: str = ""
    # `ns/host` entries as Istio writes them: `*/foo.example.com`, `./foo.example.com`
    # (already resolved to the Gateway's namespace), bare hosts normalized to `*/host`.
    hosts: tuple[str, ...] = ("*/*",)
    bind: str = ""
    tls: ServerTls | None = None  # None: plaintext (HTTP, HTTP2, GRPC, TCP; or TLS passthrough)
    # Gateway API listener name (`sectionName`), "" for Istio Gateways.
    name: str = ""


@dataclass(frozen=True, slots=True)
class Gateway:
    namespace: str
    name: str
    source: SourceRef = field(compare=False)
    # Routers whose labels match serve this gateway (any namespace, Istio's default).
    selector: Labels = ()
    servers: tuple[GatewayServer, ...] = ()
    # Set: only routers of this namespace serve it (a Gateway API Gateway: its own namespace).
    router_namespace: str = ""

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    @property
    def ref(self) -> str:
        """How a VirtualService's `gateways` names it once resolved: `namespace/name`."""
        return f"{self.namespace}/{self.name}"

    def selects(self, labels: Labels, namespace: str = "") -> bool:
        """Whether a router with `labels` in `namespace` serves this gateway."""
        if self.router_namespace and namespace != self.router_namespace:
            return False
        # Istio: an empty selector selects no router (it would capture every pod otherwise).
        return bool(self.selector) and workload_selector_matches(self.selector, labels)


# The reserved gateway name for sidecars in VirtualService `gateways`.
MESH_GATEWAY = "mesh"

__all__ = ["MESH_GATEWAY", "Gateway", "GatewayServer", "ServerTls", "ServerTlsMode"]
