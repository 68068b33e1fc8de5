"""DNS helpers for tests: real queries over real sockets (dnslib for the wire format), a real
upstream DNS server the tests start themselves, and the Debian tools (dig, dnsmasq, dnsperf)
that `make sysdeps` installs."""

from __future__ import annotations

import asyncio
import shutil
import socket
import struct
from collections.abc import Mapping

from dnslib import QTYPE, RCODE, RR, A, DNSRecord

from pilotfish_common.lifecycle import Lifecycle


def require_tool(name: str) -> str:
    """The path of a Debian tool the suite needs. Fails (never skips): CI installs them
    (`make sysdeps`), so a missing one is a broken machine, not an optional feature."""
    path = shutil.which(name)
    if path is None:
        raise AssertionError(
            f"{name} is not installed: run `make sysdeps` (apt-get install dnsutils "
            "dnsmasq-base dnsperf)"
        )
    return path


async def query(
    host: str,
    port: int,
    name: str,
    qtype: str = "A",
    *,
    tcp: bool = False,
    edns: int | None = None,
    timeout: float = 5.0,
) -> DNSRecord:
    """Ask `host:port` one question and return the parsed reply."""
    q = DNSRecord.question(name, qtype)
    if edns is not None:
        from dnslib import EDNS0

        q.add_ar(EDNS0(udp_len=edns))
    raw = await exchange(host, port, q.pack(), tcp=tcp, timeout=timeout)
    reply = DNSRecord.parse(raw)
    assert reply.header.id == q.header.id
    return reply


async def exchange(
    host: str, port: int, data: bytes, *, tcp: bool = False, timeout: float = 5.0
) -> bytes:
    """Send raw bytes as one DNS message and return the raw reply."""
    async with asyncio.timeout(timeout):
        if tcp:
            reader, writer = await asyncio.open_connection(host, port)
            try:
                writer.write(struct.pack("!H", len(data)) + data)
                await writer.drain()
                (n,) = struct.unpack("!H", await reader.readexactly(2))
                return await reader.readexactly(n)
            finally:
                writer.close()
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            sock.setblocking(False)
            sock.connect((host, port))
            await loop.sock_sendall(sock, data)
            return await loop.sock_recv(sock, 65535)
        finally:
            sock.close()


def addresses(reply: DNSRecord, qtype: str = "A") -> list[str]:
    return [str(rr.rdata) for rr in reply.rr if rr.rtype == getattr(QTYPE, qtype)]


def rcode(reply: DNSRecord) -> str:
    return str(RCODE.get(reply.header.rcode))


class _UpstreamUdp(asyncio.DatagramProtocol):
    def __init__(self, server: UpstreamDns) -> None:
        self.server = server
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.server.queries += 1
        assert self.transport is not None
        self.transport.sendto(self.server.answer(data), addr)


class UpstreamDns(Lifecycle):
    """A small DNS server (UDP and TCP) for names outside the mesh: answers the
    A records in `records`, NXDOMAIN for anything else."""

    def __init__(self, host: str, records: Mapping[str, str], port: int = 0) -> None:
        self.host = host
        self.port = port
        self.records = {k.lower().rstrip("."): v for k, v in records.items()}
        self.queries = 0
        self._udp: asyncio.DatagramTransport | None = None
        self._tcp: asyncio.Server | None = None

    def answer(self, data: bytes) -> bytes:
        q = DNSRecord.parse(data)
        reply = q.reply()
        reply.header.aa = 0  # it stands in for a recursive resolver
        name = str(q.q.qname).lower().rstrip(".")
        ip = self.records.get(name)
        if ip is None:
            reply.header.rcode = RCODE.NXDOMAIN
        elif q.q.qtype == QTYPE.A:
            reply.add_answer(RR(q.q.qname, QTYPE.A, ttl=60, rdata=A(ip)))
        packed: bytes = reply.pack()
        return packed

    async def _tcp_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            (n,) = struct.unpack("!H", await reader.readexactly(2))
            self.queries += 1
            out = self.answer(await reader.readexactly(n))
            writer.write(struct.pack("!H", len(out)) + out)
            await writer.drain()
        finally:
            writer.close()

    async def start(self) -> None:
        self._tcp = await asyncio.start_server(self._tcp_client, self.host, self.port)
        self.port = self._tcp.sockets[0].getsockname()[1]
        loop = asyncio.get_running_loop()
        self._udp, _ = await loop.create_datagram_endpoint(
            lambda: _UpstreamUdp(self), local_addr=(self.host, self.port)
        )

    async def close(self) -> None:
        if self._udp is not None:
            self._udp.close()
        if self._tcp is not None:
            self._tcp.close()
            await self._tcp.wait_closed()
