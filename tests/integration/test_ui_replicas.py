"""The proxies view across replicas (Kubernetes mode): the control-plane pods found through
the API server (tests/support/kubeapi.py lists them by label), each asked for its syncz over
its plaintext xDS port as `pilotfish-ctl proxy-status` asks; two real replicas, a proxy on
each, both rows in /ui/api/proxies of one of them; a replica that does not answer is named."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
from envoy.service.discovery.v3.discovery_pb2 import DiscoveryRequest

from control.app import ControlPlane, ControlPlaneOptions
from control.kube.client import KubeClient, kube_config
from control.ui.dashboard import Dashboard
from control.ui.replicas import DEFAULT_SELECTOR, ReplicaRows, kube_replicas
from control.xds.server import XdsOptions
from protos import typeurls
from tests.support.adsclient import AdsStream, node_id
from tests.support.controlplane import bounded_teardown, eventually
from tests.support.kubeapi import FakeKubeApi, pod
from tests.support.net import free_port, pod_ip


async def test_proxies_of_every_replica(tmp_path: Path) -> None:
    ip_a, ip_b, gone, proxy_a, proxy_b = pod_ip(), pod_ip(), pod_ip(), pod_ip(), pod_ip()
    port = free_port(ip_a)
    replicas = [
        ControlPlane(
            ControlPlaneOptions(
                xds_address=f"{ip}:{port}",
                http_address="127.0.0.1:0",
                id=name,
                xds=XdsOptions(control_plane_id=name),
            )
        )
        for name, ip in (("istiod-a", ip_a), ("istiod-b", ip_b))
    ]
    streams: list[AdsStream] = []
    channels: list[grpc.aio.Channel] = []
    async with FakeKubeApi() as api:
        for name, ip in (("istiod-a", ip_a), ("istiod-b", ip_b), ("istiod-gone", gone)):
            api.put(pod(name, ip, {"app": "istiod"}, namespace="istio-system"))
        api.put(pod("web", pod_ip(), {"app": "web"}, namespace="istio-system"))
        (tmp_path / "kubeconfig").write_text(api.kubeconfig())
        client = KubeClient(kube_config(str(tmp_path / "kubeconfig")))
        await client.start()
        try:
            for cp in replicas:
                await cp.start()
            for cp, ip, proxy in zip(replicas, (ip_a, ip_b), (proxy_a, proxy_b), strict=True):
                channel = grpc.aio.insecure_channel(f"{ip}:{port}")
                channels.append(channel)
                stream = AdsStream(channel)
                streams.append(stream)
                req = DiscoveryRequest(type_url=typeurls.CLUSTER)
                req.node.id = node_id(proxy, pod=f"app-{cp.options.id}")
                await stream.send(req)
                await stream.recv()
            find = kube_replicas(lambda: client, "istio-system", DEFAULT_SELECTOR, lambda: port)
            assert sorted(await find()) == sorted(f"{ip}:{port}" for ip in (ip_a, ip_b, gone))
            a = replicas[0]
            dashboard = Dashboard(
                a.ui.dashboard.source if a.ui else None,  # type: ignore[arg-type]
                syncz=a.views.syncz,
                config=a.watcher,
                index=lambda: a.current.index,
                remote_rows=ReplicaRows(find, "istiod-a", timeout=1.0, ttl=0.0),
            )

            async def both() -> dict[str, Any] | None:
                data = await dashboard.proxies(None)
                rows = {(p["ip"], p["replica"]) for p in data["proxies"]}  # type: ignore[attr-defined]
                return data if rows == {(proxy_a, "istiod-a"), (proxy_b, "istiod-b")} else None

            data = await eventually(both, timeout=20, what="a row from each replica")
            [failed] = data["replica_errors"]
            assert failed.startswith(f"{gone}:{port}: "), failed
            assert "LIST pods" in api.requests
            # Rows filtered by namespace come from every replica too.
            only = await dashboard.proxies(frozenset({"default"}))
            assert len(only["proxies"]) == 2  # type: ignore[arg-type]
        finally:
            for s in streams:
                await s.close()
            for c in channels:
                await c.close()
            for cp in replicas:
                await bounded_teardown(cp.close(0.5), "control plane close")
            await client.close()
