"""A stand-in for an agent's status port serving Istio's standard metrics
(`<ip>:15020/stats/prometheus`) with counters that rise with time: client → backend at 20
rps, a quarter of it 503s, and a caller with a hostile name at 2 rps; all reported by the
server (`reporter="destination"`, mutual TLS). For the dashboard's tests of what it does with
series it could not get from real agents (hostile names, exact rates)."""

from __future__ import annotations

import json
import time

from aiohttp import web

HOSTILE = "<img src=x onerror=window.__pwned=1>"


def _flow(src: str, code: str) -> str:
    labels = {
        "reporter": "destination",
        "source_workload": src,
        "source_workload_namespace": "default",
        "destination_workload": "backend",
        "destination_workload_namespace": "default",
        "destination_service": "backend.default.svc.cluster.local",
        "destination_service_name": "backend",
        "destination_service_namespace": "default",
        "request_protocol": "http",
        "response_code": code,
        "connection_security_policy": "mutual_tls",
    }
    return ",".join(f"{k}={json.dumps(v)}" for k, v in labels.items())


class StatusPort:
    def __init__(self, ip: str) -> None:
        self.ip = ip
        self.started = time.monotonic()
        self.scrapes = 0
        self._runner: web.AppRunner | None = None

    def text(self) -> str:
        t = time.monotonic() - self.started
        lines = ["# TYPE istio_requests_total counter"]
        for src, code, rate in (("client", "200", 15), ("client", "503", 5), (HOSTILE, "200", 2)):
            lines.append(f"istio_requests_total{{{_flow(src, code)}}} {int(rate * t)}")
        lines.append("# TYPE envoy_server_live gauge\nenvoy_server_live 1")
        return "\n".join(lines) + "\n"

    async def _metrics(self, request: web.Request) -> web.Response:
        self.scrapes += 1
        return web.Response(text=self.text())

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/stats/prometheus", self._metrics)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.ip, 15020).start()

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
