"""How endpoints become Envoy load assignments: what of an endpoint reaches the bytes (the cache
key `EndpointKey`), the auto-mTLS label Envoy matches `transport_socket_matches` against,
grouping by locality, and which addresses each kind of cluster (EDS, DNS) can use.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from envoy.config.core.v3.base_pb2 import Locality, Metadata
from envoy.config.endpoint.v3.endpoint_components_pb2 import (
    Endpoint as EnvoyEndpoint,
)
from envoy.config.endpoint.v3.endpoint_components_pb2 import (
    LbEndpoint,
    LocalityLbEndpoints,
)
from google.protobuf.wrappers_pb2 import UInt32Value

from control.generate.addresses import Upstream, is_ip, socket_address
from control.generate.warn import warn_once
from control.model.locality import split_locality
from control.model.types import (
    Endpoint,
)

# What a load assignment reads from an endpoint; the cache key of CLAs and DNS clusters. Labels
# and service account do not reach these bytes, so they stay out of the key and a relabelled
# workload does not cost a re-serialization.
EndpointKey = tuple[str, int, int, str, bool]  # address, port, weight, locality, mTLS

# Endpoint metadata that Envoy matches a cluster's `transport_socket_matches` against, and the
# label an endpoint reached with Istio mTLS carries there (auto mTLS, as Istio's EDS).
TRANSPORT_SOCKET_MATCH: Final = "envoy.transport_socket_match"
MTLS_ENDPOINT_LABEL: Final = {"tlsMode": "istio"}


def endpoint_keys(endpoints: tuple[Endpoint, ...]) -> tuple[EndpointKey, ...]:
    return tuple((e.address, e.port, e.weight, e.locality, e.mtls) for e in endpoints)


_MTLS_METADATA = Metadata()
_MTLS_METADATA.filter_metadata[TRANSPORT_SOCKET_MATCH].update(MTLS_ENDPOINT_LABEL)


def parse_locality(value: str) -> Locality:
    region, zone, sub_zone = split_locality(value)
    return Locality(region=region, zone=zone, sub_zone=sub_zone)


def locality_endpoints(
    cluster: str, endpoints: tuple[EndpointKey, ...], *, dns: bool
) -> list[LocalityLbEndpoints]:
    """Group endpoints by locality (sorted, so equal inputs give equal bytes)."""
    groups: dict[str, list[EndpointKey]] = {}
    for key in sorted(endpoints):
        groups.setdefault(key[3], []).append(key)
    return [
        locality_group(cluster, locality, 0, 0, groups[locality], dns=dns)
        for locality in sorted(groups)
    ]


def locality_group(
    cluster: str,
    locality: str,
    priority: int,
    weight: int,
    endpoints: Iterable[EndpointKey],
    *,
    dns: bool,
) -> LocalityLbEndpoints:
    """One locality group; `weight` 0 leaves its load-balancing weight unset.

    An address Envoy cannot use for the cluster's kind is left out with a warning instead of
    being sent: Envoy rejects the whole resource for one bad address, which would take every
    other endpoint of the cluster down with it. EDS takes IPs and Unix sockets; a DNS cluster
    takes IPs and hostnames (to resolve) but no sockets.
    """
    group = LocalityLbEndpoints(priority=priority)
    for address, port, endpoint_weight, _, mtls in endpoints:
        if address.startswith("unix://"):
            usable = not dns
            addr = Upstream(pipe=address.removeprefix("unix://")).address()
        else:
            usable = dns or is_ip(address)
            addr = socket_address(address, port)
        if not usable:
            warn_once(
                ("unusable-endpoint", cluster, address),
                "cluster %s: endpoint address %s cannot be used by a%s cluster; left out",
                cluster,
                address,
                " DNS" if dns else "n EDS",
            )
            continue
        lb = LbEndpoint(endpoint=EnvoyEndpoint(address=addr))
        if endpoint_weight > 0:
            lb.load_balancing_weight.CopyFrom(UInt32Value(value=endpoint_weight))
        if mtls:
            lb.metadata.CopyFrom(_MTLS_METADATA)
        group.lb_endpoints.append(lb)
    if locality:
        group.locality.CopyFrom(parse_locality(locality))
    if weight > 0:
        group.load_balancing_weight.CopyFrom(UInt32Value(value=weight))
    return group
