"""The dashboard's scraper over real sockets: agents' status ports read a few at a time, each
with a short timeout; a port that answers 500, garbage, nothing in time or refuses is one
line in the snapshot's errors and simply missing from it; targets come from the connected
proxies (sidecars and routers, the port from STATUS_PORT metadata)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from control.ui.scrape import AgentScraper, ScrapeTarget, scrape_targets
from tests.support.net import free_port, pod_ip

GOOD = (
    "# TYPE istio_requests_total counter\n"
    'istio_requests_total{reporter="destination",source_workload="a",response_code="200"} 5\n'
    "envoy_server_live 1\n"
)


@pytest.fixture
async def ports() -> AsyncIterator[dict[str, str]]:
    ip = pod_ip()

    async def good(request: web.Request) -> web.Response:
        return web.Response(text=GOOD)

    async def broken(request: web.Request) -> web.Response:
        return web.Response(status=500, text="no")

    async def garbage(request: web.Request) -> web.Response:
        return web.Response(text='istio_requests_total{reporter="x" 1\n')

    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(1.5)
        return web.Response(text=GOOD)

    runners = []
    out = {}
    for name, handler in (("good", good), ("broken", broken), ("garbage", garbage), ("slow", slow)):
        app = web.Application()
        app.router.add_get("/stats/prometheus", handler)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        port = free_port(ip)
        await web.TCPSite(runner, ip, port).start()
        runners.append(runner)
        out[name] = f"{ip}:{port}"
    out["refused"] = f"{ip}:{free_port(ip)}"
    try:
        yield out
    finally:
        for r in runners:
            await r.cleanup()


async def test_one_round_reads_good_targets_and_names_the_others(ports: dict[str, str]) -> None:
    targets = [ScrapeTarget(n, f"http://{a}/stats/prometheus") for n, a in ports.items()]
    scraper = AgentScraper(lambda: targets, timeout=0.5, concurrency=2)
    await scraper.start()
    try:
        snapshot = await scraper.scrape_once()
    finally:
        await scraper.close()
    assert list(snapshot.targets) == ["good"]
    [flow] = snapshot.targets["good"].flows.values()
    assert flow.codes == {"200": 5.0}
    assert snapshot.errors["broken"] == "HTTP 500"
    assert snapshot.errors["garbage"].startswith("bad Prometheus text")
    assert snapshot.errors["slow"] == "no answer within 0.5s"
    assert snapshot.errors["refused"]
    assert len(scraper.history) == 1


def test_targets_are_the_connected_sidecars_and_routers() -> None:
    proxies = [
        ("sidecar", "10.0.0.1", 0),
        ("sidecar", "10.0.0.1", 0),  # its agent's own stream: the same pod
        ("router", "10.0.0.2", 15099),
        ("pilotfish-ctl", "127.0.0.1", 0),
        ("sidecar", "fd00::5", 0),
    ]
    assert [t.url for t in scrape_targets(proxies)] == [
        "http://10.0.0.1:15020/stats/prometheus",
        "http://10.0.0.2:15099/stats/prometheus",
        "http://[fd00::5]:15020/stats/prometheus",
    ]


def test_status_port_from_node_metadata() -> None:
    from agent.config import build_parser, config_from_args
    from control.model.proxy import proxy_from_node

    node = "sidecar~10.0.0.1~web.shop~shop.svc.cluster.local"
    # The agent announces a status port other than Istio's; the control plane reads it.
    args = build_parser().parse_args(["--ip", "10.0.0.1", "--status-port", "15099"])
    meta = config_from_args(args, {}).node_metadata()
    assert proxy_from_node(node, meta).status_port == 15099
    default = config_from_args(build_parser().parse_args(["--ip", "10.0.0.1"]), {})
    assert "STATUS_PORT" not in default.node_metadata()
    for bad in ({}, {"STATUS_PORT": "x"}, {"STATUS_PORT": "70000"}):
        assert proxy_from_node(node, bad).status_port == 0  # the default, 15020
