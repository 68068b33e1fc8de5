"""DESIGN wire rules, each tested against the running gRPC server with real streams."""

from __future__ import annotations

import asyncio
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from envoy.config.endpoint.v3.endpoint_pb2 import ClusterLoadAssignment
from envoy.service.discovery.v3.discovery_pb2 import DeltaDiscoveryRequest, DiscoveryRequest

from control.app import ControlPlane
from protos import typeurls
from tests.support.adsclient import AdsStream, cluster_names, node_id
from tests.support.controlplane import bounded_teardown, eventually, running_control_plane

CDS, EDS, LDS, RDS = typeurls.CLUSTER, typeurls.ENDPOINT, typeurls.LISTENER, typeurls.ROUTE


def service(name: str, ip: str, port: int = 9080) -> str:
    return textwrap.dedent(
        f"""\
        apiVersion: v1
        kind: Service
        metadata: {{name: {name}, namespace: default}}
        spec:
          selector: {{app: {name}}}
          ports: [{{name: http, port: {port}, targetPort: 8080}}]
        ---
        apiVersion: networking.istio.io/v1
        kind: WorkloadEntry
        metadata: {{name: {name}-1, namespace: default}}
        spec: {{address: "{ip}", labels: {{app: {name}}}}}
        """
    )


def cluster(name: str, port: int = 9080) -> str:
    return f"outbound|{port}||{name}.default.svc.cluster.local"


@pytest.fixture
async def setup(tmp_path: Path) -> AsyncIterator[tuple[ControlPlane, Path, grpc.aio.Channel]]:
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "a.yaml").write_text(service("alpha", "10.0.0.1"))
    async with running_control_plane(cfg) as cp:
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{cp.xds_port}")
        yield cp, cfg, channel
        await bounded_teardown(channel.close(), "client channel close")


def req(
    type_url: str,
    names: list[str] | None = None,
    *,
    nonce: str = "",
    version: str = "",
    node: str | None = None,
    error: str = "",
) -> DiscoveryRequest:
    r = DiscoveryRequest(
        type_url=type_url, resource_names=names or [], response_nonce=nonce, version_info=version
    )
    if node:
        r.node.id = node
    if error:
        r.error_detail.code = 3
        r.error_detail.message = error
    return r


async def change_config(cp: ControlPlane, path: Path, text: str) -> None:
    before = cp.pushes
    path.write_text(text)
    await eventually(lambda: cp.pushes > before, timeout=5, what="push after config change")


async def test_rule1_stream_without_node_is_refused(setup) -> None:
    cp, _, channel = setup
    s = AdsStream(channel)
    await s.send(req(CDS))
    with pytest.raises(AssertionError):
        await s.recv()
    assert s.error is not None and s.error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "node" in (s.error.details() or "")
    assert cp.xds.connections == {}


async def test_rule1_malformed_request_closes_only_that_stream(setup) -> None:
    cp, _, channel = setup
    good = AdsStream(channel)
    await good.send(req(CDS, node=node_id("127.9.0.1")))
    await good.recv()
    bad = channel.stream_stream(
        "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources",
        request_serializer=lambda b: b,
        response_deserializer=lambda b: b,
    )()
    await bad.write(b"\xff\xff\xff")
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await bad.read()
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    # The other stream on the same channel is untouched.
    await good.send(req(EDS, [cluster("alpha")]))
    resp = await good.recv()
    assert resp.type_url == EDS
    await good.close()


async def test_rule2_nack_recorded_and_not_resent(setup) -> None:
    cp, cfg, channel = setup
    s = AdsStream(channel)
    await s.send(req(CDS, node=node_id("127.9.0.2")))
    first = await s.recv()
    await s.send(req(CDS, nonce=first.nonce, version=first.version_info, error="bad cluster"))
    row = await eventually(lambda: _syncz_type(cp, CDS, "ERROR"), what="syncz ERROR")
    assert row["last_nack"] == "bad cluster"
    # A push with nothing changed must not re-send what was rejected.
    cp.push_now()
    await s.expect_silence()
    # A real config change is sent.
    await change_config(cp, cfg / "b.yaml", service("beta", "10.0.0.2"))
    resp = await s.recv()
    assert cluster("beta") in cluster_names(resp)
    metrics = cp.metrics.render().decode()
    assert 'pilot_total_xds_rejects{type="cds"} 1.0' in metrics
    await s.close()


async def test_rule3_stale_nonce_is_ignored(setup) -> None:
    cp, _, channel = setup
    s = AdsStream(channel)
    await s.send(req(EDS, [cluster("alpha")], node=node_id("127.9.0.3")))
    r1 = await s.recv()
    # A stale nonce carrying a new subscription: ignored entirely.
    await s.send(req(EDS, [cluster("alpha"), cluster("nope")], nonce="stale-" + r1.nonce))
    await s.expect_silence()
    row = _syncz_type(cp, EDS, "STALE")
    assert row and row["sent_nonce"] == r1.nonce
    await s.close()


async def test_rule4_only_changes_and_new_names_are_sent(setup) -> None:
    cp, cfg, channel = setup
    s = AdsStream(channel)
    await s.send(req(EDS, [cluster("alpha")], node=node_id("127.9.0.4")))
    r1 = await s.recv()
    await s.send(req(EDS, [cluster("alpha")], nonce=r1.nonce, version=r1.version_info))
    cp.push_now()
    await s.expect_silence()  # nothing changed
    # A newly added name is answered even though nothing changed in config.
    await s.send(
        req(EDS, [cluster("alpha"), cluster("ghost")], nonce=r1.nonce, version=r1.version_info)
    )
    r2 = await s.recv()
    assert r2.nonce != r1.nonce
    await s.close()


async def test_rule5_wildcards_and_not_yet_existing_names(setup) -> None:
    cp, cfg, channel = setup
    legacy, explicit, named = AdsStream(channel), AdsStream(channel), AdsStream(channel)
    await legacy.send(req(CDS, node=node_id("127.9.0.5")))
    await explicit.send(req(CDS, ["*"], node=node_id("127.9.0.6")))
    await named.send(req(EDS, [cluster("later")], node=node_id("127.9.0.7")))
    for s in (legacy, explicit):
        r = await s.recv()
        assert cluster("alpha") in cluster_names(r)
        await s.send(req(CDS, [] if s is legacy else ["*"], nonce=r.nonce, version=r.version_info))
    r = await named.recv()  # first request is always answered, here with nothing in it
    assert len(r.resources) == 0
    await named.send(req(EDS, [cluster("later")], nonce=r.nonce, version=r.version_info))
    await change_config(cp, cfg / "later.yaml", service("later", "10.0.0.9"))
    r = await named.recv()
    cla = ClusterLoadAssignment()
    r.resources[0].Unpack(cla)
    assert cla.cluster_name == cluster("later")
    assert cla.endpoints[0].lb_endpoints[0].endpoint.address.socket_address.address == "10.0.0.9"
    for s in (legacy, explicit):
        r = await s.recv()
        assert cluster("later") in cluster_names(r)
    for s in (legacy, explicit, named):
        await s.close()


async def test_rule6_push_order_and_cluster_removal_last(setup) -> None:
    cp, cfg, channel = setup
    s = AdsStream(channel)
    ip = "127.9.0.8"
    await s.send(req(CDS, node=node_id(ip)))
    await s.send(req(LDS))
    seen: dict[str, object] = {}
    while len(seen) < 2:
        r = await s.recv()
        seen[r.type_url] = r
        await s.send(req(r.type_url, nonce=r.nonce, version=r.version_info))
    await s.send(req(EDS, [cluster("alpha")]))
    await s.send(req(RDS, ["9080"]))
    eds_last = ""
    for _ in range(2):
        r = await s.recv()
        if r.type_url == EDS:
            eds_last = r.nonce
        await s.send(
            req(
                r.type_url,
                list((r.type_url == EDS and [cluster("alpha")]) or ["9080"]),
                nonce=r.nonce,
                version=r.version_info,
            )
        )
    # Replace alpha by beta: the push adds a cluster and removes one. The client behaves like
    # Envoy: after each CDS response it asks EDS for exactly the clusters it now has.
    await change_config(cp, cfg / "a.yaml", service("beta", "10.0.0.2"))
    order = []
    eds_names = [cluster("alpha")]
    last_nonce = {EDS: eds_last}
    while True:
        try:
            r = await s.recv(timeout=1.0)
        except TimeoutError:
            break
        order.append((r.type_url, cluster_names(r) if r.type_url == CDS else []))
        last_nonce[r.type_url] = r.nonce
        names = {EDS: eds_names, RDS: ["9080"]}.get(r.type_url, [])
        await s.send(req(r.type_url, names, nonce=r.nonce, version=r.version_info))
        if r.type_url == CDS:
            eds_names = sorted(cluster_names(r))
            await s.send(req(EDS, eds_names, nonce=last_nonce[EDS]))
    cds = [names for t, names in order if t == CDS]
    types = [t for t, _ in order]
    assert types[0] == CDS and len(cds) == 2, types
    transitional, final = cds
    assert cluster("alpha") in transitional and cluster("beta") in transitional
    assert cluster("alpha") not in final and cluster("beta") in final
    # Routes move to beta before alpha's cluster is removed.
    last_cds = len(types) - 1 - types[::-1].index(CDS)
    assert RDS in types[:last_cds], types
    await s.close()


async def test_rule7_delta_versions_removals_and_reconnect(setup) -> None:
    cp, cfg, channel = setup
    s = AdsStream(channel, delta=True)
    first = DeltaDiscoveryRequest(type_url=CDS)
    first.node.id = node_id("127.9.0.9")
    await s.send(first)
    r = await s.recv()
    have = {res.name: res.version for res in r.resources}
    assert cluster("alpha") in have
    await s.send(DeltaDiscoveryRequest(type_url=CDS, response_nonce=r.nonce))
    await change_config(cp, cfg / "b.yaml", service("beta", "10.0.0.2"))
    r = await s.recv()
    assert [res.name for res in r.resources] == [cluster("beta")]  # only what changed
    assert list(r.removed_resources) == []
    await s.send(DeltaDiscoveryRequest(type_url=CDS, response_nonce=r.nonce))
    have[cluster("beta")] = r.resources[0].version
    (cfg / "b.yaml").unlink()
    r = await s.recv()
    assert list(r.removed_resources) == [cluster("beta")] and not r.resources
    del have[cluster("beta")]
    await s.close()
    # Reconnect with initial_resource_versions: unchanged not resent, stale one sent, gone removed.
    s2 = AdsStream(channel, delta=True)
    again = DeltaDiscoveryRequest(type_url=CDS)
    again.node.id = node_id("127.9.0.9")
    again.initial_resource_versions.update(have)
    again.initial_resource_versions[cluster("alpha")] = "old-version"
    again.initial_resource_versions[cluster("zeta")] = "x"
    await s2.send(again)
    r = await s2.recv()
    assert [res.name for res in r.resources] == [cluster("alpha")]
    assert cluster("zeta") in r.removed_resources
    await s2.close()


async def test_rule8_resources_serialized_once_for_all_proxies(setup) -> None:
    cp, _, channel = setup
    streams = [AdsStream(channel) for _ in range(5)]
    for i, s in enumerate(streams):
        await s.send(req(EDS, [cluster("alpha")], node=node_id(f"127.9.1.{i + 1}")))
    resps = [await s.recv() for s in streams]
    before = cp.cache.serializations
    assert len({r.resources[0].SerializeToString() for r in resps}) == 1
    cp.push_now()
    await asyncio.sleep(0.3)
    assert cp.cache.serializations == before  # nothing changed: nothing re-serialized
    for s in streams:
        await s.close()


async def test_rule9_pushes_are_debounced(setup) -> None:
    cp, cfg, channel = setup
    before = cp.pushes
    for i in range(10):
        (cfg / "flap.yaml").write_text(service("flap", f"10.0.1.{i + 1}"))
        await asyncio.sleep(0.01)
    await eventually(lambda: cp.pushes > before, timeout=5)
    await asyncio.sleep(0.3)
    assert cp.pushes - before <= 2  # ten changes, coalesced
    assert cp.index.service_by_host["flap.default.svc.cluster.local"]


def _syncz_type(cp: ControlPlane, type_url: str, status: str) -> dict | None:
    for entry in cp.views.syncz():
        row = entry["types"].get(type_url)
        if row and row["status"] == status:
            return row
    return None


async def test_endpoint_only_change_pushes_only_eds(setup) -> None:
    cp, cfg, channel = setup
    s = AdsStream(channel)
    first = req(CDS, node=node_id("127.9.2.1"))
    first.node.metadata.update({"AUTO_REGISTER": "false"})  # no registry push of its own
    await s.send(first)
    r = await s.recv()
    await s.send(req(CDS, nonce=r.nonce, version=r.version_info))
    await s.send(req(EDS, [cluster("alpha")]))
    r = await s.recv()
    await s.send(req(EDS, [cluster("alpha")], nonce=r.nonce, version=r.version_info))
    before = cp.metrics.eds_only_pushes._value.get()
    await change_config(cp, cfg / "a.yaml", service("alpha", "10.0.0.77"))
    r = await s.recv()
    assert r.type_url == EDS
    cla = ClusterLoadAssignment()
    r.resources[0].Unpack(cla)
    assert cla.endpoints[0].lb_endpoints[0].endpoint.address.socket_address.address == "10.0.0.77"
    assert cp.metrics.eds_only_pushes._value.get() == before + 1
    # A service change is a full push: the new cluster arrives over CDS.
    await change_config(cp, cfg / "b.yaml", service("beta", "10.0.0.2"))
    r = await s.recv()
    assert r.type_url == CDS and cluster("beta") in cluster_names(r)
    assert cp.metrics.eds_only_pushes._value.get() == before + 1
    await s.close()


def mtls_service(ip: str, account: str) -> str:
    return textwrap.dedent(
        f"""\
        apiVersion: v1
        kind: Service
        metadata: {{name: alpha, namespace: default}}
        spec:
          selector: {{app: alpha}}
          ports: [{{name: http, port: 9080, targetPort: 8080}}]
        ---
        apiVersion: networking.istio.io/v1
        kind: WorkloadEntry
        metadata: {{name: alpha-1, namespace: default}}
        spec:
          address: "{ip}"
          serviceAccount: {account}
          labels: {{app: alpha, security.istio.io/tlsMode: istio}}
        """
    )


async def test_identity_change_pushes_clusters_address_change_only_eds(setup) -> None:
    """Auto mTLS clusters carry the SPIFFE IDs of the service's workloads (SANs): a workload
    change that alters them needs CDS too; one that keeps them stays an EDS-only push."""
    cp, cfg, channel = setup
    s = AdsStream(channel)
    first = req(CDS, node=node_id("127.9.2.2"))
    first.node.metadata.update({"AUTO_REGISTER": "false", "SDS": "true"})
    await s.send(first)
    r = await s.recv()
    await s.send(req(CDS, nonce=r.nonce, version=r.version_info))
    await s.send(req(EDS, [cluster("alpha")]))
    r = await s.recv()
    await s.send(req(EDS, [cluster("alpha")], nonce=r.nonce, version=r.version_info))
    eds_only = cp.metrics.eds_only_pushes
    before = eds_only._value.get()
    await change_config(cp, cfg / "a.yaml", mtls_service("10.0.0.1", "alpha-sa"))
    r = await s.recv()
    assert r.type_url == CDS
    assert b"spiffe://cluster.local/ns/default/sa/alpha-sa" in b"".join(
        a.value for a in r.resources
    )
    assert eds_only._value.get() == before
    await s.send(req(CDS, nonce=r.nonce, version=r.version_info))
    r = await s.recv()
    assert r.type_url == EDS  # the endpoint now carries tlsMode: istio
    await s.send(req(EDS, [cluster("alpha")], nonce=r.nonce, version=r.version_info))
    await change_config(cp, cfg / "a.yaml", mtls_service("10.0.0.9", "alpha-sa"))
    r = await s.recv()
    assert r.type_url == EDS
    assert eds_only._value.get() == before + 1
    await s.close()
