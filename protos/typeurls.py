"""Type URLs of every resource type Pilotfish serves over xDS, plus push order and short names."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

_PREFIX: Final = "type.googleapis.com/"

LISTENER: Final = _PREFIX + "envoy.config.listener.v3.Listener"
CLUSTER: Final = _PREFIX + "envoy.config.cluster.v3.Cluster"
ENDPOINT: Final = _PREFIX + "envoy.config.endpoint.v3.ClusterLoadAssignment"
ROUTE: Final = _PREFIX + "envoy.config.route.v3.RouteConfiguration"
SECRET: Final = _PREFIX + "envoy.extensions.transport_sockets.tls.v3.Secret"
NAME_TABLE: Final = _PREFIX + "istio.networking.nds.v1.NameTable"
# ECDS, which the agent rewrites when it carries remote Wasm code (agent/xdsproxy/ecds.py).
EXTENSION_CONFIG: Final = _PREFIX + "envoy.config.core.v3.TypedExtensionConfig"
PROXY_CONFIG: Final = _PREFIX + "istio.mesh.v1alpha1.ProxyConfig"
# The readiness probe of a WorkloadGroup member, for its agent (protos/probe.proto).
WORKLOAD_PROBE: Final = _PREFIX + "pilotfish.health.v1.WorkloadProbe"
# The mesh's workloads, for the agent's TCP standard metrics (protos/peers.proto).
PEER_TABLE: Final = _PREFIX + "pilotfish.telemetry.v1.PeerTable"
# Istio's health report: a DiscoveryRequest of this type from the agent (no error_detail:
# healthy; error_detail: unhealthy, with the reason). Never subscribed to nor answered.
HEALTH: Final = "istio.io/health"
# Istio's debug type: not a protobuf type, so no type.googleapis.com/ prefix.
DEBUG_SYNCZ: Final = "istio.io/debug/syncz"

# Order in which a full state-of-the-world push sends types, so that a proxy never receives
# a reference before its target (clusters before their endpoints, listeners before routes).
SOTW_PUSH_ORDER: Final[tuple[str, ...]] = (CLUSTER, ENDPOINT, LISTENER, ROUTE, SECRET, NAME_TABLE)

# Short names for logs and metrics, as Istio spells them.
SHORT_NAMES: Final[Mapping[str, str]] = {
    CLUSTER: "CDS",
    ENDPOINT: "EDS",
    LISTENER: "LDS",
    ROUTE: "RDS",
    SECRET: "SDS",
    NAME_TABLE: "NDS",
    PROXY_CONFIG: "PCDS",
    DEBUG_SYNCZ: "SYNCZ",
    WORKLOAD_PROBE: "PROBE",
    PEER_TABLE: "PEERS",
    HEALTH: "HEALTH",
}
