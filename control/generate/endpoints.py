"""EDS: one ClusterLoadAssignment per outbound EDS cluster of the proxy's visible services
(subset clusters included: their assignments hold the endpoints with the subset's labels).

Every EDS cluster gets a CLA, empty when nothing backs it: Envoy keeps an EDS cluster warming
(and holds back the listeners that use it) until its assignment arrives, so "no endpoints" has
to be said explicitly.
"""

from __future__ import annotations

import functools

from envoy.config.endpoint.v3.endpoint_pb2 import ClusterLoadAssignment

from control.generate.common import (
    ENDPOINT_TYPE,
    EndpointKey,
    OutboundCluster,
    endpoint_keys,
    locality_endpoints,
    outbound_plan,
)
from control.generate.context import GenContext
from control.model.proxy import Proxy
from control.xds.cache import Resource, ResourceSet


def generate(ctx: GenContext, proxy: Proxy) -> ResourceSet:
    plan = outbound_plan(ctx, proxy)
    # Nothing here depends on the proxy beyond its scope: one set per scope per push.
    return ctx.memo(
        ("eds-set", plan.key),
        lambda: ResourceSet(
            [
                ctx.memo(("eds", id(c)), functools.partial(_resource, ctx, c))
                for c in plan.all_clusters
                if c.eds
            ]
        ),
    )


def _resource(ctx: GenContext, cluster: OutboundCluster) -> Resource:
    # Only address, port, weight and locality reach the bytes; a workload relabel that leaves
    # them alone keeps the cached CLA.
    key = endpoint_keys(cluster.endpoints)
    return ctx.resource(ENDPOINT_TYPE, cluster.name, key, lambda: build(cluster.name, key))


def build(name: str, endpoints: tuple[EndpointKey, ...]) -> ClusterLoadAssignment:
    return ClusterLoadAssignment(
        cluster_name=name, endpoints=locality_endpoints(name, endpoints, dns=False)
    )
