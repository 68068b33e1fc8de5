"""The agent's DNS server on `<ip>:<dns-port>`, UDP and TCP: thin asyncio adapters around
the sans-IO `Responder` and the `Forwarder`.

Table answers are written from `datagram_received` directly (no task per query: that is the
hot path); forwarded queries get a task each, bounded so a flood of unknown names cannot
exhaust memory (beyond the bound they are answered SERVFAIL at once).

The responder's dnslib part (agent/dns/answers.py) is imported in a thread with the first
query, not with the agent's start: the sockets are bound before the agent is ready, and the
queries that come before the import is done wait for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import struct
from typing import cast

from agent.bindaddr import server_hosts, udp_socket
from agent.dns.forwarder import Forwarder
from agent.dns.responder import Forward, Responder
from pilotfish_common.lifecycle import Lifecycle

logger = logging.getLogger(__name__)

MAX_FORWARDS = 1024
TCP_IDLE_TIMEOUT = 30.0
_ANSWERS = "agent.dns.answers"


class _UdpProtocol(asyncio.DatagramProtocol):
    def __init__(self, server: DnsServer) -> None:
        self._server = server
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        if not self._server.answers_loaded:
            self._server.after_loading(self, data, addr)
            return
        try:
            result = self._server.responder.handle(data, tcp=False)
        except Exception:  # a bug must cost one query, never the server
            logger.exception("DNS query from %s failed", addr)
            result = self._server.responder.servfail(data, echo=False)
        if result is None:
            return
        if isinstance(result, Forward):
            self._server.forward_udp(self, result, addr)
            return
        assert self.transport is not None
        self.transport.sendto(result, addr)

    def error_received(self, exc: Exception) -> None:
        logger.debug("DNS UDP socket error: %s", exc)  # e.g. ICMP unreachable from a client


class DnsServer(Lifecycle):
    """UDP and TCP DNS on one address; `start()`/`close()`, or `async with`."""

    def __init__(self, host: str, port: int, responder: Responder, forwarder: Forwarder) -> None:
        self.host = host
        self.port = port
        self.responder = responder
        self.forwarder = forwarder
        self._udp: asyncio.DatagramTransport | None = None
        self._tcp: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._loading: asyncio.Task[object] | None = None
        # Not sys.modules: a module is there from the start of its import.
        self.answers_loaded = False
        self.dropped_forwards = 0

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        # TCP first: with port 0 it picks the port, and UDP then takes the same number.
        self._tcp = await asyncio.start_server(self._serve_tcp, server_hosts(self.host), self.port)
        self.port = self._tcp.sockets[0].getsockname()[1]
        try:
            sock = udp_socket(self.host, self.port)
            if sock is None:
                transport, _ = await loop.create_datagram_endpoint(
                    lambda: _UdpProtocol(self), local_addr=(self.host, self.port)
                )
            else:
                transport, _ = await loop.create_datagram_endpoint(
                    lambda: _UdpProtocol(self), sock=sock
                )
        except OSError:
            self._tcp.close()
            raise
        self._udp = transport
        logger.info("DNS server on %s:%d (udp, tcp)", self.host, self.port)

    async def close(self) -> None:
        if self._udp is not None:
            self._udp.close()
            self._udp = None
        if self._tcp is not None:
            self._tcp.close()
            self._tcp = None
        tasks = [*self._tasks, *([self._loading] if self._loading is not None else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def load_answers(self) -> None:
        """dnslib and the responder's part that uses it, imported in a thread (once)."""
        if self._loading is None:
            self._loading = asyncio.create_task(
                asyncio.to_thread(importlib.import_module, _ANSWERS)
            )
        await asyncio.shield(self._loading)
        self.answers_loaded = True

    def after_loading(self, proto: _UdpProtocol, data: bytes, addr: tuple[str, int]) -> None:
        """Hand a UDP query to `proto` again once `load_answers` is done."""

        async def answer() -> None:
            await self.load_answers()
            proto.datagram_received(data, addr)

        self._track(asyncio.get_running_loop().create_task(answer()))

    def _track(self, task: asyncio.Task[None]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # --- forwarding ------------------------------------------------------------------------

    def forward_udp(self, proto: _UdpProtocol, fwd: Forward, addr: tuple[str, int]) -> None:
        if len(self._tasks) >= MAX_FORWARDS:
            self.dropped_forwards += 1
            reply = self.responder.servfail(fwd.query)
            if reply is not None and proto.transport is not None:
                proto.transport.sendto(reply, addr)
            return
        self._track(asyncio.get_running_loop().create_task(self._forward_udp(proto, fwd, addr)))

    async def _forward_udp(self, proto: _UdpProtocol, fwd: Forward, addr: tuple[str, int]) -> None:
        reply = await self._resolve(fwd, tcp=False)
        if reply is not None and proto.transport is not None and not proto.transport.is_closing():
            proto.transport.sendto(reply, addr)

    async def _resolve(self, fwd: Forward, *, tcp: bool) -> bytes | None:
        answer = await self.forwarder.forward(fwd.query, tcp=tcp)
        return answer if answer is not None else self.responder.servfail(fwd.query)

    # --- TCP -------------------------------------------------------------------------------

    async def _serve_tcp(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            while True:
                async with asyncio.timeout(TCP_IDLE_TIMEOUT):
                    (length,) = struct.unpack("!H", await reader.readexactly(2))
                    data = await reader.readexactly(length)
                if not self.answers_loaded:
                    await self.load_answers()
                try:
                    result = self.responder.handle(data, tcp=True)
                except Exception:
                    logger.exception("DNS query over TCP failed")
                    result = self.responder.servfail(data, echo=False)
                if isinstance(result, Forward):
                    result = await self._resolve(result, tcp=True)
                if result is None:
                    break  # nothing sensible to say: end the connection instead
                writer.write(struct.pack("!H", len(result)) + result)
                await writer.drain()
        except (asyncio.IncompleteReadError, TimeoutError, ConnectionError):
            pass
        finally:
            self._tasks.discard(task)
            writer.close()
            with contextlib.suppress(OSError, asyncio.CancelledError):
                await writer.wait_closed()
