"""Serialized-resource cache (control/xds/cache.py), wire rules 4 and 8."""

from __future__ import annotations

from envoy.config.cluster.v3.cluster_pb2 import Cluster
from envoy.config.endpoint.v3.endpoint_pb2 import ClusterLoadAssignment
from envoy.service.discovery.v3.discovery_pb2 import DeltaDiscoveryResponse
from google.protobuf import any_pb2

from control.xds.cache import EMPTY, Resource, ResourceCache, ResourceSet, digest
from protos import typeurls

CDS, EDS = typeurls.CLUSTER, typeurls.ENDPOINT


class Counting:
    """A build callback that counts how often it is called."""

    def __init__(self, name: str, timeout: int = 1) -> None:
        self.name, self.timeout, self.calls = name, timeout, 0

    def __call__(self) -> Cluster:
        self.calls += 1
        c = Cluster(name=self.name)
        c.connect_timeout.seconds = self.timeout
        return c


def test_rule8_same_key_is_not_serialized_again() -> None:
    cache = ResourceCache()
    build = Counting("a")
    r1 = cache.get(CDS, "a", ("svc-a", 1), build)
    for _ in range(5):
        assert cache.get(CDS, "a", ("svc-a", 1), build) is r1
    assert build.calls == 1 and cache.serializations == 1


def test_rule8_resource_bytes_are_a_real_any() -> None:
    cache = ResourceCache()
    r = cache.get(CDS, "a", 1, Counting("a", 7))
    assert (r.name, r.type_url) == ("a", CDS)
    any_msg = any_pb2.Any.FromString(r.any_bytes)
    assert any_msg.type_url == CDS
    c = Cluster()
    assert any_msg.Unpack(c) and c.name == "a" and c.connect_timeout.seconds == 7
    assert r.version == digest(any_msg.value)
    # delta_field() is one element of DeltaDiscoveryResponse.resources, tag included.
    (d,) = DeltaDiscoveryResponse.FromString(r.delta_field()).resources
    assert (d.name, d.version) == ("a", r.version)
    assert d.resource.SerializeToString() == any_msg.SerializeToString()


def test_rule8_delta_field_is_shared_from_its_second_use_only() -> None:
    # A resource one stream receives (a proxy's own listener) must not keep a second copy of
    # its bytes; one that many streams receive is encoded once more, then shared.
    r = ResourceCache().get(CDS, "a", 1, Counting("a"))
    first = r.delta_field()
    second = r.delta_field()
    assert first == second and first is not second
    assert r.delta_field() is second and r.delta_field() is second


def test_rule4_new_key_identical_bytes_same_object_and_version() -> None:
    cache = ResourceCache()
    r1 = cache.get(CDS, "a", ("svc-a", 1), Counting("a"))
    build = Counting("a")  # unrelated input changed, output identical
    r2 = cache.get(CDS, "a", ("svc-a", 2), build)
    assert r2 is r1 and build.calls == 1
    assert cache.serializations == 2
    # The new key is remembered: asking again with it does not rebuild.
    assert cache.get(CDS, "a", ("svc-a", 2), build) is r1 and build.calls == 1


def test_rule4_new_bytes_new_version() -> None:
    cache = ResourceCache()
    r1 = cache.get(CDS, "a", 1, Counting("a", 1))
    r2 = cache.get(CDS, "a", 2, Counting("a", 2))
    assert r2 is not r1 and r2.version != r1.version
    assert cache.get(CDS, "a", 2, Counting("a", 2)) is r2


def test_rule8_entries_are_per_type_and_name() -> None:
    cache = ResourceCache()
    c = cache.get(CDS, "x", 1, Counting("x"))
    e = cache.get(EDS, "x", 1, lambda: ClusterLoadAssignment(cluster_name="x"))
    assert c is not e and c.type_url == CDS and e.type_url == EDS
    assert len(cache) == 2


def test_cache_sweep_drops_unused_entries() -> None:
    cache = ResourceCache()
    cache.get(CDS, "keep", 1, Counting("keep"))
    cache.get(CDS, "gone", 1, Counting("gone"))
    cache.get(CDS, "same-bytes", 1, Counting("same-bytes"))
    assert cache.sweep() == 0
    for _ in range(3):
        cache.next_generation()
        cache.get(CDS, "keep", 1, Counting("keep"))  # used every generation
        cache.get(CDS, "same-bytes", cache.generation, Counting("same-bytes"))  # new key
    assert cache.sweep(keep=2) == 1
    assert len(cache) == 2
    # Swept entries are rebuilt on demand.
    build = Counting("gone")
    cache.get(CDS, "gone", 1, build)
    assert build.calls == 1


def test_cache_sweep_keeps_recent_generations() -> None:
    cache = ResourceCache()
    cache.get(CDS, "a", 1, Counting("a"))
    cache.next_generation()
    cache.next_generation()
    assert cache.sweep(keep=2) == 0  # used exactly `keep` generations ago
    cache.next_generation()
    assert cache.sweep(keep=2) == 1 and len(cache) == 0


def test_resource_set_digest_is_order_independent_and_tracks_versions() -> None:
    cache = ResourceCache()
    a, b = cache.get(CDS, "a", 1, Counting("a")), cache.get(CDS, "b", 1, Counting("b"))
    s1, s2 = ResourceSet([a, b]), ResourceSet({"b": b, "a": a})
    assert s1.digest == s2.digest
    assert s1.versions() == {"a": a.version, "b": b.version}
    b2 = cache.get(CDS, "b", 2, Counting("b", 2))
    assert ResourceSet([a, b2]).digest != s1.digest
    assert ResourceSet([a]).digest != s1.digest
    assert len(s1) == 2 and "a" in s1 and "z" not in s1 and s1["a"] is a
    assert sorted(s1) == ["a", "b"]
    assert len(EMPTY) == 0 and EMPTY.digest == ResourceSet(()).digest


def test_resource_is_immutable() -> None:
    r = Resource("a", "v", CDS, b"")
    try:
        r.version = "w"  # type: ignore[misc]
    except AttributeError:
        pass
    else:  # pragma: no cover
        raise AssertionError("Resource must be frozen")


def test_rule8_equal_selections_share_one_view_and_its_encoded_response() -> None:
    """A set rebuilt with the same resources (a later push, or the cache rebuilt them after a
    sweep) selects the view streams already hold, so a stream that connects later shares the
    encoded response instead of keeping a copy of its own."""
    first = ResourceCache()
    second = ResourceCache()  # rebuilt from nothing: new Resource objects, same bytes
    a = ResourceSet([first.get(CDS, n, n, Counting(n)) for n in ("a", "b")])
    b = ResourceSet([second.get(CDS, n, n, Counting(n)) for n in ("b", "a")])
    assert a["a"] is not b["a"]
    held = a.view(None)
    assert b.view(None) is held
    assert b.view(frozenset({"a", "b"})) is held  # the same selection by name
    assert held.framed(CDS, None) == b.view(None).framed(CDS, None)
    assert held.framed(CDS, None) is b.view(None).framed(CDS, None)  # kept from the second on
    assert a.view(frozenset({"a"})) is not held
    assert a.view(frozenset({"a"})).version != held.version


def test_resource_set_replace_remembers_what_changed_since_its_ancestors() -> None:
    cache = ResourceCache()
    base = ResourceSet([cache.get(CDS, n, n, Counting(n)) for n in ("a", "b", "c")])
    one = base.replace({"a": cache.get(CDS, "a", "a2", Counting("a", 2))})
    two = one.replace({"b": None, "d": cache.get(CDS, "d", "d", Counting("d"))})
    assert two.changed_since(two.seq) == frozenset()
    assert two.changed_since(one.seq) == {"b", "d"}
    assert two.changed_since(base.seq) == {"a", "b", "d"}
    assert one.changed_since(two.seq) is None  # not an ancestor
    assert ResourceSet(dict(two)).changed_since(base.seq) is None  # no history
    chain = base
    for i in range(20):
        chain = chain.replace({"c": cache.get(CDS, "c", f"c{i}", Counting("c", i + 3))})
    assert chain.changed_since(base.seq) is None  # too far back: look at everything
