"""Property: whatever arrives on the agent's DNS sockets (random bytes, valid queries with bytes
flipped, cut or appended), the server never crashes and every reply is a well-formed DNS
response to the query it answers. Real UDP and TCP sockets; the server runs on its own event
loop in a thread so hypothesis can drive it from a plain test."""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
from collections.abc import Iterator

import pytest
from dnslib import EDNS0, QTYPE, DNSHeader, DNSQuestion, DNSRecord
from hypothesis import given
from hypothesis import strategies as st

from agent.dns.forwarder import Forwarder
from agent.dns.responder import Responder
from agent.dns.server import DnsServer
from agent.dns.table import LookupTable, NameInfo, kubernetes_search_domains
from tests.support.fuzz import fuzz_settings
from tests.support.net import pod_ip

ROWS = {
    "backend.default.svc.cluster.local": NameInfo(
        ("10.0.0.1",), "Kubernetes", "backend", "default"
    ),
    "*.example.com": NameInfo(("10.0.0.2", "fd00::2"), "External"),
    "big.example.org": NameInfo(tuple(f"10.1.0.{i}" for i in range(1, 80)), "External"),
}


class ServerThread:
    def __init__(self) -> None:
        self.ip = pod_ip()
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._loop.run_until_complete, args=(self._run(),))
        self.server: DnsServer | None = None

    async def _run(self) -> None:
        responder = Responder()
        responder.table = LookupTable.build(
            ROWS,
            namespace="default",
            search_domains=kubernetes_search_domains("default", "cluster.local"),
        )
        # No upstreams: whatever is forwarded fails at once (SERVFAIL), keeping the run fast.
        self.server = DnsServer(self.ip, 0, responder, Forwarder(()))
        self._stop = asyncio.Event()
        async with self.server:
            self.port = self.server.port
            self._ready.set()
            await self._stop.wait()

    def start(self) -> None:
        self._thread.start()
        assert self._ready.wait(10)

    def stop(self) -> None:
        assert self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)
        self._loop.close()


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    s = ServerThread()
    s.start()
    yield s
    s.stop()


def check_reply(raw: bytes) -> DNSRecord:
    reply = DNSRecord.parse(raw)  # raises on anything malformed
    assert reply.header.qr == 1
    assert len(raw) <= 65535
    return reply


def probe_roundtrip(server: ServerThread, sock: socket.socket, packet: bytes) -> None:
    """Send `packet`, then a known-good probe; every reply read before the probe's must be
    well formed, and the probe must be answered (the server is alive)."""
    probe = DNSRecord.question("backend")
    sock.send(packet)
    sock.send(probe.pack())
    while True:
        raw = sock.recv(65535)
        reply = check_reply(raw)
        if reply.header.id == probe.header.id and str(reply.q.qname) == "backend.":
            assert [str(rr.rdata) for rr in reply.rr] == ["10.0.0.1"]
            return
        if len(packet) >= 2:
            # Any other reply answers the packet (or an earlier one's forward): ids match.
            assert raw[:2] in (packet[:2], *server_seen_ids), raw[:2]


server_seen_ids: set[bytes] = set()

valid_queries = st.builds(
    lambda name, qtype, edns, qid: _query(name, qtype, edns, qid),
    st.sampled_from(
        [
            "backend",
            "backend.default.svc.cluster.local",
            "a.example.com",
            "big.example.org",
            "unknown.test",
            "backend.default.svc.cluster.local.svc.cluster.local",
        ]
    ),
    st.sampled_from(["A", "AAAA", "MX", "TXT", "ANY", "CNAME"]),
    st.sampled_from([0, 512, 1232, 4096, 100]),
    st.integers(0, 65535),
)


def _query(name: str, qtype: str, edns: int, qid: int) -> bytes:
    # Not DNSRecord.question(): it draws the id from `random`, which hypothesis forbids.
    q = DNSRecord(DNSHeader(id=qid, rd=1), q=DNSQuestion(name, getattr(QTYPE, qtype)))
    if edns:
        q.add_ar(EDNS0(udp_len=edns))
    return bytes(q.pack())


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(valid_queries))
    for _ in range(draw(st.integers(1, 6))):
        op = draw(st.sampled_from(["flip", "cut", "append", "insert"]))
        if op == "flip" and data:
            i = draw(st.integers(0, len(data) - 1))
            data[i] = draw(st.integers(0, 255))
        elif op == "cut" and data:
            del data[draw(st.integers(0, len(data) - 1)) :]
        elif op == "append":
            data += draw(st.binary(max_size=40))
        elif op == "insert":
            i = draw(st.integers(0, len(data)))
            data[i:i] = draw(st.binary(min_size=1, max_size=8))
    return bytes(data)


packets = st.one_of(st.binary(max_size=600), valid_queries, mutated())


@fuzz_settings(400)
@given(packet=packets)
def test_udp_random_and_mutated_packets(server: ServerThread, packet: bytes) -> None:
    server_seen_ids.add(packet[:2])
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(5)
        sock.connect((server.ip, server.port))
        probe_roundtrip(server, sock, packet)


@fuzz_settings(150)
@given(packet=packets)
def test_tcp_random_and_mutated_packets(server: ServerThread, packet: bytes) -> None:
    """Framed as TCP DNS: the reply (if any) is well formed; a connection the server ends
    is fine, a server that stops answering new connections is not."""
    with socket.create_connection((server.ip, server.port), timeout=5) as sock:
        sock.sendall(struct.pack("!H", len(packet)) + packet)
        head = _recv_exactly(sock, 2)
        if head:
            (n,) = struct.unpack("!H", head)
            check_reply(_recv_exactly(sock, n))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(5)
        sock.connect((server.ip, server.port))
        probe_roundtrip(server, sock, b"")


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            return b""
        out += chunk
    return out
