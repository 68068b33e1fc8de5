"""The load tool's simulated proxy (tests/benchmarks/xds_sim.py), without sockets: responses
built from real Envoy messages go in, the requests Envoy would send come out."""

from __future__ import annotations

from envoy.config.cluster.v3.cluster_pb2 import Cluster
from envoy.config.endpoint.v3.endpoint_pb2 import ClusterLoadAssignment
from envoy.config.listener.v3.listener_pb2 import Listener
from envoy.config.route.v3.route_pb2 import RouteConfiguration
from envoy.extensions.filters.network.http_connection_manager.v3.http_connection_manager_pb2 import (  # noqa: E501
    HttpConnectionManager,
)
from envoy.service.discovery.v3.discovery_pb2 import DeltaDiscoveryRequest, DiscoveryRequest

from tests.benchmarks.xds_sim import (
    CDS,
    EDS,
    LDS,
    RDS,
    Decoder,
    Encoder,
    Request,
    SimulatedProxy,
    delta_response,
    marker_address,
    marker_of,
    proxy_identity,
    sotw_response,
)


def eds_cluster(name: str) -> bytes:
    c = Cluster(name=name, type=Cluster.EDS)
    c.eds_cluster_config.eds_config.ads.SetInParent()
    return c.SerializeToString()


def static_cluster(name: str) -> bytes:
    return Cluster(name=name, type=Cluster.STATIC).SerializeToString()


def cla(name: str, *addresses: str) -> bytes:
    a = ClusterLoadAssignment(cluster_name=name)
    for address in addresses:
        ep = a.endpoints.add().lb_endpoints.add().endpoint
        ep.address.socket_address.address = address
        ep.address.socket_address.port_value = 8080
    return a.SerializeToString()


def http_listener(name: str, route: str) -> bytes:
    hcm = HttpConnectionManager(stat_prefix=name)
    hcm.rds.route_config_name = route
    hcm.rds.config_source.ads.SetInParent()
    lst = Listener(name=name)
    flt = lst.filter_chains.add().filters.add(name="envoy.filters.network.http_connection_manager")
    flt.typed_config.Pack(hcm)
    return lst.SerializeToString()


def route(name: str) -> bytes:
    return RouteConfiguration(name=name).SerializeToString()


def decode_sotw(raw: bytes) -> DiscoveryRequest:
    return DiscoveryRequest.FromString(raw)


# --- identities and markers ----------------------------------------------------------------


def test_identity_is_what_the_agent_sends() -> None:
    ident = proxy_identity(0)
    assert ident.node_id == "sidecar~127.20.1.1~load-0.default~default.svc.cluster.local"
    meta = ident.metadata()
    assert meta["NAMESPACE"] == "default" and meta["AUTO_REGISTER"] == "false"
    assert meta["INSTANCE_IPS"] == ident.ip and meta["NAME"] == "load-0"
    ips = {proxy_identity(i).ip for i in range(20_000)}
    assert len(ips) == 20_000
    assert all(not ip.endswith((".0", ".255")) for ip in ips)


def test_marker_addresses_round_trip_and_ordinary_addresses_carry_none() -> None:
    for j in (1, 2, 249, 250, 251, 62_499, 62_500, 100_000):
        assert marker_of(marker_address(j)) == j
    for address in ("10.0.0.10", "10.3.249.14", "127.0.0.1", "::1", "10.x.1.1"):
        assert marker_of(address) == 0


# --- SotW ----------------------------------------------------------------------------------


def test_sotw_proxy_subscribes_like_envoy_and_converges() -> None:
    p = SimulatedProxy(proxy_identity(3))
    (first,) = p.start()
    assert first == Request(CDS, first=True)

    cds = sotw_response(
        CDS,
        [(CDS, eds_cluster("b")), (CDS, eds_cluster("a")), (CDS, static_cluster("s"))],
        "c1",
        "n1",
    )
    eds_req, cds_ack = p.on_response(Decoder().sotw(cds), now=1.0)
    # EDS for the EDS clusters only, before the CDS ACK (clusters warm on their endpoints).
    assert eds_req == Request(EDS, names=("a", "b"))
    assert cds_ack == Request(CDS, nonce="n1", version="c1")
    assert not p.converged

    decoder = Decoder()
    eds = sotw_response(EDS, [(EDS, cla("a", "10.0.0.1")), (EDS, cla("b", "10.0.0.2"))], "e1", "n2")
    eds_ack, lds_req = p.on_response(decoder.sotw(eds), now=2.0)
    assert eds_ack == Request(EDS, nonce="n2", version="e1", names=("a", "b"))
    assert lds_req == Request(LDS)  # once the clusters are warm
    assert not p.converged

    lds = sotw_response(LDS, [(LDS, http_listener("127.20.1.4_9080", "9080"))], "l1", "n3")
    rds_req, lds_ack = p.on_response(decoder.sotw(lds), now=3.0)
    assert rds_req == Request(RDS, names=("9080",))
    assert lds_ack == Request(LDS, nonce="n3", version="l1")

    rds = sotw_response(RDS, [(RDS, route("9080"))], "r1", "n4")
    (rds_ack,) = p.on_response(decoder.sotw(rds), now=4.0)
    assert rds_ack == Request(RDS, nonce="n4", version="r1", names=("9080",))
    assert p.converged and p.converged_at == 4.0
    assert p.counters.responses == p.counters.acks == {"CDS": 1, "EDS": 1, "LDS": 1, "RDS": 1}


def _converged_sotw(decoder: Decoder) -> SimulatedProxy:
    p = SimulatedProxy(proxy_identity(1), lds=False)
    p.start()
    p.on_response(decoder.sotw(sotw_response(CDS, [(CDS, eds_cluster("a"))], "c1", "n1")), 1.0)
    p.on_response(decoder.sotw(sotw_response(EDS, [(EDS, cla("a", "10.0.0.1"))], "e1", "n2")), 2)
    assert p.converged
    return p


def test_sotw_new_cluster_unconverges_until_its_endpoints_arrive() -> None:
    decoder = Decoder()
    p = _converged_sotw(decoder)
    cds = sotw_response(CDS, [(CDS, eds_cluster("a")), (CDS, eds_cluster("c"))], "c2", "n3")
    eds_req, _ = p.on_response(decoder.sotw(cds), 3.0)
    # The new subscription carries the last EDS version and nonce, as Envoy's does.
    assert eds_req == Request(EDS, nonce="n2", version="e1", names=("a", "c"))
    assert not p.converged
    only_a = sotw_response(EDS, [(EDS, cla("a", "10.0.0.1"))], "e1", "n4")
    p.on_response(decoder.sotw(only_a), 4.0)
    assert not p.converged  # "c" still missing
    both = sotw_response(
        EDS, [(EDS, cla("a", "10.0.0.1")), (EDS, cla("c", "10.0.0.3"))], "e2", "n5"
    )
    p.on_response(decoder.sotw(both), 5.0)
    assert p.converged and p.converged_at == 2  # first convergence is kept


def test_sotw_eds_response_naming_only_what_changed_keeps_the_other_assignments() -> None:
    """As Envoy does: a SotW EDS response updates the clusters it names and leaves the rest."""
    decoder = Decoder()
    p = _converged_sotw(decoder)
    cds = sotw_response(CDS, [(CDS, eds_cluster("a")), (CDS, eds_cluster("c"))], "c2", "n3")
    p.on_response(decoder.sotw(cds), 3.0)
    p.on_response(decoder.sotw(sotw_response(EDS, [(EDS, cla("c", "10.0.0.3"))], "e2", "n4")), 4)
    assert p.holds(EDS) == {"a", "c"} and p.converged
    moved = sotw_response(EDS, [(EDS, cla("a", marker_address(7)))], "e3", "n5")
    p.on_response(decoder.sotw(moved), 5.0)
    assert p.holds(EDS) == {"a", "c"} and p.converged and p.markers == [(7, 5.0)]
    # CDS is state of the world: a cluster it stops naming is gone.
    p.on_response(decoder.sotw(sotw_response(CDS, [(CDS, eds_cluster("a"))], "c3", "n6")), 6)
    assert p.holds(CDS) == {"a"}


def test_decoder_tells_a_partial_eds_response_from_the_full_one_of_the_same_version() -> None:
    """Our server gives a partial EDS push the whole set's version; a proxy that subscribes
    afresh gets the whole set under that version, with another nonce."""
    decoder = Decoder()
    partial = sotw_response(EDS, [(EDS, cla("a", "10.0.0.9"))], "e2", "v7")
    full = sotw_response(
        EDS, [(EDS, cla("a", "10.0.0.9")), (EDS, cla("b", "10.0.0.2"))], "e2", "v6"
    )
    assert decoder.sotw(partial).content.names == {"a"}  # type: ignore[union-attr]
    assert decoder.sotw(full).content.names == {"a", "b"}  # type: ignore[union-attr]


def test_sotw_markers_record_when_each_higher_change_was_acked() -> None:
    decoder = Decoder()
    p = _converged_sotw(decoder)
    for version, j, now in (("e2", 3, 3.0), ("e3", 3, 4.0), ("e4", 5, 5.0)):
        resp = sotw_response(EDS, [(EDS, cla("a", "10.0.0.1", marker_address(j)))], version, "n")
        p.on_response(decoder.sotw(resp), now)
    assert p.markers == [(3, 3.0), (5, 5.0)]


def test_decoder_parses_a_sotw_version_once_for_every_proxy() -> None:
    decoder = Decoder()
    body = [(EDS, cla("a", "10.0.0.1")), (EDS, cla("b", "10.0.0.2"))]
    shared = sotw_response(EDS, body, "e1", "n1")  # our server shares bytes and nonce
    one, two = decoder.sotw(shared), decoder.sotw(shared)
    assert one.content is two.content and decoder.full_decodes == 1
    assert one.content is not None and one.content.names == frozenset({"a", "b"})
    # Another nonce may carry other resources under the same version: decoded again.
    three = decoder.sotw(sotw_response(EDS, body, "e1", "n2"))
    assert three.nonce == "n2" and decoder.full_decodes == 2


# --- delta ---------------------------------------------------------------------------------


def test_delta_proxy_subscribes_unsubscribes_and_converges() -> None:
    decoder = Decoder()
    p = SimulatedProxy(proxy_identity(2), delta=True)
    assert p.start() == [Request(CDS, first=True)]
    cds = delta_response(CDS, [("a", "1", eds_cluster("a")), ("b", "1", eds_cluster("b"))], "1")
    sub, ack = p.on_response(decoder.delta(cds), 1.0)
    assert sub == Request(EDS, subscribe=("a", "b"))
    assert ack == Request(CDS, nonce="1")
    eds = delta_response(
        EDS, [("a", "1", cla("a", "10.0.0.1")), ("b", "1", cla("b", "10.0.0.2"))], "2"
    )
    _, lds = p.on_response(decoder.delta(eds), 2.0)
    assert lds == Request(LDS)
    lds_resp = delta_response(LDS, [("l", "1", http_listener("l", "9080"))], "3")
    rds_sub, _ = p.on_response(decoder.delta(lds_resp), 3.0)
    assert rds_sub == Request(RDS, subscribe=("9080",))
    p.on_response(decoder.delta(delta_response(RDS, [("9080", "1", route("9080"))], "4")), 4.0)
    assert p.converged

    # A cluster goes away: its assignment is unsubscribed; one is added: subscribed.
    change = delta_response(CDS, [("c", "1", eds_cluster("c"))], "5", removed=["b"])
    sub, _ = p.on_response(decoder.delta(change), 5.0)
    assert sub == Request(EDS, subscribe=("c",), unsubscribe=("b",))
    assert not p.converged
    p.on_response(decoder.delta(delta_response(EDS, [("c", "1", cla("c", "10.0.0.3"))], "6")), 6)
    assert p.converged and p.holds(EDS) == {"a", "c"}


def test_delta_marker_comes_from_the_resources_sent() -> None:
    decoder = Decoder()
    p = SimulatedProxy(proxy_identity(2), delta=True, lds=False)
    p.start()
    p.on_response(decoder.delta(delta_response(CDS, [("a", "1", eds_cluster("a"))], "1")), 1)
    update = delta_response(EDS, [("a", "7", cla("a", marker_address(7)))], "2")
    p.on_response(decoder.delta(update), 2.0)
    assert p.marker == 7 and p.markers == [(7, 2.0)]


# --- encoding ------------------------------------------------------------------------------


def test_encoder_writes_the_node_once_and_the_names_of_every_request() -> None:
    ident = proxy_identity(5)
    enc = Encoder(ident, {})
    first = decode_sotw(enc.sotw(Request(CDS, first=True)))
    assert first.node.id == ident.node_id and first.type_url == CDS
    assert first.node.metadata["AUTO_REGISTER"] == "false"
    assert first.node.metadata["NAMESPACE"] == "default"
    ack = decode_sotw(enc.sotw(Request(EDS, nonce="n", version="v", names=("a", "b"))))
    assert not ack.HasField("node")
    assert (ack.response_nonce, ack.version_info, list(ack.resource_names)) == (
        "n",
        "v",
        ["a", "b"],
    )
    nack = decode_sotw(enc.sotw(Request(EDS, nonce="n", error="bad")))
    assert nack.error_detail.message == "bad"
    d = DeltaDiscoveryRequest.FromString(
        enc.delta(Request(EDS, first=True, subscribe=("a",), unsubscribe=("b", "c")))
    )
    assert d.node.id == ident.node_id
    assert list(d.resource_names_subscribe) == ["a"]
    assert list(d.resource_names_unsubscribe) == ["b", "c"]
