"""The agent's xDS proxy against a real control plane: relaying without re-encoding, one TCP
connection for every stream, ResponseHandlers (ACK, NACK visible in syncz, entry points),
and upstream failure ending the downstream stream with UNAVAILABLE."""

from __future__ import annotations

import asyncio
import sys
import textwrap
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import grpc
import pytest
from envoy.config.cluster.v3.cluster_pb2 import Cluster
from envoy.config.listener.v3.listener_pb2 import Listener
from envoy.service.discovery.v3.discovery_pb2 import DeltaDiscoveryRequest, DiscoveryRequest
from google.protobuf.message import Message

from agent.xdsproxy.agentstream import AgentStream
from agent.xdsproxy.handlers import HandlerRegistry
from agent.xdsproxy.relay import RelayStats
from agent.xdsproxy.server import DownstreamServer
from agent.xdsproxy.upstream import UpstreamChannel
from control.app import ControlPlane
from pilotfish_common.backoff import Backoff
from pilotfish_common.lifecycle import Lifecycle
from protos import typeurls
from tests.support.adsclient import AdsStream, node_id
from tests.support.controlplane import eventually, running_control_plane
from tests.support.net import free_port

CDS, EDS = typeurls.CLUSTER, typeurls.ENDPOINT

MESH = textwrap.dedent(
    """\
    apiVersion: v1
    kind: Service
    metadata: {name: alpha, namespace: default}
    spec:
      selector: {app: alpha}
      ports: [{name: http, port: 9080, targetPort: 8080}]
    ---
    apiVersion: networking.istio.io/v1
    kind: WorkloadEntry
    metadata: {name: alpha-1, namespace: default}
    spec: {address: "10.1.0.1", labels: {app: alpha}}
    """
)


def established_to(port: int) -> int:
    """Client-side TCP connections to `port` on this machine, from /proc/net/tcp{,6}."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            fields = line.split()
            remote, state = fields[2], fields[3]
            if state == "01" and int(remote.rsplit(":", 1)[1], 16) == port:
                count += 1
    return count


class Proxy(Lifecycle):
    """The agent's xDS proxy parts, wired as the agent wires them."""

    def __init__(self, cp: ControlPlane, workdir: Path, handlers: HandlerRegistry) -> None:
        self.upstream = UpstreamChannel([f"127.0.0.1:{cp.xds_port}"], max_reconnect_backoff=0.5)
        self.stats = RelayStats()
        self.server = DownstreamServer(workdir / "XDS", self.upstream, handlers, self.stats)
        self.agent_stream = AgentStream(
            self.upstream,
            handlers,
            self.stats,
            node_id=node_id("127.8.0.1", "agent"),
            metadata={"AUTO_REGISTER": "false"},
        )

    async def start(self) -> None:
        await self.upstream.start()
        await self.server.start()
        await self.agent_stream.start()

    async def close(self) -> None:
        await self.agent_stream.close()
        await self.server.close()
        await self.upstream.close()


@pytest.fixture
async def cp(tmp_path: Path) -> AsyncIterator[ControlPlane]:
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "mesh.yaml").write_text(MESH)
    async with running_control_plane(cfg) as cp:
        yield cp


def sotw_request(type_url: str, ip: str, names: Sequence[str] = ()) -> DiscoveryRequest:
    r = DiscoveryRequest(type_url=type_url, resource_names=list(names))
    r.node.id = node_id(ip)
    r.node.metadata.update({"AUTO_REGISTER": "false"})
    return r


async def test_relay_forwards_exact_bytes_and_uses_one_connection(
    cp: ControlPlane, tmp_path: Path
) -> None:
    seen: list[list[Message]] = []
    handlers = HandlerRegistry()
    # The agent consumes LDS itself (a registered type never reaches downstream streams).
    handlers.register(typeurls.LISTENER, seen.append)
    async with Proxy(cp, tmp_path, handlers) as proxy:
        await eventually(lambda: seen, what="handler received LDS")
        assert all(isinstance(m, Listener) for m in seen[0])
        assert [m.name for m in seen[0]] == ["127.8.0.1_9080"]

        async with grpc.aio.insecure_channel(f"unix:{tmp_path / 'XDS'}") as local:
            sotw = AdsStream(local)
            delta = AdsStream(local, delta=True)
            await sotw.send(
                sotw_request(EDS, "127.8.0.2", ["outbound|9080||alpha.default.svc.cluster.local"])
            )
            first = DeltaDiscoveryRequest(type_url=CDS)
            first.node.id = node_id("127.8.0.3")
            await delta.send(first)
            via_agent = await sotw.recv()
            dresp = await delta.recv()
            assert any(r.name.startswith("outbound|9080||alpha") for r in dresp.resources)

            # Agent stream + SotW relay + delta relay: one TCP connection to the control plane.
            await asyncio.sleep(0.2)
            assert proxy.server.active == 2
            assert established_to(cp.xds_port) == 1
            streams = {e["stream"] for e in cp.views.syncz()}
            assert len(streams) == 3
            # The same request straight to the control plane gets the same resources.
            async with grpc.aio.insecure_channel(f"127.0.0.1:{cp.xds_port}") as direct_ch:
                direct = AdsStream(direct_ch)
                await direct.send(
                    sotw_request(
                        EDS, "127.8.0.4", ["outbound|9080||alpha.default.svc.cluster.local"]
                    )
                )
                direct_resp = await direct.recv()
                assert [r.SerializeToString() for r in via_agent.resources] == [
                    r.SerializeToString() for r in direct_resp.resources
                ]
                await direct.close()

            await sotw.close()
            await delta.close()


async def test_handler_error_is_a_nack_visible_in_syncz(cp: ControlPlane, tmp_path: Path) -> None:
    def reject(resources: Sequence[Message]) -> None:
        raise ValueError("clusters are not welcome here")

    handlers = HandlerRegistry()
    handlers.register(CDS, reject)
    async with Proxy(cp, tmp_path, handlers) as proxy:

        def nacked() -> str:
            for entry in cp.views.syncz():
                row = entry["types"].get(CDS)
                if row and row["status"] == "ERROR":
                    return str(row["last_nack"])
            return ""

        message = await eventually(nacked, what="NACK in syncz")
        assert "clusters are not welcome here" in message
        assert proxy.stats.nacks >= 1


async def test_upstream_failure_ends_downstream_with_unavailable(tmp_path: Path) -> None:
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "mesh.yaml").write_text(MESH)
    async with running_control_plane(cfg) as cp:
        proxy = Proxy(cp, tmp_path, HandlerRegistry())
        async with proxy:
            async with grpc.aio.insecure_channel(f"unix:{tmp_path / 'XDS'}") as local:
                s = AdsStream(local)
                await s.send(sotw_request(CDS, "127.8.0.5"))
                await s.recv()
                await cp.close(0)  # the control plane goes away
                with pytest.raises(AssertionError):
                    await s.recv(timeout=10)
                assert s.error is not None
                assert s.error.code() == grpc.StatusCode.UNAVAILABLE
                assert proxy.stats.errors["expected"] >= 1


def test_entry_point_handlers_are_loaded(tmp_path: Path) -> None:
    plugin = tmp_path / "pf_test_plugin.py"
    plugin.write_text(
        "SEEN = []\n"
        "from google.protobuf.struct_pb2 import Struct\n"
        "def setup(registry):\n"
        "    registry.register(\n"
        "        'type.googleapis.com/test.Thing', SEEN.append, message_class=Struct\n"
        "    )\n"
    )
    dist = tmp_path / "pf_test_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: pf-test-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[pilotfish.agent.handlers]\nthings = pf_test_plugin:setup\n"
    )
    broken = tmp_path / "pf_broken-0.1.dist-info"
    broken.mkdir()
    (broken / "METADATA").write_text("Metadata-Version: 2.1\nName: pf-broken\nVersion: 0.1\n")
    (broken / "entry_points.txt").write_text(
        "[pilotfish.agent.handlers]\nbroken = pf_no_such_module:setup\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        registry = HandlerRegistry()
        loaded = registry.load_entry_points()
        assert loaded == ["things"]  # the broken plug-in is skipped, not fatal
        assert "type.googleapis.com/test.Thing" in registry
    finally:
        sys.path.remove(str(tmp_path))


async def test_health_reports_ride_the_agent_stream_and_are_resent_after_a_restart(
    tmp_path: Path,
) -> None:
    """The agent stream's health reports (issue 18): Istio's `istio.io/health` request, never
    answered; the newest one is sent again when the stream reconnects (a restarted control
    plane learns the current health without waiting for a change)."""
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "mesh.yaml").write_text(MESH)
    port = free_port()
    seen: list[tuple[str, str | None]] = []

    def spy(cp: ControlPlane) -> None:
        def record(proxy: object, identity: object, error: str | None, wall: float) -> bool:
            seen.append((getattr(proxy, "id", ""), error))
            return False

        cp.keeper.registry.report_health = record  # type: ignore[method-assign]

    handlers = HandlerRegistry()
    handlers.register(typeurls.NAME_TABLE, lambda resources: None)
    upstream = UpstreamChannel([f"127.0.0.1:{port}"], max_reconnect_backoff=0.5)
    stream = AgentStream(
        upstream,
        handlers,
        RelayStats(),
        node_id=node_id("127.8.0.9", "agent"),
        metadata={"AUTO_REGISTER": "false"},
        backoff=Backoff(initial=0.1, maximum=0.5),
    )
    stream.report_health("status 500")  # before the stream exists: sent once it does
    async with running_control_plane(cfg, xds_port=port) as cp:
        spy(cp)
        await upstream.start()
        await stream.start()
        try:
            await eventually(lambda: seen, timeout=20, what="first report")
            stream.report_health(None)
            await eventually(lambda: seen[-1][1] is None, timeout=20, what="healthy report")
            assert seen[0] == (node_id("127.8.0.9", "agent"), "status 500")
            reports = len(seen)
            async with running_control_plane(cfg, xds_port=port) as restarted:
                spy(restarted)
                await cp.close(0)
                await eventually(
                    lambda: len(seen) > reports, timeout=30, what="report after reconnect"
                )
                assert seen[-1][1] is None  # the newest report, not the first
        finally:
            await stream.close()
            await upstream.close()


async def test_observer_sees_relayed_responses_after_they_are_forwarded(
    cp: ControlPlane, tmp_path: Path
) -> None:
    """Observe mode (issue 24): the downstream stream gets the control plane's response
    unchanged; the observer then sees it decoded; its exception is no NACK."""
    seen: list[list[str]] = []

    def audit(resources: Sequence[Message]) -> None:
        seen.append([getattr(r, "name", "") for r in resources])
        raise RuntimeError("auditor is unhappy")

    handlers = HandlerRegistry()
    handlers.register(CDS, audit, mode="observe")
    async with Proxy(cp, tmp_path, handlers) as proxy:
        async with grpc.aio.insecure_channel(f"unix:{tmp_path / 'XDS'}") as local:
            sotw = AdsStream(local)
            await sotw.send(sotw_request(CDS, "127.8.0.6"))
            resp = await sotw.recv()
            names = [Cluster.FromString(r.value).name for r in resp.resources]
            assert any(n.startswith("outbound|9080||alpha") for n in names)
            # ACK it as Envoy would: the observer's failure must not have NACKed anything.
            await sotw.send(
                DiscoveryRequest(
                    type_url=CDS, version_info=resp.version_info, response_nonce=resp.nonce
                )
            )
            await eventually(lambda: seen, what="observer saw CDS")
            assert sorted(seen[0]) == sorted(names)

            def acked() -> bool:
                for entry in cp.views.syncz():
                    row = entry["types"].get(CDS)
                    if row and entry["proxy"].split("~")[1] == "127.8.0.6":
                        return bool(row["status"] == "SYNCED")
                return False

            await eventually(acked, what="CDS SYNCED in syncz")
            assert proxy.stats.nacks == 0
            assert handlers.counts[CDS].observe_errors >= 1
            assert handlers.counts[CDS].nacks == 0
            # Not subscribed on the agent's own stream: observing is about relayed config.
            assert CDS not in handlers.type_urls
            await sotw.close()
    await handlers.close()
