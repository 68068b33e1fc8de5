"""Chaos: the mesh under faults, bounded in time, loopback only.

- the control plane `kill -9`-ed and restarted (a real subprocess, same ports and state dir)
  under steady HTTP load between two pods: zero failed requests, Envoys SYNCED again;
- an agent `kill -9`-ed: its Envoy dies with it (the pod's ports are freed), and the
  restarted agent brings the pod back to ready with traffic flowing;
- a control plane that accepts connections and then freezes: the agent's keepalive notices
  and it reconnects;
- a slow consumer that stops reading while large pushes go on: its stream is closed with
  DEADLINE_EXCEEDED and the control plane's memory stays bounded;
- the config rewritten every 50 ms: every Envoy and simulated stream ends on the last one.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import time
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from envoy.config.cluster.v3.cluster_pb2 import Cluster
from envoy.service.discovery.v3.discovery_pb2 import DeltaDiscoveryRequest, DiscoveryRequest

from agent.envoy.bootstrap import BootstrapOptions, build_bootstrap
from protos import typeurls
from tests.e2e.test_agent_pods import MESH
from tests.support.adsclient import AdsStream, cluster_names, node_id
from tests.support.agentproc import AgentProcess
from tests.support.apps import EchoApp
from tests.support.controlplane import (
    agent_token,
    eventually,
    running_control_plane,
    state_dir_token,
)
from tests.support.controlproc import ControlProcess
from tests.support.envoy import EnvoyProcess
from tests.support.mesh import mesh_agent, root_file, tls_agent
from tests.support.net import pod_ip

pytestmark = pytest.mark.envoy


class HttpLoad:
    """Steady GETs (~50/s) through a pod's outbound listener; records every status."""

    def __init__(self, url: str, host: str) -> None:
        self.url, self.host = url, host
        self.results: list[int] = []
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3)) as s:
            while not self._stop.is_set():
                try:
                    async with s.get(self.url, headers={"Host": self.host}) as r:
                        await r.read()
                        self.results.append(r.status)
                except (aiohttp.ClientError, TimeoutError):
                    self.results.append(0)
                await asyncio.sleep(0.02)

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task

    def failures(self) -> list[int]:
        return [s for s in self.results if s != 200]


async def status_of(url: str, host: str | None = None) -> int:
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3)) as s,
            s.get(url, headers={"Host": host} if host else {}) as r,
        ):
            await r.read()
            return r.status
    except (aiohttp.ClientError, TimeoutError):
        return 0


def envoy_synced(rows: list[dict[str, Any]], ip: str, types: int = 4) -> bool:
    """An Envoy stream of the pod at `ip` (CDS, EDS, LDS and, with an outbound HTTP
    listener, RDS) is SYNCED on every type."""
    return any(
        ip in e["proxy"]
        and len(e["types"]) >= types
        and all(v["status"] == "SYNCED" for v in e["types"].values())
        for e in rows
    )


# --- control plane kill -9 ---------------------------------------------------------------


async def test_control_plane_kill_9_and_restart_under_load(tmp_path: Path) -> None:
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "mesh.yaml").write_text(MESH)
    state = tmp_path / "state"
    # Tokens from the state dir's key, and its root: both survive the kill. The agents are
    # on the TLS port; the backend registers through its WorkloadGroup.
    cp = ControlProcess(cfg, state, tmp_path / "control.log")
    client_ip, backend_ip = pod_ip(), pod_ip()
    app = EchoApp("backend", backend_ip, 8080)
    await app.start()
    backend = tls_agent(
        cp.secure_target,
        cp.root,
        state_dir_token(state, "default", "backend"),
        tmp_path / "b",
        backend_ip,
        "backend",
        "app=backend",
        group="backend",
    )
    client = tls_agent(
        cp.secure_target,
        cp.root,
        state_dir_token(state),
        tmp_path / "c",
        client_ip,
        "client",
        "app=client",
    )
    load = HttpLoad(f"http://{client_ip}:9080/", "backend")
    try:
        cp.start()
        await eventually(lambda: asyncio.to_thread(cp.ready), timeout=30, what="control plane")
        backend.start()
        client.start()
        url = f"http://{client_ip}:9080/"
        await eventually(
            lambda: _is(status_of(url, "backend"), 200), timeout=30, what="traffic flows"
        )
        load.start()
        await asyncio.sleep(1.0)
        cp.kill()
        before = len(load.results)
        await asyncio.sleep(2.0)  # traffic goes on with the control plane gone
        assert len(load.results) - before > 20
        cp.start()
        await eventually(lambda: asyncio.to_thread(cp.ready), timeout=30, what="restart")

        async def both_synced() -> bool:
            rows = await asyncio.to_thread(cp.syncz)
            return envoy_synced(rows, client_ip) and envoy_synced(rows, backend_ip, 3)

        await eventually(both_synced, timeout=30, what="both Envoys SYNCED after restart")
        await asyncio.sleep(1.0)
        await load.stop()
        assert len(load.results) > 100
        assert load.failures() == [], (
            f"{len(load.failures())} of {len(load.results)} requests failed"
        )
        assert "Traceback" not in cp.log()
    finally:
        await load.stop()
        client.kill()
        backend.kill()
        cp.kill()
        await app.close()


# --- agent kill -9 -------------------------------------------------------------------------


def envoy_pid(agent: AgentProcess) -> int | None:
    m = re.search(r"started Envoy pid (\d+)", agent.log())
    return int(m.group(1)) if m else None


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] not in ("Z", "X")
    except FileNotFoundError:
        return False


async def test_agent_kill_9_takes_envoy_along_and_restart_recovers(tmp_path: Path) -> None:
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "mesh.yaml").write_text(MESH)
    client_ip, backend_ip = pod_ip(), pod_ip()
    app = EchoApp("backend", backend_ip, 8080)
    await app.start()
    url = f"http://{client_ip}:9080/"
    ready = f"http://{backend_ip}:15020/healthz/ready"
    async with running_control_plane(cfg) as cp:
        backend = mesh_agent(cp, tmp_path, backend_ip, "backend", "app=backend", group="backend")
        client = mesh_agent(cp, tmp_path, client_ip, "client", "app=client")
        restarted = mesh_agent(cp, tmp_path, backend_ip, "backend", "app=backend", group="backend")
        try:
            backend.start()
            client.start()
            await eventually(lambda: _is(status_of(url, "backend"), 200), timeout=30)
            pid = envoy_pid(backend)
            assert pid is not None and alive(pid)
            backend.kill()  # SIGKILL to the agent's process group: Envoy is not in it
            await eventually(lambda: not alive(pid), timeout=10, what="Envoy dies with its agent")
            # Nothing serves the backend pod now.
            await eventually(lambda: _is(status_of(url, "backend"), 503), timeout=10)
            restarted.start()
            await eventually(lambda: _is(status_of(ready), 200), timeout=30, what="ready again")
            await eventually(
                lambda: _is(status_of(url, "backend"), 200), timeout=30, what="traffic again"
            )
            new_pid = envoy_pid(restarted)
            assert new_pid is not None and new_pid != pid and alive(new_pid)
            assert "Traceback" not in restarted.log()
        finally:
            restarted.kill()
            client.kill()
            backend.kill()
            await app.close()


# --- a control plane that freezes ---------------------------------------------------------


class FreezingProxy:
    """A TCP proxy in front of the control plane. `freeze()` stops forwarding on every
    connection open at that moment, in both directions, and keeps them open (a peer that
    hangs, not one that closes); connections opened later are forwarded normally."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.accepted = 0
        self._frozen: list[asyncio.Event] = []  # one per connection: set = frozen
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: list[asyncio.StreamWriter] = []
        self.port = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    def freeze(self) -> None:
        for ev in self._frozen:
            ev.set()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        frozen = asyncio.Event()
        self._frozen.append(frozen)
        up_r, up_w = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        self._writers += [writer, up_w]
        for src, dst in ((reader, up_w), (up_r, writer)):
            t = asyncio.create_task(self._pump(src, dst, frozen))
            self._tasks.add(t)
            t.add_done_callback(self._tasks.discard)

    @staticmethod
    async def _pump(
        src: asyncio.StreamReader, dst: asyncio.StreamWriter, frozen: asyncio.Event
    ) -> None:
        with contextlib.suppress(OSError):
            while not frozen.is_set():
                data = await src.read(65536)
                if not data or frozen.is_set():
                    break
                dst.write(data)
                await dst.drain()
            if frozen.is_set():
                await asyncio.Event().wait()  # hold the connection open, silent, until closed
            dst.close()

    async def close(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for w in self._writers:
            w.close()
        if self._server is not None:
            self._server.close()


async def test_frozen_control_plane_is_detected_by_keepalive(tmp_path: Path) -> None:
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "mesh.yaml").write_text(MESH)
    ip = pod_ip()
    async with running_control_plane(cfg) as cp:
        proxy = FreezingProxy(cp.secure_xds_port)  # TLS passes through it untouched
        await proxy.start()
        agent = tls_agent(
            f"127.0.0.1:{proxy.port}",
            root_file(cp, tmp_path),
            agent_token(cp),
            tmp_path / "a",
            ip,
            "client",
            "app=client",
            # The control plane refuses pings more often than every 10 s (too_many_pings).
            "--keepalive-time",
            "10",
            "--keepalive-timeout",
            "2",
        )
        try:
            agent.start()
            await eventually(lambda: envoy_synced(cp.views.syncz(), ip), timeout=30)
            before = {c for c, conn in cp.xds.connections.items() if ip in conn.proxy.id}
            assert proxy.accepted == 1  # one connection carries every stream
            proxy.freeze()
            t0 = time.monotonic()

            def resynced() -> bool:
                rows = [e for e in cp.views.syncz() if e["stream"] not in before]
                return envoy_synced(rows, ip)

            # Keepalive: a ping after 10 s, unanswered for 2 s -> reconnect (plus backoff).
            await eventually(resynced, timeout=40, what="Envoy SYNCED on a new connection")
            assert proxy.accepted >= 2
            assert time.monotonic() - t0 < 40
            ready = f"http://{ip}:15020/healthz/ready"
            await eventually(lambda: _is(status_of(ready), 200), timeout=10)
        finally:
            agent.kill()
            await proxy.close()


# --- slow consumer ---------------------------------------------------------------------------


def big_mesh(services: int, version: int) -> str:
    """Many services with long names: a CDS response of a few hundred kilobytes."""
    docs = []
    for s in range(services):
        docs.append(
            "apiVersion: v1\nkind: Service\n"
            f"metadata: {{name: svc-{s}-{'x' * 40}, namespace: default,"
            f" labels: {{v: 'v{version}'}}}}\n"
            f"spec:\n  selector: {{app: svc-{s}}}\n"
            f"  ports: [{{name: http, port: {9000 + version % 500}, targetPort: 8080}}]\n"
        )
    return "---\n".join(docs)


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def test_slow_consumer_is_closed_and_memory_stays_bounded(tmp_path: Path) -> None:
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    mesh = cfg / "mesh.yaml"
    mesh.write_text(big_mesh(400, 0))
    slow_n, pushes = 10, 15
    async with running_control_plane(cfg, send_timeout=1.0) as cp:
        target = f"127.0.0.1:{cp.xds_port}"
        opts = [("grpc.max_receive_message_length", 64 << 20)]
        # No BDP probing on the slow channel: its window stays at 64 KB, so the first
        # response it does not read fills it.
        slow_opts = [*opts, ("grpc.http2.bdp_probe", 0)]
        async with (
            grpc.aio.insecure_channel(target, options=slow_opts) as slow_ch,
            grpc.aio.insecure_channel(target, options=opts) as good_ch,
        ):
            # Slow consumers: subscribe, then never read a response.
            slow = []
            for i in range(slow_n):
                call = slow_ch.stream_stream(
                    "/envoy.service.discovery.v3.AggregatedDiscoveryService/"
                    "StreamAggregatedResources",
                    request_serializer=DiscoveryRequest.SerializeToString,
                    response_deserializer=lambda b: b,
                )()
                req = DiscoveryRequest(type_url=typeurls.CLUSTER)
                req.node.id = node_id(pod_ip(), f"slow-{i}")
                await call.write(req)
                slow.append(call)
            good = AdsStream(good_ch)
            req = DiscoveryRequest(type_url=typeurls.CLUSTER)
            req.node.id = node_id(pod_ip(), "good")
            await good.send(req)
            first = await good.recv(10)
            await good.send(
                DiscoveryRequest(
                    type_url=typeurls.CLUSTER,
                    version_info=first.version_info,
                    response_nonce=first.nonce,
                )
            )
            size = first.ByteSize()
            assert size > 100_000
            await eventually(lambda: len(cp.xds.connections) == slow_n + 1, timeout=10)
            rss0 = rss_bytes()
            peak = rss0
            last = first
            for v in range(1, pushes + 1):
                mesh.write_text(big_mesh(400, v))
                # The good client keeps up: it reads and ACKs each push.
                while True:
                    last = await good.recv(15)
                    await good.send(
                        DiscoveryRequest(
                            type_url=typeurls.CLUSTER,
                            version_info=last.version_info,
                            response_nonce=last.nonce,
                        )
                    )
                    if any(f"|{9000 + v}|" in n for n in cluster_names(last)):
                        break
                peak = max(peak, rss_bytes())

            # Every slow stream was closed: it could not take a response within 1 s.
            await eventually(
                lambda: len(cp.xds.connections) == 1, timeout=15, what="slow streams closed"
            )
            errors = cp.metrics.write_timeouts._value.get()
            assert errors >= slow_n
            # Bounded: queueing every push for every slow stream would need
            # slow_n * pushes * size bytes; the server holds at most one response per stream.
            unbounded = slow_n * pushes * size
            assert peak - rss0 < max(unbounded / 3, 48 << 20), (peak - rss0, unbounded)
            await good.close()
            for call in slow:
                call.cancel()


async def test_slow_consumer_learns_its_stream_was_closed(tmp_path: Path) -> None:
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    mesh = cfg / "mesh.yaml"
    mesh.write_text(big_mesh(400, 0))
    async with running_control_plane(cfg, send_timeout=0.5) as cp:
        opts = [("grpc.max_receive_message_length", 64 << 20), ("grpc.http2.bdp_probe", 0)]
        async with grpc.aio.insecure_channel(f"127.0.0.1:{cp.xds_port}", options=opts) as ch:
            call = ch.stream_stream(
                "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources",
                request_serializer=DiscoveryRequest.SerializeToString,
                response_deserializer=lambda b: b,
            )()
            req = DiscoveryRequest(type_url=typeurls.CLUSTER)
            req.node.id = node_id(pod_ip(), "slow")
            await call.write(req)
            await eventually(lambda: len(cp.xds.connections) == 1, timeout=10)
            for v in range(1, 4):
                mesh.write_text(big_mesh(400, v))
                await asyncio.sleep(0.3)
            await eventually(lambda: not cp.xds.connections, timeout=15, what="stream closed")
            try:
                # The status comes after the responses that were already on their way.
                with contextlib.suppress(grpc.aio.AioRpcError):
                    async with asyncio.timeout(10):
                        async for _ in call:
                            pass
                assert await call.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            finally:
                call.cancel()


# --- config flapping -------------------------------------------------------------------------


def flap_mesh(i: int) -> str:
    """Version i: the backend's endpoint address encodes i; service `extra` exists for odd i."""
    docs = [
        "apiVersion: v1\nkind: Service\nmetadata: {name: backend, namespace: default}\n"
        "spec: {selector: {app: backend}, ports: [{name: http, port: 9080}]}\n",
        "apiVersion: networking.istio.io/v1\nkind: WorkloadEntry\n"
        "metadata: {name: backend-0, namespace: default}\n"
        f'spec: {{address: "10.9.{i // 250}.{i % 250 + 1}", labels: {{app: backend}}}}\n',
    ]
    if i % 2:
        docs.append(
            "apiVersion: v1\nkind: Service\nmetadata: {name: extra, namespace: default}\n"
            "spec: {selector: {app: extra}, ports: [{name: http, port: 9081}]}\n"
        )
    return "---\n".join(docs)


class Follower:
    """A simulated Envoy (SotW or delta) that ACKs everything and keeps its view of CDS and
    of the backend's EDS."""

    def __init__(self, channel: grpc.aio.Channel, ip: str, *, delta: bool) -> None:
        self.stream = AdsStream(channel, delta=delta)
        self.delta = delta
        self.ip = ip
        self.clusters: set[str] = set()
        self.endpoints: dict[str, list[str]] = {}
        self.eds_names: list[str] = []
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self.delta:
            req = DeltaDiscoveryRequest(type_url=typeurls.CLUSTER)
        else:
            req = DiscoveryRequest(type_url=typeurls.CLUSTER)
        req.node.id = node_id(self.ip, "follower-delta" if self.delta else "follower")
        await self.stream.send(req)
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        from envoy.config.endpoint.v3.endpoint_pb2 import ClusterLoadAssignment

        while True:
            resp = await self.stream.recv(3600)
            if resp.type_url == typeurls.CLUSTER:
                if self.delta:
                    for r in resp.resources:
                        c = Cluster()
                        r.resource.Unpack(c)
                        self.clusters.add(c.name)
                    self.clusters -= set(resp.removed_resources)
                else:
                    self.clusters = set(cluster_names(resp))
            else:
                items = [r.resource for r in resp.resources] if self.delta else resp.resources
                for a in items:
                    cla = ClusterLoadAssignment()
                    a.Unpack(cla)
                    self.endpoints[cla.cluster_name] = [
                        lb.endpoint.address.socket_address.address
                        for ep in cla.endpoints
                        for lb in ep.lb_endpoints
                    ]
            await self._ack(resp)
            eds = sorted(c for c in self.clusters if c.startswith("outbound|"))
            if eds != self.eds_names:
                old = set(self.eds_names)
                self.eds_names = eds
                await self._subscribe_eds(old, set(eds))

    async def _ack(self, resp: Any) -> None:
        if self.delta:
            await self.stream.send(
                DeltaDiscoveryRequest(type_url=resp.type_url, response_nonce=resp.nonce)
            )
        else:
            await self.stream.send(
                DiscoveryRequest(
                    type_url=resp.type_url,
                    version_info=resp.version_info,
                    response_nonce=resp.nonce,
                    resource_names=self.eds_names if resp.type_url == typeurls.ENDPOINT else [],
                )
            )

    async def _subscribe_eds(self, old: set[str], new: set[str]) -> None:
        if self.delta:
            await self.stream.send(
                DeltaDiscoveryRequest(
                    type_url=typeurls.ENDPOINT,
                    resource_names_subscribe=sorted(new - old),
                    resource_names_unsubscribe=sorted(old - new),
                )
            )
        else:
            await self.stream.send(
                DiscoveryRequest(type_url=typeurls.ENDPOINT, resource_names=sorted(new))
            )

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.stream.close()


async def envoy_view(admin: str) -> tuple[set[str], list[str]]:
    """The real Envoy's clusters and the backend cluster's endpoint addresses."""
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3)) as s,
        s.get(admin + "/clusters?format=json") as r,
    ):
        data = await r.json()
    clusters: set[str] = set()
    backend: list[str] = []
    for c in data.get("cluster_statuses", []):
        clusters.add(c["name"])
        if c["name"] == "outbound|9080||backend.default.svc.cluster.local":
            backend = [
                h["address"]["socket_address"]["address"] for h in c.get("host_statuses", [])
            ]
    return clusters, backend


async def test_config_flapping_every_50ms_ends_on_the_last_config(tmp_path: Path) -> None:
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    mesh = cfg / "mesh.yaml"
    mesh.write_text(flap_mesh(0))
    flaps = 200  # 10 s at one rewrite per 50 ms
    async with running_control_plane(cfg) as cp:
        ip = pod_ip()
        boot = build_bootstrap(
            BootstrapOptions(
                ip=ip,
                pod_name="flapper",
                xds_address=f"127.0.0.1:{cp.xds_port}",
                prometheus_port=None,
            )
        )
        envoy = EnvoyProcess(boot, tmp_path / "envoy")
        admin = f"http://{ip}:15000"
        async with grpc.aio.insecure_channel(f"127.0.0.1:{cp.xds_port}") as ch:
            followers = [Follower(ch, pod_ip(), delta=d) for d in (False, True, False, True)]
            try:
                envoy.start()
                for f in followers:
                    await f.start()
                for i in range(1, flaps + 1):
                    tmp = cfg / ".mesh.yaml.tmp"
                    tmp.write_text(flap_mesh(i))
                    os.replace(tmp, mesh)  # as editors and config-map updates do
                    await asyncio.sleep(0.05)
                want_ep = [f"10.9.{flaps // 250}.{flaps % 250 + 1}"]
                extra = "outbound|9081||extra.default.svc.cluster.local"
                want_extra = bool(flaps % 2)

                async def converged() -> bool:
                    clusters, backend = await envoy_view(admin)
                    if backend != want_ep or (extra in clusters) != want_extra:
                        return False
                    return all(
                        f.endpoints.get("outbound|9080||backend.default.svc.cluster.local")
                        == want_ep
                        and (extra in f.clusters) == want_extra
                        for f in followers
                    )

                await eventually(converged, timeout=20, what="every client on the last config")
                await eventually(
                    lambda: (
                        not [
                            1
                            for e in cp.views.syncz()
                            for v in e["types"].values()
                            if v["status"] != "SYNCED"
                        ]
                    ),
                    timeout=10,
                    what="every stream SYNCED",
                )
            finally:
                for f in followers:
                    await f.close()
                envoy.stop()


async def _is(call: Any, want: int) -> bool:
    return bool(await call == want)
