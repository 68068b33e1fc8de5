"""Serving an aiohttp application on one `host:port` (the debug views, the injection webhook):
bound where the address says and nowhere else, the bound port answered (port 0 picks one),
and torn down by closing the runner.
"""

from __future__ import annotations

import ssl

from aiohttp import web


async def serve(
    app: web.Application,
    address: str,
    *,
    ssl_context: ssl.SSLContext | None = None,
    shutdown_timeout: float = 60.0,
) -> tuple[web.AppRunner, int]:
    """Start `app` on `address` (`[v6]:port` too); the runner (cleanup() stops it) and the
    bound port. OSError when the address cannot be bound."""
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=shutdown_timeout)
    await runner.setup()
    host, _, port = address.rpartition(":")
    site = web.TCPSite(
        runner, host.strip("[]"), int(port), ssl_context=ssl_context, reuse_address=True
    )
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    sockets = getattr(site._server, "sockets", None) or []
    return runner, int(sockets[0].getsockname()[1]) if sockets else int(port)
