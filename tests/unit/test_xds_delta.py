"""DeltaStream (control/xds/delta.py) against the wire rules of DESIGN.md.

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
from envoy.service.discovery.v3.discovery_pb2 import (
    DeltaDiscoveryRequest,
    DeltaDiscoveryResponse,
)
from hypothesis import event, given
from hypothesis import strategies as st

from control.xds.cache import Resource, ResourceCache, ResourceSet
from control.xds.delta import DeltaResponse, DeltaStream
from control.xds.state import RequestKind, SyncStatus, TypeStatus
from protos import typeurls, wire
from tests.support.fuzz import fuzz_settings

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
            rc.virtual_hosts.add(name=f"vh-{rev}").domains.append("*")
            return rc

        return self.cache.get(RDS, name, ("route", name, rev), build)


def rset(*resources: Resource) -> ResourceSet:
    return ResourceSet(list(resources))


def dreq(
    type_url: str,
    sub: Iterable[str] = (),
    unsub: Iterable[str] = (),
    nonce: str = "",
    error: str | None = None,
    initial: Mapping[str, str] | None = None,
) -> DeltaDiscoveryRequest:
    r = DeltaDiscoveryRequest(
        type_url=type_url,
        resource_names_subscribe=list(sub),
        resource_names_unsubscribe=list(unsub),
        response_nonce=nonce,
        initial_resource_versions=dict(initial or {}),
    )
    if error is not None:
        r.error_detail.code = 3
        r.error_detail.message = error
    return r


def dack(
    resp: DeltaResponse, sub: Iterable[str] = (), unsub: Iterable[str] = ()
) -> DeltaDiscoveryRequest:
    return dreq(resp.type_url, sub, unsub, resp.nonce)


def dnack(resp: DeltaResponse, msg: str = "rejected") -> DeltaDiscoveryRequest:
    return dreq(resp.type_url, nonce=resp.nonce, error=msg)


def got(resp: DeltaResponse | None) -> tuple[list[str], list[str]]:
    """(names sent, names removed)."""
    assert resp is not None
    return [r.name for r in resp.resources], list(resp.removed)


def status_of(stream: DeltaStream, type_url: str) -> TypeStatus:
    (row,) = [s for s in stream.status() if s.type_url == type_url]
    return row


def dstart(
    s: DeltaStream, type_url: str, res: Mapping[str, Resource], sub: Iterable[str] = ()
) -> DeltaResponse:
    out = s.receive(dreq(type_url, sub))
    assert out.kind is RequestKind.INITIAL and out.must_respond
    resp = s.respond(type_url, res, force=True)
    assert resp is not None
    assert s.receive(dack(resp)).kind is RequestKind.ACK
    return resp


@pytest.fixture
def b() -> Build:
    return Build()


# --- rule 8: the bytes are real --------------------------------------------------------------


def test_rule8_delta_response_frames_cached_bytes(b: Build) -> None:
    s = DeltaStream()
    c = b.cluster("outbound|80||a.ns.svc.cluster.local")
    resp = dstart(s, CDS, rset(c))
    assert resp.resources == (c,)
    raw = wire.delta_discovery_response_block(
        resp.system_version_info,
        b"".join(r.delta_field() for r in resp.resources),
        CDS,
        list(resp.removed),
        resp.nonce,
        None,
    )
    ddr = DeltaDiscoveryResponse.FromString(raw)
    assert ddr.nonce == resp.nonce and ddr.type_url == CDS
    (r,) = ddr.resources
    assert (r.name, r.version) == (c.name, c.version)
    cluster = Cluster()
    assert r.resource.Unpack(cluster) and cluster.name == c.name


# --- rule 2: NACK ---------------------------------------------------------------------------


def test_rule2_delta_nack_recorded_and_not_resent(b: Build) -> None:
    s = DeltaStream()
    dstart(s, CDS, rset(b.cluster("a"), b.cluster("b")))
    bad = rset(b.cluster("a", 2), b.cluster("b"))
    (r2,) = s.push({CDS: bad})
    assert got(r2) == (["a"], [])
    out = s.receive(dnack(r2, "a: bad"))
    assert out.kind is RequestKind.NACK and out.error_message == "a: bad"
    assert not out.must_respond and s.nacks == 1
    row = status_of(s, CDS)
    assert row.status is SyncStatus.ERROR and row.last_nack == "a: bad"
    for _ in range(3):
        assert s.push({CDS: bad}) == []
        assert s.respond(CDS, bad) is None
    assert status_of(s, CDS).status is SyncStatus.ERROR


def test_rule2_delta_resent_once_changed(b: Build) -> None:
    s = DeltaStream()
    dstart(s, CDS, rset(b.cluster("a"), b.cluster("b")))
    (r2,) = s.push({CDS: rset(b.cluster("a", 2), b.cluster("b"))})
    s.receive(dnack(r2))
    # An unrelated resource changing does not drag the rejected one along.
    (r3,) = s.push({CDS: rset(b.cluster("a", 2), b.cluster("b", 2))})
    assert got(r3) == (["b"], [])
    (r4,) = s.push({CDS: rset(b.cluster("a", 3), b.cluster("b", 2))})
    assert got(r4) == (["a"], [])
    s.receive(dack(r3))
    s.receive(dack(r4))
    row = status_of(s, CDS)
    assert row.status is SyncStatus.SYNCED and row.last_nack == ""


# --- rule 4 ---------------------------------------------------------------------------------


def test_rule4_delta_push_unchanged_sends_nothing(b: Build) -> None:
    s = DeltaStream()
    sets = {CDS: rset(b.cluster("a")), EDS: rset(b.cla("a"))}
    dstart(s, CDS, sets[CDS])
    dstart(s, EDS, sets[EDS], sub=["a"])
    assert s.push(sets) == []
    assert s.push({CDS: rset(b.cluster("a")), EDS: rset(b.cla("a"))}) == []


def test_rule4_delta_new_names_answered(b: Build) -> None:
    s = DeltaStream()
    res = rset(b.cla("a"), b.cla("b"))
    r1 = dstart(s, EDS, res, sub=["a"])
    out = s.receive(dack(r1, sub=["b"]))
    assert out.must_respond
    assert got(s.respond(EDS, res, force=True)) == (["b"], [])


def test_rule4_delta_unsubscribe_needs_no_response_and_stops_updates(b: Build) -> None:
    s = DeltaStream()
    r1 = dstart(s, EDS, rset(b.cla("a"), b.cla("b")), sub=["a", "b"])
    out = s.receive(dack(r1, unsub=["b"]))
    assert not out.must_respond
    assert s.push({EDS: rset(b.cla("a"), b.cla("b", 2))}) == []
    # Removing an unsubscribed resource is not reported either.
    assert s.push({EDS: rset(b.cla("a"))}) == []


def test_rule4_delta_adding_explicit_wildcard_is_answered(b: Build) -> None:
    """Subscribing to '*' later is a new subscription: answered without waiting for a push."""
    s = DeltaStream()
    res = rset(b.cluster("a"), b.cluster("b"))
    r1 = dstart(s, CDS, res, sub=["a"])
    out = s.receive(dack(r1, sub=["*"]))
    assert out.must_respond
    assert got(s.respond(CDS, res, force=True)) == (["b"], [])


# --- rule 5 ---------------------------------------------------------------------------------


def test_rule5_delta_legacy_wildcard(b: Build) -> None:
    s = DeltaStream()
    r1 = dstart(s, CDS, rset(b.cluster("b"), b.cluster("a")))
    assert got(r1) == (["a", "b"], [])
    (r2,) = s.push({CDS: rset(b.cluster("a"), b.cluster("b"), b.cluster("c"))})
    assert got(r2) == (["c"], [])


def test_rule5_delta_explicit_wildcard(b: Build) -> None:
    s = DeltaStream()
    r1 = dstart(s, LDS, rset(b.listener("x"), b.listener("y")), sub=["*"])
    assert got(r1) == (["x", "y"], [])


def test_rule5_delta_wildcard_plus_names(b: Build) -> None:
    s = DeltaStream()
    r1 = dstart(s, CDS, rset(b.cluster("a")), sub=["*", "od"])
    assert got(r1) == (["a"], ["od"])  # od does not exist (yet): said once
    (r2,) = s.push({CDS: rset(b.cluster("a"), b.cluster("od"))})
    assert got(r2) == (["od"], [])
    # Unsubscribing od while the wildcard still covers it: the client drops its copy and
    # expects the state of od again (go-control-plane#558); it comes with the next push.
    s.receive(dack(r2, unsub=["od"]))
    (r3,) = s.push({CDS: rset(b.cluster("a"), b.cluster("od"))})
    assert got(r3) == (["od"], [])


def test_rule5_delta_name_that_does_not_exist_yet_is_sent_when_it_appears(b: Build) -> None:
    s = DeltaStream()
    r1 = dstart(s, EDS, rset(b.cla("a")), sub=["a", "later"])
    assert got(r1) == (["a"], ["later"])
    assert s.push({EDS: rset(b.cla("a"))}) == []
    (r2,) = s.push({EDS: rset(b.cla("a"), b.cla("later"))})
    assert got(r2) == (["later"], [])


def test_rule5_delta_subscribe_and_unsubscribe_wildcard_means_nothing(b: Build) -> None:
    """Istio's way to open a non-wildcard subscription with no names yet."""
    s = DeltaStream()
    s.receive(dreq(CDS, sub=["*"], unsub=["*"]))
    r = s.respond(CDS, rset(b.cluster("a")), force=True)
    assert got(r) == ([], [])


def test_rule5_delta_legacy_wildcard_ends_once_names_are_subscribed(b: Build) -> None:
    """xDS: legacy wildcard holds only while the client never subscribed to a name."""
    s = DeltaStream()
    res = rset(b.cluster("a"), b.cluster("b"))
    r1 = dstart(s, CDS, res)
    s.receive(dack(r1, sub=["a"]))
    s.receive(dreq(CDS, unsub=["a"]))
    # No longer subscribed to anything: a new cluster must not be pushed.
    assert s.push({CDS: rset(b.cluster("a"), b.cluster("b"), b.cluster("c"))}) == []


# --- rule 6 ---------------------------------------------------------------------------------


def _subscribe_all(s: DeltaStream, b: Build) -> None:
    dstart(s, RDS, rset(b.route("r")), sub=["r"])
    dstart(s, LDS, rset(b.listener("l")))
    dstart(s, EDS, rset(b.cla("a"), b.cla("b")), sub=["a", "b"])
    dstart(s, CDS, rset(b.cluster("a"), b.cluster("b")))


def test_rule6_delta_updated_cluster_gets_its_assignment_again(b: Build) -> None:
    """Envoy warms an updated EDS cluster until an assignment for it arrives: an unchanged
    assignment is sent again (only for the clusters updated)."""
    s = DeltaStream()
    dstart(s, CDS, rset(b.cluster("a"), b.cluster("b")))
    dstart(s, EDS, rset(b.cla("a"), b.cla("b")), sub=["a", "b"])
    eds = rset(b.cla("a"), b.cla("b"))
    out = s.push({CDS: rset(b.cluster("a", 2), b.cluster("b")), EDS: eds})
    assert [(r.type_url, got(r)) for r in out] == [(CDS, (["a"], [])), (EDS, (["a"], []))]
    for resp in out:
        s.receive(dack(resp))
    # Nothing updated: nothing sent; a cluster only added: CDS alone.
    assert s.push({CDS: rset(b.cluster("a", 2), b.cluster("b")), EDS: eds}) == []
    out = s.push({CDS: rset(b.cluster("a", 2), b.cluster("b"), b.cluster("c")), EDS: eds})
    assert [(r.type_url, got(r)) for r in out] == [(CDS, (["c"], []))]


def test_rule6_delta_push_order_and_cluster_removals_last(b: Build) -> None:
    s = DeltaStream()
    _subscribe_all(s, b)
    out = s.push(
        {
            RDS: rset(b.route("r", 2)),
            LDS: rset(b.listener("l", 2)),
            EDS: rset(b.cla("a", 2)),
            CDS: rset(b.cluster("a", 2), b.cluster("c")),  # b removed, c added
        }
    )
    assert [(r.type_url, *got(r)) for r in out] == [
        (CDS, ["a", "c"], []),
        (EDS, ["a"], ["b"]),
        (LDS, ["l"], []),
        (RDS, ["r"], []),
        (CDS, [], ["b"]),
    ]


def test_rule6_delta_cluster_removal_alone_is_last_response(b: Build) -> None:
    s = DeltaStream()
    _subscribe_all(s, b)
    out = s.push({CDS: rset(b.cluster("a")), LDS: rset(b.listener("l", 2))})
    assert [(r.type_url, *got(r)) for r in out] == [(LDS, ["l"], []), (CDS, [], ["b"])]


# --- rule 7 ---------------------------------------------------------------------------------


def test_rule7_per_resource_versions_only_changed_sent(b: Build) -> None:
    s = DeltaStream()
    dstart(s, CDS, rset(b.cluster("a"), b.cluster("b"), b.cluster("c")))
    (r,) = s.push({CDS: rset(b.cluster("a"), b.cluster("b", 2), b.cluster("c"))})
    assert got(r) == (["b"], [])
    assert r.resources[0].version == b.cluster("b", 2).version
    assert s.client_versions(CDS) == {
        "a": b.cluster("a").version,
        "b": b.cluster("b", 2).version,
        "c": b.cluster("c").version,
    }


def test_rule7_removed_resources(b: Build) -> None:
    s = DeltaStream()
    dstart(s, CDS, rset(b.cluster("a"), b.cluster("b")))
    (r,) = s.push({CDS: rset(b.cluster("a"))})
    assert got(r) == ([], ["b"])
    assert s.push({CDS: rset(b.cluster("a"))}) == []  # said once


def test_rule7_subscription_change_applied_with_stale_nonce(b: Build) -> None:
    s = DeltaStream()
    res = rset(b.cla("a"), b.cla("b"), b.cla("c"))
    dstart(s, EDS, res, sub=["a", "c"])
    out = s.receive(dreq(EDS, sub=["b"], unsub=["c"], nonce="long-gone"))
    assert out.kind is RequestKind.STALE and out.must_respond
    assert got(s.respond(EDS, res, force=True)) == (["b"], [])
    # c was unsubscribed by the stale request: its changes are no longer sent.
    assert s.push({EDS: rset(b.cla("a"), b.cla("b"), b.cla("c", 2))}) == []


def test_rule7_initial_resource_versions_honoured(b: Build) -> None:
    a1, b1, gone = b.cluster("a"), b.cluster("b"), b.cluster("gone")
    s = DeltaStream()
    s.receive(dreq(CDS, initial={"a": a1.version, "b": b1.version, "gone": gone.version}))
    r = s.respond(CDS, rset(a1, b.cluster("b", 2), b.cluster("new")), force=True)
    assert got(r) == (["b", "new"], ["gone"])


def test_rule7_initial_resource_versions_all_current_still_answered(b: Build) -> None:
    a1 = b.cluster("a")
    s = DeltaStream()
    out = s.receive(dreq(CDS, sub=["*"], initial={"a": a1.version}))
    assert out.kind is RequestKind.INITIAL and out.must_respond
    assert got(s.respond(CDS, rset(a1), force=True)) == ([], [])


def test_rule7_first_wildcard_request_answered_even_when_empty() -> None:
    s = DeltaStream()
    out = s.receive(dreq(CDS))
    assert out.must_respond
    r = s.respond(CDS, ResourceSet(()), force=True)
    assert r is not None and got(r) == ([], [])
    assert status_of(s, CDS).status is SyncStatus.STALE


def test_rule7_missing_subscribed_name_reported_removed_once(b: Build) -> None:
    s = DeltaStream()
    s.receive(dreq(EDS, sub=["nope"]))
    assert got(s.respond(EDS, rset(b.cla("a")), force=True)) == ([], ["nope"])
    assert s.respond(EDS, rset(b.cla("a"))) is None
    assert s.push({EDS: rset(b.cla("a"), b.cla("other"))}) == []


def test_rule7_resubscribe_after_unsubscribe_resends(b: Build) -> None:
    s = DeltaStream()
    res = rset(b.cla("a"))
    r1 = dstart(s, EDS, res, sub=["a"])
    s.receive(dack(r1, unsub=["a"]))
    out = s.receive(dreq(EDS, sub=["a"]))
    assert out.kind is RequestKind.UPDATE and out.must_respond
    assert got(s.respond(EDS, res, force=True)) == (["a"], [])


def test_rule7_acks_of_older_outstanding_responses_are_acks(b: Build) -> None:
    """Delta clients ACK every response; an ACK of an earlier one is not stale."""
    s = DeltaStream()
    dstart(s, CDS, rset(b.cluster("a")))
    (r2,) = s.push({CDS: rset(b.cluster("a", 2))})
    (r3,) = s.push({CDS: rset(b.cluster("a", 3))})
    assert s.receive(dack(r2)).kind is RequestKind.ACK
    assert status_of(s, CDS).status is SyncStatus.STALE
    assert s.receive(dack(r3)).kind is RequestKind.ACK
    assert status_of(s, CDS).status is SyncStatus.SYNCED
    assert s.receive(dack(r3)).kind is RequestKind.STALE  # already acknowledged


# --- nonces and syncz ---------------------------------------------------------------------


def test_nonces_unique_per_delta_stream(b: Build) -> None:
    s = DeltaStream()
    _subscribe_all(s, b)
    nonces = [status_of(s, t).sent_nonce for t in (CDS, EDS, LDS, RDS)]
    for rev in range(2, 6):
        nonces += [
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
    assert len(nonces) == len(set(nonces)) > 10


def test_syncz_delta_status_not_sent_stale_synced_error(b: Build) -> None:
    s = DeltaStream()
    s.receive(dreq(CDS))
    assert status_of(s, CDS).status is SyncStatus.NOT_SENT
    r1 = s.respond(CDS, rset(b.cluster("a"), b.cluster("b")), force=True)
    assert r1 is not None
    row = status_of(s, CDS)
    assert row.status is SyncStatus.STALE and row.sent_nonce == r1.nonce
    assert row.resource_count == 2
    s.receive(dack(r1))
    row = status_of(s, CDS)
    assert row.status is SyncStatus.SYNCED and row.acked_nonce == r1.nonce
    (r2,) = s.push({CDS: rset(b.cluster("a", 2), b.cluster("b"))})
    s.receive(dnack(r2, "nope"))
    row = status_of(s, CDS)
    assert row.status is SyncStatus.ERROR and row.last_nack == "nope"
    assert (s.requests, s.acks, s.nacks) == (3, 1, 1)


# --- property -----------------------------------------------------------------------------

TYPES = (CDS, EDS, LDS)
NAMES = ("a", "b", "c")

_names: st.SearchStrategy[list[str]] = st.one_of(
    st.just([]), st.lists(st.sampled_from((*NAMES, "*", "zz")), max_size=3, unique=True)
)
_request = st.tuples(
    st.just("req"),
    st.sampled_from(TYPES),
    _names,
    _names,
    st.sampled_from(("last", "last", "last", "", "bogus", "old")),
    st.one_of(st.none(), st.sampled_from(("bad", ""))),
)
_push = st.tuples(
    st.just("push"),
    st.fixed_dictionaries(
        {t: st.dictionaries(st.sampled_from(NAMES), st.integers(1, 3), max_size=3) for t in TYPES}
    ),
)
_push_same = st.just(("push_same",))


@fuzz_settings(500)
@given(first=_push, ops=st.lists(st.one_of(_request, _request, _push, _push_same), max_size=40))
def test_property_delta_rules_2_4_7_random_interleavings(first: tuple, ops: list[tuple]) -> None:  # type: ignore[type-arg]
    """Random delta requests (subscribe/unsubscribe incl. '*', real/older/bogus/no nonce, with
    or without error_detail) interleaved with random pushes: nothing raises, nonces stay
    unique, a push repeated at once sends nothing, a response never both updates and removes a
    name, and no resource version a client NACKed is sent again without a change to that
    resource or its subscription in between."""
    b = Build()
    build = {CDS: b.cluster, EDS: b.cla, LDS: b.listener}
    s = DeltaStream("prop")
    current: dict[str, ResourceSet] = {t: ResourceSet(()) for t in TYPES}
    nonces: set[str] = set()
    sent_nonces: dict[str, list[str]] = {t: [] for t in TYPES}
    last_resp: dict[str, DeltaResponse] = {}
    by_nonce: dict[str, DeltaResponse] = {}
    nacked: dict[str, dict[str, str]] = {t: {} for t in TYPES}  # type -> name -> version

    def sent(resp: DeltaResponse) -> None:
        assert resp.nonce and resp.nonce not in nonces
        nonces.add(resp.nonce)
        sent_nonces[resp.type_url].append(resp.nonce)
        last_resp[resp.type_url] = resp
        by_nonce[resp.nonce] = resp
        names = [r.name for r in resp.resources]
        assert not set(names) & set(resp.removed)
        assert len(names) == len(set(names)) and len(resp.removed) == len(set(resp.removed))
        for r in resp.resources:
            if nacked[resp.type_url].get(r.name) == r.version:
                raise AssertionError(f"re-sent NACKed {r.name}@{r.version} unchanged")

    for op in [first, *ops]:  # config exists before the proxy connects
        if op[0] in ("push", "push_same"):
            if any(nacked.values()):
                event("push after a NACK")
            if op[0] == "push":
                new = {
                    t: ResourceSet([build[t](n, rev) for n, rev in sorted(op[1][t].items())])
                    for t in TYPES
                }
                for t in TYPES:
                    for n, v in list(nacked[t].items()):
                        if n not in new[t] or new[t][n].version != v:
                            del nacked[t][n]  # changed: may be sent again
                current = new
            for resp in s.push(current):
                sent(resp)
            assert s.push(current) == [], "a repeated push sent something"
            continue
        _, t, sub, unsub, which, err = op
        history = sent_nonces[t]
        nonce = {
            "last": history[-1] if history else "",
            "": "",
            "bogus": "x-bogus",
            "old": history[0] if history else "",
        }[which]
        r = dreq(t, sub, unsub, nonce)
        if err is not None:
            r.error_detail.code = 3
            r.error_detail.message = err
        is_first = t not in s.subscribed_types
        outcome = s.receive(r)
        if is_first:
            assert outcome.kind is RequestKind.INITIAL and outcome.must_respond
        if outcome.kind is RequestKind.NACK:
            event("NACK")
            assert status_of(s, t).last_nack
            if nonce == last_resp[t].nonce:
                assert status_of(s, t).status is SyncStatus.ERROR
            # The rejected response is the one the nonce names (delta: any outstanding one);
            # resources a later response already updated or removed count as changed since.
            holds = s.client_versions(t)
            nacked[t].update(
                {
                    x.name: x.version
                    for x in by_nonce[nonce].resources
                    if holds.get(x.name) == x.version
                }
            )
        for n in (*sub, *unsub):
            if n == "*":
                nacked[t].clear()
            nacked[t].pop(n, None)  # a subscription change in this request may resend
        if outcome.must_respond:
            answer = s.respond(t, current[t], force=True)
            assert answer is not None
            sent(answer)


def test_unsubscribing_wildcard_forgets_what_came_only_through_it() -> None:
    from envoy.config.cluster.v3.cluster_pb2 import Cluster
    from envoy.service.discovery.v3.discovery_pb2 import DeltaDiscoveryRequest

    from control.xds.cache import ResourceCache, ResourceSet
    from control.xds.delta import DeltaStream

    cache = ResourceCache()
    cds = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
    rs = ResourceSet([cache.get(cds, n, n, lambda n=n: Cluster(name=n)) for n in ("a", "b")])
    s = DeltaStream()
    s.receive(DeltaDiscoveryRequest(type_url=cds, resource_names_subscribe=["*", "a"]))
    first = s.respond(cds, rs, force=True)
    assert first is not None and [r.name for r in first.resources] == ["a", "b"]
    s.receive(DeltaDiscoveryRequest(type_url=cds, resource_names_unsubscribe=["*"]))
    assert s.client_versions(cds) == {"a": rs["a"].version}
    out = s.receive(DeltaDiscoveryRequest(type_url=cds, resource_names_subscribe=["*"]))
    assert out.must_respond
    again = s.respond(cds, rs)
    assert again is not None and [r.name for r in again.resources] == ["b"]


def test_outstanding_nonces_are_bounded_for_a_client_that_never_acks() -> None:
    from envoy.config.cluster.v3.cluster_pb2 import Cluster
    from envoy.service.discovery.v3.discovery_pb2 import DeltaDiscoveryRequest

    from control.xds.cache import ResourceCache, ResourceSet
    from control.xds.delta import DeltaStream

    cache = ResourceCache()
    cds = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
    s = DeltaStream()
    s.receive(DeltaDiscoveryRequest(type_url=cds))
    last = None
    for i in range(100):
        rs = ResourceSet(
            [cache.get(cds, "a", i, lambda i=i: Cluster(name="a", alt_stat_name=str(i)))]
        )
        last = s.respond(cds, rs, force=True) or last
    assert last is not None
    st = s._types[cds]
    assert len(st.outstanding) <= 32 and last.nonce in st.outstanding
    ack = s.receive(DeltaDiscoveryRequest(type_url=cds, response_nonce=last.nonce))
    assert ack.kind.value == "ack"


# --- a push of a derived set looks at the changed names only -------------------------------

_change = st.tuples(
    st.just("replace"),
    st.sampled_from(TYPES),
    st.dictionaries(
        st.sampled_from((*NAMES, "d")), st.one_of(st.none(), st.integers(1, 3)), max_size=3
    ),
)


# A first request that claims resources (a reconnecting client's initial_resource_versions).
_reconnect = st.tuples(
    st.just("reconnect"),
    st.sampled_from(TYPES),
    _names,
    st.dictionaries(st.sampled_from((*NAMES, "d")), st.sampled_from(("x", "y")), max_size=3),
)


def _shape(responses: Iterable[DeltaResponse | None]) -> list[object]:
    return [
        None
        if r is None
        else (r.type_url, r.nonce, [(x.name, x.version) for x in r.resources], list(r.removed))
        for r in responses
    ]


@fuzz_settings(400)
@given(ops=st.lists(st.one_of(_request, _change, _change, _push_same, _reconnect), max_size=40))
def test_property_delta_push_of_derived_set_answers_as_a_full_comparison(
    ops: list[tuple],  # type: ignore[type-arg]
) -> None:
    """The incremental EDS push derives each set from the previous one (ResourceSet.replace);
    a stream whose client holds the previous set then compares only the names that changed
    (ResourceSet.changed_since), a new stream gets a selection worked out once for all
    (ResourceSet.selection), and a stream in line with a set refers to the set's versions
    instead of a copy. Whatever the interleaving of subscription changes, ACKs, NACKs, stale
    nonces and pushes, it must answer exactly as a stream that compares every subscribed
    name (fed plain mappings of the same resources)."""
    b = Build()
    build = {CDS: b.cluster, EDS: b.cla, LDS: b.listener}
    fast, full = DeltaStream("s"), DeltaStream("s")
    current = {t: ResourceSet(()) for t in TYPES}
    last: dict[str, str] = {}

    def copies() -> dict[str, dict[str, Resource]]:
        # Plain mappings: no history, no shared selections; every name compared.
        return {t: dict(rs) for t, rs in current.items()}

    for op in ops:
        if op[0] == "reconnect":
            _, t, sub, claimed = op
            if t in fast.subscribed_types:
                continue  # initial versions count on a stream's first request only
            # The client claims the versions it holds of the current resources, or stale ones.
            initial = {
                n: current[t][n].version if v == "x" and n in current[t] else v
                for n, v in claimed.items()
            }
            req = dreq(t, sub, initial=initial)
            assert fast.receive(req) == full.receive(req)
            a = fast.respond(t, current[t], force=True)
            c = full.respond(t, copies()[t], force=True)
            assert _shape([a]) == _shape([c])
            if a is not None:
                last[t] = a.nonce
            continue
        if op[0] in ("replace", "push_same"):
            if op[0] == "replace":
                _, t, changes = op
                derived = current[t].replace(
                    {n: build[t](n, rev) if rev else None for n, rev in changes.items()}
                )
                current = {**current, t: derived}
            got_fast, got_full = fast.push(current), full.push(copies())
            assert _shape(got_fast) == _shape(got_full)
            for r in got_fast:
                last[r.type_url] = r.nonce
            continue
        _, t, sub, unsub, which, err = op
        nonce = {"last": last.get(t, ""), "": "", "bogus": "x-bogus", "old": "1"}[which]
        req = dreq(t, sub, unsub, nonce, error=err)
        out_fast, out_full = fast.receive(req), full.receive(req)
        assert out_fast == out_full
        if out_fast.must_respond:
            a = fast.respond(t, current[t], force=True)
            c = full.respond(t, copies()[t], force=True)
            assert _shape([a]) == _shape([c])
            if a is not None:
                last[t] = a.nonce
    for t in TYPES:
        if t in fast.subscribed_types:
            assert fast.client_versions(t) == full.client_versions(t)


def test_delta_push_of_derived_set_looks_only_at_changed_names(b: Build) -> None:
    """What the property above makes safe: with a thousand subscribed assignments, a push
    that changed one looks at that one (the slow path would ask for all thousand)."""
    names = [f"c{i}" for i in range(1000)]
    base = ResourceSet([b.cla(n) for n in names])
    s = DeltaStream()
    dstart(s, EDS, base, sub=names)

    class Counting(ResourceSet):
        asked = 0

        def get(self, name: str, default: Resource | None = None) -> Resource | None:  # type: ignore[override]
            Counting.asked += 1
            return super().get(name, default)

    derived = base.replace({"c7": b.cla("c7", rev=2)})
    counting = Counting(dict(derived))
    counting.seq, counting._since = derived.seq, derived._since  # the same set, counted
    (resp,) = s.push({EDS: counting})
    assert got(resp) == (["c7"], [])
    assert Counting.asked == 1


def test_rule8_new_streams_share_their_first_answers(b: Build) -> None:
    """Thousands of proxies connecting at once: each new stream's first answer sends all of
    the same selection; it is worked out and encoded once, and every stream refers to the
    selection's versions instead of a copy of its own."""
    names = [f"c{i}" for i in range(50)]
    rs = ResourceSet([b.cla(n) for n in names])
    answers = []
    streams = []
    for _ in range(3):
        s = DeltaStream()
        s.receive(dreq(EDS, names))
        resp = s.respond(EDS, rs, force=True)
        assert resp is not None and resp.selection is not None
        answers.append(resp)
        streams.append(s)
    first = answers[0]
    assert all(a.selection is first.selection for a in answers)
    encoded = [
        a.selection.framed(a.type_url, a.system_version_info, a.nonce, None)  # type: ignore[union-attr]
        for a in answers
    ]
    assert encoded[0] is encoded[1] is encoded[2]
    decoded = DeltaDiscoveryResponse.FromString(encoded[0])
    assert [r.name for r in decoded.resources] == sorted(names)
    assert (decoded.nonce, decoded.system_version_info) == (first.nonce, first.system_version_info)
    assert all(s._types[EDS].client_has is first.selection.versions for s in streams)  # type: ignore[union-attr]
    # A stream that changes what it holds gets a copy of its own; the others keep sharing.
    streams[0].receive(dreq(EDS, unsub=["c0"], nonce=first.nonce))
    assert streams[0].client_versions(EDS).keys() == set(names) - {"c0"}
    assert streams[1]._types[EDS].client_has is first.selection.versions  # type: ignore[union-attr]
    assert len(streams[1].client_versions(EDS)) == 50
