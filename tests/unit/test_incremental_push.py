"""Incremental pushes: an index derived from the previous one (MeshIndex.next) and generation
patched over the previous push (GenContext with `previous`) must give exactly the bytes a
fresh build gives, whatever the workloads do; and the EDS-only decision must only be taken
when nothing but EDS changed."""

from __future__ import annotations

import dataclasses
import gc
import random
import weakref

from control.generate import generators_for
from control.generate.context import GenContext, next_context
from control.generate.resource_names import CLUSTER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE, ROUTE_TYPE
from control.model.index import MeshIndex, endpoints_only
from control.model.proxy import Proxy, proxy_from_node
from control.model.types import TLS_MODE_LABEL, MeshConfig, SourceRef, Workload, labels_of
from control.xds.cache import ResourceCache, ResourceSet
from tests.support.traffic import mesh_config, service, subsets_rule

TYPES = (CLUSTER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE, ROUTE_TYPE)

# Services selected every way an index knows: Kubernetes selectors, ServiceEntry
# workloadSelectors (one of them empty: every workload of its namespace), a DNS ServiceEntry
# that takes its endpoints from workloads, one with static endpoints; DestinationRule subsets,
# a VirtualService, PeerAuthentication turning mTLS off on a port, and a Sidecar that scopes
# the shop namespace.
RULES = (
    service("reviews", "reviews")
    + """
---
apiVersion: v1
kind: Service
metadata: {name: db, namespace: default}
spec:
  selector: {app: db}
  ports: [{name: tcp, port: 3306}, {name: http-admin, port: 9090}]
"""
    + service("cart", "cart", 9080, None, namespace="shop")
    + """
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: legacy, namespace: default}
spec:
  hosts: [legacy.internal]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{name: http, number: 8000, protocol: HTTP}]
  workloadSelector: {labels: {app: legacy}}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: everything, namespace: shop}
spec:
  hosts: [all.shop.internal]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{name: tcp, number: 7000, protocol: TCP}]
  workloadSelector: {labels: {}}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: named, namespace: default}
spec:
  hosts: [named.internal]
  location: MESH_INTERNAL
  resolution: DNS
  ports: [{name: http, number: 8100, protocol: HTTP}]
  workloadSelector: {labels: {app: named}}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: api, namespace: default}
spec:
  hosts: [api.example.com]
  resolution: DNS
  ports: [{name: https, number: 443, protocol: TLS}]
  endpoints: [{address: api.example.com}]
"""
    + subsets_rule("reviews", policy="{loadBalancer: {simple: LEAST_REQUEST}}")
    + subsets_rule("db", ("v1",))
    + """
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: reviews, namespace: default}
spec:
  hosts: [reviews]
  http:
  - match: [{headers: {end-user: {exact: jason}}}]
    route: [{destination: {host: reviews, subset: v2}}]
  - route:
    - {destination: {host: reviews, subset: v1}, weight: 90}
    - {destination: {host: reviews, subset: v2}, weight: 10}
---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: db, namespace: default}
spec:
  selector: {matchLabels: {app: db}}
  mtls: {mode: STRICT}
  portLevelMtls: {"9090": {mode: DISABLE}}
---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: default, namespace: shop}
spec:
  egress: [{hosts: ["./*", "default/reviews.default.svc.cluster.local"]}]
"""
)

EXTRA_VS = """
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: db, namespace: default}
spec:
  hosts: [db]
  tcp: [{route: [{destination: {host: db, subset: v1}}]}]
"""

APPS = ("reviews", "db", "cart", "legacy", "named", "other")
NAMESPACES = ("default", "shop")


def rules(*extra: str) -> MeshConfig:
    return mesh_config(RULES, *extra)


def proxies() -> list[Proxy]:
    def node(ip: str, ns: str) -> str:
        return f"sidecar~{ip}~client.{ns}~{ns}.svc.cluster.local"

    return [
        proxy_from_node(node("10.9.0.1", "default"), {}),
        proxy_from_node(node("10.9.0.2", "default"), {"SDS": "true"}),
        proxy_from_node(node("10.9.0.3", "shop"), {"SDS": "true"}),
        proxy_from_node(
            node("10.9.0.4", "default"),
            {"INTERCEPTION_MODE": "REDIRECT", "LABELS": {"app": "reviews"}},
        ),
        proxy_from_node(node("10.9.0.5", "default"), {"GENERATOR": "grpc"}),
    ]


def workload(i: int, rng: random.Random) -> Workload:
    ns = rng.choice(NAMESPACES)
    labels = {"app": rng.choice(APPS), "version": rng.choice(("v1", "v2"))}
    if rng.random() < 0.5:
        labels[TLS_MODE_LABEL] = "istio"
    return Workload(
        name=f"w{i}",
        namespace=ns,
        address=f"10.0.{i // 200}.{i % 200 + 1}",
        labels=labels_of(labels),
        service_account=rng.choice(("sa-a", "sa-b")),
        source=SourceRef("WorkloadEntry", ns, f"w{i}"),
        has_sidecar=rng.random() < 0.3,
    )


def mutate(wl: Workload, rng: random.Random) -> Workload:
    labels = dict(wl.labels)
    what = rng.randrange(6)
    if what == 0:
        return dataclasses.replace(wl, address=f"10.1.{rng.randrange(200)}.{rng.randrange(200)}")
    if what == 1:
        labels["version"] = "v2" if labels.get("version") == "v1" else "v1"
    elif what == 2:
        labels["app"] = rng.choice(APPS)
    elif what == 3:
        if labels.pop(TLS_MODE_LABEL, None) is None:
            labels[TLS_MODE_LABEL] = "istio"
    elif what == 4:
        return dataclasses.replace(wl, service_account=rng.choice(("sa-a", "sa-b", "sa-c")))
    else:
        return dataclasses.replace(wl, weight=rng.randrange(4), locality="r/z")
    return dataclasses.replace(wl, labels=labels_of(labels))


def generate(ctx: GenContext, ps: list[Proxy]) -> list[dict[str, ResourceSet]]:
    return [{t: generators_for(p)[t](ctx, p) for t in TYPES} for p in ps]


def as_bytes(sets: list[dict[str, ResourceSet]]) -> list[dict[str, dict[str, bytes]]]:
    return [{t: {n: s[n].any_bytes for n in s} for t, s in per_proxy.items()} for per_proxy in sets]


def test_incremental_generation_equals_a_fresh_build() -> None:
    rng = random.Random(6)
    ps = proxies()
    entries = [workload(i, rng) for i in range(60)]
    registered = [workload(100 + i, rng) for i in range(5)]
    base = rules()
    with_vs = rules(EXTRA_VS)
    cfg = dataclasses.replace(base, workload_entries=tuple(entries))
    ctx = GenContext(MeshIndex(cfg, registered), ResourceCache())
    generate(ctx, ps)
    incremental_steps = 0
    for step in range(120):
        old_index = ctx.index
        kind = rng.randrange(10)
        if kind < 5:  # one or a few workloads change
            for _ in range(rng.choice((1, 1, 2, 3))):
                i = rng.randrange(len(entries))
                entries[i] = mutate(entries[i], rng)
        elif kind == 5:
            entries.append(workload(200 + step, rng))
        elif kind == 6 and entries:
            del entries[rng.randrange(len(entries))]
        elif kind == 7:
            i = rng.randrange(len(registered))
            registered[i] = mutate(registered[i], rng)
        elif kind == 8:
            pass  # nothing changed
        else:  # the rules change: never derived
            base = with_vs if base is not with_vs else rules()
        cfg = dataclasses.replace(base, workload_entries=tuple(entries))
        index = old_index.next(cfg, registered, version=step)
        changed = index.changed_since(old_index)
        fresh_index = MeshIndex(cfg, registered, version=step)
        if kind == 9:
            assert changed is None
        else:
            assert changed is not None
            incremental_steps += 1
            # Every service whose endpoints differ is named (more may be).
            for s in fresh_index.services:
                for port in s.ports:
                    if old_index.endpoints(s, port) != fresh_index.endpoints(s, port):
                        assert s.hostname in changed
        ctx = next_context(ctx, index)
        # Sometimes only part of the proxies ask (or none): the next push then finds no
        # previous answer to patch for the others and builds theirs from scratch.
        asking = ps if rng.random() < 0.8 else ps[: rng.randrange(len(ps))]
        got = generate(ctx, asking)
        want = generate(GenContext(fresh_index, ResourceCache()), asking)
        assert as_bytes(got) == as_bytes(want), f"step {step}"
        for g, w in zip(got, want, strict=True):
            assert {t: s.digest for t, s in g.items()} == {t: s.digest for t, s in w.items()}
        for s in fresh_index.services:
            for port in s.ports:
                assert index.endpoints(s, port) == fresh_index.endpoints(s, port)
                assert index.identities(s, port) == fresh_index.identities(s, port)
    assert incremental_steps > 80


def test_endpoints_only_means_nothing_but_eds_changed() -> None:
    """Whenever the push decision says EDS only, CDS, LDS and RDS of every proxy are the
    same bytes before and after; and the decision is not always "no"."""
    rng = random.Random(7)
    ps = proxies()
    entries = [workload(i, rng) for i in range(40)]
    cfg = dataclasses.replace(rules(), workload_entries=tuple(entries))
    index = MeshIndex(cfg)
    says = {True: 0, False: 0}
    for step in range(80):
        i = rng.randrange(len(entries))
        entries[i] = mutate(entries[i], rng)
        new_cfg = dataclasses.replace(cfg, workload_entries=tuple(entries))
        new_index = index.next(new_cfg, version=step)
        decision = endpoints_only(index, new_index)
        says[decision] += 1
        if decision:
            before = generate(GenContext(MeshIndex(cfg), ResourceCache()), ps)
            after = generate(GenContext(MeshIndex(new_cfg), ResourceCache()), ps)
            for b, a in zip(as_bytes(before), as_bytes(after), strict=True):
                for t in (CLUSTER_TYPE, LISTENER_TYPE, ROUTE_TYPE):
                    assert b[t] == a[t], f"step {step}: {t} changed on an EDS-only push"
        cfg, index = new_cfg, new_index
    assert says[True] > 10 and says[False] > 5


def _one(app: str, sa: str = "sa-a", address: str = "10.0.0.1", ns: str = "default") -> Workload:
    return Workload(
        name="w",
        namespace=ns,
        address=address,
        labels=labels_of({"app": app, TLS_MODE_LABEL: "istio"}),
        service_account=sa,
        source=SourceRef("WorkloadEntry", ns, "w"),
    )


def test_what_makes_a_push_more_than_eds() -> None:
    base = rules()

    def step(a: Workload, b: Workload, extra: str = "") -> tuple[bool, frozenset[str] | None]:
        old = MeshIndex(dataclasses.replace(base, workload_entries=(a,)))
        cfg = rules(extra) if extra else base
        new = old.next(dataclasses.replace(cfg, workload_entries=(b,)))
        return endpoints_only(old, new), new.changed_since(old)

    reviews = "reviews.default.svc.cluster.local"
    # An endpoint moves: EDS only, and only its service changed.
    assert step(_one("reviews"), _one("reviews", address="10.0.0.2")) == (
        True,
        frozenset({reviews}),
    )
    # Another identity behind the service: the mTLS clusters' SANs change.
    assert step(_one("reviews"), _one("reviews", sa="sa-b")) == (False, frozenset({reviews}))
    # A DNS ServiceEntry's endpoints come from workloads and live in CDS.
    assert step(_one("named"), _one("named", address="10.0.0.2"))[0] is False
    # A workload no service selects changes nothing at all.
    assert step(_one("nobody"), _one("nobody", address="10.0.0.2")) == (True, frozenset())
    # An empty workloadSelector selects every workload of its namespace.
    assert step(_one("nobody", ns="shop"), _one("nobody", ns="shop", address="10.0.0.2")) == (
        True,
        frozenset({"all.shop.internal"}),
    )
    # Rules changed: not derived, a full push.
    assert step(_one("reviews"), _one("reviews"), EXTRA_VS) == (False, None)


def test_index_settings_change_is_not_derived() -> None:
    cfg = dataclasses.replace(rules(), workload_entries=(_one("reviews"),))
    old = MeshIndex(cfg)
    assert old.next(cfg).changed_since(old) == frozenset()
    assert old.next(cfg, trust_domain="example.org").changed_since(old) is None
    assert old.next(cfg, outbound_traffic_policy="REGISTRY_ONLY").changed_since(old) is None
    # Only from the index it was derived from.
    other = MeshIndex(cfg)
    assert old.next(cfg).changed_since(other) is None


def test_an_endpoint_change_serializes_and_rebuilds_only_what_changed() -> None:
    rng = random.Random(8)
    entries = [workload(i, rng) for i in range(50)]
    entries[0] = dataclasses.replace(
        entries[0], namespace="default", labels=labels_of({"app": "reviews", "version": "v1"})
    )
    cfg = dataclasses.replace(rules(), workload_entries=tuple(entries))
    cache = ResourceCache()
    ps = proxies()[:1]
    ctx = GenContext(MeshIndex(cfg), cache)
    before = generate(ctx, ps)[0][ENDPOINT_TYPE]
    entries[0] = dataclasses.replace(entries[0], address="10.7.7.7")
    new_cfg = dataclasses.replace(cfg, workload_entries=tuple(entries))
    made = cache.serializations
    ctx = next_context(ctx, ctx.index.next(new_cfg))
    after = generate(ctx, ps)[0][ENDPOINT_TYPE]
    changed = {n for n in after if after[n] is not before[n]}
    assert changed == {
        "outbound|9080||reviews.default.svc.cluster.local",
        "outbound|9080|v1|reviews.default.svc.cluster.local",
    }
    # Only the changed assignments were built (CDS/LDS/RDS are asked for too, and are reused).
    assert cache.serializations - made == 2
    # The reused assignments stay in the cache across sweeps: marked in use each push.
    for _ in range(4):
        ctx = next_context(ctx, ctx.index.next(new_cfg))
        generate(ctx, ps)
    assert cache.serializations - made == 2


def test_previous_pushes_are_not_kept_alive() -> None:
    cfg = dataclasses.replace(rules(), workload_entries=(_one("reviews"),))
    ps = proxies()[:1]
    ctx = GenContext(MeshIndex(cfg), ResourceCache())
    generate(ctx, ps)
    first = weakref.ref(ctx)
    first_index = weakref.ref(ctx.index)
    for i in range(3):
        moved = dataclasses.replace(
            cfg, workload_entries=(_one("reviews", address=f"10.0.0.{i + 2}"),)
        )
        ctx = next_context(ctx, ctx.index.next(moved))
        generate(ctx, ps)
    gc.collect()
    assert first() is None and first_index() is None
