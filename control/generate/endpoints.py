"""EDS: one ClusterLoadAssignment per outbound EDS cluster of the proxy's visible services
(subset clusters included: their assignments hold the endpoints with the subset's labels).

Every EDS cluster gets a CLA, empty when nothing backs it: Envoy keeps an EDS cluster warming
(and holds back the listeners that use it) until its assignment arrives, so "no endpoints" has
to be said explicitly.
"""

from __future__ import annotations

import functools
from collections.abc import Hashable

from envoy.config.endpoint.v3.endpoint_pb2 import ClusterLoadAssignment

from control.generate.context import GenContext
from control.generate.load_assignment import (
    EndpointKey,
    endpoint_keys,
    locality_endpoints,
    locality_group,
)
from control.generate.locality_lb import (
    ClientPlace,
    Group,
    LocalityLb,
    client_groups,
    cluster_locality_lb,
    label_keys_of,
)
from control.generate.plans import OutboundCluster, OutboundPlan, outbound_plan
from control.generate.resource_names import ENDPOINT_TYPE
from control.model.proxy import Proxy
from control.xds.cache import Resource, ResourceSet


def generate(ctx: GenContext, proxy: Proxy) -> ResourceSet:
    plan = outbound_plan(ctx, proxy)
    label_keys = _locality_label_keys(ctx, plan)
    if label_keys is None:
        # Nothing here depends on the proxy beyond its scope: one set per scope per push.
        key: Hashable = ("eds-set", plan.key)
        client = None
    else:
        # Locality load balancing: the set depends on where the client is, too.
        client = ClientPlace.of(proxy, label_keys)
        key = ("eds-set", plan.key, client)
    return ctx.memo(key, lambda: _patched(ctx, plan, key, client) or _full(ctx, plan, client))


def _locality_label_keys(ctx: GenContext, plan: OutboundPlan) -> tuple[str, ...] | None:
    key = ("eds-locality", plan.key)

    def scan() -> tuple[tuple[str, ...] | None]:
        if plan.rebuilt is not None:
            # A plan patched for endpoints keeps its clusters' policies: so does the answer.
            old = ctx.previous_memo(key, depends=frozenset())
            if isinstance(old, tuple):
                return old
        mesh = ctx.index.mesh.locality_lb
        return (
            label_keys_of(cluster_locality_lb(mesh, c.policy) for c in plan.all_clusters if c.eds),
        )

    return ctx.memo(key, scan)[0]


def _full(ctx: GenContext, plan: OutboundPlan, client: ClientPlace | None) -> ResourceSet:
    return ResourceSet([_memo_resource(ctx, c, client) for c in plan.all_clusters if c.eds])


def _patched(
    ctx: GenContext, plan: OutboundPlan, key: Hashable, client: ClientPlace | None
) -> ResourceSet | None:
    """The previous push's set with the assignments of the rebuilt clusters replaced, when
    the plan was patched from the previous push's plan of the same key (whose set this is)."""
    # The set is the plan's alone, whatever else changed.
    old = ctx.previous_memo(key, depends=frozenset())
    if plan.rebuilt is None or not isinstance(old, ResourceSet):
        return None
    # The reused assignments are served again without asking the cache for them.
    ctx.memo(("eds-keep", id(old)), lambda: ctx.cache.keep(ENDPOINT_TYPE, old))
    if not plan.rebuilt:
        return old
    changes: dict[str, Resource | None] = {
        c.name: _memo_resource(ctx, c, client) if c.eds else None for c in plan.rebuilt
    }
    return old.replace(changes)


def _memo_resource(
    ctx: GenContext, cluster: OutboundCluster, client: ClientPlace | None
) -> Resource:
    lb = None if client is None else cluster_locality_lb(ctx.index.mesh.locality_lb, cluster.policy)
    if lb is None or client is None:
        return ctx.memo(("eds", id(cluster)), functools.partial(_resource, ctx, cluster))
    return ctx.memo(
        ("eds", id(cluster), client), functools.partial(_client_resource, ctx, cluster, lb, client)
    )


def _resource(ctx: GenContext, cluster: OutboundCluster) -> Resource:
    # Only address, port, weight and locality reach the bytes; a workload relabel that leaves
    # them alone keeps the cached CLA.
    key = endpoint_keys(cluster.endpoints)
    return ctx.resource(ENDPOINT_TYPE, cluster.name, key, lambda: build(cluster.name, key))


def _client_resource(
    ctx: GenContext, cluster: OutboundCluster, lb: LocalityLb, client: ClientPlace
) -> Resource:
    groups = client_groups(lb, client, cluster.endpoints)
    # A slot per client locality: clients elsewhere do not evict each other's bytes.
    return ctx.resource(
        ENDPOINT_TYPE, cluster.name, groups, lambda: build_groups(cluster.name, groups), client
    )


def build(name: str, endpoints: tuple[EndpointKey, ...]) -> ClusterLoadAssignment:
    return ClusterLoadAssignment(
        cluster_name=name, endpoints=locality_endpoints(name, endpoints, dns=False)
    )


def build_groups(name: str, groups: tuple[Group, ...]) -> ClusterLoadAssignment:
    return ClusterLoadAssignment(
        cluster_name=name,
        endpoints=[
            locality_group(name, locality, priority, weight, endpoints, dns=False)
            for locality, priority, weight, endpoints in groups
        ],
    )
