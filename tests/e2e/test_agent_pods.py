"""Two pods, each an agent + Envoy + app on its own loopback IP: HTTP flows client app →
its Envoy → the other pod's Envoy → app, with config delivered through the agents; readiness
turns 200 only then; SIGTERM drains and exits 0."""

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

MESH = backend_yaml()


async def get(url: str, host: str | None = None) -> tuple[int, str]:
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3)) as s,
            s.get(url, headers={"Host": host} if host else {}) as r,
        ):
            return r.status, await r.text()
    except (aiohttp.ClientError, TimeoutError):
        return 0, ""


async def test_two_pods_through_agents(tmp_path: Path) -> None:
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "mesh.yaml").write_text(MESH)
    client_ip, backend_ip = pod_ip(), pod_ip()
    app = EchoApp("backend", backend_ip, 8080)
    await app.start()
    async with running_control_plane(cfg) as cp:
        # On the TLS port with tokens; the backend registers through its WorkloadGroup.
        backend = mesh_agent(cp, tmp_path, backend_ip, "backend", "app=backend", group="backend")
        client = mesh_agent(
            cp, tmp_path, client_ip, "client", "app=client", "--drain-duration", "2"
        )
        backend.start()
        client.start()
        try:
            ready = f"http://{client_ip}:15020/healthz/ready"
            await eventually(
                lambda: _status(get(ready), 200), timeout=30, what="client agent ready"
            )
            # Readiness goes through Envoy too (15021 forwards to the agent).
            assert (await get(f"http://{client_ip}:15021/healthz/ready"))[0] == 200
            url = f"http://{client_ip}:9080/hello"
            status, body = await eventually(
                lambda: _ok(get(url, "backend")), timeout=20, what="client -> backend"
            )
            assert json.loads(body)["app"] == "backend"
            # Both pods talk to the control plane through their agents: an Envoy stream and
            # an agent stream each.
            streams = cp.views.syncz()
            proxies = {e["proxy"].split("~")[1] for e in streams}
            assert proxies == {client_ip, backend_ip}
            assert (
                cp.index.workloads_selected_by(
                    cp.index.service_by_host["backend.default.svc.cluster.local"]
                )[0].address
                == backend_ip
            )

            # Merged metrics: the agent's relay counters, then Envoy's own.
            status, metrics = await get(f"http://{client_ip}:15020/stats/prometheus")
            assert status == 200
            line = next(
                ln
                for ln in metrics.splitlines()
                if ln.startswith('istio_agent_xds_proxy_responses_total{type="Cluster"}')
            )
            assert float(line.split()[-1]) >= 1
            assert "pilotfish_agent_xds_downstream_streams 1.0" in metrics
            assert "envoy_cluster_manager_cds_update_success" in metrics

            # SIGTERM with a request in flight: it finishes, Envoy stops, the agent exits 0
            # within the drain duration (plus slack for Envoy's own shutdown).
            slow = asyncio.create_task(get(url + "?delay=1.0", "backend"))
            await asyncio.sleep(0.3)
            t0 = time.monotonic()
            assert client.proc is not None
            client.proc.send_signal(signal.SIGTERM)
            status, body = await slow
            assert status == 200 and json.loads(body)["app"] == "backend"
            code = await asyncio.to_thread(client.proc.wait, 20)
            assert code == 0, client.log()[-3000:]
            assert time.monotonic() - t0 < 2.0 + 5.0  # --drain-duration 2
            assert (await get(url, "backend"))[0] == 0  # Envoy is gone
        finally:
            client.kill()
            backend.kill()
    await app.close()


async def _status(call: object, want: int) -> bool:
    status, _ = await call  # type: ignore[misc]
    return bool(status == want)


async def _ok(call: object) -> tuple[int, str] | None:
    status, body = await call  # type: ignore[misc]
    return (status, body) if status == 200 else None
