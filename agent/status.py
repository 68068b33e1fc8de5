"""The agent's HTTP status server on `<ip>:15020` (Istio's pilot-agent status port).

- `GET /healthz/ready`: 200 "ready", or 503 with the reason (the `readiness` callback decides;
  DESIGN: Envoy has accepted LDS+CDS and holds a workload cert). Envoy's readiness listener on
  `<ip>:15021` forwards here, so kubelet probes see one answer.
- `GET /stats/prometheus`: the agent's metrics, then Envoy's (fetched from its admin).
- `POST /quitquitquit`, `POST /drain`: local callers only (see `is_local_caller`).
- `GET /debug/ndsz`: the DNS name table as JSON.

Callbacks keep this module ignorant of the rest of the agent (it is wired in `__main__`).
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
from collections.abc import Awaitable, Callable
from types import TracebackType

import aiohttp
from aiohttp import web

from agent.metrics import CONTENT_TYPE, AgentMetrics

logger = logging.getLogger(__name__)

_LOOPBACK = (ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1"))


def is_local_caller(remote: str | None, pod_ip: str) -> bool:
    """Whether a caller may use the endpoints that stop or drain the pod.

    Istio allows loopback callers. Here every pod of a machine is a 127/8 address (DESIGN,
    "Local pods on one machine"), so "loopback" would let any pod stop any other. Allowed:
    127.0.0.1 and ::1 (what a process in the pod, or on a host where the pod IP is not
    loopback, connects from by default) and the pod IP itself (a caller in the same pod
    that connects to the pod IP, or binds it). Other addresses, 127/8 ones included, are not.
    """
    if not remote:
        return False
    try:
        addr = ipaddress.ip_address(remote.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    if addr in _LOOPBACK:
        return True
    try:
        return addr == ipaddress.ip_address(pod_ip)
    except ValueError:
        return False


class StatusServer:
    def __init__(
        self,
        ip: str,
        port: int,
        *,
        readiness: Callable[[], Awaitable[str | None]],
        metrics: AgentMetrics,
        envoy_stats_url: str | None,
        on_quit: Callable[[], None],
        on_drain: Callable[[], Awaitable[None]],
        ndsz: Callable[[], object],
        readiness_timeout: float = 5.0,
        envoy_stats_timeout: float = 5.0,
    ) -> None:
        """`readiness` returns None when ready, else the reason. `on_drain` should return
        once draining has begun (not after the drain period): the caller waits for it.
        `on_quit` must not block; it typically sets the agent's shutdown event."""
        self.ip = ip
        self.port = port
        self._readiness = readiness
        self._metrics = metrics
        self._envoy_stats_url = envoy_stats_url
        self._on_quit = on_quit
        self._on_drain = on_drain
        self._ndsz = ndsz
        self._readiness_timeout = readiness_timeout
        self._envoy_stats_timeout = envoy_stats_timeout
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        app = web.Application()
        app.router.add_get("/healthz/ready", self._ready)
        app.router.add_get("/stats/prometheus", self._stats)
        app.router.add_post("/quitquitquit", self._quit)
        app.router.add_post("/drain", self._drain)
        app.router.add_get("/debug/ndsz", self._ndsz_handler)
        self._app = app

    async def start(self) -> int:
        """Listen on `ip:port` (port 0: any); the actual port."""
        if self._envoy_stats_url is not None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self._envoy_stats_timeout)
            )
        # No access log: probes hit /healthz/ready every few seconds for the pod's lifetime.
        runner = web.AppRunner(self._app, access_log=None, handle_signals=False)
        await runner.setup()
        try:
            await web.TCPSite(runner, self.ip, self.port).start()
        except BaseException:
            await runner.cleanup()
            await self._close_session()
            raise
        self._runner = runner
        addr = runner.addresses[0]
        self.port = int(addr[1])
        logger.info("status server listening on %s:%d", self.ip, self.port)
        return self.port

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        await self._close_session()

    async def _close_session(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> StatusServer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def _ready(self, request: web.Request) -> web.Response:
        try:
            async with asyncio.timeout(self._readiness_timeout):
                reason = await self._readiness()
        except TimeoutError:
            reason = "readiness check timed out"
        except Exception as e:
            # A broken check must read as "not ready", never as a 500 a probe may misjudge.
            logger.exception("readiness check failed")
            reason = f"readiness check failed: {e}"
        if reason is None:
            return web.Response(text="ready\n")
        return web.Response(status=503, text=reason.rstrip("\n") + "\n")

    async def _stats(self, request: web.Request) -> web.Response:
        self._metrics.scrapes.inc()
        envoy = await self._envoy_stats()
        # Rendered after the fetch, so this scrape's failure count is in this scrape.
        body = self._metrics.render()
        if envoy:
            if not body.endswith(b"\n"):
                body += b"\n"
            body += envoy
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})

    async def _envoy_stats(self) -> bytes:
        if self._envoy_stats_url is None or self._session is None:
            return b""
        try:
            async with self._session.get(self._envoy_stats_url) as r:
                data = await r.read()
                if r.status != 200:
                    raise aiohttp.ClientResponseError(
                        r.request_info, r.history, status=r.status, message="unexpected status"
                    )
                return data
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            # The agent's own metrics are still worth serving (they may say why Envoy is down).
            logger.debug("cannot fetch Envoy stats from %s: %s", self._envoy_stats_url, e)
            self._metrics.scrape_failures.labels(type="envoy").inc()
            return b""

    def _forbidden(self, request: web.Request) -> web.Response | None:
        if is_local_caller(request.remote, self.ip):
            return None
        logger.warning("refused %s %s from %s", request.method, request.path, request.remote)
        return web.Response(status=403, text="Only requests from localhost are allowed\n")

    async def _quit(self, request: web.Request) -> web.Response:
        if (refused := self._forbidden(request)) is not None:
            return refused
        logger.info("/quitquitquit from %s: shutting down", request.remote)
        self._on_quit()
        return web.Response(text="OK\n")

    async def _drain(self, request: web.Request) -> web.Response:
        if (refused := self._forbidden(request)) is not None:
            return refused
        logger.info("/drain from %s: draining Envoy", request.remote)
        await self._on_drain()
        return web.Response(text="OK\n")

    async def _ndsz_handler(self, request: web.Request) -> web.Response:
        return web.Response(
            text=json.dumps(self._ndsz(), indent=2, sort_keys=True, default=str) + "\n",
            content_type="application/json",
        )
