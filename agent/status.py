"""The agent's HTTP status server on `<ip>:15020` (Istio's pilot-agent status port).

- `GET /healthz/ready`: 200 "ready", or 503 with the reason (the `readiness` callback decides;
  DESIGN: Envoy has accepted LDS+CDS and holds a workload cert). Envoy's readiness listener on
  `<ip>:15021` forwards here, so kubelet probes see one answer.
- `GET /stats/prometheus`: the agent's metrics, then Envoy's (fetched from its admin).
- `POST /quitquitquit`, `POST /drain`: local callers only (see `is_local_caller`).
- `GET /debug/ndsz`: the DNS name table as JSON.
- `GET /app-health/<container>/livez|readyz|startupz`: the app's original probes, run by
  `app_probe` (agent/health/appprobe.py), for the kubelet probes the injector rewrote.
- `GET /debug/handlers`: the ResponseHandlers (type, handler, package, mode, counts) as JSON.

Callbacks keep this module ignorant of the rest of the agent (it is wired in `__main__`).
HTTP is agent/httpio.py's (not aiohttp: see agent/httpwire.py for why).
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping

from agent.httpio import HttpClientError, HttpServer, Request, Response, fetch
from agent.metrics import CONTENT_TYPE, AgentMetrics
from pilotfish_common.lifecycle import Lifecycle

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


class StatusServer(Lifecycle):
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
        handlers: Callable[[], object] = list,
        readiness_timeout: float = 5.0,
        envoy_stats_timeout: float = 5.0,
        app_probe: Callable[[str, Mapping[str, str]], Awaitable[tuple[int, bytes]]] | None = None,
        app_probe_paths: Iterable[str] = (),
    ) -> None:
        """`readiness` returns None when ready, else the reason. `on_drain` should return
        once draining has begun (not after the drain period): the caller waits for it.
        `on_quit` must not block; it typically sets the agent's shutdown event.
        `app_probe(path, request headers)` answers (status, body) for `app_probe_paths`."""
        self.ip = ip
        self.port = port
        self._readiness = readiness
        self._metrics = metrics
        self._envoy_stats_url = envoy_stats_url
        self._on_quit = on_quit
        self._on_drain = on_drain
        self._readiness_timeout = readiness_timeout
        self._envoy_stats_timeout = envoy_stats_timeout
        self._app_probe = app_probe
        # No access log: probes hit /healthz/ready every few seconds for the pod's lifetime.
        routes: dict[str, dict[str, Callable[[Request], Awaitable[Response]]]] = {
            path: {"GET": self._app_health} for path in app_probe_paths if app_probe
        }
        routes.update(
            {
                "/healthz/ready": {"GET": self._ready},
                "/stats/prometheus": {"GET": self._stats},
                "/quitquitquit": {"POST": self._quit},
                "/drain": {"POST": self._drain},
                "/debug/ndsz": {"GET": self._json(ndsz)},
                "/debug/handlers": {"GET": self._json(handlers)},
            }
        )
        self._server = HttpServer(routes)

    async def start(self) -> int:
        """Listen on `ip:port` (port 0: any); the actual port."""
        self.port = await self._server.start(self.ip, self.port)
        logger.info("status server listening on %s:%d", self.ip, self.port)
        return self.port

    async def close(self) -> None:
        await self._server.close()

    async def _ready(self, request: Request) -> Response:
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
            return Response.text("ready\n")
        return Response.text(reason.rstrip("\n") + "\n", 503)

    async def _app_health(self, request: Request) -> Response:
        assert self._app_probe is not None
        status, body = await self._app_probe(request.path, request.head.headers)
        return Response(status, body)

    async def _stats(self, request: Request) -> Response:
        self._metrics.scrapes.inc()
        envoy = await self._envoy_stats()
        # Rendered after the fetch, so this scrape's failure count is in this scrape.
        body = self._metrics.render()
        if envoy:
            if not body.endswith(b"\n"):
                body += b"\n"
            body += envoy
        return Response(200, body, CONTENT_TYPE)

    async def _envoy_stats(self) -> bytes:
        if self._envoy_stats_url is None:
            return b""
        try:
            status, data = await fetch(self._envoy_stats_url, timeout=self._envoy_stats_timeout)
            if status != 200:
                raise HttpClientError(f"HTTP {status}")
            return data
        except (HttpClientError, TimeoutError, OSError) as e:
            # The agent's own metrics are still worth serving (they may say why Envoy is down).
            logger.debug("cannot fetch Envoy stats from %s: %s", self._envoy_stats_url, e)
            self._metrics.scrape_failures.labels(type="envoy").inc()
            return b""

    def _forbidden(self, request: Request) -> Response | None:
        if is_local_caller(request.remote, self.ip):
            return None
        logger.warning("refused %s %s from %s", request.method, request.path, request.remote)
        return Response.text("Only requests from localhost are allowed\n", 403)

    async def _quit(self, request: Request) -> Response:
        if (refused := self._forbidden(request)) is not None:
            return refused
        logger.info("/quitquitquit from %s: shutting down", request.remote)
        self._on_quit()
        return Response.text("OK\n")

    async def _drain(self, request: Request) -> Response:
        if (refused := self._forbidden(request)) is not None:
            return refused
        logger.info("/drain from %s: draining Envoy", request.remote)
        await self._on_drain()
        return Response.text("OK\n")

    @staticmethod
    def _json(view: Callable[[], object]) -> Callable[[Request], Awaitable[Response]]:
        async def serve(request: Request) -> Response:
            body = json.dumps(view(), indent=2, sort_keys=True, default=str) + "\n"
            return Response(200, body.encode(), "application/json")

        return serve
