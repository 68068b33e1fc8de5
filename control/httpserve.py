"""Serving an aiohttp application on one `host:port` (the debug views, the injection webhook):
bound where the address says and nowhere else, the bound port answered (port 0 picks one),
stopped by close().
"""

from __future__ import annotations

import ssl

from aiohttp import web


class AppServer:
    """One aiohttp application on one address: `await start(app, address)` answers the bound
    port; `close()` stops serving (and does nothing when not started)."""

    def __init__(self) -> None:
        self._runner: web.AppRunner | None = None

    async def start(
        self,
        app: web.Application,
        address: str,
        *,
        ssl_context: ssl.SSLContext | None = None,
        shutdown_timeout: float = 60.0,
    ) -> int:
        """Start `app` on `address` (`[v6]:port` too). OSError when it cannot be bound."""
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=shutdown_timeout)
        await runner.setup()
        self._runner = runner
        host, _, port = address.rpartition(":")
        site = web.TCPSite(
            runner, host.strip("[]"), int(port), ssl_context=ssl_context, reuse_address=True
        )
        await site.start()
        sockets = getattr(site._server, "sockets", None) or []
        return int(sockets[0].getsockname()[1]) if sockets else int(port)

    async def close(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
