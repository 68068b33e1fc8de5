"""Issue 18, end to end: a WorkloadGroup with an httpGet probe, a real control plane (TLS
port, token) and a real `pilotfish-agent --proxy-only` joining the group. The agent gets the
probe on its agent stream, probes the app at its pod IP and reports health; a raw ADS client
of the Service watches EDS: the endpoint appears only once the app answers 200, leaves while
it answers 500, and comes back. Each change is an EDS-only push."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
from envoy.config.endpoint.v3.endpoint_pb2 import ClusterLoadAssignment
from envoy.service.discovery.v3.discovery_pb2 import DiscoveryRequest

from control.app import ControlPlane
from protos import typeurls
from tests.support.adsclient import AdsStream, node_id
from tests.support.controlplane import eventually, running_control_plane
from tests.support.mesh import mesh_agent, workload_group_yaml
from tests.support.net import free_port, pod_ip
from tests.support.traffic import service

ALPHA = "outbound|9080||alpha.default.svc.cluster.local"
WAIT = 30.0  # generous: two cores shared with other tests

MESH = (
    service("alpha", "alpha")
    + """\
---
# A second endpoint of alpha with the member's identity, so that the member leaving or
# joining changes endpoints only (not the SANs clients accept): an EDS-only push.
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: alpha-static, namespace: default}
spec:
  address: 127.0.7.7
  serviceAccount: alpha
  labels: {app: alpha, security.istio.io/tlsMode: istio}
---
"""
)
STATIC = "127.0.7.7"


def probed_group(app_port: int) -> str:
    labels = {"app": "alpha", "security.istio.io/tlsMode": "istio"}
    return workload_group_yaml("alpha", labels=labels) + (
        "  probe:\n"
        "    periodSeconds: 1\n"
        "    failureThreshold: 1\n"
        f"    httpGet: {{path: /healthz, port: {app_port}}}\n"
    )


class App:
    """The workload: answers /healthz with `status` (switchable)."""

    def __init__(self) -> None:
        self.status = 200
        self.hits = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            await reader.readuntil(b"\r\n\r\n")
            self.hits += 1
            head = f"HTTP/1.1 {self.status} X\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            writer.write(head.encode())
            await writer.drain()
        writer.close()


class EdsWatch:
    """A client sidecar of `alpha` on the plaintext port: one long-lived stream that ACKs
    every response and keeps the newest endpoint addresses of alpha's cluster."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.stream = AdsStream(channel)
        self.addresses: list[str] | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        req = DiscoveryRequest(type_url=typeurls.CLUSTER)
        req.node.id = node_id("127.0.8.1", "client")
        req.node.metadata.update({"SDS": "true", "LABELS": {"app": "client"}})
        self._node = req.node
        await self.stream.send(req)
        cds = await self.stream.recv(WAIT)
        await self._ack(cds, [])
        await self.stream.send(self._eds())
        self._task = asyncio.create_task(self._run())

    def _eds(self, resp: Any = None) -> DiscoveryRequest:
        req = DiscoveryRequest(type_url=typeurls.ENDPOINT, resource_names=[ALPHA])
        req.node.CopyFrom(self._node)
        if resp is not None:
            req.version_info, req.response_nonce = resp.version_info, resp.nonce
        return req

    async def _ack(self, resp: Any, names: list[str]) -> None:
        ack = DiscoveryRequest(
            type_url=resp.type_url,
            resource_names=names,
            version_info=resp.version_info,
            response_nonce=resp.nonce,
        )
        ack.node.CopyFrom(self._node)
        await self.stream.send(ack)

    async def _run(self) -> None:
        while True:
            resp = await self.stream.recv(timeout=3600)
            if resp.type_url == typeurls.ENDPOINT:
                for any_ in resp.resources:
                    cla = ClusterLoadAssignment()
                    any_.Unpack(cla)
                    if cla.cluster_name == ALPHA:
                        self.addresses = [
                            lb.endpoint.address.socket_address.address
                            for group in cla.endpoints
                            for lb in group.lb_endpoints
                        ]
                await self.stream.send(self._eds(resp))
            else:
                await self._ack(resp, [])

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.stream.close()


@contextlib.asynccontextmanager
async def eds_watch(cp: ControlPlane) -> AsyncIterator[EdsWatch]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{cp.xds_port}") as channel:
        watch = EdsWatch(channel)
        await watch.start()
        try:
            yield watch
        finally:
            await watch.close()


async def registered(cp: ControlPlane) -> list[dict[str, Any]]:
    url = f"http://127.0.0.1:{cp.http_port}/debug/configz"
    async with aiohttp.ClientSession() as session, session.get(url) as r:
        entries: list[dict[str, Any]] = (await r.json())["registered"]
    return entries


def condition(entries: list[dict[str, Any]]) -> dict[str, str] | None:
    if len(entries) != 1:
        return None
    conds = entries[0]["status"].get("conditions") or [None]
    return conds[0]  # type: ignore[no-any-return]


async def test_endpoint_follows_the_http_probe(tmp_path: Path) -> None:
    ip = pod_ip()
    app_port = free_port(ip)
    app = App()
    server = await asyncio.start_server(app.handle, ip, app_port)
    app.status = 500  # not ready yet: it must not appear before its first healthy report
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "mesh.yaml").write_text(MESH + probed_group(app_port))
    try:
        async with running_control_plane(cfg, grace=0.5) as cp, eds_watch(cp) as watch:
            agent = mesh_agent(
                cp,
                tmp_path,
                ip,
                "alpha-0",
                "app=alpha",
                "--proxy-only",
                "--dns-port",
                "0",
                "--status-port",
                str(free_port(ip)),
                group="alpha",
                workdir=tmp_path / "pod",
            )
            agent.start()
            try:
                await eventually(lambda: app.hits >= 2, WAIT, what=f"probes\n{agent.log()}")
                # Registered (connected, annotated) but not serving: unhealthy, out of EDS.
                entries = await eventually(
                    lambda: _unhealthy(cp), WAIT, what=f"unhealthy report\n{agent.log()}"
                )
                assert "status 500" in str(condition(entries))
                assert (
                    entries[0]["metadata"]["annotations"]["proxy.istio.io/health-checks-enabled"]
                    == "true"
                )
                await eventually(lambda: watch.addresses == [STATIC], WAIT, what="EDS of alpha")

                app.status = 200
                await eventually(
                    lambda: sorted(watch.addresses or []) == sorted([STATIC, ip]),
                    WAIT,
                    what=f"endpoint in EDS\n{agent.log()}",
                )
                assert (condition(await registered(cp)) or {}).get("status") == "True"

                seq = cp.pipeline.pushes
                app.status = 500
                await eventually(
                    lambda: watch.addresses == [STATIC], WAIT, what="endpoint out of EDS"
                )
                new = [p for p in cp.pipeline.push_log if p.seq > seq]
                assert any(p.eds_only and "registry" in p.reasons for p in new), new

                app.status = 200
                await eventually(
                    lambda: sorted(watch.addresses or []) == sorted([STATIC, ip]),
                    WAIT,
                    what="endpoint back",
                )
            finally:
                agent.kill()
    finally:
        server.close()
        await server.wait_closed()


async def _unhealthy(cp: ControlPlane) -> list[dict[str, Any]] | None:
    entries = await registered(cp)
    cond = condition(entries)
    return entries if cond is not None and cond["status"] == "False" else None
