"""Small real HTTP backends for tests and the demo: each answers with its own name."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

from aiohttp import web


@dataclass
class EchoApp:
    """An HTTP server that replies `{"app": name, "host": ..., "path": ..., "xfcc": ...}`;
    `xfcc` is the `x-forwarded-client-cert` header its sidecar added (None without one), so a
    caller can see which identity the request arrived with.

    `fail_every=N` makes every Nth request fail with `fail_status` (1: every request), for
    tests of retries and outlier detection; `failures` counts them."""

    name: str
    host: str
    port: int
    fail_every: int = 0
    fail_status: int = 500
    requests: int = 0
    failures: int = 0
    headers_seen: list[dict[str, str]] = field(default_factory=list)
    _runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port, reuse_address=True).start()

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _handle(self, request: web.Request) -> web.Response:
        self.requests += 1
        if self.fail_every and self.requests % self.fail_every == 0:
            self.failures += 1
            return web.Response(status=self.fail_status, text=f"{self.name} failed")
        delay = float(request.query.get("delay", "0") or 0)
        if delay > 0:  # a slow request, to test draining with requests in flight
            await asyncio.sleep(min(delay, 30.0))
        self.headers_seen.append(dict(request.headers))
        body = {
            "app": self.name,
            "host": request.host,
            "path": request.path,
            "xfcc": request.headers.get("x-forwarded-client-cert"),
        }
        return web.Response(text=json.dumps(body), content_type="application/json")


@dataclass
class TcpEchoApp:
    """A TCP server that greets each connection with `<name>\\n`, then echoes what it gets."""

    name: str
    host: str
    port: int
    connections: int = 0
    _server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._handle, self.host, self.port, reuse_address=True
        )

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            writer.write(f"{self.name}\n".encode())
            await writer.drain()
            while data := await reader.read(4096):
                writer.write(data)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()
