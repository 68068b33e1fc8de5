"""Control plane killed and restarted under steady HTTP load between two pods: zero failed
requests (Envoy keeps its config through the agents), and Envoy is SYNCED again within a few
seconds of the control plane's return."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
import pytest

from tests.e2e.test_agent_pods import MESH, get
from tests.support.apps import EchoApp
from tests.support.controlplane import eventually, running_control_plane, state_dir_token
from tests.support.mesh import tls_agent
from tests.support.net import free_port, pod_ip

pytestmark = pytest.mark.envoy


async def test_control_plane_restart_under_load(tmp_path: Path) -> None:
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "mesh.yaml").write_text(MESH)
    state = tmp_path / "state"
    port, secure = free_port(), free_port()
    client_ip, backend_ip = pod_ip(), pod_ip()
    app = EchoApp("backend", backend_ip, 8080)
    await app.start()
    # The TLS port, verified by the state dir's root (it survives the restart, as the token
    # key does); the backend registers through its WorkloadGroup, and is restored from
    # workloads.json after the restart.
    target, root = f"127.0.0.1:{secure}", state / "root-cert.pem"
    backend = tls_agent(
        target,
        root,
        state_dir_token(state, "default", "backend"),
        tmp_path / "b",
        backend_ip,
        "backend",
        "app=backend",
        group="backend",
    )
    client = tls_agent(
        target, root, state_dir_token(state), tmp_path / "c", client_ip, "client", "app=client"
    )
    url = f"http://{client_ip}:9080/"
    results: list[int] = []
    stop = asyncio.Event()

    async def load() -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3)) as s:
            while not stop.is_set():
                try:
                    async with s.get(url, headers={"Host": "backend"}) as r:
                        await r.read()
                        results.append(r.status)
                except (aiohttp.ClientError, TimeoutError):
                    results.append(0)
                await asyncio.sleep(0.02)  # ~50 requests/s, bounded by the test's length

    try:
        async with running_control_plane(cfg, xds_port=port, secure_port=secure, state_dir=state):
            backend.start()
            client.start()
            await eventually(
                lambda: _status(get(url, "backend"), 200), timeout=30, what="traffic flows"
            )
            loader = asyncio.create_task(load())
            await asyncio.sleep(1.0)
            assert (state / "workloads.json").exists()
        # The control plane is gone; traffic keeps flowing on Envoy's last config.
        down_since = len(results)
        await asyncio.sleep(2.0)
        async with running_control_plane(
            cfg, xds_port=port, secure_port=secure, state_dir=state
        ) as cp2:
            t0 = time.monotonic()

            def synced() -> bool:
                rows = [e for e in cp2.views.syncz() if client_ip in e["proxy"]]
                return any(
                    len(e["types"]) >= 4
                    and all(v["status"] == "SYNCED" for v in e["types"].values())
                    for e in rows
                )

            await eventually(synced, timeout=15, what="client Envoy SYNCED after restart")
            resync = time.monotonic() - t0
            await asyncio.sleep(1.0)
            stop.set()
            await loader
        assert len(results) > 100 and len(results) - down_since > 50
        failures = [s for s in results if s != 200]
        assert failures == [], f"{len(failures)} of {len(results)} requests failed"
        assert resync < 10
    finally:
        stop.set()
        client.kill()
        backend.kill()
        await app.close()


async def _status(call: object, want: int) -> bool:
    status, _ = await call  # type: ignore[misc]
    return bool(status == want)
