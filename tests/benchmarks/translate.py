"""Benchmark: translating the mesh into one proxy's Envoy config, full and incremental.

Mesh: S services x E endpoints (WorkloadEntries labelled with two versions) over 10
namespaces and 10 HTTP ports, V VirtualServices (header match + 90/10 split over subsets) and
D DestinationRules (two subsets, a load balancer, outlier detection, a connection pool).

- full: a cold cache and a new index: CDS, EDS, LDS and RDS for one proxy, every resource
  built and serialized (what a proxy's first connection costs after a restart);
- incremental: one endpoint changes: what the control plane's push does for it (ControlPlane.
  push_now): the new index derived from the previous one (MeshIndex.next), the next
  generation context (cache sweep included), the EDS-only decision, and EDS regenerated for
  the proxy, patched over the previous push's answer.

Both are medians over several runs in the same process; the ratio is what to read.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from control.generate import GENERATORS
from control.generate.context import GenContext, next_context
from control.generate.resource_names import CLUSTER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE, ROUTE_TYPE
from control.model.index import MeshIndex, endpoints_only
from control.model.proxy import Proxy, proxy_from_node
from control.model.traffic import (
    ConnectionPool,
    Destination,
    DestinationRule,
    HeaderMatch,
    HttpMatch,
    HttpRoute,
    LbPolicy,
    LoadBalancer,
    MatchKind,
    OutlierDetection,
    StringMatch,
    Subset,
    TrafficPolicy,
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


def build_mesh(services: int, endpoints: int, vss: int, drs: int) -> MeshConfig:
    svc: list[Service] = []
    wls: list[Workload] = []
    rules: list[DestinationRule] = []
    routes: list[VirtualService] = []
    for i in range(services):
        ns = f"ns-{i % 10}"
        name = f"svc-{i}"
        host = f"{name}.{ns}.svc.cluster.local"
        port = 9000 + i % 10
        svc.append(
            Service(
                hostname=host,
                namespace=ns,
                name=name,
                ports=(ServicePort("http", port, Protocol.HTTP, 8080),),
                source=SourceRef("Service", ns, name),
                selector=labels_of({"app": name}),
            )
        )
        for j in range(endpoints):
            wls.append(
                Workload(
                    name=f"{name}-{j}",
                    namespace=ns,
                    address=f"10.{i // 250}.{i % 250}.{j + 1}",
                    labels=labels_of({"app": name, "version": f"v{j % 2 + 1}"}),
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
                    policy=TrafficPolicy(
                        load_balancer=LoadBalancer(simple=LbPolicy.LEAST_REQUEST),
                        connection_pool=ConnectionPool(max_connections=100),
                        outlier_detection=OutlierDetection(consecutive_5xx=5, interval=10.0),
                    ),
                    subsets=(
                        Subset("v1", labels_of({"version": "v1"})),
                        Subset("v2", labels_of({"version": "v2"})),
                    ),
                )
            )
        if i < vss:
            marked = HttpMatch(
                headers=(HeaderMatch("end-user", StringMatch(MatchKind.EXACT, "jason")),)
            )
            routes.append(
                VirtualService(
                    namespace=ns,
                    name=name,
                    source=SourceRef("VirtualService", ns, name),
                    hosts=(host,),
                    http=(
                        HttpRoute(
                            name="marked",
                            matches=(marked,),
                            destinations=(Destination(host, "v2"),),
                        ),
                        HttpRoute(
                            name="split",
                            timeout=5.0,
                            destinations=(
                                Destination(host, "v1", weight=90),
                                Destination(host, "v2", weight=10),
                            ),
                        ),
                    ),
                )
            )
    return MeshConfig(
        services=tuple(svc),
        workload_entries=tuple(wls),
        virtual_services=tuple(routes),
        destination_rules=tuple(rules),
    )


def client() -> Proxy:
    return proxy_from_node(
        "sidecar~10.255.0.1~client.ns-0~ns-0.svc.cluster.local", {"LABELS": {"app": "client"}}
    )


def full(config: MeshConfig, proxy: Proxy) -> tuple[float, int]:
    start = time.perf_counter()
    ctx = GenContext(MeshIndex(config), ResourceCache())
    count = sum(len(GENERATORS[t](ctx, proxy)) for t in TYPES)
    return time.perf_counter() - start, count


def incremental(config: MeshConfig, proxy: Proxy, runs: int) -> tuple[list[float], int]:
    """Warm a cache with `config`, then move one endpoint `runs` times (alternating between
    two addresses, each change a real one) and time what an endpoint-only push computes."""
    cache = ResourceCache()
    ctx = GenContext(MeshIndex(config), cache)
    for t in TYPES:
        GENERATORS[t](ctx, proxy)
    moved = list(config.workload_entries)
    original = moved[0]
    times: list[float] = []
    serialized = 0
    for run in range(runs):
        address = "10.254.0.1" if run % 2 == 0 else original.address
        moved[0] = dataclasses.replace(original, address=address)
        snapshot = dataclasses.replace(config, workload_entries=tuple(moved))
        before = cache.serializations
        start = time.perf_counter()
        old = ctx.index
        ctx = next_context(ctx, old.next(snapshot))
        eds_only = endpoints_only(old, ctx.index)
        GENERATORS[ENDPOINT_TYPE](ctx, proxy)
        times.append(time.perf_counter() - start)
        assert eds_only, "one endpoint moved: the push must be EDS only"
        serialized = cache.serializations - before
    return times, serialized


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--services", type=int, default=1000)
    ap.add_argument("--endpoints", type=int, default=5)
    ap.add_argument("--virtual-services", type=int, default=200)
    ap.add_argument("--destination-rules", type=int, default=200)
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    config = build_mesh(
        args.services, args.endpoints, args.virtual_services, args.destination_rules
    )
    proxy = client()
    fulls = [full(config, proxy) for _ in range(args.runs)]
    full_s = statistics.median(t for t, _ in fulls)
    inc_times, serialized = incremental(config, proxy, args.runs)
    inc_s = statistics.median(inc_times)
    print(
        f"mesh: {args.services} services x {args.endpoints} endpoints, "
        f"{args.virtual_services} VirtualServices, {args.destination_rules} DestinationRules"
    )
    print(f"translate full config, one proxy: {full_s * 1000:.1f} ms ({fulls[0][1]} resources)")
    print(
        f"translate incremental, one endpoint changed: {inc_s * 1000:.2f} ms "
        f"({serialized} resource(s) serialized)"
    )
    print(f"translate ratio incremental/full: 1/{full_s / inc_s:.0f}  (target <= 1/50)")


if __name__ == "__main__":
    main()
