"""The agent's status server over real sockets: readiness, merged metrics, local-only
controls, ndsz."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from agent.metrics import AgentMetrics
from agent.status import StatusServer, is_local_caller
from tests.support.net import pod_ip

ENVOY_STATS = (
    b"# TYPE envoy_cluster_upstream_cx_total counter\n"
    b'envoy_cluster_upstream_cx_total{envoy_cluster_name="xds-grpc"} 3\n'
)


class Calls:
    def __init__(self) -> None:
        self.ready: str | None = "no LDS yet"
        self.quit = 0
        self.drain = 0

    async def readiness(self) -> str | None:
        return self.ready

    def on_quit(self) -> None:
        self.quit += 1

    async def on_drain(self) -> None:
        self.drain += 1


@asynccontextmanager
async def status_server(
    ip: str = "127.0.0.1",
    *,
    calls: Calls | None = None,
    metrics: AgentMetrics | None = None,
    envoy_stats_url: str | None = None,
    readiness: Callable[[], Awaitable[str | None]] | None = None,
    **kw: Any,
) -> AsyncIterator[tuple[str, Calls, AgentMetrics]]:
    calls = calls or Calls()
    metrics = metrics or AgentMetrics()
    server = StatusServer(
        ip,
        0,
        readiness=readiness or calls.readiness,
        metrics=metrics,
        envoy_stats_url=envoy_stats_url,
        on_quit=calls.on_quit,
        on_drain=calls.on_drain,
        ndsz=lambda: {"table": {"web.shop.svc.cluster.local": {"ips": ["127.0.1.7"]}}},
        **kw,
    )
    async with server:
        assert server.port != 0
        yield f"http://{ip}:{server.port}", calls, metrics


async def request(
    method: str, url: str, *, source: str | None = None
) -> tuple[int, str, dict[str, str]]:
    connector = aiohttp.TCPConnector(local_addr=(source, 0) if source else None)
    async with (
        aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=5)) as s,
        s.request(method, url) as r,
    ):
        return r.status, await r.text(), dict(r.headers)


async def test_readiness_reports_the_reason_until_ready() -> None:
    async with status_server() as (url, calls, _):
        status, text, _ = await request("GET", url + "/healthz/ready")
        assert (status, text) == (503, "no LDS yet\n")
        calls.ready = None
        status, text, _ = await request("GET", url + "/healthz/ready")
        assert (status, text) == (200, "ready\n")


async def test_a_failing_or_hanging_readiness_check_is_not_ready() -> None:
    async def broken() -> str | None:
        raise RuntimeError("boom")

    async def hangs() -> str | None:
        await asyncio.sleep(60)
        return None

    async with status_server(readiness=broken) as (url, _, _):
        status, text, _ = await request("GET", url + "/healthz/ready")
        assert status == 503 and "boom" in text
    async with status_server(readiness=hangs, readiness_timeout=0.1) as (url, _, _):
        status, text, _ = await request("GET", url + "/healthz/ready")
        assert status == 503 and "timed out" in text


@asynccontextmanager
async def fake_envoy_admin(status: int = 200) -> AsyncIterator[str]:
    async def stats(request: web.Request) -> web.Response:
        return web.Response(status=status, body=ENVOY_STATS, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/stats/prometheus", stats)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/stats/prometheus"
    finally:
        await runner.cleanup()


async def test_stats_merge_agent_metrics_first_then_envoys() -> None:
    async with (
        fake_envoy_admin() as stats_url,
        status_server(envoy_stats_url=stats_url) as (url, _, metrics),
    ):
        metrics.xds_proxy_requests.labels(type="lds").inc(2)
        status, text, headers = await request("GET", url + "/stats/prometheus")
    assert status == 200
    assert headers["Content-Type"].startswith("text/plain; version=0.0.4")
    assert 'istio_agent_xds_proxy_requests_total{type="lds"} 2.0' in text
    assert "istio_agent_scrapes_total 1.0" in text
    assert text.endswith(ENVOY_STATS.decode())
    assert text.index("istio_agent_") < text.index("envoy_cluster_upstream_cx_total")


@pytest.mark.parametrize("envoy", ["down", "error"])
async def test_stats_without_envoy_serve_agent_metrics_and_count_the_failure(envoy: str) -> None:
    async with fake_envoy_admin(status=503) as broken_url:
        stats_url = "http://127.0.0.1:1/stats/prometheus" if envoy == "down" else broken_url
        async with status_server(envoy_stats_url=stats_url) as (url, _, _):
            status, text, _ = await request("GET", url + "/stats/prometheus")
    assert status == 200
    assert 'istio_agent_scrape_failures_total{type="envoy"} 1.0' in text
    assert "envoy_cluster" not in text


async def test_quit_and_drain_from_localhost_and_from_the_pod_ip() -> None:
    ip = pod_ip()
    async with status_server(ip) as (url, calls, _):
        for source in ("127.0.0.1", ip):
            status, text, _ = await request("POST", url + "/quitquitquit", source=source)
            assert (status, text) == (200, "OK\n")
            status, text, _ = await request("POST", url + "/drain", source=source)
            assert (status, text) == (200, "OK\n")
        assert (calls.quit, calls.drain) == (2, 2)


async def test_quit_and_drain_refuse_other_callers() -> None:
    """Another pod on this machine is another loopback address: it must not stop this pod."""
    ip, other_pod = pod_ip(), pod_ip()
    async with status_server(ip) as (url, calls, _):
        for path in ("/quitquitquit", "/drain"):
            status, text, _ = await request("POST", url + path, source=other_pod)
            assert status == 403, path
            assert "localhost" in text
        # Reads stay open to anyone who can reach the port (probes, scrapers).
        status, _, _ = await request("GET", url + "/healthz/ready", source=other_pod)
        assert status == 503
        assert (calls.quit, calls.drain) == (0, 0)


async def test_quit_needs_post() -> None:
    async with status_server() as (url, calls, _):
        status, _, _ = await request("GET", url + "/quitquitquit")
        assert status == 405
        assert calls.quit == 0


async def test_ndsz_is_json() -> None:
    async with status_server() as (url, _, _):
        status, text, headers = await request("GET", url + "/debug/ndsz")
    assert status == 200
    assert headers["Content-Type"].startswith("application/json")
    assert json.loads(text)["table"]["web.shop.svc.cluster.local"]["ips"] == ["127.0.1.7"]


async def test_binds_only_the_given_ip() -> None:
    ip = pod_ip()
    async with status_server(ip) as (url, _, _):
        port = int(url.rpartition(":")[2])
        with pytest.raises(aiohttp.ClientConnectionError):
            await request("GET", f"http://127.0.0.1:{port}/healthz/ready")


@pytest.mark.parametrize(
    ("remote", "allowed"),
    [
        ("127.0.0.1", True),
        ("::1", True),
        ("::ffff:127.0.0.1", True),
        ("127.0.1.5", True),  # the pod IP
        ("127.0.1.6", False),  # another local pod
        ("10.0.0.1", False),
        ("", False),
        (None, False),
        ("not-an-ip", False),
    ],
)
def test_is_local_caller(remote: str | None, allowed: bool) -> None:
    assert is_local_caller(remote, "127.0.1.5") is allowed
