"""Forwarding queries the name table does not answer to the upstream resolvers.

A query goes upstream over the transport the client used (a UDP answer with TC set is relayed
as is, and the client retries over TCP, which is forwarded over TCP). Upstreams are tried in
order; each attempt has its own timeout. None means no upstream answered: the server replies
SERVFAIL.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
import struct
from collections.abc import Iterable
from dataclasses import dataclass

logger = logging.getLogger(__name__)

DNS_PORT = 53


@dataclass(frozen=True, slots=True, eq=False)
class Upstream:
    """An upstream resolver's address."""

    host: str
    port: int = DNS_PORT

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_upstream(text: str) -> Upstream:
    """`HOST`, `HOST:PORT`, `[V6]:PORT` or a bare IPv6 address (as resolv.conf writes it)."""
    text = text.strip()
    host, port = text, DNS_PORT
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise ValueError(f"DNS upstream {text!r} is not [IPV6]:PORT")
        if rest:
            port = _port(text, rest[1:])
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
        port = _port(text, port_text)
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(f"DNS upstream {text!r}: {host!r} is not an IP address") from None
    return Upstream(host, port)


def _port(text: str, value: str) -> int:
    if not value.isdigit() or not 0 < int(value) < 65536:
        raise ValueError(f"DNS upstream {text!r}: bad port {value!r}")
    return int(value)


class Forwarder:
    def __init__(self, upstreams: Iterable[Upstream], timeout: float = 2.0) -> None:
        self.upstreams = tuple(upstreams)
        self.timeout = timeout
        self.failures = 0

    async def forward(self, query: bytes, *, tcp: bool) -> bytes | None:
        for upstream in self.upstreams:
            try:
                async with asyncio.timeout(self.timeout):
                    if tcp:
                        return await _over_tcp(upstream, query)
                    return await _over_udp(upstream, query)
            except (OSError, TimeoutError, asyncio.IncompleteReadError) as e:
                logger.debug("upstream %s failed: %s", upstream, e or type(e).__name__)
        self.failures += 1
        return None


async def _over_udp(upstream: Upstream, query: bytes) -> bytes:
    """One fresh socket per query: the kernel picks a random source port, so a spoofed answer
    must guess it as well as the id, and no id bookkeeping is shared between queries."""
    loop = asyncio.get_running_loop()
    family = socket.AF_INET6 if ":" in upstream.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_DGRAM)
    try:
        sock.setblocking(False)
        sock.connect((upstream.host, upstream.port))  # UDP connect: no packets, no waiting
        await loop.sock_sendall(sock, query)
        while True:
            answer = await loop.sock_recv(sock, 65535)
            # Same id and question as the query, else it is not our answer: keep waiting.
            if len(answer) >= 12 and answer[:2] == query[:2] and answer[4:6] == query[4:6]:
                return answer
    finally:
        sock.close()


async def _over_tcp(upstream: Upstream, query: bytes) -> bytes:
    reader, writer = await asyncio.open_connection(upstream.host, upstream.port)
    try:
        writer.write(struct.pack("!H", len(query)) + query)
        await writer.drain()
        (length,) = struct.unpack("!H", await reader.readexactly(2))
        return await reader.readexactly(length)
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
