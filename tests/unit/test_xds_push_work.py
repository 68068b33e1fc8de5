"""How much work a push and its ACKs cost per stream (issue 23, target 5), counted in
allocations and encodings rather than timed: the churn and fan-out benchmarks time it.

An ACK of SotW endpoints names every cluster the proxy uses; a thousand streams ACK each push,
and turning each one's names into a thousand strings only to find them unchanged was the
largest piece of Python work per stream and push.
"""

from __future__ import annotations

import tracemalloc

from envoy.config.core.v3.base_pb2 import ControlPlane, Node
from envoy.config.endpoint.v3.endpoint_pb2 import ClusterLoadAssignment
from envoy.service.discovery.v3.discovery_pb2 import (
    DeltaDiscoveryRequest,
    DeltaDiscoveryResponse,
    DiscoveryRequest,
)
from google.rpc.status_pb2 import Status

from control.xds.cache import Resource, ResourceCache, ResourceSet
from control.xds.connection import encode_response
from control.xds.delta import DeltaStream
from control.xds.sotw import SotwStream
from control.xds.state import RequestKind
from protos import typeurls, wire

EDS = typeurls.ENDPOINT
NAMES = [f"outbound|9080||svc-{i}.default.svc.cluster.local" for i in range(1000)]


def _raw(**fields: object) -> bytes:
    return DiscoveryRequest(**fields).SerializeToString()  # type: ignore[arg-type]


def _decoded(raw: bytes) -> DiscoveryRequest:
    return DiscoveryRequest.FromString(raw)


def test_request_names_match_sees_the_names_on_the_bytes() -> None:
    names = wire.request_names(NAMES)
    ack = _raw(version_info="v1", resource_names=NAMES, type_url=EDS, response_nonce="n1")
    assert wire.request_names_match(ack, names)
    # The node on every request (Envoy without set_node_on_first_message_only), a NACK's
    # error_detail, the names appended after the other fields (the load tool does that):
    # whole fields around the names, none of them a name.
    node = Node(id="sidecar~10.0.0.1~a.b~b.svc.cluster.local")
    assert wire.request_names_match(
        _raw(version_info="v1", node=node, resource_names=NAMES, type_url=EDS), names
    )
    nack = _raw(resource_names=NAMES, type_url=EDS, error_detail=Status(code=3, message="x"))
    assert wire.request_names_match(nack, names)
    appended = _raw(type_url=EDS, response_nonce="n1") + _raw(resource_names=NAMES)
    assert _decoded(appended).resource_names == NAMES
    assert wire.request_names_match(appended, names)
    assert wire.request_names_match(_raw(type_url=EDS), wire.request_names([]))
    # Anything else is not a match: other names, one more or one fewer, another order,
    # names on both sides of another field, none at all.
    for other in (NAMES[:-1], [*NAMES, "x"], [*NAMES[:-1], NAMES[-1] + "X"], NAMES[::-1]):
        assert not wire.request_names_match(_raw(resource_names=other, type_url=EDS), names)
    split = _raw(resource_names=NAMES[:500], type_url=EDS) + _raw(resource_names=NAMES[500:])
    assert list(_decoded(split).resource_names) == NAMES
    assert not wire.request_names_match(split, names)
    assert not wire.request_names_match(_raw(type_url=EDS, response_nonce="n1"), names)
    assert not wire.request_names_match(ack, wire.request_names([]))
    # The names' bytes inside another field (here the node's id) are not the names.
    inside = _raw(node=Node(id=names.decode()), type_url=EDS)
    assert not wire.request_names_match(inside, names)
    assert not wire.request_names_match(b"\xff", names)  # malformed


def _stream_holding_endpoints() -> tuple[SotwStream, str]:
    """A stream subscribed to NAMES that was sent their (empty) set once."""
    s = SotwStream("s")
    first = _raw(node=Node(id="sidecar~10.0.0.1~a.b~b.svc.cluster.local"), type_url=EDS)
    s.receive(_decoded(first), first)
    raw = _raw(resource_names=NAMES, type_url=EDS)
    assert s.receive(_decoded(raw), raw).kind is RequestKind.INITIAL
    resp = s.respond(EDS, ResourceSet(()), force=True)
    assert resp is not None
    return s, resp.nonce


def test_an_unchanged_sotw_ack_makes_no_strings_of_its_names() -> None:
    s, nonce = _stream_holding_endpoints()
    raw = _raw(version_info="v", resource_names=NAMES, type_url=EDS, response_nonce=nonce)
    req = _decoded(raw)
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        outcome = s.receive(req, raw)
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    assert outcome.kind is RequestKind.ACK and not outcome.must_respond
    grown = sum(d.size_diff for d in after.compare_to(before, "filename") if d.size_diff > 0)
    # A tuple of the thousand names is ~100 KB of strings; the ACK itself needs well under 2.
    assert grown < 4_000, grown


def test_unchanged_sotw_acks_share_one_outcome() -> None:
    # A thousand streams ACK each push: one outcome object for all of them, not one each.
    outcomes = []
    for _ in range(3):
        s, nonce = _stream_holding_endpoints()
        raw = _raw(version_info="v", resource_names=NAMES, type_url=EDS, response_nonce=nonce)
        outcomes.append(s.receive(_decoded(raw), raw))
    assert all(o is outcomes[0] for o in outcomes)
    assert outcomes[0].kind is RequestKind.ACK and not outcomes[0].must_respond
    # The same outcome a delta ACK gets: the stream kind is not part of it.
    d = DeltaStream("d")
    d.receive(DeltaDiscoveryRequest(type_url=EDS, resource_names_subscribe=NAMES[:3]))
    (first,) = d.push({EDS: ResourceSet(())})
    ack = DeltaDiscoveryRequest(type_url=EDS, response_nonce=first.nonce)
    assert d.receive(ack) is outcomes[0]
    # One with an error message is the request's own.
    s, nonce = _stream_holding_endpoints()
    nack = _raw(
        resource_names=NAMES, type_url=EDS, response_nonce=nonce, error_detail=Status(message="x")
    )
    got = s.receive(_decoded(nack), nack)
    assert got.kind is RequestKind.NACK and got.error_message == "x"


def test_a_changed_sotw_subscription_is_still_seen() -> None:
    s, nonce = _stream_holding_endpoints()
    raw = _raw(resource_names=[*NAMES, "new"], type_url=EDS, response_nonce=nonce)
    outcome = s.receive(_decoded(raw), raw)
    assert outcome.kind is RequestKind.ACK and outcome.must_respond
    assert "new" in s.subscription(EDS)[1]
    # And back: the names shrink, nothing new to answer, the stream forgets "new".
    resp = s.respond(EDS, ResourceSet(()), force=True)
    assert resp is not None
    raw = _raw(resource_names=NAMES, type_url=EDS, response_nonce=resp.nonce)
    outcome = s.receive(_decoded(raw), raw)
    assert outcome.kind is RequestKind.ACK and not outcome.must_respond
    assert "new" not in s.subscription(EDS)[1]
    # A NACK (its error_detail is no match for the bytes) still records the error.
    raw = _raw(
        resource_names=NAMES,
        type_url=EDS,
        response_nonce=resp.nonce,
        error_detail=Status(code=3, message="bad"),
    )
    outcome = s.receive(_decoded(raw), raw)
    assert outcome.kind is RequestKind.NACK and outcome.error_message == "bad"


def test_is_ack_tells_an_exact_ack_from_its_bytes() -> None:
    names = wire.request_names(NAMES)
    ack = wire.request_ack("v1", EDS, "n1")
    # As a protobuf serializer writes it (Envoy: number order) and as the load tool does
    # (the names appended); and with no version (proto3 leaves an empty string out).
    assert wire.is_ack(
        _raw(version_info="v1", resource_names=NAMES, type_url=EDS, response_nonce="n1"),
        ack,
        names,
    )
    assert wire.is_ack(
        _raw(version_info="v1", type_url=EDS, response_nonce="n1") + names, ack, names
    )
    assert wire.is_ack(
        _raw(resource_names=NAMES, type_url=EDS, response_nonce="n1"),
        wire.request_ack("", EDS, "n1"),
        names,
    )
    # Anything more, less or else is not: it is decoded the slow way.
    others = [
        _raw(version_info="v1", resource_names=NAMES, type_url=EDS, response_nonce="n2"),
        _raw(version_info="v2", resource_names=NAMES, type_url=EDS, response_nonce="n1"),
        _raw(version_info="v1", resource_names=NAMES, type_url="t", response_nonce="n1"),
        _raw(version_info="v1", resource_names=NAMES[1:], type_url=EDS, response_nonce="n1"),
        _raw(version_info="v1", resource_names=NAMES[::-1], type_url=EDS, response_nonce="n1"),
        _raw(
            version_info="v1",
            node=Node(id="sidecar~10.0.0.1~a.b~b.svc.cluster.local"),
            resource_names=NAMES,
            type_url=EDS,
            response_nonce="n1",
        ),
        _raw(
            version_info="v1",
            resource_names=NAMES,
            type_url=EDS,
            response_nonce="n1",
            error_detail=Status(code=3, message="x"),
        ),
        _raw(version_info="v1", type_url=EDS, response_nonce="n1"),
        b"",
    ]
    for raw in others:
        assert not wire.is_ack(raw, ack, names), _decoded(raw) if raw else raw


def test_a_push_ack_is_recorded_from_its_bytes_alone() -> None:
    s, nonce = _stream_holding_endpoints()
    version = s.status()[0].sent_version
    raw = _raw(version_info=version, resource_names=NAMES, type_url=EDS, response_nonce=nonce)
    acks_before = s.acks
    assert s.decode_unchanged(raw) == (EDS, nonce)
    # Recorded as receive() records an ACK.
    assert s.acks == acks_before + 1 and s.in_sync()
    assert s.status()[0].acked_nonce == nonce
    # A type the caller wants decoded whole (a guarded one) is not taken from the bytes.
    s, nonce = _stream_holding_endpoints()
    raw = _raw(version_info=version, resource_names=NAMES, type_url=EDS, response_nonce=nonce)
    slim = s.decode_unchanged(raw, frozenset((EDS,)))
    assert isinstance(slim, DiscoveryRequest) and slim.response_nonce == nonce
    assert not s.in_sync()
    # Not the last response's nonce: decoded, and then stale as before.
    stale = _raw(version_info=version, resource_names=NAMES, type_url=EDS, response_nonce="old")
    slim = s.decode_unchanged(stale)
    assert isinstance(slim, DiscoveryRequest)
    assert s.receive(slim, stale, same_names=True).kind is RequestKind.STALE
    # A NACK of it: decoded, and recorded as a NACK.
    nack = _raw(
        version_info=version,
        resource_names=NAMES,
        type_url=EDS,
        response_nonce=nonce,
        error_detail=Status(code=3, message="bad"),
    )
    slim = s.decode_unchanged(nack)
    assert isinstance(slim, DiscoveryRequest)
    assert s.receive(slim, nack, same_names=True).kind is RequestKind.NACK


def _cla(cache: ResourceCache, name: str, rev: int) -> Resource:
    def build() -> ClusterLoadAssignment:
        cla = ClusterLoadAssignment(cluster_name=name)
        ep = cla.endpoints.add().lb_endpoints.add().endpoint
        ep.address.socket_address.address = f"10.0.{rev // 250}.{rev % 250}"
        return cla

    return cache.get(EDS, name, (name, rev), build)


def test_a_delta_push_is_worked_out_and_encoded_once_for_streams_that_stand_alike() -> None:
    cache = ResourceCache()
    names = NAMES[:100]
    before = ResourceSet([_cla(cache, n, 0) for n in names])
    streams = []
    for k in range(50):
        s = DeltaStream(f"s{k}")
        s.receive(DeltaDiscoveryRequest(type_url=EDS, resource_names_subscribe=names))
        (first,) = s.push({EDS: before})
        s.receive(DeltaDiscoveryRequest(type_url=EDS, response_nonce=first.nonce))
        streams.append(s)
    after = before.replace({names[7]: _cla(cache, names[7], 1), names[9]: None})
    responses = [s.push({EDS: after})[0] for s in streams]
    assert len({id(r.change) for r in responses}) == 1  # worked out once
    cp = ControlPlane(identifier="test").SerializeToString()
    encoded = [encode_response(r, cp) for r in responses]
    assert len({id(e) for e in encoded}) == 1  # and encoded once
    got = DeltaDiscoveryResponse.FromString(encoded[0])
    assert [r.name for r in got.resources] == [names[7]]
    assert list(got.removed_resources) == [names[9]]
    assert got.nonce == responses[0].nonce and got.system_version_info == "2"
    # A stream whose client stands elsewhere (it NACKed, so it holds its own record) gets
    # its own answer, and the same as it always did.
    odd = streams[0]
    later = after.replace({names[3]: _cla(cache, names[3], 2)})
    odd.receive(
        DeltaDiscoveryRequest(
            type_url=EDS, response_nonce=responses[0].nonce, resource_names_unsubscribe=[names[5]]
        )
    )
    (own,) = odd.push({EDS: later})
    (alike,) = streams[1].push({EDS: later})
    assert own.change is None and alike.change is not None
    assert [r.name for r in own.resources] == [r.name for r in alike.resources] == [names[3]]
