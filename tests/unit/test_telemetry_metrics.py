"""The agent's standard metrics without sockets: label derivation from access log entries
(peers named from the control plane's table by address and certificate, principals,
services), the histogram buckets, TCP byte deltas and the cardinality cap."""

from __future__ import annotations

import pytest
from envoy.data.accesslog.v3.accesslog_pb2 import (
    AccessLogType,
    HTTPAccessLogEntry,
    TCPAccessLogEntry,
)
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from agent.telemetry.aggregator import BUCKETS, Histogram, MetricsAggregator
from agent.telemetry.labels import HTTP_LABELS, TCP_LABELS, http_labels, tcp_labels
from agent.telemetry.peers import PeerDirectory
from protos import peers_pb2
from protos import telemetry as t

CLIENT = "spiffe://cluster.local/ns/shop/sa/client"
SERVER = "spiffe://cluster.local/ns/shop/sa/web"
SERVER_IP = "10.0.0.9"
CLIENT_IP = "10.0.0.7"


def peer_table(*peers: tuple[str, str, str, str]) -> PeerDirectory:
    """The control plane's table: (ip, workload, version, principal) rows in namespace shop,
    app = workload."""
    directory = PeerDirectory()
    rows = [
        peers_pb2.Peer(ip=ip, workload=w, namespace="shop", app=w, version=v, principal=principal)
        for ip, w, v, principal in peers
    ]
    directory([peers_pb2.PeerTable(peers=rows)])
    return directory


# The mesh as the control plane tells both agents: web at SERVER_IP, client at CLIENT_IP.
PEERS = peer_table((SERVER_IP, "web", "v1", SERVER), (CLIENT_IP, "client", "v2", CLIENT))


def _tags(entry_common: object, reporter: str, **own: str) -> None:
    tags = {
        t.TAG_REPORTER: reporter,
        t.TAG_WORKLOAD: own.get("workload", "web"),
        t.TAG_NAMESPACE: own.get("namespace", "shop"),
        t.TAG_APP: own.get("app", "web"),
        t.TAG_VERSION: own.get("version", "v1"),
        t.TAG_PRINCIPAL: own.get("principal", SERVER),
        t.TAG_CLUSTER_DOMAIN: "cluster.local",
    }
    entry_common.custom_tags.update(tags)  # type: ignore[attr-defined]


def server_entry(
    *,
    peer: str | None = CLIENT,
    remote: str = CLIENT_IP,
    code: int = 200,
    duration_ms: float = 3.0,
    authority: str = "web:8080",
) -> HTTPAccessLogEntry:
    """What the server side's logger sends for one request."""
    e = HTTPAccessLogEntry()
    c = e.common_properties
    _tags(c, t.REPORTER_DESTINATION)
    if peer is not None:
        c.tls_properties.peer_certificate_properties.subject_alt_name.add(uri=peer)
        c.tls_properties.local_certificate_properties.subject_alt_name.add(uri=SERVER)
    c.downstream_direct_remote_address.socket_address.address = remote
    c.downstream_direct_remote_address.socket_address.port_value = 40000
    c.duration.FromNanoseconds(int(duration_ms * 1e6))
    c.upstream_cluster = "inbound|8080||"
    e.request.authority = authority
    e.request.request_headers_bytes = 100
    e.request.request_body_bytes = 20
    e.response.response_code.value = code
    e.response.response_headers_bytes = 50
    e.response.response_body_bytes = 950
    return e


def client_entry(*, upstream: str = SERVER, host: str = SERVER_IP) -> HTTPAccessLogEntry:
    """What the client side's logger sends for one request."""
    e = HTTPAccessLogEntry()
    c = e.common_properties
    if host:
        c.upstream_remote_address.socket_address.address = host
        c.upstream_remote_address.socket_address.port_value = 8080
    _tags(c, t.REPORTER_SOURCE, workload="client", app="client", version="v2", principal=CLIENT)
    if upstream:
        c.metadata.filter_metadata[t.METADATA_NAMESPACE].update(
            {t.METADATA_UPSTREAM_PRINCIPAL: upstream}
        )
    c.upstream_cluster = "outbound|8080|v1|web.shop.svc.cluster.local"
    e.request.authority = "web:8080"
    e.request.request_headers["content-type"] = "application/grpc"
    e.response.response_code.value = 200
    e.response.response_trailers["grpc-status"] = "14"
    return e


def labels(values: tuple[str, ...], names: tuple[str, ...] = HTTP_LABELS) -> dict[str, str]:
    return dict(zip(names, values, strict=True))


# --- labels ------------------------------------------------------------------------------------


def test_server_side_labels_from_mtls_peer_and_own_tags() -> None:
    got = labels(http_labels(server_entry(), PEERS))
    assert got == {
        "reporter": "destination",
        "source_workload": "client",
        "source_workload_namespace": "shop",
        "source_principal": CLIENT,
        "source_app": "client",
        "source_version": "v2",
        "destination_workload": "web",
        "destination_workload_namespace": "shop",
        "destination_principal": SERVER,
        "destination_app": "web",
        "destination_version": "v1",
        "destination_service": "web.shop.svc.cluster.local",
        "destination_service_name": "web",
        "destination_service_namespace": "shop",
        "request_protocol": "http",
        "response_code": "200",
        "grpc_response_status": "",
        "response_flags": "-",
        "connection_security_policy": "mutual_tls",
    }


def test_a_plaintext_caller_is_unknown_even_from_a_known_address() -> None:
    got = labels(http_labels(server_entry(peer=None), PEERS))
    assert got["source_workload"] == "unknown"
    assert got["source_workload_namespace"] == "unknown"
    assert got["source_app"] == "unknown"
    assert got["source_principal"] == "unknown"
    assert got["destination_principal"] == "unknown"
    assert got["connection_security_policy"] == "none"
    # The server's own side still comes from its tags.
    assert got["destination_workload"] == "web" and got["destination_app"] == "web"
    # Without the control plane's table nobody is named, certificate or not.
    assert labels(http_labels(server_entry()))["source_workload"] == "unknown"


def test_a_caller_is_named_by_its_address_and_certificate() -> None:
    other = "spiffe://cluster.local/ns/shop/sa/other"
    # Another identity at the client's address: not the client; its certificate still counts.
    got = labels(http_labels(server_entry(peer=other), PEERS))
    assert got["source_workload"] == "unknown" and got["source_principal"] == other
    # Envoy's "remote address" (which x-forwarded-for can set) is not read, only the socket's.
    entry = server_entry(peer=other)
    entry.common_properties.downstream_remote_address.socket_address.address = CLIENT_IP
    assert labels(http_labels(entry, PEERS))["source_workload"] == "unknown"
    # From another address (a loopback alias calls from 127.0.0.1; NAT): the one workload
    # with that principal.
    moved = labels(http_labels(server_entry(remote="127.0.0.1"), PEERS))
    assert moved["source_workload"] == "client" and moved["source_version"] == "v2"
    # Two workloads with one principal: the address says which; elsewhere, neither.
    twins = peer_table(
        (CLIENT_IP, "client", "v2", CLIENT), ("10.0.0.8", "client-canary", "v3", CLIENT)
    )
    for remote, want in ((CLIENT_IP, "v2"), ("10.0.0.8", "v3"), ("127.0.0.1", "unknown")):
        got = labels(http_labels(server_entry(remote=remote), twins))
        assert got["source_version"] == want, remote
        assert got["source_principal"] == CLIENT


def test_client_side_names_its_mtls_upstream_from_the_peer_table() -> None:
    got = labels(http_labels(client_entry(), PEERS))
    assert got["reporter"] == "source"
    assert got["source_workload"] == "client" and got["source_principal"] == CLIENT
    assert got["destination_workload"] == "web" and got["destination_version"] == "v1"
    assert got["destination_principal"] == SERVER
    assert got["destination_service"] == "web.shop.svc.cluster.local"
    assert got["destination_service_name"] == "web"
    assert got["destination_service_namespace"] == "shop"
    assert got["request_protocol"] == "grpc" and got["grpc_response_status"] == "14"
    assert got["connection_security_policy"] == "unknown"

    plaintext = labels(http_labels(client_entry(upstream=""), PEERS))
    assert plaintext["destination_workload"] == "unknown"
    assert plaintext["destination_principal"] == "unknown"
    assert plaintext["source_principal"] == "unknown"

    # The address alone proves nothing: another identity there is not web.
    other = "spiffe://cluster.local/ns/shop/sa/other"
    got = labels(http_labels(client_entry(upstream=other), PEERS))
    assert got["destination_workload"] == "unknown" and got["destination_app"] == "unknown"
    # Web's certificate at an address the table does not give it: web is the only workload
    # with that principal (a caller is named the same way: test_a_caller_is_named_by_...).
    moved = labels(http_labels(client_entry(host="10.0.0.10"), PEERS))
    assert moved["destination_workload"] == "web"
    assert labels(http_labels(client_entry(upstream=other), PEERS))["destination_principal"] == (
        other
    )

    # More URI SANs than one: the SPIFFE ID among them names the upstream.
    sans = labels(http_labels(client_entry(upstream=f"https://web.example,{SERVER}"), PEERS))
    assert sans["destination_workload"] == "web" and sans["destination_principal"] == SERVER


def test_service_names_from_the_authority_and_the_cluster() -> None:
    def service(authority: str) -> tuple[str, str, str]:
        got = labels(http_labels(server_entry(authority=authority)))
        return (
            got["destination_service"],
            got["destination_service_name"],
            got["destination_service_namespace"],
        )

    assert service("web") == ("web.shop.svc.cluster.local", "web", "shop")
    assert service("web.other:80") == ("web.other.svc.cluster.local", "web", "other")
    assert service("web.other.svc") == ("web.other.svc.cluster.local", "web", "other")
    assert service("api.example.com") == ("api.example.com", "api", "shop")
    assert service("10.0.0.1:8080") == ("unknown", "unknown", "unknown")
    assert service("[fd00::1]:80") == ("unknown", "unknown", "unknown")

    passthrough = client_entry()
    passthrough.common_properties.upstream_cluster = "PassthroughCluster"
    passthrough.request.authority = "example.org"
    got = labels(http_labels(passthrough))
    assert got["destination_service"] == "example.org"
    assert got["destination_service_name"] == "PassthroughCluster"

    # A fault abort answers before any cluster is picked: the service the client addressed.
    aborted = client_entry(upstream="")
    aborted.common_properties.ClearField("upstream_cluster")
    aborted.common_properties.response_flags.fault_injected = True
    aborted.response.response_code.value = 503
    got = labels(http_labels(aborted))
    assert got["destination_service"] == "web.shop.svc.cluster.local"
    assert got["response_flags"] == "FI" and got["response_code"] == "503"


def test_response_flags_in_envoys_short_form() -> None:
    e = server_entry()
    flags = e.common_properties.response_flags
    flags.upstream_connection_failure = True
    flags.no_healthy_upstream = True
    flags.unauthorized_details.reason = 1
    assert labels(http_labels(e))["response_flags"] == "UH,UF,UAEX"


# --- histograms and the aggregate ------------------------------------------------------------


def test_histogram_buckets_are_istios_and_upper_inclusive() -> None:
    assert BUCKETS[:4] == (0.5, 1.0, 5.0, 10.0) and BUCKETS[-1] == 3600000.0
    h = Histogram()
    for v in (0.5, 0.6, 5.0, 7_000_000.0):
        h.observe(v)
    cumulative = dict(h.cumulative())
    assert cumulative["0.5"] == 1  # le is inclusive
    assert cumulative["1"] == 2
    assert cumulative["5"] == 3
    assert cumulative["3600000"] == 3
    assert cumulative["+Inf"] == 4
    assert h.total == pytest.approx(7_000_006.1)


def _scrape(agg: MetricsAggregator) -> dict[str, list[tuple[dict[str, str], float]]]:
    registry = CollectorRegistry()
    registry.register(agg)
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def test_requests_and_histograms_per_label_set() -> None:
    agg = MetricsAggregator()
    for _ in range(3):
        agg.record_http(server_entry(duration_ms=3.0))
    agg.record_http(server_entry(code=503, duration_ms=700.0))
    scraped = _scrape(agg)
    totals = {s[0]["response_code"]: s[1] for s in scraped["istio_requests_total"]}
    assert totals == {"200": 3, "503": 1}
    ok_buckets = {
        labels_["le"]: value
        for labels_, value in scraped["istio_request_duration_milliseconds_bucket"]
        if labels_["response_code"] == "200"
    }
    assert ok_buckets["1"] == 0 and ok_buckets["5"] == 3 and ok_buckets["+Inf"] == 3
    sizes = {
        labels_["response_code"]: value for labels_, value in scraped["istio_response_bytes_sum"]
    }
    assert sizes["200"] == 3 * 1000  # headers and body
    requests = [v for lb, v in scraped["istio_request_bytes_sum"] if lb["response_code"] == "503"]
    assert requests == [120]
    assert agg.series == 2


def test_the_label_set_cap_folds_overflow_into_unknown_and_counts_it() -> None:
    agg = MetricsAggregator(max_series=3)
    for code in range(200, 210):  # ten distinct response codes
        agg.record_http(server_entry(code=code))
    assert agg.series == 4  # three real, one overflow
    assert agg.overflow == 7
    scraped = _scrape(agg)
    overflow = [
        (lb, v) for lb, v in scraped["istio_requests_total"] if lb["response_code"] == "unknown"
    ]
    assert len(overflow) == 1
    lb, value = overflow[0]
    assert value == 7 and lb["reporter"] == "destination"
    assert all(lb[n] == "unknown" for n in HTTP_LABELS if n != "reporter")
    assert scraped["pilotfish_agent_metrics_overflow_total"][0][1] == 7
    # A known label set still counts in its own series after the cap is reached.
    agg.record_http(server_entry(code=200))
    assert agg.series == 4 and agg.overflow == 7


def test_memory_is_bounded_by_label_sets_not_by_requests() -> None:
    agg = MetricsAggregator(max_series=50)
    for i in range(5000):
        agg.record_http(server_entry(code=200 + i % 300, authority=f"svc{i}"))
    assert agg.series <= 51
    assert agg.entries == 5000


def tcp_entry(
    stream: str,
    kind: int,
    sent: int,
    received: int,
    *,
    peer: str | None = CLIENT,
    reporter: str = t.REPORTER_DESTINATION,
) -> TCPAccessLogEntry:
    e = TCPAccessLogEntry()
    c = e.common_properties
    _tags(c, reporter)
    c.stream_id = stream
    c.access_log_type = kind  # type: ignore[assignment]
    c.intermediate_log_entry = kind != AccessLogType.TcpConnectionEnd
    c.tls_properties.local_certificate_properties.subject_alt_name.add(uri=SERVER)
    if peer:
        c.tls_properties.peer_certificate_properties.subject_alt_name.add(uri=peer)
    e.connection_properties.sent_bytes = sent
    e.connection_properties.received_bytes = received
    return e


def test_tcp_bytes_are_deltas_of_envoys_running_totals() -> None:
    agg = MetricsAggregator()
    # Before the handshake ends the server side cannot name the caller: that entry waits.
    agg.record_tcp(tcp_entry("c1", AccessLogType.TcpUpstreamConnected, 0, 0, peer=None))
    assert agg.series == 0
    agg.record_tcp(tcp_entry("c1", AccessLogType.TcpPeriodic, 100, 1000))
    agg.record_tcp(tcp_entry("c1", AccessLogType.TcpPeriodic, 300, 5000))
    assert agg.open_connections == 1
    agg.record_tcp(tcp_entry("c1", AccessLogType.TcpConnectionEnd, 400, 7000))
    assert agg.open_connections == 0
    # A second connection, reported only at its end.
    agg.record_tcp(tcp_entry("c2", AccessLogType.TcpConnectionEnd, 10, 20))
    [series] = agg.tcp.values()
    assert (series.sent, series.received, series.opened, series.closed) == (410, 7020, 2, 2)
    [key] = agg.tcp
    got = labels(key, TCP_LABELS)
    assert got["source_principal"] == CLIENT
    assert got["connection_security_policy"] == "mutual_tls"
    assert got["request_protocol"] == "tcp"
    assert "response_code" not in got


def test_tcp_connections_tracked_are_bounded() -> None:
    agg = MetricsAggregator(max_connections=10)
    for i in range(100):
        agg.record_tcp(tcp_entry(f"c{i}", AccessLogType.TcpPeriodic, 1, 1))
    assert agg.open_connections == 10
    assert agg.evicted == 90
    [series] = agg.tcp.values()
    assert series.opened == 100 and series.sent == 100


def test_tcp_labels_for_the_source_side() -> None:
    e = tcp_entry(
        "c", AccessLogType.TcpUpstreamConnected, 0, 0, peer=None, reporter=t.REPORTER_SOURCE
    )
    e.common_properties.ClearField("tls_properties")
    e.common_properties.upstream_cluster = "outbound|9090||db.shop.svc.cluster.local"
    got = labels(tcp_labels(e), TCP_LABELS)
    assert got["reporter"] == "source" and got["destination_service_name"] == "db"
    agg = MetricsAggregator()
    agg.record_tcp(e)  # the client side counts the connection at once
    assert next(iter(agg.tcp.values())).opened == 1
