"""Shutdown with Istio's EXIT_ON_ZERO_ACTIVE_CONNECTIONS, for real: two pods (agent + Envoy
+ app on loopback IPs), requests in flight through the client pod's Envoy when its agent gets
SIGTERM. The agent stays up past MINIMUM_DRAIN_DURATION while they run, every one of them
succeeds, and it exits soon after the last connection closes, long before the drain duration
it would otherwise wait out."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from pathlib import Path

import aiohttp
import pytest

from tests.support.apps import EchoApp
from tests.support.controlplane import eventually, running_control_plane
from tests.support.mesh import backend_yaml, mesh_agent
from tests.support.net import pod_ip

pytestmark = pytest.mark.envoy

DRAIN_DURATION = 60.0  # what the agent would wait without exit-on-zero
MINIMUM = 1.0


async def get(url: str, host: str) -> tuple[int, str, float]:
    """(status, body, when the connection was closed); status 0 when it failed."""
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as s,
            s.get(url, headers={"Host": host}) as r,
        ):
            status, body = r.status, await r.text()
    except (aiohttp.ClientError, TimeoutError):
        status, body = 0, ""
    return status, body, time.monotonic()


async def test_exit_on_zero_active_connections(tmp_path: Path) -> None:
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "mesh.yaml").write_text(backend_yaml())
    client_ip, backend_ip = pod_ip(), pod_ip()
    app = EchoApp("backend", backend_ip, 8080)
    await app.start()
    async with running_control_plane(cfg) as cp:
        backend = mesh_agent(cp, tmp_path, backend_ip, "backend", "app=backend", group="backend")
        client = mesh_agent(
            cp,
            tmp_path,
            client_ip,
            "client",
            "app=client",
            "--drain-duration",
            str(DRAIN_DURATION),
            env={"EXIT_ON_ZERO_ACTIVE_CONNECTIONS": "true", "MINIMUM_DRAIN_DURATION": "1s"},
        )
        backend.start()
        client.start()
        try:
            url = f"http://{client_ip}:9080/hello"

            async def through() -> bool:
                return (await get(url, "backend"))[0] == 200

            await eventually(through, timeout=30, what="client -> backend")
            # Requests in flight, the longest well past the minimum drain duration.
            delays = (1.5, 2.0, 2.5, 3.0, 3.5)
            slow = [asyncio.create_task(get(f"{url}?delay={d}", "backend")) for d in delays]
            await asyncio.sleep(0.3)
            assert client.proc is not None
            t0 = time.monotonic()
            client.proc.send_signal(signal.SIGTERM)
            exited = asyncio.create_task(asyncio.to_thread(client.proc.wait, DRAIN_DURATION))
            results = await asyncio.gather(*slow)
            assert [r[0] for r in results] == [200] * len(delays), results
            assert all(json.loads(r[1])["app"] == "backend" for r in results)
            last_closed = max(r[2] for r in results)
            # Alive past the minimum while connections were open: it waited for them.
            assert last_closed - t0 > MINIMUM + 1.0
            code = await exited
            gone = time.monotonic()
            assert code == 0, client.log()[-3000:]
            log = client.log()
            assert "no active connections left" in log, log[-3000:]
            # Soon after the last connection, well before the drain duration it would
            # otherwise have waited out (generous bounds: the figure is printed).
            assert gone - last_closed < 10.0
            assert gone - t0 < DRAIN_DURATION / 2
            print(
                f"agent exited {gone - last_closed:.2f}s after the last connection closed "
                f"({gone - t0:.2f}s after SIGTERM, minimum {MINIMUM:g}s)"
            )
        finally:
            client.kill()
            backend.kill()
    await app.close()
