"""Pushes after Gateway API changes: HTTPRoutes added, removed and edited, ReferenceGrants
granted and withdrawn, each in its own file as the config watcher reads them, through one
Translator as the watcher merges (control/gatewayapi/translate.py: a route change translates
that route, a ReferenceGrant change every route again, making new VirtualService objects;
the index takes over the previous objects for the equal ones, model/vs_carry.py) and the
router's tables are patched for the rest. What a push gives must be exactly what a fresh
build gives, byte for byte, and an edited route must cost that route."""

from __future__ import annotations

import random

import pytest
import yaml
from envoy.config.route.v3.route_pb2 import RouteConfiguration
from google.protobuf import any_pb2

from control.config.loader import load_text
from control.config.merge import merge
from control.config.objects import FileConfig
from control.gatewayapi.translate import Translator
from control.generate import gateway_routes, generators_for
from control.generate.context import GenContext, next_context
from control.generate.resource_names import CLUSTER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE, ROUTE_TYPE
from control.model.gatewayapi import GATEWAY_NAME_LABEL
from control.model.index import MeshIndex
from control.model.proxy import Proxy, proxy_from_node
from control.model.types import MeshConfig
from control.xds.cache import ResourceCache, ResourceSet
from tests.support.gatewayapi import (
    Obj,
    backend,
    dump,
    gateway,
    gateway_class,
    listener,
    reference_grant,
    route,
    service,
)
from tests.support.traffic import count_translations

TYPES = (CLUSTER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE, ROUTE_TYPE)
NAMESPACES = ("infra", "apps")


def _router() -> Proxy:
    return proxy_from_node(
        "router~10.1.0.9~gw-0.infra~infra.svc.cluster.local",
        {"LABELS": {GATEWAY_NAME_LABEL: "gw"}, "SDS": "true"},
    )


def _sidecar() -> Proxy:
    return proxy_from_node("sidecar~10.1.0.7~client.apps~apps.svc.cluster.local", {})


def _route(n: int, rng: random.Random) -> Obj:
    """Route `n`: in `apps` (odd) or `infra` (even), for one or two hosts, with a split that
    an `apps` route sends to `infra` (a reference a ReferenceGrant must allow)."""
    namespace = NAMESPACES[n % 2]
    other = "infra" if namespace == "apps" else ""
    hosts = [f"h{n}.example.com"] + ([f"shared{n % 3}.example.com"] if rng.random() < 0.3 else [])
    rules: list[Obj] = [
        {
            "matches": [{"path": {"type": "PathPrefix", "value": f"/p{rng.randrange(50)}"}}],
            "backendRefs": [
                backend("v1", weight=rng.choice((90, 50)), namespace=other),
                backend("v2", weight=10),
            ],
        },
        {"backendRefs": [backend("v2")]},
    ]
    if rng.random() < 0.3:
        rules[0]["matches"][0]["headers"] = [{"name": "x-user", "value": f"u{rng.randrange(9)}"}]
    return route(
        f"r{n}",
        namespace,
        parents=[{"name": "gw", "namespace": "infra"}],
        hostnames=hosts,
        rules=rules,
    )


class Files:
    """Config files by name, parsed once each (as the watcher keeps an unchanged file's
    objects); `merge()` translates the Gateway API objects of all of them with the one
    Translator that saw the previous ones."""

    def __init__(self) -> None:
        self.texts: dict[str, str] = {}
        self.parsed: dict[str, FileConfig] = {}
        self.translator = Translator()

    def put(self, name: str, *objects: Obj) -> None:
        self.texts[name] = dump(*objects)
        self.parsed[name] = load_text(self.texts[name], name)

    def drop(self, name: str) -> None:
        del self.texts[name], self.parsed[name]

    def reparse(self) -> None:
        self.parsed = {n: load_text(t, n) for n, t in self.texts.items()}

    def merge(self) -> MeshConfig:
        return merge(list(self.parsed.values()), translator=self.translator)

    def fresh(self) -> MeshConfig:
        """The same config translated from nothing."""
        return merge(list(self.parsed.values()))


def _base(rng: random.Random, routes: int) -> Files:
    files = Files()
    files.put(
        "base.yaml",
        gateway_class(),
        service("v1"),
        service("v2"),
        service("v2", "apps"),
        gateway(
            listeners=[
                listener("http", 8080, from_="All"),
                listener("wild", 9090, hostname="*.example.com", from_="All"),
            ]
        ),
    )
    for n in range(routes):
        files.put(f"r{n}.yaml", _route(n, rng))
    return files


def _edit(files: Files, rng: random.Random, routes: int) -> None:
    names = [n for n in files.texts if n.startswith("r")]
    what = rng.randrange(10)
    if what < 5 and names:  # edit a route
        n = int(rng.choice(names)[1:-5])
        files.put(f"r{n}.yaml", _route(n, rng))
    elif what == 5 and names:
        files.drop(rng.choice(names))
    elif what == 6:
        n = rng.randrange(routes + 4)
        files.put(f"r{n}.yaml", _route(n, rng))
    elif what == 7:
        if "grant.yaml" in files.texts:
            files.drop("grant.yaml")
        else:
            files.put("grant.yaml", reference_grant("apps-in", "infra", "apps"))
    elif what == 8:
        files.reparse()
    # else: nothing changed


def _generate(ctx: GenContext, proxies: list[Proxy]) -> list[dict[str, dict[str, bytes]]]:
    out = []
    for p in proxies:
        sets: dict[str, ResourceSet] = {t: generators_for(p)[t](ctx, p) for t in TYPES}
        out.append({t: {n: s[n].any_bytes for n in s} for t, s in sets.items()})
    return out


def test_incremental_generation_after_gateway_api_changes_equals_a_fresh_build() -> None:
    rng = random.Random(1919)
    routes = 14
    files = _base(rng, routes)
    proxies = [_router(), _sidecar()]
    ctx = GenContext(MeshIndex(files.merge()), ResourceCache())
    _generate(ctx, proxies)
    for step in range(120):
        _edit(files, rng, routes)
        cfg = files.merge()
        ctx = next_context(ctx, ctx.index.next(cfg, version=step))
        got = _generate(ctx, proxies)
        fresh = files.fresh()
        want = _generate(GenContext(MeshIndex(fresh, version=step), ResourceCache()), proxies)
        assert got == want, f"step {step}"


def _table(sets: dict[str, ResourceSet], name: str) -> RouteConfiguration:
    any_msg = any_pb2.Any()
    any_msg.ParseFromString(sets[ROUTE_TYPE][name].any_bytes)
    rc = RouteConfiguration()
    assert any_msg.Unpack(rc)
    return rc


def test_an_edited_http_route_is_translated_again_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    translated = count_translations(monkeypatch)
    files = _base(random.Random(7), 10)
    files.put("grant.yaml", reference_grant("apps-in", "infra", "apps"))
    proxy = _router()
    cache = ResourceCache()
    ctx = GenContext(MeshIndex(files.merge()), cache)
    first = {t: generators_for(proxy)[t](ctx, proxy) for t in TYPES}
    assert translated
    # Route 4 gets another path: its file alone is parsed and translated again, and one
    # VirtualService per host and listener port differs.
    r4 = yaml.safe_load(files.texts["r4.yaml"])
    r4["spec"]["rules"][0]["matches"][0]["path"]["value"] = "/edited"
    files.put("r4.yaml", r4)
    held = ctx.index.config.virtual_services
    translated.clear()
    before = cache.serializations
    ctx = next_context(ctx, ctx.index.next(files.merge(), version=1))
    second = {t: generators_for(proxy)[t](ctx, proxy) for t in TYPES}
    # The VirtualServices of its hosts (one per host and listener port) are new objects and
    # translated again, once for each table (port) they are bound to; every other is the
    # previous push's object.
    now = ctx.index.config.virtual_services
    expected = sorted(f"gw-{p}-{h}" for p in (8080, 9090) for h in r4["spec"]["hostnames"])
    assert sorted(vs.name for vs in now if not any(vs is old for old in held)) == expected
    assert sorted(translated) == sorted(expected * 2)
    assert cache.serializations - before == 2  # the two tables holding its hosts
    assert second[CLUSTER_TYPE] is first[CLUSTER_TYPE]
    for table in second[ROUTE_TYPE]:
        hosts = {v.name: v for v in _table(second, table).virtual_hosts}
        old = {v.name: v for v in _table(first, table).virtual_hosts}
        assert hosts.keys() == old.keys()
        for name, vhost in hosts.items():
            assert (vhost == old[name]) == (name.split(":")[0] not in r4["spec"]["hostnames"])
    # Withdrawing the grant changes what the `apps` routes may reach: their VirtualServices
    # are translated again, the others are carried.
    files.drop("grant.yaml")
    held = ctx.index.config.virtual_services
    translated.clear()
    ctx = next_context(ctx, ctx.index.next(files.merge(), version=2))
    third = {t: generators_for(proxy)[t](ctx, proxy) for t in TYPES}
    now = ctx.index.config.virtual_services
    changed = {vs.name for vs in now if not any(vs is old for old in held)}
    assert set(translated) == changed and 0 < len(changed) < len(now)
    fresh = GenContext(MeshIndex(files.fresh()), ResourceCache())
    want = {t: generators_for(proxy)[t](fresh, proxy) for t in TYPES}
    assert {t: s.digest for t, s in third.items()} == {t: s.digest for t, s in want.items()}


def test_a_table_is_the_deterministic_encoding_of_its_message() -> None:
    files = _base(random.Random(3), 6)
    proxy = _router()
    ctx = GenContext(MeshIndex(files.merge()), ResourceCache())
    tables = generators_for(proxy)[ROUTE_TYPE](ctx, proxy)
    assert tables
    for name in tables:
        any_msg = any_pb2.Any()
        any_msg.ParseFromString(tables[name].any_bytes)
        rc = RouteConfiguration()
        assert any_msg.Unpack(rc)
        assert rc.name == name and rc.virtual_hosts and rc.HasField("validate_clusters")
        assert not rc.validate_clusters.value
        assert any_msg.value == rc.SerializeToString(deterministic=True)
        assert gateway_routes.encoded(name, ()) == RouteConfiguration(
            name=name,
            validate_clusters=rc.validate_clusters,
            max_direct_response_body_size_bytes=rc.max_direct_response_body_size_bytes,
        ).SerializeToString(deterministic=True)
