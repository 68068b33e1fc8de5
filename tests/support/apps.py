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
    caller can see which identity the request arrived with."""

    name: str
    host: str
    port: int
    requests: int = 0
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
