"""Where connections go: Envoy socket and pipe addresses and what
a Sidecar ingress `defaultEndpoint` means as an upstream.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from envoy.config.core.v3.address_pb2 import Address, Pipe, SocketAddress

from pilotfish_common.addresses import is_ip as is_ip  # re-exported for the generators

# Istio's answer when a Sidecar ingress has no defaultEndpoint: the app on loopback. The pod IP
# (Istio's newer default) cannot work in interception mode NONE, where the inbound listener
# itself is bound there.
DEFAULT_INBOUND_HOST: Final = "127.0.0.1"


@dataclass(frozen=True, slots=True)
class Upstream:
    """Where a connection goes: host:port, or a Unix socket when `pipe` is set."""

    host: str = ""
    port: int = 0
    pipe: str = ""

    def address(self) -> Address:
        if self.pipe:
            return Address(pipe=Pipe(path=self.pipe))
        return socket_address(self.host, self.port)

    def __str__(self) -> str:
        return f"unix://{self.pipe}" if self.pipe else f"{self.host}:{self.port}"


def socket_address(host: str, port: int) -> Address:
    return Address(socket_address=SocketAddress(address=host, port_value=port))


def parse_default_endpoint(value: str, proxy_ip: str, port: int) -> Upstream | None:
    """Istio's `ingress[].defaultEndpoint`: `0.0.0.0:PORT` is the app at the pod IP,
    `unix:///path` a Unix socket, any other `IP:PORT` literal. None when malformed."""
    if not value:
        return Upstream(DEFAULT_INBOUND_HOST, port)
    if value.startswith("unix://"):
        path = value.removeprefix("unix://")
        return Upstream(pipe=path) if path else None
    host, sep, port_text = value.rpartition(":")
    if not sep or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        return None
    host = host.removeprefix("[").removesuffix("]")
    if not is_ip(host):
        return None
    if host in ("0.0.0.0", "::"):
        host = proxy_ip
    return Upstream(host, int(port_text))


# Where captured inbound connections arrive (REDIRECT): the listener is bound to every address.
WILDCARD_BIND: Final = "0.0.0.0"
WILDCARD_BIND_IPV6: Final = "::"
