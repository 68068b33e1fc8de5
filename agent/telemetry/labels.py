"""Istio's standard metric labels for one Envoy access log entry (sans-IO).

What a label may say, and where it comes from (protos/telemetry.py has the wire contract):

- This proxy's own workload: the logger's literal tags, written by the control plane.
- The caller's workload (server side): the control plane's table of workloads (peers.py),
  by the connection's source address and the principal the caller's certificate names;
  `unknown` for a caller without a certificate (plaintext), as Istio reports one.
- The upstream's workload (client side): the same table, by the upstream host's address and
  the principal its certificate names; `unknown` when it presented none.
- Principals: the certificates (the caller's on the server side; the upstream's on the
  client side). Nothing a peer sends is read: no header says who anyone is.
"""

from __future__ import annotations

from functools import lru_cache
from operator import itemgetter
from typing import Final

from envoy.data.accesslog.v3.accesslog_pb2 import (
    AccessLogCommon,
    AccessLogType,
    HTTPAccessLogEntry,
    ResponseFlags,
    TCPAccessLogEntry,
    TLSProperties,
)

from agent.telemetry.peers import PeerDirectory
from pilotfish_common.addresses import is_ip
from protos import telemetry as t

UNKNOWN: Final = "unknown"

# Istio's label names, in Istio's order.
HTTP_LABELS: Final = (
    "reporter",
    "source_workload",
    "source_workload_namespace",
    "source_principal",
    "source_app",
    "source_version",
    "destination_workload",
    "destination_workload_namespace",
    "destination_principal",
    "destination_app",
    "destination_version",
    "destination_service",
    "destination_service_name",
    "destination_service_namespace",
    "request_protocol",
    "response_code",
    "grpc_response_status",
    "response_flags",
    "connection_security_policy",
)
# TCP metrics have no response code or gRPC status.
TCP_LABELS: Final = tuple(
    n for n in HTTP_LABELS if n not in ("response_code", "grpc_response_status")
)

LabelValues = tuple[str, ...]
_HTTP_ORDER: Final = itemgetter(*HTTP_LABELS)
_TCP_ORDER: Final = itemgetter(*TCP_LABELS)

# Envoy's short response flag codes, in the order Envoy prints them.
_FLAG_CODES: Final = (
    ("failed_local_healthcheck", "LH"),
    ("no_healthy_upstream", "UH"),
    ("upstream_request_timeout", "UT"),
    ("local_reset", "LR"),
    ("upstream_remote_reset", "UR"),
    ("upstream_connection_failure", "UF"),
    ("upstream_connection_termination", "UC"),
    ("upstream_overflow", "UO"),
    ("no_route_found", "NR"),
    ("delay_injected", "DI"),
    ("fault_injected", "FI"),
    ("rate_limited", "RL"),
    ("rate_limit_service_error", "RLSE"),
    ("downstream_connection_termination", "DC"),
    ("upstream_retry_limit_exceeded", "URX"),
    ("stream_idle_timeout", "SI"),
    ("invalid_envoy_request_headers", "IH"),
    ("downstream_protocol_error", "DPE"),
    ("upstream_max_stream_duration_reached", "UMSDR"),
    ("response_from_cache_filter", "RFCF"),
    ("no_filter_config_found", "NFCF"),
    ("duration_timeout", "DT"),
    ("upstream_protocol_error", "UPE"),
    ("no_cluster_found", "NC"),
    ("overload_manager", "OM"),
    ("dns_resolution_failure", "DF"),
    ("downstream_remote_reset", "DR"),
)


_FLAG_ORDER: Final = {field: i for i, (field, _) in enumerate(_FLAG_CODES)}
_FLAG_CODE: Final = {**dict(_FLAG_CODES), "unauthorized_details": "UAEX"}
# Envoy's short code to the ALS field (records.py reads codes from Envoy's text).
FLAG_FIELDS: Final = {code: name for name, code in _FLAG_CODE.items()}


def response_flags(flags: ResponseFlags) -> str:
    # Only the set fields: most entries have none, and this runs once per request.
    names = [f.name for f, _ in flags.ListFields()]
    if not names:
        return "-"
    names.sort(key=lambda n: _FLAG_ORDER.get(n, len(_FLAG_ORDER)))
    return ",".join(_FLAG_CODE.get(n, n) for n in names)


def http_labels(entry: HTTPAccessLogEntry, peers: PeerDirectory | None = None) -> LabelValues:
    """`peers`: the control plane's table, to name the upstream (client side) or an mTLS
    caller (server side); without it they are `unknown`."""
    common = entry.common_properties
    request, response = entry.request, entry.response
    grpc = request.request_headers.get("content-type", "").startswith("application/grpc")
    status = ""
    if grpc:
        status = response.response_trailers.get("grpc-status") or response.response_headers.get(
            "grpc-status", ""
        )
    values = _peer_labels(common, request.authority, peers)
    values["request_protocol"] = "grpc" if grpc else "http"
    values["response_code"] = str(response.response_code.value)
    values["grpc_response_status"] = status
    values["response_flags"] = response_flags(common.response_flags)
    return _HTTP_ORDER(values)  # type: ignore[no-any-return]


def caller_unknown_yet(common: AccessLogCommon) -> bool:
    """A server-side TCP proxy logs its upstream connection before the caller's TLS handshake
    is over (it connects upstream at once), so that entry cannot say who the caller is, nor
    whether it used mTLS. Later entries (periodic, the end) can."""
    return (
        common.access_log_type == AccessLogType.TcpUpstreamConnected
        and common.custom_tags.get(t.TAG_REPORTER) == t.REPORTER_DESTINATION
        and _spiffe(common.tls_properties.peer_certificate_properties) == UNKNOWN
    )


def tcp_labels(entry: TCPAccessLogEntry, peers: PeerDirectory | None = None) -> LabelValues:
    """`peers`: the control plane's table, to name the upstream or an mTLS caller."""
    common = entry.common_properties
    values = _peer_labels(common, "", peers)
    values["request_protocol"] = "tcp"
    values["response_flags"] = response_flags(common.response_flags)
    return _TCP_ORDER(values)  # type: ignore[no-any-return]


def _peer_labels(
    common: AccessLogCommon, authority: str, peers: PeerDirectory | None = None
) -> dict[str, str]:
    tags = common.custom_tags
    own = {
        "workload": tags.get(t.TAG_WORKLOAD) or UNKNOWN,
        "workload_namespace": tags.get(t.TAG_NAMESPACE) or UNKNOWN,
        "app": tags.get(t.TAG_APP) or UNKNOWN,
        "version": tags.get(t.TAG_VERSION) or UNKNOWN,
    }
    reporter = tags.get(t.TAG_REPORTER, "")
    if reporter == t.REPORTER_DESTINATION:
        caller = _spiffe(common.tls_properties.peer_certificate_properties)
        mtls = caller != UNKNOWN
        peer = _UNKNOWN_PEER
        if peers is not None and mtls:
            # The socket's peer: Envoy's "remote address" may come from x-forwarded-for.
            remote = common.downstream_direct_remote_address.socket_address.address
            peer = peers.workload_at(remote, caller) or peer
        source, destination = peer, own
        source_principal = caller
        destination_principal = (
            _spiffe(common.tls_properties.local_certificate_properties) if mtls else UNKNOWN
        )
        if destination_principal == UNKNOWN and mtls:
            destination_principal = tags.get(t.TAG_PRINCIPAL) or UNKNOWN
        policy = "mutual_tls" if mtls else "none"
        service = _inbound_service(
            authority, own["workload_namespace"], tags.get(t.TAG_CLUSTER_DOMAIN, "")
        )
    else:
        reporter = t.REPORTER_SOURCE
        meta = common.metadata.filter_metadata.get(t.METADATA_NAMESPACE)
        fields = meta.fields if meta is not None else {}
        sans = (
            fields[t.METADATA_UPSTREAM_PRINCIPAL].string_value
            if t.METADATA_UPSTREAM_PRINCIPAL in fields
            else ""
        )
        upstream = next((u for u in sans.split(",") if u.startswith("spiffe://")), "")
        mtls = bool(upstream)
        peer = _UNKNOWN_PEER
        if peers is not None and mtls:
            host = common.upstream_remote_address.socket_address.address
            peer = peers.workload_at(host, upstream) or peer
        source, destination = own, peer
        source_principal = (tags.get(t.TAG_PRINCIPAL) or UNKNOWN) if mtls else UNKNOWN
        destination_principal = upstream if mtls else UNKNOWN
        # Istio's client side does not judge the connection's security.
        policy = UNKNOWN
        service = _outbound_service(common.upstream_cluster, authority)
        if service[0] == UNKNOWN and not common.upstream_cluster:
            # Answered before a cluster was picked (a fault abort, no route): the service the
            # client addressed.
            service = _inbound_service(
                authority, own["workload_namespace"], tags.get(t.TAG_CLUSTER_DOMAIN, "")
            )
    return {
        "reporter": reporter,
        "source_workload": source["workload"],
        "source_workload_namespace": source["workload_namespace"],
        "source_principal": source_principal,
        "source_app": source["app"],
        "source_version": source["version"],
        "destination_workload": destination["workload"],
        "destination_workload_namespace": destination["workload_namespace"],
        "destination_principal": destination_principal,
        "destination_app": destination["app"],
        "destination_version": destination["version"],
        "destination_service": service[0],
        "destination_service_name": service[1],
        "destination_service_namespace": service[2],
        "connection_security_policy": policy,
    }


_UNKNOWN_PEER: Final = {
    "workload": UNKNOWN,
    "workload_namespace": UNKNOWN,
    "app": UNKNOWN,
    "version": UNKNOWN,
}


def _spiffe(cert: TLSProperties.CertificateProperties) -> str:
    for san in cert.subject_alt_name:
        if san.uri.startswith("spiffe://"):
            return str(san.uri)
    return UNKNOWN


# Label derivation runs once per request in the agent; the same few authorities and clusters
# recur, so their parsing is cached (bounded: distinct values beyond these sizes only cost the
# parsing again).
@lru_cache(maxsize=1024)
def _outbound_service(cluster: str, authority: str) -> tuple[str, str, str]:
    """From the upstream cluster `outbound|PORT|SUBSET|HOST`, as Istio's client side names the
    service; the passthrough and blackhole clusters name themselves, with the authority's
    host as the service (Istio's reading of traffic to outside the mesh)."""
    parts = cluster.split("|")
    if len(parts) == 4 and parts[0] == "outbound" and parts[3]:
        host = parts[3]
        return host, *_name_namespace(host, UNKNOWN)
    if cluster in ("PassthroughCluster", "BlackHoleCluster"):
        return _host(authority) or UNKNOWN, cluster, UNKNOWN
    return UNKNOWN, UNKNOWN, UNKNOWN


@lru_cache(maxsize=1024)
def _inbound_service(authority: str, namespace: str, domain: str) -> tuple[str, str, str]:
    """From the request's authority, completed as a Kubernetes name in this workload's
    namespace (`backend` → `backend.<ns>.svc.<domain>`); unknown for an IP or none."""
    host = _host(authority)
    if not host or is_ip(host):
        return UNKNOWN, UNKNOWN, UNKNOWN
    domain = domain or "cluster.local"
    labels = host.split(".")
    if len(labels) == 1:
        host = f"{host}.{namespace}.svc.{domain}"
    elif len(labels) == 2:
        host = f"{host}.svc.{domain}"
    elif len(labels) == 3 and labels[2] == "svc":
        host = f"{host}.{domain}"
    return host, *_name_namespace(host, namespace)


def _name_namespace(host: str, default_namespace: str) -> tuple[str, str]:
    labels = host.split(".")
    if len(labels) >= 3 and labels[2] == "svc":
        return labels[0], labels[1]
    return labels[0], default_namespace


def _host(authority: str) -> str:
    if authority.startswith("["):
        return authority[1:].partition("]")[0]
    host, _, port = authority.rpartition(":")
    if host and port.isdigit():
        return host.lower()
    return authority.lower()


__all__ = [
    "FLAG_FIELDS",
    "HTTP_LABELS",
    "TCP_LABELS",
    "UNKNOWN",
    "LabelValues",
    "caller_unknown_yet",
    "http_labels",
    "response_flags",
    "tcp_labels",
]
