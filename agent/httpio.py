"""asyncio adapters for agent/httpwire.py: a small HTTP/1.1 server (the status server's) and
a one-shot client (for Envoy's admin API). Keep-alive on the server side, because Envoy's
readiness listener forwards kubelet's probes over pooled connections."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from agent.bindaddr import server_hosts
from agent.httpwire import (
    MAX_HEAD,
    HttpWireError,
    RequestHead,
    chunk_size,
    parse_request_head,
    parse_response_head,
    render_request,
    render_response,
)

logger = logging.getLogger(__name__)

IDLE_TIMEOUT = 75.0  # seconds a kept-alive connection may wait for its next request


@dataclass(frozen=True, slots=True, eq=False)
class Request:
    """A request to the HTTP server: its head and the caller's IP."""

    head: RequestHead
    remote: str | None  # the caller's IP

    @property
    def method(self) -> str:
        return self.head.method

    @property
    def path(self) -> str:
        return self.head.path


@dataclass(frozen=True, slots=True, eq=False)
class Response:
    """What an HTTP server route answers."""

    status: int = 200
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"

    @classmethod
    def text(cls, text: str, status: int = 200) -> Response:
        return cls(status, text.encode())


Handler = Callable[[Request], Awaitable[Response]]


class HttpServer:
    """Serves `routes` ({path: {method: handler}}) on host:port. A GET route answers HEAD
    too; a known path with another method gets 405, an unknown one 404."""

    def __init__(self, routes: Mapping[str, Mapping[str, Handler]]) -> None:
        self._routes = {path: dict(methods) for path, methods in routes.items()}
        for methods in self._routes.values():
            if "GET" in methods:
                methods.setdefault("HEAD", methods["GET"])
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    async def start(self, host: str, port: int) -> int:
        """Listen; the port (given, or picked when 0)."""
        self._server = await asyncio.start_server(
            self._serve, server_hosts(host), port, limit=MAX_HEAD
        )
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        await self._server.wait_closed()
        self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        peer = writer.get_extra_info("peername")
        remote = str(peer[0]) if isinstance(peer, tuple) and peer else None
        try:
            while await self._one(reader, writer, remote):
                pass
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError):
            pass  # the client went away, or stayed idle too long
        finally:
            self._connections.discard(task)
            writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await writer.wait_closed()

    async def _one(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, remote: str | None
    ) -> bool:
        """Serve one request; whether the connection stays open for another."""
        try:
            async with asyncio.timeout(IDLE_TIMEOUT):
                raw = await reader.readuntil(b"\r\n\r\n")
            head = parse_request_head(raw)
            body_length = head.body_length()
        except asyncio.LimitOverrunError:
            writer.write(render_response(431, b"request head too large\n", keep_alive=False))
            return False
        except HttpWireError as e:
            writer.write(render_response(400, f"{e}\n".encode(), keep_alive=False))
            return False
        if body_length:
            await reader.readexactly(body_length)  # no endpoint reads a body
        response = await self._dispatch(Request(head, remote))
        keep_alive = head.keep_alive
        writer.write(
            render_response(
                response.status,
                response.body,
                response.content_type,
                keep_alive=keep_alive,
                head_only=head.method == "HEAD",
            )
        )
        await writer.drain()
        return keep_alive

    async def _dispatch(self, request: Request) -> Response:
        methods = self._routes.get(request.path)
        if methods is None:
            return Response.text("404: Not Found\n", 404)
        handler = methods.get(request.method)
        if handler is None:
            return Response.text("405: Method Not Allowed\n", 405)
        try:
            return await handler(request)
        except Exception:
            logger.exception("%s %s failed", request.method, request.path)
            return Response.text("500: Internal Server Error\n", 500)


class HttpClientError(Exception):
    """The server's answer was not HTTP we understand, or it ended early."""


async def fetch(url: str, method: str = "GET", timeout: float = 5.0) -> tuple[int, bytes]:
    """(status, body) of one request to `url` (http:// only); OSError when the server
    cannot be reached, TimeoutError after `timeout`, HttpClientError for a bad answer."""
    parts = urlsplit(url)
    if parts.scheme != "http" or parts.hostname is None:
        raise ValueError(f"not an http:// URL: {url!r}")
    target = parts.path or "/"
    if parts.query:
        target += "?" + parts.query
    async with asyncio.timeout(timeout):
        reader, writer = await asyncio.open_connection(parts.hostname, parts.port or 80)
        try:
            writer.write(render_request(method, parts.netloc, target))
            return await _read_response(reader, head_only=method == "HEAD")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, HttpWireError) as e:
            raise HttpClientError(f"{method} {url}: {e}") from None
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await writer.wait_closed()


async def _read_response(reader: asyncio.StreamReader, *, head_only: bool) -> tuple[int, bytes]:
    head = parse_response_head(await reader.readuntil(b"\r\n\r\n"))
    if head_only or head.status in (204, 304) or 100 <= head.status < 200:
        return head.status, b""
    if head.chunked:
        chunks = []
        while size := chunk_size(await reader.readuntil(b"\r\n")):
            chunks.append((await reader.readexactly(size + 2))[:-2])
        while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers
            pass
        return head.status, b"".join(chunks)
    length = head.body_length()
    if length is None:
        return head.status, await reader.read()
    return head.status, await reader.readexactly(length)
