"""xDS type URLs and the names Istio gives generated resources: `outbound|PORT|SUBSET|HOST`,
`inbound|PORT||`, `ADDRESS_PORT` listeners, the passthrough and blackhole clusters. One
generator names what another sends (a listener names a cluster, a cluster its EDS resource),
so every name is made here and nowhere else.
"""

from __future__ import annotations

from typing import Final

from envoy.config.cluster.v3.cluster_pb2 import Cluster
from envoy.config.endpoint.v3.endpoint_pb2 import ClusterLoadAssignment
from envoy.config.listener.v3.listener_pb2 import Listener
from envoy.config.route.v3.route_pb2 import RouteConfiguration

_PREFIX: Final = "type.googleapis.com/"
CLUSTER_TYPE: Final[str] = _PREFIX + Cluster.DESCRIPTOR.full_name
ENDPOINT_TYPE: Final[str] = _PREFIX + ClusterLoadAssignment.DESCRIPTOR.full_name
LISTENER_TYPE: Final[str] = _PREFIX + Listener.DESCRIPTOR.full_name
ROUTE_TYPE: Final[str] = _PREFIX + RouteConfiguration.DESCRIPTOR.full_name

BLACKHOLE_CLUSTER: Final = "BlackHoleCluster"
PASSTHROUGH_CLUSTER: Final = "PassthroughCluster"


def outbound_cluster_name(port: int, hostname: str) -> str:
    return f"outbound|{port}||{hostname}"


def subset_cluster_name(port: int, subset: str, hostname: str) -> str:
    return f"outbound|{port}|{subset}|{hostname}"


def inbound_cluster_name(port: int) -> str:
    return f"inbound|{port}||"


def listener_name(address: str, port: int) -> str:
    return f"{address}_{port}"
