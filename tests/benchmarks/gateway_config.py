"""Benchmark: generating a router's config for N gateway-bound VirtualServices (what the
Gateway API translator makes of N HTTPRoutes), full against one route changed.

Mesh: N Services (two WorkloadEntries each) over 10 namespaces, one Gateway with an HTTP and
an HTTPS server for `*.example.com`, and N VirtualServices bound to it, one host each, a path
match with a 90/10 split and a catch-all route (an HTTPRoute's shape), plus D
DestinationRules with two subsets.

- full: a cold cache and a new index: CDS, EDS, LDS and RDS for one router, every resource
  built and serialized (a router's first connection after a restart);
- incremental: one VirtualService's path match changes: what a push does for it (PushPipeline.
  push_now through CurrentPush): the new index of the new snapshot (MeshIndex.next), the next
  generation context (cache sweep included) and all four types generated again for the
  router over the warm cache. Each run's change is a new one (a path not used before).

Both are medians over runs in one process; the ratio is what to read (target <= 1/20).
Run alone: `python tests/benchmarks/gateway.py --config-only`.
"""

from __future__ import annotations

import dataclasses
import statistics
import time

from control.generate import generators_for
from control.generate.context import GenContext, next_context
from control.generate.resource_names import CLUSTER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE, ROUTE_TYPE
from control.model.gateway import Gateway, GatewayServer, ServerTls
from control.model.index import MeshIndex
from control.model.proxy import Proxy, proxy_from_node
from control.model.traffic import (
    Destination,
    DestinationRule,
    HttpMatch,
    HttpRoute,
    MatchKind,
    StringMatch,
    Subset,
    VirtualService,
)
from control.model.types import (
    MeshConfig,
    Protocol,
    Service,
    ServicePort,
    SourceRef,
    Workload,
    labels_of,
)
from control.xds.cache import ResourceCache

TYPES = (CLUSTER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE, ROUTE_TYPE)
GATEWAY_REF = "istio-system/ingress"


def _route(i: int, host: str, next_host: str, prefix: str) -> VirtualService:
    ns = f"ns-{i % 10}"
    split = HttpRoute(
        name="api",
        matches=(HttpMatch(uri=StringMatch(MatchKind.PREFIX, prefix)),),
        destinations=(Destination(host, weight=90), Destination(next_host, weight=10)),
    )
    return VirtualService(
        namespace=ns,
        name=f"route-{i}",
        source=SourceRef("VirtualService", ns, f"route-{i}"),
        hosts=(f"h{i}.example.com",),
        http=(split, HttpRoute(name="rest", destinations=(Destination(host),))),
        gateways=(GATEWAY_REF,),
    )


def build_mesh(routes: int, drs: int) -> MeshConfig:
    services: list[Service] = []
    workloads: list[Workload] = []
    rules: list[DestinationRule] = []
    hosts = [f"svc-{i}.ns-{i % 10}.svc.cluster.local" for i in range(routes)]
    for i, host in enumerate(hosts):
        ns, name = f"ns-{i % 10}", f"svc-{i}"
        services.append(
            Service(
                hostname=host,
                namespace=ns,
                name=name,
                ports=(ServicePort("http", 9080, Protocol.HTTP, 8080),),
                source=SourceRef("Service", ns, name),
                selector=labels_of({"app": name}),
            )
        )
        for j in range(2):
            workloads.append(
                Workload(
                    name=f"{name}-{j}",
                    namespace=ns,
                    address=f"10.{i // 250}.{i % 250}.{j + 1}",
                    labels=labels_of({"app": name, "version": f"v{j + 1}"}),
                    service_account=name,
                    source=SourceRef("WorkloadEntry", ns, f"{name}-{j}"),
                )
            )
        if i < drs:
            rules.append(
                DestinationRule(
                    namespace=ns,
                    name=name,
                    source=SourceRef("DestinationRule", ns, name),
                    host=host,
                    subsets=(
                        Subset("v1", labels_of({"version": "v1"})),
                        Subset("v2", labels_of({"version": "v2"})),
                    ),
                )
            )
    gateway = Gateway(
        namespace="istio-system",
        name="ingress",
        source=SourceRef("Gateway", "istio-system", "ingress"),
        selector=labels_of({"istio": "ingressgateway"}),
        servers=(
            GatewayServer(8080, Protocol.HTTP, "http", ("*/*.example.com",)),
            GatewayServer(
                8443,
                Protocol.HTTPS,
                "https",
                ("*/*.example.com",),
                tls=ServerTls(credential_name="ingress-cert"),
            ),
        ),
    )
    return MeshConfig(
        services=tuple(services),
        workload_entries=tuple(workloads),
        gateways=(gateway,),
        virtual_services=tuple(
            _route(i, hosts[i], hosts[(i + 1) % routes], "/api") for i in range(routes)
        ),
        destination_rules=tuple(rules),
    )


def router() -> Proxy:
    return proxy_from_node(
        "router~10.255.0.9~ingress-0.istio-system~istio-system.svc.cluster.local",
        {"LABELS": {"istio": "ingressgateway"}, "SDS": "true"},
    )


def _generate(ctx: GenContext, proxy: Proxy) -> int:
    generators = generators_for(proxy)
    return sum(len(generators[t](ctx, proxy)) for t in TYPES)


def full(config: MeshConfig, proxy: Proxy) -> tuple[float, int]:
    start = time.perf_counter()
    ctx = GenContext(MeshIndex(config), ResourceCache())
    count = _generate(ctx, proxy)
    return time.perf_counter() - start, count


def changed_route(config: MeshConfig, position: int, prefix: str) -> MeshConfig:
    """The snapshot with one VirtualService's path match changed (a new object, as the
    config loader makes for an edited file)."""
    routes = list(config.virtual_services)
    vs = routes[position]
    match = HttpMatch(uri=StringMatch(MatchKind.PREFIX, prefix))
    first = dataclasses.replace(vs.http[0], matches=(match,))
    routes[position] = dataclasses.replace(vs, http=(first, *vs.http[1:]))
    return dataclasses.replace(config, virtual_services=tuple(routes))


def incremental(config: MeshConfig, proxy: Proxy, runs: int) -> tuple[list[float], int]:
    """Warm a cache with `config`, then change one route `runs` times and time each push."""
    cache = ResourceCache()
    ctx = GenContext(MeshIndex(config), cache)
    _generate(ctx, proxy)
    position = len(config.virtual_services) // 2
    times: list[float] = []
    serialized = 0
    for run in range(runs):
        snapshot = changed_route(config, position, f"/v{run + 2}")
        before = cache.serializations
        start = time.perf_counter()
        ctx = next_context(ctx, ctx.index.next(snapshot, version=run + 1))
        _generate(ctx, proxy)
        times.append(time.perf_counter() - start)
        serialized = cache.serializations - before
    return times, serialized


def run(routes: int, drs: int, runs: int) -> dict[str, float]:
    config = build_mesh(routes, drs)
    proxy = router()
    fulls = [full(config, proxy) for _ in range(runs)]
    full_s = statistics.median(t for t, _ in fulls)
    inc_times, serialized = incremental(config, proxy, runs)
    inc_s = statistics.median(inc_times)
    print(
        f"gateway config: {routes} gateway-bound VirtualServices (HTTPRoutes), {routes} services,"
        f" {drs} DestinationRules, one router"
    )
    print(f"gateway config full: {full_s * 1000:.1f} ms ({fulls[0][1]} resources)")
    print(
        f"gateway config one route changed: {inc_s * 1000:.1f} ms"
        f" ({serialized} resource(s) serialized)"
        f"  (runs: {', '.join(f'{t * 1000:.1f}' for t in inc_times)})"
    )
    ratio = inc_s / full_s
    print(
        f"gateway config ratio incremental/full: {ratio:.3f} = 1/{1 / ratio:.0f}  (target <= 1/20)"
    )
    return {
        "config_full_ms": full_s * 1000,
        "config_incremental_ms": inc_s * 1000,
        "config_ratio": ratio,
    }
