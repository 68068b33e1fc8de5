"""`pilotfish-agent --proxy-only`: a stock grpcio client using the bootstrap the agent writes
reaches a gRPC backend through the agent's xDS socket, and follows an endpoint change; the
client's streams and the agent's share one TCP connection to the control plane."""

from __future__ import annotations

import json
from pathlib import Path

from tests.integration.test_agent_xdsproxy import established_to
from tests.integration.test_proxyless_grpc import backend, grpc_client, mesh_yaml
from tests.support.controlplane import eventually, running_control_plane
from tests.support.mesh import mesh_agent
from tests.support.net import pod_ip


async def test_proxyless_client_through_agent(tmp_path: Path) -> None:
    first_ip, second_ip, pod = pod_ip(), pod_ip(), pod_ip()
    cfg = tmp_path / "config"
    cfg.mkdir()
    mesh = cfg / "mesh.yaml"
    mesh.write_text(mesh_yaml(first_ip))
    async with (
        backend("first", first_ip) as first,
        backend("second", second_ip),
        running_control_plane(cfg) as cp,
    ):
        agent = mesh_agent(
            cp, tmp_path, pod, "grpcapp", "app=grpcapp", "--proxy-only", workdir=tmp_path / "pod"
        )
        agent.start()
        try:
            boot = tmp_path / "pod" / "grpc-bootstrap.json"
            await eventually(boot.exists, timeout=15, what="grpc-bootstrap.json written")
            data = json.loads(boot.read_text())
            assert (
                data["xds_servers"][0]["server_uri"]
                == f"unix://{(tmp_path / 'pod' / 'XDS').resolve()}"
            )
            assert data["node"]["metadata"]["GENERATOR"] == "grpc"
            targets = ("xds:///echo.default.svc.cluster.local:7070", "xds:///echo:7070")
            async with grpc_client(boot, targets) as client:
                await client.wait_for("first", timeout=15)
                assert first.calls > 0
                # Every stream of the pod rides the agent's single upstream connection.
                assert established_to(cp.secure_xds_port) == 1
                assert {e["proxy"].split("~")[1] for e in cp.views.syncz()} == {pod}
                ready = await _ready(pod)
                assert ready == 200
                mesh.write_text(mesh_yaml(second_ip))
                await client.wait_for("second", timeout=15)
        finally:
            assert agent.terminate() == 0, agent.log()[-2000:]


async def _ready(ip: str) -> int:
    import aiohttp

    async with (
        aiohttp.ClientSession() as s,
        s.get(f"http://{ip}:15020/healthz/ready") as r,
    ):
        return r.status


async def test_proxy_only_agent_is_ready_before_any_client(tmp_path: Path) -> None:
    pod = pod_ip()
    cfg = tmp_path / "config"
    cfg.mkdir()
    (cfg / "mesh.yaml").write_text(mesh_yaml(pod_ip()))
    async with running_control_plane(cfg) as cp:
        agent = mesh_agent(
            cp, tmp_path, pod, "lonely", "", "--proxy-only", workdir=tmp_path / "pod"
        )
        agent.start()
        try:
            status = await eventually(
                lambda: _ready_or_zero(pod), timeout=15, what="ready without clients"
            )
            assert status == 200
        finally:
            assert agent.terminate() == 0, agent.log()[-2000:]


async def _ready_or_zero(ip: str) -> int:
    import aiohttp

    try:
        return 200 if await _ready(ip) == 200 else 0
    except aiohttp.ClientError:
        return 0
