"""Pushes after a rule change (a VirtualService, DestinationRule, Service or Gateway edited):
the new index shares every part whose config slice is unchanged (MeshIndex.next), and the
generators carry over what depends on none of the changes (the outbound plan, CDS and EDS
sets, each VirtualService's route translation, each virtual host's bytes). What they give
must be exactly what a fresh build gives, and the work they do must be what changed."""

from __future__ import annotations

import dataclasses
import gc
import random
import weakref
from collections.abc import Callable
from typing import TypeVar

import pytest
from envoy.config.route.v3.route_pb2 import RouteConfiguration
from google.protobuf import any_pb2

from control.generate import generators_for, plans, route_tables
from control.generate.context import GenContext, next_context
from control.generate.resource_names import CLUSTER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE, ROUTE_TYPE
from control.model.gateway import Gateway
from control.model.index import IndexChange, MeshIndex
from control.model.proxy import Proxy, proxy_from_node
from control.model.traffic import (
    ConsistentHash,
    DestinationRule,
    HttpRoute,
    LoadBalancer,
    TrafficPolicy,
    VirtualService,
)
from control.model.types import MeshConfig, Service, ServicePort
from control.xds.cache import ResourceCache, ResourceSet
from tests.support.gateways import GATEWAY_MESH, SERVICES, router
from tests.support.traffic import mesh_config, subsets_rule, workload_entry

T = TypeVar("T")
TYPES = (CLUSTER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE, ROUTE_TYPE)
REVIEWS = "reviews.default.svc.cluster.local"
RATINGS = "ratings.default.svc.cluster.local"

# The gateway mesh (every server shape), plus what sidecars route by: a mesh VirtualService
# with a split over subsets, DestinationRules, endpoints.
MESH = (
    GATEWAY_MESH
    + subsets_rule("reviews")
    + subsets_rule("ratings", ("v1",))
    + workload_entry("reviews-1", "10.3.0.1", app="reviews", version="v1")
    + workload_entry("reviews-2", "10.3.0.2", app="reviews", version="v2")
    + workload_entry("ratings-1", "10.3.0.3", app="ratings", version="v1")
    + """
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: reviews-mesh, namespace: default}
spec:
  hosts: [reviews]
  gateways: [mesh, edge/a]
  http:
  - match: [{uri: {prefix: /v2}, gateways: [mesh]}]
    route: [{destination: {host: reviews, subset: v2}}]
  - route:
    - {destination: {host: reviews, subset: v1}, weight: 80}
    - {destination: {host: ratings}, weight: 20}
"""
)


def proxies() -> list[Proxy]:
    def sidecar(ip: str, ns: str, meta: dict[str, object]) -> Proxy:
        return proxy_from_node(f"sidecar~{ip}~client.{ns}~{ns}.svc.cluster.local", meta)

    return [
        router(),
        router(mode="REDIRECT"),
        sidecar("10.9.0.1", "default", {"SDS": "true"}),
        sidecar("10.9.0.2", "shop", {}),
        sidecar("10.9.0.3", "default", {"INTERCEPTION_MODE": "REDIRECT", "LABELS": {"app": "x"}}),
    ]


def generate(ctx: GenContext, ps: list[Proxy]) -> list[dict[str, ResourceSet]]:
    return [{t: generators_for(p)[t](ctx, p) for t in TYPES} for p in ps]


def as_bytes(sets: list[dict[str, ResourceSet]]) -> list[dict[str, dict[str, bytes]]]:
    return [{t: {n: s[n].any_bytes for n in s} for t, s in per_proxy.items()} for per_proxy in sets]


# --- edits at the model level: every object not edited stays the same object (as the config
# --- watcher keeps the objects of unchanged files) ---------------------------------------


def _replace_one(items: tuple[T, ...], i: int, new: T) -> tuple[T, ...]:
    return (*items[:i], new, *items[i + 1 :])


def edit_route(cfg: MeshConfig, rng: random.Random) -> MeshConfig:
    vss = cfg.virtual_services
    i = rng.randrange(len(vss))
    vs = vss[i]
    if not vs.http:
        return cfg
    first = vs.http[0]
    what = rng.randrange(3)
    if what == 0:
        first = dataclasses.replace(first, timeout=rng.choice((None, 1.0, 2.5)))
    elif what == 1 and first.destinations:
        d = first.destinations[0]
        host = RATINGS if d.host == REVIEWS else REVIEWS
        first = dataclasses.replace(
            first, destinations=(dataclasses.replace(d, host=host, subset=""),)
        )
    else:
        first = dataclasses.replace(first, name=f"r{rng.randrange(100)}")
    new = dataclasses.replace(vs, http=(first, *vs.http[1:]))
    return dataclasses.replace(cfg, virtual_services=_replace_one(vss, i, new))


def edit_binding(cfg: MeshConfig, rng: random.Random) -> MeshConfig:
    """A VirtualService replaced in place that serves other hosts or other gateways: what
    is bound where, and the order of virtual hosts, may change."""
    vss = cfg.virtual_services
    i = rng.randrange(len(vss))
    vs = vss[i]
    if rng.random() < 0.5:
        extra = "extra.example.com"
        hosts = (
            tuple(h for h in vs.hosts if h != extra) if extra in vs.hosts else (extra, *vs.hosts)
        )
        new = dataclasses.replace(vs, hosts=hosts)
    else:
        gateways = vs.gateways[:-1] if len(vs.gateways) > 1 else (*vs.gateways, "edge/b")
        new = dataclasses.replace(vs, gateways=gateways)
    return dataclasses.replace(cfg, virtual_services=_replace_one(vss, i, new))


def edit_rule(cfg: MeshConfig, rng: random.Random) -> MeshConfig:
    drs = cfg.destination_rules
    i = rng.randrange(len(drs))
    dr = drs[i]
    hashed = TrafficPolicy(
        load_balancer=LoadBalancer(consistent_hash=ConsistentHash(header=f"x-{rng.randrange(3)}"))
    )
    what = rng.randrange(3)
    if what == 0:
        new = dataclasses.replace(dr, policy=None if dr.policy is not None else hashed)
    elif what == 1:
        new = dataclasses.replace(dr, subsets=dr.subsets[:1] if len(dr.subsets) > 1 else dr.subsets)
    else:
        new = dataclasses.replace(dr, policy=hashed)
    return dataclasses.replace(cfg, destination_rules=_replace_one(drs, i, new))


def edit_service(cfg: MeshConfig, rng: random.Random) -> MeshConfig:
    services = cfg.services
    i = next(j for j, s in enumerate(services) if s.hostname in (REVIEWS, RATINGS))
    s = services[i]
    first = s.ports[0]
    if len(s.ports) == 1 and rng.random() < 0.5:
        ports = (first, ServicePort("http-admin", 9090, first.protocol, 9090))
    else:
        number = 9081 if first.port == 9080 else 9080
        ports = (dataclasses.replace(first, port=number),)
    new = dataclasses.replace(s, ports=ports)
    return dataclasses.replace(cfg, services=_replace_one(services, i, new))


def edit_gateway(cfg: MeshConfig, rng: random.Random) -> MeshConfig:
    gws = cfg.gateways
    i = rng.randrange(len(gws))
    gw = gws[i]
    server = gw.servers[0]
    hosts = server.hosts
    extra = "*/mtls.example.com"
    hosts = tuple(h for h in hosts if h != extra) if extra in hosts else (*hosts, extra)
    new = dataclasses.replace(
        gw, servers=(dataclasses.replace(server, hosts=hosts), *gw.servers[1:])
    )
    return dataclasses.replace(cfg, gateways=_replace_one(gws, i, new))


def drop_or_restore(base: MeshConfig) -> Callable[[MeshConfig, random.Random], MeshConfig]:
    def edit(cfg: MeshConfig, rng: random.Random) -> MeshConfig:
        if len(cfg.virtual_services) < len(base.virtual_services):
            return dataclasses.replace(cfg, virtual_services=base.virtual_services)
        i = rng.randrange(len(cfg.virtual_services))
        return dataclasses.replace(
            cfg, virtual_services=cfg.virtual_services[:i] + cfg.virtual_services[i + 1 :]
        )

    return edit


def move_endpoint(cfg: MeshConfig, rng: random.Random) -> MeshConfig:
    entries = cfg.workload_entries
    i = rng.randrange(len(entries))
    moved = dataclasses.replace(entries[i], address=f"10.4.0.{rng.randrange(1, 200)}")
    return dataclasses.replace(cfg, workload_entries=_replace_one(entries, i, moved))


def reloaded(cfg: MeshConfig, rng: random.Random) -> MeshConfig:
    # Equal objects that are not the same ones (every file parsed again): nothing may be
    # taken for unchanged by identity alone, and nothing may go stale either.
    del rng
    return mesh_config(MESH)


def test_incremental_generation_after_rule_changes_equals_a_fresh_build() -> None:
    rng = random.Random(19)
    ps = proxies()
    base = mesh_config(MESH)
    edits = [
        edit_route,
        edit_route,
        edit_route,
        edit_binding,
        edit_rule,
        edit_rule,
        edit_service,
        edit_gateway,
        drop_or_restore(base),
        move_endpoint,
        reloaded,
        lambda cfg, rng: cfg,
    ]
    cfg = base
    ctx = GenContext(MeshIndex(cfg), ResourceCache())
    generate(ctx, ps)
    derived = 0
    for step in range(150):
        cfg = rng.choice(edits)(cfg, rng)
        old_index = ctx.index
        ctx = next_context(ctx, old_index.next(cfg, version=step))
        derived += ctx.change is not None
        # Sometimes only some proxies ask: the next push finds nothing carried for the others.
        asking = ps if rng.random() < 0.8 else ps[: rng.randrange(len(ps))]
        got = generate(ctx, asking)
        want = generate(GenContext(MeshIndex(cfg, version=step), ResourceCache()), asking)
        assert as_bytes(got) == as_bytes(want), f"step {step}"
        for g, w in zip(got, want, strict=True):
            assert {t: s.digest for t, s in g.items()} == {t: s.digest for t, s in w.items()}
    assert derived == 150


# --- what a change costs ---------------------------------------------------------------------

ROUTES = 12


def many_routes() -> MeshConfig:
    """A Gateway with an HTTP and an HTTPS server and ROUTES VirtualServices bound to it, one
    host each, alternating between two backends (what HTTPRoutes translate to)."""
    docs = [
        SERVICES,
        subsets_rule("reviews"),
        """
---
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: web, namespace: edge}
spec:
  selector: {istio: ingressgateway}
  servers:
  - port: {number: 8080, name: http, protocol: HTTP}
    hosts: ["*/*.web.example.com"]
  - port: {number: 8443, name: https, protocol: HTTPS}
    hosts: ["*/*.web.example.com"]
    tls: {mode: SIMPLE, credentialName: web-cert}
""",
    ]
    for i in range(ROUTES):
        backend = "reviews" if i % 2 == 0 else "ratings"
        docs.append(
            f"""
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: route-{i}, namespace: default}}
spec:
  hosts: [h{i}.web.example.com]
  gateways: [edge/web]
  http:
  - match: [{{uri: {{prefix: /api}}}}]
    route: [{{destination: {{host: {backend}}}}}]
"""
        )
    return mesh_config(*docs)


class Counts:
    """Calls of the functions that do the work a carried answer saves."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.translated: list[str] = []
        self.plans = 0
        original_routes = route_tables.vs_routes
        original_plan = plans._build_plan

        def vs_routes(index: MeshIndex, vs: VirtualService, *args: object) -> object:
            self.translated.append(vs.name)
            return original_routes(index, vs, *args)

        def build_plan(*args: object) -> object:
            self.plans += 1
            return original_plan(*args)

        monkeypatch.setattr(route_tables, "vs_routes", vs_routes)
        monkeypatch.setattr(plans, "_build_plan", build_plan)

    def reset(self) -> None:
        self.translated.clear()
        self.plans = 0


def _push(
    ctx: GenContext, cfg: MeshConfig, proxy: Proxy
) -> tuple[GenContext, dict[str, ResourceSet]]:
    ctx = next_context(ctx, ctx.index.next(cfg, version=ctx.index.version + 1))
    return ctx, {t: generators_for(proxy)[t](ctx, proxy) for t in TYPES}


def _routes_of(sets: dict[str, ResourceSet], table: str, host: str) -> list[object]:
    any_msg = any_pb2.Any()
    any_msg.ParseFromString(sets[ROUTE_TYPE][table].any_bytes)
    rc = RouteConfiguration()
    assert any_msg.Unpack(rc)
    (vhost,) = [v for v in rc.virtual_hosts if v.name.startswith(f"{host}:")]
    return list(vhost.routes)


def _vs(cfg: MeshConfig, name: str) -> tuple[int, VirtualService]:
    return next((i, v) for i, v in enumerate(cfg.virtual_services) if v.name == name)


def _with_vs(cfg: MeshConfig, i: int, vs: VirtualService) -> MeshConfig:
    return dataclasses.replace(cfg, virtual_services=_replace_one(cfg.virtual_services, i, vs))


HTTP_TABLE, HTTPS_TABLE = "http.8080", "https.8443.https.web.edge"


def test_one_route_changed_translates_that_route_and_reuses_the_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    counts = Counts(monkeypatch)
    cfg = many_routes()
    proxy = router()
    cache = ResourceCache()
    ctx = GenContext(MeshIndex(cfg), cache)
    first = {t: generators_for(proxy)[t](ctx, proxy) for t in TYPES}
    assert len(counts.translated) == 2 * ROUTES and counts.plans == 1
    assert {HTTP_TABLE, HTTPS_TABLE} <= set(first[ROUTE_TYPE])

    i, vs = _vs(cfg, "route-3")
    route = dataclasses.replace(vs.http[0], timeout=7.0)
    cfg = _with_vs(cfg, i, dataclasses.replace(vs, http=(route, *vs.http[1:])))
    counts.reset()
    before = cache.serializations
    ctx, second = _push(ctx, cfg, proxy)
    assert ctx.change == IndexChange(frozenset({"virtual_services"}), frozenset())
    # The edited VirtualService, once per table it is served in; nothing else.
    assert counts.translated == ["route-3", "route-3"]
    # Clusters and endpoints do not depend on VirtualServices: the very same sets.
    assert counts.plans == 0
    assert second[CLUSTER_TYPE] is first[CLUSTER_TYPE]
    assert second[ENDPOINT_TYPE] is first[ENDPOINT_TYPE]
    # The two tables that hold the route are serialized again, nothing else.
    assert cache.serializations - before == 2
    assert second[ROUTE_TYPE][HTTP_TABLE].version != first[ROUTE_TYPE][HTTP_TABLE].version
    (changed,) = _routes_of(second, HTTP_TABLE, "h3.web.example.com")
    assert changed.route.timeout.seconds == 7  # type: ignore[attr-defined]
    for host in ("h2.web.example.com", "h4.web.example.com"):
        assert _routes_of(second, HTTP_TABLE, host) == _routes_of(first, HTTP_TABLE, host)

    # A push with nothing changed does no work at all.
    counts.reset()
    before = cache.serializations
    ctx, third = _push(ctx, cfg, proxy)
    assert counts.translated == [] and counts.plans == 0
    assert cache.serializations == before
    assert third[ROUTE_TYPE][HTTP_TABLE] is second[ROUTE_TYPE][HTTP_TABLE]


def test_a_destination_rule_change_reaches_the_routes_and_clusters_it_feeds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    counts = Counts(monkeypatch)
    cfg = many_routes()
    proxy = router()
    ctx = GenContext(MeshIndex(cfg), ResourceCache())
    first = {t: generators_for(proxy)[t](ctx, proxy) for t in TYPES}
    i, rule = next((j, r) for j, r in enumerate(cfg.destination_rules) if r.host == REVIEWS)
    hashed = TrafficPolicy(
        load_balancer=LoadBalancer(consistent_hash=ConsistentHash(header="x-user"))
    )
    new_rule: DestinationRule = dataclasses.replace(rule, policy=hashed)
    cfg = dataclasses.replace(
        cfg,
        destination_rules=_replace_one(cfg.destination_rules, i, new_rule),
    )
    counts.reset()
    ctx, second = _push(ctx, cfg, proxy)
    # The plan is made again (cluster settings come from the rule); of the routes, only
    # those to the rule's host are translated again (they carry its consistent hash).
    assert counts.plans == 1
    to_reviews = {f"route-{j}" for j in range(0, ROUTES, 2)}
    assert sorted(counts.translated) == sorted([*to_reviews, *to_reviews])
    (route,) = _routes_of(second, HTTP_TABLE, "h0.web.example.com")
    assert route.route.hash_policy[0].header.header_name == "x-user"  # type: ignore[attr-defined]
    (route,) = _routes_of(second, HTTP_TABLE, "h1.web.example.com")
    assert not route.route.hash_policy  # type: ignore[attr-defined]
    name = f"outbound|9080||{REVIEWS}"
    assert second[CLUSTER_TYPE][name].version != first[CLUSTER_TYPE][name].version


def test_a_service_port_change_reaches_the_routes_to_it(monkeypatch: pytest.MonkeyPatch) -> None:
    counts = Counts(monkeypatch)
    cfg = many_routes()
    proxy = router()
    ctx = GenContext(MeshIndex(cfg), ResourceCache())
    for t in TYPES:
        generators_for(proxy)[t](ctx, proxy)
    i, reviews = next((j, s) for j, s in enumerate(cfg.services) if s.hostname == REVIEWS)
    moved: Service = dataclasses.replace(
        reviews, ports=(dataclasses.replace(reviews.ports[0], port=9555),)
    )
    cfg = dataclasses.replace(cfg, services=_replace_one(cfg.services, i, moved))
    counts.reset()
    ctx, second = _push(ctx, cfg, proxy)
    # A destination without a port goes to the service's only port: the new one.
    (route,) = _routes_of(second, HTTP_TABLE, "h0.web.example.com")
    assert route.route.cluster == f"outbound|9555||{REVIEWS}"  # type: ignore[attr-defined]
    assert f"outbound|9555||{REVIEWS}" in second[CLUSTER_TYPE]
    assert counts.plans == 1


def test_a_gateway_change_rebinds_but_keeps_translations(monkeypatch: pytest.MonkeyPatch) -> None:
    counts = Counts(monkeypatch)
    cfg = many_routes()
    proxy = router()
    ctx = GenContext(MeshIndex(cfg), ResourceCache())
    for t in TYPES:
        generators_for(proxy)[t](ctx, proxy)
    i, web = next((j, g) for j, g in enumerate(cfg.gateways) if g.name == "web")
    # The HTTP server now serves only h1: every other VirtualService leaves its table.
    only: Gateway = dataclasses.replace(
        web,
        servers=(
            dataclasses.replace(web.servers[0], hosts=("*/h1.web.example.com",)),
            *web.servers[1:],
        ),
    )
    cfg = dataclasses.replace(cfg, gateways=_replace_one(cfg.gateways, i, only))
    counts.reset()
    ctx, second = _push(ctx, cfg, proxy)
    any_msg = any_pb2.Any()
    any_msg.ParseFromString(second[ROUTE_TYPE][HTTP_TABLE].any_bytes)
    rc = RouteConfiguration()
    assert any_msg.Unpack(rc)
    assert [v.name for v in rc.virtual_hosts] == ["h1.web.example.com:8080"]
    # The servers changed, so their tables are new; the routes are the same routes.
    assert counts.plans == 0


def test_an_index_after_a_route_change_shares_every_part_the_change_leaves_alone() -> None:
    cfg = many_routes()
    index = MeshIndex(cfg)
    i, vs = _vs(cfg, "route-0")
    edited = _with_vs(cfg, i, dataclasses.replace(vs, http=(HttpRoute(name="x"),)))
    new = index.next(edited, version=1)
    assert new.change_since(index) == IndexChange(frozenset({"virtual_services"}), frozenset())
    assert new.changed_since(index) is None  # more than endpoints changed
    assert new.services is index.services
    assert new._endpoints is index._endpoints
    assert new._visibility is index._visibility
    assert new._security is index._security
    # The route is bound to a gateway only: sidecars' traffic rules are the same.
    assert new._traffic is index._traffic and new._gateways is not index._gateways
    # An equal snapshot made of other objects (the files parsed again) is no change at all,
    # and the new index holds the objects of the one before.
    again = MeshIndex(mesh_config(MESH))
    same = again.next(mesh_config(MESH), version=2)
    assert same.change_since(again) == IndexChange(frozenset(), frozenset())
    assert same.changed_since(again) == frozenset()
    assert same._traffic is again._traffic and same._gateways is again._gateways
    assert same.config.virtual_services is again.config.virtual_services
    # A route sidecars see: their traffic rules are made again.
    i, mesh_vs = _vs(again.config, "reviews-mesh")
    edited = _with_vs(again.config, i, dataclasses.replace(mesh_vs, http=mesh_vs.http[1:]))
    assert same.next(edited, version=3)._traffic is not same._traffic
    # Not derived from it: anything may differ.
    assert MeshIndex(cfg).change_since(index) is None


def test_what_is_carried_does_not_keep_old_pushes_or_objects_alive() -> None:
    cfg = many_routes()
    proxy = router()
    ctx = GenContext(MeshIndex(cfg), ResourceCache())
    for t in TYPES:
        generators_for(proxy)[t](ctx, proxy)
    first, first_index = weakref.ref(ctx), weakref.ref(ctx.index)
    i, vs = _vs(cfg, "route-5")
    assert vs.http[0].timeout is None
    for n in range(3):
        route = dataclasses.replace(vs.http[0], timeout=float(n + 1))
        cfg = _with_vs(cfg, i, dataclasses.replace(vs, http=(route, *vs.http[1:])))
        ctx, _ = _push(ctx, cfg, proxy)
    del vs, route
    gc.collect()
    # Carried state holds one push's worth: no chain of contexts or indexes, and the
    # VirtualService objects edited away are let go (model objects take no weakrefs): only
    # the current one and the previous push's (what it carried, offered to this one) remain.
    assert first() is None and first_index() is None
    alive = [
        o.http[0].timeout
        for o in gc.get_objects()
        if isinstance(o, VirtualService) and o.name == "route-5"
    ]
    assert sorted(alive) == [2.0, 3.0]


def test_what_pushes_reuse_stays_in_the_cache() -> None:
    """Resources a push serves again without asking the cache (clusters and assignments
    of a plan it patched) are still marked in use, over route edits and an endpoint move
    in between: a fresh build over the same cache after the sweeps serializes nothing."""
    rng = random.Random(5)
    ps = proxies()
    cfg = mesh_config(MESH)
    cache = ResourceCache()
    ctx = GenContext(MeshIndex(cfg), cache)
    generate(ctx, ps)
    for edit in (edit_route, move_endpoint, edit_route, edit_route, edit_route, edit_route):
        cfg = edit(cfg, rng)
        ctx = next_context(ctx, ctx.index.next(cfg, version=ctx.index.version + 1))
        generate(ctx, ps)
    cache.next_generation()
    cache.sweep()
    before = cache.serializations
    generate(GenContext(ctx.index, cache), ps)
    assert cache.serializations == before
