"""SotwStream (control/xds/sotw.py) against the wire rules of DESIGN.md.

Every test name carries the rule it checks. Resources are real Envoy messages serialized through
ResourceCache, so the bytes in the responses are the bytes a proxy would decode.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import pytest
from envoy.config.cluster.v3.cluster_pb2 import Cluster
from envoy.config.endpoint.v3.endpoint_pb2 import ClusterLoadAssignment
from envoy.config.listener.v3.listener_pb2 import Listener
from envoy.config.route.v3.route_pb2 import RouteConfiguration
from envoy.service.discovery.v3.discovery_pb2 import DiscoveryRequest, DiscoveryResponse
from google.protobuf import any_pb2
from hypothesis import event, example, given
from hypothesis import strategies as st

from control.xds.cache import Resource, ResourceCache, ResourceSet
from control.xds.sotw import SotwResponse, SotwStream, names_of
from control.xds.state import PUSH_ORDER, RequestKind, SyncStatus, TypeStatus, ordered
from protos import typeurls
from tests.support.fuzz import fuzz_settings
from tests.support.wire import discovery_response

CDS, EDS, LDS, RDS = typeurls.CLUSTER, typeurls.ENDPOINT, typeurls.LISTENER, typeurls.ROUTE


# --- helpers --------------------------------------------------------------------------------


class Build:
    """Real Envoy resources through one ResourceCache. `rev` changes the bytes."""

    def __init__(self) -> None:
        self.cache = ResourceCache()

    def cluster(self, name: str, rev: int = 1) -> Resource:
        def build() -> Cluster:
            c = Cluster(name=name, type=Cluster.EDS)
            c.connect_timeout.seconds = rev
            c.eds_cluster_config.eds_config.ads.SetInParent()
            return c

        return self.cache.get(CDS, name, ("cluster", name, rev), build)

    def cla(self, name: str, rev: int = 1) -> Resource:
        def build() -> ClusterLoadAssignment:
            cla = ClusterLoadAssignment(cluster_name=name)
            ep = cla.endpoints.add().lb_endpoints.add().endpoint
            ep.address.socket_address.address = f"10.0.0.{rev}"
            ep.address.socket_address.port_value = 8080
            return cla

        return self.cache.get(EDS, name, ("cla", name, rev), build)

    def listener(self, name: str, rev: int = 1) -> Resource:
        def build() -> Listener:
            lst = Listener(name=name)
            lst.address.socket_address.address = "0.0.0.0"
            lst.address.socket_address.port_value = 15000 + rev
            return lst

        return self.cache.get(LDS, name, ("listener", name, rev), build)

    def route(self, name: str, rev: int = 1) -> Resource:
        def build() -> RouteConfiguration:
            rc = RouteConfiguration(name=name)
            vh = rc.virtual_hosts.add(name=f"vh-{rev}")
            vh.domains.append("*")
            return rc

        return self.cache.get(RDS, name, ("route", name, rev), build)


def rset(*resources: Resource) -> ResourceSet:
    return ResourceSet(list(resources))


def req(
    type_url: str,
    names: Iterable[str] = (),
    nonce: str = "",
    version: str = "",
    error: str | None = None,
) -> DiscoveryRequest:
    r = DiscoveryRequest(
        type_url=type_url, resource_names=list(names), response_nonce=nonce, version_info=version
    )
    if error is not None:
        r.error_detail.code = 3  # INVALID_ARGUMENT, as Envoy sends
        r.error_detail.message = error
    return r


def ack(resp: SotwResponse, names: Iterable[str] = ()) -> DiscoveryRequest:
    return req(resp.type_url, names, resp.nonce, resp.version_info)


def nack(resp: SotwResponse, names: Iterable[str] = (), msg: str = "rejected") -> DiscoveryRequest:
    return req(resp.type_url, names, resp.nonce, "", error=msg)


def names(resp: SotwResponse | None) -> list[str]:
    assert resp is not None
    return [r.name for r in resp.resources]


def status_of(stream: SotwStream, type_url: str) -> TypeStatus:
    (row,) = [s for s in stream.status() if s.type_url == type_url]
    return row


def start(
    stream: SotwStream, type_url: str, res: Mapping[str, Resource], subs: Iterable[str] = ()
) -> SotwResponse:
    """First request, forced first answer, ACK: the usual start of a subscription."""
    out = stream.receive(req(type_url, subs))
    assert out.kind is RequestKind.INITIAL and out.must_respond
    resp = stream.respond(type_url, res, force=True)
    assert resp is not None
    assert stream.receive(ack(resp, subs)).kind is RequestKind.ACK
    return resp


@pytest.fixture
def b() -> Build:
    return Build()


# --- rule 8 sanity: the bytes are real and shared ------------------------------------------


def test_rule8_response_carries_cached_resource_objects_and_decodes(b: Build) -> None:
    s = SotwStream("s1")
    c = b.cluster("outbound|80||a.ns.svc.cluster.local")
    resp = start(s, CDS, rset(c))
    assert resp.resources[0] is c  # no copy, no re-encoding
    raw = discovery_response(
        resp.version_info, [r.any_bytes for r in resp.resources], CDS, resp.nonce, None
    )
    dr = DiscoveryResponse.FromString(raw)
    assert dr.type_url == CDS and dr.nonce == resp.nonce and dr.version_info == resp.version_info
    got = Cluster()
    assert dr.resources[0].Unpack(got)
    assert got.name == "outbound|80||a.ns.svc.cluster.local"
    any_msg = any_pb2.Any.FromString(c.any_bytes)
    assert any_msg.type_url == CDS


def test_rule8_same_view_same_version_on_two_streams(b: Build) -> None:
    res = rset(b.cluster("a"), b.cluster("b"))
    r1 = start(SotwStream("s1"), CDS, res)
    r2 = start(SotwStream("s2"), CDS, res, subs=["*"])
    assert r1.version_info == r2.version_info


# --- rule 2: NACK -----------------------------------------------------------------------------


def test_rule2_nack_recorded_and_not_resent(b: Build) -> None:
    s = SotwStream()
    start(s, CDS, rset(b.cluster("a")))
    bad = rset(b.cluster("a", rev=2))
    (r2,) = s.push({CDS: bad})
    out = s.receive(nack(r2, msg="cluster a: bad timeout"))
    assert out.kind is RequestKind.NACK
    assert out.error_message == "cluster a: bad timeout"
    assert not out.must_respond
    assert s.nacks == 1
    row = status_of(s, CDS)
    assert row.status is SyncStatus.ERROR
    assert row.last_nack == "cluster a: bad timeout"
    # The same resources are never re-sent, however many pushes happen.
    for _ in range(3):
        assert s.push({CDS: bad}) == []
        assert s.push({CDS: rset(b.cluster("a", rev=2))}) == []  # rebuilt: same object
        assert s.respond(CDS, bad) is None
    assert status_of(s, CDS).status is SyncStatus.ERROR


def test_rule2_nacked_resources_resent_once_config_changes(b: Build) -> None:
    s = SotwStream()
    start(s, CDS, rset(b.cluster("a")))
    (r2,) = s.push({CDS: rset(b.cluster("a", rev=2))})
    s.receive(nack(r2))
    (r3,) = s.push({CDS: rset(b.cluster("a", rev=3))})
    assert r3.nonce != r2.nonce and r3.version_info != r2.version_info
    assert status_of(s, CDS).status is SyncStatus.STALE
    assert s.receive(ack(r3)).kind is RequestKind.ACK
    row = status_of(s, CDS)
    assert row.status is SyncStatus.SYNCED and row.last_nack == ""
    # Going back to the rejected bytes is a change too (the client holds rev 3 now).
    (r4,) = s.push({CDS: rset(b.cluster("a", rev=2))})
    assert r4.version_info == r2.version_info


def test_rule2_nack_with_code_only_is_recorded(b: Build) -> None:
    s = SotwStream()
    start(s, EDS, rset(b.cla("a")), subs=["a"])
    (r2,) = s.push({EDS: rset(b.cla("a", 2))})
    bad = req(EDS, ["a"], r2.nonce)
    bad.error_detail.code = 13
    out = s.receive(bad)
    assert out.kind is RequestKind.NACK and out.error_message == "code 13"
    assert status_of(s, EDS).status is SyncStatus.ERROR


def test_rule2_nack_adding_names_answers_the_new_names(b: Build) -> None:
    s = SotwStream()
    start(s, EDS, rset(b.cla("a")), subs=["a"])
    res = rset(b.cla("a", 2), b.cla("b"))
    (r2,) = s.push({EDS: res})
    out = s.receive(nack(r2, ["a", "b"]))
    assert out.kind is RequestKind.NACK and out.must_respond  # rule 4 wins for new names
    assert names(s.respond(EDS, res, force=True)) == ["a", "b"]


# --- rule 3: stale nonces -----------------------------------------------------------------


def test_rule3_stale_nonce_is_ignored(b: Build) -> None:
    s = SotwStream()
    r1 = start(s, EDS, rset(b.cla("a")), subs=["a"])
    res = rset(b.cla("a", 2), b.cla("b"))
    (r2,) = s.push({EDS: res})
    before = status_of(s, EDS)
    # The client had not seen r2 yet when it asked for b with r1's nonce.
    out = s.receive(req(EDS, ["a", "b"], r1.nonce, r1.version_info))
    assert out.kind is RequestKind.STALE and not out.must_respond
    assert s.subscription(EDS) == (False, frozenset({"a"}))
    assert status_of(s, EDS) == before
    assert s.push({EDS: res}) == []
    # A stale NACK is not recorded either.
    out = s.receive(req(EDS, ["a"], r1.nonce, error="old"))
    assert out.kind is RequestKind.STALE
    assert s.nacks == 0 and status_of(s, EDS).last_nack == ""
    # The ACK of r2 (the real last nonce) then carries the new name and is answered.
    out = s.receive(ack(r2, ["a", "b"]))
    assert out.kind is RequestKind.ACK and out.must_respond
    assert names(s.respond(EDS, res, force=True)) == ["a", "b"]


def test_rule3_unknown_nonce_is_stale(b: Build) -> None:
    s = SotwStream()
    start(s, CDS, rset(b.cluster("a")))
    out = s.receive(req(CDS, [], "no-such-nonce"))
    assert out.kind is RequestKind.STALE and not out.must_respond
    assert s.acks == 1


def test_rule3_nonces_are_per_type(b: Build) -> None:
    """A nonce that is current for CDS is stale for EDS."""
    s = SotwStream()
    rc = start(s, CDS, rset(b.cluster("a")))
    start(s, EDS, rset(b.cla("a")), subs=["a"])
    assert s.receive(req(EDS, ["a"], rc.nonce)).kind is RequestKind.STALE


# --- rule 4: send only on change; new names are always answered ------------------------------


def test_rule4_push_with_unchanged_resources_sends_nothing(b: Build) -> None:
    s = SotwStream()
    sets = {
        CDS: rset(b.cluster("a")),
        EDS: rset(b.cla("a")),
        LDS: rset(b.listener("l")),
        RDS: rset(b.route("r")),
    }
    subs = {CDS: [], EDS: ["a"], LDS: [], RDS: ["r"]}
    for t in PUSH_ORDER[:4]:
        start(s, t, sets[t], subs[t])
    assert s.push(sets) == []
    # Rebuilt from new inputs with identical bytes: still nothing.
    rebuilt = {CDS: ResourceSet({"a": b.cluster("a")}), **{t: sets[t] for t in (EDS, LDS, RDS)}}
    assert s.push(rebuilt) == []


def test_rule4_only_changed_types_are_sent(b: Build) -> None:
    s = SotwStream()
    start(s, CDS, rset(b.cluster("a")))
    start(s, EDS, rset(b.cla("a")), subs=["a"])
    out = s.push({CDS: rset(b.cluster("a")), EDS: rset(b.cla("a", 2))})
    assert names_of(out) == [(EDS, ["a"])]


def test_rule4_new_names_answered_even_when_nothing_changed(b: Build) -> None:
    s = SotwStream()
    res = rset(b.cla("a"), b.cla("b"))
    r1 = start(s, EDS, res, subs=["a"])
    out = s.receive(ack(r1, ["a", "b"]))
    assert out.kind is RequestKind.ACK and out.must_respond
    r2 = s.respond(EDS, res, force=True)
    assert names(r2) == ["a", "b"]


def test_rule4_new_name_that_does_not_exist_is_still_answered(b: Build) -> None:
    s = SotwStream()
    res = rset(b.cla("a"))
    r1 = start(s, EDS, res, subs=["a"])
    out = s.receive(ack(r1, ["a", "missing"]))
    assert out.must_respond
    assert s.respond(EDS, res) is None  # the view did not change ...
    r2 = s.respond(EDS, res, force=True)  # ... but new names are always answered
    assert r2 is not None and names(r2) == ["a"] and r2.nonce != r1.nonce


def test_rule4_removing_names_needs_no_response(b: Build) -> None:
    s = SotwStream()
    res = rset(b.cla("a"), b.cla("b"))
    r1 = start(s, EDS, res, subs=["a", "b"])
    out = s.receive(ack(r1, ["a"]))
    assert out.kind is RequestKind.ACK and not out.must_respond
    assert s.subscription(EDS) == (False, frozenset({"a"}))


def test_rule4_eds_is_sent_per_requested_name(b: Build) -> None:
    s = SotwStream()
    r = start(s, EDS, rset(b.cla("a"), b.cla("b"), b.cla("c")), subs=["c", "a"])
    assert names(r) == ["a", "c"]
    # A change to an endpoint nobody here asked for is not a change for this stream.
    assert s.push({EDS: rset(b.cla("a"), b.cla("b", 2), b.cla("c"))}) == []


def test_rule4_clusters_and_listeners_are_sent_complete(b: Build) -> None:
    s = SotwStream()
    start(s, CDS, rset(b.cluster("a"), b.cluster("b")))
    start(s, LDS, rset(b.listener("l1"), b.listener("l2")))
    out = s.push(
        {
            CDS: rset(b.cluster("a"), b.cluster("b", 2)),
            LDS: rset(b.listener("l1", 2), b.listener("l2")),
        }
    )
    assert names_of(out) == [(CDS, ["a", "b"]), (LDS, ["l1", "l2"])]


def test_rule4_respond_for_unsubscribed_type_is_none(b: Build) -> None:
    s = SotwStream()
    assert s.respond(CDS, rset(b.cluster("a")), force=True) is None
    assert s.push({CDS: rset(b.cluster("a"))}) == []


# --- rule 5: wildcard and not-yet-existing names -------------------------------------------


def test_rule5_legacy_wildcard_empty_first_request(b: Build) -> None:
    s = SotwStream()
    s.receive(req(CDS))
    assert s.subscription(CDS) == (True, frozenset())
    r = s.respond(CDS, rset(b.cluster("b"), b.cluster("a")), force=True)
    assert r is not None and names(r) == ["a", "b"]
    s.receive(ack(r))
    (r2,) = s.push({CDS: rset(b.cluster("a"), b.cluster("b"), b.cluster("c"))})
    assert names(r2) == ["a", "b", "c"]


def test_rule5_legacy_wildcard_first_answer_even_when_empty() -> None:
    s = SotwStream()
    assert s.receive(req(CDS)).must_respond
    r = s.respond(CDS, ResourceSet(()), force=True)
    assert r is not None and r.resources == ()


def test_rule5_explicit_wildcard(b: Build) -> None:
    s = SotwStream()
    s.receive(req(LDS, ["*"]))
    assert s.subscription(LDS)[0] is True
    assert names(s.respond(LDS, rset(b.listener("x"), b.listener("y")), force=True)) == ["x", "y"]


def test_rule5_wildcard_plus_names(b: Build) -> None:
    s = SotwStream()
    r1 = start(s, CDS, rset(b.cluster("a")), subs=["*", "od"])
    assert names(r1) == ["a"]
    (r2,) = s.push({CDS: rset(b.cluster("a"), b.cluster("od"), b.cluster("z"))})
    assert names(r2) == ["a", "od", "z"]


def test_rule5_name_that_does_not_exist_yet_is_sent_when_it_appears(b: Build) -> None:
    s = SotwStream()
    r1 = start(s, EDS, rset(b.cla("a")), subs=["a", "later"])
    assert names(r1) == ["a"]
    assert s.push({EDS: rset(b.cla("a"))}) == []
    (r2,) = s.push({EDS: rset(b.cla("a"), b.cla("later"))})
    # An endpoint push carries what the client lacks; it then holds both.
    assert names(r2) == ["later"]
    assert sorted(r2.view.by_name) == ["a", "later"]


def test_rule5_legacy_wildcard_ends_once_names_are_requested(b: Build) -> None:
    """xDS: an empty list means wildcard only while the client has never named a resource."""
    s = SotwStream()
    res = rset(b.cluster("a"), b.cluster("b"))
    r1 = start(s, CDS, res)
    s.receive(ack(r1, ["a"]))
    assert s.subscription(CDS) == (False, frozenset({"a"}))
    (r2,) = s.push({CDS: res})
    assert names(r2) == ["a"]
    s.receive(ack(r2, []))  # unsubscribes from everything; not back to wildcard
    assert s.subscription(CDS) == (False, frozenset())


def test_rule5_eds_unsubscribe_all_before_first_answer_is_not_wildcard(b: Build) -> None:
    """Envoy drops its last EDS name before the first response arrived (no nonce yet)."""
    s = SotwStream()
    s.receive(req(EDS, ["a"]))
    out = s.receive(req(EDS, []))
    assert out.must_respond
    assert s.subscription(EDS) == (False, frozenset())
    r = s.respond(EDS, rset(b.cla("a"), b.cla("b")), force=True)
    assert r is not None and r.resources == ()


# --- rule 6: make-before-break ---------------------------------------------------------------


def _subscribe_all(s: SotwStream, b: Build, rev: int = 1) -> dict[str, ResourceSet]:
    sets = {
        CDS: rset(b.cluster("a", rev), b.cluster("b", rev)),
        EDS: rset(b.cla("a", rev), b.cla("b", rev)),
        LDS: rset(b.listener("l", rev)),
        RDS: rset(b.route("r", rev)),
    }
    subs = {CDS: [], EDS: ["a", "b"], LDS: [], RDS: ["r"]}
    # Subscribe in the "wrong" order: the push order must not depend on it.
    for t in (RDS, LDS, EDS, CDS):
        start(s, t, sets[t], subs[t])
    return sets


def test_rule6_push_order_cds_eds_lds_rds(b: Build) -> None:
    s = SotwStream()
    _subscribe_all(s, b)
    new = {
        RDS: rset(b.route("r", 2)),
        LDS: rset(b.listener("l", 2)),
        EDS: rset(b.cla("a", 2), b.cla("b", 2)),
        CDS: rset(b.cluster("a", 2), b.cluster("b", 2)),
    }
    out = s.push(new)
    assert [r.type_url for r in out] == [CDS, EDS, LDS, RDS]


def test_rule6_an_updated_cluster_gets_its_assignment_again(b: Build) -> None:
    """Envoy warms an updated EDS cluster until an assignment for it arrives; an unchanged
    assignment must be sent again, or the new cluster waits out Envoy's 15 s fetch timeout."""
    s = SotwStream()
    start(s, CDS, rset(b.cluster("a"), b.cluster("b")))
    start(s, EDS, rset(b.cla("a"), b.cla("b")), subs=["a", "b"])
    eds = rset(b.cla("a"), b.cla("b"))
    out = s.push({CDS: rset(b.cluster("a", 2), b.cluster("b")), EDS: eds})
    assert names_of(out) == [(CDS, ["a", "b"]), (EDS, ["a", "b"])]
    for resp in out:
        s.receive(ack(resp, ["a", "b"] if resp.type_url == EDS else ()))
    # A cluster only added is no update: its assignment comes with its new subscription.
    out = s.push({CDS: rset(b.cluster("a", 2), b.cluster("b"), b.cluster("c")), EDS: eds})
    assert names_of(out) == [(CDS, ["a", "b", "c"])]
    # An updated cluster whose assignment the client does not subscribe to: no EDS either.
    s2 = SotwStream()
    start(s2, CDS, rset(b.cluster("a"), b.cluster("b")))
    start(s2, EDS, rset(b.cla("b")), subs=["b"])
    out = s2.push({CDS: rset(b.cluster("a", 2), b.cluster("b")), EDS: eds})
    assert names_of(out) == [(CDS, ["a", "b"])]


def test_rule6_ordered_puts_unknown_types_last() -> None:
    other = typeurls.NAME_TABLE
    assert ordered([other, RDS, typeurls.SECRET, LDS, EDS, CDS]) == [
        CDS,
        EDS,
        LDS,
        RDS,
        typeurls.SECRET,
        other,
    ]


def test_rule6_removed_clusters_are_dropped_after_listeners_and_routes(b: Build) -> None:
    s = SotwStream()
    sets = _subscribe_all(s, b)
    old_b = sets[CDS]["b"]
    new = {
        CDS: rset(b.cluster("a", 2)),  # a changed, b removed
        EDS: rset(b.cla("a", 2)),
        LDS: rset(b.listener("l", 2)),  # listener moves off b
        RDS: rset(b.route("r", 2)),
    }
    out = s.push(new)
    assert [r.type_url for r in out] == [CDS, EDS, LDS, RDS, CDS]
    transitional, final = out[0], out[-1]
    assert names(transitional) == ["a", "b"]
    assert transitional.resources[0] is new[CDS]["a"]  # the change goes out at once ...
    assert transitional.resources[1] is old_b  # ... b stays with the bytes the client has
    assert names(final) == ["a"]
    assert status_of(s, CDS).sent_nonce == final.nonce
    # Only the last CDS is current; the transitional nonce is stale from now on.
    assert s.receive(ack(transitional)).kind is RequestKind.STALE
    assert s.receive(ack(final)).kind is RequestKind.ACK


def test_rule6_removal_only_skips_identical_transitional_cds(b: Build) -> None:
    s = SotwStream()
    _subscribe_all(s, b)
    out = s.push(
        {
            CDS: rset(b.cluster("a")),  # only b removed
            LDS: rset(b.listener("l", 2)),
            RDS: rset(b.route("r", 2)),
        }
    )
    assert names_of(out) == [(LDS, ["l"]), (RDS, ["r"]), (CDS, ["a"])]


def test_rule6_pure_cluster_removal_is_one_response(b: Build) -> None:
    s = SotwStream()
    _subscribe_all(s, b)
    out = s.push({CDS: rset(b.cluster("a"))})
    assert names_of(out) == [(CDS, ["a"])]


# --- nonces and syncz ---------------------------------------------------------------------


def test_nonces_unique_per_stream(b: Build) -> None:
    s = SotwStream()
    seen: list[str] = []
    sets = _subscribe_all(s, b)
    for t in sets:
        seen.append(status_of(s, t).sent_nonce)
    for rev in range(2, 6):
        seen += [
            r.nonce
            for r in s.push(
                {
                    CDS: rset(b.cluster("a", rev)),
                    EDS: rset(b.cla("a", rev)),
                    LDS: rset(b.listener("l", rev)),
                    RDS: rset(b.route("r", rev)),
                }
            )
        ]
    assert len(seen) == len(set(seen)) > 10
    assert all(seen)


def test_streams_share_one_encoded_response_per_view(b: Build) -> None:
    """Rule 8: streams that are sent the same selection share its nonce and its bytes."""
    resources = rset(b.cluster("a"), b.cluster("b"))
    answers = []
    for name in ("one", "two", "three"):
        s = SotwStream(name)
        s.receive(req(CDS, []))
        r = s.respond(CDS, resources, force=True)
        assert r is not None
        answers.append(r)
    assert answers[0].nonce == answers[1].nonce == answers[2].nonce
    frames = [r.view.framed(CDS, None) for r in answers]
    # Encoded again for the second stream and kept from then on (View.framed).
    assert frames[0] == frames[1] and frames[1] is frames[2]
    decoded = DiscoveryResponse.FromString(frames[0])
    assert decoded.nonce == answers[0].nonce and len(decoded.resources) == 2


def test_a_view_sent_once_keeps_no_copy_of_its_response(b: Build) -> None:
    """A proxy's own listeners make a view only its stream gets: the bytes written for it
    are not kept beside the resources' own (the first framing is not the one kept)."""
    view = rset(b.cluster("a")).view(None)
    once = view.framed(CDS, None)
    again = view.framed(CDS, None)
    assert once == again and once is not again
    assert view.framed(CDS, None) is again
    assert view.framed(CDS, b"cp") is not view.framed(CDS, b"cp")  # other keys: never kept


def test_same_view_twice_on_one_stream_gets_a_new_nonce(b: Build) -> None:
    """Rule 3 needs every response on a stream to carry its own nonce, shared bytes or not."""
    resources = rset(b.cluster("a"))
    s = SotwStream()
    s.receive(req(CDS, []))
    r1 = s.respond(CDS, resources, force=True)
    assert r1 is not None
    r2 = s.respond(CDS, resources, force=True)
    r3 = s.respond(CDS, resources, force=True)
    assert r2 is not None and r3 is not None
    assert len({r1.nonce, r2.nonce, r3.nonce}) == 3
    assert r2.view is r1.view and r2.nonce != r2.view.nonce
    # The client's ACK of the first is now stale.
    assert s.receive(ack(r1)).kind is RequestKind.STALE
    assert s.receive(ack(r3)).kind is RequestKind.ACK


def test_a_shared_empty_view_is_framed_per_type() -> None:
    empty = ResourceSet(()).view(None)
    cds = DiscoveryResponse.FromString(empty.framed(CDS, None))
    lds = DiscoveryResponse.FromString(empty.framed(LDS, None))
    assert (cds.type_url, lds.type_url) == (CDS, LDS)
    assert cds.nonce == lds.nonce == empty.nonce


def test_syncz_status_not_sent_stale_synced_error(b: Build) -> None:
    s = SotwStream("conn-1")
    s.receive(req(CDS))
    row = status_of(s, CDS)
    assert row.status is SyncStatus.NOT_SENT and row.resource_count == 0
    r1 = s.respond(CDS, rset(b.cluster("a"), b.cluster("b")), force=True)
    assert r1 is not None
    row = status_of(s, CDS)
    assert row.status is SyncStatus.STALE
    assert (row.sent_nonce, row.sent_version, row.resource_count) == (
        r1.nonce,
        r1.version_info,
        2,
    )
    s.receive(ack(r1))
    row = status_of(s, CDS)
    assert row.status is SyncStatus.SYNCED and row.acked_nonce == r1.nonce
    (r2,) = s.push({CDS: rset(b.cluster("a", 2))})
    assert status_of(s, CDS).status is SyncStatus.STALE
    s.receive(nack(r2, msg="nope"))
    row = status_of(s, CDS)
    assert row.status is SyncStatus.ERROR and row.last_nack == "nope"
    assert row.acked_nonce == r1.nonce  # still what the client runs
    assert (s.requests, s.acks, s.nacks) == (3, 1, 1)


# --- property: random request / push interleavings ------------------------------------------

TYPES = (CDS, EDS, LDS)
NAMES = ("a", "b", "c")


def _sets_strategy() -> st.SearchStrategy[dict[str, dict[str, int]]]:
    """type -> {name: rev}; built into real resources inside the test."""
    per_type = st.dictionaries(st.sampled_from(NAMES), st.integers(1, 3), max_size=3)
    return st.fixed_dictionaries({t: per_type for t in TYPES})


_request = st.tuples(
    st.just("req"),
    st.sampled_from(TYPES),
    st.lists(st.sampled_from((*NAMES, "*", "zz")), max_size=3, unique=True),
    st.sampled_from(("last", "last", "last", "", "bogus", "old")),
    st.one_of(st.none(), st.sampled_from(("bad", ""))),
)
_push = st.tuples(st.just("push"), _sets_strategy())
_push_same = st.just(("push_same",))  # a push that changes nothing (other proxies' config)


@fuzz_settings(500)
@given(first=_push, ops=st.lists(st.one_of(_request, _request, _push, _push_same), max_size=40))
# Found by this test: a CDS change re-sent (forced) the EDS view the client had just NACKed,
# because the wildcard EDS subscription covered the updated cluster.
@example(
    first=(
        "push",
        {typeurls.CLUSTER: {"a": 1}, typeurls.ENDPOINT: {"b": 1}, typeurls.LISTENER: {}},
    ),
    ops=[
        ("req", typeurls.CLUSTER, [], "last", None),
        ("req", typeurls.ENDPOINT, ["b", "c", "*"], "last", None),
        ("req", typeurls.ENDPOINT, ["b", "c", "*"], "last", "bad"),
        ("push", {typeurls.CLUSTER: {"a": 2}, typeurls.ENDPOINT: {"b": 1}, typeurls.LISTENER: {}}),
    ],
)
# Found by this test: the client NACKed an endpoint push that carried only the changed
# assignment (c) and unsubscribed from the rest (b) in the same request; the next push of an
# unchanged config re-sent c as the whole set, the very content it had rejected.
@example(
    first=("push", {typeurls.CLUSTER: {}, typeurls.ENDPOINT: {"b": 1}, typeurls.LISTENER: {}}),
    ops=[
        ("req", typeurls.ENDPOINT, ["b", "c"], "last", None),
        (
            "push",
            {
                typeurls.CLUSTER: {},
                typeurls.ENDPOINT: {"a": 1, "b": 1, "c": 1},
                typeurls.LISTENER: {},
            },
        ),
        ("req", typeurls.ENDPOINT, ["c"], "last", "bad"),
        ("push_same",),
    ],
)
def test_property_rules_2_3_4_random_interleavings(first: tuple, ops: list[tuple]) -> None:  # type: ignore[type-arg]
    """Random requests (types, names incl. '*' and missing ones, the real last nonce, an older
    one, a bogus one or none, with or without error_detail) interleaved with random pushes:
    nothing raises, nonces stay unique, stale requests change nothing, and no unforced
    response repeats a NACKed view unless the config changed in between."""
    b = Build()
    build = {CDS: b.cluster, EDS: b.cla, LDS: b.listener}
    s = SotwStream("prop")
    current: dict[str, ResourceSet] = {t: ResourceSet(()) for t in TYPES}
    last_nonce: dict[str, str] = {}
    old_nonce: dict[str, str] = {}
    last_view: dict[str, frozenset[tuple[str, str]]] = {}
    nonces: set[str] = set()
    nacked: dict[str, frozenset[tuple[str, str]]] = {}  # type -> view the client rejected

    def sent(resp: SotwResponse, forced: bool) -> None:
        assert resp.nonce and resp.nonce not in nonces
        nonces.add(resp.nonce)
        view = frozenset((r.name, r.version) for r in resp.resources)
        if not forced:
            if resp.type_url in nacked:
                event("unforced response after a NACK")
            assert nacked.get(resp.type_url) != view, "re-sent a NACKed view unchanged"
        nacked.pop(resp.type_url, None)
        if resp.type_url in last_nonce:
            old_nonce[resp.type_url] = last_nonce[resp.type_url]
        last_nonce[resp.type_url] = resp.nonce
        last_view[resp.type_url] = view
        assert [r.name for r in resp.resources] == sorted(r.name for r in resp.resources)

    for op in [first, *ops]:  # config exists before the proxy connects
        if op[0] == "push_same":
            if nacked:
                event("unchanged push after a NACK")
            for resp in s.push(current):
                sent(resp, forced=False)
            continue
        if op[0] == "push":
            new = {
                t: ResourceSet([build[t](n, rev) for n, rev in sorted(op[1][t].items())])
                for t in TYPES
            }
            for t in TYPES:
                if new[t].digest != current[t].digest:
                    nacked.pop(t, None)  # a config change: sending it again is allowed
            current = new
            had_clusters = {n for n, _ in last_view.get(CDS, ())}
            pushed = s.push(current)
            types = [r.type_url for r in pushed]
            if len(types) > 1 and types[-1] == CDS:
                # Only the final CDS of a cluster removal may come after the other types.
                assert had_clusters - set(names(pushed[-1]))
                types = types[:-1]
            assert types == ordered(types) and len(types) == len(set(types))
            for resp in pushed:
                sent(resp, forced=False)
            continue
        _, t, subs, which, err = op
        nonce = {"last": last_nonce.get(t, ""), "": "", "bogus": "x-bogus"}.get(
            which, old_nonce.get(t, "")
        )
        r = req(t, subs, nonce)
        if err is not None:
            r.error_detail.code = 3
            r.error_detail.message = err
        known = t in s.subscribed_types
        before = s.subscription(t) if known else None
        outcome = s.receive(r)
        assert outcome.type_url == t
        if known and nonce and nonce != last_nonce.get(t):
            assert outcome.kind is RequestKind.STALE and not outcome.must_respond
            assert s.subscription(t) == before
        if outcome.kind is RequestKind.NACK:
            assert status_of(s, t).status is SyncStatus.ERROR
            assert status_of(s, t).last_nack
            nacked[t] = last_view[t]
            event("NACK recorded")
        if outcome.must_respond:
            answer = s.respond(t, current[t], force=True)
            assert answer is not None
            sent(answer, forced=True)


# --- endpoint pushes carry only the assignments that changed ------------------------------


def _eds_stream(b: Build, name: str = "s", n: int = 3) -> tuple[SotwStream, SotwResponse]:
    s = SotwStream(name)
    subs = [f"c{i}" for i in range(n)]
    return s, start(s, EDS, rset(*(b.cla(c) for c in subs)), subs=subs)


def test_eds_push_carries_only_changed_assignments(b: Build) -> None:
    s, r1 = _eds_stream(b)
    moved = rset(b.cla("c0"), b.cla("c1", rev=2), b.cla("c2"))
    (r2,) = s.push({EDS: moved})
    assert names(r2) == ["c1"]
    assert sorted(r2.view.by_name) == ["c0", "c1", "c2"]
    # The version is the whole set's: what the client holds after applying it.
    assert r2.version_info == moved.view(frozenset(["c0", "c1", "c2"])).version
    assert r2.version_info != r1.version_info
    decoded = DiscoveryResponse.FromString(r2.body.framed(EDS, None))
    assert [ClusterLoadAssignment.FromString(a.value).cluster_name for a in decoded.resources] == [
        "c1"
    ]
    assert decoded.nonce == r2.nonce and decoded.version_info == r2.version_info
    assert s.receive(ack(r2, ["c0", "c1", "c2"])).kind is RequestKind.ACK
    row = status_of(s, EDS)
    assert row.status is SyncStatus.SYNCED and row.resource_count == 3
    # Nothing changed again: nothing to send.
    assert s.push({EDS: moved}) == []


def test_eds_push_shares_the_changed_part_between_streams(b: Build) -> None:
    (s1, _), (s2, _) = _eds_stream(b, "one"), _eds_stream(b, "two")
    moved = rset(b.cla("c0", rev=3), b.cla("c1"), b.cla("c2"))
    (a,) = s1.push({EDS: moved})
    (c,) = s2.push({EDS: moved})
    assert a.part is not None and a.part is c.part and a.nonce == c.nonce
    assert a.body.framed(EDS, None) == c.body.framed(EDS, None)
    assert a.body.framed(EDS, None) is c.body.framed(EDS, None)  # kept from the second on


def test_eds_push_after_a_nack_sends_the_whole_set(b: Build) -> None:
    """The client that rejected the last response may not hold it: send everything."""
    s, _ = _eds_stream(b)
    (r2,) = s.push({EDS: rset(b.cla("c0", rev=2), b.cla("c1"), b.cla("c2"))})
    assert names(r2) == ["c0"]
    s.receive(nack(r2, ["c0", "c1", "c2"]))
    (r3,) = s.push({EDS: rset(b.cla("c0", rev=3), b.cla("c1"), b.cla("c2"))})
    assert r3.part is None and names(r3) == ["c0", "c1", "c2"]


def test_eds_push_that_drops_an_assignment_sends_the_whole_set(b: Build) -> None:
    s, _ = _eds_stream(b)
    (r2,) = s.push({EDS: rset(b.cla("c0", rev=2), b.cla("c1"))})
    assert r2.part is None and names(r2) == ["c0", "c1"]


def test_eds_push_where_everything_changed_is_the_shared_whole_view(b: Build) -> None:
    s, _ = _eds_stream(b, n=2)
    (r2,) = s.push({EDS: rset(b.cla("c0", rev=2), b.cla("c1", rev=2))})
    assert r2.part is None and r2.nonce == r2.view.nonce


def test_eds_partial_nonces_stay_unique_when_views_repeat(b: Build) -> None:
    """Moving back and forth between two sets reuses shared parts; nonces never repeat."""
    s, _ = _eds_stream(b)
    sets = [
        rset(b.cla("c0", rev=2), b.cla("c1"), b.cla("c2")),
        rset(b.cla("c0"), b.cla("c1"), b.cla("c2")),
    ]
    nonces = []
    for i in range(6):
        (r,) = s.push({EDS: sets[i % 2]})
        assert names(r) == ["c0"]
        nonces.append(r.nonce)
        assert s.receive(ack(r, ["c0", "c1", "c2"])).kind is RequestKind.ACK
    assert len(set(nonces)) == len(nonces)


def test_eds_push_with_an_updated_cluster_resends_every_subscribed_assignment(b: Build) -> None:
    """Envoy warms an updated EDS cluster until its assignment arrives: the complete set."""
    s = SotwStream()
    start(s, CDS, rset(b.cluster("c0"), b.cluster("c1")))
    start(s, EDS, rset(b.cla("c0"), b.cla("c1")), subs=["c0", "c1"])
    out = s.push(
        {CDS: rset(b.cluster("c0", rev=2), b.cluster("c1")), EDS: rset(b.cla("c0"), b.cla("c1"))}
    )
    assert [(r.type_url, names(r)) for r in out] == [(CDS, ["c0", "c1"]), (EDS, ["c0", "c1"])]
