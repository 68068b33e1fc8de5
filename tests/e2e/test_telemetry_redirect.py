"""Access logs in interception mode REDIRECT, with pods as network namespaces: MeshConfig
`accessLogFile: /dev/stdout` puts one line per request in each agent's output (Envoy runs as
UID 1337 and writes to its stdout, the agent's), from `virtualOutbound` on the client (mesh
HTTP through its routes, and plain TCP to a destination outside the mesh through
`PassthroughCluster`) and from `virtualInbound` on the backend (over mTLS, STRICT)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.e2e.test_redirect_pods import (
    MESH,
    OUTSIDE_PORT,
    _alive,
    app_get,
    ready,
    start_sidecar,
    workdirs,
)
from tests.e2e.test_telemetry_access_logs import text_entries
from tests.support.agentproc import AgentProcess
from tests.support.apps import EchoApp
from tests.support.controlplane import eventually, running_control_plane
from tests.support.netns import pod_network

pytestmark = pytest.mark.envoy

__all__ = ["workdirs"]  # the fixture, shared with test_redirect_pods


def _entries(agent: AgentProcess, path: str, cluster: str) -> list[dict[str, str]] | None:
    found = [e for e in text_entries(agent.log()) if e["path"] == path and e["cluster"] == cluster]
    return found or None


async def test_redirect_access_logs(tmp_path: Path, workdirs: Path) -> None:
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "mesh.yaml").write_text(MESH)
    mesh_file = tmp_path / "meshconfig.yaml"
    mesh_file.write_text("accessLogFile: /dev/stdout\n")
    agents: list[AgentProcess] = []
    with pod_network() as net:
        client, backend = net.add_pod("client"), net.add_pod("backend")
        backend.spawn(
            backend.python("-m", "tests.support.podapp", "serve", "backend", "9080"),
            tmp_path / "backend-app.log",
        )
        outside = EchoApp("outside", net.gateway, OUTSIDE_PORT)
        async with running_control_plane(cfg, host=net.gateway, mesh_config=mesh_file) as cp:
            await outside.start()
            try:
                for pod, app, group in ((client, "client", ""), (backend, "backend", "backend")):
                    agents.append(
                        start_sidecar(pod, cp, net.gateway, workdirs, tmp_path, app, group)
                    )
                for pod, agent in zip((client, backend), agents, strict=True):
                    await eventually(
                        lambda pod=pod, agent=agent: _alive(agent) and ready(pod),
                        timeout=60,
                        what=f"{pod.name} ready",
                    )
                client_agent, backend_agent = agents
                url = "http://backend.default.svc.cluster.local:9080/logged"
                await eventually(
                    lambda: _status(app_get(client, url)), timeout=30, what="client -> backend"
                )
                out = await eventually(
                    lambda: _entries(
                        client_agent, "/logged", "outbound|9080||backend.default.svc.cluster.local"
                    ),
                    timeout=20,
                    what="client access log",
                )
                assert all(e["method"] == "GET" and e["code"] == "200" for e in out)
                into = await eventually(
                    lambda: _entries(backend_agent, "/logged", "inbound|9080||"),
                    timeout=20,
                    what="backend access log",
                )
                # The same request on both sides, arriving from the client pod.
                assert {e["request_id"] for e in into} >= {e["request_id"] for e in out}
                assert all(e["downstream_remote"].startswith(f"{client.ip}:") for e in into)
                # Plain TCP to a destination the mesh does not know: the passthrough chain.
                status, _ = await app_get(client, f"http://outside.test:{OUTSIDE_PORT}/")
                if status != 200:  # no DNS here: dial the address itself
                    status, _ = await app_get(client, f"http://{net.gateway}:{OUTSIDE_PORT}/")
                assert status == 200
                tcp = await eventually(
                    lambda: (
                        [
                            e
                            for e in text_entries(client_agent.log())
                            if e["cluster"] == "PassthroughCluster"
                        ]
                        or None
                    ),
                    timeout=20,
                    what="TCP access log",
                )
                assert tcp[0]["method"] == "-" and int(tcp[0]["received"]) > 0
                assert tcp[0]["upstream_host"] == f"{net.gateway}:{OUTSIDE_PORT}"
            except BaseException:
                for a in agents:
                    print(f"--- {a.log_path.name}\n{a.log()[-3000:]}", file=sys.stderr)
                raise
            finally:
                for a in agents:
                    a.kill()
                await outside.close()


async def _status(call: object) -> bool:
    status, _ = await call  # type: ignore[misc]
    return bool(status == 200)
