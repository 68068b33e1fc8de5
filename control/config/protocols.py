"""Port protocol detection, following Istio's rules.

Kubernetes Services: `appProtocol` first, then the port-name convention (`http`, `http-web`,
`grpc-api`, ...), else UNKNOWN (the proxy treats the port as TCP, sniffing is not done).
Istio kinds state the protocol explicitly (`ports[].protocol: HTTP`).

Protocols the model has no dedicated value for map to the closest one Envoy handles the same
way: gRPC-Web is plain HTTP to the proxy, and Mongo/Redis/MySQL are TCP.
"""

from __future__ import annotations

from control.model.types import Protocol

# Istio protocol names (case-insensitive), as accepted by `ports[].protocol`.
_ISTIO: dict[str, Protocol] = {
    "http": Protocol.HTTP,
    "http_proxy": Protocol.HTTP,
    "http2": Protocol.HTTP2,
    "grpc": Protocol.GRPC,
    "grpc-web": Protocol.HTTP,
    "https": Protocol.HTTPS,
    "tls": Protocol.TLS,
    "tcp": Protocol.TCP,
    "mongo": Protocol.TCP,
    "redis": Protocol.TCP,
    "mysql": Protocol.TCP,
}

# Kubernetes `appProtocol` values beyond Istio's names (KEP-3726 standard application protocols).
_APP_PROTOCOL: dict[str, Protocol] = {
    **_ISTIO,
    "kubernetes.io/h2c": Protocol.HTTP2,
    "kubernetes.io/ws": Protocol.HTTP,
    "kubernetes.io/wss": Protocol.HTTPS,
}

UDP = "udp"
ISTIO_NAMES = (
    "HTTP",
    "HTTPS",
    "HTTP2",
    "GRPC",
    "GRPC-WEB",
    "TLS",
    "TCP",
    "MONGO",
    "REDIS",
    "MYSQL",
)


def from_istio_name(value: str) -> Protocol | None:
    """An Istio protocol name (`HTTP`, `grpc`, `MONGO`, ...); None when unknown (or UDP)."""
    return _ISTIO.get(value.lower())


def from_app_protocol(value: str) -> Protocol | None:
    """A Kubernetes `appProtocol`; None when it names nothing we know (fall back to the name)."""
    return _APP_PROTOCOL.get(value.lower())


def from_port_name(name: str) -> Protocol:
    """Istio's port naming convention: `<protocol>[-<suffix>]`, e.g. `http`, `grpc-api`."""
    lowered = name.lower()
    exact = _ISTIO.get(lowered)
    if exact is not None:
        return exact
    if lowered.startswith("grpc-web"):
        return Protocol.HTTP
    prefix, _, _ = lowered.partition("-")
    return _ISTIO.get(prefix, Protocol.UNKNOWN)


def detect_service_port(name: str, app_protocol: str) -> Protocol:
    """The protocol of a Kubernetes Service port."""
    if app_protocol:
        found = from_app_protocol(app_protocol)
        if found is not None:
            return found
    return from_port_name(name)
