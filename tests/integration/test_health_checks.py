"""The probe checks against real local sockets (agent/health/checks.py, checker.run_check):
HTTP status ranges, headers, refused connections, timeouts, TCP connect, gRPC health."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest
from google.protobuf import wrappers_pb2

from agent.health import checks
from agent.health.checker import ProbeSpec, run_check
from agent.health.prober import Schedule
from tests.support.net import free_port


@pytest.fixture
async def http() -> AsyncIterator[tuple[int, dict[str, object]]]:
    """An HTTP server answering with state["status"]; state["request"] is the last request."""
    state: dict[str, object] = {"status": 200}

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        state["request"] = await reader.readuntil(b"\r\n\r\n")
        if state["status"] == "hang":
            await asyncio.sleep(30)
        writer.write(f"HTTP/1.1 {state['status']} X\r\nContent-Length: 0\r\n\r\n".encode())
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield port, state
    finally:
        server.close()


async def test_http_status_ranges_and_headers(http: tuple[int, dict[str, object]]) -> None:
    port, state = http
    for status, ok in ((200, True), (302, True), (399, True), (404, False), (500, False)):
        state["status"] = status
        error = await checks.http_get("127.0.0.1", port, "/ready", headers=(("X-Probe", "1"),))
        assert (error is None) is ok, (status, error)
    request = state["request"]
    assert isinstance(request, bytes)
    assert request.startswith(b"GET /ready HTTP/1.1\r\n")
    assert b"X-Probe: 1\r\n" in request and f"Host: 127.0.0.1:{port}".encode() in request
    assert "status 500" in str(await checks.http_get("127.0.0.1", port, "/ready"))


async def test_refused_and_timed_out(http: tuple[int, dict[str, object]]) -> None:
    port, state = http
    closed = free_port()
    assert await checks.tcp_connect("127.0.0.1", closed) is not None
    assert await checks.http_get("127.0.0.1", closed) is not None
    assert await checks.tcp_connect("127.0.0.1", port) is None
    state["status"] = "hang"
    spec = ProbeSpec("http_get", "127.0.0.1", port, Schedule(timeout=0.2), path="/")
    assert "timed out" in str(await run_check(spec))


async def test_grpc_health_check() -> None:
    """A gRPC server with the standard health service: SERVING passes, NOT_SERVING and a
    service it does not know fail, as does a port with no server."""
    statuses = {"": 1, "down": 2}

    def check(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        service = wrappers_pb2.StringValue.FromString(request).value
        if service not in statuses:
            context.set_code(grpc.StatusCode.NOT_FOUND)
            return b""
        return wrappers_pb2.Int32Value(value=statuses[service]).SerializeToString()

    handler = grpc.method_handlers_generic_handler(
        "grpc.health.v1.Health", {"Check": grpc.unary_unary_rpc_method_handler(check)}
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        assert await checks.grpc_health("127.0.0.1", port) is None
        assert "NOT_SERVING" in str(await checks.grpc_health("127.0.0.1", port, "down"))
        assert "NOT_FOUND" in str(await checks.grpc_health("127.0.0.1", port, "other"))
        assert "UNAVAILABLE" in str(await checks.grpc_health("127.0.0.1", free_port()))
    finally:
        await server.stop(0)
