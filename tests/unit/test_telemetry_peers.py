"""Callers named from the control plane's table of workloads (protos/peers.proto): what the
control plane puts in it (registered workloads, and connected proxies no registry names), and
when the agent trusts it (only for the principal the caller's certificate names)."""

from __future__ import annotations

from envoy.data.accesslog.v3.accesslog_pb2 import AccessLogType, TCPAccessLogEntry
from google.protobuf import any_pb2

from agent.telemetry.aggregator import MetricsAggregator
from agent.telemetry.labels import TCP_LABELS, tcp_labels
from agent.telemetry.peers import MAX_PER_ADDRESS, PeerDirectory
from control.ca.identity import Identity
from control.config.meshconfig import parse_mesh_config
from control.generate import GENERATORS, ROUTER_GENERATORS
from control.generate.context import GenContext
from control.model.index import MeshIndex
from control.model.peer import ConnectedPeer
from control.model.proxy import Proxy, proxy_from_node
from control.registry.autoregister import WorkloadRegistry
from control.registry.keeper import WorkloadKeeper
from control.registry.peers import ConnectedPeers
from control.xds.cache import ResourceCache
from protos import peers_pb2
from protos import telemetry as t
from protos.typeurls import PEER_TABLE
from tests.support.mesh import workload_group_yaml
from tests.support.traffic import mesh_config
from tests.unit.test_telemetry_metrics import CLIENT, tcp_entry

CLIENT_IP = "10.0.0.7"


def _table(*peers: peers_pb2.Peer) -> PeerDirectory:
    directory = PeerDirectory()
    directory([peers_pb2.PeerTable(peers=list(peers))])
    return directory


def _client(ip: str = CLIENT_IP, principal: str = CLIENT) -> peers_pb2.Peer:
    return peers_pb2.Peer(
        ip=ip, workload="client", namespace="shop", app="client", version="v2", principal=principal
    )


def _entry(peer: str | None = CLIENT, remote: str = CLIENT_IP) -> TCPAccessLogEntry:
    e = tcp_entry("s1", AccessLogType.TcpConnectionEnd, 10, 20, peer=peer)
    e.common_properties.downstream_direct_remote_address.socket_address.address = remote
    return e


def _labels(entry: TCPAccessLogEntry, peers: PeerDirectory | None) -> dict[str, str]:
    return dict(zip(TCP_LABELS, tcp_labels(entry, peers), strict=True))


def test_an_mtls_caller_at_its_address_is_named() -> None:
    got = _labels(_entry(), _table(_client()))
    assert got["source_workload"] == "client" and got["source_workload_namespace"] == "shop"
    assert got["source_app"] == "client" and got["source_version"] == "v2"
    assert got["source_principal"] == CLIENT
    # Without the table, as before: unknown.
    assert _labels(_entry(), None)["source_workload"] == "unknown"


def test_the_address_alone_proves_nothing() -> None:
    table = _table(_client())
    # A plaintext caller from the right address.
    assert _labels(_entry(peer=None), table)["source_workload"] == "unknown"
    # Another identity from the right address.
    other = "spiffe://cluster.local/ns/shop/sa/intruder"
    assert _labels(_entry(peer=other), table)["source_workload"] == "unknown"
    # The right identity from another address: the one workload with it (a sidecar on a
    # loopback alias calls from 127.0.0.1)...
    assert _labels(_entry(remote="10.0.0.8"), table)["source_workload"] == "client"
    # ...but not when two have it: the address would have to say which.
    twin = peers_pb2.Peer(ip="10.0.0.9", workload="client-b", namespace="shop", principal=CLIENT)
    twins = _table(_client(), twin)
    assert _labels(_entry(remote="10.0.0.8"), twins)["source_workload"] == "unknown"
    assert _labels(_entry(remote="10.0.0.9"), twins)["source_workload"] == "client-b"


def test_a_shared_address_picks_by_principal_and_a_crowded_one_names_none() -> None:
    web = peers_pb2.Peer(ip=CLIENT_IP, workload="web", namespace="web", principal="spiffe://x")
    assert _labels(_entry(), _table(web, _client()))["source_workload"] == "client"
    crowd = [_client(principal=f"spiffe://cluster.local/ns/shop/sa/s{i}") for i in range(8)]
    # (The client's principal held elsewhere too: no workload is its only holder.)
    twin = peers_pb2.Peer(ip="10.0.0.9", workload="client-b", namespace="shop", principal=CLIENT)
    table = _table(*crowd, _client(), twin)
    assert len(crowd) + 1 > MAX_PER_ADDRESS
    assert _labels(_entry(), table)["source_workload"] == "unknown"
    # IPv6 in any spelling.
    v6 = _table(_client(ip="fd00:0:0::7"))
    assert _labels(_entry(remote="fd00::7"), v6)["source_workload"] == "client"


def test_the_aggregator_labels_tcp_series_with_the_table() -> None:
    agg = MetricsAggregator(peers=_table(_client()))
    agg.record_tcp(_entry())
    ((key, series),) = agg.tcp.items()
    assert dict(zip(TCP_LABELS, key, strict=True))["source_workload"] == "client"
    assert series.received == 20


def test_the_control_plane_lists_registered_workloads_with_their_principals() -> None:
    config = mesh_config(workload_group_yaml("backend", labels={"app": "backend", "version": "v1"}))
    member = proxy_from_node(
        "sidecar~10.0.0.9~backend-0.default~default.svc.cluster.local",
        {
            "LABELS": {"app": "backend", "version": "v1"},
            "WORKLOAD_GROUP": "backend",
            "SERVICE_ACCOUNT": "backend",
            t.ALS_NODE_METADATA: "true",
        },
    )
    idx = MeshIndex(config, [member.as_workload()], mesh=parse_mesh_config("", "m"))
    ctx = GenContext(idx, ResourceCache())
    resources = GENERATORS[PEER_TABLE](ctx, member)
    (resource,) = resources.values()
    wrapped = any_pb2.Any()
    wrapped.ParseFromString(resource.any_bytes)
    table = peers_pb2.PeerTable()
    assert wrapped.Unpack(table)
    rows = [(p.ip, p.workload, p.namespace, p.app, p.version, p.principal) for p in table.peers]
    # As its own metrics tags name it (a registered group member would be its group).
    assert rows == [
        (
            "10.0.0.9",
            "backend-0",
            "default",
            "backend",
            "v1",
            "spiffe://cluster.local/ns/default/sa/backend",
        )
    ]
    # Not for a proxy that reports no standard metrics.
    plain = proxy_from_node("sidecar~10.0.0.10~x.default~default.svc.cluster.local", {})
    assert not GENERATORS[PEER_TABLE](ctx, plain)
    assert PEER_TABLE in ROUTER_GENERATORS


def _rows(ctx: GenContext, proxy: Proxy) -> list[tuple[str, ...]]:
    (resource,) = GENERATORS[PEER_TABLE](ctx, proxy).values()
    wrapped = any_pb2.Any()
    wrapped.ParseFromString(resource.any_bytes)
    table = peers_pb2.PeerTable()
    assert wrapped.Unpack(table)
    return [(p.ip, p.workload, p.namespace, p.app, p.version, p.principal) for p in table.peers]


def _sidecar(ip: str, pod: str, **meta: object) -> Proxy:
    return proxy_from_node(
        f"sidecar~{ip}~{pod}.default~default.svc.cluster.local",
        {"LABELS": {"app": pod, "version": "v2"}, t.ALS_NODE_METADATA: "true", **meta},
    )


def test_connected_proxies_no_registry_names_are_in_the_table_as_they_authenticated() -> None:
    peers = ConnectedPeers()
    client = _sidecar("10.0.0.7", "client", SERVICE_ACCOUNT="claimed")
    me = Identity("default", "client")
    assert peers.connect(client, me)
    assert not peers.connect(client, me)  # its second stream (the agent's own)
    # Not tracked: plaintext, another namespace than it proved, proxyless gRPC, no metrics.
    assert not peers.connect(_sidecar("10.0.0.8", "plain"), None)
    assert not peers.connect(_sidecar("10.0.0.8", "x"), Identity("other", "x"))
    assert not peers.connect(_sidecar("10.0.0.8", "g", GENERATOR="grpc"), me)
    assert not peers.connect(
        proxy_from_node("sidecar~10.0.0.8~y.default~default.svc.cluster.local", {}), me
    )

    config = mesh_config(workload_group_yaml("backend", labels={"app": "backend"}))
    member = _sidecar("10.0.0.9", "backend-0", WORKLOAD_GROUP="backend")
    idx = MeshIndex(config, [member.as_workload()], mesh=parse_mesh_config("", "m"))
    # The registered workload's proxy is connected too (authenticated as `backend`): the
    # index's row names it (here as its node describes it: sa `default`), no second row.
    ctx = GenContext(idx, ResourceCache(), peers=(*peers.peers(), *_tracked(member, "backend")))
    assert _rows(ctx, member) == [
        ("10.0.0.7", "client", "default", "client", "v2", CLIENT_OF_DEFAULT),
        ("10.0.0.9", "backend-0", "default", "backend-0", "v2", DEFAULT_OF_DEFAULT),
    ]

    # It stays while a stream is open, and goes with its last.
    assert not peers.disconnect(client, me)
    assert peers.peers()
    assert peers.disconnect(client, me)
    assert peers.peers() == ()
    assert not peers.disconnect(client, me)


CLIENT_OF_DEFAULT = "spiffe://cluster.local/ns/default/sa/client"
DEFAULT_OF_DEFAULT = "spiffe://cluster.local/ns/default/sa/default"


def _tracked(proxy: Proxy, account: str) -> tuple[ConnectedPeer, ...]:
    peers = ConnectedPeers()
    peers.connect(proxy, Identity(proxy.namespace, account))
    return peers.peers()


async def test_the_keeper_tells_the_pipeline_when_connected_peers_change() -> None:
    keeper = WorkloadKeeper(WorkloadRegistry(), register=False)
    told: list[int] = []
    keeper.subscribe(lambda: told.append(len(keeper.connected_peers())))
    client = _sidecar("10.0.0.7", "client")
    keeper.proxy_connected(client, Identity("default", "client"))
    keeper.proxy_connected(client, Identity("default", "client"))
    keeper.proxy_disconnected(client, Identity("default", "client"))
    assert told == [1]
    keeper.proxy_disconnected(client, Identity("default", "client"))
    assert told == [1, 0]
