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
from control.generate.load_assignment import EndpointKey, endpoint_keys, locality_endpoints
from control.generate.plans import OutboundCluster, OutboundPlan, outbound_plan
from control.generate.resource_names import ENDPOINT_TYPE
from control.model.proxy import Proxy
from control.xds.cache import Resource, ResourceSet


def generate(ctx: GenContext, proxy: Proxy) -> ResourceSet:
    plan = outbound_plan(ctx, proxy)
    key = ("eds-set", plan.key)
    # Nothing here depends on the proxy beyond its scope: one set per scope per push.
    return ctx.memo(key, lambda: _patched(ctx, plan, key) or _full(ctx, plan))


def _full(ctx: GenContext, plan: OutboundPlan) -> ResourceSet:
    return ResourceSet(
        [
            ctx.memo(("eds", id(c)), functools.partial(_resource, ctx, c))
            for c in plan.all_clusters
            if c.eds
        ]
    )


def _patched(ctx: GenContext, plan: OutboundPlan, key: Hashable) -> ResourceSet | None:
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
        c.name: ctx.memo(("eds", id(c)), functools.partial(_resource, ctx, c)) if c.eds else None
        for c in plan.rebuilt
    }
    return old.replace(changes)


def _resource(ctx: GenContext, cluster: OutboundCluster) -> Resource:
    # Only address, port, weight and locality reach the bytes; a workload relabel that leaves
    # them alone keeps the cached CLA.
    key = endpoint_keys(cluster.endpoints)
    return ctx.resource(ENDPOINT_TYPE, cluster.name, key, lambda: build(cluster.name, key))


def build(name: str, endpoints: tuple[EndpointKey, ...]) -> ClusterLoadAssignment:
    return ClusterLoadAssignment(
        cluster_name=name, endpoints=locality_endpoints(name, endpoints, dns=False)
    )
