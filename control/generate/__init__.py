"""Envoy configuration generators.

`GENERATORS` maps a type URL to the function that computes that type's resources for an Envoy
proxy (and the agent's DNS name table); `GRPC_GENERATORS` does the same for proxyless gRPC
clients (node metadata `GENERATOR: grpc`), which need api_listeners named after the target
they dial instead.

Where each decision is made:

- per xDS type for sidecars: clusters (CDS), endpoints (EDS), listeners_explicit (LDS in
  interception mode NONE: bound listeners, and the inbound chains a PeerAuthentication mode
  implies), listeners_redirect (LDS in mode REDIRECT: virtualOutbound/virtualInbound),
  route_tables (RDS), names (NDS), probes (the agent's WorkloadGroup probe), peers (the
  workloads by address, for the agent's TCP standard metrics);
- routers (gateways): gateway_listeners (LDS per merged server port), gateway_routes (RDS
  `http.<port>` / `https.<port>.…` from bound VirtualServices), gateway_tls (server
  certificates over SDS), secrets (the certificates themselves: SDS over ADS for the
  router's agent); clusters and endpoints as for sidecars (cluster names stay
  `outbound|PORT|SUBSET|HOST`, so DestinationRules and auto mTLS apply at the gateway hop);
  no NDS (DNS proxying is a sidecar's);
- proxyless gRPC: grpc_targets (which dial names lead to which cluster), grpc_listeners
  (LDS/RDS, xDS-server listeners), grpc_clusters (CDS/EDS, their transport security);
- what those share: plans (outbound clusters and ports, inbound ports, binds), route_translation
  (VirtualService HTTP route -> Envoy route), destination_policy (DestinationRule
  trafficPolicy -> cluster settings), authz_rbac (AuthorizationPolicy -> RBAC filters),
  mesh_tls (Istio mTLS transport sockets: SDS, auto mTLS, certificate providers), filters
  (HCM, router, TCP proxy), load_assignment (endpoints -> locality groups), resource_names,
  addresses, wire, warn; context (the per-push memo and resource cache).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from control.generate import (
    clusters,
    endpoints,
    gateway_listeners,
    gateway_routes,
    grpc_clusters,
    grpc_listeners,
    listeners_redirect,
    names,
    peers,
    probes,
    route_tables,
    secrets,
)
from control.generate.context import GenContext
from control.generate.resource_names import CLUSTER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE, ROUTE_TYPE
from control.model.proxy import Proxy
from control.xds.cache import ResourceSet
from protos.typeurls import NAME_TABLE, PEER_TABLE, SECRET, WORKLOAD_PROBE

Generator = Callable[[GenContext, Proxy], ResourceSet]

GENERATORS: Final[dict[str, Generator]] = {
    CLUSTER_TYPE: clusters.generate,
    ENDPOINT_TYPE: endpoints.generate,
    # Mode NONE's bound listeners, or REDIRECT's virtualOutbound/virtualInbound.
    LISTENER_TYPE: listeners_redirect.generate_listeners,
    ROUTE_TYPE: route_tables.generate,
    NAME_TABLE: names.generate,
    # For the agent: the readiness probe of its WorkloadGroup.
    WORKLOAD_PROBE: probes.generate,
    # For the agent's standard metrics: who runs where (TCP callers).
    PEER_TABLE: peers.generate,
}

GRPC_GENERATORS: Final[dict[str, Generator]] = {
    CLUSTER_TYPE: grpc_clusters.generate_clusters,
    ENDPOINT_TYPE: grpc_clusters.generate_endpoints,
    LISTENER_TYPE: grpc_listeners.generate_listeners,
    ROUTE_TYPE: grpc_listeners.generate_routes,
    # The agent of a proxyless pod serves DNS too; its table is the same as a sidecar's.
    NAME_TABLE: names.generate,
    WORKLOAD_PROBE: probes.generate,
}


ROUTER_GENERATORS: Final[dict[str, Generator]] = {
    CLUSTER_TYPE: clusters.generate,
    ENDPOINT_TYPE: endpoints.generate,
    LISTENER_TYPE: gateway_listeners.generate,
    ROUTE_TYPE: gateway_routes.generate,
    WORKLOAD_PROBE: probes.generate,
    # For the router's agent: gateway certificates (who may ask: control/secretaccess.py).
    SECRET: secrets.generate,
    PEER_TABLE: peers.generate,
}


# Generators whose answer depends on the proxy only through its visibility class
# (control/model/visibility_index.py) and its locality: EDS is the outbound plan's
# assignments, the plan is keyed by the visible services and the traffic scope alone, and
# locality load balancing reads the proxy's locality and labels. Every proxy of a class gets
# the same set object anyway (the per-push memo); naming them here lets the push ask once per
# class instead of walking the plan lookups for each of a thousand streams.
BY_VISIBILITY: Final[frozenset[Generator]] = frozenset((endpoints.generate,))


def generators_for(proxy: Proxy) -> dict[str, Generator]:
    """The generator table that speaks the proxy's dialect."""
    if proxy.is_grpc:
        return GRPC_GENERATORS
    return ROUTER_GENERATORS if proxy.is_router else GENERATORS


__all__ = [
    "BY_VISIBILITY",
    "GENERATORS",
    "GRPC_GENERATORS",
    "ROUTER_GENERATORS",
    "Generator",
    "generators_for",
]
