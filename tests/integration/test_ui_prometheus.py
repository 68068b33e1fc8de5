"""`--prometheus-url`: the dashboard's graph from a real Prometheus (Debian's package) that
scrapes a status port serving Istio's standard metrics; the rates the page would draw are
Prometheus's samples at the window's two ends."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp

from control.app import ControlPlane, ControlPlaneOptions
from tests.support.controlplane import bounded_teardown, eventually
from tests.support.net import pod_ip
from tests.support.promserver import running_prometheus
from tests.support.statusport import StatusPort

EDGE = "wl:default/client>svc:backend.default.svc.cluster.local"


async def test_graph_from_a_real_prometheus(tmp_path: Path) -> None:
    port = StatusPort(pod_ip())
    await port.start()
    config = {
        "global": {"scrape_interval": "1s"},
        "scrape_configs": [
            {
                "job_name": "agents",
                "metrics_path": "/stats/prometheus",
                "static_configs": [{"targets": [f"{port.ip}:15020"]}],
            }
        ],
    }
    try:
        async with running_prometheus(config, tmp_path / "prometheus") as prom:
            cp = ControlPlane(
                ControlPlaneOptions(
                    xds_address="127.0.0.1:0", http_address="127.0.0.1:0", prometheus_url=prom.url
                )
            )
            await cp.start()
            try:
                url = f"http://127.0.0.1:{cp.http_port}/ui/api/graph?window=10s"

                async def edge() -> dict[str, Any] | None:
                    async with aiohttp.ClientSession() as s, s.get(url) as r:
                        assert r.status == 200, await r.text()
                        data = json.loads(await r.text())
                    assert data["source"] == "prometheus"
                    found = {e["id"]: e for e in data["edges"]}.get(EDGE)
                    # Ten seconds of samples at both ends (Prometheus scrapes every second).
                    return found if found and found["rps"] > 0 and data["interval"] == 10 else None

                found = await eventually(edge, timeout=40, interval=0.5, what="the edge")
                assert 15 < found["rps"] < 25, found  # 20 rps
                assert 0.15 < found["error_rate"] < 0.35, found  # a quarter 503s
                assert found["mtls"] is True
                assert port.scrapes > 0
            finally:
                await bounded_teardown(cp.close(0.2), "control plane close")
    finally:
        await port.close()
