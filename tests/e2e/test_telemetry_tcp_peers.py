"""TCP callers named in the standard metrics, with pods as network namespaces (interception
mode REDIRECT: a connection arrives from the caller's pod address, as in Kubernetes).

The backend's agent names the caller from the control plane's table of workloads
(protos/peers.proto) when the caller's certificate names the principal the table gives the
connection's source address: a registered client is `source_workload="client"` with its
group's app and version; a sidecar with a valid mesh certificate that is registered nowhere
is named as its own metrics name it (its pod, its node's labels, the service account its
stream authenticated as), never as a registered workload.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from tests.e2e.test_gateway_telemetry import metrics
from tests.e2e.test_redirect_pods import _alive, app_get, ready, start_sidecar, workdirs
from tests.support.agentproc import AgentProcess
from tests.support.controlplane import eventually, running_control_plane
from tests.support.mesh import workload_group_yaml
from tests.support.netns import pod_network

pytestmark = pytest.mark.envoy
__all__ = ["workdirs"]  # the fixture, shared with test_redirect_pods

VIP = "10.96.0.52"
MESH = (
    textwrap.dedent(
        f"""\
        apiVersion: v1
        kind: Service
        metadata: {{name: backend, namespace: default}}
        spec:
          clusterIP: {VIP}
          selector: {{app: backend}}
          ports: [{{name: tcp, port: 9090, targetPort: 9080}}]
        ---
        apiVersion: security.istio.io/v1
        kind: PeerAuthentication
        metadata: {{name: default, namespace: istio-system}}
        spec:
          mtls: {{mode: STRICT}}
        ---
        """
    )
    + workload_group_yaml("backend")
    + "---\n"
    + workload_group_yaml("client", labels={"app": "client", "version": "v3"})
)
PRINCIPAL = "spiffe://cluster.local/ns/default/sa/{}"


def _opened(e: object, account: str, workload: str) -> float:
    return e.total(  # type: ignore[attr-defined, no-any-return]
        "istio_tcp_connections_opened_total",
        reporter="destination",
        destination_workload="backend",
        source_principal=PRINCIPAL.format(account),
        source_workload=workload,
        connection_security_policy="mutual_tls",
    )


async def test_tcp_callers_named_from_the_peer_table(tmp_path: Path, workdirs: Path) -> None:
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "mesh.yaml").write_text(MESH)
    agents: list[AgentProcess] = []
    with pod_network() as net:
        client, stranger, backend = (
            net.add_pod("client"),
            net.add_pod("stranger"),
            net.add_pod("backend"),
        )
        backend.spawn(
            backend.python("-m", "tests.support.podapp", "serve", "backend", "9080"),
            tmp_path / "backend-app.log",
        )
        async with running_control_plane(cfg, host=net.gateway) as cp:
            try:
                # The backend first: the callers join the registry while its agent is
                # connected, so their rows reach it with a workload-only (EDS) push.
                order = (
                    (backend, "backend", "backend"),
                    (client, "client", "client"),
                    (stranger, "stranger", ""),  # a mesh sidecar, registered nowhere
                )
                for pod, app, group in order:
                    agent = start_sidecar(pod, cp, net.gateway, workdirs, tmp_path, app, group)
                    agents.append(agent)
                    await eventually(
                        lambda pod=pod, agent=agent: _alive(agent) and ready(pod),
                        timeout=60,
                        what=f"{pod.name} ready",
                    )
                url = f"http://{VIP}:9090/over-tcp"
                for pod in (client, stranger):
                    await eventually(
                        lambda pod=pod: _ok(app_get(pod, url)), timeout=30, what=pod.name
                    )

                # A caller's connections before its row reaches the backend's agent (with the
                # push its own connection caused) are `unknown`: keep connecting until named.
                async def named() -> object | None:
                    for pod in (client, stranger):
                        await _ok(app_get(pod, url))
                    e = await metrics(backend.ip)
                    ok = _opened(e, "client", "client") >= 1
                    return e if ok and _opened(e, "stranger", stranger.name) >= 1 else None

                e = await eventually(named, timeout=30, what="both callers counted")
                (series,) = [
                    s
                    for s in e.series("istio_tcp_connections_opened_total")  # type: ignore[attr-defined]
                    if s.get("source_principal") == PRINCIPAL.format("client")
                ]
                assert series["source_app"] == "client" and series["source_version"] == "v3"
                assert series["source_workload_namespace"] == "default"
                assert series["request_protocol"] == "tcp"
                # The stranger's connections are never credited to a registered workload:
                # before the table names it, `unknown`; then its own pod.
                strangers = [
                    s
                    for s in e.series("istio_tcp_connections_opened_total")  # type: ignore[attr-defined]
                    if s.get("source_principal") == PRINCIPAL.format("stranger")
                ]
                assert {s["source_workload"] for s in strangers} <= {"unknown", stranger.name}
                assert {s["source_app"] for s in strangers} <= {"unknown", "stranger"}
            except BaseException:
                for a in agents:
                    print(f"--- {a.log_path.name}\n{a.log()[-3000:]}", file=sys.stderr)
                raise
            finally:
                for a in agents:
                    a.kill()


async def _ok(call: object) -> bool:
    status, _ = await call  # type: ignore[misc]
    return bool(status == 200)
