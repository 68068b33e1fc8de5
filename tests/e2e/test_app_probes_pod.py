"""Rewritten app probes where they matter: a network-namespace pod with capture on
(interception mode REDIRECT) under STRICT mTLS. The kubelet's plaintext probe straight to the
app's port is captured and refused by the sidecar; the rewritten probes, answered by the agent
on 15020 (excluded from capture) which runs the originals from inside the pod, see the app:
HTTP, TCP and gRPC, and a stopped app reads as failing."""

from __future__ import annotations

import asyncio
import sys
import textwrap
from pathlib import Path

import aiohttp
import pytest

from control.webhook.probes import probers_env, rewrite_probes
from tests.e2e.test_redirect_pods import (  # noqa: F401 (workdirs: a fixture)
    _alive,
    ready,
    start_sidecar,
    workdirs,
)
from tests.support.controlplane import eventually, running_control_plane
from tests.support.mesh import workload_group_yaml
from tests.support.netns import pod_network

pytestmark = pytest.mark.envoy

MESH = textwrap.dedent(
    """\
    apiVersion: v1
    kind: Service
    metadata: {name: backend, namespace: default}
    spec:
      selector: {app: backend}
      ports: [{name: http, port: 9080, targetPort: 9080}, {name: grpc, port: 9090}]
    ---
    apiVersion: security.istio.io/v1
    kind: PeerAuthentication
    metadata: {name: default, namespace: istio-system}
    spec:
      mtls: {mode: STRICT}
    ---
    """
) + workload_group_yaml("backend")

# The pod spec's containers as the user wrote them; the injector's function rewrites them.
CONTAINERS = [
    {
        "name": "web",
        "ports": [{"name": "http", "containerPort": 9080}],
        "readinessProbe": {"httpGet": {"path": "/ready", "port": "http"}},
        "livenessProbe": {"tcpSocket": {"port": 9080}},
    },
    {"name": "api", "readinessProbe": {"grpc": {"port": 9090}}},
]


async def kubelet_get(url: str) -> int:
    """What the kubelet sees (0: no HTTP answer)."""
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as s,
            s.get(url, headers={"User-Agent": "kube-probe/1.31"}) as r,
        ):
            return r.status
    except (aiohttp.ClientError, TimeoutError):
        return 0


async def test_rewritten_probes_under_strict_mtls_with_capture(
    tmp_path: Path,
    workdirs: Path,  # noqa: F811
) -> None:
    changes, probers = rewrite_probes(CONTAINERS)
    assert {c[2]["httpGet"]["port"] for c in changes} == {15020}
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "mesh.yaml").write_text(MESH)
    with pod_network() as net:
        pod = net.add_pod("backend")
        web = pod.spawn(
            pod.python("-m", "tests.support.podapp", "serve", "backend", "9080"),
            tmp_path / "web.log",
        )
        api = pod.spawn(
            pod.python("-m", "tests.support.podapp", "grpc-health", "9090"), tmp_path / "api.log"
        )
        async with running_control_plane(cfg, host=net.gateway) as cp:
            agent = start_sidecar(
                pod,
                cp,
                net.gateway,
                workdirs,
                tmp_path,
                "backend",
                "backend",
                capture=(),
                env={"ISTIO_KUBE_APP_PROBERS": probers_env(probers)},
            )
            try:
                await eventually(
                    lambda: _alive(agent) and ready(pod), timeout=60, what="sidecar ready"
                )
                base = f"http://{pod.ip}:15020/app-health"
                for path in ("web/readyz", "web/livez", "api/readyz"):
                    await eventually(
                        lambda path=path: _is(kubelet_get(f"{base}/{path}"), 200),
                        timeout=20,
                        what=f"/app-health/{path} 200",
                    )
                # The same probe sent straight to the app: captured, and refused under STRICT.
                assert await kubelet_get(f"http://{pod.ip}:9080/ready") == 0
                # The app stops: both of its probes fail, the gRPC one still passes.
                web.kill()
                await asyncio.to_thread(web.wait, 10)
                assert await kubelet_get(f"{base}/web/readyz") == 503
                assert await kubelet_get(f"{base}/web/livez") == 503
                assert await kubelet_get(f"{base}/api/readyz") == 200
                # And the gRPC server stops: its probe fails too.
                api.kill()
                await asyncio.to_thread(api.wait, 10)
                assert await kubelet_get(f"{base}/api/readyz") == 503
            except BaseException:
                print(f"--- agent\n{agent.log()[-4000:]}", file=sys.stderr)
                raise
            finally:
                agent.kill()


async def _is(call: object, want: int) -> bool:
    return bool(await call == want)  # type: ignore[misc]
